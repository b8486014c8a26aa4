//! The platform APIs that produce frames for CUDA: the other side of each
//! interop transport, as product code a user can build on.
//!
//! - `vulkan` (feature `vulkan`): a Vulkan device chosen by the CUDA
//!   device's UUID that allocates memory and timeline/binary semaphores
//!   exportable as opaque POSIX fds, submits copies and semaphore
//!   operations on a queue family the caller picks (`vulkan::QueueChoice`,
//!   e.g. the copy engines), and hands host-written memory to the device
//!   through recorded queue batches. It is the producer of the discrete-GPU
//!   transport (`transport::gpu`). The Vulkan loader is opened at run time.
//! - [`egl`]: an EGL display on the EGL device platform with a surfaceless
//!   OpenGL ES 2 context, making the objects CUDA's EGL interop consumes:
//!   `EGLStreamKHR`s (FIFO or mailbox) and `EGLImageKHR`s from GL textures.
//!   It is the display of the EGLStream transport on a real GPU
//!   ([`crate::transport::egl`]). `libEGL.so.1` and `libGLESv2.so.2` are
//!   opened at run time; a machine without them gets a typed error.
//!
//! Neither module links anything at build time, so a program that has this
//! crate as a dependency builds and starts on a machine without Vulkan or
//! EGL and reports what is missing when it asks for it.
//!
//! This is the one module tree of the crate that calls C directly (through
//! `ash` and run-time loaded EGL/GLES symbols); every `unsafe` block in it
//! says why it holds.
#![allow(unsafe_code)]

pub mod egl;
#[cfg(feature = "vulkan")]
pub mod vulkan;
