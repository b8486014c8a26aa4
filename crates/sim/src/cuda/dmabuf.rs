//! `cuMemGetHandleForAddressRange`: exporting device memory as a dma-buf fd.
//!
//! What is modelled, and why (see the crate README's table):
//!
//! - Measured on an H200 (driver 580.159, CUDA 13.0): exporting a
//!   `cuMemAlloc` allocation with
//!   `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD` works on a device whose attribute
//!   `DMA_BUF_SUPPORTED` (124) is 1. The simulator exports when
//!   `SimConfig::dmabuf_supported` is set (it answers attribute 124 from the
//!   same setting).
//! - The fd handed out is a real descriptor the caller owns: a memfd of the
//!   range's length holding a copy of the range's bytes at export time. A real
//!   dma-buf shares the memory; this copy does not (later writes on either side
//!   are not seen by the other), so nothing may rely on sharing through it.
//!   Importing it back as `DMABUF_FD` is answered by the simulator's import
//!   code (the H200 answered NOT_SUPPORTED for that).
//! - Not measured, so refused rather than guessed: a range that does not
//!   start at a `cuMemAlloc` allocation, a length that is 0, not a multiple of
//!   the host page size or past the allocation, a non-zero flags word, any
//!   other handle type (all INVALID_VALUE + a `Misuse` diagnostic), and
//!   export without dma-buf support (NOT_SUPPORTED + `Unimplemented`).

use core::ffi::{c_int, c_ulonglong};
use std::os::fd::IntoRawFd;
use std::os::unix::fs::FileExt;

use tegra_interop_sys::cuda::{CUdeviceptr, CUmemRangeHandleType, CUresult};

use crate::cmem::CMut;
use crate::codes::{INVALID_CONTEXT, INVALID_VALUE, NOT_INITIALIZED, NOT_SUPPORTED, SUCCESS};
use crate::instance::{AllocKind, Call};
use crate::shm;
use crate::DiagnosticKind as D;

/// `cuMemGetHandleForAddressRange(handle, dptr, size, handleType, flags)`.
///
/// `handle` is the caller's out-pointer for the fd (`crate::abi` gives it
/// its type).
pub(crate) fn cuMemGetHandleForAddressRange(
    c: &Call,
    handle: CMut<c_int>,
    dptr: CUdeviceptr,
    size: usize,
    handle_type: CUmemRangeHandleType,
    flags: c_ulonglong,
) -> CUresult {
    let st = c.state();
    if !st.initialized {
        return NOT_INITIALIZED;
    }
    // Like every call that uses device memory: a live current context.
    let cur = c.inst.current();
    if cur == 0 || !st.contexts.contains_key(&cur) {
        return INVALID_CONTEXT;
    }
    if handle.is_null() {
        return INVALID_VALUE;
    }
    if handle_type != CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD {
        c.diag(
            D::Misuse,
            format!(
                "handle type {} is not DMA_BUF_FD (1), the only type the simulator models",
                handle_type.0
            ),
        );
        return INVALID_VALUE;
    }
    if !c.inst.config.dmabuf_supported {
        c.diag(
            D::Unimplemented,
            "dma-buf export on a device without DMA_BUF_SUPPORTED (attribute 124 = 0): \
             not measured, refused"
                .into(),
        );
        return NOT_SUPPORTED;
    }
    if flags != 0 {
        c.diag(D::Misuse, format!("flags {flags:#x}: only 0 is modelled"));
        return INVALID_VALUE;
    }
    let page = shm::page_size() as u64;
    let len = size as u64;
    let alloc = match st.allocations.get(&dptr) {
        Some(a) if matches!(a.kind, AllocKind::Alloc) => a,
        _ => {
            c.diag(
                D::Misuse,
                format!(
                    "{dptr:#x} is not the start of a cuMemAlloc allocation: \
                     the simulator exports whole-page ranges of cuMemAlloc memory only"
                ),
            );
            return INVALID_VALUE;
        }
    };
    if len == 0 || !len.is_multiple_of(page) || len > alloc.len as u64 {
        c.diag(
            D::Misuse,
            format!(
                "{len} bytes: the range must be a non-zero multiple of the page size \
                 ({page}) inside the allocation ({} bytes)",
                alloc.len
            ),
        );
        return INVALID_VALUE;
    }
    let fd = match shm::memfd(c"tegra-interop-sim-dmabuf", len) {
        Ok(fd) => fd,
        Err(e) => {
            c.diag(D::Internal, format!("memfd for the dma-buf: {e}"));
            return crate::codes::OUT_OF_MEMORY;
        }
    };
    // Copy the range's current bytes into the file.
    let mut bytes = vec![0u8; size];
    if !st.device_read(dptr, &mut bytes) {
        c.diag(
            D::Internal,
            format!("{size} bytes at {dptr:#x}: a checked allocation without its mapping"),
        );
        return crate::codes::OUT_OF_MEMORY;
    }
    let file = std::fs::File::from(fd);
    if let Err(e) = file.write_all_at(&bytes, 0) {
        c.diag(D::Internal, format!("writing the dma-buf copy: {e}"));
        return crate::codes::OUT_OF_MEMORY;
    }
    drop(st);
    // The caller owns the new descriptor from here on.
    let raw: c_int = file.into_raw_fd();
    handle.write(raw);
    SUCCESS
}
