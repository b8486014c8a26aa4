//! `host-fanout`: the REFERENCE multicast transport, in plain host memory
//! with std threads. Not CUDA and not the simulator: it is the executable
//! definition of the [`FanoutTransport`] protocol, and runs the multicast
//! ring's tests anywhere.
//!
//! Each slot's buffer is allocated once. The producer owns it while it
//! writes ([`SlotMemory`]); at *ready* it becomes shared, read-only
//! (`Arc`), and each consumer it is queued to gets a reference. Every
//! consumer is a host thread running its [`HostWork`] closure over the
//! bytes (`&[u8]`: it cannot write them); it drops its reference, then
//! signals its own *release* fence of the slot (an atomic per consumer and
//! slot, with a condvar for the waits). The producer gets the buffer back
//! only when no reference is left, so a slot is never written while a
//! consumer reads it, by ownership.
//!
//! A consumer can be slowed down or stopped through its [`Control`] (for
//! tests: a slow mailbox, a consumer that stops answering). A stopped
//! consumer holds the frame it was given; a closure that panics ends its
//! thread (the ring then disconnects the consumer, and the slot it held
//! stays retired: its release never comes).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::{
    Completion, ConsumerSpec, FanoutInfo, FanoutTransport, FrameGeometry, Queued, SlotMemory,
    TransportError, MAX_CONSUMERS,
};
use crate::camera::TestPattern;
use crate::frame::LeasedMemory;
use crate::slots::MAX_SLOTS;

/// How long a consumer thread may take to stop once asked (it stops
/// between frames; a closure running is not interrupted).
pub const STOP_WAIT: Duration = Duration::from_secs(5);

/// The test-pattern bytes of `bytes` that differ from
/// `TestPattern::new(frame, stride)` (read-only: the multicast consumers'
/// check).
pub fn pattern_mismatches(frame: u64, stride: usize, bytes: &[u8]) -> u64 {
    if stride == 0 {
        return 0;
    }
    let pattern = TestPattern::new(frame, stride);
    let mut mismatches = 0u64;
    for (row, line) in bytes.chunks(stride).enumerate() {
        for (col, b) in line.iter().enumerate() {
            mismatches += u64::from(*b != pattern.byte(row, col));
        }
    }
    mismatches
}

/// The control of one host consumer: slow it down, stop it, resume it
/// (cheap to clone; every clone controls the same consumer).
#[derive(Clone, Debug, Default)]
pub struct Control {
    inner: Arc<ControlInner>,
}

#[derive(Debug, Default)]
struct ControlInner {
    delay_ns: AtomicU64,
    stopped: Mutex<bool>,
    quit: AtomicBool,
    wake: Condvar,
}

impl Control {
    /// Each frame takes at least `delay` more (before the closure runs).
    pub fn set_delay(&self, delay: Duration) {
        let ns = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.inner.delay_ns.store(ns, Ordering::Relaxed);
    }

    /// The consumer stops before its next frame (keeping that frame, not
    /// releasing it) until [`Control::resume`].
    pub fn stop(&self) {
        *lock(&self.inner.stopped) = true;
    }

    /// A stopped consumer goes on.
    pub fn resume(&self) {
        *lock(&self.inner.stopped) = false;
        self.inner.wake.notify_all();
    }

    fn quit(&self) {
        self.inner.quit.store(true, Ordering::SeqCst);
        let _guard = lock(&self.inner.stopped);
        self.inner.wake.notify_all();
    }

    /// Waits out the delay and any stop; `false` when asked to quit.
    fn gate(&self) -> bool {
        let delay = Duration::from_nanos(self.inner.delay_ns.load(Ordering::Relaxed));
        let until = Instant::now() + delay;
        let mut stopped = lock(&self.inner.stopped);
        loop {
            if self.inner.quit.load(Ordering::SeqCst) {
                return false;
            }
            let left = until.saturating_duration_since(Instant::now());
            if !*stopped && left.is_zero() {
                return true;
            }
            let wait = if *stopped { STOP_WAIT } else { left };
            stopped = match self.inner.wake.wait_timeout(stopped, wait) {
                Ok((g, _)) => g,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }
}

/// A lock that a panicked holder did not poison for us (the data are plain
/// flags and values, valid whatever the holder did).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The closure of a [`HostWork`].
type RunFrame = Box<dyn FnMut(u64, &[u8]) -> u64 + Send>;

/// What a host consumer runs per frame: a closure given the frame number
/// and its bytes (read-only) that returns the mismatches it found.
pub struct HostWork {
    run: RunFrame,
    control: Control,
}

impl std::fmt::Debug for HostWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostWork").finish_non_exhaustive()
    }
}

impl HostWork {
    /// Work that runs `run(frame, bytes)` on each frame.
    pub fn new(run: impl FnMut(u64, &[u8]) -> u64 + Send + 'static) -> HostWork {
        HostWork {
            run: Box::new(run),
            control: Control::default(),
        }
    }

    /// The control of the consumer this work will run in.
    pub fn control(&self) -> Control {
        self.control.clone()
    }
}

/// The fences: *ready* per slot, *release* per consumer and slot.
#[derive(Debug)]
struct Fences {
    ready: [AtomicU64; MAX_SLOTS],
    release: [[AtomicU64; MAX_SLOTS]; MAX_CONSUMERS],
    /// Per consumer place, whether its thread runs (a waiter for its
    /// release gives up once it ended).
    alive: [AtomicBool; MAX_CONSUMERS],
    lock: Mutex<()>,
    signalled: Condvar,
}

impl Fences {
    fn signal(&self, fence: &AtomicU64, value: u64) {
        fence.store(value, Ordering::SeqCst);
        let _guard = lock(&self.lock);
        self.signalled.notify_all();
    }

    /// Waits up to `limit` for consumer `id`'s `fence` to reach `value`;
    /// `None` when its thread ended first.
    fn wait(&self, id: usize, fence: &AtomicU64, value: u64, limit: Duration) -> Option<bool> {
        let deadline = Instant::now() + limit;
        let mut guard = lock(&self.lock);
        loop {
            if fence.load(Ordering::SeqCst) >= value {
                return Some(true);
            }
            if !self.alive[id].load(Ordering::SeqCst) {
                return None;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Some(false);
            }
            guard = match self.signalled.wait_timeout(guard, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

/// A slot's buffer where it is.
#[derive(Debug)]
enum Buffer {
    /// With the transport, not published.
    Here(Box<[u8]>),
    /// Out with the producer.
    Out,
    /// Published at *ready*: shared, read-only.
    Shared(Arc<Box<[u8]>>),
}

/// The producer's hold of a slot's buffer while it writes.
struct Writing(Box<[u8]>);

impl LeasedMemory for Writing {
    fn bytes_mut(&mut self, _slot: usize) -> Result<&mut [u8], TransportError> {
        Ok(&mut self.0)
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }
}

/// A frame for a consumer thread.
struct Job {
    q: Queued,
    bytes: Arc<Box<[u8]>>,
}

/// One consumer thread.
struct Worker {
    jobs: Sender<Job>,
    done: Receiver<Completion>,
    control: Control,
    exited: Receiver<()>,
    thread: JoinHandle<()>,
}

/// The host reference multicast transport (see the module docs).
pub struct HostFanout {
    geometry: FrameGeometry,
    buffers: Vec<Buffer>,
    fences: Arc<Fences>,
    workers: Vec<Option<Worker>>,
    /// Per consumer place, completions of a stopped thread not yet taken.
    leftover: Vec<VecDeque<Completion>>,
    /// Threads asked to stop that had not stopped within [`STOP_WAIT`].
    stragglers: usize,
}

impl std::fmt::Debug for HostFanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostFanout")
            .field("geometry", &self.geometry)
            .field("slots", &self.buffers.len())
            .field("consumers", &self.workers.iter().flatten().count())
            .finish()
    }
}

impl HostFanout {
    /// `slots` buffers of `geometry`'s frames (`1..=MAX_SLOTS`), no
    /// consumer yet.
    ///
    /// # Errors
    /// Refused for a slot count outside that range.
    pub fn new(geometry: FrameGeometry, slots: usize) -> Result<HostFanout, TransportError> {
        if !(1..=MAX_SLOTS).contains(&slots) {
            return Err(TransportError::refused(format!(
                "host-fanout: {slots} slots is outside 1..={MAX_SLOTS}"
            )));
        }
        let len = geometry.frame_len();
        Ok(HostFanout {
            geometry,
            buffers: (0..slots)
                .map(|_| Buffer::Here(vec![0u8; len].into_boxed_slice()))
                .collect(),
            fences: Arc::new(Fences {
                ready: std::array::from_fn(|_| AtomicU64::new(0)),
                release: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
                alive: std::array::from_fn(|_| AtomicBool::new(false)),
                lock: Mutex::new(()),
                signalled: Condvar::new(),
            }),
            workers: (0..MAX_CONSUMERS).map(|_| None).collect(),
            leftover: (0..MAX_CONSUMERS).map(|_| VecDeque::new()).collect(),
            stragglers: 0,
        })
    }

    /// Slot `slot`'s *ready* fence now (`None` past the ring).
    pub fn ready_value(&self, slot: usize) -> Option<u64> {
        (slot < self.buffers.len()).then(|| self.fences.ready[slot].load(Ordering::SeqCst))
    }

    /// Consumer place `id`'s *release* fence of `slot` now (it outlives
    /// the consumer: a later consumer at the same place goes on from it).
    pub fn release_value(&self, id: usize, slot: usize) -> Option<u64> {
        self.release_fence(id, slot)
            .ok()
            .map(|f| f.load(Ordering::SeqCst))
    }

    fn buffer(&mut self, slot: usize) -> Result<&mut Buffer, TransportError> {
        self.buffers
            .get_mut(slot)
            .ok_or_else(|| TransportError::no_slot(slot))
    }

    fn worker(&mut self, id: usize) -> Result<&mut Worker, TransportError> {
        self.workers
            .get_mut(id)
            .and_then(Option::as_mut)
            .ok_or_else(|| TransportError::misuse(format!("host-fanout: no consumer {id}")))
    }

    fn release_fence(&self, id: usize, slot: usize) -> Result<&AtomicU64, TransportError> {
        self.fences
            .release
            .get(id)
            .and_then(|r| r.get(slot).filter(|_| slot < self.buffers.len()))
            .ok_or_else(|| TransportError::misuse(format!("host-fanout: no fence {id}/{slot}")))
    }

    /// Asks consumer `id`'s thread to stop and waits for it up to
    /// [`STOP_WAIT`]; one that does not stop is left running (counted).
    fn stop(&mut self, id: usize) -> bool {
        let Some(w) = self.workers.get_mut(id).and_then(Option::take) else {
            return true;
        };
        w.control.quit();
        drop(w.jobs);
        match w.exited.recv_timeout(STOP_WAIT) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                // It has left its loop: the join is immediate, and every
                // completion it sent is in the queue.
                let _ = w.thread.join();
                if let Some(left) = self.leftover.get_mut(id) {
                    left.extend(w.done.try_iter());
                }
                true
            }
            Err(RecvTimeoutError::Timeout) => {
                self.stragglers += 1;
                false
            }
        }
    }
}

/// Marks a consumer thread ended when it leaves its loop, unwinding from
/// a panic of its work included, and wakes the waiters.
struct Alive<'a> {
    fences: &'a Fences,
    id: usize,
}

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.fences.alive[self.id].store(false, Ordering::SeqCst);
        let _guard = lock(&self.fences.lock);
        self.fences.signalled.notify_all();
    }
}

/// Consumer thread `id`: per job, the gate (delay, stop), a check of the
/// *ready* fence, the closure, the reference dropped, *release* signalled,
/// the completion reported.
fn consumer_loop(
    id: usize,
    mut work: HostWork,
    fences: Arc<Fences>,
    jobs: Receiver<Job>,
    done: Sender<Completion>,
    exited: Sender<()>,
) {
    let _alive = Alive {
        fences: &fences,
        id,
    };
    while let Ok(Job { q, bytes }) = jobs.recv() {
        if !work.control.gate() {
            break;
        }
        // The slot is not used again before this release, so *ready* is
        // exactly the use; anything else is a broken protocol, and the
        // consumer ends (its completion queue closes: the ring sees it).
        if fences.ready[q.slot].load(Ordering::SeqCst) != q.use_ {
            break;
        }
        let start = Instant::now();
        let mismatches = (work.run)(q.frame, &bytes);
        let process = start.elapsed();
        drop(bytes);
        fences.signal(&fences.release[id][q.slot], q.use_);
        let c = Completion {
            slot: q.slot,
            frame: q.frame,
            mismatches,
            process,
            busy: process,
            finished: Instant::now(),
        };
        if done.send(c).is_err() {
            break;
        }
    }
    let _ = exited.send(());
}

impl FanoutTransport for HostFanout {
    type Work = HostWork;

    fn info(&self) -> FanoutInfo {
        FanoutInfo {
            backend: "host-fanout",
            geometry: self.geometry,
            slots: self.buffers.len(),
        }
    }

    fn attach(&mut self, id: usize, spec: ConsumerSpec<HostWork>) -> Result<(), TransportError> {
        match self.workers.get(id) {
            Some(None) => {}
            Some(Some(_)) => {
                return Err(TransportError::misuse(format!(
                    "host-fanout: consumer {id} is attached already"
                )))
            }
            None => {
                return Err(TransportError::misuse(format!(
                    "host-fanout: no consumer place {id}"
                )))
            }
        }
        self.leftover[id].clear();
        let (jobs, jobs_rx) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        let (exited_tx, exited) = mpsc::channel();
        let control = spec.work.control();
        let fences = Arc::clone(&self.fences);
        self.fences.alive[id].store(true, Ordering::SeqCst);
        let thread = thread::Builder::new()
            .name(format!("host-fanout-{id}"))
            .spawn(move || consumer_loop(id, spec.work, fences, jobs_rx, done_tx, exited_tx))
            .map_err(|e| TransportError::new(format!("host-fanout: consumer thread: {e}")))?;
        self.workers[id] = Some(Worker {
            jobs,
            done,
            control,
            exited,
            thread,
        });
        Ok(())
    }

    fn detach(&mut self, id: usize) -> Result<(), TransportError> {
        self.worker(id)?;
        match self.stop(id) {
            true => Ok(()),
            false => Err(TransportError::timeout(
                format!("host-fanout consumer {id}'s thread to stop (left running)"),
                STOP_WAIT,
            )),
        }
    }

    fn take_slot(
        &mut self,
        slot: usize,
        frame: u64,
        _use: u64,
    ) -> Result<SlotMemory, TransportError> {
        let len = self.geometry.frame_len();
        let buffer = std::mem::replace(self.buffer(slot)?, Buffer::Out);
        let bytes = match buffer {
            Buffer::Here(b) => b,
            Buffer::Shared(arc) => match Arc::try_unwrap(arc) {
                Ok(b) => b,
                Err(arc) => {
                    self.buffers[slot] = Buffer::Shared(arc);
                    return Err(TransportError::misuse(format!(
                        "host-fanout: slot {slot} is still read by a consumer"
                    )));
                }
            },
            Buffer::Out => {
                return Err(TransportError::misuse(format!(
                    "host-fanout: slot {slot} is out already"
                )))
            }
        };
        Ok(SlotMemory::for_slot(slot, frame, len, Writing(bytes)))
    }

    fn put_back(&mut self, slot: usize, memory: SlotMemory) -> Result<(), TransportError> {
        let frame = memory.frame();
        let Writing(bytes) = memory.into_memory_of(slot, frame)?;
        *self.buffer(slot)? = Buffer::Here(bytes);
        Ok(())
    }

    fn signal_ready(
        &mut self,
        slot: usize,
        use_: u64,
        memory: SlotMemory,
    ) -> Result<(), TransportError> {
        let frame = memory.frame();
        let Writing(bytes) = memory.into_memory_of(slot, frame)?;
        *self.buffer(slot)? = Buffer::Shared(Arc::new(bytes));
        self.fences.signal(&self.fences.ready[slot], use_);
        Ok(())
    }

    fn queue(&mut self, id: usize, q: Queued) -> Result<(), TransportError> {
        let bytes = match self.buffers.get(q.slot) {
            Some(Buffer::Shared(arc))
                if self.fences.ready[q.slot].load(Ordering::SeqCst) == q.use_ =>
            {
                Arc::clone(arc)
            }
            _ => {
                return Err(TransportError::misuse(format!(
                    "host-fanout: frame {} (slot {}, use {}) is not the slot's published frame",
                    q.frame, q.slot, q.use_
                )))
            }
        };
        self.worker(id)?
            .jobs
            .send(Job { q, bytes })
            .map_err(|_| TransportError::peer(format!("host-fanout consumer {id}'s thread ended")))
    }

    fn released(&mut self, id: usize, slot: usize) -> Result<u64, TransportError> {
        Ok(self.release_fence(id, slot)?.load(Ordering::SeqCst))
    }

    fn wait_released(
        &mut self,
        id: usize,
        slot: usize,
        value: u64,
        limit: Duration,
    ) -> Result<bool, TransportError> {
        let fence = self.release_fence(id, slot)?;
        self.fences.wait(id, fence, value, limit).ok_or_else(|| {
            TransportError::peer(format!(
                "host-fanout consumer {id}'s thread ended before its release of slot {slot} reached {value}"
            ))
        })
    }

    fn try_complete(&mut self, id: usize) -> Result<Option<Completion>, TransportError> {
        if self.workers.get(id).is_some_and(Option::is_none) {
            // Detached: what its thread reported before it stopped.
            return Ok(self.leftover[id].pop_front());
        }
        match self.worker(id)?.done.try_recv() {
            Ok(c) => Ok(Some(c)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(TransportError::peer(format!(
                "host-fanout consumer {id}'s thread ended (its work panicked or a fence was wrong)"
            ))),
        }
    }

    fn close(mut self: Box<Self>) -> Result<(), TransportError> {
        for id in 0..MAX_CONSUMERS {
            self.stop(id);
        }
        match self.stragglers {
            0 => Ok(()),
            n => Err(TransportError::timeout(
                format!(
                    "{n} host-fanout consumer thread(s) to stop (left running; each holds only its own references)"
                ),
                STOP_WAIT,
            )),
        }
    }
}

impl Drop for HostFanout {
    fn drop(&mut self) {
        // Ask every thread to stop; no wait here (close waits).
        for w in self.workers.iter().flatten() {
            w.control.quit();
        }
    }
}
