//! The multicast ring's state machine: a pool of slots, one producer, up
//! to [`MAX_CONSUMERS`] consumers. Pure (no clock, no I/O), fixed capacity
//! (arrays of [`MAX_SLOTS`] x [`MAX_CONSUMERS`], no allocation); the
//! [`super::ring::MulticastRing`] makes the moves and does the waiting.
//!
//! # The pool
//!
//! The producer takes the *oldest free slot*: of the slots that no
//! consumer holds (attached or left) and that are not being written, the
//! one whose last frame is the oldest (never used first, lowest index
//! first). Frames are numbered 0, 1, 2, ... in hand-over order, whatever
//! slot they use.
//!
//! # The fence rule
//!
//! - Slot `s` has one *ready* fence, starting at 0. Its `u`-th use
//!   (`u` = 1, 2, ...) is written by the producer, which then signals
//!   *ready* = `u`. A [`FanoutTicket`] carries (slot, frame, use `u`).
//! - Consumer `c` has its own *release* fence per slot, starting at 0 (or
//!   where the consumer index's previous holder left it). A consumer that
//!   *took* use `u` of slot `s` (the frame was queued to it) waits for
//!   *ready* >= `u`, reads the slot, and signals its *release* fence of `s`
//!   to `u`. So one consumer's release values on one slot only grow, and
//!   each value it reaches is a use it took; values of uses it did not take
//!   are skipped.
//! - Before use `u + 1` of `s`, the producer waits, for each consumer `c`
//!   that took a use `v` of `s` and has not released it, for
//!   `release[c][s] >= v`. A consumer that did not take a use of `s` since
//!   its last release (a mailbox consumer whose queued frame was replaced,
//!   a consumer attached later, one that left and released) is not waited
//!   for: no value anyone waits for changes at an attach or a detach, and
//!   no fence is ever renumbered.
//! - A consumer attached while frame `f` is being written takes frames
//!   `> f` (the next frame handed over); attached while no frame is being
//!   written, it takes the next frame acquired.
//! - A consumer that leaves (detach, or disconnect at its time limit)
//!   takes no more frames; the frames waiting for it in the ring are
//!   dropped (it never took them; counted as [`ConsumerStats::dropped`]). Every use it took and has not released
//!   keeps its slot out of the pool (*retired*) until its release fence is
//!   seen at that use: a device may still be reading the slot, so it is not
//!   written before. A slot whose fence never comes stays out for the
//!   ring's life. Once a consumer that left holds nothing, it is forgotten
//!   and its index may be attached again.
//!
//! # Modes
//!
//! - FIFO: every frame handed over after its attach is taken, in order:
//!   queued to it at the hand-over while it has fewer than [`FIFO_DEPTH`]
//!   queued, else kept for it in the ring (holding the slot) and queued,
//!   oldest first, as its earlier frames are released.
//! - Mailbox: a frame is queued to it only when it holds no queued frame
//!   (it finished its previous one); otherwise the frame waits in its
//!   mailbox, replacing (and counting as *skipped*) a frame already
//!   waiting there, whose use is let go at once (nothing was queued).
//!
//! # Back-pressure, and why a mailbox consumer never stalls the producer
//!
//! With `U` usable slots (not retired) and `M` mailbox consumers attached,
//! FIFO consumers may hold at most `U - 2M - 1` slots when the producer
//! acquires: past that, [`Fanout::acquire`] asks to wait for the FIFO
//! consumer holding the oldest frame. A mailbox consumer holds at most two
//! slots (one queued, one waiting), so a free slot then always exists, and
//! the producer never waits for a mailbox consumer, provided
//! `U >= fifo_holds + 2M + 1` (`fifo_holds` = 1 with any FIFO consumer),
//! which [`Fanout::attach`] checks. Slots retired later can break it; the
//! producer then waits for whoever holds the oldest slot, counted as that
//! consumer's stall ([`ConsumerStats::stalls`]).

use super::{Mode, MulticastError, Queued, MAX_CONSUMERS};
use crate::slots::MAX_SLOTS;

/// How many frames a FIFO consumer has queued to it (taken) at once; later
/// frames wait for it in the ring, in order, holding their slots. A FIFO
/// consumer that dies retires at most this many slots (those it may be
/// reading); the frames waiting in the ring are dropped, not retired.
pub const FIFO_DEPTH: usize = 2;

/// One frame's slot as the state machine handed it out: the slot, the
/// frame, and the slot's use (the *ready* value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FanoutTicket {
    slot: usize,
    frame: u64,
    use_: u64,
}

impl FanoutTicket {
    /// The slot.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The frame.
    pub fn frame(&self) -> u64 {
        self.frame
    }

    /// The slot's use this frame is: the *ready* value the producer signals
    /// and the *release* value each consumer that takes it signals.
    pub fn use_(&self) -> u64 {
        self.use_
    }
}

/// Why the producer has to wait before it may take a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitReason {
    /// The FIFO consumers hold as many slots as they may (back-pressure).
    FifoWindow,
    /// No slot is free (retired slots broke the attach check).
    NoFreeSlot,
}

/// A release the producer must wait for: consumer `consumer`'s release
/// fence of `slot` reaching `use_` (frame `frame`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocker {
    /// The consumer's index.
    pub consumer: usize,
    /// The slot.
    pub slot: usize,
    /// The use it took.
    pub use_: u64,
    /// That use's frame.
    pub frame: u64,
    /// Why.
    pub reason: WaitReason,
}

/// What [`Fanout::acquire`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// Write this slot.
    Ticket(FanoutTicket),
    /// Wait for this release first (counted as the consumer's stall), then
    /// ask again.
    Wait(Blocker),
}

/// Whether a consumer takes frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// It takes frames.
    Attached,
    /// It left (detached or disconnected) and still holds uses it took.
    Left,
}

/// One consumer's counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumerStats {
    /// FIFO or mailbox.
    pub mode: Mode,
    /// The first frame it takes (frames before are not its).
    pub first_frame: u64,
    /// The last frame it took, if any.
    pub last_frame: Option<u64>,
    /// Frames it took (queued to it).
    pub taken: u64,
    /// Of those, frames whose release was seen.
    pub released: u64,
    /// Frames that waited in its mailbox and were replaced by a newer one.
    pub skipped: u64,
    /// Frames waiting for it in the ring (not taken) when it left: dropped.
    pub dropped: u64,
    /// Times the producer had to wait for it.
    pub stalls: u64,
}

/// A use a consumer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hold {
    use_: u64,
    frame: u64,
    /// Queued to it (taken); a mailbox frame waiting in the ring is not.
    taken: bool,
}

#[derive(Clone, Copy, Debug)]
struct Consumer {
    standing: Standing,
    holds: [Option<Hold>; MAX_SLOTS],
    released: [u64; MAX_SLOTS],
    stats: ConsumerStats,
}

impl Consumer {
    /// The slot of its oldest frame waiting in the ring (held, not taken).
    fn waiting_slot(&self) -> Option<usize> {
        (0..MAX_SLOTS)
            .filter(|&s| matches!(self.holds[s], Some(h) if !h.taken))
            .min_by_key(|&s| self.holds[s].map_or(u64::MAX, |h| h.frame))
    }

    fn waiting_count(&self) -> usize {
        self.holds.iter().flatten().filter(|h| !h.taken).count()
    }

    /// How many frames it may have queued at once.
    fn depth(&self) -> usize {
        match self.stats.mode {
            Mode::Fifo => FIFO_DEPTH,
            Mode::Mailbox => 1,
        }
    }

    fn taken_count(&self) -> usize {
        self.holds.iter().flatten().filter(|h| h.taken).count()
    }
}

/// The frames a hand-over queues and skips, per consumer index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deliveries {
    queued: [Option<Queued>; MAX_CONSUMERS],
    skipped: [Option<Queued>; MAX_CONSUMERS],
}

impl Deliveries {
    /// (consumer index, frame to queue to it now).
    pub fn queued(&self) -> impl Iterator<Item = (usize, Queued)> + '_ {
        (0..MAX_CONSUMERS).filter_map(|c| self.queued[c].map(|q| (c, q)))
    }

    /// (mailbox consumer index, the frame it skipped).
    pub fn skipped(&self) -> impl Iterator<Item = (usize, Queued)> + '_ {
        (0..MAX_CONSUMERS).filter_map(|c| self.skipped[c].map(|q| (c, q)))
    }
}

/// What a release seen by [`Fanout::observe`] changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// The use released now (`None`: the value was already known).
    pub released: Option<Queued>,
    /// A mailbox frame to queue to the consumer now.
    pub next: Option<Queued>,
    /// The slot was retired and is back in the pool.
    pub restored: bool,
}

/// The state machine (see the module docs).
#[derive(Clone, Debug)]
pub struct Fanout {
    slots: usize,
    uses: [u64; MAX_SLOTS],
    /// Per slot, 1 + its last frame (0: never used): the oldest free first.
    stamp: [u64; MAX_SLOTS],
    consumers: [Option<Consumer>; MAX_CONSUMERS],
    next_frame: u64,
    writing: Option<FanoutTicket>,
}

impl Fanout {
    /// A pool of `slots` slots (`1..=MAX_SLOTS`), no consumer.
    ///
    /// # Errors
    /// [`MulticastError::Size`] outside that range.
    pub fn new(slots: usize) -> Result<Fanout, MulticastError> {
        if !(1..=MAX_SLOTS).contains(&slots) {
            return Err(MulticastError::Size { slots });
        }
        Ok(Fanout {
            slots,
            uses: [0; MAX_SLOTS],
            stamp: [0; MAX_SLOTS],
            consumers: [None; MAX_CONSUMERS],
            next_frame: 0,
            writing: None,
        })
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The frame the next hand-over is.
    pub fn next_frame(&self) -> u64 {
        self.next_frame
    }

    /// The ticket being written, if a slot is out.
    pub fn writing(&self) -> Option<FanoutTicket> {
        self.writing
    }

    /// Slot `slot`'s *ready* value so far (its last use).
    pub fn ready(&self, slot: usize) -> Option<u64> {
        self.uses.get(slot).copied().filter(|_| slot < self.slots)
    }

    fn consumer(&self, c: usize) -> Result<&Consumer, MulticastError> {
        self.consumers
            .get(c)
            .and_then(Option::as_ref)
            .ok_or_else(|| MulticastError::order(format!("consumer index {c} is not in the ring")))
    }

    fn consumer_mut(&mut self, c: usize) -> Result<&mut Consumer, MulticastError> {
        self.consumers
            .get_mut(c)
            .and_then(Option::as_mut)
            .ok_or_else(|| MulticastError::order(format!("consumer index {c} is not in the ring")))
    }

    /// Consumer `c`'s counts (`None`: no consumer there).
    pub fn stats(&self, c: usize) -> Option<ConsumerStats> {
        self.consumer(c).ok().map(|k| k.stats)
    }

    /// Whether consumer `c` takes frames or left (`None`: no consumer).
    pub fn standing(&self, c: usize) -> Option<Standing> {
        self.consumer(c).ok().map(|k| k.standing)
    }

    /// Consumer `c`'s release value of `slot` as last seen.
    pub fn released(&self, c: usize, slot: usize) -> Option<u64> {
        let k = self.consumer(c).ok()?;
        k.released.get(slot).copied().filter(|_| slot < self.slots)
    }

    /// The use of `slot` consumer `c` holds (taken or waiting in its
    /// mailbox), if any: (use, frame, taken).
    pub fn holds(&self, c: usize, slot: usize) -> Option<(u64, u64, bool)> {
        let h = self.consumer(c).ok()?.holds.get(slot).copied().flatten()?;
        Some((h.use_, h.frame, h.taken))
    }

    /// The uses consumer `c` took and has not released, oldest frame first
    /// (at most [`MAX_SLOTS`]).
    pub fn taken(&self, c: usize) -> impl Iterator<Item = Queued> {
        let mut out = [None; MAX_SLOTS];
        if let Ok(k) = self.consumer(c) {
            for (s, h) in k.holds.iter().enumerate() {
                if let Some(h) = h.filter(|h| h.taken) {
                    out[s] = Some(Queued {
                        frame: h.frame,
                        slot: s,
                        use_: h.use_,
                    });
                }
            }
        }
        out.sort_by_key(|q| q.map_or(u64::MAX, |q| q.frame));
        out.into_iter().flatten()
    }

    /// Whether a consumer that left still holds `slot` (it is out of the
    /// pool until that consumer's release is seen).
    pub fn retired(&self, slot: usize) -> bool {
        self.consumers
            .iter()
            .flatten()
            .any(|k| k.standing == Standing::Left && k.holds.get(slot).copied().flatten().is_some())
    }

    /// How many slots are retired.
    pub fn retired_count(&self) -> usize {
        (0..self.slots).filter(|&s| self.retired(s)).count()
    }

    /// Whether no consumer holds `slot` and it is not being written.
    pub fn is_free(&self, slot: usize) -> bool {
        slot < self.slots
            && self.writing.is_none_or(|t| t.slot != slot)
            && self
                .consumers
                .iter()
                .flatten()
                .all(|k| k.holds[slot].is_none())
    }

    fn attached(&self, mode: Mode) -> usize {
        self.consumers
            .iter()
            .flatten()
            .filter(|k| k.standing == Standing::Attached && k.stats.mode == mode)
            .count()
    }

    /// The frame a consumer attached now takes first.
    pub fn attach_frame(&self) -> u64 {
        self.next_frame + u64::from(self.writing.is_some())
    }
}

/// The moves.
impl Fanout {
    /// Attaches a consumer of `mode` at a free index; it takes frames from
    /// [`Fanout::attach_frame`] on. `released` is its release fence of each
    /// slot as the transport has it (`0` for a fresh consumer; missing
    /// slots read 0). Returns (index, first frame).
    ///
    /// # Errors
    /// [`MulticastError::Full`] with no free index;
    /// [`MulticastError::Capacity`] where the usable slots cannot keep the
    /// mailbox promise (module docs).
    pub fn attach(&mut self, mode: Mode, released: &[u64]) -> Result<(usize, u64), MulticastError> {
        let index = self
            .consumers
            .iter()
            .position(Option::is_none)
            .ok_or(MulticastError::Full)?;
        let fifo = self.attached(Mode::Fifo) + usize::from(mode == Mode::Fifo);
        let mailboxes = self.attached(Mode::Mailbox) + usize::from(mode == Mode::Mailbox);
        let usable = self.slots - self.retired_count();
        let fifo_holds = usize::from(fifo > 0);
        if usable < fifo_holds + 2 * mailboxes + 1 {
            return Err(MulticastError::Capacity {
                slots: usable,
                fifo_holds,
                mailboxes,
            });
        }
        let mut fences = [0; MAX_SLOTS];
        for (f, r) in fences.iter_mut().zip(released) {
            *f = *r;
        }
        let first_frame = self.attach_frame();
        self.consumers[index] = Some(Consumer {
            standing: Standing::Attached,
            holds: [None; MAX_SLOTS],
            released: fences,
            stats: ConsumerStats {
                mode,
                first_frame,
                last_frame: None,
                taken: 0,
                released: 0,
                skipped: 0,
                dropped: 0,
                stalls: 0,
            },
        });
        Ok((index, first_frame))
    }

    /// Consumer `c` leaves (detach or disconnect): it takes no more
    /// frames, the frames waiting for it in the ring are dropped (not
    /// taken; counted as dropped, not skipped), and the uses it took retire
    /// their slots until their release is seen. Returns the last frame it
    /// took.
    ///
    /// # Errors
    /// [`MulticastError::Order`] for no consumer at `c`, or one that left.
    pub fn leave(&mut self, c: usize) -> Result<Option<u64>, MulticastError> {
        let k = self.consumer_mut(c)?;
        if k.standing == Standing::Left {
            return Err(MulticastError::order(format!(
                "consumer index {c} already left"
            )));
        }
        k.standing = Standing::Left;
        while let Some(s) = k.waiting_slot() {
            k.holds[s] = None;
            k.stats.dropped += 1;
        }
        Ok(k.stats.last_frame)
    }

    /// Forgets consumer `c`, which left and holds nothing: its index may be
    /// attached again. Returns its final counts.
    ///
    /// # Errors
    /// [`MulticastError::Order`] while it is attached or holds a use.
    pub fn forget(&mut self, c: usize) -> Result<ConsumerStats, MulticastError> {
        let k = self.consumer(c)?;
        if k.standing != Standing::Left || k.holds.iter().any(Option::is_some) {
            return Err(MulticastError::order(format!(
                "consumer index {c} is forgotten only once it left and released every use it took"
            )));
        }
        let stats = k.stats;
        self.consumers[c] = None;
        Ok(stats)
    }

    /// The next slot for the producer, or the release to wait for first
    /// (counted as that consumer's stall; see the module docs).
    ///
    /// # Errors
    /// [`MulticastError::Order`] while a slot is being written;
    /// [`MulticastError::AllRetired`] when nothing free is left and no
    /// attached consumer holds a slot.
    pub fn acquire(&mut self) -> Result<Acquire, MulticastError> {
        if let Some(t) = self.writing {
            return Err(MulticastError::order(format!(
                "frame {} is being written in slot {}: hand it over (or drop its lease) first",
                t.frame, t.slot
            )));
        }
        let usable = self.slots - self.retired_count();
        let cap = usable.saturating_sub(2 * self.attached(Mode::Mailbox) + 1);
        let fifo_held = (0..self.slots).filter(|&s| self.held_by_fifo(s)).count();
        let blocker = if fifo_held > cap {
            self.oldest_hold(|k| k.stats.mode == Mode::Fifo)
                .map(|b| (b, WaitReason::FifoWindow))
        } else {
            None
        };
        let blocker = match (blocker, self.oldest_free()) {
            (Some(b), _) => b,
            (None, Some(slot)) => return Ok(Acquire::Ticket(self.take(slot))),
            (None, None) => match self.oldest_hold(|_| true) {
                Some(b) => (b, WaitReason::NoFreeSlot),
                None => {
                    return Err(MulticastError::AllRetired {
                        retired: self.retired_count(),
                    })
                }
            },
        };
        let ((consumer, slot, hold), reason) = blocker;
        if let Some(k) = self.consumers[consumer].as_mut() {
            k.stats.stalls += 1;
        }
        Ok(Acquire::Wait(Blocker {
            consumer,
            slot,
            use_: hold.use_,
            frame: hold.frame,
            reason,
        }))
    }

    /// Whether an attached FIFO consumer holds `slot`, which is not
    /// retired (a retired slot is out of the usable ones already).
    fn held_by_fifo(&self, slot: usize) -> bool {
        !self.retired(slot)
            && self.consumers.iter().flatten().any(|k| {
                k.standing == Standing::Attached
                    && k.stats.mode == Mode::Fifo
                    && k.holds[slot].is_some()
            })
    }

    /// The attached consumer (of those `pick` accepts) holding the oldest
    /// taken use: (index, slot, hold). A use of a retired slot counts: its
    /// release lets the consumer's later frames on.
    fn oldest_hold(&self, pick: impl Fn(&Consumer) -> bool) -> Option<(usize, usize, Hold)> {
        let mut best: Option<(usize, usize, Hold)> = None;
        for (c, k) in self.consumers.iter().enumerate() {
            let Some(k) = k
                .as_ref()
                .filter(|k| k.standing == Standing::Attached && pick(k))
            else {
                continue;
            };
            for (s, h) in k.holds[..self.slots].iter().enumerate() {
                if let Some(h) = h.filter(|h| h.taken) {
                    if best.is_none_or(|(_, _, b)| h.frame < b.frame) {
                        best = Some((c, s, h));
                    }
                }
            }
        }
        best
    }

    fn oldest_free(&self) -> Option<usize> {
        (0..self.slots)
            .filter(|&s| self.is_free(s))
            .min_by_key(|&s| (self.stamp[s], s))
    }

    fn take(&mut self, slot: usize) -> FanoutTicket {
        let t = FanoutTicket {
            slot,
            frame: self.next_frame,
            use_: self.uses[slot] + 1,
        };
        self.writing = Some(t);
        t
    }

    /// The slot of `t` comes back unwritten: nothing was signalled, and the
    /// next [`Fanout::acquire`] hands the same frame out again.
    ///
    /// # Errors
    /// [`MulticastError::Order`] when `t` is not the ticket being written.
    pub fn put_back(&mut self, t: FanoutTicket) -> Result<(), MulticastError> {
        self.check_writing(t, "put back")?;
        self.writing = None;
        Ok(())
    }

    fn check_writing(&self, t: FanoutTicket, what: &str) -> Result<(), MulticastError> {
        if self.writing != Some(t) {
            return Err(MulticastError::order(format!(
                "{what} of frame {} in slot {} (use {}), which is not the slot being written ({:?})",
                t.frame, t.slot, t.use_, self.writing
            )));
        }
        Ok(())
    }
}

/// The hand-over and the releases.
impl Fanout {
    /// Frame `t` is written and its *ready* fence signalled: every attached
    /// consumer whose first frame is at most `t`'s holds it. It is queued
    /// now where the consumer has room ([`FIFO_DEPTH`] frames for FIFO, one
    /// for a mailbox) and nothing waits before it; else it waits in the
    /// ring (a mailbox's replaces, and skips, one waiting there).
    ///
    /// # Errors
    /// [`MulticastError::Order`] when `t` is not the ticket being written.
    pub fn hand_over(&mut self, t: FanoutTicket) -> Result<Deliveries, MulticastError> {
        self.check_writing(t, "hand-over")?;
        self.writing = None;
        self.uses[t.slot] = t.use_;
        self.stamp[t.slot] = t.frame + 1;
        self.next_frame = t.frame + 1;
        let q = Queued {
            frame: t.frame,
            slot: t.slot,
            use_: t.use_,
        };
        let mut out = Deliveries::default();
        for (c, k) in self.consumers.iter_mut().enumerate() {
            let Some(k) = k
                .as_mut()
                .filter(|k| k.standing == Standing::Attached && k.stats.first_frame <= t.frame)
            else {
                continue;
            };
            let queue_now = k.taken_count() < k.depth() && k.waiting_count() == 0;
            if !queue_now && k.stats.mode == Mode::Mailbox {
                if let Some(old) = k.waiting_slot() {
                    out.skipped[c] = k.holds[old].map(|h| Queued {
                        frame: h.frame,
                        slot: old,
                        use_: h.use_,
                    });
                    k.holds[old] = None;
                    k.stats.skipped += 1;
                }
            }
            k.holds[t.slot] = Some(Hold {
                use_: t.use_,
                frame: t.frame,
                taken: queue_now,
            });
            if queue_now {
                k.stats.taken += 1;
                k.stats.last_frame = Some(t.frame);
                out.queued[c] = Some(q);
            }
        }
        Ok(out)
    }

    /// Consumer `c`'s release fence of `slot` is seen at `value`. A value
    /// it already had changes nothing; a new one must be the use of `slot`
    /// it took and holds, which is then released (and the oldest frame
    /// waiting for the consumer in the ring is queued now).
    ///
    /// # Errors
    /// [`MulticastError::Fence`] for a value that went back or is no use it
    /// took (nothing changes); [`MulticastError::Order`] for no consumer at
    /// `c` or a slot past the ring.
    pub fn observe(
        &mut self,
        c: usize,
        slot: usize,
        value: u64,
    ) -> Result<Observed, MulticastError> {
        if slot >= self.slots {
            return Err(MulticastError::order(format!(
                "release of slot {slot}, which the ring does not have"
            )));
        }
        let was_retired = self.retired(slot);
        let k = self.consumer_mut(c)?;
        let seen = k.released[slot];
        if value == seen {
            return Ok(Observed::default());
        }
        let hold = k.holds[slot].filter(|h| h.taken);
        let Some(hold) = hold.filter(|h| value > seen && h.use_ == value) else {
            return Err(MulticastError::Fence {
                consumer: c,
                slot,
                value,
                expected: match hold {
                    Some(h) => format!("{seen} (last seen) or {} (the use it took)", h.use_).into(),
                    None => format!("{seen} (last seen; it holds no use of the slot)").into(),
                },
            });
        };
        k.released[slot] = value;
        k.holds[slot] = None;
        k.stats.released += 1;
        let mut next = None;
        if k.standing == Standing::Attached && k.taken_count() < k.depth() {
            if let Some(s) = k.waiting_slot() {
                if let Some(h) = k.holds[s].as_mut() {
                    h.taken = true;
                    k.stats.taken += 1;
                    k.stats.last_frame = Some(h.frame);
                    next = Some(Queued {
                        frame: h.frame,
                        slot: s,
                        use_: h.use_,
                    });
                }
            }
        }
        Ok(Observed {
            released: Some(Queued {
                frame: hold.frame,
                slot,
                use_: value,
            }),
            next,
            restored: was_retired && !self.retired(slot),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    fn ticket(f: &mut Fanout) -> FanoutTicket {
        match f.acquire() {
            Ok(Acquire::Ticket(t)) => t,
            other => panic!("expected a ticket, got {other:?}"),
        }
    }

    #[test]
    fn sizes_outside_the_pool_are_refused() {
        assert!(matches!(
            Fanout::new(0),
            Err(MulticastError::Size { slots: 0 })
        ));
        assert!(Fanout::new(MAX_SLOTS + 1).is_err());
        assert!(Fanout::new(MAX_SLOTS).is_ok());
    }

    #[test]
    fn fifo_takes_every_frame_and_back_pressures() {
        let mut f = Fanout::new(3).unwrap();
        let (c, first) = f.attach(Mode::Fifo, &[]).unwrap();
        assert_eq!(first, 0);
        let mut queued = Vec::new();
        for _ in 0..3 {
            let t = ticket(&mut f);
            queued.extend(f.hand_over(t).unwrap().queued());
        }
        // Three slots held, window 3 - 0 - 1 = 2: wait for frame 0.
        let Ok(Acquire::Wait(b)) = f.acquire() else {
            panic!("expected a wait")
        };
        assert_eq!(
            (b.consumer, b.frame, b.use_, b.reason),
            (c, 0, 1, WaitReason::FifoWindow)
        );
        assert_eq!(f.stats(c).unwrap().stalls, 1);
        // FIFO_DEPTH frames are queued; frame 2 waits in the ring.
        let frames: Vec<u64> = queued.iter().map(|(_, q)| q.frame).collect();
        assert_eq!(frames, [0, 1]);
        assert_eq!(f.holds(c, 2), Some((1, 2, false)));
        let o = f.observe(c, b.slot, 1).unwrap();
        assert_eq!(o.released.unwrap().frame, 0);
        assert_eq!(o.next.unwrap().frame, 2, "the waiting frame is queued now");
        let t = ticket(&mut f);
        assert_eq!((t.slot(), t.frame(), t.use_()), (b.slot, 3, 2));
    }

    #[test]
    fn the_oldest_free_slot_is_taken_not_frame_mod_slots() {
        let mut f = Fanout::new(4).unwrap();
        let (c, _) = f.attach(Mode::Fifo, &[]).unwrap();
        let mut q = VecDeque::new();
        for _ in 0..3 {
            let t = ticket(&mut f);
            q.extend(f.hand_over(t).unwrap().queued().map(|(_, q)| q));
        }
        // Frame 1 (slot 1) finishes first, out of order for the pool.
        let one = q.remove(1).unwrap();
        f.observe(c, one.slot, one.use_).unwrap();
        let t = ticket(&mut f);
        assert_eq!(t.slot(), 3, "never-used slot 3 is the oldest free");
        f.hand_over(t).unwrap();
        let t = ticket(&mut f);
        assert_eq!((t.slot(), t.use_()), (1, 2));
    }

    #[test]
    fn a_mailbox_replaces_its_waiting_frame_and_counts_the_skip() {
        let mut f = Fanout::new(4).unwrap();
        let (m, _) = f.attach(Mode::Mailbox, &[]).unwrap();
        let t0 = ticket(&mut f);
        let d = f.hand_over(t0).unwrap();
        assert_eq!(d.queued().count(), 1);
        for _ in 0..3 {
            let t = ticket(&mut f);
            let d = f.hand_over(t).unwrap();
            assert_eq!(d.queued().count(), 0);
        }
        let s = f.stats(m).unwrap();
        assert_eq!((s.taken, s.skipped, s.stalls), (1, 2, 0));
        let o = f.observe(m, t0.slot(), t0.use_()).unwrap();
        assert_eq!(o.next.unwrap().frame, 3, "the newest frame is queued next");
    }

    #[test]
    fn a_late_consumer_takes_the_next_frame_handed_over() {
        let mut f = Fanout::new(4).unwrap();
        f.attach(Mode::Fifo, &[]).unwrap();
        let t = ticket(&mut f);
        let (late, first) = f.attach(Mode::Fifo, &[]).unwrap();
        assert_eq!(first, 1, "frame 0 is being written");
        let d = f.hand_over(t).unwrap();
        assert!(d.queued().all(|(c, _)| c != late));
        let t = ticket(&mut f);
        let d = f.hand_over(t).unwrap();
        assert!(d.queued().any(|(c, q)| c == late && q.frame == 1));
    }

    #[test]
    fn a_consumer_that_left_retires_its_slot_until_its_fence_comes() {
        let mut f = Fanout::new(3).unwrap();
        let (a, _) = f.attach(Mode::Fifo, &[]).unwrap();
        let (b, _) = f.attach(Mode::Fifo, &[]).unwrap();
        let t = ticket(&mut f);
        f.hand_over(t).unwrap();
        f.observe(a, t.slot(), t.use_()).unwrap();
        assert_eq!(f.leave(b).unwrap(), Some(0));
        assert!(f.retired(t.slot()));
        assert!(f.forget(b).is_err(), "it still holds frame 0");
        for _ in 0..4 {
            let u = ticket(&mut f);
            assert_ne!(u.slot(), t.slot());
            f.hand_over(u).unwrap();
            f.observe(a, u.slot(), u.use_()).unwrap();
        }
        assert!(
            f.observe(b, t.slot(), t.use_() + 1).is_err(),
            "not a use it took"
        );
        assert!(f.observe(b, t.slot(), t.use_()).unwrap().restored);
        f.forget(b).unwrap();
        assert!(f.attach(Mode::Fifo, &[]).is_ok());
    }

    #[test]
    fn attach_keeps_room_for_the_mailboxes() {
        let mut f = Fanout::new(4).unwrap();
        f.attach(Mode::Fifo, &[]).unwrap();
        assert!(f.attach(Mode::Mailbox, &[]).is_ok());
        assert!(matches!(
            f.attach(Mode::Mailbox, &[]),
            Err(MulticastError::Capacity {
                slots: 4,
                fifo_holds: 1,
                mailboxes: 2
            })
        ));
        let mut g = Fanout::new(MAX_SLOTS).unwrap();
        for _ in 0..MAX_CONSUMERS {
            g.attach(Mode::Fifo, &[]).unwrap();
        }
        assert!(matches!(
            g.attach(Mode::Fifo, &[]),
            Err(MulticastError::Full)
        ));
    }

    #[test]
    fn moves_out_of_order_are_refused() {
        let mut f = Fanout::new(2).unwrap();
        let t = ticket(&mut f);
        assert!(f.acquire().is_err(), "one lease at a time");
        f.put_back(t).unwrap();
        assert!(f.hand_over(t).is_err(), "put back, not being written");
        assert_eq!(ticket(&mut f), t, "the same frame again");
        assert!(f.observe(0, 0, 1).is_err(), "no consumer");
        assert!(f.leave(5).is_err());
    }

    /// A move of the property test (indices pick among the consumers in
    /// the ring, modulo their number).
    #[derive(Clone, Debug)]
    enum Op {
        Attach(Mode),
        Leave(usize),
        /// Leave stuck: its fences come only with a later `Recover`.
        Timeout(usize),
        Recover(usize),
        /// The producer writes a frame (`true`) or drops its lease, and a
        /// consumer may attach while it writes.
        Produce(bool, Option<Mode>),
        Finish(usize),
        Bogus(usize, usize, u64),
    }

    fn ops() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            1 => prop_oneof![Just(Mode::Fifo), Just(Mode::Mailbox)].prop_map(Op::Attach),
            1 => (0usize..8).prop_map(Op::Leave),
            1 => (0usize..8).prop_map(Op::Timeout),
            1 => (0usize..8).prop_map(Op::Recover),
            8 => Just(Op::Produce(true, None)),
            1 => Just(Op::Produce(false, None)),
            1 => prop_oneof![Just(Mode::Fifo), Just(Mode::Mailbox)]
                .prop_map(|m| Op::Produce(true, Some(m))),
            6 => (0usize..8).prop_map(Op::Finish),
            1 => (0usize..8, 0usize..8, 0u64..40).prop_map(|(c, s, v)| Op::Bogus(c, s, v)),
        ]
    }

    /// What the test remembers of a consumer (its transport queue and
    /// what it was given).
    #[derive(Default)]
    struct Seen {
        queue: VecDeque<Queued>,
        got: Vec<u64>,
        offered: u64,
        stuck: bool,
        left: bool,
        took: Vec<(usize, u64)>,
    }

    struct Model {
        f: Fanout,
        seen: [Option<Seen>; MAX_CONSUMERS],
        uses: [u64; MAX_SLOTS],
    }

    impl Model {
        fn present(&self, k: usize) -> Option<usize> {
            let ids: Vec<usize> = (0..MAX_CONSUMERS)
                .filter(|&c| self.seen[c].is_some())
                .collect();
            (!ids.is_empty()).then(|| ids[k % ids.len()])
        }

        fn push(&mut self, c: usize, q: Queued) {
            let s = self.seen[c].as_mut().unwrap();
            if let Some(&last) = s.got.last() {
                assert!(
                    q.frame > last,
                    "consumer {c} got frame {} after {last}",
                    q.frame
                );
            }
            s.got.push(q.frame);
            s.took.push((q.slot, q.use_));
            s.queue.push_back(q);
        }

        fn finish(&mut self, c: usize) {
            let Some(q) = self.seen[c].as_mut().unwrap().queue.pop_front() else {
                return;
            };
            let before = self.f.released(c, q.slot).unwrap();
            let o = self.f.observe(c, q.slot, q.use_).unwrap();
            assert!(
                q.use_ > before,
                "release of slot {} went from {before} to {}",
                q.slot,
                q.use_
            );
            assert_eq!(o.released, Some(q));
            assert_eq!(self.f.released(c, q.slot), Some(q.use_));
            if let Some(n) = o.next {
                self.push(c, n);
            }
            self.maybe_forget(c);
        }

        fn maybe_forget(&mut self, c: usize) {
            let s = self.seen[c].as_ref().unwrap();
            if s.left && s.queue.is_empty() {
                let stats = self.f.forget(c).unwrap();
                self.check_counts(c, &stats);
                self.seen[c] = None;
            }
        }

        fn check_counts(&self, c: usize, st: &ConsumerStats) {
            let s = self.seen[c].as_ref().unwrap();
            assert_eq!(st.taken, s.got.len() as u64);
            let waiting = self.f.consumer(c).ok().map_or(0, Consumer::waiting_count) as u64;
            match st.mode {
                Mode::Fifo => {
                    let n = s.offered - st.dropped - waiting;
                    let want: Vec<u64> = (st.first_frame..st.first_frame + n).collect();
                    assert_eq!(s.got, want, "FIFO consumer {c} misses frames");
                    assert_eq!(st.skipped, 0);
                    assert!(s.queue.len() <= FIFO_DEPTH);
                }
                Mode::Mailbox => assert_eq!(
                    s.offered,
                    st.taken + st.skipped + waiting + st.dropped,
                    "mailbox {c}'s counts do not add up"
                ),
            }
        }
    }

    impl Model {
        fn attach(&mut self, mode: Mode, writing: Option<FanoutTicket>) {
            let Ok((c, first)) = self.f.attach(mode, &[]) else {
                return;
            };
            assert_eq!(first, writing.map_or(self.f.next_frame(), |t| t.frame + 1));
            self.seen[c] = Some(Seen::default());
        }

        fn ticket(&mut self) -> Option<FanoutTicket> {
            for _ in 0..4 * MAX_SLOTS * MAX_CONSUMERS {
                let b = match self.f.acquire() {
                    Ok(Acquire::Ticket(t)) => return Some(t),
                    Ok(Acquire::Wait(b)) => b,
                    Err(MulticastError::AllRetired { .. }) => {
                        assert!((0..self.f.slots()).all(|s| !self.f.is_free(s)));
                        let attached_hold = (0..MAX_CONSUMERS).any(|c| {
                            self.f.standing(c) == Some(Standing::Attached)
                                && self.f.taken(c).next().is_some()
                        });
                        assert!(
                            !attached_hold,
                            "AllRetired while an attached consumer holds a use"
                        );
                        return None;
                    }
                    Err(e) => panic!("{e}"),
                };
                let mode = self.f.stats(b.consumer).unwrap().mode;
                if self.f.retired_count() == 0 {
                    assert_eq!(mode, Mode::Fifo, "the producer waited for a mailbox: {b:?}");
                }
                assert_eq!(
                    self.f.holds(b.consumer, b.slot),
                    Some((b.use_, b.frame, true))
                );
                self.finish(b.consumer);
            }
            panic!("the producer waited forever")
        }

        fn produce(&mut self, write: bool, attach: Option<Mode>) {
            let Some(t) = self.ticket() else { return };
            assert_eq!(t.use_, self.uses[t.slot] + 1, "slot {}'s use count", t.slot);
            assert!(!self.f.retired(t.slot));
            for (c, s) in self.seen.iter().enumerate() {
                let Some(s) = s else { continue };
                assert_eq!(
                    self.f.holds(c, t.slot),
                    None,
                    "slot {} is held by {c}",
                    t.slot
                );
                assert!(
                    s.queue.iter().all(|q| q.slot != t.slot),
                    "{c} still reads it"
                );
            }
            if let Some(mode) = attach {
                self.attach(mode, Some(t));
            }
            if !write {
                return self.f.put_back(t).unwrap();
            }
            let d = self.f.hand_over(t).unwrap();
            self.uses[t.slot] = t.use_;
            assert_eq!(self.f.ready(t.slot), Some(t.use_));
            for c in 0..MAX_CONSUMERS {
                let Some(st) = self.f.stats(c) else { continue };
                if self.f.standing(c) == Some(Standing::Attached) && st.first_frame <= t.frame {
                    self.seen[c].as_mut().unwrap().offered += 1;
                }
            }
            for (c, _) in d.skipped() {
                assert_eq!(self.f.stats(c).unwrap().mode, Mode::Mailbox);
            }
            for (c, q) in d.queued() {
                self.push(c, q);
            }
        }

        fn leave(&mut self, k: usize, stuck: bool) {
            let Some(c) = self.present(k) else { return };
            if self.seen[c].as_ref().unwrap().left {
                return;
            }
            let waiting = self.f.consumer(c).unwrap().waiting_count() as u64;
            self.f.leave(c).unwrap();
            assert_eq!(self.f.stats(c).unwrap().dropped, waiting);
            let s = self.seen[c].as_mut().unwrap();
            (s.left, s.stuck) = (true, stuck);
            for q in &s.queue {
                assert!(self.f.retired(q.slot), "slot {} is not retired", q.slot);
            }
            self.maybe_forget(c);
        }

        fn bogus(&mut self, k: usize, slot: usize, value: u64) {
            let Some(c) = self.present(k) else { return };
            let seen = self.f.released(c, slot);
            let held = self.f.holds(c, slot);
            if seen.is_none() || seen == Some(value) || held == Some((value, 0, true)) {
                return;
            }
            if matches!(held, Some((u, _, true)) if u == value) {
                return;
            }
            let before = format!("{:?}", self.f);
            assert!(self.f.observe(c, slot, value).is_err());
            assert_eq!(
                before,
                format!("{:?}", self.f),
                "a refused release changed the state"
            );
        }

        fn step(&mut self, op: Op) {
            match op {
                Op::Attach(mode) => self.attach(mode, None),
                Op::Leave(k) => self.leave(k, false),
                Op::Timeout(k) => self.leave(k, true),
                Op::Recover(k) => {
                    if let Some(c) = self.present(k) {
                        self.seen[c].as_mut().unwrap().stuck = false;
                    }
                }
                Op::Produce(write, attach) => self.produce(write, attach),
                Op::Finish(k) => {
                    if let Some(c) = self
                        .present(k)
                        .filter(|&c| !self.seen[c].as_ref().unwrap().stuck)
                    {
                        self.finish(c);
                    }
                }
                Op::Bogus(k, slot, v) => self.bogus(k, slot, v),
            }
            self.check_fences();
        }

        /// Every release value seen is 0 or a use the consumer took.
        fn check_fences(&self) {
            for (c, s) in self.seen.iter().enumerate() {
                let Some(s) = s else { continue };
                for slot in 0..self.f.slots() {
                    let v = self.f.released(c, slot).unwrap();
                    assert!(
                        v == 0 || s.took.contains(&(slot, v)),
                        "{c}'s release of {slot} is {v}"
                    );
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(400))]
        #[test]
        fn any_run_keeps_the_fence_rule(
            slots in 1usize..=MAX_SLOTS,
            run in proptest::collection::vec(ops(), 1..200),
        ) {
            let mut m = Model {
                f: Fanout::new(slots).unwrap(),
                seen: Default::default(),
                uses: [0; MAX_SLOTS],
            };
            for op in run {
                m.step(op);
            }
            for c in 0..MAX_CONSUMERS {
                if let (Some(st), Some(false)) = (m.f.stats(c), m.seen[c].as_ref().map(|s| s.left)) {
                    m.check_counts(c, &st);
                }
            }
        }
    }
}
