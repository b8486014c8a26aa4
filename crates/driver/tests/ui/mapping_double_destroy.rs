use std::os::fd::OwnedFd;
use tegra_interop_core::BufferMapping;
use tegra_interop_driver::{Backend, Context, ExternalMemory, FunctionTable};

fn scenario(fd: OwnedFd) -> Result<(), tegra_interop_driver::Error> {
    // SAFETY: an empty table calls nothing.
    let backend = unsafe { Backend::from_table("ui", FunctionTable::empty()) };
    let ctx = Context::primary(backend, 0)?;
    let memory = ExternalMemory::opaque_fd(&ctx, fd, 4096)?;
    let buffer = memory.map_buffer(BufferMapping::new(0, 4096))?;
    buffer.destroy()?;
    // A second cuMemFree of the same pointer: does not compile.
    buffer.destroy()?;
    Ok(())
}

fn main() {
    let _ = scenario;
}
