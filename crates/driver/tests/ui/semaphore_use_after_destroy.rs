use std::os::fd::OwnedFd;
use tegra_interop_core::WaitParams;
use tegra_interop_driver::{Backend, Context, ExternalSemaphore, FunctionTable, Stream};

fn scenario(fd: OwnedFd) -> Result<(), tegra_interop_driver::Error> {
    // SAFETY: an empty table calls nothing.
    let backend = unsafe { Backend::from_table("ui", FunctionTable::empty()) };
    let ctx = Context::primary(backend, 0)?;
    let stream = Stream::new(&ctx)?;
    let semaphore = ExternalSemaphore::binary_fd(&ctx, fd)?;
    semaphore.destroy()?;
    // The semaphore was moved into destroy(): using it again is refused.
    stream.wait(&semaphore, WaitParams::binary())?;
    Ok(())
}

fn main() {
    let _ = scenario;
}
