//! Capability probes: answers obtained by trying, not inferred from a device
//! attribute.
//!
//! [`dma_buf_import`] finds out whether `DMABUF_FD` memory import works on a
//! context's device. Device attribute `DMA_BUF_SUPPORTED` (124) is no
//! evidence for it: it describes *exporting* dma-bufs. On an H200 (driver
//! 580.159, CUDA 13.0) the attribute is 1 and the export works, but
//! `DMABUF_FD` import answers `CUDA_ERROR_NOT_SUPPORTED` (801), even for a
//! dma-buf CUDA exported itself.
//!
//! ```
//! use tegra_interop_driver::{probe, Context};
//!
//! let sim = tegra_interop_sim::Sim::new()?;
//! let ctx = Context::primary(sim.backend(), 0)?;
//! let found = probe::dma_buf_import(&ctx);
//! println!("DMABUF_FD import: {found}"); // says what was tried and what it answered
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![allow(unsafe_code)] // calls of pointer-taking entry points, taking the exported fd, each with its `// SAFETY:` line

use std::fmt;

use tegra_interop_core::CuResult;
use tegra_interop_sys::cuda::{CUdeviceptr, CUmemRangeHandleType};

use crate::ffi::call;
use crate::{Context, Error, ExternalMemory};

/// Bytes the dma-buf probe allocates (and frees again): 2 MiB, a multiple of
/// every host page size and of the GPU's large-page granularity.
pub const DMA_BUF_PROBE_BYTES: usize = 2 << 20;

/// What [`dma_buf_import`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DmaBufImport {
    /// A dma-buf CUDA exported itself was imported as `DMABUF_FD`.
    Supported,
    /// The import answered `CUDA_ERROR_NOT_SUPPORTED`.
    NotSupported {
        /// The import's answer (`NOT_SUPPORTED`).
        code: CuResult,
    },
    /// No answer either way: the probe could not be run to the end (an
    /// entry point missing, the allocation or the export refused), or the
    /// import failed with a code that does not say whether the kind is
    /// supported.
    Unknown {
        /// What stopped the probe, with the driver's answer.
        reason: String,
    },
}

impl DmaBufImport {
    /// `Some(true)` / `Some(false)` when the probe gave an answer.
    pub fn supported(&self) -> Option<bool> {
        match self {
            DmaBufImport::Supported => Some(true),
            DmaBufImport::NotSupported { .. } => Some(false),
            DmaBufImport::Unknown { .. } => None,
        }
    }
}

impl fmt::Display for DmaBufImport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DmaBufImport::Supported => write!(
                f,
                "supported (probed: a {} MiB cuMemAlloc buffer exported with \
                 cuMemGetHandleForAddressRange(DMA_BUF_FD) was imported as DMABUF_FD)",
                DMA_BUF_PROBE_BYTES >> 20
            ),
            DmaBufImport::NotSupported { code } => write!(
                f,
                "not supported (probed: import answered {})",
                code.name().unwrap_or("an unnamed code")
            ),
            DmaBufImport::Unknown { reason } => write!(f, "unknown ({reason})"),
        }
    }
}

/// Probes whether `DMABUF_FD` memory import works in `ctx`, without side
/// effects that outlast the call: allocates [`DMA_BUF_PROBE_BYTES`] of
/// device memory (`cuMemAlloc`), exports it as a dma-buf
/// (`cuMemGetHandleForAddressRange`, `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`),
/// imports that fd with [`ExternalMemory::dma_buf_fd`], and undoes each step
/// (destroys the import, closes the fd the probe still owns, frees the
/// allocation), on every path.
///
/// Leaves the context current on the calling thread.
pub fn dma_buf_import(ctx: &Context) -> DmaBufImport {
    let api = ctx.api();
    // Every step's entry is needed before the first step is made.
    let (Some(_), Some(_), Some(_)) = (
        api.cuMemAlloc,
        api.cuMemFree,
        api.cuMemGetHandleForAddressRange,
    ) else {
        let missing = [
            ("cuMemAlloc", api.cuMemAlloc.is_none()),
            ("cuMemFree", api.cuMemFree.is_none()),
            (
                "cuMemGetHandleForAddressRange",
                api.cuMemGetHandleForAddressRange.is_none(),
            ),
        ]
        .into_iter()
        .find(|(_, missing)| *missing)
        .map_or("an entry point", |(name, _)| name);
        return DmaBufImport::Unknown {
            reason: format!(
                "no probe possible: {}",
                crate::table::missing_entry(api, missing)
            ),
        };
    };
    if let Err(e) = ctx.bind() {
        return DmaBufImport::Unknown {
            reason: format!("no probe possible: {e}"),
        };
    }
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: `ptr` is a local the driver writes one device pointer to.
    if let Err(e) = unsafe { call::cuMemAlloc(api, &mut ptr, DMA_BUF_PROBE_BYTES) } {
        return DmaBufImport::Unknown {
            reason: format!("no probe possible: {e}"),
        };
    }
    let verdict = export_and_import(ctx, ptr);
    // `ptr` came from our cuMemAlloc and is freed once, after the import
    // made from it (if any) was destroyed.
    let freed = call::cuMemFree(api, ptr);
    match (verdict, freed) {
        (verdict, Ok(())) => verdict,
        (DmaBufImport::Unknown { reason }, Err(e)) => DmaBufImport::Unknown {
            reason: format!("{reason}; freeing the probe buffer: {e}"),
        },
        (_, Err(e)) => DmaBufImport::Unknown {
            reason: format!("freeing the probe buffer failed: {e}"),
        },
    }
}

/// The export and import steps of [`dma_buf_import`] over the allocation
/// at `ptr` (which the caller frees).
fn export_and_import(ctx: &Context, ptr: CUdeviceptr) -> DmaBufImport {
    let mut raw_fd: core::ffi::c_int = -1;
    // SAFETY: `raw_fd` is a local `int`, the size a dma-buf handle is written as; the range is the
    // whole live allocation made by the caller.
    let exported = unsafe {
        call::cuMemGetHandleForAddressRange(
            ctx.api(),
            (&mut raw_fd as *mut core::ffi::c_int).cast(),
            ptr,
            DMA_BUF_PROBE_BYTES,
            CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    };
    if let Err(e) = exported {
        return DmaBufImport::Unknown {
            reason: format!("no probe possible: the export to import back failed: {e}"),
        };
    }
    if raw_fd < 0 {
        return DmaBufImport::Unknown {
            reason: format!(
                "no probe possible: cuMemGetHandleForAddressRange succeeded but gave fd {raw_fd}"
            ),
        };
    }
    // From here on `fd` closes it exactly once (or the driver takes it on a
    // successful import).
    // SAFETY: a successful dma-buf export hands the caller a new, open
    // descriptor that nothing else owns (the table contract, point 6).
    let fd = unsafe { crate::fd::own_fd(raw_fd) };
    match ExternalMemory::dma_buf_fd(ctx, fd, DMA_BUF_PROBE_BYTES as u64) {
        Ok(memory) => match memory.destroy() {
            Ok(()) => DmaBufImport::Supported,
            Err(e) => DmaBufImport::Unknown {
                reason: format!("the import succeeded, but destroying it failed: {e}"),
            },
        },
        Err(failed) => {
            // Converting closes the fd the error hands back (ours).
            let error = Error::from(failed);
            match error.code() {
                Some(code) if code == CuResult::NOT_SUPPORTED => {
                    DmaBufImport::NotSupported { code }
                }
                _ => DmaBufImport::Unknown {
                    reason: format!(
                        "probed: the import failed in a way that does not say whether \
                         DMABUF_FD is supported: {error}"
                    ),
                },
            }
        }
    }
}
