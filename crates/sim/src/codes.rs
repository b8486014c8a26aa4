//! The `CUresult` codes the simulator returns, and their names and messages
//! for `cuGetErrorName` / `cuGetErrorString`.

#![deny(unsafe_code)]

use core::ffi::CStr;
use tegra_interop_sys::cuda::CUresult;

/// `CUDA_SUCCESS` (0).
pub const SUCCESS: CUresult = CUresult::CUDA_SUCCESS;
/// `CUDA_ERROR_INVALID_VALUE` (1).
pub const INVALID_VALUE: CUresult = CUresult::CUDA_ERROR_INVALID_VALUE;
/// `CUDA_ERROR_OUT_OF_MEMORY` (2).
pub const OUT_OF_MEMORY: CUresult = CUresult::CUDA_ERROR_OUT_OF_MEMORY;
/// `CUDA_ERROR_NOT_INITIALIZED` (3).
pub const NOT_INITIALIZED: CUresult = CUresult::CUDA_ERROR_NOT_INITIALIZED;
/// `CUDA_ERROR_DEINITIALIZED` (4).
pub const DEINITIALIZED: CUresult = CUresult::CUDA_ERROR_DEINITIALIZED;
/// `CUDA_ERROR_NO_DEVICE` (100).
pub const NO_DEVICE: CUresult = CUresult::CUDA_ERROR_NO_DEVICE;
/// `CUDA_ERROR_INVALID_DEVICE` (101).
pub const INVALID_DEVICE: CUresult = CUresult::CUDA_ERROR_INVALID_DEVICE;
/// `CUDA_ERROR_INVALID_CONTEXT` (201).
pub const INVALID_CONTEXT: CUresult = CUresult::CUDA_ERROR_INVALID_CONTEXT;
/// `CUDA_ERROR_OPERATING_SYSTEM` (304).
pub const OPERATING_SYSTEM: CUresult = CUresult::CUDA_ERROR_OPERATING_SYSTEM;
/// `CUDA_ERROR_INVALID_HANDLE` (400).
pub const INVALID_HANDLE: CUresult = CUresult::CUDA_ERROR_INVALID_HANDLE;
/// `CUDA_ERROR_NOT_READY` (600).
pub const NOT_READY: CUresult = CUresult::CUDA_ERROR_NOT_READY;
/// `CUDA_ERROR_CONTEXT_IS_DESTROYED` (709).
pub const CONTEXT_IS_DESTROYED: CUresult = CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED;
/// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED` (712).
pub const HOST_MEMORY_ALREADY_REGISTERED: CUresult =
    CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
/// `CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED` (713).
pub const HOST_MEMORY_NOT_REGISTERED: CUresult = CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
/// `CUDA_ERROR_NOT_PERMITTED` (800).
pub const NOT_PERMITTED: CUresult = CUresult::CUDA_ERROR_NOT_PERMITTED;
/// `CUDA_ERROR_NOT_SUPPORTED` (801).
pub const NOT_SUPPORTED: CUresult = CUresult::CUDA_ERROR_NOT_SUPPORTED;
/// `CUDA_ERROR_TIMEOUT` (909).
pub const TIMEOUT: CUresult = CUresult::CUDA_ERROR_TIMEOUT;
/// `CUDA_ERROR_LAUNCH_TIMEOUT` (702).
pub const LAUNCH_TIMEOUT: CUresult = CUresult::CUDA_ERROR_LAUNCH_TIMEOUT;
/// `CUDA_ERROR_INVALID_IMAGE` (200).
pub const INVALID_IMAGE: CUresult = CUresult::CUDA_ERROR_INVALID_IMAGE;
/// `CUDA_ERROR_NOT_FOUND` (500).
pub const NOT_FOUND: CUresult = CUresult::CUDA_ERROR_NOT_FOUND;
/// `CUDA_ERROR_INVALID_PTX` (218).
pub const INVALID_PTX: CUresult = CUresult::CUDA_ERROR_INVALID_PTX;
/// `CUDA_ERROR_UNKNOWN` (999).
pub const UNKNOWN: CUresult = CUresult::CUDA_ERROR_UNKNOWN;

/// The one-line description of each code the simulator answers
/// `cuGetErrorName` / `cuGetErrorString` for (the names come from the
/// generated list of `tegra-interop-sys`).
const DESCRIPTIONS: &[(u32, &CStr)] = &[
    (0, c"no error"),
    (1, c"invalid argument"),
    (2, c"out of memory"),
    (3, c"initialization error"),
    (4, c"driver shutting down"),
    (100, c"no CUDA-capable device is detected"),
    (101, c"invalid device ordinal"),
    (200, c"device kernel image is invalid"),
    (201, c"invalid device context"),
    (218, c"a PTX JIT compilation failed"),
    (304, c"OS call failed or operation not supported on this OS"),
    (400, c"invalid resource handle"),
    (500, c"named symbol not found"),
    (600, c"device not ready"),
    (709, c"context is destroyed"),
    (800, c"operation not permitted"),
    (801, c"operation not supported"),
    (909, c"timeout expired"),
    (999, c"unknown error"),
];

macro_rules! name_table {
    ([] $($short:ident = $value:expr, $name:literal, $c_name:literal;)*) => {
        /// Every `CUresult` the header names, with its C name.
        const NAMES: &[(u32, &CStr)] = &[$(($value, $c_name),)*];
    };
}
tegra_interop_sys::cuda_result_codes!(name_table);

/// The C name of `code` (`CUDA_ERROR_...`), if the simulator knows it.
pub fn name(code: u32) -> Option<&'static CStr> {
    description(code)?;
    NAMES.iter().find(|(c, _)| *c == code).map(|(_, n)| *n)
}

/// A short description of `code`, if the simulator knows it.
pub fn description(code: u32) -> Option<&'static CStr> {
    DESCRIPTIONS
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, d)| *d)
}
