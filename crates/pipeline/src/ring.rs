//! Ring-of-slots bookkeeping: which slot a frame uses, the deterministic
//! fence values, and which frame is in flight in each slot. Fixed capacity,
//! no allocation.

use std::time::Instant;

/// Most slots a ring may have (the ring is a fixed-size array).
pub const MAX_SLOTS: usize = 8;

/// Slot and fence values for each frame of a ring of `slots` slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FenceSchedule {
    slots: usize,
}

impl FenceSchedule {
    /// A schedule for `slots` slots, `1..=MAX_SLOTS`.
    pub fn new(slots: usize) -> Result<Self, String> {
        if slots == 0 || slots > MAX_SLOTS {
            return Err(format!(
                "ring size {slots} is outside 1..={MAX_SLOTS} (the ring has a fixed capacity)"
            ));
        }
        Ok(FenceSchedule { slots })
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Slot that `frame` uses.
    pub fn slot(&self, frame: u64) -> usize {
        (frame % self.slots as u64) as usize
    }

    /// How many frames used `frame`'s slot before it.
    fn use_count(&self, frame: u64) -> u64 {
        frame / self.slots as u64
    }

    /// Value of the slot's *free* fence the producer waits for before writing
    /// `frame` (0 for a slot's first use).
    pub fn free_wait_value(&self, frame: u64) -> u64 {
        self.use_count(frame)
    }

    /// Value of the slot's *ready* fence signalled once `frame` is written,
    /// and waited for by the consumer.
    pub fn ready_value(&self, frame: u64) -> u64 {
        self.use_count(frame) + 1
    }

    /// Value of the slot's *free* fence signalled once `frame` is processed.
    pub fn free_signal_value(&self, frame: u64) -> u64 {
        self.use_count(frame) + 1
    }
}

/// What the pipeline remembers about a frame between submit and completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight {
    /// Frame index.
    pub frame: u64,
    /// When the producer started writing it.
    pub started: Instant,
    /// Nanoseconds the producer took to write it (camera, plus the copy in
    /// `--copy` mode).
    pub write_ns: u64,
}

/// Per-slot state of the ring.
#[derive(Debug)]
pub struct Ring {
    schedule: FenceSchedule,
    in_flight: [Option<InFlight>; MAX_SLOTS],
    last_done: [Option<u64>; MAX_SLOTS],
}

impl Ring {
    /// An empty ring.
    pub fn new(schedule: FenceSchedule) -> Self {
        Ring {
            schedule,
            in_flight: [None; MAX_SLOTS],
            last_done: [None; MAX_SLOTS],
        }
    }

    /// The fence schedule.
    pub fn schedule(&self) -> FenceSchedule {
        self.schedule
    }

    /// Whether `slot` holds a submitted frame that has not completed.
    pub fn is_busy(&self, slot: usize) -> bool {
        self.in_flight.get(slot).is_some_and(Option::is_some)
    }

    /// Number of frames submitted and not completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight.iter().filter(|s| s.is_some()).count()
    }

    /// Records that `rec.frame` was submitted in its slot.
    pub fn submit(&mut self, rec: InFlight) -> Result<usize, String> {
        let slot = self.schedule.slot(rec.frame);
        match &mut self.in_flight[slot] {
            Some(old) => Err(format!(
                "slot {slot} still holds frame {} when frame {} was submitted",
                old.frame, rec.frame
            )),
            free => {
                *free = Some(rec);
                Ok(slot)
            }
        }
    }

    /// Records that `frame` completed in `slot`; returns what was recorded at
    /// submit. Fails if that is not the frame in flight there.
    pub fn complete(&mut self, slot: usize, frame: u64) -> Result<InFlight, String> {
        let entry = self
            .in_flight
            .get_mut(slot)
            .filter(|_| slot < self.schedule.slots)
            .ok_or_else(|| {
                format!(
                    "completion names slot {slot}, the ring has {} slots",
                    self.schedule.slots
                )
            })?;
        match *entry {
            Some(rec) if rec.frame == frame => {
                *entry = None;
                self.last_done[slot] = Some(frame);
                Ok(rec)
            }
            Some(rec) => Err(format!(
                "completion for frame {frame} in slot {slot}, but frame {} is in flight there",
                rec.frame
            )),
            None => Err(format!(
                "completion for frame {frame} in slot {slot}, which has nothing in flight"
            )),
        }
    }

    /// The last frame that completed in `slot`, if any.
    pub fn last_done(&self, slot: usize) -> Option<u64> {
        self.last_done.get(slot).copied().flatten()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rec(frame: u64) -> InFlight {
        InFlight {
            frame,
            started: Instant::now(),
            write_ns: 0,
        }
    }

    #[test]
    fn schedule_rejects_zero_and_oversized_rings() {
        assert!(FenceSchedule::new(0).is_err());
        assert!(FenceSchedule::new(MAX_SLOTS + 1).is_err());
        assert_eq!(FenceSchedule::new(MAX_SLOTS).unwrap().slots(), MAX_SLOTS);
    }

    #[test]
    fn fence_values_are_deterministic_per_slot() {
        let s = FenceSchedule::new(3).unwrap();
        let slots: Vec<usize> = (0..7).map(|f| s.slot(f)).collect();
        assert_eq!(slots, [0, 1, 2, 0, 1, 2, 0]);
        // Slot 1 is used by frames 1, 4, 7: ready 1, 2, 3.
        assert_eq!(
            [1, 4, 7].map(|f| s.ready_value(f)),
            [1, 2, 3],
            "ready values"
        );
        // Frame 4 waits for slot 1's free fence to reach 1 (frame 1 processed).
        assert_eq!(s.free_wait_value(4), s.free_signal_value(1));
        assert_eq!(s.free_wait_value(1), 0);
    }

    #[test]
    fn ring_tracks_in_flight_frames_per_slot() {
        let mut ring = Ring::new(FenceSchedule::new(2).unwrap());
        assert_eq!(ring.submit(rec(0)).unwrap(), 0);
        assert_eq!(ring.submit(rec(1)).unwrap(), 1);
        assert_eq!(ring.in_flight(), 2);
        // Frame 2 needs slot 0, which is still busy.
        assert!(ring.is_busy(0));
        assert!(ring.submit(rec(2)).is_err());
        // Completions must name the frame in flight in that slot.
        assert!(ring.complete(0, 1).is_err());
        assert!(ring.complete(5, 0).is_err());
        assert_eq!(ring.complete(0, 0).unwrap().frame, 0);
        assert!(ring.complete(0, 0).is_err(), "double completion");
        assert_eq!(ring.last_done(0), Some(0));
        assert_eq!(ring.last_done(1), None);
        assert_eq!(ring.submit(rec(2)).unwrap(), 0);
        assert_eq!(ring.in_flight(), 2);
    }
}
