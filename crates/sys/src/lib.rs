//! Generated FFI layouts and fn-pointer types for tegra-interop, and the
//! function table built from the generated entry-point lists.
#![no_std]

#[rustfmt::skip]
pub mod cuda;
#[rustfmt::skip]
pub mod nvsci;
#[rustfmt::skip]
pub mod nvrtc;
#[rustfmt::skip]
#[macro_use]
pub mod lists;
#[rustfmt::skip]
pub mod versions;
pub mod table;
