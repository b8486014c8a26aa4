//! The CUDA driver API called "raw": bare C function pointers resolved from libcuda.so.1 with
//! `libloading`, typed by `tegra_interop_sys::cuda::PFN_*` and named by
//! `tegra_interop_sys::cuda::symbols`. No validation, no RAII beyond what a caller writes.
//!
//! This is the C-level baseline the GPU smoke binary uses and the benchmarks compare the safe
//! wrappers against (`tegra_interop_testkit::raw_cuda`).
#![allow(non_snake_case)]
// The raw baseline passes CUDA handles (opaque pointers owned by the driver) straight to the
// driver, as C does; Rust never dereferences them. Checking them is what the safe wrappers are
// for, and what this baseline is measured against.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::ffi::{c_char, c_void, CStr};
use std::fmt;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};

use libloading::Library;
use tegra_interop_sys::cuda as sys;

pub use sys::{CUcontext, CUdevice, CUdeviceptr, CUexternalMemory, CUexternalSemaphore, CUstream};

/// Maps `Option<unsafe extern "C" fn ..>` (the generated `PFN_*` types) to the bare fn type.
pub trait Bare {
    /// The function pointer type without the `Option`.
    type F: Copy;
}
impl<F: Copy> Bare for Option<F> {
    type F = F;
}

/// A failed CUDA call: its name, the raw code and the driver's name for it.
#[derive(Debug, Clone)]
pub struct CuError {
    /// The C function.
    pub call: &'static str,
    /// The raw `CUresult`.
    pub code: u32,
    /// `cuGetErrorName`, when the driver knows the code.
    pub name: String,
}

impl fmt::Display for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} ({})", self.call, self.name, self.code)
    }
}

impl std::error::Error for CuError {}

macro_rules! raw_table {
    ($($name:ident),* $(,)?) => {
        /// Bare function pointers into libcuda.so.1 (valid while the [`RawCuda`] lives).
        #[derive(Clone, Copy)]
        pub struct RawFns {
            $(
                #[doc = concat!("`", stringify!($name), "`")]
                pub $name: <paste_pfn!($name) as Bare>::F,
            )*
        }

        impl RawFns {
            /// # Safety
            /// `lib` must be the CUDA driver library; the pointers are valid while it is loaded.
            unsafe fn load(lib: &Library) -> Result<Self, String> {
                Ok(Self {
                    $(
                        $name: {
                            // SAFETY: the generated PFN type is the C prototype of this symbol.
                            let sym = unsafe { lib.get::<paste_pfn!($name)>(sys::symbols::$name) }
                                .map_err(|e| format!("{}: {e}", stringify!($name)))?;
                            (*sym).ok_or_else(|| format!("{} is NULL", stringify!($name)))?
                        },
                    )*
                })
            }
        }
    };
}

// `PFN_<name>` for a given name.
macro_rules! paste_pfn {
    (cuInit) => {
        sys::PFN_cuInit
    };
    (cuDriverGetVersion) => {
        sys::PFN_cuDriverGetVersion
    };
    (cuGetErrorName) => {
        sys::PFN_cuGetErrorName
    };
    (cuDeviceGet) => {
        sys::PFN_cuDeviceGet
    };
    (cuDeviceGetName) => {
        sys::PFN_cuDeviceGetName
    };
    (cuDeviceGetUuid_v2) => {
        sys::PFN_cuDeviceGetUuid_v2
    };
    (cuDeviceGetAttribute) => {
        sys::PFN_cuDeviceGetAttribute
    };
    (cuDevicePrimaryCtxRetain) => {
        sys::PFN_cuDevicePrimaryCtxRetain
    };
    (cuDevicePrimaryCtxRelease) => {
        sys::PFN_cuDevicePrimaryCtxRelease
    };
    (cuCtxSetCurrent) => {
        sys::PFN_cuCtxSetCurrent
    };
    (cuCtxGetCurrent) => {
        sys::PFN_cuCtxGetCurrent
    };
    (cuCtxCreate) => {
        sys::PFN_cuCtxCreate
    };
    (cuCtxDestroy) => {
        sys::PFN_cuCtxDestroy
    };
    (cuStreamGetCtx) => {
        sys::PFN_cuStreamGetCtx
    };
    (cuCtxSynchronize) => {
        sys::PFN_cuCtxSynchronize
    };
    (cuStreamCreate) => {
        sys::PFN_cuStreamCreate
    };
    (cuStreamDestroy) => {
        sys::PFN_cuStreamDestroy
    };
    (cuStreamSynchronize) => {
        sys::PFN_cuStreamSynchronize
    };
    (cuStreamQuery) => {
        sys::PFN_cuStreamQuery
    };
    (cuMemcpyDtoH) => {
        sys::PFN_cuMemcpyDtoH
    };
    (cuMemcpyHtoD) => {
        sys::PFN_cuMemcpyHtoD
    };
    (cuMemFree) => {
        sys::PFN_cuMemFree
    };
    (cuImportExternalMemory) => {
        sys::PFN_cuImportExternalMemory
    };
    (cuExternalMemoryGetMappedBuffer) => {
        sys::PFN_cuExternalMemoryGetMappedBuffer
    };
    (cuExternalMemoryGetMappedMipmappedArray) => {
        sys::PFN_cuExternalMemoryGetMappedMipmappedArray
    };
    (cuMipmappedArrayDestroy) => {
        sys::PFN_cuMipmappedArrayDestroy
    };
    (cuDestroyExternalMemory) => {
        sys::PFN_cuDestroyExternalMemory
    };
    (cuImportExternalSemaphore) => {
        sys::PFN_cuImportExternalSemaphore
    };
    (cuSignalExternalSemaphoresAsync) => {
        sys::PFN_cuSignalExternalSemaphoresAsync
    };
    (cuWaitExternalSemaphoresAsync) => {
        sys::PFN_cuWaitExternalSemaphoresAsync
    };
    (cuDestroyExternalSemaphore) => {
        sys::PFN_cuDestroyExternalSemaphore
    };
}

raw_table!(
    cuInit,
    cuDriverGetVersion,
    cuGetErrorName,
    cuDeviceGet,
    cuDeviceGetName,
    cuDeviceGetUuid_v2,
    cuDeviceGetAttribute,
    cuDevicePrimaryCtxRetain,
    cuDevicePrimaryCtxRelease,
    cuCtxSetCurrent,
    cuCtxGetCurrent,
    cuCtxCreate,
    cuCtxDestroy,
    cuStreamGetCtx,
    cuCtxSynchronize,
    cuStreamCreate,
    cuStreamDestroy,
    cuStreamSynchronize,
    cuStreamQuery,
    cuMemcpyDtoH,
    cuMemcpyHtoD,
    cuMemFree,
    cuImportExternalMemory,
    cuExternalMemoryGetMappedBuffer,
    cuExternalMemoryGetMappedMipmappedArray,
    cuMipmappedArrayDestroy,
    cuDestroyExternalMemory,
    cuImportExternalSemaphore,
    cuSignalExternalSemaphoresAsync,
    cuWaitExternalSemaphoresAsync,
    cuDestroyExternalSemaphore,
);

/// libcuda.so.1 and its bare function pointers.
pub struct RawCuda {
    /// The function pointers (copy them out for tight loops).
    pub f: RawFns,
    _lib: Library,
}

impl RawCuda {
    /// Opens libcuda.so.1 and resolves every entry point of [`RawFns`].
    pub fn load() -> Result<Self, String> {
        // SAFETY: opening the CUDA driver runs its initialisers, which is how it is meant to be
        // used.
        let lib =
            unsafe { Library::new("libcuda.so.1") }.map_err(|e| format!("libcuda.so.1: {e}"))?;
        // SAFETY: `lib` is the CUDA driver; it is kept alive next to the pointers.
        let f = unsafe { RawFns::load(&lib) }?;
        Ok(Self { f, _lib: lib })
    }

    /// Turns a `CUresult` into `Ok` / [`CuError`].
    pub fn check(&self, call: &'static str, r: sys::CUresult) -> Result<(), CuError> {
        if r.0 == 0 {
            return Ok(());
        }
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: valid out pointer; the driver returns a static string or an error.
        let known = unsafe { (self.f.cuGetErrorName)(r, &mut p) }.0 == 0 && !p.is_null();
        let name = if known {
            // SAFETY: the driver returned a NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        } else {
            "unknown".to_owned()
        };
        Err(CuError {
            call,
            code: r.0,
            name,
        })
    }

    /// `cuInit(0)`, then the driver version (e.g. 13000 for CUDA 13.0).
    pub fn init(&self) -> Result<i32, CuError> {
        // SAFETY: plain call.
        self.check("cuInit", unsafe { (self.f.cuInit)(0) })?;
        let mut v = 0;
        // SAFETY: valid out pointer.
        self.check("cuDriverGetVersion", unsafe {
            (self.f.cuDriverGetVersion)(&mut v)
        })?;
        Ok(v)
    }

    /// Device handle of ordinal `ordinal`.
    pub fn device(&self, ordinal: i32) -> Result<CUdevice, CuError> {
        let mut d = 0;
        // SAFETY: valid out pointer.
        self.check("cuDeviceGet", unsafe {
            (self.f.cuDeviceGet)(&mut d, ordinal)
        })?;
        Ok(d)
    }

    /// The device's name.
    pub fn device_name(&self, dev: CUdevice) -> Result<String, CuError> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 bytes, as passed.
        self.check("cuDeviceGetName", unsafe {
            (self.f.cuDeviceGetName)(buf.as_mut_ptr(), 256, dev)
        })?;
        let bytes: Vec<u8> = buf
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The device UUID (the bytes Vulkan reports as `deviceUUID`).
    pub fn device_uuid(&self, dev: CUdevice) -> Result<[u8; 16], CuError> {
        let mut u = sys::CUuuid::default();
        // SAFETY: valid out pointer.
        self.check("cuDeviceGetUuid_v2", unsafe {
            (self.f.cuDeviceGetUuid_v2)(&mut u, dev)
        })?;
        Ok(u.bytes.map(|c| c as u8))
    }

    /// An integer device attribute.
    pub fn attribute(&self, dev: CUdevice, attr: u32) -> Result<i32, CuError> {
        let mut v = 0;
        // SAFETY: valid out pointer.
        self.check("cuDeviceGetAttribute", unsafe {
            (self.f.cuDeviceGetAttribute)(&mut v, sys::CUdevice_attribute_enum(attr), dev)
        })?;
        Ok(v)
    }

    /// Retains the primary context of `dev` and makes it current.
    pub fn primary_context(&self, dev: CUdevice) -> Result<CUcontext, CuError> {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        self.check("cuDevicePrimaryCtxRetain", unsafe {
            (self.f.cuDevicePrimaryCtxRetain)(&mut ctx, dev)
        })?;
        // SAFETY: `ctx` was just retained.
        self.check("cuCtxSetCurrent", unsafe { (self.f.cuCtxSetCurrent)(ctx) })?;
        Ok(ctx)
    }

    /// Releases the primary context retained by [`RawCuda::primary_context`].
    pub fn release_primary_context(&self, dev: CUdevice) -> Result<(), CuError> {
        // SAFETY: plain call; balanced with a retain.
        self.check("cuDevicePrimaryCtxRelease", unsafe {
            (self.f.cuDevicePrimaryCtxRelease)(dev)
        })
    }

    /// A new stream (flags 0) in the current context.
    pub fn stream(&self) -> Result<CUstream, CuError> {
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        self.check("cuStreamCreate", unsafe {
            (self.f.cuStreamCreate)(&mut s, 0)
        })?;
        Ok(s)
    }

    /// Blocks until the stream's work is done.
    pub fn sync(&self, s: CUstream) -> Result<(), CuError> {
        // SAFETY: plain call on a live stream.
        self.check("cuStreamSynchronize", unsafe {
            (self.f.cuStreamSynchronize)(s)
        })
    }

    /// Destroys a stream.
    pub fn destroy_stream(&self, s: CUstream) -> Result<(), CuError> {
        // SAFETY: plain call on a live stream, which is not used afterwards.
        self.check("cuStreamDestroy", unsafe { (self.f.cuStreamDestroy)(s) })
    }

    /// Imports an `OPAQUE_FD` allocation of `size` bytes. The fd passes to the driver on
    /// success and is closed here on failure.
    pub fn import_memory_fd(
        &self,
        fd: OwnedFd,
        size: u64,
        dedicated: bool,
    ) -> Result<CUexternalMemory, CuError> {
        let mut desc = sys::CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
            type_: sys::CUexternalMemoryHandleType_enum::CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
            size,
            flags: if dedicated {
                sys::CUDA_EXTERNAL_MEMORY_DEDICATED
            } else {
                0
            },
            ..Default::default()
        };
        desc.handle.fd = fd.as_raw_fd();
        let mut mem: CUexternalMemory = std::ptr::null_mut();
        // SAFETY: the descriptor is fully initialised (reserved fields zero) and outlives the
        // call; `mem` is a valid out pointer.
        let r = unsafe { (self.f.cuImportExternalMemory)(&mut mem, &desc) };
        self.check("cuImportExternalMemory", r)?;
        // The driver owns the fd now: do not close it.
        let _ = fd.into_raw_fd();
        Ok(mem)
    }

    /// Maps `size` bytes at `offset` of an imported allocation as a device pointer.
    pub fn map_buffer(
        &self,
        mem: CUexternalMemory,
        offset: u64,
        size: u64,
    ) -> Result<CUdeviceptr, CuError> {
        let desc = sys::CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
            offset,
            size,
            ..Default::default()
        };
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: valid descriptor and out pointer; `mem` is a live import.
        self.check("cuExternalMemoryGetMappedBuffer", unsafe {
            (self.f.cuExternalMemoryGetMappedBuffer)(&mut ptr, mem, &desc)
        })?;
        Ok(ptr)
    }

    /// Frees a mapped buffer (`cuMemFree`).
    pub fn free(&self, ptr: CUdeviceptr) -> Result<(), CuError> {
        // SAFETY: `ptr` came from `map_buffer` and is not used afterwards.
        self.check("cuMemFree", unsafe { (self.f.cuMemFree)(ptr) })
    }

    /// Destroys an imported allocation.
    pub fn destroy_memory(&self, mem: CUexternalMemory) -> Result<(), CuError> {
        // SAFETY: `mem` is a live import, not used afterwards.
        self.check("cuDestroyExternalMemory", unsafe {
            (self.f.cuDestroyExternalMemory)(mem)
        })
    }

    /// Copies device memory to `out`.
    pub fn dtoh(&self, out: &mut [u8], src: CUdeviceptr) -> Result<(), CuError> {
        // SAFETY: `out` is writable for its length; the caller passes a mapping at least as long.
        self.check("cuMemcpyDtoH", unsafe {
            (self.f.cuMemcpyDtoH)(out.as_mut_ptr().cast::<c_void>(), src, out.len())
        })
    }

    /// Copies `data` to device memory.
    pub fn htod(&self, dst: CUdeviceptr, data: &[u8]) -> Result<(), CuError> {
        // SAFETY: `data` is readable for its length; the caller passes a mapping at least as long.
        self.check("cuMemcpyHtoD", unsafe {
            (self.f.cuMemcpyHtoD)(dst, data.as_ptr().cast::<c_void>(), data.len())
        })
    }

    /// Imports a semaphore fd: `TIMELINE_SEMAPHORE_FD` when `timeline`, else `OPAQUE_FD`.
    /// The fd passes to the driver on success and is closed here on failure.
    pub fn import_semaphore_fd(
        &self,
        fd: OwnedFd,
        timeline: bool,
    ) -> Result<CUexternalSemaphore, CuError> {
        let mut desc = sys::CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC {
            type_: if timeline {
                sys::CUexternalSemaphoreHandleType_enum::CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD
            } else {
                sys::CUexternalSemaphoreHandleType_enum::CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD
            },
            ..Default::default()
        };
        desc.handle.fd = fd.as_raw_fd();
        let mut sem: CUexternalSemaphore = std::ptr::null_mut();
        // SAFETY: fully initialised descriptor and valid out pointer.
        let r = unsafe { (self.f.cuImportExternalSemaphore)(&mut sem, &desc) };
        self.check("cuImportExternalSemaphore", r)?;
        let _ = fd.into_raw_fd();
        Ok(sem)
    }

    /// Enqueues a signal of `value` (ignored by binary semaphores) on `stream`.
    pub fn signal(
        &self,
        sem: CUexternalSemaphore,
        value: u64,
        stream: CUstream,
    ) -> Result<(), CuError> {
        let mut p = sys::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
        p.params.fence.value = value;
        // SAFETY: one live semaphore and one zero-initialised parameter block.
        self.check("cuSignalExternalSemaphoresAsync", unsafe {
            (self.f.cuSignalExternalSemaphoresAsync)(&sem, &p, 1, stream)
        })
    }

    /// Enqueues a wait for `value` (ignored by binary semaphores) on `stream`.
    pub fn wait(
        &self,
        sem: CUexternalSemaphore,
        value: u64,
        stream: CUstream,
    ) -> Result<(), CuError> {
        let mut p = sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default();
        p.params.fence.value = value;
        // SAFETY: one live semaphore and one zero-initialised parameter block.
        self.check("cuWaitExternalSemaphoresAsync", unsafe {
            (self.f.cuWaitExternalSemaphoresAsync)(&sem, &p, 1, stream)
        })
    }

    /// Destroys an imported semaphore (no signal/wait may be outstanding).
    pub fn destroy_semaphore(&self, sem: CUexternalSemaphore) -> Result<(), CuError> {
        // SAFETY: `sem` is a live import, not used afterwards.
        self.check("cuDestroyExternalSemaphore", unsafe {
            (self.f.cuDestroyExternalSemaphore)(sem)
        })
    }
}
