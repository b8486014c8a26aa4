//! The multicast ring: one producer, up to [`MAX_CONSUMERS`] consumers,
//! slots handed out as owned leases.
//!
//! A [`MulticastRing`] owns a [`FanoutTransport`] (memory, fences,
//! consumers) and a [`Fanout`] (the state machine and its fence rule).
//! Per frame:
//!
//! 1. [`MulticastRing::acquire`] looks at what the consumers released
//!    (no wait), then asks the state machine for the oldest free slot; when
//!    the FIFO consumers hold as many slots as they may, it waits for the
//!    one holding the oldest frame, at most until that frame's time limit
//!    ends (and disconnects the consumer then). It hands the slot out as a
//!    [`WriteLease`] (owned, `Send`, written on any thread);
//! 2. [`MulticastRing::hand_over`] takes the written lease back: the
//!    transport signals the slot's *ready* fence, and the frame is queued to
//!    every FIFO consumer and to each mailbox consumer that is idle (the
//!    others keep it in their mailbox, replacing an older one);
//! 3. [`MulticastRing::poll`] / [`MulticastRing::wait_poll`] report what
//!    finished ([`Polled::Finished`]) and what happened to the consumers
//!    ([`Polled::Event`]: attached, detached, disconnected at their limit,
//!    slots retired and restored, consumers forgotten).
//!
//! A lease dropped unwritten gives its slot back unsignalled; the next
//! acquire hands the same frame out again. [`MulticastRing::attach`] and
//! [`MulticastRing::detach`] may come at any time, a lease out or not.
//!
//! Every wait is bounded: the producer's wait for a consumer by that
//! consumer's limit ([`ConsumerSpec::limit`]), a detach's wait for the
//! consumer's frames by its limit, [`MulticastRing::wait_poll`] and
//! [`MulticastRing::drain`] by the caller's limit. A consumer's limit is
//! counted from when its oldest unfinished frame became its oldest one (as
//! the ring saw it: the ring looks at the fences when it is called).
//!
//! ```
//! use std::time::Duration;
//! use tegra_interop_pipeline::camera::TestPattern;
//! use tegra_interop_pipeline::frame::FrameGeometry;
//! use tegra_interop_pipeline::multicast::host::{pattern_mismatches, HostFanout, HostWork};
//! use tegra_interop_pipeline::multicast::ring::MulticastRing;
//! use tegra_interop_pipeline::multicast::ConsumerSpec;
//!
//! let g = FrameGeometry { stride: 64, rows: 4 };
//! let mut ring = MulticastRing::new(HostFanout::new(g, 4)?)?;
//! let limit = Duration::from_secs(5);
//! let check = || HostWork::new(move |frame, bytes: &[u8]| pattern_mismatches(frame, 64, bytes));
//! let a = ring.attach(ConsumerSpec::fifo(check(), limit))?;
//! let b = ring.attach(ConsumerSpec::mailbox(check(), limit))?;
//! for _ in 0..10 {
//!     let mut lease = ring.acquire()?;
//!     TestPattern::new(lease.frame(), 64).fill(lease.bytes_mut()?);
//!     ring.hand_over(lease)?;
//! }
//! ring.drain(limit)?;
//! let fifo = ring.report(a).expect("attached");
//! assert_eq!((fifo.finished, fifo.mismatches), (10, 0));
//! let mailbox = ring.report(b).expect("attached");
//! assert_eq!(mailbox.finished + mailbox.stats.skipped, 10);
//! ring.close()?;
//! # Ok::<(), tegra_interop_pipeline::multicast::MulticastError>(())
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use crate::frame::{FrameLayout, FrameMut};

use super::fanout::{Acquire, Blocker, ConsumerStats, Fanout, FanoutTicket, Standing};
use super::{
    Completion, ConsumerEvent, ConsumerId, ConsumerSpec, DisconnectReason, FanoutInfo,
    FanoutTransport, FrameGeometry, Mode, MulticastError, Queued, SlotMemory, MAX_CONSUMERS,
};

/// Numbers the multicast rings of this process (a lease names its ring).
static RING_IDS: AtomicU64 = AtomicU64::new(1);

/// A slot taken for writing one frame: owned, `Send` (write it on any
/// thread), given back by [`MulticastRing::hand_over`] once written, or by
/// being dropped unwritten (the ring then hands the same frame out again).
pub struct WriteLease {
    ring: u64,
    ticket: FanoutTicket,
    memory: Option<SlotMemory>,
    geometry: FrameGeometry,
    back: Sender<(FanoutTicket, SlotMemory)>,
}

impl fmt::Debug for WriteLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteLease")
            .field("ring", &self.ring)
            .field("ticket", &self.ticket)
            .finish()
    }
}

impl WriteLease {
    /// The frame's ticket (slot, frame, use).
    pub fn ticket(&self) -> FanoutTicket {
        self.ticket
    }

    /// The frame being written.
    pub fn frame(&self) -> u64 {
        self.ticket.frame()
    }

    /// The slot.
    pub fn slot(&self) -> usize {
        self.ticket.slot()
    }

    /// The frame's layout in bytes.
    pub fn geometry(&self) -> FrameGeometry {
        self.geometry
    }

    /// The frame's bytes, to write (they hold the slot's previous frame
    /// until then).
    ///
    /// # Errors
    /// Refused where the frame is not written in this process or the
    /// slot's memory is smaller than a frame.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8], MulticastError> {
        match self.memory.as_mut() {
            Some(m) => Ok(m.bytes_mut()?),
            None => Err(MulticastError::order("the lease's memory was given back")),
        }
    }
}

impl WriteLease {
    /// The frame as a [`FrameMut`] of `layout` (for a
    /// [`crate::source::Source`]).
    ///
    /// # Errors
    /// As [`WriteLease::bytes_mut`]; [`MulticastError::Layout`] when
    /// `layout` is not the ring's frame size.
    pub fn frame_mut(&mut self, layout: FrameLayout) -> Result<FrameMut<'_>, MulticastError> {
        let index = self.ticket.frame();
        let bytes = self.bytes_mut()?;
        FrameMut::new(index, layout, bytes).map_err(MulticastError::Layout)
    }
}

impl Drop for WriteLease {
    fn drop(&mut self) {
        if let Some(memory) = self.memory.take() {
            // The ring is gone when this fails: the memory goes with it.
            let _ = self.back.send((self.ticket, memory));
        }
    }
}

/// A consumer's counts, as [`MulticastRing::report`] and
/// [`ConsumerEvent::Forgotten`] give them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumerReport {
    /// The state machine's counts (taken, released, skipped, stalls).
    pub stats: ConsumerStats,
    /// Frames whose completion the consumer reported.
    pub finished: u64,
    /// Test-pattern mismatches its completions reported, summed.
    pub mismatches: u64,
}

/// A frame a consumer finished.
#[derive(Clone, Copy, Debug)]
pub struct Delivered {
    /// The consumer.
    pub consumer: ConsumerId,
    /// Its report of the frame.
    pub completion: Completion,
}

/// What [`MulticastRing::poll`] reports.
#[derive(Clone, Debug)]
pub enum Polled {
    /// A consumer finished a frame.
    Finished(Delivered),
    /// Something happened to a consumer or a slot.
    Event(ConsumerEvent),
}

/// Per consumer index, what the ring keeps beside the state machine.
#[derive(Clone, Copy, Debug)]
struct Place {
    id: ConsumerId,
    limit: Duration,
    /// Since when its oldest unfinished frame is its oldest one.
    oldest_since: Option<Instant>,
    finished: u64,
    mismatches: u64,
}

/// The multicast ring (see the module docs).
pub struct MulticastRing<T: FanoutTransport> {
    id: u64,
    fanout: Fanout,
    info: FanoutInfo,
    transport: T,
    places: [Option<Place>; MAX_CONSUMERS],
    attaches: u64,
    back_tx: Sender<(FanoutTicket, SlotMemory)>,
    back_rx: Receiver<(FanoutTicket, SlotMemory)>,
    out: VecDeque<Polled>,
    /// An error met where it could not be returned, for the next poll.
    deferred: Option<MulticastError>,
}

impl<T: FanoutTransport> fmt::Debug for MulticastRing<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MulticastRing")
            .field("id", &self.id)
            .field("backend", &self.info.backend)
            .field("fanout", &self.fanout)
            .finish()
    }
}

/// Making the ring and asking it.
impl<T: FanoutTransport> MulticastRing<T> {
    /// A ring over `transport`'s slots (`1..=MAX_SLOTS`), no consumer yet.
    ///
    /// # Errors
    /// [`MulticastError::Size`] for a transport with no slots or too many.
    pub fn new(transport: T) -> Result<MulticastRing<T>, MulticastError> {
        let info = transport.info();
        let (back_tx, back_rx) = mpsc::channel();
        Ok(MulticastRing {
            id: RING_IDS.fetch_add(1, Ordering::Relaxed),
            fanout: Fanout::new(info.slots)?,
            info,
            transport,
            places: [None; MAX_CONSUMERS],
            attaches: 0,
            back_tx,
            back_rx,
            out: VecDeque::new(),
            deferred: None,
        })
    }

    /// What the transport said about itself.
    pub fn info(&self) -> &FanoutInfo {
        &self.info
    }

    /// The state machine (slots, holds, fence values as last seen).
    pub fn fanout(&self) -> &Fanout {
        &self.fanout
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The frame the next new lease is for.
    pub fn next_frame(&self) -> u64 {
        self.fanout.next_frame()
    }

    /// The consumers in the ring (attached, or left and still holding a
    /// slot), by index.
    pub fn consumers(&self) -> impl Iterator<Item = ConsumerId> + '_ {
        self.places.iter().flatten().map(|p| p.id)
    }

    /// Whether `id` takes frames (it is attached, not left).
    pub fn is_attached(&self, id: ConsumerId) -> bool {
        self.index(id)
            .is_ok_and(|c| self.fanout.standing(c) == Some(Standing::Attached))
    }

    /// `id`'s counts while it is in the ring (`None` once it is forgotten:
    /// [`ConsumerEvent::Forgotten`] carried its last ones).
    pub fn report(&self, id: ConsumerId) -> Option<ConsumerReport> {
        let c = self.index(id).ok()?;
        let p = self.places[c]?;
        Some(ConsumerReport {
            stats: self.fanout.stats(c)?,
            finished: p.finished,
            mismatches: p.mismatches,
        })
    }

    /// Frames taken by consumers and not yet released, summed over them.
    pub fn in_flight(&self) -> usize {
        (0..MAX_CONSUMERS)
            .map(|c| self.fanout.taken(c).count())
            .sum()
    }

    fn index(&self, id: ConsumerId) -> Result<usize, MulticastError> {
        match self.places.get(id.index()).copied().flatten() {
            Some(p) if p.id == id => Ok(id.index()),
            _ => Err(MulticastError::UnknownConsumer { consumer: id }),
        }
    }

    fn id_of(&self, c: usize) -> Option<ConsumerId> {
        self.places.get(c).copied().flatten().map(|p| p.id)
    }
}

/// Consumers coming and going.
impl<T: FanoutTransport> MulticastRing<T> {
    /// Attaches a consumer; it takes frames from the next frame handed
    /// over on ([`ConsumerEvent::Attached`] says which).
    ///
    /// # Errors
    /// [`MulticastError::Full`], [`MulticastError::Capacity`] (the mailbox
    /// promise, see [`super::fanout`]); the transport's refusal of the
    /// spec.
    pub fn attach(&mut self, spec: ConsumerSpec<T::Work>) -> Result<ConsumerId, MulticastError> {
        self.take_back()?;
        // Check first on a copy: nothing is started for a refused attach.
        let mut probe = self.fanout.clone();
        let (c, _) = probe.attach(spec.mode, &[])?;
        let (mode, limit) = (spec.mode, spec.limit);
        self.transport.attach(c, spec)?;
        let first_frame = match self.attach_fences(c, mode) {
            Ok(first) => first,
            Err(e) => {
                // Not in the ring: the transport lets it go again.
                let _ = self.transport.detach(c);
                return Err(e);
            }
        };
        self.attaches += 1;
        let id = ConsumerId::new(c, self.attaches);
        self.places[c] = Some(Place {
            id,
            limit,
            oldest_since: None,
            finished: 0,
            mismatches: 0,
        });
        self.out.push_back(Polled::Event(ConsumerEvent::Attached {
            consumer: id,
            first_frame,
        }));
        Ok(id)
    }

    /// The state machine's attach of consumer `c` (started on the
    /// transport) with its release fences as the transport has them.
    fn attach_fences(&mut self, c: usize, mode: Mode) -> Result<u64, MulticastError> {
        let mut fences = [0; crate::slots::MAX_SLOTS];
        for (s, f) in fences.iter_mut().enumerate().take(self.info.slots) {
            *f = self.transport.released(c, s)?;
        }
        let (c2, first_frame) = self.fanout.attach(mode, &fences)?;
        if c2 != c {
            // The probe and the attach saw the same state: unreachable.
            self.fanout.leave(c2)?;
            self.fanout.forget(c2)?;
            return Err(MulticastError::order(
                "the consumer index changed during attach",
            ));
        }
        Ok(first_frame)
    }

    /// Detaches `id`: it takes no more frames (a frame waiting in its
    /// mailbox is dropped), the ring waits up to its limit for the frames
    /// it took, and retires the slots of those not released by then
    /// ([`ConsumerEvent::SlotRetired`]); once it holds nothing it is
    /// forgotten. Reports [`ConsumerEvent::Detached`].
    ///
    /// # Errors
    /// [`MulticastError::UnknownConsumer`] for an id not attached; the
    /// transport's failure.
    pub fn detach(&mut self, id: ConsumerId) -> Result<(), MulticastError> {
        let c = self.index(id)?;
        if self.fanout.standing(c) != Some(Standing::Attached) {
            return Err(MulticastError::UnknownConsumer { consumer: id });
        }
        let last_frame = self.fanout.leave(c)?;
        self.out.push_back(Polled::Event(ConsumerEvent::Detached {
            consumer: id,
            last_frame,
        }));
        let limit = self.places[c].map_or(Duration::ZERO, |p| p.limit);
        let deadline = Instant::now() + limit;
        let taken: Vec<Queued> = self.fanout.taken(c).collect();
        for q in taken {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.transport.wait_released(c, q.slot, q.use_, left) {
                Ok(_) => {}
                Err(e) => self.failed(c, &e),
            }
            self.poll_consumer(c)?;
        }
        self.retire(c);
        self.try_forget(c)
    }

    /// Consumer `c` left: the slots of the uses it still holds are retired.
    fn retire(&mut self, c: usize) {
        let Some(id) = self.id_of(c) else { return };
        let taken: Vec<Queued> = self.fanout.taken(c).collect();
        for q in taken {
            self.out
                .push_back(Polled::Event(ConsumerEvent::SlotRetired {
                    slot: q.slot,
                    consumer: id,
                    use_: q.use_,
                }));
        }
    }

    /// Disconnects consumer `c` for `reason` (it takes no more frames, its
    /// held slots are retired).
    fn disconnect(&mut self, c: usize, reason: DisconnectReason) -> Result<(), MulticastError> {
        let Some(id) = self.id_of(c) else {
            return Ok(());
        };
        if self.fanout.standing(c) != Some(Standing::Attached) {
            return Ok(());
        }
        self.fanout.leave(c)?;
        self.out
            .push_back(Polled::Event(ConsumerEvent::Disconnected {
                consumer: id,
                reason,
            }));
        self.retire(c);
        self.try_forget(c)
    }

    /// A consumer-side call for `c` failed: disconnect it (the ring goes
    /// on). An error while letting it go is kept for the next poll.
    fn failed(&mut self, c: usize, e: &(dyn std::error::Error + 'static)) {
        // A consumer process that ended is named so (typed).
        let reason = super::process::disconnect_reason(e);
        if let Err(e) = self.disconnect(c, reason) {
            self.deferred.get_or_insert(e);
        }
    }

    /// Forgets consumer `c` if it left and holds nothing: the transport
    /// lets it go, and [`ConsumerEvent::Forgotten`] reports its counts.
    fn try_forget(&mut self, c: usize) -> Result<(), MulticastError> {
        if self.fanout.standing(c) != Some(Standing::Left)
            || (0..self.info.slots).any(|s| self.fanout.holds(c, s).is_some())
        {
            return Ok(());
        }
        let Some(id) = self.id_of(c) else {
            return Ok(());
        };
        // Stopped first, so that every completion it sent is there to take.
        let detached = self.transport.detach(c);
        self.drain_completions(c);
        let report = self.report(id);
        self.fanout.forget(c)?;
        self.places[c] = None;
        if let Some(report) = report {
            self.out.push_back(Polled::Event(ConsumerEvent::Forgotten {
                consumer: id,
                report,
            }));
        }
        detached.map_err(MulticastError::from)
    }
}

/// The producer's moves.
impl<T: FanoutTransport> MulticastRing<T> {
    /// Takes back the leases dropped unwritten since the last call.
    fn take_back(&mut self) -> Result<(), MulticastError> {
        while let Ok((t, memory)) = self.back_rx.try_recv() {
            self.fanout.put_back(t)?;
            self.transport.put_back(t.slot(), memory)?;
        }
        Ok(())
    }

    /// The next frame's slot as a [`WriteLease`]: the oldest free slot of
    /// the pool, once the FIFO consumers are within their window (see
    /// [`super::fanout`]). Waits, each time for one consumer's oldest
    /// frame and at most until that frame's limit; a consumer past it is
    /// disconnected ([`DisconnectReason::Timeout`]) and the ring goes on
    /// with the others.
    ///
    /// # Errors
    /// [`MulticastError::Order`] while a lease is out;
    /// [`MulticastError::AllRetired`]; the transport's failure.
    pub fn acquire(&mut self) -> Result<WriteLease, MulticastError> {
        self.take_back()?;
        self.poll_all()?;
        let t = loop {
            match self.fanout.acquire()? {
                Acquire::Ticket(t) => break t,
                Acquire::Wait(b) => self.wait_for(b)?,
            }
        };
        let memory = match self.transport.take_slot(t.slot(), t.frame(), t.use_()) {
            Ok(m) => m,
            Err(e) => {
                self.fanout.put_back(t)?;
                return Err(e.into());
            }
        };
        Ok(WriteLease {
            ring: self.id,
            ticket: t,
            memory: Some(memory),
            geometry: self.info.geometry,
            back: self.back_tx.clone(),
        })
    }

    /// Waits for `b` (a consumer's oldest frame) at most until its limit
    /// ends, then disconnects the consumer if it is still not released.
    fn wait_for(&mut self, b: Blocker) -> Result<(), MulticastError> {
        let c = b.consumer;
        let Some(p) = self.places[c] else {
            return Err(MulticastError::order(
                "the state machine waits for a consumer the ring lost",
            ));
        };
        let since = p.oldest_since.unwrap_or_else(Instant::now);
        let left = (since + p.limit).saturating_duration_since(Instant::now());
        match self.transport.wait_released(c, b.slot, b.use_, left) {
            Ok(_) => self.poll_consumer(c)?,
            Err(e) => self.failed(c, &e),
        }
        if self.fanout.holds(c, b.slot) == Some((b.use_, b.frame, true))
            && self.fanout.standing(c) == Some(Standing::Attached)
        {
            let waited = since.elapsed();
            let frame = b.frame;
            self.disconnect(c, DisconnectReason::Timeout { frame, waited })?;
        }
        Ok(())
    }

    /// Hands a written lease over: *ready* is signalled, and the frame is
    /// queued to every consumer that takes it now (a mailbox consumer that
    /// is busy keeps it in its mailbox). A consumer whose queue call fails
    /// is disconnected ([`DisconnectReason::Failed`]).
    ///
    /// # Errors
    /// [`MulticastError::ForeignLease`] for another ring's lease (dropped:
    /// it goes back to its own ring); the transport's failure to signal.
    pub fn hand_over(&mut self, mut lease: WriteLease) -> Result<(), MulticastError> {
        if lease.ring != self.id {
            return Err(MulticastError::ForeignLease {
                frame: lease.frame(),
            });
        }
        let t = lease.ticket;
        let Some(memory) = lease.memory.take() else {
            return Err(MulticastError::order("a lease without its memory"));
        };
        if let Err(e) = self.transport.signal_ready(t.slot(), t.use_(), memory) {
            self.fanout.put_back(t)?;
            return Err(e.into());
        }
        let d = self.fanout.hand_over(t)?;
        for (c, q) in d.queued() {
            self.queue(c, q);
        }
        Ok(())
    }

    /// Queues `q` to consumer `c` and starts its clock if it was idle.
    fn queue(&mut self, c: usize, q: Queued) {
        match self.transport.queue(c, q) {
            Ok(()) => {
                if let Some(p) = self.places[c].as_mut() {
                    p.oldest_since.get_or_insert_with(Instant::now);
                }
            }
            Err(e) => self.failed(c, &e),
        }
    }
}

/// Collecting.
impl<T: FanoutTransport> MulticastRing<T> {
    /// What finished and what happened since the last call (no wait):
    /// every consumer's completions and release fences are read, mailbox
    /// frames are queued to consumers that became idle, consumers past
    /// their limit are disconnected, retired slots whose fence came are
    /// restored, and consumers that left and hold nothing are forgotten.
    ///
    /// A consumer whose calls fail, or whose release fence reads a value
    /// that is no use it took, is disconnected
    /// ([`DisconnectReason::Failed`]); the ring goes on.
    ///
    /// # Errors
    /// The transport's failure to let a consumer go (also one met earlier,
    /// where it could not be returned).
    pub fn poll(&mut self) -> Result<Vec<Polled>, MulticastError> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        self.take_back()?;
        self.poll_all()?;
        Ok(self.out.drain(..).collect())
    }

    /// As [`MulticastRing::poll`], after waiting up to `limit` for the
    /// consumer frame whose time limit ends first to be released (no wait
    /// when no frame is out).
    ///
    /// # Errors
    /// As [`MulticastRing::poll`].
    pub fn wait_poll(&mut self, limit: Duration) -> Result<Vec<Polled>, MulticastError> {
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        self.take_back()?;
        self.poll_all()?;
        if self.out.is_empty() {
            if let Some((c, q, deadline)) = self.next_deadline() {
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .min(limit);
                if let Err(e) = self.transport.wait_released(c, q.slot, q.use_, left) {
                    self.failed(c, &e);
                }
                self.poll_all()?;
            }
        }
        Ok(self.out.drain(..).collect())
    }

    /// Waits until no attached consumer holds a frame it took and each
    /// reported every frame it released (the producer stopped), at most
    /// `limit` in all; consumers past their own limit are
    /// disconnected on the way. Returns what was polled meanwhile.
    ///
    /// # Errors
    /// [`MulticastError::Timeout`] at `limit`, naming what was still out;
    /// as [`MulticastRing::poll`].
    pub fn drain(&mut self, limit: Duration) -> Result<Vec<Polled>, MulticastError> {
        let deadline = Instant::now() + limit;
        let mut all = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            all.extend(self.wait_poll(left.min(Duration::from_millis(50)))?);
            if self.attached_idle() {
                return Ok(all);
            }
            if left.is_zero() {
                let waiting_for = match self.next_deadline() {
                    Some((c, q, _)) => format!(
                        "consumer {c}'s release of frame {} (slot {}, use {}) while draining",
                        q.frame, q.slot, q.use_
                    ),
                    None => "the consumers' reports of the frames they released".to_string(),
                };
                return Err(MulticastError::Timeout { waiting_for, limit });
            }
            if self.next_deadline().is_none() {
                // Released, not yet reported: the report follows the fence.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Whether every attached consumer has released what it took and
    /// reported it finished (those that left may still hold retired slots).
    fn attached_idle(&self) -> bool {
        (0..MAX_CONSUMERS).all(|c| {
            let reported = match (self.places[c], self.fanout.stats(c)) {
                (Some(p), Some(st)) => p.finished >= st.released,
                _ => true,
            };
            self.fanout.standing(c) != Some(Standing::Attached)
                || (self.fanout.taken(c).next().is_none() && reported)
        })
    }

    /// The attached consumer whose oldest frame's limit ends first: (index,
    /// that frame, when its limit ends).
    fn next_deadline(&self) -> Option<(usize, Queued, Instant)> {
        (0..MAX_CONSUMERS)
            .filter(|&c| self.fanout.standing(c) == Some(Standing::Attached))
            .filter_map(|c| {
                let q = self.fanout.taken(c).next()?;
                let p = self.places[c]?;
                let since = p.oldest_since.unwrap_or_else(Instant::now);
                Some((c, q, since + p.limit))
            })
            .min_by_key(|&(_, _, d)| d)
    }

    /// Polls every consumer, then enforces the limits.
    fn poll_all(&mut self) -> Result<(), MulticastError> {
        for c in 0..MAX_CONSUMERS {
            if self.places[c].is_some() {
                self.poll_consumer(c)?;
            }
        }
        let now = Instant::now();
        for c in 0..MAX_CONSUMERS {
            let Some((q, since, limit)) = self.overdue(c, now) else {
                continue;
            };
            let waited = now.saturating_duration_since(since);
            if waited >= limit {
                self.disconnect(
                    c,
                    DisconnectReason::Timeout {
                        frame: q.frame,
                        waited,
                    },
                )?;
            }
        }
        Ok(())
    }

    /// Consumer `c`'s oldest frame and its clock, if it is attached and
    /// has one.
    fn overdue(&self, c: usize, now: Instant) -> Option<(Queued, Instant, Duration)> {
        if self.fanout.standing(c) != Some(Standing::Attached) {
            return None;
        }
        let q = self.fanout.taken(c).next()?;
        let p = self.places[c]?;
        Some((q, p.oldest_since.unwrap_or(now), p.limit))
    }

    /// Reads consumer `c`'s completions and release fences.
    fn poll_consumer(&mut self, c: usize) -> Result<(), MulticastError> {
        self.drain_completions(c);
        let taken: Vec<Queued> = self.fanout.taken(c).collect();
        let mut released_any = false;
        for q in taken {
            let value = match self.transport.released(c, q.slot) {
                Ok(v) => v,
                Err(e) => {
                    self.failed(c, &e);
                    continue;
                }
            };
            let o = match self.fanout.observe(c, q.slot, value) {
                Ok(o) => o,
                Err(e) => {
                    // Not a use it took: its fence cannot be trusted. The
                    // slot stays retired until a value it took is seen.
                    self.failed(c, &e);
                    continue;
                }
            };
            released_any |= o.released.is_some();
            if o.restored {
                self.out
                    .push_back(Polled::Event(ConsumerEvent::SlotRestored { slot: q.slot }));
            }
            if let Some(next) = o.next {
                self.queue(c, next);
            }
        }
        if released_any {
            let busy = self.fanout.taken(c).next().is_some();
            if let Some(p) = self.places[c].as_mut() {
                p.oldest_since = busy.then(Instant::now);
            }
        }
        self.try_forget(c)
    }

    /// Moves consumer `c`'s completions into the output.
    fn drain_completions(&mut self, c: usize) {
        loop {
            match self.transport.try_complete(c) {
                Ok(Some(completion)) => {
                    let Some(p) = self.places[c].as_mut() else {
                        return;
                    };
                    p.finished += 1;
                    p.mismatches += completion.mismatches;
                    let consumer = p.id;
                    self.out.push_back(Polled::Finished(Delivered {
                        consumer,
                        completion,
                    }));
                }
                Ok(None) => return,
                Err(e) => return self.failed(c, &e),
            }
        }
    }

    /// Tears the ring down: the transport stops every consumer (bounded)
    /// and reports its first error. Leases still out are dropped with it.
    ///
    /// # Errors
    /// The transport's failure.
    pub fn close(self) -> Result<(), MulticastError> {
        Box::new(self.transport)
            .close()
            .map_err(MulticastError::from)
    }
}
