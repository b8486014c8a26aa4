//! std backend of tegra-interop (work in progress: the function table seam).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod table;

pub use table::FunctionTable;

/// Errors of the driver backend.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A library or one of its symbols is not available on this machine.
    NotSupported {
        /// The C symbol that is missing.
        symbol: &'static str,
        /// The library it should come from.
        library: &'static str,
    },
}

impl Error {
    /// A missing symbol of a library.
    pub fn not_supported(symbol: &'static str, library: &'static str) -> Self {
        Error::NotSupported { symbol, library }
    }
}
