//! The seam: one table of C entry points, resolved at run time.
//!
//! Everything above this module is the same code for the real driver and for
//! the simulator (`tegra-interop-sim`), which fills the same structs with its
//! own `extern "C"` functions. Each entry is optional: a symbol that the
//! installed driver lacks (for example `cuDeviceGetNvSciSyncAttributes`
//! outside Tegra, or every NvSci symbol on a discrete GPU) is `None`, and
//! calling it yields [`crate::Error::NotSupported`] naming the symbol.
//!
//! The structs live in `tegra-interop-sys` (built from its generated
//! entry-point lists); this module adds what needs std: the loader
//! ([`Resolve`], generated from the same lists), its notes, and the
//! [`crate::Error::NotSupported`] for a missing entry. The field names are
//! the C API names; their types are the generated `PFN_*` types; the symbol
//! each one resolves to is the generated `symbols::*` constant (for example
//! `cuMemFree` resolves `cuMemFree_v2`).
//!
//! # Safety
//!
//! This module is the loader, one of the few that may hold `unsafe` code:
//! opening a library runs its initialisers, and each resolved address is
//! trusted to have the signature of its `PFN_` type. Both rest on one
//! invariant: a library is only ever opened by the soname its API struct
//! names (`CudaApi::LIBRARY`, ...; NVRTC also by the few other names of
//! the same library, `NVRTC_ALTERNATES`), the vendor's libraries whose
//! exported symbols have the C signatures of the headers the `PFN_` types
//! were generated from. `load` is the only place that opens libraries.
#![allow(unsafe_code)]

use crate::logging;

pub use tegra_interop_sys::table::{
    library_of, CudaApi, FunctionTable, LoaderNotes, NvSciBufApi, NvSciIpcApi, NvSciSyncApi,
    NvrtcApi,
};

/// Filling a table from a loaded library: the four API structs of
/// `tegra-interop-sys`, resolved entry by entry from their generated lists.
pub trait Resolve: Sized {
    /// Resolves every entry from `library`; a missing symbol stays `None`
    /// and the loader's reason for it is kept in the struct's `loader` notes.
    ///
    /// # Safety
    /// `library` must be the library named by the struct's `LIBRARY` (or one
    /// with the same C ABI): each resolved address is trusted to have the
    /// signature of its `PFN_` type.
    unsafe fn resolve(library: &libloading::Library) -> Self;

    /// A table for a library the loader could not open: every entry is
    /// missing, and `reason` (the loader's message) says why.
    fn not_loaded(reason: String) -> Self;
}

macro_rules! resolve_impl {
    (
        [] $name:ident $library:literal
        $( $field:ident { symbol: $sym:expr, pfn: $pfn:ty, $kind:ident: $safety:ident fn($($a:ident: $t:ty),*) -> $r:ty } )*
    ) => {
        impl Resolve for $name {
            unsafe fn resolve(library: &libloading::Library) -> Self {
                let mut missing = Vec::new();
                let mut table = $name {
                    $(
                        // SAFETY: the caller guarantees the library's ABI; the
                        // symbol name comes from the same header as the type.
                        $field: match unsafe { library.get::<$pfn>($sym.to_bytes_with_nul()) } {
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
                    ..$name::empty()
                };
                for (field, reason) in &missing {
                    logging::debug!(target: logging::LOADER, "{}: {field} missing: {reason}", stringify!($name));
                }
                logging::info!(
                    target: logging::LOADER,
                    "{}: {} of {} entry points resolved, {} missing",
                    stringify!($name),
                    [$(stringify!($field)),*].len() - missing.len(),
                    [$(stringify!($field)),*].len(),
                    missing.len()
                );
                table.loader = Some(intern($library, None, missing));
                table
            }

            fn not_loaded(reason: String) -> Self {
                $name {
                    loader: Some(intern($library, Some(reason), Vec::new())),
                    ..Self::empty()
                }
            }
        }
    };
}

tegra_interop_sys::cuda_entry_points!(resolve_impl);
tegra_interop_sys::nvscibuf_entry_points!(resolve_impl);
tegra_interop_sys::nvscisync_entry_points!(resolve_impl);
tegra_interop_sys::nvsciipc_entry_points!(resolve_impl);
tegra_interop_sys::nvrtc_entry_points!(resolve_impl);

/// Opens a library by soname.
fn open(soname: &str) -> Result<libloading::Library, libloading::Error> {
    logging::trace!(target: logging::LOADER, "{soname}: dlopen");
    // SAFETY: loading a shared library runs its initialisers. The libraries we
    // open (libcuda, libnvsci*) are the vendor's system libraries, whose
    // initialisers are designed to run in any process that links them.
    unsafe { libloading::Library::new(soname) }
}

/// Opens `A::LIBRARY` and resolves `A` from it; the library is kept in
/// `libraries` (it must outlive the table).
fn open_and_resolve<A: Resolve + LibraryName>(
    libraries: &mut Vec<libloading::Library>,
) -> Result<A, libloading::Error> {
    let lib = open(A::NAME)?;
    logging::info!(target: logging::LOADER, "{}: loaded", A::NAME);
    // SAFETY: `lib` was opened by the soname `A` describes (module docs).
    let api = unsafe { A::resolve(&lib) };
    libraries.push(lib);
    Ok(api)
}

/// The soname of an API struct's library.
trait LibraryName {
    const NAME: &'static str;
}

macro_rules! library_name {
    ($($name:ident),*) => {
        $(impl LibraryName for $name {
            const NAME: &'static str = $name::LIBRARY;
        })*
    };
}
library_name!(CudaApi, NvSciBufApi, NvSciSyncApi, NvSciIpcApi);

/// Where NVRTC is looked for, in order, after its soname
/// (`NvrtcApi::LIBRARY`, `libnvrtc.so.12`): the unversioned development
/// link, the CUDA 13 soname, then the toolkit's usual folder. Every name is
/// NVIDIA's NVRTC, whose entry points of the table keep the C signatures of
/// the 12.9 header across these releases (the calls the table makes exist
/// unchanged in 11.2 through 13.0).
const NVRTC_ALTERNATES: &[&str] = &[
    "libnvrtc.so",
    "libnvrtc.so.13",
    "/usr/local/cuda/lib64/libnvrtc.so.12",
    "/usr/local/cuda/lib64/libnvrtc.so.13",
    "/usr/local/cuda/lib64/libnvrtc.so",
];

/// Opens NVRTC by its soname or one of [`NVRTC_ALTERNATES`] and resolves it;
/// when none loads, the first loader's reason (the soname's) is kept.
fn open_nvrtc(libraries: &mut Vec<libloading::Library>) -> NvrtcApi {
    let first = match open(NvrtcApi::LIBRARY) {
        Ok(lib) => {
            logging::info!(target: logging::LOADER, "NVRTC: found as {}", NvrtcApi::LIBRARY);
            Ok(lib)
        }
        Err(e) => {
            let reason = loader_reason(&e, None);
            logging::debug!(
                target: logging::LOADER,
                "NVRTC: {} not loaded ({reason}); trying {} other names",
                NvrtcApi::LIBRARY,
                NVRTC_ALTERNATES.len()
            );
            NVRTC_ALTERNATES
                .iter()
                .find_map(|name| match open(name) {
                    Ok(lib) => {
                        logging::info!(target: logging::LOADER, "NVRTC: found as {name}");
                        Some(lib)
                    }
                    Err(e) => {
                        logging::debug!(
                            target: logging::LOADER,
                            "NVRTC: {name} not loaded ({})",
                            loader_reason(&e, None)
                        );
                        None
                    }
                })
                .ok_or(reason)
        }
    };
    match first {
        Ok(lib) => {
            // SAFETY: `lib` is NVIDIA's NVRTC, opened by one of the names
            // listed above (module docs, `NVRTC_ALTERNATES`).
            let api = unsafe { NvrtcApi::resolve(&lib) };
            libraries.push(lib);
            api
        }
        Err(reason) => {
            logging::info!(
                target: logging::LOADER,
                "NVRTC: not found under any of {} names ({}: {reason}); run-time compilation reports NotSupported",
                NVRTC_ALTERNATES.len() + 1,
                NvrtcApi::LIBRARY
            );
            NvrtcApi::not_loaded(reason)
        }
    }
}

/// Loads the installed driver: `libcuda.so.1` (required: else
/// [`crate::Error::DriverNotFound`] with the loader's reason) and, where
/// they load, the three NvSci libraries (a library that does not load
/// leaves its struct empty, with the loader's reason in its notes). Returns
/// the table and the libraries, which must outlive it.
pub(crate) fn load() -> Result<(FunctionTable, Vec<libloading::Library>), crate::Error> {
    let mut libraries = Vec::new();
    let mut table = FunctionTable::empty();
    table.cuda = open_and_resolve::<CudaApi>(&mut libraries).map_err(|e| {
        let message = loader_reason(&e, Some(CudaApi::LIBRARY));
        logging::warn!(
            target: logging::LOADER,
            "{}: not loaded ({message}); no CUDA driver: Backend::real fails with DriverNotFound",
            CudaApi::LIBRARY
        );
        crate::Error::DriverNotFound {
            library: CudaApi::LIBRARY,
            message,
        }
    })?;
    table.nvscibuf = open_and_resolve(&mut libraries).unwrap_or_else(|e| optional_absent(&e));
    table.nvscisync = open_and_resolve(&mut libraries).unwrap_or_else(|e| optional_absent(&e));
    table.nvsciipc = open_and_resolve(&mut libraries).unwrap_or_else(|e| optional_absent(&e));
    table.nvrtc = open_nvrtc(&mut libraries);
    Ok((table, libraries))
}

/// The table of an optional library (NvSci) that did not load, with the
/// loader's reason (logged: normal on a discrete GPU).
fn optional_absent<A: Resolve + LibraryName>(error: &libloading::Error) -> A {
    let reason = loader_reason(error, None);
    logging::info!(
        target: logging::LOADER,
        "{}: not loaded ({reason}); its entry points report NotSupported",
        A::NAME
    );
    A::not_loaded(reason)
}

/// Anything that holds a table's loader notes (the four API structs).
#[doc(hidden)]
pub trait HasLoaderNotes {
    /// The notes of the loader that filled the table, if any.
    fn loader_notes(&self) -> Option<&'static LoaderNotes>;

    /// The CUDA driver's release (`cuDriverGetVersion`), where this is the
    /// CUDA table and it can say; `None` for the other libraries.
    fn driver_version(&self) -> Option<i32> {
        None
    }
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
has_loader_notes!(NvSciBufApi, NvSciSyncApi, NvSciIpcApi, NvrtcApi);

impl HasLoaderNotes for CudaApi {
    fn loader_notes(&self) -> Option<&'static LoaderNotes> {
        self.loader
    }

    fn driver_version(&self) -> Option<i32> {
        cuda_driver_version(self)
    }
}

impl<T: HasLoaderNotes> HasLoaderNotes for &T {
    fn loader_notes(&self) -> Option<&'static LoaderNotes> {
        (**self).loader_notes()
    }

    fn driver_version(&self) -> Option<i32> {
        (**self).driver_version()
    }
}

/// `cuDriverGetVersion` of `api`, or `None` where the table lacks it or
/// the call fails (it needs no `cuInit`).
pub fn cuda_driver_version(api: &CudaApi) -> Option<i32> {
    let f = api.cuDriverGetVersion?;
    let mut version: core::ffi::c_int = 0;
    // SAFETY: the one argument is an out-pointer to a local `int`, which
    // the entry point writes once; the table holds the driver's (or a
    // table-contract keeping) function of the `PFN_` type.
    let code = unsafe { f(&mut version) };
    (code.0 == 0).then_some(version)
}

/// The error for an entry that `api` lacks, decided before any call:
/// [`crate::Error::NeedsNewerDriver`] when the CUDA driver reports a
/// release older than the one that introduced the symbol
/// (`tegra_interop_sys::versions`); otherwise
/// [`crate::Error::NotSupported`] naming the symbol, its library and, where
/// a loader filled the table, the loader's reason (why the library did not
/// load, or `dlsym`'s message).
#[cold]
#[inline(never)]
#[doc(hidden)]
pub fn missing_entry(api: &impl HasLoaderNotes, symbol: &'static str) -> crate::Error {
    let library = library_of(symbol);
    if library == CudaApi::LIBRARY {
        if let (Some(since), Some(driver)) = (
            tegra_interop_sys::versions::since(symbol),
            api.driver_version(),
        ) {
            if driver < since {
                logging::debug!(
                    target: logging::LOADER,
                    "{symbol}: missing; it first shipped in CUDA {} and the driver reports {driver}",
                    crate::error::cuda_release(since)
                );
                return crate::Error::NeedsNewerDriver {
                    symbol,
                    library,
                    since,
                    driver,
                };
            }
        }
    }
    crate::Error::NotSupported {
        symbol,
        library,
        reason: api.loader_notes().and_then(|n| n.reason_for(symbol)),
    }
}

/// Keeps one loader outcome for the life of the process, reusing an equal one
/// already kept (so repeated loads do not grow memory).
fn intern(
    library: &'static str,
    load_error: Option<String>,
    missing: Vec<(&'static str, String)>,
) -> &'static LoaderNotes {
    static KEPT: std::sync::Mutex<Vec<&'static LoaderNotes>> = std::sync::Mutex::new(Vec::new());
    let mut kept = match KEPT.lock() {
        Ok(k) => k,
        Err(poisoned) => poisoned.into_inner(),
    };
    let same = |k: &LoaderNotes| {
        k.library == library
            && k.load_error == load_error.as_deref()
            && k.missing.len() == missing.len()
            && k.missing
                .iter()
                .zip(&missing)
                .all(|(a, b)| a.0 == b.0 && a.1 == b.1)
    };
    if let Some(found) = kept.iter().find(|k| same(k)) {
        return found;
    }
    let load_error: Option<&'static str> = load_error.map(|e| &*Box::leak(e.into_boxed_str()));
    let missing: Vec<(&'static str, &'static str)> = missing
        .into_iter()
        .map(|(name, reason)| (name, &*Box::leak(reason.into_boxed_str())))
        .collect();
    let leaked: &'static LoaderNotes = Box::leak(Box::new(LoaderNotes {
        library,
        load_error,
        missing: Box::leak(missing.into_boxed_slice()),
    }));
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
