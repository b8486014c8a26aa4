//! The seam: one table of C entry points, resolved at run time.
//!
//! Everything above this module is the same code for the real driver and for
//! the simulator (`tegra-interop-sim`), which fills the same structs with its
//! own `extern "C"` functions. Each entry is optional: a symbol that the
//! installed driver lacks (for example `cuDeviceGetNvSciSyncAttributes`
//! outside Tegra, or every NvSci symbol on a discrete GPU) is `None`, and
//! calling it yields [`crate::Error::NotSupported`] naming the symbol.
//!
//! The field names are the C API names; their types are the generated
//! `PFN_*` types of `tegra-interop-sys`; the symbol each one resolves to is
//! the generated `symbols::*` constant (for example `cuMemFree` resolves
//! `cuMemFree_v2`).
#![allow(non_snake_case)]

use tegra_interop_sys::{cuda, nvsci};

macro_rules! api_struct {
    (
        $(#[$meta:meta])*
        $name:ident, $module:ident, $library:literal { $($field:ident: $pfn:ident,)* }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Default)]
        pub struct $name {
            $(
                #[doc = concat!("`", stringify!($field), "`, if the library exports it.")]
                pub $field: $module::$pfn,
            )*
        }

        impl $name {
            /// The library (soname) these entry points live in.
            pub const LIBRARY: &'static str = $library;

            /// A table where every entry is missing.
            pub const fn empty() -> Self {
                $name { $($field: None,)* }
            }

            /// Resolves every entry from `library`; a missing symbol stays `None`.
            ///
            /// # Safety
            /// `library` must be the library named by [`Self::LIBRARY`] (or one
            /// with the same C ABI): each resolved address is trusted to have
            /// the signature of its `PFN_` type.
            pub unsafe fn resolve(library: &libloading::Library) -> Self {
                $name {
                    $(
                        // SAFETY: the caller guarantees the library's ABI; the
                        // symbol name comes from the same header as the type.
                        $field: unsafe {
                            library
                                .get::<$module::$pfn>($module::symbols::$field.to_bytes_with_nul())
                                .ok()
                                .and_then(|s| *s)
                        },
                    )*
                }
            }

            /// Names of the entries that are present.
            pub fn present(&self) -> impl Iterator<Item = &'static str> + '_ {
                [$((stringify!($field), self.$field.is_some()),)*]
                    .into_iter()
                    .filter_map(|(n, p)| p.then_some(n))
            }

            /// Names of the entries that are missing.
            pub fn missing(&self) -> impl Iterator<Item = &'static str> + '_ {
                [$((stringify!($field), self.$field.is_some()),)*]
                    .into_iter()
                    .filter_map(|(n, p)| (!p).then_some(n))
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                let present = self.present().count();
                let missing = self.missing().count();
                f.debug_struct(stringify!($name))
                    .field("present", &present)
                    .field("missing", &missing)
                    .finish()
            }
        }
    };
}

api_struct! {
    /// CUDA driver entry points (`libcuda.so.1`).
    CudaApi, cuda, "libcuda.so.1" {
        cuInit: PFN_cuInit,
        cuDriverGetVersion: PFN_cuDriverGetVersion,
        cuGetErrorName: PFN_cuGetErrorName,
        cuGetErrorString: PFN_cuGetErrorString,
        cuDeviceGetCount: PFN_cuDeviceGetCount,
        cuDeviceGet: PFN_cuDeviceGet,
        cuDeviceGetName: PFN_cuDeviceGetName,
        cuDeviceGetUuid_v2: PFN_cuDeviceGetUuid_v2,
        cuDeviceGetAttribute: PFN_cuDeviceGetAttribute,
        cuDevicePrimaryCtxRetain: PFN_cuDevicePrimaryCtxRetain,
        cuDevicePrimaryCtxRelease: PFN_cuDevicePrimaryCtxRelease,
        cuDevicePrimaryCtxReset: PFN_cuDevicePrimaryCtxReset,
        cuCtxCreate: PFN_cuCtxCreate,
        cuCtxDestroy: PFN_cuCtxDestroy,
        cuCtxSetCurrent: PFN_cuCtxSetCurrent,
        cuCtxGetCurrent: PFN_cuCtxGetCurrent,
        cuCtxGetDevice: PFN_cuCtxGetDevice,
        cuCtxSynchronize: PFN_cuCtxSynchronize,
        cuStreamCreate: PFN_cuStreamCreate,
        cuStreamDestroy: PFN_cuStreamDestroy,
        cuStreamSynchronize: PFN_cuStreamSynchronize,
        cuStreamQuery: PFN_cuStreamQuery,
        cuStreamGetCtx: PFN_cuStreamGetCtx,
        cuMemAlloc: PFN_cuMemAlloc,
        cuMemFree: PFN_cuMemFree,
        cuMemcpyHtoD: PFN_cuMemcpyHtoD,
        cuMemcpyDtoH: PFN_cuMemcpyDtoH,
        cuMemsetD8: PFN_cuMemsetD8,
        cuMemcpy3D: PFN_cuMemcpy3D,
        cuMipmappedArrayDestroy: PFN_cuMipmappedArrayDestroy,
        cuMipmappedArrayGetLevel: PFN_cuMipmappedArrayGetLevel,
        cuImportExternalMemory: PFN_cuImportExternalMemory,
        cuExternalMemoryGetMappedBuffer: PFN_cuExternalMemoryGetMappedBuffer,
        cuExternalMemoryGetMappedMipmappedArray: PFN_cuExternalMemoryGetMappedMipmappedArray,
        cuDestroyExternalMemory: PFN_cuDestroyExternalMemory,
        cuImportExternalSemaphore: PFN_cuImportExternalSemaphore,
        cuSignalExternalSemaphoresAsync: PFN_cuSignalExternalSemaphoresAsync,
        cuWaitExternalSemaphoresAsync: PFN_cuWaitExternalSemaphoresAsync,
        cuDestroyExternalSemaphore: PFN_cuDestroyExternalSemaphore,
        cuDeviceGetNvSciSyncAttributes: PFN_cuDeviceGetNvSciSyncAttributes,
        cuLaunchHostFunc: PFN_cuLaunchHostFunc,
    }
}

api_struct! {
    /// NvSciBuf entry points (`libnvscibuf.so.1`).
    NvSciBufApi, nvsci, "libnvscibuf.so.1" {
        NvSciBufModuleOpen: PFN_NvSciBufModuleOpen,
        NvSciBufModuleClose: PFN_NvSciBufModuleClose,
        NvSciBufAttrListCreate: PFN_NvSciBufAttrListCreate,
        NvSciBufAttrListFree: PFN_NvSciBufAttrListFree,
        NvSciBufAttrListSetAttrs: PFN_NvSciBufAttrListSetAttrs,
        NvSciBufAttrListGetAttrs: PFN_NvSciBufAttrListGetAttrs,
        NvSciBufAttrListReconcile: PFN_NvSciBufAttrListReconcile,
        NvSciBufAttrListReconcileAndObjAlloc: PFN_NvSciBufAttrListReconcileAndObjAlloc,
        NvSciBufObjAlloc: PFN_NvSciBufObjAlloc,
        NvSciBufObjDup: PFN_NvSciBufObjDup,
        NvSciBufObjDupWithReducePerm: PFN_NvSciBufObjDupWithReducePerm,
        NvSciBufObjFree: PFN_NvSciBufObjFree,
        NvSciBufObjGetAttrList: PFN_NvSciBufObjGetAttrList,
        NvSciBufObjGetCpuPtr: PFN_NvSciBufObjGetCpuPtr,
        NvSciBufObjGetConstCpuPtr: PFN_NvSciBufObjGetConstCpuPtr,
        NvSciBufObjFlushCpuCacheRange: PFN_NvSciBufObjFlushCpuCacheRange,
        NvSciBufObjIpcExport: PFN_NvSciBufObjIpcExport,
        NvSciBufObjIpcImport: PFN_NvSciBufObjIpcImport,
        NvSciBufAttrListIpcExportUnreconciled: PFN_NvSciBufAttrListIpcExportUnreconciled,
        NvSciBufAttrListIpcExportReconciled: PFN_NvSciBufAttrListIpcExportReconciled,
        NvSciBufAttrListIpcImportUnreconciled: PFN_NvSciBufAttrListIpcImportUnreconciled,
        NvSciBufAttrListIpcImportReconciled: PFN_NvSciBufAttrListIpcImportReconciled,
        NvSciBufAttrListFreeDesc: PFN_NvSciBufAttrListFreeDesc,
        NvSciBufCheckVersionCompatibility: PFN_NvSciBufCheckVersionCompatibility,
    }
}

api_struct! {
    /// NvSciSync entry points (`libnvscisync.so.1`).
    NvSciSyncApi, nvsci, "libnvscisync.so.1" {
        NvSciSyncModuleOpen: PFN_NvSciSyncModuleOpen,
        NvSciSyncModuleClose: PFN_NvSciSyncModuleClose,
        NvSciSyncCpuWaitContextAlloc: PFN_NvSciSyncCpuWaitContextAlloc,
        NvSciSyncCpuWaitContextFree: PFN_NvSciSyncCpuWaitContextFree,
        NvSciSyncAttrListCreate: PFN_NvSciSyncAttrListCreate,
        NvSciSyncAttrListFree: PFN_NvSciSyncAttrListFree,
        NvSciSyncAttrListSetAttrs: PFN_NvSciSyncAttrListSetAttrs,
        NvSciSyncAttrListGetAttrs: PFN_NvSciSyncAttrListGetAttrs,
        NvSciSyncAttrListReconcile: PFN_NvSciSyncAttrListReconcile,
        NvSciSyncAttrListReconcileAndObjAlloc: PFN_NvSciSyncAttrListReconcileAndObjAlloc,
        NvSciSyncObjAlloc: PFN_NvSciSyncObjAlloc,
        NvSciSyncObjDup: PFN_NvSciSyncObjDup,
        NvSciSyncObjFree: PFN_NvSciSyncObjFree,
        NvSciSyncObjGetAttrList: PFN_NvSciSyncObjGetAttrList,
        NvSciSyncObjIpcExport: PFN_NvSciSyncObjIpcExport,
        NvSciSyncObjIpcImport: PFN_NvSciSyncObjIpcImport,
        NvSciSyncIpcExportFence: PFN_NvSciSyncIpcExportFence,
        NvSciSyncIpcImportFence: PFN_NvSciSyncIpcImportFence,
        NvSciSyncObjGenerateFence: PFN_NvSciSyncObjGenerateFence,
        NvSciSyncObjSignal: PFN_NvSciSyncObjSignal,
        NvSciSyncFenceWait: PFN_NvSciSyncFenceWait,
        NvSciSyncFenceDup: PFN_NvSciSyncFenceDup,
        NvSciSyncFenceClear: PFN_NvSciSyncFenceClear,
        NvSciSyncFenceExtractFence: PFN_NvSciSyncFenceExtractFence,
        NvSciSyncFenceUpdateFence: PFN_NvSciSyncFenceUpdateFence,
        NvSciSyncFenceGetTimestamp: PFN_NvSciSyncFenceGetTimestamp,
        NvSciSyncCheckVersionCompatibility: PFN_NvSciSyncCheckVersionCompatibility,
        NvSciSyncAttrListIpcExportUnreconciled: PFN_NvSciSyncAttrListIpcExportUnreconciled,
        NvSciSyncAttrListIpcExportReconciled: PFN_NvSciSyncAttrListIpcExportReconciled,
        NvSciSyncAttrListIpcImportUnreconciled: PFN_NvSciSyncAttrListIpcImportUnreconciled,
        NvSciSyncAttrListIpcImportReconciled: PFN_NvSciSyncAttrListIpcImportReconciled,
        NvSciSyncAttrListFreeDesc: PFN_NvSciSyncAttrListFreeDesc,
    }
}

api_struct! {
    /// NvSciIpc entry points (`libnvsciipc.so`).
    NvSciIpcApi, nvsci, "libnvsciipc.so" {
        NvSciIpcInit: PFN_NvSciIpcInit,
        NvSciIpcDeinit: PFN_NvSciIpcDeinit,
        NvSciIpcOpenEndpoint: PFN_NvSciIpcOpenEndpoint,
        NvSciIpcCloseEndpoint: PFN_NvSciIpcCloseEndpoint,
        NvSciIpcCloseEndpointSafe: PFN_NvSciIpcCloseEndpointSafe,
        NvSciIpcResetEndpointSafe: PFN_NvSciIpcResetEndpointSafe,
        NvSciIpcGetLinuxEventFd: PFN_NvSciIpcGetLinuxEventFd,
        NvSciIpcGetEndpointInfo: PFN_NvSciIpcGetEndpointInfo,
        NvSciIpcGetEventSafe: PFN_NvSciIpcGetEventSafe,
        NvSciIpcReadSafe: PFN_NvSciIpcReadSafe,
        NvSciIpcWriteSafe: PFN_NvSciIpcWriteSafe,
    }
}

/// The whole seam: every C entry point the project calls.
#[derive(Clone, Copy, Debug, Default)]
pub struct FunctionTable {
    /// CUDA driver API.
    pub cuda: CudaApi,
    /// NvSciBuf.
    pub nvscibuf: NvSciBufApi,
    /// NvSciSync.
    pub nvscisync: NvSciSyncApi,
    /// NvSciIpc.
    pub nvsciipc: NvSciIpcApi,
}

impl FunctionTable {
    /// A table where every entry is missing.
    pub const fn empty() -> Self {
        FunctionTable {
            cuda: CudaApi::empty(),
            nvscibuf: NvSciBufApi::empty(),
            nvscisync: NvSciSyncApi::empty(),
            nvsciipc: NvSciIpcApi::empty(),
        }
    }
}

/// Takes a function out of a table, or returns [`crate::Error::NotSupported`]
/// naming the symbol and its library.
///
/// `entry!(table.cuda, cuImportExternalMemory)` evaluates to the bare
/// `unsafe extern "C" fn`.
#[macro_export]
#[doc(hidden)]
macro_rules! entry {
    ($api:expr, $field:ident) => {
        match $api.$field {
            Some(f) => f,
            None => {
                return Err($crate::Error::not_supported(
                    stringify!($field),
                    $crate::table::library_of(stringify!($field)),
                ))
            }
        }
    };
}

/// The library an entry point lives in, from its name.
pub fn library_of(symbol: &str) -> &'static str {
    if symbol.starts_with("NvSciBuf") {
        NvSciBufApi::LIBRARY
    } else if symbol.starts_with("NvSciSync") {
        NvSciSyncApi::LIBRARY
    } else if symbol.starts_with("NvSciIpc") {
        NvSciIpcApi::LIBRARY
    } else {
        CudaApi::LIBRARY
    }
}
