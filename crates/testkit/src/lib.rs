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
//! - [`egl_image_checks`], [`egl_stream_checks`]: the EGLImage and
//!   EGLStream suites, run on the simulator and, with the platform crate's
//!   EGL display (`tegra_interop_platform::egl`), on a GPU machine.
//! - [`raw_cuda`]: the raw `libcuda` calls the benchmarks compare the driver's
//!   wrappers against.
//! - [`bench_json`]: the rows `gpu_bench --json FILE` writes.
//!
//! The exporters the GPU tests, examples and benchmarks use are product
//! code of `tegra-interop-platform`: `vulkan` (feature `vulkan` here, which
//! turns on the platform crate's and the pipeline's) and `egl`.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod bench_json;
pub mod conformance;
pub mod egl_image_checks;
pub mod egl_stream_checks;
pub mod raw_cuda;
pub mod sim_exporter;
