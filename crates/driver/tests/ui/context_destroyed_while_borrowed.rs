use std::os::fd::OwnedFd;
use tegra_interop_driver::{Backend, Context, ExternalSemaphore, FunctionTable};

fn scenario(fd: OwnedFd) -> Result<(), tegra_interop_driver::Error> {
    let backend = Backend::from_table("ui", FunctionTable::empty());
    let ctx = Context::primary(backend, 0)?;
    let semaphore = ExternalSemaphore::binary_fd(&ctx, fd)?;
    // Destroying the context while a semaphore of it lives is refused.
    ctx.destroy()?;
    drop(semaphore);
    Ok(())
}

fn main() {
    let _ = scenario;
}
