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

use std::fmt;
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

/// A transport failure, as one line of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportError(pub String);

impl TransportError {
    /// Wraps a message.
    pub fn new(msg: impl fmt::Display) -> Self {
        TransportError(msg.to_string())
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TransportError {}

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
        Err(TryRecvError::Disconnected) => Err(TransportError::new("completion queue closed")),
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
        return Err(TransportError::new("no frame is in flight"));
    }
    rx.recv_timeout(stuck).map_err(|e| match e {
        RecvTimeoutError::Timeout => TransportError::new(format!(
            "no frame finished within {stuck:?}: the consumer's stream is stuck"
        )),
        RecvTimeoutError::Disconnected => TransportError::new("completion queue closed"),
    })
}

/// A collected frame's bytes, lent by [`FrameTransport::lend`] for reading
/// **beyond that call**, on another thread: the producer's read-back check
/// runs while the camera writes the next frames and the handover goes on.
/// It is a pointer and a length; the ring's
/// [`SlotState::Lent`](crate::ring::SlotState::Lent) keeps the slot's next
/// ticket from being handed out until the reader gives the frame back
/// ([`Ring::give_back`](crate::ring::Ring::give_back)).
#[derive(Debug)]
pub struct PeekedFrame {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: a pointer to bytes that nothing writes while the frame is lent
// (the contract of `PeekedFrame::new`); reading them from another thread is
// what the type is for, and `bytes` states when that is allowed.
unsafe impl Send for PeekedFrame {}

impl PeekedFrame {
    /// Lends `len` bytes at `ptr`.
    ///
    /// # Safety
    /// The bytes must be readable, stay allocated at that address and be
    /// written by nobody (the transport, its consumer, the device) from now
    /// until the transport is given the slot's next ticket, or is closed or
    /// dropped, whichever comes first.
    pub unsafe fn new(ptr: std::ptr::NonNull<u8>, len: usize) -> PeekedFrame {
        PeekedFrame { ptr, len }
    }

    /// Lends the bytes of `bytes`, a safe shorthand for borrowed memory the
    /// caller keeps for as long as the frame is read (tests).
    pub fn from_slice(bytes: &[u8]) -> PeekedFrame {
        PeekedFrame {
            ptr: std::ptr::NonNull::from(bytes).cast(),
            len: bytes.len(),
        }
    }

    /// Bytes lent.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no byte is lent.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The lent bytes.
    ///
    /// # Safety
    /// Only while the lending transport is alive and has not been given the
    /// slot's next ticket (the ring refuses that ticket while the slot is
    /// lent), and, for [`PeekedFrame::from_slice`], while the slice it was
    /// made from is alive.
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` readable bytes that nobody writes
        // until the slot's next ticket (the contract of `new`), which the
        // caller has not passed yet (this function's contract).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast_const(), self.len) }
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
