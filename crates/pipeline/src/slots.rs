//! The ring's one per-slot state machine: which slot each frame uses,
//! which fence values the two sides wait for and signal, and where each
//! slot is in the protocol.
//!
//! [`Slots`] decides, once per frame, which slot the frame uses and which
//! fence values the two sides wait for and signal, and hands them out as a
//! [`Ticket`]. It does no interop and holds no memory: [`crate::ring::Ring`]
//! drives it together with a transport, and the two-process mode's camera
//! follows the CUDA process's tickets with one of its own. Fixed capacity,
//! no allocation.
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
//! | from       | to         | call                     | when |
//! |------------|------------|--------------------------|------|
//! | `Free`     | `Writing`  | [`Slots::acquire`]       | the slot is taken for writing (a write lease) |
//! | `Writing`  | `Returned` | [`Slots::unwritten`]     | the lease was dropped unwritten |
//! | `Returned` | `Writing`  | [`Slots::acquire`]       | the same ticket again, before any new frame |
//! | `Writing`  | `Ready`    | [`Slots::release`]       | written, *ready* signalled |
//! | `Ready`    | `InFlight` | [`Slots::submit`]        | the consumer was queued |
//! | `InFlight` | `Free`     | [`Slots::complete`]      | the consumer finished the frame |
//! | `Free`     | `Lent`     | [`Slots::lend`]          | the finished frame is lent for reading |
//! | `Lent`     | `Free`     | [`Slots::give_back`]     | the reader is done |
//!
//! A transport whose consumer waits for *ready* on the device may have its
//! consumer queued before the frame is written (`Writing -> Queued` by
//! [`Slots::submit_early`], `Queued -> InFlight` by [`Slots::release`]); a
//! lease of such a frame dropped unwritten keeps the consumer queued
//! (`Returned { queued: true }`), and the re-issued ticket goes back to
//! `Queued`.
//!
//! [`Slots::acquire`] refuses a slot that is not `Free`, so a slot's frame
//! is always collected (and a lent frame given back) before the slot is
//! written again, and every value a side waits for has been (or is being)
//! signalled. A ticket given back unwritten is handed out again, with the
//! same frame and fence values, so the fences never skip a value.

use std::fmt;
use std::time::{Duration, Instant};

use crate::error::TransportError;
use crate::frame::{Completion, LayoutError};

/// Most slots a ring may have (the state is a fixed-size array).
pub const MAX_SLOTS: usize = 8;

/// Why the ring refused a call, or what failed under it. Each variant
/// prints as one line; a transport's failure keeps its
/// [`TransportError`] as [`std::error::Error::source`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RingError {
    /// A ring size outside `1..=MAX_SLOTS`.
    Size {
        /// The size asked for.
        slots: usize,
    },
    /// The next frame's slot is not free (collect its frame, or give its
    /// read lease back, first).
    Busy {
        /// The frame that needs the slot.
        frame: u64,
        /// The slot.
        slot: usize,
        /// Where the slot is.
        state: SlotState,
    },
    /// A move out of the protocol's order (the caller's bug): `what` of
    /// `frame` in `slot`, which is in `state` (`None`: no such slot).
    Order {
        /// The move refused.
        what: &'static str,
        /// The frame.
        frame: u64,
        /// The slot.
        slot: usize,
        /// Where the slot is.
        state: Option<SlotState>,
    },
    /// A lease made by another ring was handed to this one (it was dropped,
    /// so its own ring gets its slot back).
    ForeignLease {
        /// The lease's frame.
        frame: u64,
        /// The lease's slot.
        slot: usize,
    },
    /// A wait for a finished frame with none pending (nothing handed over
    /// and not yet collected).
    Idle,
    /// A wait of the ring ran past its limit.
    Timeout {
        /// What was waited for.
        waiting_for: String,
        /// The limit.
        limit: Duration,
    },
    /// A frame view of another size than the ring's frames.
    Layout(LayoutError),
    /// The transport failed.
    Transport(TransportError),
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Size { slots } => write!(
                f,
                "ring size {slots} is outside 1..={MAX_SLOTS} (the ring has a fixed capacity)"
            ),
            RingError::Busy { frame, slot, state } => write!(
                f,
                "frame {frame} needs slot {slot}, which is {state:?}; collect its frame (or give its read lease back) first"
            ),
            RingError::Order {
                what,
                frame,
                slot,
                state: Some(state),
            } => write!(f, "{what} of frame {frame} in slot {slot}, which is {state:?}"),
            RingError::Order {
                what,
                frame,
                slot,
                state: None,
            } => write!(f, "{what} of frame {frame} names slot {slot}, which the ring does not have"),
            RingError::ForeignLease { frame, slot } => write!(
                f,
                "the lease of frame {frame} in slot {slot} belongs to another ring"
            ),
            RingError::Idle => f.write_str("no frame is pending to wait for"),
            RingError::Timeout { waiting_for, limit } => {
                write!(f, "timed out after {limit:?} waiting for {waiting_for}")
            }
            RingError::Layout(e) => fmt::Display::fmt(e, f),
            RingError::Transport(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl std::error::Error for RingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RingError::Transport(e) => Some(e),
            RingError::Layout(e) => Some(e),
            _ => None,
        }
    }
}

impl From<TransportError> for RingError {
    fn from(e: TransportError) -> Self {
        RingError::Transport(e)
    }
}

impl From<RingError> for String {
    /// The one-line message (for callers that report `String`s).
    fn from(e: RingError) -> String {
        e.to_string()
    }
}

/// One frame's use of one slot, as the ring handed it out: the slot, the
/// frame and the fence values of the protocol (see the module docs).
/// Only [`Slots::acquire`] makes one; it is neither `Clone` nor `Copy`.
#[derive(Debug, PartialEq, Eq)]
pub struct Ticket {
    slot: usize,
    frame: u64,
    use_index: u64,
    previous: Option<u64>,
}

impl Ticket {
    /// The same ticket again (crate-private: a lease dropped unwritten
    /// sends it back to its ring; only one of the two is used after).
    pub(crate) fn duplicate(&self) -> Ticket {
        Ticket {
            slot: self.slot,
            frame: self.frame,
            use_index: self.use_index,
            previous: self.previous,
        }
    }

    /// The slot the frame uses.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The frame index.
    pub fn frame(&self) -> u64 {
        self.frame
    }

    /// The slot's previous frame, whose processed bytes the slot holds when
    /// the producer gets it (`None` for the slot's first use).
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

/// What the ring remembers about a frame between its write and its
/// completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight {
    /// Frame index.
    pub frame: u64,
    /// When the producer started writing it.
    pub started: Instant,
    /// Nanoseconds the producer took to write it.
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
    /// This frame's lease was dropped unwritten: the next acquire hands
    /// the same ticket out again (`queued`: its consumer is already
    /// queued, for a transport that queues before ready).
    Returned {
        /// The frame.
        frame: u64,
        /// Whether its consumer was queued early.
        queued: bool,
    },
    /// Written and signalled ready; the consumer is not queued yet.
    Ready(InFlight),
    /// The consumer is queued for this frame, which the producer still
    /// writes (only for transports that queue before ready).
    Queued(u64),
    /// The consumer is queued for it; its completion is not collected yet.
    InFlight(InFlight),
    /// Free, but its finished frame is lent for reading: no ticket for the
    /// slot until [`Slots::give_back`].
    Lent(u64),
}

/// A collected frame: what the ring recorded for it, and how long it
/// waited, already signalled ready, for the consumer to finish the frame
/// before it (queueing, not interop cost).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Collected {
    /// What was recorded at [`Slots::release`].
    pub rec: InFlight,
    /// From its ready signal to the previous frame's finish (zero if the
    /// previous frame had finished by then).
    pub queued: Duration,
}

/// The state machine of every slot (see the module docs).
#[derive(Debug)]
pub struct Slots {
    slots: usize,
    next_frame: u64,
    state: [SlotState; MAX_SLOTS],
    last_done: [Option<u64>; MAX_SLOTS],
    last_finished: Option<Instant>,
}

impl Slots {
    /// An empty ring of `slots` slots, `1..=MAX_SLOTS`; its first frame is 0.
    pub fn new(slots: usize) -> Result<Slots, RingError> {
        if slots == 0 || slots > MAX_SLOTS {
            return Err(RingError::Size { slots });
        }
        Ok(Slots {
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

    /// The frame the next new ticket is for (tickets given back unwritten
    /// are handed out again first).
    pub fn next_frame(&self) -> u64 {
        self.next_frame
    }

    /// The slot of [`Slots::next_frame`].
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

    /// The ticket of `frame` (its slot, fence values and previous frame).
    fn ticket(&self, frame: u64) -> Ticket {
        let n = self.slots as u64;
        Ticket {
            slot: (frame % n) as usize,
            frame,
            use_index: frame / n,
            previous: frame.checked_sub(n),
        }
    }

    /// The oldest ticket given back unwritten, if any.
    fn returned(&self) -> Option<(u64, bool)> {
        self.state[..self.slots]
            .iter()
            .filter_map(|s| match *s {
                SlotState::Returned { frame, queued } => Some((frame, queued)),
                _ => None,
            })
            .min()
    }

    /// `Free -> Writing` (or `Returned -> Writing / Queued`): the ticket of
    /// the oldest frame given back unwritten, else of the next frame.
    /// Refused unless its slot is free.
    pub fn acquire(&mut self) -> Result<Ticket, RingError> {
        if let Some((frame, queued)) = self.returned() {
            let t = self.ticket(frame);
            self.state[t.slot] = match queued {
                true => SlotState::Queued(frame),
                false => SlotState::Writing(frame),
            };
            return Ok(t);
        }
        let t = self.ticket(self.next_frame);
        match self.state[t.slot] {
            SlotState::Free => {}
            state => {
                return Err(RingError::Busy {
                    frame: t.frame,
                    slot: t.slot,
                    state,
                })
            }
        }
        self.state[t.slot] = SlotState::Writing(t.frame);
        self.next_frame += 1;
        Ok(t)
    }

    fn refuse(&self, t: &Ticket, what: &'static str) -> RingError {
        RingError::Order {
            what,
            frame: t.frame,
            slot: t.slot,
            state: self.state(t.slot),
        }
    }

    /// `Writing -> Returned` (or `Queued -> Returned { queued }`): `t`'s
    /// lease was given back unwritten; the next [`Slots::acquire`] hands the
    /// same ticket out again.
    pub fn unwritten(&mut self, t: &Ticket) -> Result<(), RingError> {
        let queued = match self.state(t.slot) {
            Some(SlotState::Writing(f)) if f == t.frame => false,
            Some(SlotState::Queued(f)) if f == t.frame => true,
            _ => return Err(self.refuse(t, "unwritten return")),
        };
        self.state[t.slot] = SlotState::Returned {
            frame: t.frame,
            queued,
        };
        Ok(())
    }

    /// `Writing -> Ready` (or `Queued -> InFlight`): the frame was written
    /// (from `started`, taking `write_ns`) and the transport signalled its
    /// ready fence.
    pub fn release(
        &mut self,
        t: &Ticket,
        started: Instant,
        write_ns: u64,
    ) -> Result<(), RingError> {
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
            _ => Err(self.refuse(t, "release")),
        }
    }

    /// `Ready -> InFlight`: the transport queued the consumer for the frame.
    pub fn submit(&mut self, t: &Ticket) -> Result<(), RingError> {
        match self.state(t.slot) {
            Some(SlotState::Ready(rec)) if rec.frame == t.frame => {
                self.state[t.slot] = SlotState::InFlight(rec);
                Ok(())
            }
            _ => Err(self.refuse(t, "submit")),
        }
    }

    /// `Writing -> Queued`: a transport that queues before ready queued the
    /// consumer for the frame before it was written ([`Slots::release`] then
    /// moves it in flight).
    pub fn submit_early(&mut self, t: &Ticket) -> Result<(), RingError> {
        if self.state(t.slot) != Some(SlotState::Writing(t.frame)) {
            return Err(self.refuse(t, "early submit"));
        }
        self.state[t.slot] = SlotState::Queued(t.frame);
        Ok(())
    }

    /// `InFlight -> Free`: the transport reported `c` finished. Refused
    /// unless `c` names the frame in flight in its slot.
    pub fn complete(&mut self, c: &Completion) -> Result<Collected, RingError> {
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
            state => Err(RingError::Order {
                what: "completion",
                frame,
                slot,
                state,
            }),
        }
    }

    /// The value the *free* fence of `frame`'s slot reached when the
    /// consumer finished it, if `frame` is the last collected frame of a
    /// `Free` slot (it can be lent then: [`Slots::lend`]).
    pub fn lendable(&self, frame: u64) -> Option<(usize, u64)> {
        let slot = (frame % self.slots as u64) as usize;
        let free = self.state[slot] == SlotState::Free;
        (free && self.last_done[slot] == Some(frame)).then(|| (slot, frame / self.slots as u64 + 1))
    }

    /// `Free -> Lent`: collected frame `frame` is lent for reading; its
    /// slot's next ticket waits for [`Slots::give_back`]. Refused unless
    /// [`Slots::lendable`].
    pub fn lend(&mut self, frame: u64) -> Result<usize, RingError> {
        match self.lendable(frame) {
            Some((slot, _)) => {
                self.state[slot] = SlotState::Lent(frame);
                Ok(slot)
            }
            None => Err(RingError::Order {
                what: "lend",
                frame,
                slot: (frame % self.slots as u64) as usize,
                state: self.state((frame % self.slots as u64) as usize),
            }),
        }
    }

    /// `Lent -> Free`: the reader of lent frame `frame` is done with its
    /// bytes. Refused unless that frame is lent.
    pub fn give_back(&mut self, frame: u64) -> Result<(), RingError> {
        let slot = (frame % self.slots as u64) as usize;
        match self.state[slot] {
            SlotState::Lent(f) if f == frame => {
                self.state[slot] = SlotState::Free;
                Ok(())
            }
            state => Err(RingError::Order {
                what: "give-back",
                frame,
                slot,
                state: Some(state),
            }),
        }
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

    fn write(ring: &mut Slots) -> Ticket {
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
        let mut ring = Slots::new(2).unwrap();
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
        assert!(Slots::new(0).is_err());
        assert!(Slots::new(MAX_SLOTS + 1).is_err());
        assert_eq!(Slots::new(MAX_SLOTS).unwrap().slots(), MAX_SLOTS);
    }

    #[test]
    fn tickets_carry_the_deterministic_fence_values() {
        let mut ring = Slots::new(3).unwrap();
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
        let mut ring = Slots::new(2).unwrap();
        let t0 = ring.acquire().unwrap();
        assert_eq!(ring.state(0), Some(SlotState::Writing(0)));
        assert!(ring.submit(&t0).is_err(), "submit before release");
        ring.release(&t0, Instant::now(), 0).unwrap();
        assert!(
            ring.submit_early(&t0).is_err(),
            "early submit after release"
        );
        let mut ring = Slots::new(2).unwrap();
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
        let mut ring = Slots::new(2).unwrap();
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
    fn lend_holds_the_slot_until_given_back() {
        let mut ring = Slots::new(3).unwrap();
        let t0 = write(&mut ring);
        assert_eq!(ring.lendable(0), None, "in flight: not lendable");
        ring.complete(&done(&t0)).unwrap();
        assert_eq!(ring.lendable(0), Some((0, t0.free_signal())));
        assert_eq!(ring.lendable(3), None, "not produced yet");
        assert_eq!(ring.lendable(1), None, "never written");
        assert_eq!(ring.lend(0).unwrap(), 0);
        assert!(ring.lend(0).is_err(), "lent twice");
        let _t1 = write(&mut ring);
        let _t2 = write(&mut ring);
        // Frame 3 needs slot 0, which is lent.
        let e = ring.acquire().unwrap_err();
        assert!(
            matches!(
                e,
                RingError::Busy {
                    frame: 3,
                    slot: 0,
                    state: SlotState::Lent(0)
                }
            ),
            "{e}"
        );
        assert!(ring.give_back(1).is_err(), "frame 1 was not lent");
        ring.give_back(0).unwrap();
        assert!(ring.give_back(0).is_err(), "given back twice");
        let t3 = ring.acquire().unwrap();
        assert_eq!(
            t3.free_wait(),
            t0.free_signal(),
            "the next ticket waits for the value reached"
        );
        assert_eq!(ring.lendable(0), None, "slot 0 moved on");
    }

    /// A ticket given back unwritten comes out again, the same frame, slot
    /// and fence values, before any new frame; an early-queued one goes
    /// back to `Queued`.
    #[test]
    fn a_ticket_given_back_unwritten_is_handed_out_again() {
        let mut ring = Slots::new(2).unwrap();
        let t0 = ring.acquire().unwrap();
        let t1 = ring.acquire().unwrap();
        ring.submit_early(&t1).unwrap();
        ring.unwritten(&t0).unwrap();
        assert!(ring.unwritten(&t0).is_err(), "given back twice");
        assert_eq!(
            ring.state(0),
            Some(SlotState::Returned {
                frame: 0,
                queued: false
            })
        );
        ring.unwritten(&t1).unwrap();
        let again = ring.acquire().unwrap();
        assert_eq!(again, t0);
        assert_eq!(ring.state(0), Some(SlotState::Writing(0)));
        let again1 = ring.acquire().unwrap();
        assert_eq!(again1, t1);
        assert_eq!(ring.state(1), Some(SlotState::Queued(1)));
        assert_eq!(ring.next_frame(), 2, "no new frame was taken");
        assert!(ring.acquire().is_err(), "both slots are being written");
    }

    /// One move of a random run of the protocol.
    #[derive(Clone, Debug)]
    enum Move {
        Acquire,
        Unwritten(usize),
        Early(usize),
        Write(usize),
        Complete(usize),
        Lend,
        GiveBack,
    }

    fn moves() -> impl proptest::strategy::Strategy<Value = Move> {
        use proptest::prelude::*;
        prop_oneof![
            3 => Just(Move::Acquire),
            1 => (0..8usize).prop_map(Move::Unwritten),
            1 => (0..8usize).prop_map(Move::Early),
            3 => (0..8usize).prop_map(Move::Write),
            3 => (0..8usize).prop_map(Move::Complete),
            1 => Just(Move::Lend),
            1 => Just(Move::GiveBack),
        ]
    }

    /// The ticket of `frame` in a ring of `n`, by the protocol's formula.
    fn check_values(t: &Ticket, n: u64) {
        assert_eq!(t.slot() as u64, t.frame() % n);
        assert_eq!(t.free_wait(), t.frame() / n);
        assert_eq!(t.ready(), t.frame() / n + 1);
        assert_eq!(t.free_signal(), t.ready());
        assert_eq!(t.previous_frame(), t.frame().checked_sub(n));
    }

    /// One `Move::Acquire` of the property test: a ticket with its frame's
    /// values, never a written frame or a busy slot again, the oldest
    /// ticket given back first; or the refusal of a slot that is not free.
    fn acquire_checked(
        ring: &mut Slots,
        n64: u64,
        held: &mut Vec<(Ticket, bool)>,
        flying: &[Ticket],
        written: &std::collections::BTreeSet<u64>,
        returned: &mut Vec<u64>,
    ) {
        match ring.acquire() {
            Ok(t) => {
                check_values(&t, n64);
                assert!(!written.contains(&t.frame()), "frame {} again", t.frame());
                assert!(held.iter().all(|(h, _)| h.slot() != t.slot()));
                assert!(flying.iter().all(|f| f.slot() != t.slot()));
                let queued = match returned.iter().min().copied() {
                    Some(f) => {
                        assert_eq!(t.frame(), f, "the oldest given back first");
                        returned.retain(|&r| r != f);
                        ring.state(t.slot()) == Some(SlotState::Queued(f))
                    }
                    None => false,
                };
                held.push((t, queued));
            }
            Err(RingError::Busy { slot, state, .. }) => {
                assert!(returned.is_empty());
                assert_ne!(state, SlotState::Free);
                assert_eq!(ring.state(slot), Some(state));
            }
            Err(e) => panic!("{e}"),
        }
    }

    proptest::proptest! {
        /// Any run of moves keeps the protocol: every ticket has the
        /// deterministic fence values of its frame, a frame is written
        /// once, a slot holds one frame at a time, a ticket given back
        /// unwritten comes out again unchanged before any new frame, and
        /// the ring refuses exactly the moves out of order.
        #[test]
        fn any_run_keeps_the_protocol(n in 1usize..=4, run in proptest::collection::vec(moves(), 1..120)) {
            let mut ring = Slots::new(n).unwrap();
            let n64 = n as u64;
            // Tickets out for writing (with whether the consumer is queued),
            // frames in flight, frames written, tickets given back, lent.
            let mut held: Vec<(Ticket, bool)> = Vec::new();
            let mut flying: Vec<Ticket> = Vec::new();
            let mut written = std::collections::BTreeSet::new();
            let mut returned: Vec<u64> = Vec::new();
            let mut lent: Option<u64> = None;
            let mut last_done: Option<u64> = None;
            for m in run {
                match m {
                    Move::Acquire => acquire_checked(&mut ring, n64, &mut held, &flying, &written, &mut returned),
                    Move::Unwritten(i) if !held.is_empty() => {
                        let (t, _) = held.remove(i % held.len());
                        ring.unwritten(&t).unwrap();
                        returned.push(t.frame());
                    }
                    Move::Early(i) if !held.is_empty() => {
                        let k = i % held.len();
                        let r = ring.submit_early(&held[k].0);
                        assert_eq!(r.is_ok(), !held[k].1, "early submit once");
                        held[k].1 = true;
                    }
                    Move::Write(i) if !held.is_empty() => {
                        let (t, queued) = held.remove(i % held.len());
                        ring.release(&t, Instant::now(), 0).unwrap();
                        if !queued {
                            assert!(ring.submit_early(&t).is_err());
                            ring.submit(&t).unwrap();
                        } else {
                            assert!(ring.submit(&t).is_err(), "queued twice");
                        }
                        assert!(written.insert(t.frame()));
                        flying.push(t);
                    }
                    Move::Complete(i) if !flying.is_empty() => {
                        let t = flying.remove(i % flying.len());
                        let c = ring.complete(&done(&t)).unwrap();
                        assert_eq!(c.rec.frame, t.frame());
                        assert!(ring.complete(&done(&t)).is_err(), "collected twice");
                        last_done = Some(t.frame());
                    }
                    Move::Lend => {
                        if let (None, Some(f)) = (lent, last_done) {
                            let ok = ring.lendable(f).is_some();
                            assert_eq!(ring.lend(f).is_ok(), ok);
                            if ok {
                                lent = Some(f);
                            }
                        }
                    }
                    Move::GiveBack => {
                        if let Some(f) = lent.take() {
                            ring.give_back(f).unwrap();
                            assert!(ring.give_back(f).is_err());
                        }
                    }
                    _ => {}
                }
                assert_eq!(ring.in_flight(), flying.len());
            }
        }
    }
}
