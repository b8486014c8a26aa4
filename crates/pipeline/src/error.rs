//! The error of the interop calls under the ring: [`TransportError`],
//! one line each, keeping the driver's own error as its source.
//!
//! This module sits below the transports and the consumer (both import
//! it; it imports neither).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The driver's error type (CUDA and NvSci calls), kept as a
/// [`TransportError`]'s `source()`.
pub type DriverError = tegra_interop::driver::Error;

/// Why a transport call failed. Every variant prints as one line; a failed
/// driver or NvSci call keeps the driver's [`DriverError`] (with its raw
/// `CUresult` / `NvSciError`) as [`std::error::Error::source`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum TransportError {
    /// A CUDA or NvSci call failed.
    Driver {
        /// What the transport was doing (often the C call's name).
        doing: Cow<'static, str>,
        /// The driver's error, with the raw result code.
        source: DriverError,
    },
    /// A wait ran past its limit.
    Timeout {
        /// What was waited for.
        waiting_for: Cow<'static, str>,
        /// How long it was waited for.
        limit: Duration,
    },
    /// A frame, or one of its fences, failed a check (wrong layout, a fence
    /// value other than the deterministic counter's, a kernel fault).
    FrameCheck {
        /// The ring slot.
        slot: usize,
        /// The frame number.
        frame: u64,
        /// What did not hold.
        reason: String,
    },
    /// The other side (a peer process, the other end of a stream, the
    /// consumer's thread or stream) failed or went away.
    Peer {
        /// What happened.
        reason: Cow<'static, str>,
        /// The peer's own error, where it sent one.
        source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// Set-up was refused: this transport cannot run with these settings
    /// here (the reason says what is missing or what conflicts).
    Refused {
        /// Why.
        reason: Cow<'static, str>,
    },
    /// A call out of the ring's order, or for a slot the transport does not
    /// have: the caller's bug, refused before anything was queued.
    Misuse {
        /// What was wrong.
        reason: Cow<'static, str>,
    },
    /// Any other failure, as a message.
    Other(String),
}

impl TransportError {
    /// A failure described by a message only ([`TransportError::Other`]).
    pub fn new(msg: impl fmt::Display) -> Self {
        TransportError::Other(msg.to_string())
    }

    /// A failed driver or NvSci call while `doing` something.
    pub fn driver(doing: impl Into<Cow<'static, str>>, source: DriverError) -> Self {
        TransportError::Driver {
            doing: doing.into(),
            source,
        }
    }

    /// A wait for `waiting_for` that ran past `limit`.
    pub fn timeout(waiting_for: impl Into<Cow<'static, str>>, limit: Duration) -> Self {
        TransportError::Timeout {
            waiting_for: waiting_for.into(),
            limit,
        }
    }

    /// Frame `frame` in `slot` failed a check.
    pub fn frame_check(slot: usize, frame: u64, reason: impl fmt::Display) -> Self {
        TransportError::FrameCheck {
            slot,
            frame,
            reason: reason.to_string(),
        }
    }

    /// The other side failed or went away.
    pub fn peer(reason: impl Into<Cow<'static, str>>) -> Self {
        TransportError::Peer {
            reason: reason.into(),
            source: None,
        }
    }

    /// The other side failed with its own error.
    pub fn peer_error(
        reason: impl Into<Cow<'static, str>>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        TransportError::Peer {
            reason: reason.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// Set-up refused, with the reason.
    pub fn refused(reason: impl Into<Cow<'static, str>>) -> Self {
        TransportError::Refused {
            reason: reason.into(),
        }
    }

    /// A call out of order (the caller's bug).
    pub fn misuse(reason: impl Into<Cow<'static, str>>) -> Self {
        TransportError::Misuse {
            reason: reason.into(),
        }
    }

    /// A request for a slot the transport does not have.
    pub fn no_slot(slot: usize) -> Self {
        TransportError::misuse(format!("no slot {slot}"))
    }

    /// The driver's error, where a driver or NvSci call failed.
    pub fn driver_error(&self) -> Option<&DriverError> {
        match self {
            TransportError::Driver { source, .. } => Some(source),
            _ => None,
        }
    }

    /// Whether this is a [`TransportError::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, TransportError::Timeout { .. })
    }
}

/// Writes `text` with line breaks turned into spaces (every error is one
/// line).
fn one_line(f: &mut fmt::Formatter<'_>, text: &str) -> fmt::Result {
    let mut lines = text.lines();
    if let Some(first) = lines.next() {
        f.write_str(first)?;
    }
    for line in lines {
        write!(f, " {line}")?;
    }
    Ok(())
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportError::Driver { doing, source } => {
                write!(f, "{doing}: ")?;
                one_line(f, &source.to_string())
            }
            TransportError::Timeout { waiting_for, limit } => {
                write!(f, "timed out after {limit:?} waiting for {waiting_for}")
            }
            TransportError::FrameCheck {
                slot,
                frame,
                reason,
            } => {
                write!(f, "frame {frame} in slot {slot}: ")?;
                one_line(f, reason)
            }
            TransportError::Peer { reason, source } => {
                one_line(f, reason)?;
                match source {
                    Some(e) => {
                        f.write_str(": ")?;
                        one_line(f, &e.to_string())
                    }
                    None => Ok(()),
                }
            }
            TransportError::Refused { reason } | TransportError::Misuse { reason } => {
                one_line(f, reason)
            }
            TransportError::Other(msg) => one_line(f, msg),
        }
    }
}

impl std::error::Error for TransportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TransportError::Driver { source, .. } => Some(source),
            TransportError::Peer {
                source: Some(e), ..
            } => Some(e.as_ref()),
            _ => None,
        }
    }
}

impl From<TransportError> for String {
    /// The one-line message (for callers that still report `String`s).
    fn from(e: TransportError) -> String {
        e.to_string()
    }
}

/// `.during("what")` on a driver result: a failed call becomes a
/// [`TransportError::Driver`] that keeps the driver's error.
pub trait DriverResultExt<T> {
    /// Maps the driver's error to [`TransportError::Driver`] with `doing`.
    fn during(self, doing: impl Into<Cow<'static, str>>) -> Result<T, TransportError>;
}

impl<T> DriverResultExt<T> for Result<T, DriverError> {
    fn during(self, doing: impl Into<Cow<'static, str>>) -> Result<T, TransportError> {
        self.map_err(|e| TransportError::driver(doing, e))
    }
}

impl<T, K: fmt::Debug> DriverResultExt<T>
    for Result<T, tegra_interop::driver::nvsci::ReconcileError<K>>
{
    /// The keys in conflict, where the library named them, join `doing`.
    fn during(self, doing: impl Into<Cow<'static, str>>) -> Result<T, TransportError> {
        self.map_err(|e| {
            let doing = doing.into();
            let doing = match e.conflicts.is_empty() {
                true => doing,
                false => Cow::Owned(format!("{doing} (keys in conflict: {:?})", e.conflicts)),
            };
            TransportError::driver(doing, e.error)
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn transport_errors_are_one_line_and_keep_the_driver_error() {
        use std::error::Error as _;
        use tegra_interop::core::CuResult;
        let driver = DriverError::Driver {
            call: "cuLaunchKernel",
            code: CuResult(700),
        };
        let e: Result<(), DriverError> = Err(driver.clone());
        let e = e.during("launching the consumer kernel").unwrap_err();
        assert_eq!(e.driver_error(), Some(&driver));
        let source = e.source().unwrap().downcast_ref::<DriverError>().unwrap();
        assert_eq!(source, &driver);
        let text = e.to_string();
        assert!(
            text.starts_with("launching the consumer kernel: "),
            "{text}"
        );
        assert!(text.contains("cuLaunchKernel"), "{text}");
        let t = TransportError::timeout("slot 2's free fence", Duration::from_secs(10));
        assert!(t.is_timeout() && t.source().is_none());
        assert_eq!(
            t.to_string(),
            "timed out after 10s waiting for slot 2's free fence"
        );
        let f = TransportError::frame_check(1, 7, "two\nlines");
        assert_eq!(f.to_string(), "frame 7 in slot 1: two lines");
        let p = TransportError::peer_error("the camera process failed", driver);
        assert!(p.source().is_some(), "{p:?}");
        assert!(!p.to_string().contains('\n'));
        let s: String = TransportError::new("as a message").into();
        assert_eq!(s, "as a message");
    }
}
