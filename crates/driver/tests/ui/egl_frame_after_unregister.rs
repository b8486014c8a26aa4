use tegra_interop_driver::egl::{EglAccess, EglImage};
use tegra_interop_driver::{Backend, Context, FunctionTable};

fn scenario() -> Result<(), tegra_interop_driver::Error> {
    // SAFETY: an empty table calls nothing.
    let backend = unsafe { Backend::from_table("ui", FunctionTable::empty()) };
    let ctx = Context::primary(backend, 0)?;
    // SAFETY: (ui test, never run).
    let image = unsafe { EglImage::register(&ctx, std::ptr::null_mut(), EglAccess::ReadWrite)? };
    let frame = image.frame()?;
    image.unregister()?;
    // A frame's plane pointers after the registration ended: does not compile.
    let _ = frame.plane_ptr(0);
    Ok(())
}

fn main() {
    let _ = scenario;
}
