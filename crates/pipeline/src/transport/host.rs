//! `host-reference`: a REFERENCE / TESTING transport in plain host memory with
//! std threads and channels. It is not the simulator and not CUDA; it exists
//! so the pipeline, its statistics and its verification run end to end
//! anywhere, and as the executable definition of the [`FrameTransport`]
//! protocol the interop transports implement.
//!
//! Each slot's buffer is allocated once and its ownership moves between the
//! producer and a consumer thread (a pointer move, never a copy of the frame).
//! Each move carries the fence value the [`Ticket`] names, and the
//! receiving side checks it is exactly the value it waits for, as a
//! deterministic fence would.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::consumer::shared::Lendable;
use crate::transport::{
    process_frame, Completion, FrameGeometry, FrameTransport, PeekedFrame, SlotMemory, Ticket,
    TransportError, TransportInfo,
};

/// How long the producer waits for a free slot or a finished frame before
/// it reports the consumer thread stuck.
const STUCK: Duration = Duration::from_secs(10);

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
    bytes: Lendable<Box<[u8]>>,
}

/// Work for the consumer thread: a ticket's slot, frame and fence values.
struct Job {
    slot: usize,
    frame: u64,
    ready: u64,
    free: u64,
}

/// The host-only reference transport (see the module docs).
pub struct HostReference {
    geometry: FrameGeometry,
    /// Buffers currently owned by the producer (waited for, not signalled).
    held: Vec<Option<Lendable<Box<[u8]>>>>,
    /// Per slot, the *free* fence: buffers handed back by the consumer.
    free_rx: Vec<Receiver<Token>>,
    /// Per slot, the *ready* fence: buffers handed to the consumer.
    ready_tx: Vec<SyncSender<Token>>,
    jobs: Option<Sender<Job>>,
    done: Receiver<Result<Completion, TransportError>>,
    worker: Option<JoinHandle<()>>,
}

impl HostReference {
    /// Allocates `slots` buffers and starts the consumer thread.
    pub fn new(geometry: FrameGeometry, slots: usize, fault: Fault) -> Self {
        let mut free_rx = Vec::with_capacity(slots);
        let mut free_tx = Vec::with_capacity(slots);
        let mut ready_tx = Vec::with_capacity(slots);
        let mut ready_rx = Vec::with_capacity(slots);
        for _ in 0..slots {
            // One token per slot exists, so one place in each channel suffices.
            let (ftx, frx) = mpsc::sync_channel::<Token>(1);
            let (rtx, rrx) = mpsc::sync_channel::<Token>(1);
            let bytes = Lendable::new(vec![0u8; geometry.frame_len()].into_boxed_slice());
            // Nothing is in flight yet: the free fence starts at 0.
            // The receiver is alive, so this send cannot fail.
            let _ = ftx.send(Token { value: 0, bytes });
            free_rx.push(frx);
            free_tx.push(ftx);
            ready_tx.push(rtx);
            ready_rx.push(rrx);
        }
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        // At most `slots` frames are in flight, so at most that many results wait.
        let (done_tx, done) = mpsc::sync_channel(slots);
        let worker = thread::spawn(move || {
            consumer_loop(geometry, fault, jobs_rx, ready_rx, free_tx, done_tx)
        });
        HostReference {
            geometry,
            held: (0..slots).map(|_| None).collect(),
            free_rx,
            ready_tx,
            jobs: Some(jobs_tx),
            done,
            worker: Some(worker),
        }
    }
}

/// The consumer thread: per job, wait on the slot's ready fence, check its
/// value, process in place, signal the slot's free fence, report.
fn consumer_loop(
    geometry: FrameGeometry,
    fault: Fault,
    jobs: Receiver<Job>,
    ready: Vec<Receiver<Token>>,
    free: Vec<SyncSender<Token>>,
    done: SyncSender<Result<Completion, TransportError>>,
) {
    while let Ok(Job {
        slot,
        frame,
        ready: want,
        free: next,
    }) = jobs.recv()
    {
        let result = (|| {
            let Ok(mut token) = ready[slot].recv() else {
                return Err(TransportError::peer("producer side of the ring is gone"));
            };
            if token.value != want {
                return Err(TransportError::frame_check(
                    slot,
                    frame,
                    format!(
                        "ready fence is {}, the consumer waits for {want}",
                        token.value
                    ),
                ));
            }
            // The producer sends a slot's buffer only once its lent frame
            // was given back; waited for again here, as the type asks.
            let bytes = token.bytes.get_mut(slot)?;
            if fault == Fault::Corrupt {
                if let Some(b) = bytes.last_mut() {
                    *b ^= 0x5a;
                }
            }
            let t = Instant::now();
            let mismatches = match fault {
                Fault::SkipProcess => 0,
                _ => process_frame(frame, geometry.stride, bytes),
            };
            let process = t.elapsed();
            token.value = next;
            free[slot]
                .send(token)
                .map_err(|_| TransportError::peer("producer side of the ring is gone"))?;
            Ok(Completion {
                slot,
                frame,
                mismatches,
                process,
                busy: process,
                finished: Instant::now(),
            })
        })();
        let failed = result.is_err();
        if done.send(result).is_err() || failed {
            return;
        }
    }
}

impl HostReference {
    /// Makes sure the producer holds `slot`'s buffer: receives it from the
    /// slot's *free* channel unless already held, checking that it carries
    /// `want` (`frame` names the waiter in the error).
    fn take_free(&mut self, slot: usize, want: u64, frame: u64) -> Result<(), TransportError> {
        let (Some(held), Some(rx)) = (self.held.get_mut(slot), self.free_rx.get(slot)) else {
            return Err(TransportError::no_slot(slot));
        };
        if held.is_none() {
            let token = rx.recv_timeout(STUCK).map_err(|e| match e {
                RecvTimeoutError::Timeout => {
                    TransportError::timeout(format!("slot {slot}'s free fence"), STUCK)
                }
                RecvTimeoutError::Disconnected => TransportError::peer("consumer thread stopped"),
            })?;
            if token.value != want {
                return Err(TransportError::frame_check(
                    slot,
                    frame,
                    format!(
                        "free fence is {}, the producer waits for {want}",
                        token.value
                    ),
                ));
            }
            *held = Some(token.bytes);
        }
        Ok(())
    }
}

impl FrameTransport for HostReference {
    fn info(&self) -> TransportInfo {
        TransportInfo {
            backend: "host-reference",
            geometry: self.geometry,
            slots: self.held.len(),
            queues_before_ready: false,
        }
    }

    fn take_slot(&mut self, t: &Ticket) -> Result<SlotMemory, TransportError> {
        let slot = t.slot();
        self.take_free(slot, t.free_wait(), t.frame())?;
        let bytes = self
            .held
            .get_mut(slot)
            .and_then(Option::take)
            .ok_or_else(|| TransportError::misuse("slot buffer missing"))?;
        // Lent frames of the slot are given back before the write (the
        // buffer stays where it was when refused).
        if let Err(e) = bytes.wait_returned(slot) {
            self.held[slot] = Some(bytes);
            return Err(e);
        }
        Ok(SlotMemory::new(t, self.geometry.frame_len(), bytes))
    }

    fn put_back(&mut self, t: &Ticket, memory: SlotMemory) -> Result<(), TransportError> {
        let bytes: Lendable<Box<[u8]>> = memory.into_memory(t)?;
        match self.held.get_mut(t.slot()) {
            Some(held @ None) => {
                *held = Some(bytes);
                Ok(())
            }
            Some(Some(_)) => Err(TransportError::misuse(format!(
                "slot {}'s buffer given back while the transport holds it",
                t.slot()
            ))),
            None => Err(TransportError::no_slot(t.slot())),
        }
    }

    fn lend(
        &mut self,
        slot: usize,
        frame: u64,
        free_reached: u64,
    ) -> Result<Option<PeekedFrame>, TransportError> {
        // The slot's buffer comes back with the value its next ticket waits
        // for.
        self.take_free(slot, free_reached, frame)?;
        match self.held.get(slot) {
            // The lent frame shares the slot's buffer; the next write and
            // the consumer thread's processing wait for it to be dropped.
            Some(Some(bytes)) => Ok(Some(bytes.lend(self.geometry.frame_len())?)),
            _ => Err(TransportError::misuse("slot buffer missing")),
        }
    }

    fn signal_ready(&mut self, t: &Ticket, memory: SlotMemory) -> Result<(), TransportError> {
        self.put_back(t, memory)?;
        let slot = t.slot();
        let bytes = self
            .held
            .get_mut(slot)
            .and_then(Option::take)
            .ok_or_else(|| TransportError::misuse(format!("slot {slot}'s buffer missing")))?;
        // The consumer thread writes the buffer: not while a lent frame of
        // it is read (the buffer goes back where it was when refused).
        if let Err(e) = bytes.wait_returned(slot) {
            self.held[slot] = Some(bytes);
            return Err(e);
        }
        let token = Token {
            value: t.ready(),
            bytes,
        };
        self.ready_tx[slot]
            .send(token)
            .map_err(|_| TransportError::peer("consumer thread stopped"))
    }

    fn queue_consumer(&mut self, t: &Ticket) -> Result<(), TransportError> {
        let job = Job {
            slot: t.slot(),
            frame: t.frame(),
            ready: t.ready(),
            free: t.free_signal(),
        };
        self.jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(|| TransportError::peer("consumer thread stopped"))
    }

    fn try_complete(&mut self) -> Result<Option<Completion>, TransportError> {
        match self.done.try_recv() {
            Ok(r) => r.map(Some),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(TransportError::peer("consumer thread stopped")),
        }
    }

    fn wait_complete(&mut self) -> Result<Completion, TransportError> {
        self.done.recv_timeout(STUCK).map_err(|e| match e {
            RecvTimeoutError::Timeout => {
                TransportError::timeout("the consumer thread's next frame", STUCK)
            }
            RecvTimeoutError::Disconnected => TransportError::peer("consumer thread stopped"),
        })?
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
    use crate::slots::Slots;

    fn transport(slots: usize, fault: Fault) -> (HostReference, Slots) {
        let g = FrameGeometry {
            stride: 64,
            rows: 8,
        };
        (
            HostReference::new(g, slots, fault),
            Slots::new(slots).unwrap(),
        )
    }

    /// One frame through the protocol: take, write the pattern, signal,
    /// queue.
    fn produce(t: &mut HostReference, ring: &mut Slots) -> Ticket {
        let ticket = ring.acquire().unwrap();
        let mut m = t.take_slot(&ticket).unwrap();
        TestPattern::new(ticket.frame(), 64).fill(m.bytes_mut().unwrap());
        t.signal_ready(&ticket, m).unwrap();
        ring.release(&ticket, Instant::now(), 0).unwrap();
        t.queue_consumer(&ticket).unwrap();
        ring.submit(&ticket).unwrap();
        ticket
    }

    fn drain(t: &mut HostReference, ring: &mut Slots) {
        while ring.in_flight() > 0 {
            let c = t.wait_complete().unwrap();
            ring.complete(&c).unwrap();
        }
    }

    #[test]
    fn frames_round_trip_through_the_ring() {
        let (mut t, mut ring) = transport(2, Fault::None);
        for frame in 0..8u64 {
            let ticket = ring.acquire().unwrap();
            assert_eq!(
                (ticket.frame(), ticket.slot()),
                (frame, (frame % 2) as usize)
            );
            let mut m = t.take_slot(&ticket).unwrap();
            let buf = m.bytes_mut().unwrap();
            if frame >= 2 {
                // The producer sees the consumer's in-place result of the
                // slot's previous frame.
                let prev = TestPattern::new(frame - 2, 64);
                assert_eq!(prev.first_mismatch(buf, 0xff), None);
            }
            TestPattern::new(frame, 64).fill(buf);
            t.signal_ready(&ticket, m).unwrap();
            ring.release(&ticket, Instant::now(), 0).unwrap();
            t.queue_consumer(&ticket).unwrap();
            ring.submit(&ticket).unwrap();
            let c = t.wait_complete().unwrap();
            assert_eq!((c.slot, c.frame, c.mismatches), (ticket.slot(), frame, 0));
            ring.complete(&c).unwrap();
        }
        assert!(t.try_complete().unwrap().is_none());
    }

    #[test]
    fn skipped_processing_leaves_the_frame_uninverted() {
        let (mut t, mut ring) = transport(1, Fault::SkipProcess);
        produce(&mut t, &mut ring);
        let c = t.wait_complete().unwrap();
        assert_eq!(c.mismatches, 0);
        ring.complete(&c).unwrap();
        let next = ring.acquire().unwrap();
        let mut m = t.take_slot(&next).unwrap();
        let buf = m.bytes_mut().unwrap();
        assert_eq!(TestPattern::new(0, 64).first_mismatch(buf, 0xff), Some(0));
    }

    #[test]
    fn a_fence_value_other_than_the_ticket_is_refused() {
        // Two state machines over one transport: the second hands out frame
        // 0 again for a slot whose free fence is already at 1.
        let (mut t, mut ring) = transport(1, Fault::None);
        produce(&mut t, &mut ring);
        drain(&mut t, &mut ring);
        let stale = Slots::new(1).unwrap().acquire().unwrap();
        let e = t.take_slot(&stale).unwrap_err();
        assert!(
            matches!(
                e,
                TransportError::FrameCheck {
                    slot: 0,
                    frame: 0,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(
            e.contains("free fence is 1") && e.contains("waits for 0"),
            "{e}"
        );
        // Memory of another ticket is refused, not signalled.
        let (mut t, mut ring) = transport(2, Fault::None);
        let a = ring.acquire().unwrap();
        let b = ring.acquire().unwrap();
        let m = t.take_slot(&a).unwrap();
        assert!(t.signal_ready(&b, m).is_err());
    }

    #[test]
    fn a_lent_frame_outliving_its_turn_is_waited_for_not_overwritten() {
        // The transport is asked for the slot's next frame while a frame of
        // it is still lent (lent straight from the transport, so no ring
        // holds the slot back): `take_slot` waits until the reader dropped
        // the frame, and the reader sees the frame unchanged.
        let (mut t, mut ring) = transport(2, Fault::None);
        produce(&mut t, &mut ring);
        drain(&mut t, &mut ring);
        let (slot, free) = ring.lendable(0).unwrap();
        let lent = t.lend(slot, 0, free).unwrap().unwrap();
        let dropped = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let processed = TestPattern::new(0, 64);
                for _ in 0..20 {
                    assert_eq!(processed.first_mismatch(lent.bytes(), 0xff), None);
                    std::thread::sleep(Duration::from_millis(10));
                }
                dropped.store(true, std::sync::atomic::Ordering::SeqCst);
                drop(lent);
            });
            // Frame 2 of slot 0 (frame 1 of slot 1 in between).
            produce(&mut t, &mut ring);
            let next = ring.acquire().unwrap();
            assert_eq!(next.slot(), 0);
            let mut m = t.take_slot(&next).unwrap();
            assert!(
                dropped.load(std::sync::atomic::Ordering::SeqCst),
                "the slot was handed out for writing while its frame was lent"
            );
            m.bytes_mut().unwrap().fill(0);
            reader.join().unwrap();
        });
    }

    #[test]
    fn a_lent_frame_keeps_its_memory_after_the_transport_is_gone() {
        let (mut t, mut ring) = transport(1, Fault::None);
        produce(&mut t, &mut ring);
        drain(&mut t, &mut ring);
        let (slot, free) = ring.lendable(0).unwrap();
        let lent = t.lend(slot, 0, free).unwrap().unwrap();
        drop(t);
        assert_eq!(lent.len(), 64 * 8);
        assert_eq!(
            TestPattern::new(0, 64).first_mismatch(lent.bytes(), 0xff),
            None
        );
    }

    #[test]
    fn corruption_is_counted_by_the_consumer() {
        let (mut t, mut ring) = transport(1, Fault::Corrupt);
        produce(&mut t, &mut ring);
        assert_eq!(t.wait_complete().unwrap().mismatches, 1);
    }

    #[test]
    fn drop_with_work_pending_does_not_hang() {
        let (mut t, mut ring) = transport(2, Fault::None);
        let ticket = ring.acquire().unwrap();
        t.queue_consumer(&ticket).unwrap(); // queued, never signalled ready
        drop(t);
    }
}
