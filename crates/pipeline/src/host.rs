//! `host-reference`: a REFERENCE / TESTING transport in plain host memory with
//! std threads and channels. It is not the simulator and not CUDA; it exists
//! so the pipeline, its statistics and its verification run end to end
//! anywhere, and as the executable definition of the [`FrameTransport`]
//! protocol the interop transports implement.
//!
//! Each slot's buffer is allocated once and its ownership moves between the
//! producer and a consumer thread (a pointer move, never a copy of the frame).
//! Each move carries the fence value of the [`FenceSchedule`], and the
//! receiving side checks it is exactly the value it waits for, as a
//! deterministic fence would.

use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::ring::FenceSchedule;
use crate::transport::{process_frame, Completion, FrameGeometry, FrameTransport, TransportError};

/// A deliberate defect, so tests can show that verification catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Behave correctly.
    None,
    /// The consumer reports success but does not process the frame.
    SkipProcess,
    /// One byte of every frame is damaged on its way to the consumer.
    Corrupt,
}

/// A buffer moving between the two sides, with the fence value it carries.
struct Token {
    value: u64,
    bytes: Box<[u8]>,
    /// When the producer signalled the ready fence (for the queueing figure).
    signalled: Instant,
}

/// Work for the consumer thread.
struct Job {
    slot: usize,
    frame: u64,
}

/// The host-only reference transport (see the module docs).
pub struct HostReference {
    geometry: FrameGeometry,
    schedule: FenceSchedule,
    /// Buffers currently owned by the producer (acquired, not released).
    held: Vec<Option<Box<[u8]>>>,
    /// Per slot, the *free* fence: buffers handed back by the consumer.
    free_rx: Vec<Receiver<Token>>,
    /// Per slot, the *ready* fence: buffers handed to the consumer.
    ready_tx: Vec<SyncSender<Token>>,
    jobs: Option<Sender<Job>>,
    done: Receiver<Result<Completion, TransportError>>,
    worker: Option<JoinHandle<()>>,
}

impl HostReference {
    /// Allocates `schedule.slots()` buffers and starts the consumer thread.
    pub fn new(geometry: FrameGeometry, schedule: FenceSchedule, fault: Fault) -> Self {
        let slots = schedule.slots();
        let mut free_rx = Vec::with_capacity(slots);
        let mut free_tx = Vec::with_capacity(slots);
        let mut ready_tx = Vec::with_capacity(slots);
        let mut ready_rx = Vec::with_capacity(slots);
        for _ in 0..slots {
            // One token per slot exists, so one place in each channel suffices.
            let (ftx, frx) = mpsc::sync_channel::<Token>(1);
            let (rtx, rrx) = mpsc::sync_channel::<Token>(1);
            let bytes = vec![0u8; geometry.frame_len()].into_boxed_slice();
            // Nothing is in flight yet: the free fence starts at 0.
            // The receiver is alive, so this send cannot fail.
            let _ = ftx.send(Token {
                value: 0,
                bytes,
                signalled: Instant::now(),
            });
            free_rx.push(frx);
            free_tx.push(ftx);
            ready_tx.push(rtx);
            ready_rx.push(rrx);
        }
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        // At most `slots` frames are in flight, so at most that many results wait.
        let (done_tx, done) = mpsc::sync_channel(slots);
        let worker = thread::spawn(move || {
            consumer_loop(
                geometry, schedule, fault, jobs_rx, ready_rx, free_tx, done_tx,
            )
        });
        HostReference {
            geometry,
            schedule,
            held: (0..slots).map(|_| None).collect(),
            free_rx,
            ready_tx,
            jobs: Some(jobs_tx),
            done,
            worker: Some(worker),
        }
    }

    fn check_slot(&self, slot: usize, frame: u64) -> Result<(), TransportError> {
        if slot != self.schedule.slot(frame) {
            return Err(TransportError::new(format!(
                "frame {frame} belongs in slot {}, not {slot}",
                self.schedule.slot(frame)
            )));
        }
        Ok(())
    }
}

/// The consumer thread: per job, wait on the slot's ready fence, check its
/// value, process in place, signal the slot's free fence, report.
fn consumer_loop(
    geometry: FrameGeometry,
    schedule: FenceSchedule,
    fault: Fault,
    jobs: Receiver<Job>,
    ready: Vec<Receiver<Token>>,
    free: Vec<SyncSender<Token>>,
    done: SyncSender<Result<Completion, TransportError>>,
) {
    let mut prev_end: Option<Instant> = None;
    while let Ok(Job { slot, frame }) = jobs.recv() {
        let result = (|| {
            let Ok(mut token) = ready[slot].recv() else {
                return Err(TransportError::new("producer side of the ring is gone"));
            };
            let want = schedule.ready_value(frame);
            if token.value != want {
                return Err(TransportError::new(format!(
                    "slot {slot} ready fence is {}, consumer of frame {frame} waits for {want}",
                    token.value
                )));
            }
            if fault == Fault::Corrupt {
                if let Some(b) = token.bytes.last_mut() {
                    *b ^= 0x5a;
                }
            }
            let t = Instant::now();
            let mismatches = match fault {
                Fault::SkipProcess => 0,
                _ => process_frame(frame, geometry.stride, &mut token.bytes),
            };
            let process = t.elapsed();
            // Ready before the previous frame was done: it queued until then.
            let queued = prev_end.map_or(Duration::ZERO, |end| {
                end.saturating_duration_since(token.signalled)
            });
            prev_end = Some(t + process);
            token.value = schedule.free_signal_value(frame);
            free[slot]
                .send(token)
                .map_err(|_| TransportError::new("producer side of the ring is gone"))?;
            Ok(Completion {
                slot,
                frame,
                mismatches,
                process,
                queued,
                finished: Instant::now(),
            })
        })();
        let failed = result.is_err();
        if done.send(result).is_err() || failed {
            return;
        }
    }
}

impl FrameTransport for HostReference {
    fn backend(&self) -> &'static str {
        "host-reference"
    }

    fn slot_count(&self) -> usize {
        self.schedule.slots()
    }

    fn geometry(&self) -> FrameGeometry {
        self.geometry
    }

    fn producer_acquire(&mut self, slot: usize, frame: u64) -> Result<&mut [u8], TransportError> {
        self.check_slot(slot, frame)?;
        let held = &mut self.held[slot];
        if held.is_none() {
            let token = self.free_rx[slot]
                .recv()
                .map_err(|_| TransportError::new("consumer thread stopped"))?;
            let want = self.schedule.free_wait_value(frame);
            if token.value != want {
                return Err(TransportError::new(format!(
                    "slot {slot} free fence is {}, producer of frame {frame} waits for {want}",
                    token.value
                )));
            }
            *held = Some(token.bytes);
        }
        match held {
            Some(bytes) => Ok(bytes),
            None => Err(TransportError::new("slot buffer missing")),
        }
    }

    fn producer_release(&mut self, slot: usize, frame: u64) -> Result<(), TransportError> {
        self.check_slot(slot, frame)?;
        let bytes = self.held[slot].take().ok_or_else(|| {
            TransportError::new(format!("release of slot {slot} that was not acquired"))
        })?;
        let token = Token {
            value: self.schedule.ready_value(frame),
            bytes,
            signalled: Instant::now(),
        };
        self.ready_tx[slot]
            .send(token)
            .map_err(|_| TransportError::new("consumer thread stopped"))
    }

    fn consumer_submit(&mut self, slot: usize, frame: u64) -> Result<(), TransportError> {
        self.check_slot(slot, frame)?;
        self.jobs
            .as_ref()
            .and_then(|j| j.send(Job { slot, frame }).ok())
            .ok_or_else(|| TransportError::new("consumer thread stopped"))
    }

    fn try_complete(&mut self) -> Result<Option<Completion>, TransportError> {
        match self.done.try_recv() {
            Ok(r) => r.map(Some),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(TransportError::new("consumer thread stopped")),
        }
    }

    fn wait_complete(&mut self) -> Result<Completion, TransportError> {
        self.done
            .recv()
            .map_err(|_| TransportError::new("consumer thread stopped"))?
    }
}

impl Drop for HostReference {
    fn drop(&mut self) {
        // Close everything the consumer thread may be blocked on: the job
        // queue, the ready fences and the result queue; then it exits.
        self.jobs = None;
        self.ready_tx.clear();
        let (_, closed) = mpsc::sync_channel(0);
        drop(std::mem::replace(&mut self.done, closed));
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::TestPattern;

    fn transport(slots: usize, fault: Fault) -> HostReference {
        let g = FrameGeometry {
            stride: 64,
            rows: 8,
        };
        HostReference::new(g, FenceSchedule::new(slots).unwrap(), fault)
    }

    fn produce(t: &mut HostReference, frame: u64) -> usize {
        let slot = frame as usize % t.slot_count();
        let buf = t.producer_acquire(slot, frame).unwrap();
        TestPattern::new(frame, 64).fill(buf);
        t.producer_release(slot, frame).unwrap();
        t.consumer_submit(slot, frame).unwrap();
        slot
    }

    #[test]
    fn frames_round_trip_through_the_ring() {
        let mut t = transport(2, Fault::None);
        for frame in 0..8u64 {
            let slot = (frame % 2) as usize;
            let buf = t.producer_acquire(slot, frame).unwrap();
            if frame >= 2 {
                // The producer sees the consumer's in-place result of the
                // slot's previous frame.
                let prev = TestPattern::new(frame - 2, 64);
                assert_eq!(prev.first_mismatch(buf, 0xff), None);
            }
            TestPattern::new(frame, 64).fill(buf);
            t.producer_release(slot, frame).unwrap();
            t.consumer_submit(slot, frame).unwrap();
            let c = t.wait_complete().unwrap();
            assert_eq!((c.slot, c.frame, c.mismatches), (slot, frame, 0));
        }
        assert!(t.try_complete().unwrap().is_none());
    }

    #[test]
    fn skipped_processing_leaves_the_frame_uninverted() {
        let mut t = transport(1, Fault::SkipProcess);
        produce(&mut t, 0);
        assert_eq!(t.wait_complete().unwrap().mismatches, 0);
        let buf = t.producer_acquire(0, 1).unwrap();
        assert_eq!(TestPattern::new(0, 64).first_mismatch(buf, 0xff), Some(0));
    }

    #[test]
    fn out_of_order_use_is_refused() {
        let mut t = transport(2, Fault::None);
        assert!(t.producer_acquire(1, 0).is_err(), "wrong slot");
        assert!(t.producer_release(0, 0).is_err(), "release before acquire");
        // Frame 2 would wait on slot 0's free fence value 1; the slot is at 0.
        assert!(t.producer_acquire(0, 2).is_err());
    }

    #[test]
    fn corruption_is_counted_by_the_consumer() {
        let mut t = transport(1, Fault::Corrupt);
        produce(&mut t, 0);
        assert_eq!(t.wait_complete().unwrap().mismatches, 1);
    }

    #[test]
    fn drop_with_work_pending_does_not_hang() {
        let mut t = transport(2, Fault::None);
        t.consumer_submit(0, 0).unwrap(); // submitted, never released
        drop(t);
    }
}
