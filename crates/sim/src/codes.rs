//! The `CUresult` codes the simulator returns, and their names and messages
//! for `cuGetErrorName` / `cuGetErrorString`.

use core::ffi::CStr;
use tegra_interop_sys::cuda::CUresult;

/// `CUDA_SUCCESS` (0).
pub const SUCCESS: CUresult = CUresult(0);
/// `CUDA_ERROR_INVALID_VALUE` (1).
pub const INVALID_VALUE: CUresult = CUresult(1);
/// `CUDA_ERROR_OUT_OF_MEMORY` (2).
pub const OUT_OF_MEMORY: CUresult = CUresult(2);
/// `CUDA_ERROR_NOT_INITIALIZED` (3).
pub const NOT_INITIALIZED: CUresult = CUresult(3);
/// `CUDA_ERROR_DEINITIALIZED` (4).
pub const DEINITIALIZED: CUresult = CUresult(4);
/// `CUDA_ERROR_NO_DEVICE` (100).
pub const NO_DEVICE: CUresult = CUresult(100);
/// `CUDA_ERROR_INVALID_DEVICE` (101).
pub const INVALID_DEVICE: CUresult = CUresult(101);
/// `CUDA_ERROR_INVALID_CONTEXT` (201).
pub const INVALID_CONTEXT: CUresult = CUresult(201);
/// `CUDA_ERROR_OPERATING_SYSTEM` (304).
pub const OPERATING_SYSTEM: CUresult = CUresult(304);
/// `CUDA_ERROR_INVALID_HANDLE` (400).
pub const INVALID_HANDLE: CUresult = CUresult(400);
/// `CUDA_ERROR_NOT_READY` (600).
pub const NOT_READY: CUresult = CUresult(600);
/// `CUDA_ERROR_CONTEXT_IS_DESTROYED` (709).
pub const CONTEXT_IS_DESTROYED: CUresult = CUresult(709);
/// `CUDA_ERROR_NOT_PERMITTED` (800).
pub const NOT_PERMITTED: CUresult = CUresult(800);
/// `CUDA_ERROR_NOT_SUPPORTED` (801).
pub const NOT_SUPPORTED: CUresult = CUresult(801);
/// `CUDA_ERROR_TIMEOUT` (909).
pub const TIMEOUT: CUresult = CUresult(909);
/// `CUDA_ERROR_UNKNOWN` (999).
pub const UNKNOWN: CUresult = CUresult(999);

/// Name and one-line description of each code the simulator knows.
const TABLE: &[(u32, &CStr, &CStr)] = &[
    (0, c"CUDA_SUCCESS", c"no error"),
    (1, c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
    (2, c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
    (3, c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
    (4, c"CUDA_ERROR_DEINITIALIZED", c"driver shutting down"),
    (
        100,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (101, c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
    (
        201,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        304,
        c"CUDA_ERROR_OPERATING_SYSTEM",
        c"OS call failed or operation not supported on this OS",
    ),
    (
        400,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (600, c"CUDA_ERROR_NOT_READY", c"device not ready"),
    (
        709,
        c"CUDA_ERROR_CONTEXT_IS_DESTROYED",
        c"context is destroyed",
    ),
    (800, c"CUDA_ERROR_NOT_PERMITTED", c"operation not permitted"),
    (801, c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
    (909, c"CUDA_ERROR_TIMEOUT", c"timeout expired"),
    (999, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

/// The C name of `code` (`CUDA_ERROR_...`), if the simulator knows it.
pub fn name(code: u32) -> Option<&'static CStr> {
    TABLE
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, n, _)| *n)
}

/// A short description of `code`, if the simulator knows it.
pub fn description(code: u32) -> Option<&'static CStr> {
    TABLE
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, _, d)| *d)
}
