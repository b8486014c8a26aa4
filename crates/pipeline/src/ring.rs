//! The ring of slots and its one per-slot state machine.
//!
//! A [`Ring`] of `n` slots decides, once per frame, which slot the frame
//! uses and which fence values the two sides wait for and signal, and hands
//! them out as a [`Ticket`]. A transport ([`crate::transport`]) only does
//! the interop a ticket names (wait, write, signal); it keeps no per-slot
//! progress of its own. Fixed capacity, no allocation.
//!
//! # The slot protocol
//!
//! Frame `f` uses slot `f % n`; it is that slot's `k`-th use, `k = f / n`.
//! Each slot has two deterministic fences: *ready* (the producer signals,
//! the consumer waits) and *free* (the consumer signals, the producer
//! waits). The ticket of frame `f` carries:
//!
//! - [`Ticket::free_wait`] = `k`: the producer writes only once the slot's
//!   *free* fence reached `k` (the consumer finished the slot's previous
//!   frame; 0 for a first use, which waits for nothing);
//! - [`Ticket::ready`] = `k + 1`: the producer signals *ready* to it after
//!   writing, and the consumer waits for it;
//! - [`Ticket::free_signal`] = `k + 1`: the consumer signals *free* to it
//!   after processing.
//!
//! Each slot is in one [`SlotState`]; only the ring moves it, and the
//! caller (the program that drives the ring) tells it when:
//!
//! | from       | to         | ring call                  | after the transport's |
//! |------------|------------|----------------------------|-----------------------|
//! | `Free`     | `Writing`  | [`Ring::acquire`] (ticket) | (before) `wait_free`: wait *free* >= `free_wait`, get the bytes |
//! | `Writing`  | `Ready`    | [`Ring::release`]          | `signal_ready`: signal *ready* = `ready` |
//! | `Ready`    | `InFlight` | [`Ring::submit`]           | `queue_consumer`: wait *ready*, process, signal *free* = `free_signal` |
//! | `InFlight` | `Free`     | [`Ring::complete`]         | `try_complete` / `wait_complete` returned the frame |
//!
//! A transport whose consumer waits for *ready* on the device
//! ([`FrameTransport::queues_before_ready`]) may have its consumer queued
//! before the frame is written, so that the device starts on the frame as
//! soon as *ready* arrives instead of after the host has queued the work:
//!
//! | from       | to         | ring call                  | after the transport's |
//! |------------|------------|----------------------------|-----------------------|
//! | `Writing`  | `Queued`   | [`Ring::submit_early`]     | `queue_consumer` (before `wait_free`) |
//! | `Queued`   | `InFlight` | [`Ring::release`]          | `signal_ready` |
//!
//! A collected frame may be lent for reading beyond the call that lent it
//! (the producer's read-back check, on another thread, while the camera
//! writes the next frames):
//!
//! | from       | to         | ring call                  | after the transport's |
//! |------------|------------|----------------------------|-----------------------|
//! | `Free`     | `Lent`     | [`Ring::lend`]             | `lend` lent the frame ([`PeekedFrame`]) |
//! | `Lent`     | `Free`     | [`Ring::give_back`]        | (the reader is done with the bytes) |
//!
//! A transport that [leases its slots](FrameTransport::leases_frames) lets
//! a frame be written on another thread: [`Ring::take_for_write`] is the
//! first half of [`Ring::produce`] (acquire, early queueing, the wait for
//! the slot, whose memory moves out of the transport into a
//! [`WriteLease`]) and [`Ring::hand_over`] the second (the memory back,
//! ready signal, release, queueing). Between the two the slot is `Writing`
//! and the next frame's slot may be taken too.
//!
//! [`Ring::acquire`] refuses a slot that is not `Free`, so a slot's frame is
//! always collected before the slot is written again, a lent frame is
//! given back before its slot's next ticket exists (and so before the
//! transport is asked for those bytes again), and every value a transport
//! waits for has been (or is being) signalled.
//! [`Ring::make_room`] and [`Ring::drain`] collect completions for the
//! caller.

use std::time::{Duration, Instant};

use crate::transport::{Completion, FrameTransport, PeekedFrame, WriteLease};

/// Most slots a ring may have (the ring is a fixed-size array).
pub const MAX_SLOTS: usize = 8;

/// One frame's use of one slot, as the ring handed it out: the slot, the
/// frame and the fence values of the protocol (see the module docs).
/// Only [`Ring::acquire`] makes one; it is neither `Clone` nor `Copy`, so
/// a frame has exactly one.
#[derive(Debug, PartialEq, Eq)]
pub struct Ticket {
    slot: usize,
    frame: u64,
    use_index: u64,
    previous: Option<u64>,
}

impl Ticket {
    /// The slot the frame uses.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The frame index.
    pub fn frame(&self) -> u64 {
        self.frame
    }

    /// The slot's previous frame, whose processed bytes the slot holds when
    /// the producer gets it (`None` for the slot's first use). The ring
    /// hands out a ticket only once that frame is collected.
    pub fn previous_frame(&self) -> Option<u64> {
        self.previous
    }

    /// The value of the slot's *free* fence the producer waits for before it
    /// writes (the number of the slot's earlier frames; 0: wait for nothing).
    pub fn free_wait(&self) -> u64 {
        self.use_index
    }

    /// The value of the slot's *ready* fence: signalled by the producer once
    /// the frame is written, waited for by the consumer.
    pub fn ready(&self) -> u64 {
        self.use_index + 1
    }

    /// The value of the slot's *free* fence the consumer signals once it has
    /// processed the frame.
    pub fn free_signal(&self) -> u64 {
        self.use_index + 1
    }
}

/// A collected frame that still sits in its slot, lent for reading (the
/// producer's check of the processed bytes) before the slot's next ticket
/// exists: made by [`Ring::peek`]. The slot is `Free`, so no transport call
/// for a ticket touches it until the ring hands out its next ticket.
#[derive(Debug, PartialEq, Eq)]
pub struct Peek {
    slot: usize,
    frame: u64,
    free_reached: u64,
}

impl Peek {
    /// The slot.
    pub fn slot(&self) -> usize {
        self.slot
    }
    /// The collected frame whose processed bytes the slot holds.
    pub fn frame(&self) -> u64 {
        self.frame
    }
    /// The value the slot's *free* fence reached when the consumer finished
    /// the frame (its [`Ticket::free_signal`]); the slot's next ticket waits
    /// for the same value.
    pub fn free_reached(&self) -> u64 {
        self.free_reached
    }
}

/// What the ring remembers about a frame between its write and its
/// completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight {
    /// Frame index.
    pub frame: u64,
    /// When the producer started writing it.
    pub started: Instant,
    /// Nanoseconds the producer took to write it (camera, plus the copy in
    /// `--copy` mode).
    pub write_ns: u64,
    /// When the producer signalled it ready.
    pub signalled: Instant,
}

/// Where a slot is in the protocol (see the module docs for the moves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// The consumer is done with it (or it was never used): the next frame
    /// of the slot may be acquired.
    Free,
    /// The producer holds it to write this frame.
    Writing(u64),
    /// Written and signalled ready; the consumer is not queued yet.
    Ready(InFlight),
    /// The consumer is queued for this frame, which the producer still
    /// writes (only for transports that queue before ready).
    Queued(u64),
    /// The consumer is queued for it; its completion is not collected yet.
    InFlight(InFlight),
    /// Free, but its collected frame is lent for reading
    /// ([`PeekedFrame`]): no ticket for the slot until
    /// [`Ring::give_back`].
    Lent(u64),
}

/// A collected frame: what the ring recorded for it, and how long it
/// waited, already signalled ready, for the consumer to finish the frame
/// before it (queueing, not interop cost).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Collected {
    /// What was recorded at [`Ring::release`].
    pub rec: InFlight,
    /// From its ready signal to the previous frame's finish (zero if the
    /// previous frame had finished by then).
    pub queued: Duration,
}

/// The ring: which slot each frame uses, its fence values and the one state
/// machine of every slot.
#[derive(Debug)]
pub struct Ring {
    slots: usize,
    next_frame: u64,
    state: [SlotState; MAX_SLOTS],
    last_done: [Option<u64>; MAX_SLOTS],
    last_finished: Option<Instant>,
}

impl Ring {
    /// An empty ring of `slots` slots, `1..=MAX_SLOTS`; its first frame is 0.
    pub fn new(slots: usize) -> Result<Ring, String> {
        if slots == 0 || slots > MAX_SLOTS {
            return Err(format!(
                "ring size {slots} is outside 1..={MAX_SLOTS} (the ring has a fixed capacity)"
            ));
        }
        Ok(Ring {
            slots,
            next_frame: 0,
            state: [SlotState::Free; MAX_SLOTS],
            last_done: [None; MAX_SLOTS],
            last_finished: None,
        })
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The frame the next [`Ring::acquire`] hands out.
    pub fn next_frame(&self) -> u64 {
        self.next_frame
    }

    /// The slot the next [`Ring::acquire`] hands out.
    pub fn next_slot(&self) -> usize {
        (self.next_frame % self.slots as u64) as usize
    }

    /// Where `slot` is in the protocol (`None` past the ring's end).
    pub fn state(&self, slot: usize) -> Option<SlotState> {
        self.state[..self.slots].get(slot).copied()
    }

    /// Number of frames whose consumer is queued and not collected.
    pub fn in_flight(&self) -> usize {
        self.state[..self.slots]
            .iter()
            .filter(|s| matches!(s, SlotState::InFlight(_)))
            .count()
    }

    /// The last frame collected in `slot`, if any.
    pub fn last_done(&self, slot: usize) -> Option<u64> {
        self.last_done[..self.slots].get(slot).copied().flatten()
    }

    /// `Free -> Writing`: the ticket of the next frame. Refused unless its
    /// slot is free (collect the slot's frame first: [`Ring::make_room`]).
    pub fn acquire(&mut self) -> Result<Ticket, String> {
        let frame = self.next_frame;
        let slot = self.next_slot();
        match self.state[slot] {
            SlotState::Free => {}
            other => {
                return Err(format!(
                    "frame {frame} needs slot {slot}, which is {other:?}; collect its frame first"
                ))
            }
        }
        self.state[slot] = SlotState::Writing(frame);
        self.next_frame += 1;
        Ok(Ticket {
            slot,
            frame,
            use_index: frame / self.slots as u64,
            previous: frame.checked_sub(self.slots as u64),
        })
    }

    fn expect(&self, t: &Ticket, what: &str, ok: bool) -> Result<(), String> {
        if ok {
            return Ok(());
        }
        Err(format!(
            "{what} of frame {} in slot {}, which is {:?}",
            t.frame,
            t.slot,
            self.state(t.slot)
        ))
    }

    /// `Writing -> Ready` (or `Queued -> InFlight`): the frame was written
    /// (from `started`, taking `write_ns`) and the transport signalled its
    /// ready fence.
    pub fn release(&mut self, t: &Ticket, started: Instant, write_ns: u64) -> Result<(), String> {
        let rec = InFlight {
            frame: t.frame,
            started,
            write_ns,
            signalled: Instant::now(),
        };
        match self.state(t.slot) {
            Some(SlotState::Writing(f)) if f == t.frame => {
                self.state[t.slot] = SlotState::Ready(rec);
                Ok(())
            }
            Some(SlotState::Queued(f)) if f == t.frame => {
                self.state[t.slot] = SlotState::InFlight(rec);
                Ok(())
            }
            _ => self.expect(t, "release", false),
        }
    }

    /// `Ready -> InFlight`: the transport queued the consumer for the frame.
    pub fn submit(&mut self, t: &Ticket) -> Result<(), String> {
        match self.state(t.slot) {
            Some(SlotState::Ready(rec)) if rec.frame == t.frame => {
                self.state[t.slot] = SlotState::InFlight(rec);
                Ok(())
            }
            _ => self.expect(t, "submit", false),
        }
    }

    /// `Writing -> Queued`: a transport that [queues before
    /// ready](FrameTransport::queues_before_ready) queued the consumer for
    /// the frame before it was written ([`Ring::release`] then moves it in
    /// flight).
    pub fn submit_early(&mut self, t: &Ticket) -> Result<(), String> {
        let ok = self.state(t.slot) == Some(SlotState::Writing(t.frame));
        self.expect(t, "early submit", ok)?;
        self.state[t.slot] = SlotState::Queued(t.frame);
        Ok(())
    }

    /// `InFlight -> Free`: the transport reported `c` finished. Refused
    /// unless `c` names the frame in flight in its slot.
    pub fn complete(&mut self, c: &Completion) -> Result<Collected, String> {
        let (slot, frame) = (c.slot, c.frame);
        match self.state(slot) {
            Some(SlotState::InFlight(rec)) if rec.frame == frame => {
                self.state[slot] = SlotState::Free;
                self.last_done[slot] = Some(frame);
                let queued = self.last_finished.map_or(Duration::ZERO, |prev| {
                    prev.saturating_duration_since(rec.signalled)
                });
                self.last_finished = Some(c.finished);
                Ok(Collected { rec, queued })
            }
            None => Err(format!(
                "completion names slot {slot}, the ring has {} slots",
                self.slots
            )),
            Some(other) => Err(format!(
                "completion for frame {frame} in slot {slot}, which is {other:?}"
            )),
        }
    }

    /// `Lent -> Free`: the reader of lent frame `frame` is done with its
    /// bytes; the slot's next ticket may be handed out. Refused unless that
    /// frame is lent.
    pub fn give_back(&mut self, frame: u64) -> Result<(), String> {
        let slot = (frame % self.slots as u64) as usize;
        match self.state[slot] {
            SlotState::Lent(f) if f == frame => {
                self.state[slot] = SlotState::Free;
                Ok(())
            }
            other => Err(format!(
                "give-back of frame {frame} in slot {slot}, which is {other:?}"
            )),
        }
    }

    /// Lends collected frame `frame` for reading while its slot waits for its
    /// next ticket. `None` unless the frame was collected and is still the
    /// last one of a `Free` slot (after the slot's next [`Ring::acquire`] the
    /// bytes belong to that ticket).
    pub fn peek(&self, frame: u64) -> Option<Peek> {
        let slot = (frame % self.slots as u64) as usize;
        let free = self.state[slot] == SlotState::Free;
        (free && self.last_done[slot] == Some(frame)).then(|| Peek {
            slot,
            frame,
            free_reached: frame / self.slots as u64 + 1,
        })
    }

    /// Blocks until `frame` is collected (it must have been submitted), then
    /// collects whatever else finished without blocking; calls `each` per
    /// collected frame.
    pub fn collect_through<T: FrameTransport + ?Sized>(
        &mut self,
        t: &mut T,
        frame: u64,
        mut each: impl FnMut(&Completion, &Collected) -> Result<(), String>,
    ) -> Result<(), String> {
        let slot = (frame % self.slots as u64) as usize;
        while matches!(self.state[slot], SlotState::InFlight(rec) if rec.frame <= frame) {
            let c = t.wait_complete().map_err(String::from)?;
            each(&c, &self.complete(&c)?)?;
        }
        while let Some(c) = t.try_complete().map_err(String::from)? {
            each(&c, &self.complete(&c)?)?;
        }
        Ok(())
    }

    /// `Free -> Lent`: lends collected frame `p` (from [`Ring::peek`]) for
    /// reading beyond this call, where the transport can
    /// ([`FrameTransport::lend`]): the [`PeekedFrame`] may go to another
    /// thread that reads it while later frames are written, and the slot's
    /// next ticket is refused until [`Ring::give_back`]. `Ok(None)`: the
    /// transport cannot lend it now; the slot stays `Free` and its frame
    /// unread. A stale `p` (the slot moved on) is refused.
    pub fn lend<T: FrameTransport + ?Sized>(
        &mut self,
        t: &mut T,
        p: &Peek,
    ) -> Result<Option<PeekedFrame>, String> {
        // Checked here, not trusted from the caller.
        if self.peek(p.frame).as_ref() != Some(p) {
            return Err(format!(
                "lend of frame {} in slot {}, which is not a free slot's collected frame",
                p.frame, p.slot
            ));
        }
        let lent = t.lend(p).map_err(String::from)?;
        if lent.is_some() {
            self.state[p.slot] = SlotState::Lent(p.frame);
        }
        Ok(lent)
    }

    /// One frame through the producer's half of the protocol: acquire its
    /// ticket, have `t` wait for the slot, let `write` fill the bytes
    /// (it returns when it started writing and how many nanoseconds it
    /// took), signal ready, queue the consumer (first, right after the
    /// acquire, where the transport [queues before
    /// ready](FrameTransport::queues_before_ready)). Returns the frame's ticket
    /// (already submitted). Call [`Ring::make_room`] first.
    pub fn produce<T: FrameTransport + ?Sized>(
        &mut self,
        t: &mut T,
        write: impl FnOnce(&Ticket, &mut [u8]) -> Result<(Instant, u64), String>,
    ) -> Result<Ticket, String> {
        let ticket = self.acquire()?;
        let early = t.queues_before_ready();
        if early {
            t.queue_consumer(&ticket).map_err(String::from)?;
            self.submit_early(&ticket)?;
        }
        let (started, write_ns) = write(&ticket, t.wait_free(&ticket).map_err(String::from)?)?;
        t.signal_ready(&ticket).map_err(String::from)?;
        self.release(&ticket, started, write_ns)?;
        if !early {
            t.queue_consumer(&ticket).map_err(String::from)?;
            self.submit(&ticket)?;
        }
        Ok(ticket)
    }

    /// The first half of [`Ring::produce`] for a frame written on another
    /// thread: acquire its ticket (`Free -> Writing`; refused unless the
    /// slot is free, as for [`Ring::acquire`]), queue the consumer where the
    /// transport [queues before ready](FrameTransport::queues_before_ready),
    /// and take the slot's memory out of the transport
    /// ([`FrameTransport::take_for_write`], which waits for the slot as
    /// `wait_free` does). More than one slot may be `Writing` at once: the
    /// next frame's slot may be taken while this one is written. Refused
    /// when the transport does not lease its slots (the ticket is then
    /// acquired and never handed over: call it only where
    /// [`FrameTransport::leases_frames`]).
    pub fn take_for_write<T: FrameTransport + ?Sized>(
        &mut self,
        t: &mut T,
    ) -> Result<(Ticket, WriteLease), String> {
        if !t.leases_frames() {
            return Err(format!(
                "the {} transport does not lease its slots for writing",
                t.backend()
            ));
        }
        let ticket = self.acquire()?;
        if t.queues_before_ready() {
            t.queue_consumer(&ticket).map_err(String::from)?;
            self.submit_early(&ticket)?;
        }
        let lease = t
            .take_for_write(&ticket)
            .map_err(String::from)?
            .ok_or_else(|| {
                format!(
                    "the {} transport did not lease slot {}",
                    t.backend(),
                    ticket.slot
                )
            })?;
        Ok((ticket, lease))
    }

    /// The second half: give the written memory back to the transport
    /// ([`FrameTransport::put_back`]), signal ready, queue the consumer
    /// (unless it was queued early), as [`Ring::produce`] does after its
    /// `write`. `started` and `write_ns` say when and how long the frame
    /// was written.
    pub fn hand_over<T: FrameTransport + ?Sized>(
        &mut self,
        t: &mut T,
        ticket: Ticket,
        lease: WriteLease,
        started: Instant,
        write_ns: u64,
    ) -> Result<Ticket, String> {
        t.put_back(&ticket, lease).map_err(String::from)?;
        t.signal_ready(&ticket).map_err(String::from)?;
        self.release(&ticket, started, write_ns)?;
        if !t.queues_before_ready() {
            t.queue_consumer(&ticket).map_err(String::from)?;
            self.submit(&ticket)?;
        }
        Ok(ticket)
    }

    /// Collects every finished frame without blocking, then blocks until
    /// the next frame's slot is free; calls `each` per collected frame.
    pub fn make_room<T: FrameTransport + ?Sized>(
        &mut self,
        t: &mut T,
        mut each: impl FnMut(&Completion, &Collected) -> Result<(), String>,
    ) -> Result<(), String> {
        while let Some(c) = t.try_complete().map_err(String::from)? {
            each(&c, &self.complete(&c)?)?;
        }
        while matches!(self.state[self.next_slot()], SlotState::InFlight(_)) {
            let c = t.wait_complete().map_err(String::from)?;
            each(&c, &self.complete(&c)?)?;
        }
        Ok(())
    }

    /// Blocks until every frame in flight is collected; calls `each` per
    /// collected frame.
    pub fn drain<T: FrameTransport + ?Sized>(
        &mut self,
        t: &mut T,
        mut each: impl FnMut(&Completion, &Collected) -> Result<(), String>,
    ) -> Result<(), String> {
        while self.in_flight() > 0 {
            let c = t.wait_complete().map_err(String::from)?;
            each(&c, &self.complete(&c)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn done(t: &Ticket) -> Completion {
        Completion {
            slot: t.slot,
            frame: t.frame,
            mismatches: 0,
            process: Duration::ZERO,
            busy: Duration::ZERO,
            finished: Instant::now(),
        }
    }

    fn write(ring: &mut Ring) -> Ticket {
        let t = ring.acquire().unwrap();
        ring.release(&t, Instant::now(), 0).unwrap();
        ring.submit(&t).unwrap();
        t
    }

    /// The early path: `Writing -> Queued` by `submit_early`, `Queued ->
    /// InFlight` by `release`; a queued frame is not in flight (no
    /// completion can come before its ready signal), is refused a second
    /// submit of either kind, and its slot is not free.
    #[test]
    fn a_consumer_queued_before_the_write_moves_through_queued() {
        let mut ring = Ring::new(2).unwrap();
        let t = ring.acquire().unwrap();
        ring.submit_early(&t).unwrap();
        assert_eq!(ring.state(0), Some(SlotState::Queued(0)));
        assert_eq!(ring.in_flight(), 0);
        assert!(ring.submit_early(&t).is_err(), "queued twice");
        assert!(
            ring.submit(&t).is_err(),
            "queued again after an early submit"
        );
        let t1 = ring.acquire().unwrap();
        assert_eq!(t1.slot(), 1, "the next frame takes the next slot");
        ring.release(&t1, Instant::now(), 0).unwrap();
        assert!(
            ring.submit_early(&t1).is_err(),
            "early submit of a released frame"
        );
        assert!(
            ring.complete(&done(&t)).is_err(),
            "completed before its release"
        );
        ring.release(&t, Instant::now(), 0).unwrap();
        assert!(matches!(ring.state(0), Some(SlotState::InFlight(r)) if r.frame == 0));
        assert!(
            ring.release(&t, Instant::now(), 0).is_err(),
            "released twice"
        );
        assert_eq!(ring.in_flight(), 1);
        ring.complete(&done(&t)).unwrap();
        assert_eq!(ring.state(0), Some(SlotState::Free));
        assert!(
            ring.submit_early(&t).is_err(),
            "early submit of a collected frame"
        );
    }

    #[test]
    fn rejects_zero_and_oversized_rings() {
        assert!(Ring::new(0).is_err());
        assert!(Ring::new(MAX_SLOTS + 1).is_err());
        assert_eq!(Ring::new(MAX_SLOTS).unwrap().slots(), MAX_SLOTS);
    }

    #[test]
    fn tickets_carry_the_deterministic_fence_values() {
        let mut ring = Ring::new(3).unwrap();
        let mut seen = Vec::new();
        for _ in 0..7 {
            let t = write(&mut ring);
            seen.push((t.slot(), t.free_wait(), t.ready(), t.free_signal()));
            assert_eq!(t.previous_frame(), t.frame().checked_sub(3));
            ring.complete(&done(&t)).unwrap();
        }
        // Slot 1 is used by frames 1 and 4: ready 1 then 2; frame 4 waits
        // for the free value frame 1 signalled.
        assert_eq!(
            seen,
            [
                (0, 0, 1, 1),
                (1, 0, 1, 1),
                (2, 0, 1, 1),
                (0, 1, 2, 2),
                (1, 1, 2, 2),
                (2, 1, 2, 2),
                (0, 2, 3, 3)
            ]
        );
    }

    #[test]
    fn every_move_is_checked() {
        let mut ring = Ring::new(2).unwrap();
        let t0 = ring.acquire().unwrap();
        assert_eq!(ring.state(0), Some(SlotState::Writing(0)));
        assert!(ring.submit(&t0).is_err(), "submit before release");
        ring.release(&t0, Instant::now(), 0).unwrap();
        assert!(
            ring.submit_early(&t0).is_err(),
            "early submit after release"
        );
        let mut ring = Ring::new(2).unwrap();
        let t0 = ring.acquire().unwrap();
        assert!(ring.complete(&done(&t0)).is_err(), "complete while writing");
        ring.release(&t0, Instant::now(), 0).unwrap();
        assert!(
            ring.release(&t0, Instant::now(), 0).is_err(),
            "released twice"
        );
        ring.submit(&t0).unwrap();
        assert!(ring.submit(&t0).is_err(), "submitted twice");
        let t1 = write(&mut ring);
        assert_eq!(ring.in_flight(), 2);
        // Frame 2 needs slot 0, which is still in flight.
        assert!(ring.acquire().is_err());
        // Completions must name the frame in flight in that slot.
        let mut wrong = done(&t1);
        wrong.slot = 0;
        assert!(ring.complete(&wrong).is_err());
        wrong.slot = 5;
        assert!(ring.complete(&wrong).is_err());
        assert_eq!(ring.complete(&done(&t0)).unwrap().rec.frame, 0);
        assert!(ring.complete(&done(&t0)).is_err(), "double completion");
        assert_eq!(ring.last_done(0), Some(0));
        assert_eq!(ring.last_done(1), None);
        assert_eq!(ring.acquire().unwrap().slot(), 0);
        assert_eq!(ring.state(9), None);
    }

    #[test]
    fn queueing_is_measured_against_the_previous_finish() {
        let mut ring = Ring::new(2).unwrap();
        let a = write(&mut ring);
        let b = write(&mut ring);
        let late = Instant::now() + Duration::from_millis(5);
        let mut c = done(&a);
        c.finished = late;
        assert_eq!(ring.complete(&c).unwrap().queued, Duration::ZERO);
        // `b` was ready before `a` finished: it queued behind it.
        assert!(ring.complete(&done(&b)).unwrap().queued >= Duration::from_millis(4));
    }

    #[test]
    fn peek_lends_only_a_free_slots_last_collected_frame() {
        let mut ring = Ring::new(3).unwrap();
        let t0 = write(&mut ring);
        assert_eq!(ring.peek(0), None, "in flight: not lent");
        ring.complete(&done(&t0)).unwrap();
        let p = ring.peek(0).unwrap();
        assert_eq!((p.slot(), p.frame(), p.free_reached()), (0, 0, 1));
        assert_eq!(p.free_reached(), t0.free_signal());
        assert_eq!(ring.peek(3), None, "not produced yet");
        assert_eq!(ring.peek(1), None, "never written");
        let _t1 = write(&mut ring);
        let _t2 = write(&mut ring);
        // Frame 3 takes slot 0: from its acquire on, frame 0 is not lent.
        let t3 = ring.acquire().unwrap();
        assert_eq!(
            t3.free_wait(),
            p.free_reached(),
            "the next ticket waits for the same value"
        );
        assert_eq!(ring.peek(0), None);
    }

    /// A transport that records what it was asked and lends from plain
    /// buffers (or refuses to lend).
    struct Lender {
        bufs: Vec<crate::consumer::shared::Lendable<Vec<u8>>>,
        lend: bool,
        /// Whether it queues its consumer before ready.
        early: bool,
        done: std::collections::VecDeque<Completion>,
        log: Vec<String>,
    }

    impl FrameTransport for Lender {
        fn backend(&self) -> &'static str {
            "lender"
        }
        fn slot_count(&self) -> usize {
            self.bufs.len()
        }
        fn geometry(&self) -> crate::transport::FrameGeometry {
            crate::transport::FrameGeometry { stride: 4, rows: 1 }
        }
        fn wait_free(&mut self, t: &Ticket) -> Result<&mut [u8], crate::transport::TransportError> {
            self.log.push(format!("wait_free {}", t.frame()));
            Ok(self.bufs[t.slot()].get_mut(t.slot())?)
        }
        fn lend(
            &mut self,
            p: &Peek,
        ) -> Result<Option<PeekedFrame>, crate::transport::TransportError> {
            if !self.lend {
                return Ok(None);
            }
            self.log.push(format!("lend {}", p.frame()));
            Ok(Some(self.bufs[p.slot()].lend(4)?))
        }
        fn signal_ready(&mut self, t: &Ticket) -> Result<(), crate::transport::TransportError> {
            self.log.push(format!("ready {}", t.frame()));
            Ok(())
        }
        fn queue_consumer(&mut self, t: &Ticket) -> Result<(), crate::transport::TransportError> {
            self.log.push(format!("queue {}", t.frame()));
            self.done.push_back(done(t));
            Ok(())
        }
        fn queues_before_ready(&self) -> bool {
            self.early
        }
        fn try_complete(&mut self) -> Result<Option<Completion>, crate::transport::TransportError> {
            Ok(None)
        }
        fn wait_complete(&mut self) -> Result<Completion, crate::transport::TransportError> {
            self.done
                .pop_front()
                .ok_or_else(|| crate::transport::TransportError::new("nothing in flight"))
        }
    }

    fn lender(slots: usize, lend: bool) -> Lender {
        Lender {
            bufs: (0..slots)
                .map(|i| crate::consumer::shared::Lendable::new(vec![i as u8; 4]))
                .collect(),
            lend,
            early: false,
            done: Default::default(),
            log: Vec::new(),
        }
    }

    /// `produce` queues the consumer after the ready signal, or, for a
    /// transport that queues before ready, right after the acquire (before
    /// the wait for the slot and the write); the ring's states follow.
    #[test]
    fn produce_queues_the_consumer_where_the_transport_can_take_it() {
        for early in [false, true] {
            let mut ring = Ring::new(2).unwrap();
            let mut t = lender(2, false);
            t.early = early;
            let mut written = None;
            let ticket = ring
                .produce(&mut t, |ticket, _| {
                    written = Some(ticket.frame());
                    Ok((Instant::now(), 0))
                })
                .unwrap();
            let want: &[&str] = if early {
                &["queue 0", "wait_free 0", "ready 0"]
            } else {
                &["wait_free 0", "ready 0", "queue 0"]
            };
            assert_eq!(t.log, want, "early = {early}");
            assert_eq!(written, Some(0));
            assert!(matches!(ring.state(0), Some(SlotState::InFlight(r)) if r.frame == 0));
            ring.drain(&mut t, |c, _| {
                assert_eq!(c.frame, ticket.frame());
                Ok(())
            })
            .unwrap();
            assert_eq!(ring.state(0), Some(SlotState::Free));
        }
    }

    #[test]
    fn lend_keeps_the_slot_until_it_is_given_back() {
        let mut ring = Ring::new(3).unwrap();
        let mut t = lender(3, true);
        for _ in 0..3 {
            ring.produce(&mut t, |_, _| Ok((Instant::now(), 0)))
                .unwrap();
        }
        // Frame 1 (slot 1) may be lent once it is collected, not before.
        ring.make_room(&mut t, |_, _| Ok(())).unwrap();
        let stale = Peek {
            slot: 2,
            frame: 2,
            free_reached: 1,
        };
        assert!(ring.lend(&mut t, &stale).is_err(), "frame 2 is in flight");
        ring.collect_through(&mut t, 1, |_, _| Ok(())).unwrap();
        assert_eq!(ring.in_flight(), 1, "frame 2 still in flight");
        let p = ring.peek(1).unwrap();
        let lent = ring.lend(&mut t, &p).unwrap().unwrap();
        assert_eq!(lent.len(), 4);
        // The lent bytes are slot 1's buffer, which holds frame 1.
        assert_eq!(
            lent.as_ptr(),
            t.bufs[1].get().as_ptr(),
            "slot 1's buffer lent"
        );
        assert_eq!(lent.bytes(), &[1; 4][..], "slot 1's bytes");
        assert!(t.log.iter().any(|l| l == "lend 1"), "{:?}", t.log);
        // Frame 1 is lent: slot 1 is neither peeked nor lent again, nor
        // acquired (frame 4's ticket) until it is given back; frame 3
        // (slot 0) goes on meanwhile.
        assert_eq!(ring.state(1), Some(SlotState::Lent(1)));
        assert_eq!(ring.peek(1), None);
        assert!(ring.lend(&mut t, &p).is_err(), "lent twice");
        ring.produce(&mut t, |ticket, bytes| {
            bytes.fill(ticket.frame() as u8);
            Ok((Instant::now(), 0))
        })
        .unwrap();
        assert_eq!(t.bufs[0].get(), &vec![3; 4]);
        ring.make_room(&mut t, |_, _| Ok(())).unwrap();
        let e = ring
            .produce(&mut t, |_, _| Ok((Instant::now(), 0)))
            .unwrap_err();
        assert!(e.contains("slot 1") && e.contains("Lent"), "{e}");
        assert_eq!(ring.next_frame(), 4, "nothing acquired");
        assert!(ring.give_back(2).is_err(), "frame 2 was not lent");
        drop(lent);
        ring.give_back(1).unwrap();
        assert!(ring.give_back(1).is_err(), "given back twice");
        ring.produce(&mut t, |_, _| Ok((Instant::now(), 0)))
            .unwrap();
        // Slot 1 moved on to frame 4: the old peek is stale even once frame
        // 4 is collected.
        ring.drain(&mut t, |_, _| Ok(())).unwrap();
        assert!(ring.lend(&mut t, &p).is_err(), "stale peek");
        assert!(ring.peek(4).is_some());

        // A transport that cannot lend: nothing lent, the slot stays free.
        let mut ring = Ring::new(3).unwrap();
        let mut t = lender(3, false);
        for _ in 0..3 {
            ring.produce(&mut t, |_, _| Ok((Instant::now(), 0)))
                .unwrap();
        }
        ring.collect_through(&mut t, 1, |_, _| Ok(())).unwrap();
        let p = ring.peek(1).unwrap();
        assert!(ring.lend(&mut t, &p).unwrap().is_none());
        assert_eq!(ring.state(1), Some(SlotState::Free));
        assert_eq!(ring.peek(1), Some(p));
    }

    /// The split produce (`take_for_write`, then `hand_over`) over the
    /// host transport, which leases its slots: two slots may be `Writing`
    /// at once (frame f + 1 taken before f is handed over), a leased slot
    /// is neither signalled nor lent while it is out, a lease is given back
    /// only for its own ticket, a slot still in flight or lent is not
    /// taken, and every frame comes back processed.
    #[test]
    fn a_leased_slot_is_written_off_the_transport_and_handed_over_after() {
        use crate::transport::host::{Fault, HostReference};
        let g = crate::transport::FrameGeometry { stride: 8, rows: 2 };
        let mut t = HostReference::new(g, 2, Fault::None);
        let mut ring = Ring::new(2).unwrap();
        let (t0, mut l0) = ring.take_for_write(&mut t).unwrap();
        let (t1, mut l1) = ring.take_for_write(&mut t).unwrap();
        assert_eq!(ring.state(0), Some(SlotState::Writing(0)));
        assert_eq!(ring.state(1), Some(SlotState::Writing(1)));
        // Frame 2 needs slot 0, which is being written.
        assert!(ring.take_for_write(&mut t).is_err());
        assert_eq!(ring.next_frame(), 2, "nothing acquired");
        // While out, the transport cannot signal the slot.
        let e = t.signal_ready(&t0).unwrap_err();
        assert!(e.to_string().contains("not waited for"), "{e}");
        for (ticket, lease) in [(&t0, &mut l0), (&t1, &mut l1)] {
            let bytes = lease.bytes_mut().unwrap();
            assert_eq!(bytes.len(), g.frame_len());
            crate::camera::TestPattern::new(ticket.frame(), g.stride).fill(bytes);
        }
        // A lease goes back only for its own ticket (a misuse drops it:
        // checked on a lease of its own below).
        let t1 = ring.hand_over(&mut t, t1, l1, Instant::now(), 0).unwrap();
        assert!(matches!(ring.state(1), Some(SlotState::InFlight(r)) if r.frame == 1));
        ring.hand_over(&mut t, t0, l0, Instant::now(), 0).unwrap();
        let mut seen = Vec::new();
        ring.drain(&mut t, |c, _| {
            seen.push((c.frame, c.mismatches));
            Ok(())
        })
        .unwrap();
        seen.sort_unstable();
        assert_eq!(seen, [(0, 0), (1, 0)]);
        // The next use of slot 1 holds frame 1, processed (inverted).
        let (t2, mut l2) = ring.take_for_write(&mut t).unwrap();
        assert_eq!(t2.frame(), 2);
        let (t3, mut l3) = ring.take_for_write(&mut t).unwrap();
        assert_eq!(t3.previous_frame(), Some(t1.frame()));
        let pattern = crate::camera::TestPattern::new(1, g.stride);
        assert_eq!(pattern.first_mismatch(l3.bytes_mut().unwrap(), 0xff), None);
        drop(l3);
        // `l3` was dropped, not given back: slot 1 has no memory, and the
        // transport says so instead of writing it.
        assert!(t.signal_ready(&t3).is_err());
        // A lease given back for another ticket is refused.
        let bytes = l2.bytes_mut().unwrap();
        bytes.fill(0);
        let e = ring
            .hand_over(&mut t, t3, l2, Instant::now(), 0)
            .unwrap_err();
        assert!(e.contains("given back for frame 3"), "{e}");
    }

    /// A transport that does not lease refuses the split produce before it
    /// acquires anything.
    #[test]
    fn take_for_write_needs_a_leasing_transport() {
        let mut ring = Ring::new(2).unwrap();
        let mut t = lender(2, false);
        let e = ring.take_for_write(&mut t).unwrap_err();
        assert!(e.contains("does not lease"), "{e}");
        assert_eq!(ring.next_frame(), 0);
        assert_eq!(ring.state(0), Some(SlotState::Free));
    }
}
