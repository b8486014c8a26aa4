//! # tegra-interop-platform
//!
//! The platform APIs that produce frames for CUDA: the other side of each
//! interop transport of tegra-interop, as product code a user can build on.
//!
//! - `vulkan` (feature `vulkan`): a Vulkan device chosen by the CUDA
//!   device's UUID that allocates memory and timeline/binary semaphores
//!   exportable as opaque POSIX fds, submits copies and semaphore
//!   operations on a queue family the caller picks (`vulkan::QueueChoice`,
//!   e.g. the copy engines), and hands host-written memory to the device
//!   through recorded queue batches. It is the producer of the discrete-GPU
//!   transport (`tegra_interop_pipeline::transport::gpu`). The Vulkan loader is opened at run time.
//! - [`egl`]: an EGL display on the EGL device platform with a surfaceless
//!   OpenGL ES 2 context, making the objects CUDA's EGL interop consumes:
//!   `EGLStreamKHR`s (FIFO or mailbox) and `EGLImageKHR`s from GL textures.
//!   It is the display of the EGLStream transport on a real GPU
//!   (`tegra_interop_pipeline::transport::egl`). `libEGL.so.1` and `libGLESv2.so.2` are
//!   opened at run time; a machine without them gets a typed error.
//!
//! Neither module links anything at build time, so a program that has this
//! crate as a dependency builds and starts on a machine without Vulkan or
//! EGL and reports what is missing when it asks for it;
//! [`vulkan_loader_present`] (with or without the `vulkan` feature) says
//! whether a Vulkan loader can be opened here.
//!
//! The crate calls C directly (through `ash` and run-time loaded EGL/GLES
//! symbols); every `unsafe` block in it says why it holds, and every public
//! fn that takes a raw handle or pointer is `unsafe` with its `# Safety`
//! list.

pub mod egl;
#[cfg(feature = "vulkan")]
pub mod vulkan;

/// The file name of the system's Vulkan loader.
pub const VULKAN_LOADER: &str = "libvulkan.so.1";

/// Whether the system's Vulkan loader ([`VULKAN_LOADER`]) can be opened
/// here: `Err` names the file and carries the dynamic loader's reason. Nothing from the loader
/// is called, and it is closed again before this returns.
pub fn vulkan_loader_present() -> Result<(), String> {
    // SAFETY: opening the system's Vulkan loader runs its initialisers,
    // which are written to run in any process that links it; nothing from
    // it is called here, and it is unloaded when dropped.
    unsafe { libloading::Library::new(VULKAN_LOADER) }
        .map(drop)
        .map_err(|e| format!("{VULKAN_LOADER}: {e}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn vulkan_loader_present_answers_with_a_reason() {
        // Either way it answers; where the loader is missing, the reason
        // names it.
        if let Err(why) = super::vulkan_loader_present() {
            assert!(why.contains(super::VULKAN_LOADER), "{why}");
        }
    }
}
