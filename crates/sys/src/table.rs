//! The seam: one table of C entry points, one `Option<PFN_*>` field per entry
//! point, named as in C.
//!
//! The five structs are built from the generated lists ([`crate::lists`]), so
//! an entry point exists here as soon as it is in the list (CUDA) or declared
//! in the project's NvSci header. Who fills a table is not this crate's
//! business: the driver resolves it from the real libraries, the simulator
//! fills it with its own functions, a test may fill a few fields by hand.
#![allow(non_snake_case)]

/// What a run-time loader said about one library while filling a table:
/// whether the library loaded (and if not, the loader's message), and for
/// each symbol it lacks, the loader's message.
///
/// Borrowed for the life of the process (the driver keeps each distinct
/// outcome once), so errors can quote it as `&'static str`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoaderNotes {
    /// The library (soname) that was searched.
    pub library: &'static str,
    /// `Some(message)` when the library could not be loaded at all.
    pub load_error: Option<&'static str>,
    /// Symbols the library lacks, with the loader's message for each.
    pub missing: &'static [(&'static str, &'static str)],
}

impl LoaderNotes {
    /// The loader's reason why `symbol` is not available: the library's
    /// load error, or the symbol's own message.
    pub fn reason_for(&self, symbol: &str) -> Option<&'static str> {
        if let Some(e) = self.load_error {
            return Some(e);
        }
        self.missing
            .iter()
            .find(|(name, _)| *name == symbol)
            .map(|(_, reason)| *reason)
    }
}

/// Builds one API struct from a generated list.
macro_rules! api_struct {
    (
        [$doc:literal] $name:ident $library:literal
        $( $field:ident { symbol: $sym:expr, pfn: $pfn:ty, $kind:ident: $safety:ident fn($($a:ident: $t:ty),*) -> $r:ty } )*
    ) => {
        #[doc = $doc]
        #[derive(Clone, Copy, Default)]
        pub struct $name {
            $(
                #[doc = concat!("`", stringify!($field), "`, if the library exports it.")]
                pub $field: $pfn,
            )*
            /// What the run-time loader said while filling this table: why
            /// the library did not load, or why a symbol is missing. `None`
            /// for tables filled by someone else (the simulator, a test double).
            pub loader: Option<&'static LoaderNotes>,
        }

        impl $name {
            /// The library (soname) these entry points live in.
            pub const LIBRARY: &'static str = $library;

            /// The C names of every entry point of this struct, in list order.
            pub const ENTRY_POINTS: &'static [&'static str] = &[$(stringify!($field),)*];

            /// A table where every entry is missing.
            pub const fn empty() -> Self {
                $name { $($field: None,)* loader: None }
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

cuda_entry_points!(api_struct "CUDA driver entry points (`libcuda.so.1`).");
nvscibuf_entry_points!(api_struct "NvSciBuf entry points (`libnvscibuf.so.1`).");
nvscisync_entry_points!(api_struct "NvSciSync entry points (`libnvscisync.so.1`).");
nvsciipc_entry_points!(api_struct "NvSciIpc entry points (`libnvsciipc.so`).");
nvrtc_entry_points!(api_struct "NVRTC entry points (`libnvrtc.so.12`, the CUDA runtime compiler; optional).");

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
    /// NVRTC (run-time compilation of CUDA C to PTX).
    pub nvrtc: NvrtcApi,
}

impl FunctionTable {
    /// A table where every entry is missing.
    pub const fn empty() -> Self {
        FunctionTable {
            cuda: CudaApi::empty(),
            nvscibuf: NvSciBufApi::empty(),
            nvscisync: NvSciSyncApi::empty(),
            nvsciipc: NvSciIpcApi::empty(),
            nvrtc: NvrtcApi::empty(),
        }
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
    } else if symbol.starts_with("nvrtc") {
        NvrtcApi::LIBRARY
    } else {
        CudaApi::LIBRARY
    }
}
