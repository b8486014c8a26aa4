//! The seam between the pipeline and an interop backend: [`FrameTransport`].
//!
//! A transport owns a ring of `slot_count()` frame buffers shared by a
//! producer (the camera, on the host) and a consumer (CUDA, or a host thread
//! in the reference transport), and one pair of deterministic fences per slot:
//!
//! - *ready*: the producer signals value `n + 1` when it has written the
//!   slot's n-th frame (`n = frame / slot_count`); the consumer waits for it.
//! - *free*: the consumer signals value `n + 1` when it has processed that
//!   frame; the producer waits for value `n` before writing frame `frame`.
//!
//! [`crate::ring::FenceSchedule`] computes these values. Per frame the
//! pipeline calls, in this order and on one thread:
//!
//! 1. [`FrameTransport::producer_acquire`]: wait for *free*, get the bytes;
//! 2. the camera writes the frame into those bytes;
//! 3. [`FrameTransport::producer_release`]: signal *ready*;
//! 4. [`FrameTransport::consumer_submit`]: have the consumer wait for *ready*,
//!    run [`process_frame`] in place, signal *free* (may return before it ran);
//! 5. [`FrameTransport::try_complete`] / [`FrameTransport::wait_complete`]:
//!    collect finished frames, in submission order. A transport buffers at
//!    most `slot_count()` of them, so the caller collects the completion of a
//!    slot's frame before acquiring that slot again.
//!
//! A transport never copies a frame between the producer and the consumer; the
//! pipeline's `--copy` mode adds a copy on top, for comparison.

use std::fmt;
use std::time::{Duration, Instant};

use crate::camera::TestPattern;

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
    /// Time the frame, already signalled ready, waited for the consumer to
    /// finish earlier frames (queueing, not interop cost); zero where a
    /// transport cannot tell.
    pub queued: Duration,
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

/// A ring of shared frame buffers plus the fences between producer and
/// consumer (see the module docs for the protocol).
pub trait FrameTransport {
    /// Name printed as `backend: ...` (e.g. `host-reference`).
    fn backend(&self) -> &'static str;
    /// Number of slots in the ring.
    fn slot_count(&self) -> usize;
    /// Layout of every frame.
    fn geometry(&self) -> FrameGeometry;
    /// Waits until `slot` is free for `frame` (the consumer finished the
    /// slot's previous frame) and returns its bytes (`frame_len` long), which
    /// still hold the processed previous frame.
    fn producer_acquire(&mut self, slot: usize, frame: u64) -> Result<&mut [u8], TransportError>;
    /// Signals that `frame` is completely written into `slot`.
    fn producer_release(&mut self, slot: usize, frame: u64) -> Result<(), TransportError>;
    /// Queues the consumer for `frame` in `slot`: wait on the ready fence,
    /// [`process_frame`] in place, signal the slot free.
    fn consumer_submit(&mut self, slot: usize, frame: u64) -> Result<(), TransportError>;
    /// The oldest finished frame, if one has finished.
    fn try_complete(&mut self) -> Result<Option<Completion>, TransportError>;
    /// Waits for the oldest submitted frame to finish.
    fn wait_complete(&mut self) -> Result<Completion, TransportError>;
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
