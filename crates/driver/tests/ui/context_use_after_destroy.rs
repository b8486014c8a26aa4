use tegra_interop_driver::{Backend, Context, FunctionTable};

fn scenario() -> Result<(), tegra_interop_driver::Error> {
    // SAFETY: an empty table calls nothing.
    let backend = unsafe { Backend::from_table("ui", FunctionTable::empty()) };
    let ctx = Context::primary(backend, 0)?;
    ctx.destroy()?;
    // Binding a destroyed context: does not compile.
    ctx.bind()?;
    Ok(())
}

fn main() {
    let _ = scenario;
}
