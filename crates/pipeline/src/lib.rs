//! # tegra-interop-pipeline
//!
//! The camera -> shared buffer -> consumer pipeline of tegra-interop as a
//! library, and the two programs built on it (`pipeline`, `interop_info`).
//!
//! - [`camera`]: the camera sensor model over `embedded-hal` 1.0 traits
//!   (no alloc), which writes the frames; [`sensor`] is its simulated bus.
//! - [`ring`]: the ring of slots and its fence schedule; [`transport`]: the
//!   interface a transport implements, with [`host`] (host reference),
//!   [`nvsci`] (NvSciBuf/NvSciSync + CUDA, on a Jetson or the simulator) and
//!   `gpu` (feature `vulkan`: Vulkan producer, CUDA kernel consumer);
//!   [`kernel`] is the CUDA consumer kernel both GPU transports launch.
//! - [`backend`] and [`probe`]: which transport runs here and why;
//!   [`cli`], [`report`], [`stats`], [`app`]: the `pipeline` program;
//!   [`info`]: the `interop_info` capability report.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod app;
pub mod backend;
pub mod camera;
pub mod cli;
#[cfg(feature = "vulkan")]
pub mod gpu;
pub mod host;
pub mod info;
pub mod kernel;
pub mod nvsci;
pub mod probe;
pub mod report;
pub mod ring;
pub mod sensor;
pub mod stats;
pub mod transport;
