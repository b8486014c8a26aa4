//! The import front end external memory and external semaphores share,
//! over the core's [`Import<K>`](tegra_interop_core::Import): every fd
//! import path (`import_fd`, `opaque_fd`, `dma_buf_fd`, `binary_fd`,
//! `timeline_fd`) is [`import_fd`] with the core's constructor and the
//! type's driver call, and every non-fd path first passes
//! [`refuse_fd_kind`]. The fd policy itself (duplicate, consume on success,
//! hand back on failure) is `import_consuming_fd`.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use tegra_interop_core::{Import, ImportKind, ValidationError};

use crate::{Error, ImportError};

/// Imports `fd`: `describe` (a core constructor, given `fd`'s number)
/// builds the description, then the driver call `import` is handed a
/// duplicate of `fd`, never `fd` itself. On success `fd` is consumed; on any
/// failure, a refused description included, it comes back in the
/// [`ImportError`], open and the same open file description.
pub(crate) fn import_fd<K: ImportKind, T>(
    fd: OwnedFd,
    describe: impl FnOnce(RawFd) -> Result<Import<K>, ValidationError>,
    import: impl FnOnce(&Import<K>) -> Result<T, Error>,
) -> Result<T, ImportError> {
    let described = match describe(fd.as_raw_fd()) {
        Ok(described) => described,
        Err(e) => {
            return Err(ImportError {
                error: e.into(),
                fd,
            })
        }
    };
    crate::fd::import_consuming_fd(fd, described.fd(), |dup| described.with_fd(dup), import)
}

/// The check before a non-fd import: an fd kind is refused
/// (`HandleKindMismatch`), since only [`import_fd`] keeps its ownership
/// right.
pub(crate) fn refuse_fd_kind<K: ImportKind>(import: &Import<K>) -> Result<(), Error> {
    match import.fd() {
        Some(_) => Err(Error::Validation(ValidationError::HandleKindMismatch)),
        None => Ok(()),
    }
}
