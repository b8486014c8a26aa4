//! [`Error`] and [`ImportError`].

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
                if let Some(hint) = code.hint() {
                    write!(f, "; {hint}")?;
                }
                Ok(())
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

/// A failed import of a file descriptor: the error, and the fd, which the
/// caller still owns (the driver takes the fd only when the import succeeds).
///
/// Converting it into [`Error`] (for example with `?`) closes the fd.
#[derive(Debug)]
pub struct ImportError {
    /// Why the import failed.
    pub error: Error,
    /// The descriptor, still open and owned by the caller.
    pub fd: OwnedFd,
}

impl ImportError {
    /// Splits into the error and the fd.
    pub fn into_parts(self) -> (Error, OwnedFd) {
        (self.error, self.fd)
    }
}

/// The fd-ownership rule of every fd import, in one place: `fd` must be the
/// descriptor `fd_in_desc` names (else the import is refused before the
/// call); `import` runs the driver call; on success the driver owns the fd
/// (it has already closed it in this process) so ownership is given up
/// without closing; on failure the caller gets it back, open.
pub(crate) fn import_consuming_fd<T>(
    fd: OwnedFd,
    fd_in_desc: Option<std::os::fd::RawFd>,
    import: impl FnOnce() -> Result<T, Error>,
) -> Result<T, ImportError> {
    use std::os::fd::{AsRawFd, IntoRawFd};
    if fd_in_desc != Some(fd.as_raw_fd()) {
        return Err(ImportError {
            error: Error::Validation(tegra_interop_core::ValidationError::HandleKindMismatch),
            fd,
        });
    }
    match import() {
        Ok(value) => {
            let _ = fd.into_raw_fd();
            Ok(value)
        }
        Err(error) => Err(ImportError { error, fd }),
    }
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (the fd is returned to the caller)", self.error)
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

/// Turns a CUDA return code into a `Result`.
pub(crate) fn check(
    call: &'static str,
    code: tegra_interop_sys::cuda::CUresult,
) -> Result<(), Error> {
    let code = CuResult::from(code);
    if code.is_success() {
        Ok(())
    } else {
        Err(Error::Driver { call, code })
    }
}
