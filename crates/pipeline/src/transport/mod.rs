//! The seam between the pipeline and an interop backend: [`FrameTransport`].
//!
//! A transport owns a ring of `slot_count()` frame buffers shared by a
//! producer (the camera, on the host) and a consumer (CUDA, or a host thread
//! in the reference transport), and one pair of deterministic fences per slot
//! (*ready*, *free*). It only does interop: each call gets the
//! [`Ticket`] that [`crate::ring::Ring`] handed out, which names the slot, the
//! frame and the fence values, and the ring keeps the one per-slot state
//! machine (see [`crate::ring`] for the protocol and who moves a slot).
//! Per frame, on one thread:
//!
//! 1. [`FrameTransport::wait_free`]: wait until the slot's *free* fence
//!    reached [`Ticket::free_wait`], get the bytes;
//! 2. the camera writes the frame into those bytes;
//! 3. [`FrameTransport::signal_ready`]: signal *ready* = [`Ticket::ready`];
//! 4. [`FrameTransport::queue_consumer`]: have the consumer wait for *ready*,
//!    run [`process_frame`] in place, signal *free* =
//!    [`Ticket::free_signal`] (may return before it ran);
//! 5. [`FrameTransport::try_complete`] / [`FrameTransport::wait_complete`]:
//!    collect finished frames, in submission order.
//!
//! A transport that can ([`FrameTransport::leases_frames`]) may instead hand
//! a slot's memory out of itself for step 2 ([`FrameTransport::take_for_write`],
//! a [`WriteLease`] another thread writes through) and take it back before
//! step 3 ([`FrameTransport::put_back`]): the pipeline's camera then writes
//! the next frame while the producer thread hands the previous one over.
//!
//! A transport never copies a frame between the producer and the consumer; the
//! pipeline's `--copy` mode adds a copy on top, for comparison. A transport is
//! a value its caller owns (store it, return it); [`FrameTransport::close`]
//! tears it down and reports what a drop could only swallow.

pub mod egl;
#[cfg(feature = "vulkan")]
pub mod gpu;
pub mod host;
pub mod nvsci;
pub mod process;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::camera::TestPattern;
use crate::ring::{Peek, Ticket};

/// Layout of one frame: `rows` lines of `stride` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameGeometry {
    /// Bytes per line.
    pub stride: usize,
    /// Number of lines.
    pub rows: usize,
}

impl FrameGeometry {
    /// Bytes per frame.
    pub fn frame_len(&self) -> usize {
        self.stride * self.rows
    }
}

/// One processed frame, as reported by the consumer side.
#[derive(Clone, Copy, Debug)]
pub struct Completion {
    /// Slot the frame was in.
    pub slot: usize,
    /// Frame index.
    pub frame: u64,
    /// Bytes that did not match the test pattern when the consumer read them.
    pub mismatches: u64,
    /// Time the consumer spent in [`process_frame`] (after its wait).
    pub process: Duration,
    /// Time the consumer was occupied with the frame after its wait: the
    /// processing plus whatever else it does per frame (copies, counter
    /// read-back, the *free* signal; on a GPU also any time its stream sat
    /// behind other GPU work). Equal to `process` where nothing else is done.
    pub busy: Duration,
    /// When the frame was known to be finished on the host.
    pub finished: Instant,
}

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

/// The oldest completion a transport's consumer sent, if one is there
/// (the shared half of [`FrameTransport::try_complete`] for transports whose
/// consumer reports through a channel).
pub(crate) fn try_recv_completion(
    rx: &std::sync::mpsc::Receiver<Completion>,
) -> Result<Option<Completion>, TransportError> {
    use std::sync::mpsc::TryRecvError;
    match rx.try_recv() {
        Ok(c) => Ok(Some(c)),
        Err(TryRecvError::Empty) => Ok(None),
        Err(TryRecvError::Disconnected) => Err(TransportError::peer("completion queue closed")),
    }
}

/// Waits up to `stuck` for the next completion of `in_flight` queued frames
/// (the shared half of [`FrameTransport::wait_complete`]).
pub(crate) fn wait_completion(
    rx: &std::sync::mpsc::Receiver<Completion>,
    in_flight: usize,
    stuck: Duration,
) -> Result<Completion, TransportError> {
    use std::sync::mpsc::RecvTimeoutError;
    if in_flight == 0 {
        return Err(TransportError::misuse("no frame is in flight"));
    }
    rx.recv_timeout(stuck).map_err(|e| match e {
        RecvTimeoutError::Timeout => {
            TransportError::timeout("the next frame to finish (the consumer is stuck)", stuck)
        }
        RecvTimeoutError::Disconnected => TransportError::peer("completion queue closed"),
    })
}

pub use crate::consumer::shared::PeekedFrame;

/// A slot's memory as a transport keeps it, moved out of the transport
/// while a [`WriteLease`] holds it (the transport cannot reach it then).
pub(crate) trait LeasedMemory: Send + 'static {
    /// The memory's bytes, for the lease holder's writes (`slot` names it
    /// in an error).
    fn bytes_mut(&mut self, slot: usize) -> Result<&mut [u8], TransportError>;
    /// The memory, for the transport to take its own type back.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send>;
}

/// One ticket's slot memory, taken out of its transport
/// ([`FrameTransport::take_for_write`]) so that another thread writes the
/// frame while the transport's owner goes on with other slots (the previous
/// frame's ready signal, collecting finished frames).
///
/// Safe by ownership: while the lease lives, the transport does not have
/// the memory, so it can neither let the consumer at it nor lend it; its
/// ready signal for the slot is refused until the lease is given back
/// ([`FrameTransport::put_back`]). A lease that is dropped instead (a failed
/// run) leaves the slot without memory: the transport refuses every later
/// use of that slot as a misuse.
pub struct WriteLease {
    slot: usize,
    frame: u64,
    len: usize,
    memory: Box<dyn LeasedMemory>,
}

impl fmt::Debug for WriteLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteLease")
            .field("slot", &self.slot)
            .field("frame", &self.frame)
            .field("len", &self.len)
            .finish()
    }
}

impl WriteLease {
    /// `memory` of `t`'s slot, of which the first `len` bytes are the frame.
    pub(crate) fn new(t: &Ticket, len: usize, memory: impl LeasedMemory) -> WriteLease {
        WriteLease {
            slot: t.slot(),
            frame: t.frame(),
            len,
            memory: Box::new(memory),
        }
    }

    /// The slot.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The frame the slot is leased for.
    pub fn frame(&self) -> u64 {
        self.frame
    }

    /// The frame's bytes (`frame_len` long), which hold the slot's
    /// processed previous frame until they are written.
    ///
    /// # Errors
    /// Refused when the memory is shorter than a frame.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8], TransportError> {
        let (slot, len) = (self.slot, self.len);
        self.memory
            .bytes_mut(slot)?
            .get_mut(..len)
            .ok_or_else(|| TransportError::refused("a slot's memory is smaller than a frame"))
    }

    /// The memory back as the transport's type `M`, once `t` names the
    /// lease's slot and frame (a misuse otherwise; the lease is then
    /// dropped, and the slot is left without memory).
    pub(crate) fn into_memory<M: 'static>(self, t: &Ticket) -> Result<M, TransportError> {
        if (self.slot, self.frame) != (t.slot(), t.frame()) {
            return Err(TransportError::misuse(format!(
                "slot {}'s lease for frame {} given back for frame {} in slot {}",
                self.slot,
                self.frame,
                t.frame(),
                t.slot()
            )));
        }
        self.memory
            .into_any()
            .downcast::<M>()
            .map(|m| *m)
            .map_err(|_| TransportError::misuse("a lease given back to another transport"))
    }
}

/// A ring of shared frame buffers plus the fences between producer and
/// consumer (see the module docs for the protocol). It does what a
/// [`Ticket`] says and keeps no per-slot progress: calling it out of the
/// ring's order is the caller's bug (a wait may then time out).
pub trait FrameTransport {
    /// Name printed as `backend: ...` (e.g. `host-reference`).
    fn backend(&self) -> &'static str;
    /// Number of slots in the ring.
    fn slot_count(&self) -> usize;
    /// Layout of every frame.
    fn geometry(&self) -> FrameGeometry;
    /// Waits until the ticket's slot is free for its frame (*free* reached
    /// [`Ticket::free_wait`]) and returns its bytes (`frame_len` long), which
    /// still hold the processed previous frame.
    fn wait_free(&mut self, t: &Ticket) -> Result<&mut [u8], TransportError>;
    /// The bytes of the collected frame `p` (its slot is free, and the ring
    /// keeps it untouched until its next ticket), made visible to the host
    /// as [`wait_free`](Self::wait_free) would for the slot's next frame,
    /// lent for reading until the slot's next ticket ([`PeekedFrame`]): the
    /// producer checks one frame on another thread while it writes the next
    /// ones. `Ok(None)`: this transport cannot lend `p` now (nothing was
    /// waited for); the caller reads the frame when its slot comes round.
    /// The default lends nothing.
    fn lend(&mut self, p: &Peek) -> Result<Option<PeekedFrame>, TransportError> {
        let _ = p;
        Ok(None)
    }
    /// The transport's own measurements so far, one line for the report
    /// (`None`, the default: it has none).
    fn details(&self) -> Option<String> {
        None
    }
    /// Signals the slot's *ready* fence to [`Ticket::ready`]: the frame is
    /// completely written.
    fn signal_ready(&mut self, t: &Ticket) -> Result<(), TransportError>;
    /// Queues the consumer for the ticket's frame: wait for *ready*,
    /// [`process_frame`] in place, signal *free* to [`Ticket::free_signal`].
    fn queue_consumer(&mut self, t: &Ticket) -> Result<(), TransportError>;
    /// Whether [`queue_consumer`](Self::queue_consumer) may come before
    /// [`wait_free`](Self::wait_free) and [`signal_ready`](Self::signal_ready)
    /// for the same ticket: the consumer waits for *ready* on the device,
    /// and a consumer queued for a frame that is never signalled is let
    /// through at teardown. [`crate::ring::Ring::produce`] then queues the
    /// consumer first. `false` (the default): queue after the signal.
    fn queues_before_ready(&self) -> bool {
        false
    }
    /// Whether [`take_for_write`](Self::take_for_write) hands slots out
    /// (`false`, the default: the caller writes through
    /// [`wait_free`](Self::wait_free)).
    fn leases_frames(&self) -> bool {
        false
    }
    /// [`wait_free`](Self::wait_free), but the slot's memory is moved out of
    /// the transport into the returned [`WriteLease`] (written on any
    /// thread) until [`put_back`](Self::put_back); meanwhile the transport
    /// goes on with its other slots. `Ok(None)`: this transport does not
    /// lease (the default; nothing was waited for).
    fn take_for_write(&mut self, t: &Ticket) -> Result<Option<WriteLease>, TransportError> {
        let _ = t;
        Ok(None)
    }
    /// Takes the memory of `t`'s slot back from `lease` (written), before
    /// [`signal_ready`](Self::signal_ready). Refused (a misuse) when the
    /// lease is not `t`'s or the transport does not lease (the default).
    fn put_back(&mut self, t: &Ticket, lease: WriteLease) -> Result<(), TransportError> {
        drop(lease);
        Err(TransportError::misuse(format!(
            "frame {}'s slot {} given back to a transport that does not lease slots",
            t.frame(),
            t.slot()
        )))
    }
    /// The oldest finished frame, if one has finished.
    fn try_complete(&mut self) -> Result<Option<Completion>, TransportError>;
    /// Waits for the oldest queued frame to finish.
    fn wait_complete(&mut self) -> Result<Completion, TransportError>;
    /// Tears the transport down (consumer drained, objects released) and
    /// reports the first error a drop would have had to swallow.
    fn close(self: Box<Self>) -> Result<(), TransportError> {
        drop(self);
        Ok(())
    }
}

/// The consumer's work, which every backend must do identically (a CUDA
/// kernel computes the same): count the bytes that differ from
/// `TestPattern::new(frame, stride)`, and invert every byte in place.
pub fn process_frame(frame: u64, stride: usize, bytes: &mut [u8]) -> u64 {
    let pattern = TestPattern::new(frame, stride);
    let mut mismatches = 0u64;
    if stride == 0 {
        return 0;
    }
    for (row, line) in bytes.chunks_mut(stride).enumerate() {
        for (col, b) in line.iter_mut().enumerate() {
            mismatches += u64::from(*b != pattern.byte(row, col));
            *b = !*b;
        }
    }
    mismatches
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

    #[test]
    fn process_counts_mismatches_and_inverts() {
        let stride = 300;
        let mut buf = vec![0u8; stride * 4];
        let p = TestPattern::new(5, stride);
        p.fill(&mut buf);
        buf[7] ^= 0x10;
        buf[stride * 3] ^= 0x01;
        assert_eq!(process_frame(5, stride, &mut buf), 2);
        // Everything but the two corrupted bytes is now the inverted pattern.
        assert_eq!(p.first_mismatch(&buf, 0xff), Some(7));
        let mut good = vec![0u8; stride * 4];
        p.fill(&mut good);
        assert_eq!(process_frame(5, stride, &mut good), 0);
        assert_eq!(p.first_mismatch(&good, 0xff), None);
        assert_eq!(process_frame(6, stride, &mut good), (stride * 4) as u64);
    }
}
