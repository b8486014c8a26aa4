//! Generated FFI layouts and fn-pointer types for tegra-interop.
#![no_std]

#[rustfmt::skip]
pub mod cuda;
#[rustfmt::skip]
pub mod nvsci;
