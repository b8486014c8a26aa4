//! The fd transport's channel: typed messages and file descriptors between
//! two processes over a Unix stream socket, with the peer treated as
//! hostile.
//!
//! Memory and timeline semaphores exported as opaque fds (by Vulkan, by
//! CUDA, or by the simulator's exporter) cannot travel through shared
//! memory or NvSciIpc; they travel as `SCM_RIGHTS` ancillary data of a Unix
//! socket. [`Channel`] carries length-prefixed messages, each with at most
//! a few fds, and applies these rules to what it receives:
//!
//! - **Bounded messages**: a message's declared length above
//!   [`Limits::max_message`] is refused ([`FdError::MessageTooLarge`])
//!   before a byte of its body is read; one that ends early is
//!   [`FdError::Truncated`].
//! - **Bounded fds**: at most [`Limits::max_fds`] per message. More, or a
//!   control message the kernel had to cut (`MSG_CTRUNC`), is
//!   [`FdError::TooManyFds`]; fds arriving inside a body are
//!   [`FdError::StrayFds`]. Every fd received is an [`OwnedFd`](std::os::fd::OwnedFd) from the
//!   moment the kernel hands it over (`MSG_CMSG_CLOEXEC` too), so a refused
//!   message closes every one of them.
//! - **The peer's uid**: `SO_PEERCRED` of the socket must name the uid this
//!   process runs as ([`FdError::WrongUid`], naming both) before anything
//!   is received.
//! - **Sizes checked against the fd**: a memory fd's declared size is
//!   checked with [`check_memory_fd`] (`fstat`) before any import
//!   ([`FdError::SizeExceedsFd`]).
//! - **Bounded waits**: every send and receive waits at most
//!   [`Limits::timeout`], and a [`FdError::Timeout`] says what it waited
//!   for.
//!
//! After a framing error (too large, truncated, stray fds) the byte stream
//! can no longer be trusted: the channel refuses every later call with
//! [`FdError::Broken`]. The process itself goes on.
//!
//! [`open_fds`] counts this process's open descriptors (the tests' fd
//! ledger: the count before and after a hostile exchange must match).
//!
//! Verified where: the channel and its hostile-peer tests
//! (`tests/fdpass.rs`) run on Linux in CI; nothing in it depends on a GPU.
//!
//! ```
//! use std::time::Duration;
//! use tegra_interop_pipeline::transport::fdpass::{Channel, FdMsg, Limits};
//!
//! let limits = Limits::new(Duration::from_secs(5));
//! let (mut a, mut b) = Channel::pair(limits)?;
//! a.send_msg(&FdMsg::End, &[])?;
//! let (msg, fds) = b.recv_msg(&|| "the end".into())?;
//! assert_eq!((msg, fds.len()), (FdMsg::End, 0));
//! # Ok::<(), tegra_interop_pipeline::transport::fdpass::FdError>(())
//! ```

mod channel;
mod error;
pub(crate) mod msg;

use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

pub use channel::{Channel, PeerCred, Received};
pub use error::FdError;
pub use msg::{FdHello, FdMsg, SemRole};

/// The most fds one message may carry, whatever [`Limits`] say (the
/// receive buffer for ancillary data is sized for this many).
pub const HARD_MAX_FDS: usize = 16;

/// The most fds one `sendmsg` can carry on Linux (the kernel's
/// `SCM_MAX_FD`): the default receive buffer ([`Limits::fd_buffer`]) holds
/// this many, so the kernel never has to drop fds of a message by cutting
/// its control data; every fd that arrives is owned and closed here.
pub const SCM_MAX_FD: usize = 253;

/// The largest message body, whatever [`Limits`] say.
pub const HARD_MAX_MESSAGE: usize = 64 * 1024;

/// What a [`Channel`] accepts from its peer and how long it waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest message body in bytes (at most [`HARD_MAX_MESSAGE`]).
    pub max_message: usize,
    /// The most fds one message may carry (at most [`HARD_MAX_FDS`]).
    pub max_fds: usize,
    /// The longest any one send or receive waits for the peer.
    pub timeout: Duration,
    /// The fds the receive buffer holds per `recvmsg` (at least
    /// `max_fds`, at most [`SCM_MAX_FD`], the default). With fewer, a flood
    /// larger than the buffer makes the kernel cut the control data
    /// (`MSG_CTRUNC`, [`FdError::TooManyFds`] with `truncated`) and drop the
    /// fds that did not fit.
    pub fd_buffer: usize,
}

impl Limits {
    /// Defaults for the two-process mode's messages (4 KiB, 2 fds) with
    /// `timeout` for every wait.
    pub fn new(timeout: Duration) -> Limits {
        Limits {
            max_message: 4096,
            max_fds: 2,
            timeout,
            fd_buffer: SCM_MAX_FD,
        }
    }

    /// The limits within the hard bounds, or why not.
    pub(crate) fn checked(self) -> Result<Limits, FdError> {
        if self.max_message == 0 || self.max_message > HARD_MAX_MESSAGE {
            return Err(FdError::BadLimits(format!(
                "max_message {} is outside 1..={HARD_MAX_MESSAGE}",
                self.max_message
            )));
        }
        if self.max_fds > HARD_MAX_FDS {
            return Err(FdError::BadLimits(format!(
                "max_fds {} is above {HARD_MAX_FDS}",
                self.max_fds
            )));
        }
        if self.fd_buffer < self.max_fds || self.fd_buffer > SCM_MAX_FD {
            return Err(FdError::BadLimits(format!(
                "fd_buffer {} is outside {}..={SCM_MAX_FD}",
                self.fd_buffer, self.max_fds
            )));
        }
        if self.timeout.is_zero() {
            return Err(FdError::BadLimits("a zero timeout".into()));
        }
        Ok(self)
    }
}

/// What `fstat` says a memory fd is, once its declared size was checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdSize {
    /// A regular file (a memfd, the simulator's exported memory): its size
    /// is known and the declared size fits in it.
    Known(u64),
    /// Not a regular file (a driver's opaque handle, e.g. Vulkan's
    /// `OPAQUE_FD` on a discrete GPU): `fstat` cannot tell its size; the
    /// declared size was checked against the caller's bound instead.
    Opaque,
}

/// Checks a memory fd before any import: `declared` must be at least
/// `least` (what the receiver will touch) and at most `most`, and, where
/// `fstat` knows the fd's size (a regular file: a memfd), at most that
/// size. A forged size over a small memfd is [`FdError::SizeExceedsFd`].
///
/// For a non-regular fd (a driver's opaque handle) `fstat` tells no size:
/// the result is [`FdSize::Opaque`] and only `least..=most` was checked
/// (CUDA does not check an `OPAQUE_FD` import's size either, so `most`
/// must come from the receiver's own geometry, never from the peer).
pub fn check_memory_fd(
    fd: BorrowedFd<'_>,
    declared: u64,
    least: u64,
    most: u64,
) -> Result<FdSize, FdError> {
    if declared < least || declared > most {
        return Err(FdError::SizeOutOfRange {
            declared,
            least,
            most,
        });
    }
    let st = rustix::fs::fstat(fd.as_fd()).map_err(|e| FdError::Io {
        what: "fstat of a received memory fd".into(),
        source: e.into(),
    })?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Ok(FdSize::Opaque);
    }
    let actual = u64::try_from(st.st_size).unwrap_or(0);
    if declared > actual {
        return Err(FdError::SizeExceedsFd { declared, actual });
    }
    Ok(FdSize::Known(actual))
}

/// The number of file descriptors open in this process now (the entries of
/// `/proc/self/fd`, less the one the count itself opens): the fd ledger of
/// the tests.
///
/// # Errors
/// `/proc/self/fd` cannot be read (no procfs).
pub fn open_fds() -> std::io::Result<usize> {
    let mut n = 0usize;
    for entry in std::fs::read_dir("/proc/self/fd")? {
        entry?;
        n += 1;
    }
    Ok(n.saturating_sub(1))
}
