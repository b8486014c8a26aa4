use std::os::fd::OwnedFd;
use tegra_interop_driver::{Backend, Context, ExternalMemory, FunctionTable};

fn scenario(fd: OwnedFd) -> Result<(), tegra_interop_driver::Error> {
    let backend = Backend::from_table("ui", FunctionTable::empty());
    let memory;
    {
        let ctx = Context::primary(backend, 0)?;
        memory = ExternalMemory::opaque_fd(&ctx, fd, 4096)?;
    }
    // The context is gone; the memory may not outlive it.
    let _ = memory.size();
    Ok(())
}

fn main() {
    let _ = scenario;
}
