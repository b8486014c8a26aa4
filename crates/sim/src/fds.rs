//! The simulator's fd ledger: every descriptor it opens (duplicates it
//! keeps for imported objects) and every descriptor it closes (its own, and
//! the caller's one when the import takes it, as the real driver does), each
//! checked before the close: a number that is no longer open is a double
//! close somewhere, a number that now names another file is someone else's
//! (a foreign fd); neither is closed, both become diagnostics.
//!
//! # Safety
//! The unsafe code here is `fstat`/`close` on descriptor numbers and
//! borrowing a descriptor number for the duration of one call; each use
//! says which descriptor it relies on being open.

#![allow(unsafe_code)]

use std::io::Write as _;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Diagnostic, DiagnosticKind};

/// Which file a descriptor refers to: `(st_dev, st_ino)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
}

/// The identity of the file behind `fd`, or `None` when the number is not
/// open (or negative).
pub(crate) fn file_id(fd: RawFd) -> Option<FileId> {
    if fd < 0 {
        return None;
    }
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer; fstat on any number is harmless.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some(FileId {
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

/// What the simulator did with a descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FdAction {
    /// It made this descriptor, a duplicate of `from`, and keeps it for an
    /// imported object.
    Duplicated {
        /// The descriptor it was duplicated from.
        from: RawFd,
    },
    /// It closed one of its own duplicates (the object was destroyed or the
    /// simulator freed everything).
    ClosedOwn,
    /// It closed the descriptor the caller handed to an import: after a
    /// successful import, or after an `OPAQUE_FD` memory import that failed
    /// once its parameters were accepted (the measured driver closes it then
    /// too; parameter errors keep it).
    ClosedCallers,
    /// It was about to close this number but the number was no longer open:
    /// someone closed it already (a double close). Not closed again;
    /// reported as [`DiagnosticKind::DoubleClose`].
    FoundClosed,
    /// It was about to close this number but the number now refers to
    /// another file than the one it was given (it was closed and reused):
    /// left alone, reported as [`DiagnosticKind::ForeignFd`].
    FoundForeign,
}

/// One entry of the fd ledger ([`crate::Sim::fd_events`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdEvent {
    /// Index of the call that did it; `None` for closes outside a call
    /// (shutdown, dropping the simulator).
    pub call_index: Option<u64>,
    /// The entry point (or `"drop"` / `"shutdown"` outside a call).
    pub symbol: &'static str,
    /// The descriptor number.
    pub fd: RawFd,
    /// What happened.
    pub action: FdAction,
}

/// The ledger itself, shared by the instance and every [`TrackedFd`].
#[derive(Default)]
pub(crate) struct FdLedger {
    pub(crate) events: Vec<FdEvent>,
    /// Diagnostics found outside a call (when a held descriptor is dropped),
    /// moved into the instance's diagnostics when they are read.
    pub(crate) pending: Vec<Diagnostic>,
    /// Diagnostics are recorded only, not also written to stderr
    /// (`Sim::set_diagnostic_echo(false)`).
    pub(crate) quiet: bool,
}

pub(crate) type SharedFdLedger = Arc<Mutex<FdLedger>>;

fn lock(l: &SharedFdLedger) -> MutexGuard<'_, FdLedger> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a close happens, for the ledger and diagnostics.
#[derive(Clone, Copy)]
pub(crate) struct Site {
    pub(crate) call_index: Option<u64>,
    pub(crate) symbol: &'static str,
}

/// The outcome of a checked close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CloseOutcome {
    Closed,
    AlreadyClosed,
    Foreign,
}

/// Closes `fd` if it still refers to `expected`; records what happened.
/// Returns the outcome and, for problems, the diagnostic to report.
pub(crate) fn checked_close(
    ledger: &SharedFdLedger,
    site: Site,
    fd: RawFd,
    expected: FileId,
    own: bool,
) -> (CloseOutcome, Option<Diagnostic>) {
    let whose = if own {
        "the simulator's own duplicate"
    } else {
        "the descriptor handed to the import"
    };
    let (outcome, action, problem) = match file_id(fd) {
        None => (
            CloseOutcome::AlreadyClosed,
            FdAction::FoundClosed,
            Some((
                DiagnosticKind::DoubleClose,
                format!(
                    "fd {fd} ({whose}) was already closed by someone else before the simulator closed it: \
                     a double close (closing a number twice closes whatever reused it)"
                ),
            )),
        ),
        Some(id) if id != expected => (
            CloseOutcome::Foreign,
            FdAction::FoundForeign,
            Some((
                DiagnosticKind::ForeignFd,
                format!(
                    "fd {fd} ({whose}) now refers to another file than the one the simulator was given: \
                     it was closed by someone else and the number reused; left open"
                ),
            )),
        ),
        Some(_) => {
            // SAFETY: the number is open and refers to the file we were given
            // (checked just above); it is ours to close (our duplicate, or the
            // caller's descriptor that the import takes, as the driver does).
            unsafe {
                libc::close(fd);
            }
            (
                CloseOutcome::Closed,
                if own {
                    FdAction::ClosedOwn
                } else {
                    FdAction::ClosedCallers
                },
                None,
            )
        }
    };
    lock(ledger).events.push(FdEvent {
        call_index: site.call_index,
        symbol: site.symbol,
        fd,
        action,
    });
    let diag = problem.map(|(kind, message)| Diagnostic {
        call_index: site.call_index,
        symbol: site.symbol,
        kind,
        message,
    });
    (outcome, diag)
}

/// A duplicate the simulator holds for an imported object; closing it goes
/// through [`checked_close`] (on drop).
pub(crate) struct TrackedFd {
    /// Owned by this value from `dup` until `drop`.
    raw: RawFd,
    id: FileId,
    ledger: SharedFdLedger,
}

impl TrackedFd {
    /// Duplicates `from` (F_DUPFD_CLOEXEC) and records it.
    pub(crate) fn dup(
        ledger: &SharedFdLedger,
        site: Site,
        from: BorrowedFd<'_>,
    ) -> std::io::Result<TrackedFd> {
        let fd: OwnedFd = from.try_clone_to_owned()?;
        let Some(id) = file_id(fd.as_raw_fd()) else {
            return Err(std::io::Error::from_raw_os_error(libc::EBADF));
        };
        let raw = fd.into_raw_fd();
        lock(ledger).events.push(FdEvent {
            call_index: site.call_index,
            symbol: site.symbol,
            fd: raw,
            action: FdAction::Duplicated {
                from: from.as_raw_fd(),
            },
        });
        Ok(TrackedFd {
            raw,
            id,
            ledger: Arc::clone(ledger),
        })
    }
}

impl AsFd for TrackedFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `raw` was an open descriptor owned by this value since
        // `dup` and is closed only in `drop`, after every borrow ended. (If
        // someone else closed the number behind our back, that is the bug
        // the drop-time check reports.)
        unsafe { BorrowedFd::borrow_raw(self.raw) }
    }
}

impl Drop for TrackedFd {
    fn drop(&mut self) {
        let site = Site {
            call_index: None,
            symbol: "drop",
        };
        let (_, diag) = checked_close(&self.ledger, site, self.raw, self.id, true);
        if let Some(d) = diag {
            let mut l = lock(&self.ledger);
            if !l.quiet {
                let _ = writeln!(std::io::stderr(), "tegra-interop-sim: {d}");
            }
            l.pending.push(d);
        }
    }
}

/// Runs `f` with the descriptor number a C caller handed to an import
/// (checked open with `fstat` just before), borrowed for `f` only.
pub(crate) fn with_handed<T>(raw: RawFd, f: impl FnOnce(BorrowedFd<'_>) -> T) -> T {
    // SAFETY: the C contract of the import entry points: the caller hands
    // over an open descriptor and does not close it during the call; the
    // borrow ends with `f`.
    f(unsafe { BorrowedFd::borrow_raw(raw) })
}
