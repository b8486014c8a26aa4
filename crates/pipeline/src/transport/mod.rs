//! The seam between the ring and an interop backend: [`FrameTransport`].
//!
//! A transport owns `slots` frame buffers shared by a producer (the
//! camera, on the host) and a consumer (CUDA, or a host thread in the
//! reference transport), and one pair of deterministic fences per slot
//! (*ready*, *free*). It only does interop: each call gets the
//! [`Ticket`] the ring's state machine ([`crate::slots`]) handed out,
//! which names the slot, the frame and the fence values; the
//! [`crate::ring::Ring`] that owns the transport keeps the one per-slot
//! state and makes every call. Per frame:
//!
//! 1. [`FrameTransport::take_slot`]: wait until the slot's *free* fence
//!    reached [`Ticket::free_wait`], and move the slot's memory out of the
//!    transport into a [`SlotMemory`] (the ring's write lease holds it; it
//!    is written on any thread);
//! 2. [`FrameTransport::signal_ready`]: take the written memory back and
//!    signal *ready* = [`Ticket::ready`] (or [`FrameTransport::put_back`]:
//!    take it back unwritten, signalling nothing);
//! 3. [`FrameTransport::queue_consumer`]: have the consumer wait for
//!    *ready*, do its work in place, signal *free* = [`Ticket::free_signal`]
//!    (may return before it ran; a transport whose consumer waits on the
//!    device may be asked before step 1: [`TransportInfo::queues_before_ready`]);
//! 4. [`FrameTransport::try_complete`] / [`FrameTransport::wait_complete`]:
//!    finished frames, in the order they finished;
//! 5. [`FrameTransport::lend`]: a finished frame's bytes, shared for reading
//!    until the reader drops them (the ring's read lease).
//!
//! [`FrameTransport::info`] says what the transport is, and
//! [`FrameTransport::close`] tears it down and reports what a drop could
//! only swallow. A transport never copies a frame between the producer and
//! the consumer; the pipeline's `--copy` mode adds a copy on top, for
//! comparison.

pub mod egl;
pub mod export;
#[cfg(target_os = "linux")]
pub mod fdpass;
#[cfg(feature = "vulkan")]
pub mod gpu;
pub mod host;
pub mod nvsci;

use std::fmt;
use std::time::Duration;

pub use crate::consumer::shared::PeekedFrame;
pub use crate::error::{DriverError, DriverResultExt, TransportError};
pub(crate) use crate::frame::LeasedMemory;
pub use crate::frame::{process_frame, Completion, FrameGeometry};
pub use crate::slots::Ticket;

/// What a transport is: its name, its frames, its slots, and when its
/// consumer may be queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransportInfo {
    /// Name printed as `backend: ...` (e.g. `host-reference`).
    pub backend: &'static str,
    /// Layout of every frame.
    pub geometry: FrameGeometry,
    /// Number of slots.
    pub slots: usize,
    /// Whether [`FrameTransport::queue_consumer`] may come before
    /// [`FrameTransport::take_slot`] and [`FrameTransport::signal_ready`] for
    /// the same ticket: the consumer waits for *ready* on the device, and a
    /// consumer queued for a frame that is never signalled is let through
    /// at teardown. The ring then queues the consumer at the acquire.
    pub queues_before_ready: bool,
}

/// One ticket's slot memory, moved out of its transport
/// ([`FrameTransport::take_slot`]) so that the frame is written on any
/// thread while the transport goes on with its other slots.
///
/// Safe by ownership: while it is out, the transport does not have the
/// memory, so it can neither let the consumer at it nor lend it; it gets
/// it back with [`FrameTransport::signal_ready`] (written) or
/// [`FrameTransport::put_back`] (unwritten). The ring's write lease holds
/// it and gives it back either way.
pub struct SlotMemory {
    slot: usize,
    frame: u64,
    len: usize,
    memory: Box<dyn LeasedMemory>,
}

impl fmt::Debug for SlotMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotMemory")
            .field("slot", &self.slot)
            .field("frame", &self.frame)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg_attr(not(feature = "cli"), allow(dead_code))] // used by `app::process`
/// Memory of a frame written elsewhere (the two-process mode's camera
/// process): no bytes here.
struct Elsewhere(&'static str);

impl LeasedMemory for Elsewhere {
    fn bytes_mut(&mut self, slot: usize) -> Result<&mut [u8], TransportError> {
        Err(TransportError::refused(format!(
            "slot {slot}'s frame is written {}, not in this process",
            self.0
        )))
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

impl SlotMemory {
    /// `memory` of `t`'s slot, of which the first `len` bytes are the frame.
    pub(crate) fn new(t: &Ticket, len: usize, memory: impl LeasedMemory) -> SlotMemory {
        SlotMemory::for_slot(t.slot(), t.frame(), len, memory)
    }

    /// `memory` of `slot`, taken for `frame` (a ring without [`Ticket`]s:
    /// the multicast ring).
    pub(crate) fn for_slot(
        slot: usize,
        frame: u64,
        len: usize,
        memory: impl LeasedMemory,
    ) -> SlotMemory {
        SlotMemory {
            slot,
            frame,
            len,
            memory: Box::new(memory),
        }
    }

    #[cfg_attr(not(feature = "cli"), allow(dead_code))] // used by `app::process`
    /// `t`'s slot, whose frame is written `where_` (by another process):
    /// [`SlotMemory::bytes_mut`] refuses.
    pub(crate) fn elsewhere(t: &Ticket, where_: &'static str) -> SlotMemory {
        SlotMemory::new(t, 0, Elsewhere(where_))
    }

    /// The slot.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The frame the slot is taken for.
    pub fn frame(&self) -> u64 {
        self.frame
    }

    /// The frame's bytes (`frame_len` long), which hold the slot's
    /// processed previous frame until they are written.
    ///
    /// # Errors
    /// Refused when the frame is written elsewhere or the memory is shorter
    /// than a frame.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8], TransportError> {
        let (slot, len) = (self.slot, self.len);
        self.memory
            .bytes_mut(slot)?
            .get_mut(..len)
            .ok_or_else(|| TransportError::refused("a slot's memory is smaller than a frame"))
    }

    /// The memory back as the transport's type `M`, once `t` names the
    /// slot and frame it was taken for (a misuse otherwise; the memory is
    /// then dropped, and the slot is left without it).
    pub(crate) fn into_memory<M: 'static>(self, t: &Ticket) -> Result<M, TransportError> {
        self.into_memory_of(t.slot(), t.frame())
    }

    /// [`SlotMemory::into_memory`] by slot and frame.
    pub(crate) fn into_memory_of<M: 'static>(
        self,
        slot: usize,
        frame: u64,
    ) -> Result<M, TransportError> {
        if (self.slot, self.frame) != (slot, frame) {
            return Err(TransportError::misuse(format!(
                "slot {}'s memory for frame {} given back for frame {} in slot {}",
                self.slot, self.frame, frame, slot
            )));
        }
        self.memory
            .into_any()
            .downcast::<M>()
            .map(|m| *m)
            .map_err(|_| TransportError::misuse("slot memory given back to another transport"))
    }
}

/// A ring of shared frame buffers plus the fences between producer and
/// consumer (see the module docs for the protocol). It does what a
/// [`Ticket`] says and keeps no per-slot progress: calling it out of the
/// ring's order is the caller's bug (a wait may then time out).
pub trait FrameTransport {
    /// What the transport is (name, frames, slots, queueing).
    fn info(&self) -> TransportInfo;
    /// Waits until the ticket's slot is free for its frame (*free* reached
    /// [`Ticket::free_wait`]) and moves the slot's memory out (its bytes
    /// still hold the processed previous frame).
    fn take_slot(&mut self, t: &Ticket) -> Result<SlotMemory, TransportError>;
    /// Takes `t`'s slot memory back unwritten, signalling nothing (the
    /// ring hands the same ticket out again).
    fn put_back(&mut self, t: &Ticket, memory: SlotMemory) -> Result<(), TransportError>;
    /// Takes `t`'s slot memory back written and signals the slot's *ready*
    /// fence to [`Ticket::ready`].
    fn signal_ready(&mut self, t: &Ticket, memory: SlotMemory) -> Result<(), TransportError>;
    /// Queues the consumer for the ticket's frame: wait for *ready*, do its
    /// work in place, signal *free* to [`Ticket::free_signal`].
    fn queue_consumer(&mut self, t: &Ticket) -> Result<(), TransportError>;
    /// The oldest finished frame, if one has finished.
    fn try_complete(&mut self) -> Result<Option<Completion>, TransportError>;
    /// Waits for the oldest queued frame to finish.
    fn wait_complete(&mut self) -> Result<Completion, TransportError>;
    /// The bytes of finished frame `frame` in `slot` (its *free* fence
    /// reached `free_reached`; the ring keeps the slot untouched until it
    /// is given back), made visible to the host and lent for reading
    /// ([`PeekedFrame`]) until the reader drops them. `Ok(None)`: this
    /// transport cannot lend it (the default).
    fn lend(
        &mut self,
        slot: usize,
        frame: u64,
        free_reached: u64,
    ) -> Result<Option<PeekedFrame>, TransportError> {
        let _ = (slot, frame, free_reached);
        Ok(None)
    }
    /// The transport's own measurements so far, one line for the report
    /// (`None`, the default: it has none).
    fn details(&self) -> Option<String> {
        None
    }
    /// Tears the transport down (consumer drained, objects released) and
    /// reports the first error a drop would have had to swallow.
    fn close(self: Box<Self>) -> Result<(), TransportError> {
        drop(self);
        Ok(())
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
