use tegra_interop_driver::{Backend, Context, FunctionTable, Stream};

fn scenario() -> Result<(), tegra_interop_driver::Error> {
    // SAFETY: an empty table calls nothing.
    let backend = unsafe { Backend::from_table("ui", FunctionTable::empty()) };
    let ctx = Context::primary(backend, 0)?;
    let stream = Stream::new(&ctx)?;
    stream.destroy()?;
    // Queuing on a destroyed stream: does not compile.
    stream.synchronize()?;
    Ok(())
}

fn main() {
    let _ = scenario;
}
