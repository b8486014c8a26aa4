use std::os::fd::OwnedFd;
use tegra_interop_driver::{Backend, Context, ExternalSemaphore, FunctionTable};

fn scenario(fd: OwnedFd) -> Result<(), tegra_interop_driver::Error> {
    let backend = Backend::from_table("ui", FunctionTable::empty());
    let mut ctx = Context::primary(backend, 0)?;
    let semaphore = ExternalSemaphore::timeline_fd(&ctx, fd)?;
    // cuDevicePrimaryCtxReset with a live semaphore, then destroying the
    // semaphore, crashes the real driver: the reset needs `&mut ctx`.
    ctx.reset()?;
    semaphore.destroy()?;
    Ok(())
}

fn main() {
    let _ = scenario;
}
