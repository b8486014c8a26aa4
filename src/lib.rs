//! # tegra-interop
//!
//! Safe, zero-copy sharing of memory and synchronisation between CUDA and the
//! rest of an NVIDIA Jetson / DRIVE SoC (NvSciBuf / NvSciSync, Vulkan, camera
//! pipelines).
//!
//! - [`core`] (always available, `no_std`, no allocation): validated
//!   descriptors for the CUDA external-resource API, fixed-capacity semaphore
//!   batches, deterministic fence counters, typed errors.
//! - [`driver`] (feature `std`, on by default): the run-time loaded CUDA /
//!   NvSci function table and RAII handles over it.
//!
//! With `default-features = false` this crate is `#![no_std]` and builds for
//! bare-metal targets such as `aarch64-unknown-none`, `thumbv7em-none-eabihf`
//! and `armv7r-none-eabihf`.
#![cfg_attr(not(feature = "std"), no_std)]
#![deny(unsafe_op_in_unsafe_fn)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use tegra_interop_core as core;
pub use tegra_interop_sys as sys;

#[cfg(feature = "std")]
pub use tegra_interop_driver as driver;

/// True when this build targets aarch64 Linux (a Jetson's userland).
pub const TARGET_IS_AARCH64_LINUX: bool = cfg!(tegra_aarch64_linux);

/// True when this build targets bare metal (`target_os = "none"`).
pub const TARGET_IS_BARE_METAL: bool = cfg!(tegra_bare_metal);

// The README's Rust examples are compiled and run as doctests of
// `tegra-interop-pipeline` (crates/pipeline/src/lib.rs), since its quick
// start is a program on that crate, which this one does not depend on.
