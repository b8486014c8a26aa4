//! Multicast: one producer, up to [`MAX_CONSUMERS`] consumers of every
//! frame, each with its own release fence per slot, as NvSciStream's
//! multicast block offers it (a pool of packets, FIFO and mailbox queues,
//! late attach, detach, and disconnecting a dead consumer while the others
//! go on).
//!
//! The module is built in three layers, like the one-consumer ring:
//!
//! - [`fanout`]: the pure state machine ([`fanout::Fanout`]): which slot
//!   the producer writes next (the oldest free one of the pool), which use
//!   of it that is, which consumer holds which use, what a mailbox consumer
//!   skipped, which slots are retired. Fixed capacity, no allocation, no
//!   clock. **Its module docs state the fence rule.**
//! - [`FanoutTransport`]: the seam to a backend (the slots' memory, the
//!   *ready* fence per slot, the *release* fence per consumer and slot, and
//!   the consumers themselves). It only does interop; the ring makes every
//!   call with the values the state machine computed.
//! - [`ring::MulticastRing`]: owns a transport and a state machine, hands
//!   slots out as owned [`ring::WriteLease`]s, queues each handed-over frame
//!   to the consumers that take it, collects what they finished, enforces
//!   each consumer's time limit and reports [`ConsumerEvent`]s.
//!
//! Transports: [`host::HostFanout`] (the host reference: consumers are
//! host threads running a closure over the slot's bytes, read-only; the
//! one this module's tests run on); `multicast::cuda::CudaFanout` over
//! exported memory and semaphores (each consumer its own CUDA stream, its
//! own release semaphores and its own copy of the slot; a host reader such
//! as the Zenoh publisher reads the exported mapping instead); and
//! `multicast::process::ProcessFanout`, whose consumers are other
//! processes given the slots and fences as fds over a Unix socket.
//!
//! # What "reclaimed safely" means
//!
//! A consumer that misses its limit is disconnected
//! ([`ConsumerEvent::Disconnected`] with [`DisconnectReason::Timeout`]),
//! but a device (a GPU stream, a host thread) may still be reading the
//! slots of the frames queued to it, and nothing on the host can stop it
//! in the middle. So the ring never waits for it past its limit and never
//! rewrites those slots blindly: each slot of a use it took is *retired*
//! ([`ConsumerEvent::SlotRetired`]), out of the pool until the consumer's
//! release fence is seen at that use (read with no wait at every poll),
//! then *restored* ([`ConsumerEvent::SlotRestored`]). A slot whose fence
//! never comes stays out for the ring's life. Frames that were still
//! waiting for it in the ring (never queued to the device) are dropped at
//! once. A FIFO consumer has at most [`fanout::FIFO_DEPTH`] frames queued,
//! so a dead one retires at most that many slots; the others go on with
//! the rest, without a dropped frame. A clean [`ring::MulticastRing::detach`]
//! first waits (up to the consumer's limit) for the frames it took.
//!
//! # Outputs wait for the caller
//!
//! Finished frames and events wait in the ring until
//! [`ring::MulticastRing::poll`] (or `wait_poll`, `drain`) hands them out:
//! a program that never polls keeps one entry per finished frame per
//! consumer. Poll once per frame (the examples and tests do).
//!
//! # Consumers never write the shared slot
//!
//! Every consumer of a multicast ring reads the same slot at the same time,
//! so none may write it: the host transport hands its closures `&[u8]`, and
//! a CUDA consumer's [`CudaWork`] refuses [`Placement::InPlace`] (a typed
//! [`MulticastError::InPlace`]); it reads the slot through a copy into its
//! own buffer ([`Placement::DeviceCopy`]) or a read-back.

pub mod cuda;
pub mod fanout;
pub mod host;
pub mod process;
mod produce;
pub mod ring;

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use crate::consumer::work::{FrameWork, Placement};
pub use crate::error::TransportError;
pub use crate::frame::{Completion, FrameGeometry};
pub use crate::transport::SlotMemory;

/// Most consumers one multicast ring serves at once (a fixed capacity, as
/// the ring's slots are: `MAX_SLOTS`).
pub const MAX_CONSUMERS: usize = 8;

/// How a consumer takes the frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every frame handed over after its attach, in order. A slow FIFO
    /// consumer back-pressures the producer (the producer waits for it,
    /// within its limit).
    Fifo,
    /// The newest frame: at most one frame waiting in the ring and one in
    /// work. A frame replaced while waiting is skipped (counted), and the
    /// consumer never makes the producer wait.
    Mailbox,
}

/// A consumer to attach: its mode, its time limit and its work (whose type
/// is the transport's: a host closure for [`host::HostFanout`], a
/// [`CudaWork`] for a CUDA-backed transport).
pub struct ConsumerSpec<W> {
    /// FIFO or mailbox.
    pub mode: Mode,
    /// How long its oldest queued frame may take (counted from when that
    /// frame became its oldest one) before the consumer is disconnected
    /// ([`DisconnectReason::Timeout`]). Also bounds every wait of the
    /// producer for it.
    pub limit: Duration,
    /// The work it runs on each frame.
    pub work: W,
}

impl<W> fmt::Debug for ConsumerSpec<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsumerSpec")
            .field("mode", &self.mode)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl<W> ConsumerSpec<W> {
    /// A FIFO consumer of `work` with time limit `limit`.
    pub fn fifo(work: W, limit: Duration) -> Self {
        ConsumerSpec {
            mode: Mode::Fifo,
            limit,
            work,
        }
    }

    /// A mailbox consumer of `work` with time limit `limit`.
    pub fn mailbox(work: W, limit: Duration) -> Self {
        ConsumerSpec {
            mode: Mode::Mailbox,
            limit,
            work,
        }
    }
}

/// A CUDA consumer's work on a multicast ring: a [`FrameWork`] and where
/// it sees the frame (never [`Placement::InPlace`]: the slot is shared by
/// every consumer, so a consumer works on its own copy or a read-back), or
/// a host reader ([`cuda::HostRead`]) that copies each frame out of the
/// slot's host mapping.
pub struct CudaWork {
    kind: WorkKind,
}

/// What a [`CudaWork`] is: device work, or a host reader.
pub enum WorkKind {
    /// A [`FrameWork`] on the consumer's own CUDA streams.
    Device {
        /// The work.
        work: Box<dyn FrameWork>,
        /// Where it sees the frame.
        placement: Placement,
    },
    /// A reader on the host ([`cuda::HostRead`]).
    Host(Box<dyn cuda::HostRead>),
}

impl fmt::Debug for CudaWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaWork")
            .field("work", &self.name())
            .field("placement", &self.placement())
            .finish()
    }
}

impl CudaWork {
    /// `work` placed at `placement`.
    ///
    /// # Errors
    /// [`MulticastError::InPlace`] for [`Placement::InPlace`]: a multicast
    /// consumer would write the slot every other consumer reads.
    pub fn new(work: Box<dyn FrameWork>, placement: Placement) -> Result<CudaWork, MulticastError> {
        if placement == Placement::InPlace {
            return Err(MulticastError::InPlace {
                work: work.name().to_string(),
            });
        }
        Ok(CudaWork {
            kind: WorkKind::Device { work, placement },
        })
    }

    /// A host reader: each frame is read on the host from the slot's
    /// mapping (see [`cuda::HostRead`]).
    pub fn host(reader: Box<dyn cuda::HostRead>) -> CudaWork {
        CudaWork {
            kind: WorkKind::Host(reader),
        }
    }

    /// Where the work sees the frame (never [`Placement::InPlace`]; a
    /// host reader reads it back: [`Placement::ReadBack`]).
    pub fn placement(&self) -> Placement {
        match &self.kind {
            WorkKind::Device { placement, .. } => *placement,
            WorkKind::Host(_) => Placement::ReadBack,
        }
    }

    /// The work's name.
    pub fn name(&self) -> &str {
        match &self.kind {
            WorkKind::Device { work, .. } => work.name(),
            WorkKind::Host(reader) => reader.name(),
        }
    }

    /// What the work is, for the transport that runs it.
    pub fn into_kind(self) -> WorkKind {
        self.kind
    }
}

/// What a fan-out transport is: its name, its frames, its slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FanoutInfo {
    /// Name printed as `backend: ...` (e.g. `host-fanout`).
    pub backend: &'static str,
    /// Layout of every frame.
    pub geometry: FrameGeometry,
    /// Number of slots (`1..=MAX_SLOTS`).
    pub slots: usize,
}

/// One frame queued to one consumer: wait for the slot's *ready* fence to
/// reach `use_`, run the work (reading the slot), then signal the
/// consumer's *release* fence of the slot to `use_`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queued {
    /// The frame.
    pub frame: u64,
    /// Its slot.
    pub slot: usize,
    /// The slot's use the frame is (its *ready* value, and the *release*
    /// value the consumer signals).
    pub use_: u64,
}

/// The seam between a [`ring::MulticastRing`] and a backend: the slots'
/// memory, one *ready* fence per slot, one *release* fence per consumer and
/// slot (all starting at 0), and the consumers.
///
/// It does what the ring says and keeps no protocol state of its own: the
/// ring's [`fanout::Fanout`] computes every value (see its fence rule).
/// Consumer `id`s are `0..MAX_CONSUMERS`; an id is attached again only
/// after its [`FanoutTransport::detach`].
///
/// Against the integrator's sketch, one change: the work's type is the
/// transport's own ([`FanoutTransport::Work`]), because a host transport
/// runs host closures and a CUDA one runs a [`CudaWork`]; a spec of the
/// wrong kind cannot be built.
pub trait FanoutTransport {
    /// What each consumer runs on a frame.
    type Work: Send + 'static;
    /// What the transport is (name, frames, slots).
    fn info(&self) -> FanoutInfo;
    /// Starts consumer `id` (its release fences of every slot at 0, or at
    /// the values the id's previous holder left: the ring reads them with
    /// [`FanoutTransport::released`] before it queues anything).
    fn attach(&mut self, id: usize, spec: ConsumerSpec<Self::Work>) -> Result<(), TransportError>;
    /// Stops consumer `id` and frees what it owns. The ring calls it once
    /// every use the consumer took is released (then drains
    /// [`FanoutTransport::try_complete`] for `id`: completions not yet
    /// taken stay there to be taken); a transport whose consumer may still
    /// be reading a slot must not free that slot's memory here.
    fn detach(&mut self, id: usize) -> Result<(), TransportError>;
    /// Moves `slot`'s memory out for the producer to write `frame`, the
    /// slot's use `use_`. The ring calls it only once every consumer that
    /// took an earlier use of the slot released it; it does not wait.
    fn take_slot(
        &mut self,
        slot: usize,
        frame: u64,
        use_: u64,
    ) -> Result<SlotMemory, TransportError>;
    /// Takes `slot`'s memory back unwritten, signalling nothing.
    fn put_back(&mut self, slot: usize, memory: SlotMemory) -> Result<(), TransportError>;
    /// Takes `slot`'s memory back written and signals its *ready* fence to
    /// `use_`.
    fn signal_ready(
        &mut self,
        slot: usize,
        use_: u64,
        memory: SlotMemory,
    ) -> Result<(), TransportError>;
    /// Queues frame `q` to consumer `id` (may return before it ran): wait
    /// for *ready* >= `q.use_`, run the work reading the slot, signal the
    /// consumer's *release* fence of `q.slot` to `q.use_`, report a
    /// [`Completion`].
    fn queue(&mut self, id: usize, q: Queued) -> Result<(), TransportError>;
    /// Consumer `id`'s *release* fence of `slot` as the host sees it now
    /// (no wait).
    fn released(&mut self, id: usize, slot: usize) -> Result<u64, TransportError>;
    /// Waits up to `limit` for consumer `id`'s *release* fence of `slot` to
    /// reach `value`: `Ok(true)` once it did, `Ok(false)` at the limit.
    fn wait_released(
        &mut self,
        id: usize,
        slot: usize,
        value: u64,
        limit: Duration,
    ) -> Result<bool, TransportError>;
    /// Consumer `id`'s oldest finished frame not yet reported, if any.
    fn try_complete(&mut self, id: usize) -> Result<Option<Completion>, TransportError>;
    /// Tears the transport down (every consumer stopped, bounded) and
    /// reports the first error a drop would have had to swallow.
    fn close(self: Box<Self>) -> Result<(), TransportError>;
}

/// Identifies a consumer of one ring: its index (`0..MAX_CONSUMERS`) and
/// the attach that made it (an index is used again after its consumer is
/// gone; an id of the earlier consumer is then refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConsumerId {
    index: usize,
    attach: u64,
}

impl ConsumerId {
    /// An id of consumer `index` made by the ring's `attach`-th attach.
    pub(crate) fn new(index: usize, attach: u64) -> ConsumerId {
        ConsumerId { index, attach }
    }

    /// The index the transport knows the consumer by.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The number of the attach that made it (from 1, per ring).
    pub fn attach_number(&self) -> u64 {
        self.attach
    }
}

impl fmt::Display for ConsumerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "consumer {} (attach {})", self.index, self.attach)
    }
}

/// Why a consumer was disconnected.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DisconnectReason {
    /// Its oldest queued `frame` had not finished after `waited` (its
    /// limit).
    Timeout {
        /// The frame it did not finish.
        frame: u64,
        /// How long it had been its oldest frame.
        waited: Duration,
    },
    /// The transport reported the consumer failed (its thread or stream).
    Failed {
        /// What the transport said.
        reason: String,
    },
    /// The consumer's process ended: its connection closed
    /// ([`process::ProcessFanout`]; see [`process::ConsumerEnded`]).
    ProcessEnded {
        /// Its process id.
        pid: i32,
        /// What was seen (the connection closed; how the process ended,
        /// where known).
        detail: String,
    },
}

/// Something that happened to a consumer, reported by the ring's poll.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConsumerEvent {
    /// Attached; it takes frames from `first_frame` on.
    Attached {
        /// The consumer.
        consumer: ConsumerId,
        /// The first frame it takes.
        first_frame: u64,
    },
    /// Detached at its own request; it took no frame after `last_frame`
    /// (`None`: it took none).
    Detached {
        /// The consumer.
        consumer: ConsumerId,
        /// Its last frame.
        last_frame: Option<u64>,
    },
    /// Disconnected by the ring.
    Disconnected {
        /// The consumer.
        consumer: ConsumerId,
        /// Why.
        reason: DisconnectReason,
    },
    /// `slot` was taken out of the pool: a consumer that left still held
    /// its use `use_` (its release fence had not reached it). It comes
    /// back ([`ConsumerEvent::SlotRestored`]) once the fence is seen there.
    SlotRetired {
        /// The slot.
        slot: usize,
        /// The consumer that held it.
        consumer: ConsumerId,
        /// The use it held.
        use_: u64,
    },
    /// A retired `slot` is back in the pool (the consumer's release fence
    /// reached the use it held).
    SlotRestored {
        /// The slot.
        slot: usize,
    },
    /// A consumer that left is forgotten: every use it took is released,
    /// and the transport let it go; its index may be attached again.
    Forgotten {
        /// The consumer.
        consumer: ConsumerId,
        /// Its final counts.
        report: ring::ConsumerReport,
    },
}

/// Why a multicast call failed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum MulticastError {
    /// A ring size outside `1..=MAX_SLOTS`.
    Size {
        /// The size asked for.
        slots: usize,
    },
    /// All [`MAX_CONSUMERS`] consumer places are taken (by attached
    /// consumers or ones that left and still hold a slot).
    Full,
    /// The attach would break the mailbox promise: `slots >= fifo_holds +
    /// 2 * mailboxes + 1` (one slot for FIFO consumers if any, two per
    /// mailbox consumer, one for the producer) must hold.
    Capacity {
        /// The ring's usable slots (not retired).
        slots: usize,
        /// Slots the FIFO consumers need (1 if any, else 0).
        fifo_holds: usize,
        /// Mailbox consumers, the new one included.
        mailboxes: usize,
    },
    /// A consumer id this ring does not know (never attached, or gone).
    UnknownConsumer {
        /// The id.
        consumer: ConsumerId,
    },
    /// A CUDA consumer asked for [`Placement::InPlace`]: it would write
    /// the slot every other consumer reads.
    InPlace {
        /// The work's name.
        work: String,
    },
    /// A move out of the protocol's order (the caller's or the transport's
    /// bug), refused before anything changed.
    Order {
        /// What was refused and why.
        what: Cow<'static, str>,
    },
    /// A release fence value that is no use the consumer took (a
    /// transport's bug or a hostile peer).
    Fence {
        /// The consumer's index.
        consumer: usize,
        /// The slot.
        slot: usize,
        /// The value seen.
        value: u64,
        /// What the value had to be.
        expected: Cow<'static, str>,
    },
    /// Every slot not being written is retired: nothing can be acquired.
    AllRetired {
        /// How many slots are retired.
        retired: usize,
    },
    /// A lease of another ring was handed over (it was dropped, so its own
    /// ring gets the slot back).
    ForeignLease {
        /// The lease's frame.
        frame: u64,
    },
    /// A wait of the ring ran past its limit.
    Timeout {
        /// What was waited for.
        waiting_for: String,
        /// The limit.
        limit: Duration,
    },
    /// A frame view of another size than the ring's frames.
    Layout(crate::frame::LayoutError),
    /// The transport failed.
    Transport(TransportError),
}

impl fmt::Display for MulticastError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MulticastError::Size { slots } => write!(
                f,
                "multicast ring size {slots} is outside 1..={} slots",
                crate::slots::MAX_SLOTS
            ),
            MulticastError::Full => write!(
                f,
                "all {MAX_CONSUMERS} consumer places are taken (attached, or left and still holding a slot)"
            ),
            MulticastError::Capacity { slots, fifo_holds, mailboxes } => write!(
                f,
                "{slots} usable slots cannot serve {mailboxes} mailbox consumer(s) without stalling the producer: \
                 need {fifo_holds} (FIFO) + 2 x {mailboxes} (mailbox) + 1 (producer) = {} slots",
                fifo_holds + 2 * mailboxes + 1
            ),
            MulticastError::UnknownConsumer { consumer } => {
                write!(f, "{consumer} is not attached to this ring")
            }
            MulticastError::InPlace { work } => write!(
                f,
                "work `{work}` asks for in-place placement, but a multicast consumer may not write the slot \
                 the other consumers read; use a device copy or a read-back"
            ),
            MulticastError::Order { what } => write!(f, "out of the multicast protocol's order: {what}"),
            MulticastError::Fence { consumer, slot, value, expected } => write!(
                f,
                "consumer {consumer}'s release fence of slot {slot} reads {value}, but it must be {expected}"
            ),
            MulticastError::AllRetired { retired } => write!(
                f,
                "every free slot is retired ({retired} retired: consumers that left still hold them)"
            ),
            MulticastError::ForeignLease { frame } => {
                write!(f, "the lease of frame {frame} belongs to another multicast ring")
            }
            MulticastError::Timeout { waiting_for, limit } => {
                write!(f, "waited {limit:?} for {waiting_for}")
            }
            MulticastError::Layout(e) => write!(f, "multicast frame view: {e}"),
            MulticastError::Transport(e) => write!(f, "multicast transport: {e}"),
        }
    }
}

impl std::error::Error for MulticastError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MulticastError::Transport(e) => Some(e),
            _ => None,
        }
    }
}

impl From<TransportError> for MulticastError {
    fn from(e: TransportError) -> Self {
        MulticastError::Transport(e)
    }
}

impl MulticastError {
    /// An out-of-order move ([`MulticastError::Order`]).
    pub(crate) fn order(what: impl Into<Cow<'static, str>>) -> MulticastError {
        MulticastError::Order { what: what.into() }
    }
}
