use tegra_interop_driver::{Backend, Context, FunctionTable, Stream};

fn scenario() -> Result<(), tegra_interop_driver::Error> {
    let backend = Backend::from_table("ui", FunctionTable::empty());
    let ctx = Context::primary(backend, 0)?;
    let stream = Stream::new(&ctx)?;
    drop(ctx);
    stream.synchronize()?;
    Ok(())
}

fn main() {
    let _ = scenario;
}
