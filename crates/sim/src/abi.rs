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
        CUdevice, CUdeviceptr, CUexternalSemaphore, CUfunc_st, CUmemRangeHandleType, CUmodule,
        CUresult, CUstream_st, CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS,
        CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
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

    pub(crate) fn cuMemHostRegister(
        c: &Call,
        p: CMut<c_void>,
        size: usize,
        flags: c_uint,
    ) -> CUresult {
        let memory = (!p.is_null()).then(|| {
            // SAFETY: cuMemHostRegister: `p` is the start of `size` bytes of
            // the caller's memory, which by registering it the caller keeps
            // mapped, readable and writable until cuMemHostUnregister (whose
            // body drops the region; a refused registration drops it now).
            unsafe { crate::shm::Region::borrowed(p.as_raw().cast(), size) }
        });
        crate::cuda::cuMemHostRegister(c, p, size, flags, memory)
    }

    pub(crate) fn cuModuleLoadData(c: &Call, out: CMut<CUmodule>, image: CPtr<c_void>) -> CUresult {
        // SAFETY: cuModuleLoadData: a PTX image is a NUL-terminated string
        // (the simulator loads nothing else; a binary image ends at its
        // first NUL byte, which the real format holds early).
        let image = unsafe { image.cast::<c_char>() };
        crate::cuda::cuModuleLoadData(c, out, image)
    }

    /// `cuLaunchKernel`: reads one argument per parameter of the launched
    /// kernel (the sizes its registration gives) from `kernelParams`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn cuLaunchKernel(
        c: &Call,
        f: CMut<CUfunc_st>,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        shared: c_uint,
        s: CMut<CUstream_st>,
        params: CMut<*mut c_void>,
        extra: CMut<*mut c_void>,
    ) -> CUresult {
        let args = crate::cuda::launch_param_sizes(c, f.addr() as u64).and_then(|sizes| {
            if sizes.is_empty() {
                return Some(Vec::new());
            }
            // SAFETY: cuLaunchKernel: `kernelParams` holds one pointer per
            // parameter of the kernel (these are its sizes), each to as many
            // readable bytes as the parameter's size.
            let ptrs = unsafe { params.slice_mut(sizes.len()) }?;
            ptrs.iter()
                .zip(&sizes)
                .map(|(p, size)| {
                    // SAFETY: as above, for one parameter.
                    let bytes = unsafe { CPtr::new(p.cast_const().cast::<u8>()).slice(*size) }?;
                    Some(bytes.to_vec())
                })
                .collect::<Option<Vec<Vec<u8>>>>()
        });
        crate::cuda::cuLaunchKernel(
            c,
            f,
            [gx, gy, gz],
            [bx, by, bz],
            shared,
            s,
            args,
            !extra.is_null(),
        )
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
        let cb = f.0.map(|f| unsafe { HostCallback::new(f, user.as_raw()) });
        crate::cuda::cuLaunchHostFunc(c, s, cb)
    }
}

/// NvSci (buf, sync, ipc).
pub(crate) mod nvsci {
    pub(crate) use crate::nvsci::bodies::*;

    use core::ffi::c_void;

    use tegra_interop_sys::nvsci::{
        NvSciBufAttrKeyValuePair, NvSciBufAttrList, NvSciBufAttrListRec, NvSciBufModuleRec,
        NvSciBufObj, NvSciError, NvSciIpcEndpoint, NvSciSyncAttrKeyValuePair, NvSciSyncAttrList,
        NvSciSyncAttrListRec, NvSciSyncModuleRec, NvSciSyncObj,
    };

    use crate::cmem::{CArr, CMut, CPtr};
    use crate::instance::Call;
    use crate::nvsci::bodies as b;

    pub(crate) fn NvSciBufAttrListSetAttrs(
        c: &Call,
        list: CMut<NvSciBufAttrListRec>,
        pairs: CMut<NvSciBufAttrKeyValuePair>,
        n: usize,
    ) -> NvSciError {
        // SAFETY: NvSciBufAttrListSetAttrs: `pairs` holds `n` readable pairs
        // (the library only reads them), each value pointing at `len`
        // readable bytes.
        let pairs = unsafe { pairs.as_const().slice(n).map(|p| CArr::new(p)) };
        b::NvSciBufAttrListSetAttrs(c, list, pairs)
    }

    pub(crate) fn NvSciSyncAttrListSetAttrs(
        c: &Call,
        list: CMut<NvSciSyncAttrListRec>,
        pairs: CPtr<NvSciSyncAttrKeyValuePair>,
        n: usize,
    ) -> NvSciError {
        // SAFETY: NvSciSyncAttrListSetAttrs: as for the NvSciBuf twin.
        let pairs = unsafe { pairs.slice(n).map(|p| CArr::new(p)) };
        b::NvSciSyncAttrListSetAttrs(c, list, pairs)
    }

    pub(crate) fn NvSciBufAttrListGetAttrs(
        c: &Call,
        list: CMut<NvSciBufAttrListRec>,
        pairs: CMut<NvSciBufAttrKeyValuePair>,
        n: usize,
    ) -> NvSciError {
        // SAFETY: NvSciBufAttrListGetAttrs: `pairs` holds `n` readable and
        // writable pairs (keys in, value pointers and lengths out).
        let pairs = unsafe { pairs.slice_mut(n) };
        b::NvSciBufAttrListGetAttrs(c, list, pairs)
    }

    pub(crate) fn NvSciSyncAttrListGetAttrs(
        c: &Call,
        list: CMut<NvSciSyncAttrListRec>,
        pairs: CMut<NvSciSyncAttrKeyValuePair>,
        n: usize,
    ) -> NvSciError {
        // SAFETY: NvSciSyncAttrListGetAttrs: as for the NvSciBuf twin.
        let pairs = unsafe { pairs.slice_mut(n) };
        b::NvSciSyncAttrListGetAttrs(c, list, pairs)
    }

    /// An entry point taking an array of attribute-list handles and its
    /// count first (reconcile, export unreconciled), for both libraries.
    macro_rules! with_lists {
        ($name:ident ($lt:ty; $($a:ident: $t:ty),*)) => {
            pub(crate) fn $name(
                c: &Call,
                lists: CPtr<$lt>,
                n: usize,
                $($a: $t),*
            ) -> NvSciError {
                // SAFETY: the entry point's C contract: `lists` holds `n`
                // attribute-list handles.
                let lists = unsafe { lists.slice(n) };
                b::$name(c, lists, $($a),*)
            }
        };
    }

    with_lists!(NvSciBufAttrListReconcile(NvSciBufAttrList;
        out: CMut<NvSciBufAttrList>, conflict: CMut<NvSciBufAttrList>));
    with_lists!(NvSciSyncAttrListReconcile(NvSciSyncAttrList;
        out: CMut<NvSciSyncAttrList>, conflict: CMut<NvSciSyncAttrList>));
    with_lists!(NvSciBufAttrListReconcileAndObjAlloc(NvSciBufAttrList;
        obj: CMut<NvSciBufObj>, conflict: CMut<NvSciBufAttrList>));
    with_lists!(NvSciSyncAttrListReconcileAndObjAlloc(NvSciSyncAttrList;
        obj: CMut<NvSciSyncObj>, conflict: CMut<NvSciSyncAttrList>));
    with_lists!(NvSciBufAttrListIpcExportUnreconciled(NvSciBufAttrList;
        ep: NvSciIpcEndpoint, desc: CMut<*mut c_void>, len: CMut<usize>));
    with_lists!(NvSciSyncAttrListIpcExportUnreconciled(NvSciSyncAttrList;
        ep: NvSciIpcEndpoint, desc: CMut<*mut c_void>, len: CMut<usize>));

    pub(crate) fn NvSciBufAttrListIpcImportUnreconciled(
        c: &Call,
        module: CMut<NvSciBufModuleRec>,
        ep: NvSciIpcEndpoint,
        desc: CPtr<c_void>,
        len: usize,
        out: CMut<NvSciBufAttrList>,
    ) -> NvSciError {
        // SAFETY: NvSciBufAttrListIpcImportUnreconciled: `desc` holds `len`
        // readable bytes (the descriptor received from the peer).
        let desc = unsafe { desc.cast::<u8>().slice(len) };
        b::NvSciBufAttrListIpcImportUnreconciled(c, module, ep, desc, out)
    }

    pub(crate) fn NvSciSyncAttrListIpcImportUnreconciled(
        c: &Call,
        module: CMut<NvSciSyncModuleRec>,
        ep: NvSciIpcEndpoint,
        desc: CPtr<c_void>,
        len: usize,
        out: CMut<NvSciSyncAttrList>,
    ) -> NvSciError {
        // SAFETY: NvSciSyncAttrListIpcImportUnreconciled: as for the NvSciBuf twin.
        let desc = unsafe { desc.cast::<u8>().slice(len) };
        b::NvSciSyncAttrListIpcImportUnreconciled(c, module, ep, desc, out)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn NvSciBufAttrListIpcImportReconciled(
        c: &Call,
        module: CMut<NvSciBufModuleRec>,
        ep: NvSciIpcEndpoint,
        desc: CPtr<c_void>,
        len: usize,
        inputs: CPtr<NvSciBufAttrList>,
        n: usize,
        out: CMut<NvSciBufAttrList>,
    ) -> NvSciError {
        // SAFETY: NvSciBufAttrListIpcImportReconciled: `desc` holds `len`
        // readable bytes and `inputs` `n` attribute-list handles.
        let (desc, inputs) = unsafe { (desc.cast::<u8>().slice(len), inputs.slice(n)) };
        b::NvSciBufAttrListIpcImportReconciled(c, module, ep, desc, inputs, n, out)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn NvSciSyncAttrListIpcImportReconciled(
        c: &Call,
        module: CMut<NvSciSyncModuleRec>,
        ep: NvSciIpcEndpoint,
        desc: CPtr<c_void>,
        len: usize,
        inputs: CPtr<NvSciSyncAttrList>,
        n: usize,
        out: CMut<NvSciSyncAttrList>,
    ) -> NvSciError {
        // SAFETY: NvSciSyncAttrListIpcImportReconciled: as for the NvSciBuf twin.
        let (desc, inputs) = unsafe { (desc.cast::<u8>().slice(len), inputs.slice(n)) };
        b::NvSciSyncAttrListIpcImportReconciled(c, module, ep, desc, inputs, n, out)
    }

    pub(crate) fn NvSciIpcReadSafe(
        c: &Call,
        h: NvSciIpcEndpoint,
        buf: CMut<c_void>,
        size: u32,
        bytes: CMut<u32>,
    ) -> NvSciError {
        // SAFETY: NvSciIpcReadSafe: `buf` holds `size` writable bytes.
        let buf = unsafe { buf.cast::<u8>().slice_mut(size as usize) };
        b::NvSciIpcReadSafe(c, h, buf, size, bytes)
    }

    pub(crate) fn NvSciIpcWriteSafe(
        c: &Call,
        h: NvSciIpcEndpoint,
        buf: CPtr<c_void>,
        size: u32,
        bytes: CMut<u32>,
    ) -> NvSciError {
        // SAFETY: NvSciIpcWriteSafe: `buf` holds `size` readable bytes.
        let buf = unsafe { buf.cast::<u8>().slice(size as usize) };
        b::NvSciIpcWriteSafe(c, h, buf, size, bytes)
    }

    /// The extent given to a legacy read or write buffer: `size`, or 0 for
    /// a size past `u32` (the body refuses it before touching the buffer).
    fn legacy_len(size: usize) -> usize {
        if u32::try_from(size).is_ok() {
            size
        } else {
            0
        }
    }

    pub(crate) fn NvSciIpcRead(
        c: &Call,
        h: NvSciIpcEndpoint,
        buf: CMut<c_void>,
        size: usize,
        bytes: CMut<i32>,
    ) -> NvSciError {
        // SAFETY: NvSciIpcRead: `buf` holds `size` writable bytes.
        let buf = unsafe { buf.cast::<u8>().slice_mut(legacy_len(size)) };
        b::NvSciIpcRead(c, h, buf, size, bytes)
    }

    pub(crate) fn NvSciIpcWrite(
        c: &Call,
        h: NvSciIpcEndpoint,
        buf: CPtr<c_void>,
        size: usize,
        bytes: CMut<i32>,
    ) -> NvSciError {
        // SAFETY: NvSciIpcWrite: `buf` holds `size` readable bytes.
        let buf = unsafe { buf.cast::<u8>().slice(legacy_len(size)) };
        b::NvSciIpcWrite(c, h, buf, size, bytes)
    }
}

/// NVRTC.
pub(crate) mod nvrtc {
    pub(crate) use crate::nvrtc::{
        nvrtcCreateProgram, nvrtcDestroyProgram, nvrtcGetPTXSize, nvrtcGetProgramLogSize,
        nvrtcVersion,
    };

    use core::ffi::{c_char, c_int};

    use tegra_interop_sys::nvrtc::{_nvrtcProgram, nvrtcResult};

    use crate::cmem::{CMut, CPtr};
    use crate::instance::Call;

    pub(crate) fn nvrtcCompileProgram(
        c: &Call,
        prog: CMut<_nvrtcProgram>,
        count: c_int,
        options: CPtr<*const c_char>,
    ) -> nvrtcResult {
        let n = usize::try_from(count).unwrap_or(0);
        let strings = if n == 0 {
            Some(Vec::new())
        } else {
            // SAFETY: nvrtcCompileProgram: `options` holds `count` pointers
            // to NUL-terminated strings, valid for the call.
            unsafe { options.slice(n) }.and_then(|ptrs| {
                ptrs.iter()
                    .map(|p| {
                        // SAFETY: as above, for one option string.
                        unsafe { CPtr::new(*p) }
                            .c_str()
                            .map(|s| s.to_string_lossy().into_owned())
                    })
                    .collect::<Option<Vec<String>>>()
            })
        };
        crate::nvrtc::compile(c, prog, count, strings)
    }

    fn write_output(
        c: &Call,
        prog: CMut<_nvrtcProgram>,
        out: CMut<c_char>,
        ptx: bool,
    ) -> nvrtcResult {
        match crate::nvrtc::output(c, prog.addr() as u64, ptx) {
            Ok(bytes) => {
                // SAFETY: nvrtcGetPTX / nvrtcGetProgramLog: `out` holds as
                // many writable chars as the matching size call reported,
                // which is `bytes.len()` (the program is unchanged since:
                // the caller may not compile it concurrently).
                let out = unsafe { out.slice_mut(bytes.len()) };
                crate::nvrtc::fill(out, &bytes)
            }
            Err(e) => e,
        }
    }

    pub(crate) fn nvrtcGetPTX(
        c: &Call,
        prog: CMut<_nvrtcProgram>,
        out: CMut<c_char>,
    ) -> nvrtcResult {
        write_output(c, prog, out, true)
    }

    pub(crate) fn nvrtcGetProgramLog(
        c: &Call,
        prog: CMut<_nvrtcProgram>,
        out: CMut<c_char>,
    ) -> nvrtcResult {
        write_output(c, prog, out, false)
    }
}
