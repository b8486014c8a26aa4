//! The ring: slots handed out as owned leases, the way the driver owns its
//! handles.
//!
//! A [`Ring`] owns a transport ([`crate::transport::FrameTransport`]: the
//! slots' memory and fences) and the one state machine of its slots
//! ([`crate::slots`]: which slot each frame uses, and the fence values).
//! Per frame:
//!
//! 1. [`Ring::acquire`] collects what finished until the frame's slot is
//!    free, waits (on the transport) for the slot's *free* fence, and hands
//!    the slot out as a [`WriteLease`]: owned, `Send`, written on any
//!    thread ([`WriteLease::bytes_mut`], or a [`crate::source::Source`]
//!    through [`WriteLease::frame_mut`]);
//! 2. [`Ring::hand_over`] consumes the written lease: the memory goes back
//!    to the transport, which signals *ready*, and the consumer is queued
//!    (it waits for *ready*, does its work, signals *free*);
//! 3. [`Ring::collect`] / [`Ring::wait_collect`] give each finished frame
//!    back as a [`Finished`], in the order the consumer finished them;
//!    [`Ring::read`] lends a finished frame's processed bytes as a
//!    [`ReadLease`] (owned, `Send`), for a check on any thread. A frame can
//!    be read until its slot's next lease is acquired: to read every
//!    frame, call [`Ring::make_room`] and collect before each acquire (the
//!    acquire collects what it must to free its slot, and a frame it
//!    collected that way can no longer be read once it hands the slot out).
//!
//! Leases give their slot back by being dropped: a write lease dropped
//! unwritten returns the slot to the transport unsignalled, and the ring
//! hands the same ticket (frame and fence values) out again at the next
//! [`Ring::acquire`]; a read lease dropped lets the slot's next frame be
//! acquired ([`Ring::acquire`] waits for it, at most [`READ_RETURN_WAIT`]).
//! There is no call to forget. A lease handed to another ring is refused
//! ([`RingError::ForeignLease`]) and goes back to its own.
//!
//! The fence values follow the deterministic protocol of
//! [`crate::slots`]: frame `f` of a ring of `n` uses slot `f % n` for its
//! `k = f / n`-th time; the producer waits for *free* = `k`, signals
//! *ready* = `k + 1`, the consumer signals *free* = `k + 1`.
//!
//! ```
//! use tegra_interop_pipeline::camera::TestPattern;
//! use tegra_interop_pipeline::frame::FrameGeometry;
//! use tegra_interop_pipeline::ring::Ring;
//! use tegra_interop_pipeline::transport::host::{Fault, HostReference};
//!
//! let g = FrameGeometry { stride: 64, rows: 4 };
//! let mut ring = Ring::new(HostReference::new(g, 2, Fault::None))?;
//! for _ in 0..6 {
//!     let mut lease = ring.acquire()?;
//!     let frame = lease.frame();
//!     TestPattern::new(frame, g.stride).fill(lease.bytes_mut()?);
//!     ring.hand_over(lease)?;
//! }
//! let mut finished = 0;
//! while ring.pending() > 0 {
//!     let done = ring.wait_collect()?;
//!     assert_eq!(done.completion.mismatches, 0);
//!     finished += 1;
//! }
//! assert_eq!(finished, 6);
//! ring.close()?;
//! # Ok::<(), tegra_interop_pipeline::ring::RingError>(())
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use crate::frame::{Completion, FrameGeometry, FrameLayout, FrameMut};
pub use crate::slots::{Collected, InFlight, RingError, SlotState, Slots, Ticket, MAX_SLOTS};
use crate::transport::{FrameTransport, PeekedFrame, SlotMemory, TransportInfo};

/// How long [`Ring::acquire`] waits for the read lease of the slot's
/// previous frame to be dropped before it gives up with
/// [`RingError::Timeout`].
pub const READ_RETURN_WAIT: Duration = Duration::from_secs(30);

/// Numbers the rings of this process (a lease names its ring).
static RING_IDS: AtomicU64 = AtomicU64::new(1);

/// A lease coming back to its ring by being dropped.
enum Back {
    /// A write lease dropped unwritten: its ticket and the slot's memory.
    Unwritten { ticket: Ticket, memory: SlotMemory },
    /// A read lease of `frame` dropped.
    Read { frame: u64 },
}

/// A finished frame, as [`Ring::collect`] gives it: what the consumer
/// reported, what the ring recorded, and how long it queued.
#[derive(Clone, Copy, Debug)]
pub struct Finished {
    /// The consumer's report.
    pub completion: Completion,
    /// What the ring recorded at its hand-over.
    pub rec: InFlight,
    /// From its ready signal to the previous frame's finish (zero if that
    /// had finished by then).
    pub queued: Duration,
    ring: u64,
}

impl Finished {
    /// The frame.
    pub fn frame(&self) -> u64 {
        self.completion.frame
    }

    /// The slot it was in.
    pub fn slot(&self) -> usize {
        self.completion.slot
    }
}

/// A slot taken for writing one frame: owned, `Send` (write it on any
/// thread), given back by [`Ring::hand_over`] once written, or by being
/// dropped unwritten (the ring then hands the same ticket out again).
pub struct WriteLease {
    ring: u64,
    ticket: Ticket,
    memory: Option<SlotMemory>,
    geometry: FrameGeometry,
    started: Option<Instant>,
    write_ns: Option<u64>,
    back: Sender<Back>,
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
    /// The frame's ticket (slot, frame, fence values).
    pub fn ticket(&self) -> &Ticket {
        &self.ticket
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

    /// The frame's bytes, to write (they hold the slot's processed previous
    /// frame until then). The first call starts the frame's write time.
    ///
    /// # Errors
    /// Refused where the frame is not written in this process (the
    /// two-process mode's CUDA side) or the slot's memory is smaller than a
    /// frame.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8], RingError> {
        self.started.get_or_insert_with(Instant::now);
        let slot = self.ticket.slot();
        match self.memory.as_mut() {
            Some(m) => Ok(m.bytes_mut()?),
            None => Err(RingError::Order {
                what: "write",
                frame: self.ticket.frame(),
                slot,
                state: None,
            }),
        }
    }

    /// The frame as a [`FrameMut`] of `layout` (for a
    /// [`crate::source::Source`]).
    ///
    /// # Errors
    /// As [`WriteLease::bytes_mut`]; refused when `layout` is not the
    /// ring's frame size.
    pub fn frame_mut(&mut self, layout: FrameLayout) -> Result<FrameMut<'_>, RingError> {
        let index = self.ticket.frame();
        let bytes = self.bytes_mut()?;
        FrameMut::new(index, layout, bytes).map_err(RingError::Layout)
    }

    /// Records when the frame's write started and how long it took (the
    /// default: from the first [`WriteLease::bytes_mut`] to the hand-over).
    pub fn set_write_time(&mut self, started: Instant, took: Duration) {
        self.started = Some(started);
        self.write_ns = Some(took.as_nanos() as u64);
    }
}

impl Drop for WriteLease {
    fn drop(&mut self) {
        if let Some(memory) = self.memory.take() {
            let ticket = self.ticket.duplicate();
            // The ring is gone when this fails: the memory goes with the
            // lease, as the transport's did.
            let _ = self.back.send(Back::Unwritten { ticket, memory });
        }
    }
}

/// A finished frame's processed bytes, lent for reading: owned, `Send`.
/// While it lives, the slot's next frame is not acquired and the transport
/// neither writes the bytes nor lets the device at them; dropping it gives
/// the slot back.
pub struct ReadLease {
    bytes: Option<PeekedFrame>,
    frame: u64,
    slot: usize,
    back: Sender<Back>,
}

impl fmt::Debug for ReadLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadLease")
            .field("frame", &self.frame)
            .field("slot", &self.slot)
            .field("len", &self.bytes().len())
            .finish()
    }
}

impl ReadLease {
    /// The frame.
    pub fn frame(&self) -> u64 {
        self.frame
    }

    /// The slot.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The processed bytes.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_ref().map_or(&[], PeekedFrame::bytes)
    }
}

impl Drop for ReadLease {
    fn drop(&mut self) {
        // The bytes go first, so the transport finds them given back when
        // the ring hears of it.
        drop(self.bytes.take());
        let _ = self.back.send(Back::Read { frame: self.frame });
    }
}

/// The ring (see the module docs).
pub struct Ring {
    id: u64,
    slots: Slots,
    info: TransportInfo,
    transport: Box<dyn FrameTransport>,
    back_tx: Sender<Back>,
    back_rx: Receiver<Back>,
    done: VecDeque<Finished>,
}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field("id", &self.id)
            .field("backend", &self.info.backend)
            .field("slots", &self.slots)
            .finish()
    }
}

impl Ring {
    /// A ring over `transport`'s slots (`1..=MAX_SLOTS` of them).
    ///
    /// # Errors
    /// [`RingError::Size`] for a transport with no slots or too many.
    pub fn new(transport: impl FrameTransport + 'static) -> Result<Ring, RingError> {
        Ring::from_box(Box::new(transport))
    }

    /// [`Ring::new`] over a boxed transport.
    ///
    /// # Errors
    /// As [`Ring::new`].
    pub fn from_box(transport: Box<dyn FrameTransport>) -> Result<Ring, RingError> {
        let info = transport.info();
        let (back_tx, back_rx) = mpsc::channel();
        Ok(Ring {
            id: RING_IDS.fetch_add(1, Ordering::Relaxed),
            slots: Slots::new(info.slots)?,
            info,
            transport,
            back_tx,
            back_rx,
            done: VecDeque::with_capacity(MAX_SLOTS),
        })
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots.slots()
    }

    /// Layout of every frame.
    pub fn geometry(&self) -> FrameGeometry {
        self.info.geometry
    }

    /// What the transport said about itself when the ring was made.
    pub fn info(&self) -> &TransportInfo {
        &self.info
    }

    /// The transport (for its name and measurements).
    pub fn transport(&self) -> &dyn FrameTransport {
        &*self.transport
    }

    /// Where `slot` is in the protocol (`None` past the ring's end).
    pub fn state(&self, slot: usize) -> Option<SlotState> {
        self.slots.state(slot)
    }

    /// The frame the next new lease is for.
    pub fn next_frame(&self) -> u64 {
        self.slots.next_frame()
    }

    /// Frames handed over and not yet collected (in flight, or finished and
    /// waiting in the ring for [`Ring::collect`]).
    pub fn pending(&self) -> usize {
        self.slots.in_flight() + self.done.len()
    }

    /// Takes back the leases dropped since the last call.
    fn take_back(&mut self) -> Result<(), RingError> {
        while let Ok(b) = self.back_rx.try_recv() {
            self.returned(b)?;
        }
        Ok(())
    }

    fn returned(&mut self, b: Back) -> Result<(), RingError> {
        match b {
            Back::Unwritten { ticket, memory } => {
                self.slots.unwritten(&ticket)?;
                self.transport.put_back(&ticket, memory)?;
            }
            Back::Read { frame } => self.slots.give_back(frame)?,
        }
        Ok(())
    }

    /// Collects one finished frame from the transport (blocking or not).
    fn collect_one(&mut self, block: bool) -> Result<bool, RingError> {
        let c = match block {
            true => self.transport.wait_complete()?,
            false => match self.transport.try_complete()? {
                Some(c) => c,
                None => return Ok(false),
            },
        };
        let Collected { rec, queued } = self.slots.complete(&c)?;
        self.done.push_back(Finished {
            completion: c,
            rec,
            queued,
            ring: self.id,
        });
        Ok(true)
    }

    /// The slot the next [`Ring::acquire`] hands out.
    fn upcoming_slot(&self) -> usize {
        let returned = (0..self.slots())
            .filter_map(|s| match self.slots.state(s) {
                Some(SlotState::Returned { frame, .. }) => Some(frame),
                _ => None,
            })
            .min();
        match returned {
            Some(frame) => (frame % self.slots() as u64) as usize,
            None => self.slots.next_slot(),
        }
    }

    /// Collects every finished frame without blocking, then blocks until
    /// the next lease's slot has no frame in flight and no read lease out
    /// (at most [`READ_RETURN_WAIT`] for a read lease). [`Ring::acquire`]
    /// does this first; call it alone to time the wait.
    ///
    /// # Errors
    /// The transport's failure, or the wait's timeout.
    pub fn make_room(&mut self) -> Result<(), RingError> {
        self.take_back()?;
        while self.collect_one(false)? {}
        let slot = self.upcoming_slot();
        while matches!(self.slots.state(slot), Some(SlotState::InFlight(_))) {
            self.collect_one(true)?;
        }
        let began = Instant::now();
        while let Some(SlotState::Lent(frame)) = self.slots.state(slot) {
            let left = READ_RETURN_WAIT.saturating_sub(began.elapsed());
            match self.back_rx.recv_timeout(left) {
                Ok(b) => self.returned(b)?,
                // The ring holds a sender: only the timeout is left.
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    return Err(RingError::Timeout {
                        waiting_for: format!("the read lease of frame {frame} to be dropped"),
                        limit: READ_RETURN_WAIT,
                    })
                }
            }
        }
        Ok(())
    }

    /// The next frame's slot as a [`WriteLease`], once its previous frame is
    /// collected and the transport found the slot's *free* fence reached.
    /// A frame whose lease was dropped unwritten comes first, with the same
    /// ticket. A finished frame of the slot not read by then can no longer
    /// be read (see the module docs).
    ///
    /// # Errors
    /// [`RingError::Busy`] when the slot is still being written (a ring of
    /// one slot whose lease is out); the transport's failure.
    pub fn acquire(&mut self) -> Result<WriteLease, RingError> {
        self.make_room()?;
        let ticket = self.slots.acquire()?;
        let queued = self.slots.state(ticket.slot()) == Some(SlotState::Queued(ticket.frame()));
        if self.info.queues_before_ready && !queued {
            if let Err(e) = self.transport.queue_consumer(&ticket) {
                self.slots.unwritten(&ticket)?;
                return Err(e.into());
            }
            self.slots.submit_early(&ticket)?;
        }
        let memory = match self.transport.take_slot(&ticket) {
            Ok(m) => m,
            Err(e) => {
                // Not taken: the same ticket comes out again next time.
                self.slots.unwritten(&ticket)?;
                return Err(e.into());
            }
        };
        Ok(WriteLease {
            ring: self.id,
            ticket,
            memory: Some(memory),
            geometry: self.info.geometry,
            started: None,
            write_ns: None,
            back: self.back_tx.clone(),
        })
    }

    /// Hands a written frame over: its memory back to the transport, which
    /// signals *ready*; the consumer queued (unless it was queued at the
    /// acquire). Consumes the lease.
    ///
    /// # Errors
    /// [`RingError::ForeignLease`] for a lease of another ring (it goes back
    /// to its own); the transport's failure.
    pub fn hand_over(&mut self, mut lease: WriteLease) -> Result<(), RingError> {
        if lease.ring != self.id {
            return Err(RingError::ForeignLease {
                frame: lease.frame(),
                slot: lease.slot(),
            });
        }
        self.take_back()?;
        let Some(memory) = lease.memory.take() else {
            return Err(RingError::Order {
                what: "hand-over",
                frame: lease.frame(),
                slot: lease.slot(),
                state: self.slots.state(lease.slot()),
            });
        };
        let t = &lease.ticket;
        let now = Instant::now();
        let started = lease.started.unwrap_or(now);
        let write_ns = lease
            .write_ns
            .unwrap_or_else(|| now.saturating_duration_since(started).as_nanos() as u64);
        if let Err(e) = self.transport.signal_ready(t, memory) {
            // Not signalled: the transport has the memory back, and the
            // same ticket comes out again.
            self.slots.unwritten(t)?;
            return Err(e.into());
        }
        self.slots.release(t, started, write_ns)?;
        if !self.info.queues_before_ready {
            self.transport.queue_consumer(t)?;
            self.slots.submit(t)?;
        }
        Ok(())
    }

    /// The oldest finished frame, if one has finished (does not block).
    ///
    /// # Errors
    /// The transport's failure; a completion out of the protocol.
    pub fn collect(&mut self) -> Result<Option<Finished>, RingError> {
        self.take_back()?;
        if self.done.is_empty() {
            self.collect_one(false)?;
        }
        Ok(self.done.pop_front())
    }

    /// The oldest finished frame, waiting for it (the transport's wait has
    /// its limit).
    ///
    /// # Errors
    /// [`RingError::Idle`] when nothing is pending; the transport's
    /// failure or timeout.
    pub fn wait_collect(&mut self) -> Result<Finished, RingError> {
        self.take_back()?;
        if self.done.is_empty() {
            if self.slots.in_flight() == 0 {
                return Err(RingError::Idle);
            }
            self.collect_one(true)?;
        }
        self.done.pop_front().ok_or(RingError::Idle)
    }

    /// Lends finished frame `f`'s processed bytes for reading, where the
    /// transport can (`Ok(None)`: it cannot; the slot stays free). Only the
    /// last finished frame of a slot whose next frame was not acquired can
    /// be read.
    ///
    /// # Errors
    /// [`RingError::ForeignLease`] for another ring's frame;
    /// [`RingError::Order`] when the slot moved on or is lent already; the
    /// transport's failure.
    pub fn read(&mut self, f: &Finished) -> Result<Option<ReadLease>, RingError> {
        if f.ring != self.id {
            return Err(RingError::ForeignLease {
                frame: f.frame(),
                slot: f.slot(),
            });
        }
        self.take_back()?;
        let Some((slot, free_reached)) = self.slots.lendable(f.frame()) else {
            return Err(RingError::Order {
                what: "read (a frame is read before its slot's next acquire)",
                frame: f.frame(),
                slot: f.slot(),
                state: self.slots.state(f.slot()),
            });
        };
        let Some(bytes) = self.transport.lend(slot, f.frame(), free_reached)? else {
            return Ok(None);
        };
        self.slots.lend(f.frame())?;
        Ok(Some(ReadLease {
            bytes: Some(bytes),
            frame: f.frame(),
            slot,
            back: self.back_tx.clone(),
        }))
    }

    /// The transport's own measurements so far, one line (`None`: it has
    /// none).
    pub fn details(&self) -> Option<String> {
        self.transport.details()
    }

    /// The transport, out of the ring, with the memory of every lease
    /// dropped so far given back to it (leases still out keep theirs).
    pub fn into_transport(mut self) -> Box<dyn FrameTransport> {
        while let Ok(b) = self.back_rx.try_recv() {
            if let Back::Unwritten { ticket, memory } = b {
                let _ = self.transport.put_back(&ticket, memory);
            }
        }
        self.transport
    }

    /// Tears the transport down ([`FrameTransport::close`]), once the
    /// memory of every lease dropped so far is back in it, and reports the
    /// first error a drop would have swallowed.
    ///
    /// # Errors
    /// The transport's teardown failure.
    pub fn close(self) -> Result<(), RingError> {
        Ok(self.into_transport().close()?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::TestPattern;
    use crate::transport::host::{Fault, HostReference};

    const G: FrameGeometry = FrameGeometry { stride: 8, rows: 2 };

    fn host_ring(slots: usize) -> Ring {
        Ring::new(HostReference::new(G, slots, Fault::None)).unwrap()
    }

    fn write(ring: &mut Ring) -> u64 {
        let mut lease = ring.acquire().unwrap();
        let frame = lease.frame();
        TestPattern::new(frame, G.stride).fill(lease.bytes_mut().unwrap());
        ring.hand_over(lease).unwrap();
        frame
    }

    /// Every frame comes back processed, in order, and each slot's read
    /// lease holds its inverted pattern.
    #[test]
    fn frames_go_round_and_come_back_processed() {
        let mut ring = host_ring(3);
        for f in 0..7 {
            assert_eq!(write(&mut ring), f);
            while let Some(done) = ring.collect().unwrap() {
                assert_eq!(done.completion.mismatches, 0);
            }
        }
        let mut seen = Vec::new();
        while ring.pending() > 0 {
            let done = ring.wait_collect().unwrap();
            let read = ring.read(&done).unwrap().unwrap();
            let p = TestPattern::new(done.frame(), G.stride);
            assert_eq!(p.first_mismatch(read.bytes(), 0xff), None);
            seen.push(done.frame());
        }
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        assert!(matches!(ring.wait_collect(), Err(RingError::Idle)));
        ring.close().unwrap();
    }

    /// A write lease dropped unwritten gives its slot back: the next
    /// acquire hands out the same frame with the same fence values, and the
    /// run goes on.
    #[test]
    fn a_lease_dropped_unwritten_returns_the_slot() {
        let mut ring = host_ring(2);
        write(&mut ring);
        let lease = ring.acquire().unwrap();
        let (frame, slot, fences) = (
            lease.frame(),
            lease.slot(),
            (
                lease.ticket().free_wait(),
                lease.ticket().ready(),
                lease.ticket().free_signal(),
            ),
        );
        assert_eq!(ring.state(slot), Some(SlotState::Writing(frame)));
        drop(lease);
        let again = ring.acquire().unwrap();
        assert_eq!((again.frame(), again.slot()), (frame, slot));
        let t = again.ticket();
        assert_eq!((t.free_wait(), t.ready(), t.free_signal()), fences);
        drop(again);
        // Dropped on another thread: the same.
        let lease = ring.acquire().unwrap();
        std::thread::spawn(move || drop(lease)).join().unwrap();
        for _ in 0..4 {
            write(&mut ring);
        }
        let mut n = 0;
        while ring.pending() > 0 {
            assert_eq!(ring.wait_collect().unwrap().completion.mismatches, 0);
            n += 1;
        }
        // Frames 0..=4: the lease dropped twice took no frame number.
        assert_eq!(n, 5);
        assert_eq!(ring.next_frame(), 5);
    }

    /// Both leases cross threads.
    #[test]
    fn leases_are_send() {
        fn send<T: Send>() {}
        send::<WriteLease>();
        send::<ReadLease>();
        send::<Finished>();
    }

    /// A lease written on another thread is handed over on this one.
    #[test]
    fn a_lease_is_written_on_another_thread() {
        let mut ring = host_ring(2);
        let a = ring.acquire().unwrap();
        let b = ring.acquire().unwrap();
        let written = std::thread::spawn(move || {
            [a, b].map(|mut l| {
                let f = l.frame();
                TestPattern::new(f, G.stride).fill(l.bytes_mut().unwrap());
                l
            })
        })
        .join()
        .unwrap();
        for l in written {
            ring.hand_over(l).unwrap();
        }
        for _ in 0..2 {
            assert_eq!(ring.wait_collect().unwrap().completion.mismatches, 0);
        }
    }

    /// A read lease holds its slot; dropping it (here on another thread)
    /// lets the slot's next frame be acquired.
    #[test]
    fn a_read_lease_dropped_gives_the_slot_back() {
        let mut ring = host_ring(1);
        write(&mut ring);
        let done = ring.wait_collect().unwrap();
        let read = ring.read(&done).unwrap().unwrap();
        assert_eq!(ring.state(0), Some(SlotState::Lent(0)));
        assert!(ring.read(&done).is_err(), "lent twice");
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(read);
        });
        // Waits for the reader.
        let lease = ring.acquire().unwrap();
        reader.join().unwrap();
        assert_eq!(lease.frame(), 1);
        assert_eq!(lease.ticket().free_wait(), 1);
        drop(lease);
        // The slot moved on: frame 0 can no longer be read.
        write(&mut ring);
        assert!(matches!(ring.read(&done), Err(RingError::Order { .. })));
    }

    /// A lease (or a finished frame) of another ring is refused with a
    /// typed error, and the lease goes back to its own ring.
    #[test]
    fn another_rings_lease_is_refused() {
        let mut a = host_ring(2);
        let mut b = host_ring(2);
        let lease = a.acquire().unwrap();
        let frame = lease.frame();
        let e = b.hand_over(lease).unwrap_err();
        assert!(
            matches!(e, RingError::ForeignLease { frame: 0, slot: 0 }),
            "{e}"
        );
        assert!(!e.to_string().contains('\n'));
        // Back in `a`: handed out again.
        assert_eq!(a.acquire().unwrap().frame(), frame);
        write(&mut b);
        let done = b.wait_collect().unwrap();
        assert!(matches!(a.read(&done), Err(RingError::ForeignLease { .. })));
    }

    /// A transport's failure comes through the ring as
    /// [`RingError::Transport`], with the transport's error as its source.
    #[test]
    fn transport_errors_keep_their_source() {
        use std::error::Error as _;
        let e = RingError::from(crate::error::TransportError::timeout(
            "slot 1's free fence",
            Duration::from_secs(1),
        ));
        let source = e.source().unwrap();
        assert!(source
            .downcast_ref::<crate::error::TransportError>()
            .is_some());
        assert_eq!(e.to_string(), source.to_string());
        assert!(Ring::new(HostReference::new(G, 0, Fault::None)).is_err());
    }
}
