//! The entry points whose C arguments pair up: an array or buffer and its
//! length, a host function and its user pointer, a `void *` the handle type
//! gives a type. Each adapter here builds the slice (or callback) from the
//! C arguments, under the entry point's C contract, and calls the safe body
//! of the same name; every other entry point goes to its body directly.
//! The trampolines (`crate::trampolines`) call `abi::cuda::*` and
//! `abi::nvsci::*`, which re-export the bodies and shadow them with these
//! adapters.
//!
//! A NULL array becomes `None` (the body answers it with its own code, in
//! its own order of checks), a length of 0 an empty slice.
//!
//! # Safety
//! Each adapter relies on the C contract of its entry point: the pointer is
//! NULL or points at as many elements as the length argument says, valid
//! for the call (see [`crate::cmem`]).

#![allow(unsafe_code)]
#![allow(non_snake_case)]

/// CUDA.
pub(crate) mod cuda {
    pub(crate) use crate::cuda::*;

    use core::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

    use tegra_interop_sys::cuda::{
        CUdevice, CUdeviceptr, CUexternalSemaphore, CUmemRangeHandleType, CUresult, CUstream_st,
        CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS, CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
    };

    use crate::cmem::{CArr, CMut, CPtr, HostCallback, HostFn};
    use crate::instance::Call;

    pub(crate) fn cuDeviceGetName(
        c: &Call,
        name: CMut<c_char>,
        len: c_int,
        dev: CUdevice,
    ) -> CUresult {
        // SAFETY: cuDeviceGetName: `name` holds `len` writable chars.
        let name = unsafe { name.slice_mut(usize::try_from(len).unwrap_or(0)) };
        crate::cuda::cuDeviceGetName(c, name, len, dev)
    }

    pub(crate) fn cuMemGetHandleForAddressRange(
        c: &Call,
        handle: CMut<c_void>,
        dptr: CUdeviceptr,
        size: usize,
        handle_type: CUmemRangeHandleType,
        flags: c_ulonglong,
    ) -> CUresult {
        // SAFETY: for DMA_BUF_FD (the only type the body writes) `handle`
        // points at an int.
        let handle = unsafe { handle.cast::<c_int>() };
        crate::cuda::cuMemGetHandleForAddressRange(c, handle, dptr, size, handle_type, flags)
    }

    pub(crate) fn cuMemcpyHtoD(
        c: &Call,
        dst: CUdeviceptr,
        src: CPtr<c_void>,
        n: usize,
    ) -> CUresult {
        // SAFETY: cuMemcpyHtoD: `src` holds `n` readable bytes.
        let src = unsafe { src.cast::<u8>().slice(n) };
        crate::cuda::cuMemcpyHtoD(c, dst, src, n)
    }

    pub(crate) fn cuMemcpyDtoH(
        c: &Call,
        dst: CMut<c_void>,
        src: CUdeviceptr,
        n: usize,
    ) -> CUresult {
        // SAFETY: cuMemcpyDtoH: `dst` holds `n` writable bytes.
        let dst = unsafe { dst.cast::<u8>().slice_mut(n) };
        crate::cuda::cuMemcpyDtoH(c, dst, src, n)
    }

    pub(crate) fn cuSignalExternalSemaphoresAsync(
        c: &Call,
        sems: CPtr<CUexternalSemaphore>,
        params: CPtr<CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS>,
        n: c_uint,
        stream: CMut<CUstream_st>,
    ) -> CUresult {
        // SAFETY: cuSignalExternalSemaphoresAsync: `sems` and `params` each
        // hold `n` elements (and each block's fence pointer is valid).
        let (sems, params) = unsafe {
            (
                sems.slice(n as usize),
                params.slice(n as usize).map(|p| CArr::new(p)),
            )
        };
        crate::cuda::cuSignalExternalSemaphoresAsync(c, sems, params, n, stream)
    }

    pub(crate) fn cuWaitExternalSemaphoresAsync(
        c: &Call,
        sems: CPtr<CUexternalSemaphore>,
        params: CPtr<CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS>,
        n: c_uint,
        stream: CMut<CUstream_st>,
    ) -> CUresult {
        // SAFETY: cuWaitExternalSemaphoresAsync: as for the signal.
        let (sems, params) = unsafe {
            (
                sems.slice(n as usize),
                params.slice(n as usize).map(|p| CArr::new(p)),
            )
        };
        crate::cuda::cuWaitExternalSemaphoresAsync(c, sems, params, n, stream)
    }

    pub(crate) fn cuLaunchHostFunc(
        c: &Call,
        s: CMut<CUstream_st>,
        f: HostFn,
        user: CMut<c_void>,
    ) -> CUresult {
        // SAFETY: cuLaunchHostFunc: `f` may be called once with `user`, from
        // a driver thread, after the work queued before it.
        let cb = f.0.map(|f| unsafe { HostCallback::new(f, user.addr()) });
        crate::cuda::cuLaunchHostFunc(c, s, cb)
    }
}
