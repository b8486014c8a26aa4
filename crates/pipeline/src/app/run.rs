//! The program's one loop over small parts: a [`Source`] fills each write
//! lease (on the producer thread, or one frame ahead on a writer thread:
//! [`Plan::ahead`]), the ring hands it over, and every finished frame goes
//! to the [`Checker`]: through a read lease on a checker thread beside the
//! writes, or on the producer thread through the slot's next write lease,
//! just before the frame is overwritten ([`Plan::overlap`]); the timings
//! and the verification make the report.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::check::Checker;
use super::report::{Progress, Verification};
use super::stats::Samples;
use super::trace::{Trace, Track};
use crate::frame::FrameLayout;
use crate::ring::{Finished, ReadLease, Ring, SlotState, WriteLease, MAX_SLOTS};
use crate::source::{Filled, Source};

/// How long the producer waits for the writer thread to write one frame
/// (`--camera-ahead on`) before it gives up with an error.
pub const CAMERA_WAIT: Duration = Duration::from_secs(60);

/// The settings of the loop.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Frames to run.
    pub frames: u64,
    /// The source writes frame f + 1 on a writer thread while the producer
    /// hands frame f over (needs two slots or more).
    pub ahead: bool,
    /// Finished frames are checked through read leases on a checker thread
    /// while later frames are written (needs three slots or more); else on
    /// the producer thread when their slot comes round.
    pub overlap: bool,
    /// The source writes into a staging buffer that is copied into the
    /// slot (`--copy` where the transport does not copy).
    pub host_copy: bool,
    /// How frames are verified.
    pub checker: Checker,
}

/// Per-frame measurements, each a histogram of fixed size (see [`Samples`]).
pub(crate) struct Timings<'a> {
    pub(crate) latency: Samples,
    pub(crate) write: Samples,
    pub(crate) process: Samples,
    pub(crate) queued: Samples,
    /// Written frame kept by the producer before its ready signal.
    pub(crate) held: Samples,
    /// Per slot: the frame whose `held` time is recorded, and that time.
    held_by_slot: [Option<(u64, u64)>; MAX_SLOTS],
    pub(crate) overhead: Samples,
    /// The check of a processed frame.
    pub(crate) verify: Samples,
    /// Producer thread inside the ring's acquire and hand-over.
    pub(crate) handover: Samples,
    /// Consumer occupied with a frame after its wait.
    pub(crate) busy: Samples,
    /// Producer thread collecting finished frames, per frame.
    pub(crate) collect: Samples,
    /// Producer thread lending finished frames for their check, per frame.
    pub(crate) lend: Samples,
    /// Producer thread waiting for the checker, per frame.
    pub(crate) checker: Samples,
    pub(crate) last_finished: Option<Instant>,
    /// `--trace`: each frame's stages (nothing when off).
    pub(crate) trace: &'a mut Trace,
}

impl<'a> Timings<'a> {
    /// Empty histograms, tracing into `trace`.
    pub(crate) fn new(trace: &'a mut Trace) -> Result<Timings<'a>, String> {
        Ok(Timings {
            latency: Samples::new()?,
            write: Samples::new()?,
            process: Samples::new()?,
            queued: Samples::new()?,
            held: Samples::new()?,
            held_by_slot: [None; MAX_SLOTS],
            overhead: Samples::new()?,
            verify: Samples::new()?,
            handover: Samples::new()?,
            busy: Samples::new()?,
            collect: Samples::new()?,
            lend: Samples::new()?,
            checker: Samples::new()?,
            last_finished: None,
            trace,
        })
    }
}

/// A lease the source wrote (or failed to write).
struct Written {
    lease: WriteLease,
    started: Instant,
    written: Instant,
    copied: Option<Instant>,
    filled: Result<Filled, String>,
}

/// Fills `lease` from `source` (through `staging` when it is not empty).
fn write_frame(
    source: &mut dyn Source,
    staging: &mut [u8],
    layout: FrameLayout,
    mut lease: WriteLease,
) -> Written {
    let started = Instant::now();
    let index = lease.frame();
    let filled = match staging.is_empty() {
        true => lease
            .frame_mut(layout)
            .map_err(|e| e.to_string())
            .and_then(|mut f| source.fill(&mut f).map_err(|e| e.to_string())),
        false => crate::frame::FrameMut::new(index, layout, staging)
            .map_err(|e| e.to_string())
            .and_then(|mut f| source.fill(&mut f).map_err(|e| e.to_string())),
    };
    let written = Instant::now();
    let mut copied = None;
    let filled = match (filled, staging.is_empty()) {
        (Ok(f), false) => match lease.bytes_mut() {
            Ok(bytes) => {
                bytes.copy_from_slice(staging);
                copied = Some(Instant::now());
                Ok(f)
            }
            Err(e) => Err(e.to_string()),
        },
        (other, _) => other,
    };
    lease.set_write_time(started, written - started);
    Written {
        lease,
        started,
        written,
        copied,
        filled,
    }
}

/// Where frames are written: on the producer thread, or on a writer
/// thread one frame ahead.
enum Producer {
    Inline {
        source: Box<dyn Source>,
        staging: Vec<u8>,
        layout: FrameLayout,
        done: Option<Box<Written>>,
    },
    Ahead {
        jobs: Option<SyncSender<WriteLease>>,
        done: Receiver<Written>,
        thread: Option<JoinHandle<Box<dyn Source>>>,
        out: usize,
    },
}

/// The writer thread: fills each lease it is given, in order, and answers
/// with it. After a failure it writes nothing more (each later lease comes
/// back unwritten, with the first failure).
fn writer_thread(
    mut source: Box<dyn Source>,
    mut staging: Vec<u8>,
    layout: FrameLayout,
    jobs: Receiver<WriteLease>,
    done: SyncSender<Written>,
) -> Box<dyn Source> {
    let mut failed: Option<String> = None;
    for lease in jobs {
        let w = match &failed {
            None => write_frame(&mut *source, &mut staging, layout, lease),
            Some(first) => {
                let now = Instant::now();
                Written {
                    filled: Err(format!("frame {} not written: {first}", lease.frame())),
                    lease,
                    started: now,
                    written: now,
                    copied: None,
                }
            }
        };
        if let Err(e) = &w.filled {
            failed.get_or_insert_with(|| e.clone());
        }
        if done.send(w).is_err() {
            break;
        }
    }
    source
}

impl Producer {
    fn new(source: Box<dyn Source>, ahead: bool, host_copy: bool) -> Producer {
        let layout = source.layout();
        let staging = match host_copy {
            true => vec![0u8; layout.frame_len()],
            false => Vec::new(),
        };
        if !ahead {
            return Producer::Inline {
                source,
                staging,
                layout,
                done: None,
            };
        }
        // At most two frames are with the writer: the one it writes and
        // the next one, queued.
        let (jobs, jobs_rx) = mpsc::sync_channel(1);
        let (done_tx, done) = mpsc::sync_channel(2);
        let thread =
            std::thread::spawn(move || writer_thread(source, staging, layout, jobs_rx, done_tx));
        Producer::Ahead {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
            out: 0,
        }
    }

    /// Frames given and not taken back.
    fn pending(&self) -> usize {
        match self {
            Producer::Inline { done, .. } => usize::from(done.is_some()),
            Producer::Ahead { out, .. } => *out,
        }
    }

    /// Has `lease` written (now, or on the writer thread).
    fn give(&mut self, lease: WriteLease) -> Result<(), String> {
        match self {
            Producer::Inline {
                source,
                staging,
                layout,
                done,
            } => {
                *done = Some(Box::new(write_frame(
                    &mut **source,
                    staging,
                    *layout,
                    lease,
                )));
                Ok(())
            }
            Producer::Ahead { jobs, out, .. } => {
                if jobs.as_ref().is_none_or(|j| j.send(lease).is_err()) {
                    return Err("the camera thread stopped".to_string());
                }
                *out += 1;
                Ok(())
            }
        }
    }

    /// The oldest frame given, written (waits at most [`CAMERA_WAIT`]).
    fn take(&mut self) -> Result<Written, String> {
        match self {
            Producer::Inline { done, .. } => match done.take() {
                Some(w) => Ok(*w),
                None => Err("no frame given".into()),
            },
            Producer::Ahead { done, out, .. } => {
                let w = done.recv_timeout(CAMERA_WAIT).map_err(|e| match e {
                    RecvTimeoutError::Timeout => format!(
                        "the camera thread did not write a frame within {} s",
                        CAMERA_WAIT.as_secs()
                    ),
                    RecvTimeoutError::Disconnected => "the camera thread stopped".to_string(),
                })?;
                *out -= 1;
                Ok(w)
            }
        }
    }

    /// The source back, once the writer thread (if any) ended.
    fn finish(self) -> Result<Box<dyn Source>, String> {
        match self {
            Producer::Inline { source, .. } => Ok(source),
            Producer::Ahead {
                mut jobs,
                mut thread,
                done,
                ..
            } => {
                jobs.take();
                // Leases it still answered with go back to the ring unwritten.
                drop(done);
                match thread.take().map(JoinHandle::join) {
                    Some(Ok(source)) => Ok(source),
                    _ => Err("the camera thread panicked".to_string()),
                }
            }
        }
    }
}

/// A read lease for the checker thread, with the digest the source gave.
struct CheckJob {
    read: ReadLease,
    expected: Option<u64>,
}

/// The checker thread's answer for one [`CheckJob`].
struct CheckDone {
    frame: u64,
    slot: usize,
    result: Result<(), String>,
    ns: u64,
    ended: Instant,
}

/// The checker thread: checks each read lease and answers, until its
/// queue closes (or nobody listens). The lease is dropped before the
/// answer, which gives the slot back to the ring.
fn checker_thread(checker: Checker, jobs: Receiver<CheckJob>, done: SyncSender<CheckDone>) {
    for job in jobs {
        let (frame, slot) = (job.read.frame(), job.read.slot());
        let (result, ns) = checker.check(frame, job.read.bytes(), job.expected);
        drop(job.read);
        let answer = CheckDone {
            frame,
            slot,
            result,
            ns,
            ended: Instant::now(),
        };
        if done.send(answer).is_err() {
            return;
        }
    }
}

/// The checker thread's ends.
struct CheckerThread {
    jobs: Option<SyncSender<CheckJob>>,
    done: Receiver<CheckDone>,
    thread: Option<JoinHandle<()>>,
    out: usize,
}

impl CheckerThread {
    fn spawn(checker: Checker) -> CheckerThread {
        let (jobs, jobs_rx) = mpsc::sync_channel(1);
        let (done_tx, done) = mpsc::sync_channel(MAX_SLOTS + 1);
        let thread = std::thread::spawn(move || checker_thread(checker, jobs_rx, done_tx));
        CheckerThread {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
            out: 0,
        }
    }
}

/// Records a check's result.
fn record_check(v: &mut Verification, frame: u64, slot: usize, result: Result<(), String>) {
    match result {
        Ok(()) => v.readback_ok += 1,
        Err(e) => v.fail(format!("frame {frame} in slot {slot}: {e}")),
    }
}

/// The loop's state (see the module docs).
pub(crate) struct Run<'t> {
    pub(crate) ring: Ring,
    plan: Plan,
    pub(crate) t: Timings<'t>,
    pub(crate) v: Verification,
    /// Per slot: a finished frame the transport could not lend, checked
    /// through the slot's next write lease instead.
    unchecked: [Option<u64>; MAX_SLOTS],
    /// Per slot: the frame and the digest its source gave.
    digests: [Option<(u64, Option<u64>)>; MAX_SLOTS],
    /// Per slot: nanoseconds the producer spent acquiring its lease.
    acquire_ns: [u64; MAX_SLOTS],
    checker: Option<CheckerThread>,
    progress: Progress,
    pub(crate) first_start: Option<Instant>,
}

impl<'t> Run<'t> {
    /// The loop over `ring`, with `plan`.
    pub(crate) fn new(ring: Ring, plan: Plan, t: Timings<'t>, progress: Progress) -> Run<'t> {
        let checker = plan.overlap.then(|| CheckerThread::spawn(plan.checker));
        Run {
            ring,
            plan,
            t,
            v: Verification::default(),
            unchecked: [None; MAX_SLOTS],
            digests: [None; MAX_SLOTS],
            acquire_ns: [0; MAX_SLOTS],
            checker,
            progress,
            first_start: None,
        }
    }

    /// The ring, once the loop is done.
    pub(crate) fn into_ring(self) -> Ring {
        self.ring
    }

    /// Every frame of the plan from `source`; then the source back.
    pub(crate) fn frames(&mut self, source: Box<dyn Source>) -> Result<Box<dyn Source>, String> {
        let mut producer = Producer::new(source, self.plan.ahead, self.plan.host_copy);
        let result = self.all_frames(&mut producer);
        // Written frames not handed over after a failure are dropped with
        // their leases, which gives their slots back.
        let source = producer.finish();
        let checked = self.end_checker();
        result?;
        checked?;
        source
    }

    fn all_frames(&mut self, producer: &mut Producer) -> Result<(), String> {
        let depth = usize::from(self.plan.ahead);
        for frame in 0..self.plan.frames {
            self.collect_before(frame)?;
            let entered = Instant::now();
            let mut lease = self.ring.acquire()?;
            let taken = Instant::now();
            self.t
                .trace
                .span(Track::Producer, "acquire", frame, entered, taken - entered);
            self.acquire_ns[lease.slot()] = (taken - entered).as_nanos() as u64;
            self.check_through_lease(&mut lease)?;
            producer.give(lease)?;
            while producer.pending() > depth {
                let w = producer.take()?;
                self.hand_over(w)?;
            }
            self.progress
                .update((frame + 1).saturating_sub(self.ring.pending() as u64 + depth as u64));
        }
        while producer.pending() > 0 {
            let w = producer.take()?;
            self.hand_over(w)?;
        }
        while self.ring.pending() > 0 {
            let f = self.ring.wait_collect()?;
            self.finished(f)?;
        }
        self.progress.update(self.plan.frames);
        self.progress.finish();
        Ok(())
    }

    /// Collects what finished before `frame` is acquired (and, with the
    /// checker thread, the frame in the next frame's slot, so that its check
    /// runs beside this frame's write); records the producer's waits.
    fn collect_before(&mut self, frame: u64) -> Result<(), String> {
        let start = Instant::now();
        let (mut lend_ns, mut checker_ns) = (0, 0);
        let mut step = |run: &mut Run<'t>, f: Finished| -> Result<(), String> {
            let (l, c) = run.finished(f)?;
            lend_ns += l;
            checker_ns += c;
            Ok(())
        };
        self.ring.make_room()?;
        while let Some(f) = self.ring.collect()? {
            step(self, f)?;
        }
        let slots = self.ring.slots() as u64;
        if let Some(g) = (frame + 1)
            .checked_sub(slots)
            .filter(|_| self.checker.is_some())
        {
            let slot = (g % slots) as usize;
            while matches!(self.ring.state(slot), Some(SlotState::InFlight(r)) if r.frame <= g) {
                let f = self.ring.wait_collect()?;
                step(self, f)?;
            }
        }
        let began = Instant::now();
        self.take_answers(false)?;
        checker_ns += began.elapsed().as_nanos() as u64;
        let total = start.elapsed().as_nanos() as u64;
        let collect_ns = total.saturating_sub(lend_ns + checker_ns);
        self.t.collect.push(collect_ns);
        self.t.lend.push(lend_ns);
        self.t.checker.push(checker_ns);
        let waits = [
            ("collect wait", collect_ns),
            ("lend wait", lend_ns),
            ("checker wait", checker_ns),
        ];
        self.t.trace.producer_waits(frame, start, waits);
        Ok(())
    }

    /// Measures and verifies a finished frame, and has it checked; returns
    /// the nanoseconds spent lending it and handing it to the checker.
    fn finished(&mut self, f: Finished) -> Result<(u64, u64), String> {
        on_completion(&f, &mut self.t, &mut self.v, self.plan.checker);
        // Without the checker thread, the frame is checked through its
        // slot's next write lease, just before it is overwritten.
        let Some(c) = self.checker.as_mut() else {
            self.unchecked[f.slot()] = Some(f.frame());
            return Ok((0, 0));
        };
        let began = Instant::now();
        let read = self.ring.read(&f)?;
        let lend_ns = began.elapsed().as_nanos() as u64;
        let expected = match self.digests[f.slot()] {
            Some((frame, d)) if frame == f.frame() => d,
            _ => None,
        };
        let Some(read) = read else {
            // The transport cannot lend it now: checked through the lease.
            self.unchecked[f.slot()] = Some(f.frame());
            return Ok((lend_ns, 0));
        };
        let began = Instant::now();
        let job = CheckJob { read, expected };
        if c.jobs.as_ref().is_none_or(|j| j.send(job).is_err()) {
            return Err("the read-back checker stopped".into());
        }
        c.out += 1;
        Ok((lend_ns, began.elapsed().as_nanos() as u64))
    }

    /// Records a check on the producer thread that began at `at`.
    fn checked(
        &mut self,
        frame: u64,
        slot: usize,
        result: Result<(), String>,
        ns: u64,
        at: Instant,
    ) {
        record_check(&mut self.v, frame, slot, result);
        self.t.verify.push(ns);
        let d = Duration::from_nanos(ns);
        self.t.trace.span(Track::Producer, "check", frame, at, d);
    }

    /// Checks the slot's previous frame through `lease` where it could not
    /// be lent when it finished.
    fn check_through_lease(&mut self, lease: &mut WriteLease) -> Result<(), String> {
        let slot = lease.slot();
        let Some(prev) = lease.ticket().previous_frame() else {
            return Ok(());
        };
        if self.unchecked[slot] != Some(prev) {
            return Ok(());
        }
        self.unchecked[slot] = None;
        let expected = match self.digests[slot] {
            Some((frame, d)) if frame == prev => d,
            _ => None,
        };
        let at = Instant::now();
        let (result, ns) = self.plan.checker.check(prev, lease.bytes_mut()?, expected);
        self.checked(prev, slot, result, ns, at);
        Ok(())
    }

    /// Takes the checker thread's answers: those there (`block`: all of
    /// them).
    fn take_answers(&mut self, block: bool) -> Result<(), String> {
        let Some(c) = self.checker.as_mut() else {
            return Ok(());
        };
        while c.out > 0 {
            let d = match block {
                true => c.done.recv().map_err(|_| "the read-back checker stopped")?,
                false => match c.done.try_recv() {
                    Ok(d) => d,
                    Err(_) => break,
                },
            };
            c.out -= 1;
            record_check(&mut self.v, d.frame, d.slot, d.result);
            self.t.verify.push(d.ns);
            let ns = Duration::from_nanos(d.ns);
            self.t
                .trace
                .span_ending(Track::Checker, "check", d.frame, d.ended, ns);
        }
        Ok(())
    }

    /// Takes the checker's last answers and ends its thread.
    fn end_checker(&mut self) -> Result<(), String> {
        let answered = self.take_answers(true);
        let Some(mut c) = self.checker.take() else {
            return answered;
        };
        c.jobs.take();
        match c.thread.take().map(JoinHandle::join) {
            Some(Err(_)) => answered.and(Err("the read-back checker panicked".into())),
            _ => answered,
        }
    }

    /// Hands a written frame over, recording its camera, copy and
    /// hand-over spans.
    fn hand_over(&mut self, w: Written) -> Result<(), String> {
        let Written {
            lease,
            started,
            written,
            copied,
            filled,
        } = w;
        let filled = filled?;
        let (frame, slot) = (lease.frame(), lease.slot());
        self.first_start.get_or_insert(started);
        let track = match self.plan.ahead {
            true => Track::Camera,
            false => Track::Producer,
        };
        self.t
            .trace
            .span(track, "camera", frame, started, written - started);
        if let Some(copied) = copied {
            self.t
                .trace
                .span(track, "copy", frame, written, copied - written);
        }
        self.digests[slot] = Some((frame, filled.digest));
        let begin = Instant::now();
        let held = begin.saturating_duration_since(copied.unwrap_or(written));
        self.t.held_by_slot[slot] = Some((frame, held.as_nanos() as u64));
        self.ring.hand_over(lease)?;
        let end = Instant::now();
        let ns = self.acquire_ns[slot] + (end - begin).as_nanos() as u64;
        self.t.handover.push(ns);
        self.t
            .trace
            .span(Track::Producer, "handover", frame, begin, end - begin);
        Ok(())
    }

    /// Checks the last frames the transport could not lend, through write
    /// leases dropped unwritten after (the slots go back to the ring).
    pub(crate) fn check_the_rest(&mut self) -> Result<(), String> {
        if self.unchecked.iter().all(Option::is_none) {
            return Ok(());
        }
        let mut held = Vec::with_capacity(self.ring.slots());
        for _ in 0..self.ring.slots() {
            let mut lease = self.ring.acquire()?;
            self.check_through_lease(&mut lease)?;
            held.push(lease);
        }
        Ok(())
    }
}

/// Verifies and measures one finished frame.
fn on_completion(f: &Finished, t: &mut Timings, v: &mut Verification, checker: Checker) {
    let (c, rec) = (&f.completion, &f.rec);
    if !checker.counts_consumer() || c.mismatches == 0 {
        v.consumer_ok += 1;
    } else {
        v.fail(format!(
            "frame {} in slot {}: consumer saw {} byte(s) that differ from the camera pattern",
            c.frame, c.slot, c.mismatches
        ));
    }
    let latency = c.finished.saturating_duration_since(rec.started).as_nanos() as u64;
    let process = c.process.as_nanos() as u64;
    let queued = f.queued.as_nanos() as u64;
    let held = match t.held_by_slot.get_mut(c.slot).and_then(Option::take) {
        Some((frame, ns)) if frame == c.frame => ns,
        _ => 0,
    };
    t.latency.push(latency);
    t.write.push(rec.write_ns);
    t.process.push(process);
    t.busy.push(c.busy.as_nanos() as u64);
    t.queued.push(queued);
    t.held.push(held);
    t.overhead.push(
        latency
            .saturating_sub(rec.write_ns)
            .saturating_sub(held)
            .saturating_sub(process)
            .saturating_sub(queued),
    );
    t.last_finished = Some(c.finished);
    t.trace.consumer(c.frame, rec.signalled, c.finished, c.busy);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::frame::{FrameGeometry, FrameMut};
    use crate::source::SourceError;
    use crate::transport::host::{Fault, HostReference};

    /// A source that fails on its second frame.
    struct Flaky(FrameLayout);

    impl Source for Flaky {
        fn describe(&self) -> String {
            "flaky".into()
        }
        fn layout(&self) -> FrameLayout {
            self.0
        }
        fn fill(&mut self, frame: &mut FrameMut<'_>) -> Result<Filled, SourceError> {
            match frame.index() {
                1 => Err(SourceError::Ended { frames: 1 }),
                i => {
                    frame.bytes_mut().fill(i as u8);
                    Ok(Filled::default())
                }
            }
        }
    }

    /// After a failed write the writer thread writes nothing more but
    /// answers every lease it was given (with the first failure); the
    /// leases dropped unwritten give their slots back, and the ring hands
    /// the same frames out again.
    #[test]
    fn the_writer_answers_every_lease_after_a_failure() {
        let layout = FrameLayout::packed(4, 2, crate::frame::PixelFormat::Rgba8).unwrap();
        let g = FrameGeometry {
            stride: 16,
            rows: 2,
        };
        let mut ring = Ring::new(HostReference::new(g, 3, Fault::None)).unwrap();
        let mut p = Producer::new(Box::new(Flaky(layout)), true, false);
        for _ in 0..3 {
            p.give(ring.acquire().unwrap()).unwrap();
        }
        let answers: Vec<Written> = (0..3).map(|_| p.take().unwrap()).collect();
        assert!(answers[0].filled.is_ok());
        let first = answers[1].filled.as_ref().unwrap_err().clone();
        let third = answers[2].filled.as_ref().unwrap_err();
        assert!(third.contains("frame 2 not written") && third.contains(&first));
        let mut answers = answers.into_iter();
        let w = answers.next().unwrap();
        ring.hand_over(w.lease).unwrap();
        drop(answers);
        // Frames 1 and 2 come out again, same slots.
        let again: Vec<WriteLease> = (0..2).map(|_| ring.acquire().unwrap()).collect();
        let again: Vec<u64> = again.iter().map(WriteLease::frame).collect();
        assert_eq!(again, [1, 2]);
        assert_eq!(p.finish().unwrap().describe(), "flaky");
    }
}
