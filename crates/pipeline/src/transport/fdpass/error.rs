//! The channel's typed error.

use std::fmt;
use std::time::Duration;

/// Why a [`super::Channel`] call or a received fd was refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum FdError {
    /// A system call failed.
    Io {
        /// What was being done.
        what: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// The peer did not send (or take) a message within the limit.
    Timeout {
        /// What was waited for.
        waiting_for: String,
        /// The limit.
        limit: Duration,
    },
    /// The peer closed the connection (it ended) between messages.
    Closed {
        /// What was waited for.
        waiting_for: String,
    },
    /// The peer runs as another user (`SO_PEERCRED`).
    WrongUid {
        /// The uid the peer must have (this process's).
        ours: u32,
        /// The uid the kernel reports for the peer.
        peer: u32,
    },
    /// A message carried more fds than allowed, or more than the receive
    /// buffer holds (`MSG_CTRUNC`: the kernel dropped the rest). Every fd
    /// that did arrive was closed.
    TooManyFds {
        /// The fds that arrived with it.
        received: usize,
        /// The limit.
        max: usize,
        /// Whether the kernel had to cut the control data.
        truncated: bool,
    },
    /// fds arrived inside a message's body instead of with its header
    /// (closed).
    StrayFds {
        /// How many.
        count: usize,
    },
    /// A message of a kind that carries another number of fds.
    WrongFdCount {
        /// The message's kind.
        kind: &'static str,
        /// The fds that kind carries.
        want: usize,
        /// The fds that came (all closed).
        got: usize,
    },
    /// A message's declared length is above the limit (its body is not
    /// read).
    MessageTooLarge {
        /// The declared length.
        declared: u64,
        /// The limit.
        max: usize,
    },
    /// The connection ended inside a message.
    Truncated {
        /// The bytes the message needed.
        expected: usize,
        /// The bytes that came.
        got: usize,
    },
    /// A message that does not parse (kind, field count or values).
    BadMessage(String),
    /// A memory fd's declared size is larger than the file (`fstat`).
    SizeExceedsFd {
        /// The size the peer declared.
        declared: u64,
        /// The file's size.
        actual: u64,
    },
    /// A memory fd's declared size is outside what the receiver accepts.
    SizeOutOfRange {
        /// The size the peer declared.
        declared: u64,
        /// The least the receiver needs.
        least: u64,
        /// The most it accepts.
        most: u64,
    },
    /// The limits asked for are outside the hard bounds.
    BadLimits(String),
    /// An earlier framing error left the byte stream untrusted: the
    /// channel takes no more messages.
    Broken(String),
}

impl fmt::Display for FdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FdError::Io { what, source } => write!(f, "{what}: {source}"),
            FdError::Timeout { waiting_for, limit } => write!(
                f,
                "timed out after {limit:?} waiting for the peer: {waiting_for} (is it stopped or stuck?)"
            ),
            FdError::Closed { waiting_for } => write!(
                f,
                "the peer closed the connection (it ended) while waiting for {waiting_for}"
            ),
            FdError::WrongUid { ours, peer } => write!(
                f,
                "the peer runs as uid {peer}, this process as uid {ours}: refused (SO_PEERCRED)"
            ),
            FdError::TooManyFds {
                received,
                max,
                truncated,
            } => write!(
                f,
                "a message with {received}{} fds, more than the {max} allowed; all closed",
                if *truncated { " or more (cut by the kernel)" } else { "" }
            ),
            FdError::StrayFds { count } => {
                write!(f, "{count} fds inside a message's body (closed)")
            }
            FdError::WrongFdCount { kind, want, got } => write!(
                f,
                "`{kind}` carries {want} fds, {got} came (closed)"
            ),
            FdError::MessageTooLarge { declared, max } => write!(
                f,
                "a message of {declared} bytes, more than the {max} allowed"
            ),
            FdError::Truncated { expected, got } => write!(
                f,
                "the connection ended inside a message ({got} of {expected} bytes)"
            ),
            FdError::BadMessage(e) => write!(f, "a malformed message: {e}"),
            FdError::SizeExceedsFd { declared, actual } => write!(
                f,
                "a memory fd declared as {declared} bytes holds {actual} (fstat): refused before any import"
            ),
            FdError::SizeOutOfRange {
                declared,
                least,
                most,
            } => write!(
                f,
                "a memory fd declared as {declared} bytes, outside the {least}..={most} accepted"
            ),
            FdError::BadLimits(e) => write!(f, "channel limits: {e}"),
            FdError::Broken(e) => write!(f, "the channel is broken by an earlier error: {e}"),
        }
    }
}

impl std::error::Error for FdError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FdError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
