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
            /// What the run-time loader said while filling this table
            /// ([`Backend::real`](crate::Backend::real)): why the library
            /// did not load, or why a symbol is missing. `None` for tables
            /// filled by someone else (the simulator, a test double).
            pub loader: Option<&'static LoaderNotes>,
        }

        impl $name {
            /// The library (soname) these entry points live in.
            pub const LIBRARY: &'static str = $library;

            /// A table where every entry is missing.
            pub const fn empty() -> Self {
                $name { $($field: None,)* loader: None }
            }

            /// Resolves every entry from `library`; a missing symbol stays `None`
            /// and the loader's reason for it is kept in [`loader`](Self::loader).
            ///
            /// # Safety
            /// `library` must be the library named by [`Self::LIBRARY`] (or one
            /// with the same C ABI): each resolved address is trusted to have
            /// the signature of its `PFN_` type.
            pub unsafe fn resolve(library: &libloading::Library) -> Self {
                let mut missing = Vec::new();
                let mut table = $name {
                    $(
                        // SAFETY: the caller guarantees the library's ABI; the
                        // symbol name comes from the same header as the type.
                        $field: match unsafe {
                            library.get::<$module::$pfn>($module::symbols::$field.to_bytes_with_nul())
                        } {
                            Ok(symbol) => match *symbol {
                                Some(f) => Some(f),
                                None => {
                                    missing.push((stringify!($field), String::from("the symbol's address is NULL")));
                                    None
                                }
                            },
                            Err(e) => {
                                missing.push((stringify!($field), loader_reason(&e, None)));
                                None
                            }
                        },
                    )*
                    loader: None,
                };
                table.loader = Some(intern(LoaderNotes {
                    library: $library,
                    load_error: None,
                    missing,
                }));
                table
            }

            /// A table for a library the loader could not open: every entry
            /// is missing, and `reason` (the loader's message) says why.
            pub fn not_loaded(reason: String) -> Self {
                $name {
                    loader: Some(intern(LoaderNotes {
                        library: $library,
                        load_error: Some(reason),
                        missing: Vec::new(),
                    })),
                    ..Self::empty()
                }
            }

            /// The loader's reason why `symbol` is missing from this table,
            /// if a loader filled it and gave one.
            pub fn missing_reason(&self, symbol: &str) -> Option<&'static str> {
                self.loader.and_then(|notes| notes.reason_for(symbol))
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
                    .field("loader", &self.loader)
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
        cuMemGetHandleForAddressRange: PFN_cuMemGetHandleForAddressRange,
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
            None => return Err($crate::table::missing_entry(&$api, stringify!($field))),
        }
    };
}

/// Anything that holds a table's loader notes (the four API structs).
#[doc(hidden)]
pub trait HasLoaderNotes {
    /// The notes of the loader that filled the table, if any.
    fn loader_notes(&self) -> Option<&'static LoaderNotes>;
}

macro_rules! has_loader_notes {
    ($($name:ident),*) => {
        $(impl HasLoaderNotes for $name {
            fn loader_notes(&self) -> Option<&'static LoaderNotes> {
                self.loader
            }
        })*
    };
}
has_loader_notes!(CudaApi, NvSciBufApi, NvSciSyncApi, NvSciIpcApi);

impl<T: HasLoaderNotes> HasLoaderNotes for &T {
    fn loader_notes(&self) -> Option<&'static LoaderNotes> {
        (**self).loader_notes()
    }
}

/// The error for an entry that `api` lacks: [`crate::Error::NotSupported`]
/// naming the symbol, its library and, where a loader filled the table, the
/// loader's reason (why the library did not load, or `dlsym`'s message).
#[cold]
#[inline(never)]
#[doc(hidden)]
pub fn missing_entry(api: &impl HasLoaderNotes, symbol: &'static str) -> crate::Error {
    crate::Error::NotSupported {
        symbol,
        library: library_of(symbol),
        reason: api.loader_notes().and_then(|n| n.reason_for(symbol)),
    }
}

/// What the run-time loader said about one library while
/// [`Backend::real`](crate::Backend::real) filled a table: whether the
/// library loaded (and if not, the loader's message), and for each symbol
/// it lacks, `dlsym`'s message.
///
/// Notes are kept for the life of the process (one per distinct outcome;
/// loading the same library again reuses them), so errors can borrow their
/// text as `&'static str`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderNotes {
    /// The library (soname) that was searched.
    pub library: &'static str,
    /// `Some(message)` when the library could not be loaded at all.
    pub load_error: Option<String>,
    /// Symbols the library lacks, with the loader's message for each.
    pub missing: Vec<(&'static str, String)>,
}

impl LoaderNotes {
    /// The loader's reason why `symbol` is not available: the library's
    /// load error, or the symbol's own `dlsym` message.
    pub fn reason_for(&'static self, symbol: &str) -> Option<&'static str> {
        if let Some(e) = &self.load_error {
            return Some(e.as_str());
        }
        self.missing
            .iter()
            .find(|(name, _)| *name == symbol)
            .map(|(_, reason)| reason.as_str())
    }
}

/// Keeps `notes` for the life of the process, reusing an equal one already
/// kept (so repeated loads do not grow memory).
fn intern(notes: LoaderNotes) -> &'static LoaderNotes {
    static KEPT: std::sync::Mutex<Vec<&'static LoaderNotes>> = std::sync::Mutex::new(Vec::new());
    let mut kept = match KEPT.lock() {
        Ok(k) => k,
        Err(poisoned) => poisoned.into_inner(),
    };
    if let Some(found) = kept.iter().find(|k| ***k == notes) {
        return found;
    }
    let leaked: &'static LoaderNotes = Box::leak(Box::new(notes));
    kept.push(leaked);
    leaked
}

/// The loader's reason for `error`, from its source chain (`libloading`
/// puts `dlerror()`'s text in the source; its own text is only "dlopen
/// failed"). A leading `"{library}: "` is dropped when `library` is given,
/// since messages that carry it show the library name already.
pub fn loader_reason(error: &libloading::Error, library: Option<&str>) -> String {
    let mut deepest: &dyn std::error::Error = error;
    while let Some(source) = deepest.source() {
        deepest = source;
    }
    let text = deepest.to_string();
    match library
        .and_then(|l| text.strip_prefix(l))
        .and_then(|t| t.strip_prefix(": "))
    {
        Some(rest) => rest.to_string(),
        None => text,
    }
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
