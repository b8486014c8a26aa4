//! The fd-ownership policy of imports and the operating-system calls made
//! on descriptors, in one place.
//!
//! Every fd import hands the driver a duplicate and keeps the caller's fd
//! until the import's answer ([`import_consuming_fd`]); after a failure the
//! duplicate is closed only if it is provably still ours
//! ([`release_duplicate`], counted in [`FdAudit`]).
//!
//! # Safety
//!
//! The unsafe code here is libc calls on descriptor numbers (`fcntl`,
//! `kcmp`, `poll`: none reads or writes our memory beyond the one record
//! passed) and [`own_fd`], which makes a number an [`OwnedFd`]: its callers
//! promise the number is open and owned by nobody else (each call site says
//! why), so that it is closed exactly once.
#![allow(unsafe_code)]

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, ImportError};
use crate::logging;

static DUPLICATES_CLOSED: AtomicU64 = AtomicU64::new(0);
static DUPLICATES_GONE: AtomicU64 = AtomicU64::new(0);
static DUPLICATES_UNPROVEN: AtomicU64 = AtomicU64::new(0);
static DUPLICATES_REUSED: AtomicU64 = AtomicU64::new(0);

/// What happened to the duplicates handed to the driver by failed fd
/// imports in this process, from [`fd_audit`].
///
/// Every fd import gives the driver a duplicate (`F_DUPFD_CLOEXEC`) of the
/// caller's fd and keeps the original. On success the original is closed
/// (the import consumes the caller's fd; the driver owns the duplicate). On
/// failure the original goes back to the caller, and the duplicate is
/// closed only if it is provably still ours: its number is open and
/// `kcmp(KCMP_FILE)` says it is the same open file description as the
/// original. Otherwise it is left alone:
///
/// * already closed (the driver closed it, as the real driver does after a
///   failed `OPAQUE_FD` memory import): nothing to do ([`Self::gone`]);
/// * open but another file (the driver closed it and something else
///   reused the number): not ours, not touched ([`Self::reused`]);
/// * `kcmp` unavailable (kernel without `CONFIG_KCMP`, seccomp, `EPERM`,
///   Miri): it cannot be proven ours, so it is left open: this may leak one
///   fd per failed import ([`Self::unproven`]).
///
/// Residual race, not closed by this design: if, between the driver closing
/// the duplicate and our check, another thread duplicates the caller's same
/// open file description into that very number (`dup`, `fcntl(F_DUPFD)`),
/// `kcmp` cannot tell that fd from ours and it is closed. It needs another
/// thread to duplicate the fd the caller has just handed to an import, in
/// that window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FdAudit {
    /// Duplicates proven ours after a failed import and closed.
    pub closed: u64,
    /// Duplicates the driver had already closed after a failed import.
    pub gone: u64,
    /// Duplicates whose number referred to another file after a failed
    /// import (closed by the driver and reused): left alone.
    pub reused: u64,
    /// Duplicates that could not be proven ours (`kcmp` unavailable) and
    /// were left open: each may be one leaked fd.
    pub unproven: u64,
}

/// Process-wide counts of what happened to the duplicates that failed fd
/// imports handed to the driver (see [`FdAudit`]). `unproven` is the number
/// of fds that may have leaked.
pub fn fd_audit() -> FdAudit {
    FdAudit {
        closed: DUPLICATES_CLOSED.load(Ordering::Relaxed),
        gone: DUPLICATES_GONE.load(Ordering::Relaxed),
        reused: DUPLICATES_REUSED.load(Ordering::Relaxed),
        unproven: DUPLICATES_UNPROVEN.load(Ordering::Relaxed),
    }
}

/// Whether `a` and `b` are the same open file description of this process:
/// `Some(true)`/`Some(false)` from `kcmp(KCMP_FILE)`, `None` when that cannot
/// be asked (no kcmp, not permitted, a closed number, Miri).
///
/// This is the test the imports use before closing a duplicate they handed
/// to the driver; it is public so that tests and callers can check an fd
/// handed back by [`ImportError`] against a reference duplicate of their own.
///
/// The descriptors are borrowed, so both are open for the call (a raw
/// number could name nothing, or someone else's file, by the time it is
/// asked).
///
/// ```
/// use std::os::fd::AsFd;
/// let file = std::fs::File::open("/dev/null")?;
/// let copy = file.try_clone()?; // dup: the same open file description
/// let other = std::fs::File::open("/dev/null")?; // a new description
/// use tegra_interop_driver::error::same_description;
/// if let Some(same) = same_description(file.as_fd(), copy.as_fd()) {
///     assert!(same);
///     assert_eq!(same_description(file.as_fd(), other.as_fd()), Some(false));
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn same_description(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> Option<bool> {
    same_description_raw(a.as_raw_fd(), b.as_raw_fd())
}

/// [`same_description`] on numbers, for the duplicate the driver may have
/// closed (kcmp only compares; a closed number answers `None`).
fn same_description_raw(a: RawFd, b: RawFd) -> Option<bool> {
    if cfg!(miri) {
        // Miri does not implement the kcmp system call.
        return None;
    }
    kcmp_file(a, b)
}

/// After a failed import: closes the duplicate `dup` handed to the driver
/// only if it is provably still ours (open, same open file description as
/// the caller's `orig`); counts every outcome (see [`FdAudit`]).
fn release_duplicate(orig: BorrowedFd<'_>, dup: RawFd) {
    match is_open(dup) {
        Some(false) => {
            DUPLICATES_GONE.fetch_add(1, Ordering::Relaxed);
            logging::debug!(
                target: logging::FD,
                "failed import: duplicate fd {dup} already closed by the driver (gone)"
            );
            return;
        }
        Some(true) => {}
        None => {
            DUPLICATES_UNPROVEN.fetch_add(1, Ordering::Relaxed);
            logging::warn!(
                target: logging::FD,
                "failed import: cannot tell whether duplicate fd {dup} is open (fcntl(F_GETFD) failed, not EBADF); left alone, it may leak (unproven)"
            );
            return;
        }
    }
    match same_description_raw(orig.as_raw_fd(), dup) {
        Some(true) => {
            // `dup` is open and is the same open file description as the
            // caller's fd: it is the duplicate we made (the residual race is
            // documented on `FdAudit`); nothing else owns it, and it is
            // closed once, here.
            // SAFETY: open, and proven the duplicate this import made (the
            // driver refused it, so it did not take it): ours alone.
            drop(unsafe { own_fd(dup) });
            DUPLICATES_CLOSED.fetch_add(1, Ordering::Relaxed);
            logging::debug!(
                target: logging::FD,
                "failed import: duplicate fd {dup} still ours (kcmp: same file as fd {}); closed (closed)",
                orig.as_raw_fd()
            );
        }
        Some(false) => {
            DUPLICATES_REUSED.fetch_add(1, Ordering::Relaxed);
            logging::info!(
                target: logging::FD,
                "failed import: fd number {dup} now names another file (the driver closed the duplicate, the number was reused); left alone (reused)"
            );
        }
        None => {
            DUPLICATES_UNPROVEN.fetch_add(1, Ordering::Relaxed);
            logging::warn!(
                target: logging::FD,
                "failed import: duplicate fd {dup} is open but kcmp cannot say it is ours (no kcmp, not permitted, or Miri); left open, it may leak (unproven)"
            );
        }
    }
}

/// The fd-ownership rule of every fd import, in one place.
///
/// `fd` must be the descriptor `fd_in_desc` names (else the import is
/// refused before the call). The driver is handed a duplicate of it
/// (`F_DUPFD_CLOEXEC`): `rebuild` makes the import description name the
/// duplicate, `import` runs the driver call with it. On success the
/// caller's `fd` is closed (the import consumes it; the driver owns the
/// duplicate). On failure the caller's `fd` comes back, open and untouched,
/// and the duplicate is released by [`release_duplicate`].
pub(crate) fn import_consuming_fd<T, I>(
    fd: OwnedFd,
    fd_in_desc: Option<RawFd>,
    rebuild: impl FnOnce(RawFd) -> Result<I, tegra_interop_core::ValidationError>,
    import: impl FnOnce(&I) -> Result<T, Error>,
) -> Result<T, ImportError> {
    if fd_in_desc != Some(fd.as_raw_fd()) {
        return Err(ImportError {
            error: Error::Validation(tegra_interop_core::ValidationError::HandleKindMismatch),
            fd,
        });
    }
    let dup = match dup_cloexec(fd.as_fd()) {
        Ok(dup) => dup,
        Err(errno) => {
            return Err(ImportError {
                error: Error::Os {
                    call: "fcntl(F_DUPFD_CLOEXEC)",
                    errno,
                },
                fd,
            })
        }
    };
    let described = match rebuild(dup) {
        Ok(d) => d,
        Err(e) => {
            // SAFETY: `dup` was just made by `dup_cloexec` and nobody else
            // has seen it: open and ours alone.
            drop(unsafe { own_fd(dup) });
            return Err(ImportError {
                error: Error::Validation(e),
                fd,
            });
        }
    };
    match import(&described) {
        Ok(value) => {
            // The import consumes the caller's fd; the driver owns `dup`.
            drop(fd);
            Ok(value)
        }
        Err(error) => {
            release_duplicate(fd.as_fd(), dup);
            Err(ImportError { error, fd })
        }
    }
}

// ------------------------------------------------------------------ OS calls

/// `errno` of the last failed libc call on this thread.
fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, 0)`: a new descriptor number for an open
/// file, or `Err(errno)`.
fn dup_cloexec(fd: std::os::fd::BorrowedFd<'_>) -> Result<RawFd, i32> {
    // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor number for an open fd
    // (borrowed, so open for the call); no memory is involved.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        Err(errno())
    } else {
        Ok(dup)
    }
}

/// Whether `fd` is an open descriptor number of this process (`None`:
/// cannot tell).
fn is_open(fd: RawFd) -> Option<bool> {
    // SAFETY: F_GETFD reads the descriptor flags of a number; harmless on any
    // value.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1 {
        return Some(true);
    }
    if errno() == libc::EBADF {
        Some(false)
    } else {
        None
    }
}

/// `kcmp(KCMP_FILE)`: whether two descriptor numbers of this process name
/// the same open file description (`None`: cannot tell, e.g. seccomp).
fn kcmp_file(a: RawFd, b: RawFd) -> Option<bool> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        const KCMP_FILE: libc::c_long = 0;
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        // SAFETY: kcmp only compares kernel objects named by numbers; it
        // reads no user memory.
        let r = unsafe {
            libc::syscall(
                libc::SYS_kcmp,
                pid,
                pid,
                KCMP_FILE,
                libc::c_long::from(a),
                libc::c_long::from(b),
            )
        };
        match r {
            0 => Some(true),
            1..=3 => Some(false),
            _ => None,
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = (a, b);
        None
    }
}

/// Takes ownership of a descriptor number: the returned [`OwnedFd`] closes
/// it once, on drop.
///
/// # Safety
/// `fd` must be open and owned by nobody else (no other `OwnedFd`, `File`
/// or C library will close or use it as its own): a duplicate this crate
/// just made, one proven ours with [`is_open`] and `kcmp`, or one a C call
/// handed to us as the new owner.
pub(crate) unsafe fn own_fd(fd: RawFd) -> OwnedFd {
    // SAFETY: the caller's promise above is `from_raw_fd`'s contract.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

// ------------------------------------------------------------------ polling

/// Waits at most `limit` for `fd` to become readable (an NvSciIpc event fd).
/// A closed or invalid fd only makes `poll` return at once.
pub(crate) fn poll_readable(fd: RawFd, limit: std::time::Duration) {
    let ms = libc::c_int::try_from(limit.as_millis()).unwrap_or(libc::c_int::MAX);
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd record for the duration of the call; poll
    // does not act on the descriptor.
    unsafe { libc::poll(&mut pfd, 1, ms) };
}
