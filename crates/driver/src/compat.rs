//! Older drivers: what the loaded driver lacks, and what that costs.
//!
//! The project binds the CUDA 12.9 header, but a JetPack 5 or DRIVE OS 6.0
//! machine runs a CUDA 11.4 driver, which does not export the entry points
//! introduced later. Every entry point of the table has the release that
//! introduced its symbol in `tegra_interop_sys::versions` (generated from
//! the header's revision typedefs; the table is `crates/sys/CUDA_VERSIONS.md`).
//! Of the table's entries, two are newer than 11.4:
//!
//! | entry point | since | on an older driver |
//! |---|---|---|
//! | `cuFuncGetParamInfo` | 12.4 | [`crate::Module::function`] works; launches are not checked against the kernel's parameter sizes (nothing older gives them), so [`crate::Function::param_sizes`] is `None` and the arguments rest on [`crate::Launch::launch`]'s `unsafe` promise alone |
//! | `cuMemGetHandleForAddressRange` | 11.7 | the dma-buf import probe ([`crate::probe::dma_buf_import`]) cannot run: `Unknown`, its reason the typed error below |
//!
//! A call that needs a missing entry fails before any call with
//! [`Error::NeedsNewerDriver`] (the entry point, the release that
//! introduced it, the driver's own `cuDriverGetVersion`) when the driver is
//! older than that release, and with [`Error::NotSupported`] as before when
//! it is not (a symbol a driver of the right release still lacks, such as
//! `cuDeviceGetNvSciSyncAttributes` off Tegra). [`Backend::missing_entry_points`]
//! lists them all with what each costs (`interop_info` prints it).
//!
//! Device attributes follow the same rule on the driver side: an attribute
//! a release does not know is the driver's to refuse (the simulator's 11.4
//! profile answers INVALID_VALUE for `DMA_BUF_SUPPORTED`, 124, new in 11.7).
//!
//! # cudarc (feature `cudarc`)
//!
//! cudarc 0.19 with `dynamic-loading` resolves each symbol the first time
//! one of its wrappers is called and panics there if the library lacks it
//! (it also panics when no driver library loads at all, which
//! `Context::new` rules out first with `is_culib_present`). Its
//! `cuda-NNNNN` feature picks the header the bindings follow, not the
//! symbols its wrappers call. The calls this crate makes through cudarc,
//! and the symbols they reach (read from cudarc 0.19.10's `safe/core.rs` and
//! `result.rs`):
//!
//! | our use | cudarc | symbols | newest since |
//! |---|---|---|---|
//! | `Context::new` (real driver) | `CudaContext::new` | `cuInit`, `cuDeviceGet`, `cuDevicePrimaryCtxRetain`, `cuDeviceGetAttribute` (attribute 115, CUDA 11.2), `cuCtxGetCurrent`, `cuCtxSetCurrent` | 7.0 |
//! | dropping that context | `Drop for CudaContext` | `cuCtxGetCurrent`, `cuCtxSetCurrent`, `cuDevicePrimaryCtxRelease_v2` | 11.0 |
//! | `Stream::new` on it | `CudaContext::new_stream` | `cuCtxSynchronize` (first stream), `cuStreamCreate` | 2.0 |
//! | dropping that stream | `Drop for CudaStream` | `cuStreamDestroy_v2` | 4.0 |
//! | `MappedBuffer::cudarc_slice` | `upgrade_device_ptr`, `leak`, event drop | `cuEventCreate`, `cuStreamWaitEvent`, `cuEventDestroy_v2` | 4.0 |
//! | `Stream::from_cudarc`, `Context::from_cudarc` | `context`, `cu_ctx`, `cu_stream` | none | - |
//!
//! Every one exists in CUDA 11.4, so no path of this crate can make cudarc
//! panic on an 11.4 driver. The crate keeps `cuda-12090` (a workspace that
//! also uses cudarc must agree on one `cuda-NNNNN` feature, and a user on a
//! newer driver wants the newer bindings) and `dynamic-loading` (the
//! program starts without a driver and reports `DriverNotFound` instead of
//! failing to start). A user's own cudarc calls of newer entry points can
//! still panic on an older driver: that is cudarc's behaviour, outside this
//! crate (check [`Backend::driver_version`] first).
//!
//! The checks this crate runs on the simulator's 11.4 profile
//! (`crates/driver/tests/cuda_11_4_sim.rs`) cannot reach cudarc (it loads the
//! real driver only); the table above is the evidence for the cudarc paths.

use crate::table::{missing_entry, CudaApi, NvrtcApi};
use crate::{Backend, Error};

/// One entry point the loaded libraries lack.
#[derive(Debug)]
#[non_exhaustive]
pub struct MissingEntry {
    /// The C entry point.
    pub symbol: &'static str,
    /// The release that introduced it, as `cuDriverGetVersion` writes
    /// versions (12040 is CUDA 12.4), where it is one of the table's.
    pub since: Option<i32>,
    /// What a call needing it gets: [`Error::NeedsNewerDriver`] or
    /// [`Error::NotSupported`].
    pub error: Error,
    /// What the project loses without it (one line).
    pub costs: &'static str,
}

/// What the project loses without the entry point `symbol` (one line).
pub fn costs(symbol: &str) -> &'static str {
    match symbol {
        "cuFuncGetParamInfo" => {
            "launches are not checked against the kernel's parameter sizes (they still run)"
        }
        "cuMemGetHandleForAddressRange" => {
            "the dma-buf import probe cannot run (its answer is Unknown)"
        }
        "cuDeviceGetNvSciSyncAttributes" => {
            "NvSciSync semaphores with CUDA (the NvSci transport, the jetson backend)"
        }
        "cuEventCreateFromEGLSync" => "EGL syncs as CUDA events",
        s if s.starts_with("cuEGLStream") => "EGLStream interop (the egl backend on a GPU)",
        s if s.starts_with("cuGraphics") => "EGLImage interop",
        s if s.starts_with("nvrtc") => {
            "run-time compilation (the kernel consumer of the pipeline's jetson and gpu backends)"
        }
        _ => "the operations that call it fail with the error shown",
    }
}

impl Backend {
    /// Every CUDA and NVRTC entry point of the table this backend lacks,
    /// with the error a call needing it gets and what it costs; empty on a
    /// complete driver. (NvSci libraries are reported by the loader notes
    /// and the NvSci probes, not here.)
    pub fn missing_entry_points(&self) -> Vec<MissingEntry> {
        let table = self.table();
        let cuda = table
            .cuda
            .missing()
            .map(|s| (s, missing_entry(&table.cuda, s)));
        let nvrtc = table
            .nvrtc
            .missing()
            .map(|s| (s, missing_entry(&table.nvrtc, s)));
        cuda.chain(nvrtc)
            .map(|(symbol, error)| MissingEntry {
                symbol,
                since: tegra_interop_sys::versions::since(symbol),
                error,
                costs: costs(symbol),
            })
            .collect()
    }

    /// Whether the entry point `symbol` (C name, CUDA or NVRTC) can be
    /// called on this backend: `Ok` when the table has it, else the error a
    /// call needing it gets ([`Error::NeedsNewerDriver`] naming the release
    /// that introduced it, or [`Error::NotSupported`]); a name that is not
    /// one of the table's is [`Error::NotSupported`] too.
    pub fn entry_point(&self, symbol: &str) -> Result<(), Error> {
        let table = self.table();
        if let Some(name) = CudaApi::ENTRY_POINTS.iter().find(|n| **n == symbol) {
            return match table.cuda.present().any(|p| p == *name) {
                true => Ok(()),
                false => Err(missing_entry(&table.cuda, name)),
            };
        }
        if let Some(name) = NvrtcApi::ENTRY_POINTS.iter().find(|n| **n == symbol) {
            return match table.nvrtc.present().any(|p| p == *name) {
                true => Ok(()),
                false => Err(missing_entry(&table.nvrtc, name)),
            };
        }
        Err(Error::NotSupported {
            symbol: "(not an entry point of the table)",
            library: CudaApi::LIBRARY,
            reason: None,
        })
    }
}
