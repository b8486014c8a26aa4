//! [`Error`] and [`ImportError`]. The fd-ownership policy of imports
//! ([`FdAudit`], [`fd_audit`], [`same_description`]) lives in the crate's
//! `fd` module and is re-exported here, where it has always been public.

pub use crate::fd::{fd_audit, same_description, FdAudit};

use std::fmt;
use std::os::fd::OwnedFd;

use tegra_interop_core::{CuResult, NvSciError, ValidationError};

/// A process-unique name for a [`crate::Context`], used in error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContextId {
    /// Process-unique number (counts up from 1 as contexts are made).
    pub id: u64,
    /// The CUDA device ordinal of the context.
    pub device: i32,
}

impl fmt::Display for ContextId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "context #{} (device {})", self.id, self.device)
    }
}

/// Errors of the driver backend.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A library or one of its symbols is not available on this machine.
    NotSupported {
        /// The C symbol that is missing.
        symbol: &'static str,
        /// The library it should come from (the soname that was searched).
        library: &'static str,
        /// The run-time loader's reason, where a loader filled the table
        /// ([`crate::Backend::real`]): why the library did not load, or
        /// `dlsym`'s message for the symbol. `None` for tables filled by
        /// someone else (the simulator, a test double), which have no loader.
        reason: Option<&'static str>,
    },
    /// An entry point the loaded CUDA driver is too old to have: it lacks
    /// the symbol, and the release that introduced it (from
    /// `tegra_interop_sys::versions`, see `crates/sys/CUDA_VERSIONS.md`) is
    /// newer than the one `cuDriverGetVersion` reports. Returned before any
    /// call of the missing entry (a missing symbol on a driver that is new
    /// enough stays [`Error::NotSupported`]).
    NeedsNewerDriver {
        /// The C entry point (its table field name, e.g. `cuFuncGetParamInfo`).
        symbol: &'static str,
        /// The library it is looked up in (`libcuda.so.1`).
        library: &'static str,
        /// The release that introduced the symbol, as `cuDriverGetVersion`
        /// writes versions (12040 is CUDA 12.4).
        since: i32,
        /// What the loaded driver's `cuDriverGetVersion` reported (raw).
        driver: i32,
    },
    /// The CUDA driver library could not be loaded at all (no NVIDIA driver
    /// installed, or not on the loader's path).
    DriverNotFound {
        /// The soname we tried (`libcuda.so.1`).
        library: &'static str,
        /// The loader's reason (`dlerror()`'s text from libloading's source
        /// chain, without the leading soname), e.g. `cannot open shared
        /// object file: No such file or directory`.
        message: String,
    },
    /// A CUDA driver call returned an error.
    Driver {
        /// The C function that failed.
        call: &'static str,
        /// What it returned.
        code: CuResult,
    },
    /// An NvSci call returned an error.
    NvSci {
        /// The C function that failed.
        call: &'static str,
        /// What it returned.
        code: NvSciError,
    },
    /// An NVRTC call returned an error.
    Nvrtc {
        /// The C function that failed.
        call: &'static str,
        /// What it returned.
        code: crate::nvrtc::NvrtcResult,
    },
    /// NVRTC (or the simulator's stand-in) refused to compile a program;
    /// the compiler's log says why.
    CompileFailed {
        /// The program's name (as given to [`crate::Nvrtc::compile`]).
        program: String,
        /// What `nvrtcCompileProgram` returned.
        code: crate::nvrtc::NvrtcResult,
        /// The compiler's log (may be empty).
        log: String,
    },
    /// A bounded wait ran out before what it waited for happened.
    Timeout {
        /// What was waited for (e.g. `"Event::synchronize (event recorded on stream #3)"`).
        waited_for: String,
        /// The limit.
        limit: std::time::Duration,
    },
    /// A kernel launch refused before the call: wrong argument count or
    /// sizes for the kernel's parameters, or launch dimensions outside the
    /// device's limits.
    BadLaunch {
        /// The kernel's name.
        kernel: String,
        /// What is wrong.
        reason: String,
    },
    /// A rule checked before the call was broken; the driver was not called.
    Validation(ValidationError),
    /// A semaphore was used on a stream of another context (the driver would
    /// answer a bare `INVALID_VALUE`); refused before the call.
    WrongContext {
        /// The context the semaphore was imported in.
        semaphore_ctx: ContextId,
        /// The context the stream belongs to.
        stream_ctx: ContextId,
    },
    /// A context reset or destroyed, or memory destroyed, while other
    /// handles still hold it (streams, imports, mappings, clones): the driver
    /// would crash destroying them afterwards. Refused before the call;
    /// nothing was released. Drop or destroy the holders first (a dropped
    /// value is released when its last holder goes).
    InUse {
        /// What was to be reset or destroyed (`"Context::reset"`, ...).
        operation: &'static str,
        /// The context concerned.
        ctx: ContextId,
        /// How many other handles still hold it.
        holders: usize,
    },
    /// A cudarc stream that does not belong to the given context.
    ForeignStream {
        /// The context the stream was offered to.
        ctx: ContextId,
    },
    /// A handle kind that exists only on another operating system.
    UnsupportedOnPlatform {
        /// The handle kind (C name).
        kind: &'static str,
        /// Where it is available.
        available_on: &'static str,
    },
    /// A host copy reaching outside a mapped buffer; refused before the call.
    OutOfBounds {
        /// Byte offset into the buffer.
        offset: u64,
        /// Bytes to copy.
        len: u64,
        /// Size of the buffer.
        size: u64,
    },
    /// An operating-system call made around a driver call failed (for
    /// example duplicating the fd handed to an import).
    Os {
        /// The system call.
        call: &'static str,
        /// The `errno` it set.
        errno: i32,
    },
    /// The loaded NvSci library's version lacks an attribute key or entry
    /// point (for example `FenceUpdateFence` before NvSciSync 2.3, or
    /// `PrimitiveInfo` before 2.5); refused before any call.
    NotInLibraryVersion {
        /// The C key or function.
        item: &'static str,
        /// The library.
        library: &'static str,
        /// The version that has it.
        needed: &'static str,
        /// The loaded library's version.
        loaded: crate::nvsci::LibVersion,
    },
    /// The operation does not apply to this kind of handle or context (for
    /// example resetting a context that is not a primary context, or a
    /// timeline signal on a binary semaphore).
    Unsupported {
        /// What was attempted.
        operation: &'static str,
        /// Why it does not apply.
        reason: &'static str,
    },
}

impl Error {
    /// A missing symbol of a library, without a loader's reason (a table
    /// filled by someone else).
    pub fn not_supported(symbol: &'static str, library: &'static str) -> Self {
        Error::NotSupported {
            symbol,
            library,
            reason: None,
        }
    }

    /// The driver code, for [`Error::Driver`].
    pub fn code(&self) -> Option<CuResult> {
        match self {
            Error::Driver { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// `true` when the driver has already shut down (`DEINITIALIZED` /
    /// `NOT_INITIALIZED`): objects are gone with it.
    pub fn is_driver_shut_down(&self) -> bool {
        self.code().is_some_and(CuResult::is_driver_shut_down)
    }
}

/// `12040` -> `"12.4"` (a `cuDriverGetVersion` value as a release name).
pub fn cuda_release(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotSupported {
                symbol,
                library,
                reason: None,
            } => {
                write!(f, "{symbol} is not available ({library} lacks it or is not installed)")
            }
            Error::NotSupported {
                symbol,
                library,
                reason: Some(reason),
            } => write!(
                f,
                "{symbol} is not available (searched {library}; the loader said: {reason})"
            ),
            Error::NotInLibraryVersion {
                item,
                library,
                needed,
                loaded,
            } => write!(
                f,
                "{item} needs {library} {needed}, the loaded one is {loaded}; use a path that does not need it (e.g. fences received from the signaller instead of built with UpdateFence) or a newer BSP"
            ),
            Error::NeedsNewerDriver {
                symbol,
                library,
                since,
                driver,
            } => write!(
                f,
                "{symbol} needs a CUDA {} driver or newer (it first shipped in CUDA {}); the loaded {library} is CUDA {} (cuDriverGetVersion = {driver}) and does not export it",
                cuda_release(*since),
                cuda_release(*since),
                cuda_release(*driver)
            ),
            Error::DriverNotFound { library, message } => {
                write!(f, "CUDA driver not found ({library}: {message})")
            }
            Error::Driver { call, code } => {
                write!(f, "{call} failed: {code}")?;
                if let Some(hint) = code.hint_for(call) {
                    write!(f, "; {hint}")?;
                }
                Ok(())
            }
            Error::NvSci { call, code } => {
                write!(f, "{call} failed: {code}")?;
                if let Some(hint) = code.hint_for(call) {
                    write!(f, "; {hint}")?;
                }
                Ok(())
            }
            Error::Nvrtc { call, code } => write!(f, "{call} failed: {code}"),
            Error::CompileFailed { program, code, log } => {
                write!(f, "compiling `{program}` failed ({code})")?;
                if log.trim().is_empty() {
                    write!(f, "; the compiler gave no log")
                } else {
                    write!(f, "; compiler log:\n{}", log.trim_end())
                }
            }
            Error::Timeout { waited_for, limit } => {
                write!(f, "timed out after {limit:?} waiting for {waited_for}")
            }
            Error::BadLaunch { kernel, reason } => {
                write!(f, "launch of kernel `{kernel}` refused before the call: {reason}")
            }
            Error::Validation(e) => write!(f, "refused before the call: {e}"),
            Error::WrongContext {
                semaphore_ctx,
                stream_ctx,
            } => write!(
                f,
                "semaphore of {semaphore_ctx} used on a stream of {stream_ctx}; \
                 import the semaphore in the stream's context (or use a stream of {semaphore_ctx})"
            ),
            Error::InUse {
                operation,
                ctx,
                holders,
            } => write!(
                f,
                "{operation} refused: {holders} other handle(s) of {ctx} are still alive \
                 (streams, imports, mappings or clones); drop or destroy them first"
            ),
            Error::ForeignStream { ctx } => write!(
                f,
                "the cudarc stream belongs to another CUDA context than {ctx}"
            ),
            Error::UnsupportedOnPlatform { kind, available_on } => write!(
                f,
                "{kind} handles exist only on {available_on}; refused on {}",
                std::env::consts::OS
            ),
            Error::OutOfBounds { offset, len, size } => write!(
                f,
                "copy of {len} bytes at offset {offset} reaches past the end of a {size}-byte buffer"
            ),
            Error::Unsupported { operation, reason } => {
                write!(f, "{operation} is not possible: {reason}")
            }
            Error::Os { call, errno } => {
                write!(
                    f,
                    "{call} failed: {}",
                    std::io::Error::from_raw_os_error(*errno)
                )?;
                if *errno == libc::EMFILE || *errno == libc::ENFILE {
                    write!(
                        f,
                        "; the process (or system) is out of file descriptors: close unused fds or raise RLIMIT_NOFILE"
                    )?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Driver { code, .. } => Some(code),
            Error::NvSci { code, .. } => Some(code),
            Error::Validation(e) => Some(e),
            _ => None,
        }
    }
}

impl From<ValidationError> for Error {
    fn from(value: ValidationError) -> Self {
        Error::Validation(value)
    }
}

/// A failed import of a file descriptor: the error, and the caller's fd,
/// open and referring to the same open file description as before the call,
/// whatever the driver did.
///
/// The driver is never handed the caller's own fd number: it gets a
/// duplicate (see [`fd_audit`]), because the real driver closes the fd it
/// was given even when an `OPAQUE_FD` memory import fails (measured on an
/// H200, driver 580.159). Converting an `ImportError` into [`Error`] (for
/// example with `?`) closes the fd.
#[derive(Debug)]
pub struct ImportError {
    /// Why the import failed.
    pub error: Error,
    /// The caller's descriptor, still open and owned by the caller.
    pub fd: OwnedFd,
}

impl ImportError {
    /// Splits into the error and the fd.
    pub fn into_parts(self) -> (Error, OwnedFd) {
        (self.error, self.fd)
    }
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (the caller's fd is returned to the caller, open)",
            self.error
        )
    }
}

impl std::error::Error for ImportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl From<ImportError> for Error {
    fn from(value: ImportError) -> Self {
        value.error
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(call: &'static str, code: NvSciError) -> String {
        Error::NvSci { call, code }.to_string()
    }

    /// An import that refuses what the peer sent is told about the
    /// descriptor, not how to build attribute lists (which the importer
    /// did not do); an import that timed out is told about the peer, not a
    /// fence.
    #[test]
    fn import_failures_are_explained_as_imports() {
        for call in [
            "NvSciBufAttrListIpcImportUnreconciled",
            "NvSciSyncAttrListIpcImportReconciled",
            "NvSciBufObjIpcImport",
            "NvSciSyncIpcImportFence",
        ] {
            let t = text(call, NvSciError::BAD_PARAMETER);
            assert!(!t.contains("typed sets"), "{t}");
            assert!(t.contains("descriptor") && t.contains("peer"), "{t}");
        }
        for call in ["NvSciBufObjIpcImport", "NvSciSyncObjIpcImport"] {
            let t = text(call, NvSciError::TIMEOUT);
            assert!(!t.contains("fence"), "{t}");
            assert!(t.contains("peer") && t.contains("timeout"), "{t}");
        }
        // Other calls keep their hints.
        let t = text("NvSciBufAttrListSetAttrs", NvSciError::BAD_PARAMETER);
        assert!(t.contains("typed sets"), "{t}");
        let t = text("NvSciSyncFenceWait", NvSciError::TIMEOUT);
        assert!(t.contains("fence was not signalled"), "{t}");
    }
}
