//! Instance slots: how C functions without a handle argument find their
//! simulator.
//!
//! A C function pointer cannot carry state, so every entry point exists once
//! per slot as a const-generic `extern "C"` trampoline (`cuInit::<3>` serves
//! the simulator in slot 3). [`crate::Sim::new`] claims a free slot and
//! [`crate::Sim::table`] hands out the trampolines of that slot; dropping the
//! `Sim` frees the slot. Slots are handed out round-robin, so a freed slot is
//! reused as late as possible; a call through a table whose `Sim` is gone
//! (and whose slot is still free) returns `CUDA_ERROR_DEINITIALIZED`.
//!
//! Every trampoline catches panics, so nothing unwinds into C.

use core::ffi::{c_char, c_int, c_uchar, c_uint, c_void};
use std::io::Write as _;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use tegra_interop_driver::table::CudaApi;
use tegra_interop_sys::cuda::*;

/// The implementations the entry points dispatch to (CUDA in `api`, dma-buf
/// export in `dmabuf`).
mod api {
    pub(super) use crate::api::*;
    pub(super) use crate::dmabuf::cu_mem_get_handle_for_address_range;
}
use crate::codes::{DEINITIALIZED, UNKNOWN};
use crate::instance::{Call, Instance};
use crate::DiagnosticKind;

/// How many simulators can be alive at once.
pub const SLOTS: usize = 64;

static REGISTRY: [RwLock<Option<Arc<Instance>>>; SLOTS] = [const { RwLock::new(None) }; SLOTS];
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// Puts `inst` into a free slot.
pub(crate) fn claim(inst: &Arc<Instance>) -> Option<usize> {
    let start = NEXT.load(Ordering::Relaxed);
    for i in 0..SLOTS {
        let idx = (start + i) % SLOTS;
        let mut w = REGISTRY[idx].write().unwrap_or_else(|e| e.into_inner());
        if w.is_none() {
            *w = Some(Arc::clone(inst));
            NEXT.store(idx + 1, Ordering::Relaxed);
            return Some(idx);
        }
    }
    None
}

/// Frees a slot.
pub(crate) fn release(slot: usize) {
    if let Some(s) = REGISTRY.get(slot) {
        *s.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

pub(crate) fn get(slot: usize) -> Option<Arc<Instance>> {
    REGISTRY
        .get(slot)?
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
}

/// The CUDA part of the table for `slot`.
pub(crate) fn cuda_table(slot: usize) -> CudaApi {
    TABLES.get(slot).map_or_else(CudaApi::empty, |f| f())
}

fn dispatch(
    slot: usize,
    symbol: &'static str,
    f: &mut dyn FnMut(&Call<'_>) -> CUresult,
) -> CUresult {
    let Some(inst) = get(slot) else {
        let _ = writeln!(
            std::io::stderr(),
            "tegra-interop-sim: {symbol} called through the table of a simulator that was dropped"
        );
        return DEINITIALIZED;
    };
    let run = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let index = match inst.enter(symbol) {
            Ok(i) => i,
            Err(code) => return code,
        };
        f(&Call {
            inst: &inst,
            index: Some(index),
            symbol,
        })
    }));
    match run {
        Ok(code) => code,
        Err(_) => {
            let inner = std::panic::catch_unwind(AssertUnwindSafe(|| {
                inst.diag(
                    None,
                    symbol,
                    DiagnosticKind::Internal,
                    "the simulator panicked (bug in the simulator)".into(),
                );
            }));
            drop(inner);
            UNKNOWN
        }
    }
}

macro_rules! entry_points {
    ($( $field:ident => $imp:ident ( $($arg:ident : $ty:ty),* ); )*) => {
        /// One non-generic function per entry point, taking the slot.
        #[allow(non_snake_case)]
        mod by_slot {
            use super::*;
            $(
                /// # Safety
                /// The C contract of the entry point of the same name.
                pub(super) unsafe fn $field(slot: usize, $($arg: $ty),*) -> CUresult {
                    dispatch(slot, stringify!($field), &mut |c: &Call<'_>| {
                        // SAFETY: the arguments come straight from the C
                        // caller, who owes the entry point's C contract.
                        unsafe { api::$imp(c, $($arg),*) }
                    })
                }
            )*
        }

        /// The `extern "C"` trampolines, one set per slot.
        #[allow(non_snake_case)]
        mod tramp {
            use super::*;
            $(
                /// # Safety
                /// The C contract of the entry point of the same name.
                pub(super) unsafe extern "C" fn $field<const S: usize>($($arg: $ty),*) -> CUresult {
                    // SAFETY: same contract, forwarded unchanged.
                    unsafe { by_slot::$field(S, $($arg),*) }
                }
            )*
        }

        fn cuda_api<const S: usize>() -> CudaApi {
            CudaApi {
                $( $field: Some(tramp::$field::<S>), )*
                cuGetErrorName: Some(cu_get_error_name),
                cuGetErrorString: Some(cu_get_error_string),
                ..CudaApi::empty()
            }
        }
    };
}

entry_points! {
    cuInit => cu_init(flags: c_uint);
    cuDriverGetVersion => cu_driver_get_version(version: *mut c_int);
    cuDeviceGetCount => cu_device_get_count(count: *mut c_int);
    cuDeviceGet => cu_device_get(device: *mut CUdevice, ordinal: c_int);
    cuDeviceGetName => cu_device_get_name(name: *mut c_char, len: c_int, dev: CUdevice);
    cuDeviceGetUuid_v2 => cu_device_get_uuid(uuid: *mut CUuuid, dev: CUdevice);
    cuDeviceGetAttribute => cu_device_get_attribute(value: *mut c_int, attrib: CUdevice_attribute, dev: CUdevice);
    cuDevicePrimaryCtxRetain => cu_device_primary_ctx_retain(pctx: *mut CUcontext, dev: CUdevice);
    cuDevicePrimaryCtxRelease => cu_device_primary_ctx_release(dev: CUdevice);
    cuDevicePrimaryCtxReset => cu_device_primary_ctx_reset(dev: CUdevice);
    cuCtxCreate => cu_ctx_create(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice);
    cuCtxDestroy => cu_ctx_destroy(ctx: CUcontext);
    cuCtxSetCurrent => cu_ctx_set_current(ctx: CUcontext);
    cuCtxGetCurrent => cu_ctx_get_current(pctx: *mut CUcontext);
    cuCtxGetDevice => cu_ctx_get_device(device: *mut CUdevice);
    cuCtxSynchronize => cu_ctx_synchronize();
    cuStreamCreate => cu_stream_create(stream: *mut CUstream, flags: c_uint);
    cuStreamDestroy => cu_stream_destroy(stream: CUstream);
    cuStreamSynchronize => cu_stream_synchronize(stream: CUstream);
    cuStreamQuery => cu_stream_query(stream: CUstream);
    cuStreamGetCtx => cu_stream_get_ctx(stream: CUstream, pctx: *mut CUcontext);
    cuMemAlloc => cu_mem_alloc(dptr: *mut CUdeviceptr, size: usize);
    cuMemFree => cu_mem_free(dptr: CUdeviceptr);
    cuMemGetHandleForAddressRange => cu_mem_get_handle_for_address_range(handle: *mut c_void, dptr: CUdeviceptr, size: usize, ty: CUmemRangeHandleType, flags: core::ffi::c_ulonglong);
    cuMemcpyHtoD => cu_memcpy_htod(dst: CUdeviceptr, src: *const c_void, n: usize);
    cuMemcpyDtoH => cu_memcpy_dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize);
    cuMemsetD8 => cu_memset_d8(dst: CUdeviceptr, value: c_uchar, n: usize);
    cuMemcpy3D => cu_memcpy_3d(copy: *const CUDA_MEMCPY3D);
    cuMipmappedArrayDestroy => cu_mipmapped_array_destroy(mip: CUmipmappedArray);
    cuMipmappedArrayGetLevel => cu_mipmapped_array_get_level(level_array: *mut CUarray, mip: CUmipmappedArray, level: c_uint);
    cuImportExternalMemory => cu_import_external_memory(ext: *mut CUexternalMemory, desc: *const CUDA_EXTERNAL_MEMORY_HANDLE_DESC);
    cuExternalMemoryGetMappedBuffer => cu_external_memory_get_mapped_buffer(dptr: *mut CUdeviceptr, ext: CUexternalMemory, desc: *const CUDA_EXTERNAL_MEMORY_BUFFER_DESC);
    cuExternalMemoryGetMappedMipmappedArray => cu_external_memory_get_mapped_mipmapped_array(mip: *mut CUmipmappedArray, ext: CUexternalMemory, desc: *const CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC);
    cuDestroyExternalMemory => cu_destroy_external_memory(ext: CUexternalMemory);
    cuImportExternalSemaphore => cu_import_external_semaphore(sem: *mut CUexternalSemaphore, desc: *const CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC);
    cuSignalExternalSemaphoresAsync => cu_signal_external_semaphores_async(sems: *const CUexternalSemaphore, params: *const CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS, n: c_uint, stream: CUstream);
    cuWaitExternalSemaphoresAsync => cu_wait_external_semaphores_async(sems: *const CUexternalSemaphore, params: *const CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS, n: c_uint, stream: CUstream);
    cuDestroyExternalSemaphore => cu_destroy_external_semaphore(sem: CUexternalSemaphore);
    cuDeviceGetNvSciSyncAttributes => cu_device_get_nvsci_sync_attributes(list: *mut c_void, dev: CUdevice, flags: c_int);
    cuLaunchHostFunc => cu_launch_host_func(stream: CUstream, f: CUhostFn, user: *mut c_void);
}

/// `cuGetErrorName`: a pure lookup, shared by all slots and not counted.
unsafe extern "C" fn cu_get_error_name(code: CUresult, out: *mut *const c_char) -> CUresult {
    // SAFETY: forwarded C caller pointer; the lookup cannot panic, but the
    // boundary is guarded anyway.
    std::panic::catch_unwind(|| unsafe { api::cu_get_error_name(code, out) }).unwrap_or(UNKNOWN)
}

/// `cuGetErrorString`: a pure lookup, shared by all slots and not counted.
unsafe extern "C" fn cu_get_error_string(code: CUresult, out: *mut *const c_char) -> CUresult {
    // SAFETY: as for `cu_get_error_name`.
    std::panic::catch_unwind(|| unsafe { api::cu_get_error_string(code, out) }).unwrap_or(UNKNOWN)
}

static TABLES: [fn() -> CudaApi; SLOTS] = [
    cuda_api::<0>,
    cuda_api::<1>,
    cuda_api::<2>,
    cuda_api::<3>,
    cuda_api::<4>,
    cuda_api::<5>,
    cuda_api::<6>,
    cuda_api::<7>,
    cuda_api::<8>,
    cuda_api::<9>,
    cuda_api::<10>,
    cuda_api::<11>,
    cuda_api::<12>,
    cuda_api::<13>,
    cuda_api::<14>,
    cuda_api::<15>,
    cuda_api::<16>,
    cuda_api::<17>,
    cuda_api::<18>,
    cuda_api::<19>,
    cuda_api::<20>,
    cuda_api::<21>,
    cuda_api::<22>,
    cuda_api::<23>,
    cuda_api::<24>,
    cuda_api::<25>,
    cuda_api::<26>,
    cuda_api::<27>,
    cuda_api::<28>,
    cuda_api::<29>,
    cuda_api::<30>,
    cuda_api::<31>,
    cuda_api::<32>,
    cuda_api::<33>,
    cuda_api::<34>,
    cuda_api::<35>,
    cuda_api::<36>,
    cuda_api::<37>,
    cuda_api::<38>,
    cuda_api::<39>,
    cuda_api::<40>,
    cuda_api::<41>,
    cuda_api::<42>,
    cuda_api::<43>,
    cuda_api::<44>,
    cuda_api::<45>,
    cuda_api::<46>,
    cuda_api::<47>,
    cuda_api::<48>,
    cuda_api::<49>,
    cuda_api::<50>,
    cuda_api::<51>,
    cuda_api::<52>,
    cuda_api::<53>,
    cuda_api::<54>,
    cuda_api::<55>,
    cuda_api::<56>,
    cuda_api::<57>,
    cuda_api::<58>,
    cuda_api::<59>,
    cuda_api::<60>,
    cuda_api::<61>,
    cuda_api::<62>,
    cuda_api::<63>,
];
