//! # tegra-interop-testkit (unpublished)
//!
//! The fixtures that hold tegra-interop to the real driver, kept out of the
//! published crates (`publish = false`):
//!
//! - [`conformance`]: the backend conformance suite, written once and run on
//!   the simulator in CI (`tests/conformance_sim.rs`, `tests/fd_table_sim.rs`)
//!   and on a GPU machine with Vulkan as the exporter (`tests/gpu_conformance.rs`).
//! - [`sim_exporter`]: the simulator's memfd exporter behind the suite's
//!   [`conformance::Exporter`] trait.
//! - `vulkan` (feature `vulkan`): a small Vulkan setup (ash) that exports
//!   memory and semaphores as opaque fds, for GPU tests, examples and
//!   benchmarks; it is also the discrete-GPU producer of `tegra-interop-pipeline`.
//! - [`raw_cuda`]: the raw `libcuda` calls the benchmarks compare the driver's
//!   wrappers against.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod conformance;
pub mod egl;
pub mod egl_image_checks;
pub mod egl_stream_checks;
pub mod raw_cuda;
pub mod sim_exporter;
#[cfg(feature = "vulkan")]
pub mod vulkan;
