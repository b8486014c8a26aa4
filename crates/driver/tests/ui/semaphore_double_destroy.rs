use std::os::fd::OwnedFd;
use tegra_interop_driver::{Backend, Context, ExternalSemaphore, FunctionTable};

fn scenario(fd: OwnedFd) -> Result<(), tegra_interop_driver::Error> {
    // SAFETY: an empty table calls nothing.
    let backend = unsafe { Backend::from_table("ui", FunctionTable::empty()) };
    let ctx = Context::primary(backend, 0)?;
    let semaphore = ExternalSemaphore::timeline_fd(&ctx, fd)?;
    semaphore.destroy()?;
    // The real driver segfaults on a second destroy; here it does not compile.
    semaphore.destroy()?;
    Ok(())
}

fn main() {
    let _ = scenario;
}
