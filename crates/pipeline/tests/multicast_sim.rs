//! `multicast::cuda::CudaFanout` on the simulator: the simulator's memfd
//! exporter as the producer, each consumer its own CUDA stream(s) in one
//! simulated context, verifying every frame with the project's
//! check-and-invert kernel on its own device copy of the slot.
#![cfg(feature = "sim")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use tegra_interop::core::WaitParams;
use tegra_interop::driver::{Context, ExternalSemaphore, Stream};
use tegra_interop_pipeline::camera::TestPattern;
use tegra_interop_pipeline::consumer::{
    twin, CheckInvert, CopyWith, DeviceFrame, FnWork, FrameWork, Placement, WorkError,
};
use tegra_interop_pipeline::frame::FrameLayout;
use tegra_interop_pipeline::multicast::cuda::CudaFanout;
use tegra_interop_pipeline::multicast::ring::{MulticastRing, Polled};
use tegra_interop_pipeline::multicast::{
    ConsumerEvent, ConsumerId, ConsumerSpec, CudaWork, DisconnectReason, FanoutTransport, Mode,
    MulticastError, Queued,
};
use tegra_interop_pipeline::sim::Sim;
use tegra_interop_pipeline::transport::export::{
    import_timeline, ExportedTimeline, Exporter, SimExporter, SimTimeline,
};
use tegra_interop_pipeline::transport::{Completion, FrameGeometry};

const G: FrameGeometry = FrameGeometry {
    stride: 64,
    rows: 8,
};
const WAIT: Duration = Duration::from_secs(10);
const COPY: Placement = Placement::DeviceCopy(CopyWith::Engines);

/// Every test holds this while it runs: the descriptor ledger test counts
/// the process's open descriptors, so nothing else may open any meanwhile.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The tests' lock, a simulated driver with the consumer kernels' twins,
/// and its context (dropped in reverse: the lock last).
fn sim() -> (MutexGuard<'static, ()>, Sim, Context) {
    let lock = serial();
    let sim = Sim::new().unwrap();
    twin::register(&sim);
    let ctx = Context::new(sim.backend(), 0).unwrap();
    (lock, sim, ctx)
}

fn check_invert(limit: Duration) -> ConsumerSpec<CudaWork> {
    ConsumerSpec::fifo(CudaWork::new(CheckInvert::boxed(), COPY).unwrap(), limit)
}

/// Writes frame `frame` (its test pattern; one byte wrong when `damaged`)
/// into `slot` as the slot's use `use_`, and signals *ready*.
fn produce(
    t: &mut dyn FanoutTransport<Work = CudaWork>,
    slot: usize,
    frame: u64,
    use_: u64,
    damaged: bool,
) {
    let mut memory = t.take_slot(slot, frame, use_).unwrap();
    let bytes = memory.bytes_mut().unwrap();
    TestPattern::new(frame, G.stride).fill(bytes);
    if damaged {
        bytes[5] ^= 0x40;
    }
    t.signal_ready(slot, use_, memory).unwrap();
}

/// Waits (bounded) for consumer `id`'s next completion.
fn next(t: &mut dyn FanoutTransport<Work = CudaWork>, id: usize) -> Completion {
    let start = Instant::now();
    loop {
        if let Some(c) = t.try_complete(id).unwrap() {
            return c;
        }
        assert!(
            start.elapsed() < WAIT,
            "consumer {id}: no completion within {WAIT:?}"
        );
        std::thread::yield_now();
    }
}

/// The producer's side of the fence rule, by hand: slots round robin
/// (skipping retired ones), each slot's uses, and which use of each slot
/// each consumer took last (0: none, or released).
struct Driver {
    next_slot: usize,
    uses: Vec<u64>,
    retired: Vec<bool>,
    taken: Vec<[u64; 8]>,
    queued: Vec<usize>,
}

impl Driver {
    fn new(t: &dyn FanoutTransport<Work = CudaWork>) -> Driver {
        let slots = t.info().slots;
        Driver {
            next_slot: 0,
            uses: vec![0; slots],
            retired: vec![false; slots],
            taken: vec![[0; 8]; slots],
            queued: vec![0; 8],
        }
    }

    /// Frame `frame` to every consumer in `ids`, in the next slot not
    /// retired, after waiting for each consumer that took an earlier use of
    /// the slot to release it; `damaged`: one byte wrong. Its slot.
    fn frame(
        &mut self,
        t: &mut dyn FanoutTransport<Work = CudaWork>,
        ids: &[usize],
        frame: u64,
        damaged: bool,
    ) -> usize {
        let slot = loop {
            let s = self.next_slot;
            self.next_slot = (s + 1) % self.uses.len();
            if !self.retired[s] {
                break s;
            }
        };
        for id in 0..8 {
            let held = self.taken[slot][id];
            if held > 0 && t.released(id, slot).unwrap() < held {
                assert!(
                    t.wait_released(id, slot, held, WAIT).unwrap(),
                    "consumer {id}, slot {slot}"
                );
            }
            self.taken[slot][id] = 0;
        }
        self.uses[slot] += 1;
        let use_ = self.uses[slot];
        produce(t, slot, frame, use_, damaged);
        for &id in ids {
            t.queue(id, Queued { frame, slot, use_ }).unwrap();
            self.taken[slot][id] = use_;
            self.queued[id] += 1;
        }
        slot
    }

    /// Every completion of consumer `id` still to come.
    fn collect(
        &mut self,
        t: &mut dyn FanoutTransport<Work = CudaWork>,
        id: usize,
        into: &mut Vec<Completion>,
    ) {
        while into.len() < self.queued[id] {
            into.push(next(t, id));
        }
    }
}

/// Checks that `done` is exactly `frames`, in order, each verified (no
/// mismatch) but `damaged`, which has exactly one.
fn verified(done: &[Completion], frames: std::ops::Range<u64>, damaged: Option<u64>, who: &str) {
    let got: Vec<u64> = done.iter().map(|c| c.frame).collect();
    assert_eq!(got, frames.collect::<Vec<_>>(), "{who}: frames");
    for c in done {
        let want = u64::from(Some(c.frame) == damaged);
        assert_eq!(c.mismatches, want, "{who}: frame {} mismatches", c.frame);
    }
}

/// Two consumers, each its own streams and imports, verify every frame of
/// a ring of four on their own device copies; the one damaged frame is
/// caught by both, and only it. The slot is never written by a consumer:
/// the producer's read-back of each slot is the frame it wrote.
#[test]
fn two_consumers_on_their_own_streams_verify_every_frame() {
    let (_serial, _sim, ctx) = sim();
    let mut t = CudaFanout::open(&ctx, SimExporter, G, 4).unwrap();
    assert_eq!(t.exporter_name(), "sim-memfd");
    t.attach(0, check_invert(WAIT)).unwrap();
    t.attach(1, check_invert(WAIT)).unwrap();
    let mut d = Driver::new(&t);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for frame in 0..40 {
        d.frame(&mut t, &[0, 1], frame, frame == 13);
        while let Some(c) = t.try_complete(0).unwrap() {
            a.push(c);
        }
    }
    d.collect(&mut t, 0, &mut a);
    d.collect(&mut t, 1, &mut b);
    verified(&a, 0..40, Some(13), "consumer 0");
    verified(&b, 0..40, Some(13), "consumer 1");
    for slot in 0..4 {
        let mut back = vec![0u8; G.frame_len()];
        t.read_frame(slot, &mut back).unwrap();
        let mut want = vec![0u8; G.frame_len()];
        TestPattern::new(36 + slot as u64, G.stride).fill(&mut want);
        assert!(back == want, "slot {slot} was written by a consumer");
    }
    t.detach(0).unwrap();
    t.detach(1).unwrap();
    Box::new(t).close().unwrap();
}

/// A consumer attached while the ring runs imports the slots then and
/// takes frames from then on; the first consumer is never held up by it.
/// Its release fences start at 0, and it detaches cleanly.
#[test]
fn a_late_consumer_imports_at_attach_and_takes_the_next_frames() {
    let (_serial, _sim, ctx) = sim();
    let mut t = CudaFanout::open(&ctx, SimExporter, G, 3).unwrap();
    t.attach(0, check_invert(WAIT)).unwrap();
    let mut d = Driver::new(&t);
    for frame in 0..7 {
        d.frame(&mut t, &[0], frame, false);
    }
    t.attach(5, check_invert(WAIT)).unwrap();
    assert_eq!(t.attached(), 2);
    for slot in 0..3 {
        assert_eq!(t.released(5, slot).unwrap(), 0);
    }
    for frame in 7..20 {
        d.frame(&mut t, &[0, 5], frame, false);
    }
    let (mut a, mut late) = (Vec::new(), Vec::new());
    d.collect(&mut t, 0, &mut a);
    // Detached once its uses are released (as the ring does), before its
    // completions were taken: they stay there to be taken.
    for slot in 0..3 {
        let held = d.taken[slot][5];
        assert!(t.wait_released(5, slot, held, WAIT).unwrap());
        d.taken[slot][5] = 0;
    }
    t.detach(5).unwrap();
    d.collect(&mut t, 5, &mut late);
    verified(&a, 0..20, None, "first consumer");
    verified(&late, 7..20, None, "late consumer");
    assert!(
        t.try_complete(5).unwrap().is_none(),
        "a detached consumer finishes nothing more"
    );
    for frame in 20..26 {
        d.frame(&mut t, &[0], frame, false);
    }
    d.collect(&mut t, 0, &mut a);
    verified(&a, 0..26, None, "first consumer");
    Box::new(t).close().unwrap();
}

/// In-place work is refused when the work is made (it would write the
/// slot the others read), a read-back by this transport, both typed; an
/// id past the places and an id attached twice are misuse.
#[test]
fn placements_that_would_write_the_slot_or_are_not_offered_are_refused() {
    let (_serial, _sim, ctx) = sim();
    let mut t = CudaFanout::open(&ctx, SimExporter, G, 2).unwrap();
    assert!(matches!(
        CudaWork::new(CheckInvert::boxed(), Placement::InPlace),
        Err(MulticastError::InPlace { .. })
    ));
    let read_back = CudaWork::new(CheckInvert::boxed(), Placement::ReadBack).unwrap();
    let e = t
        .attach(0, ConsumerSpec::mailbox(read_back, WAIT))
        .unwrap_err();
    assert!(e.to_string().contains("DeviceCopy"), "{e}");
    assert!(t.attach(8, check_invert(WAIT)).is_err());
    t.attach(1, check_invert(WAIT)).unwrap();
    assert!(t.attach(1, check_invert(WAIT)).is_err());
    assert!(CudaFanout::open(&ctx, SimExporter, G, 0).is_err());
    assert!(CudaFanout::open(&ctx, SimExporter, G, 9).is_err());
}

/// Work that makes its stream wait, from frame `stop_at` on, for a
/// semaphore nobody signals (until the test does): a consumer stopped
/// mid-run. It checks nothing.
fn stalling_work(blocker: ExternalSemaphore, stop_at: u64) -> Box<dyn FrameWork> {
    Box::new(FnWork::new("stall", move |frame, stream| {
        if frame.number() >= stop_at {
            stream
                .wait(&blocker, WaitParams::timeline(1))
                .map_err(|e| WorkError::driver("waiting for the blocker", e))?;
        }
        Ok(())
    }))
}

/// A consumer whose stream stops (waits for a semaphore never signalled)
/// holds its slot: its release of it does not come, while the other
/// consumer goes on and verifies every frame over the other slots. Once
/// the semaphore comes, its release does too and everything drains.
#[test]
fn a_stopped_consumer_holds_only_its_slot_and_drains_once_released() {
    let (_serial, _sim, ctx) = sim();
    let mut t = CudaFanout::open(&ctx, SimExporter, G, 4).unwrap();
    let blocker_host: SimTimeline = t.exporter_mut().export_timeline(0).unwrap();
    let blocker = import_timeline(&ctx, blocker_host.export_fd().unwrap()).unwrap();
    t.attach(0, check_invert(WAIT)).unwrap();
    let stall = CudaWork::new(stalling_work(blocker, 2), COPY).unwrap();
    t.attach(1, ConsumerSpec::mailbox(stall, Duration::from_millis(200)))
        .unwrap();
    let mut d = Driver::new(&t);
    d.frame(&mut t, &[0, 1], 0, false);
    d.frame(&mut t, &[0, 1], 1, false);
    d.frame(&mut t, &[0, 1], 2, false); // consumer 1 stops here, holding slot 2
    let mut a = Vec::new();
    let mut stopped = Vec::new();
    stopped.push(next(&mut t, 1));
    stopped.push(next(&mut t, 1));
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        t.try_complete(1).unwrap().is_none(),
        "the stopped consumer finished frame 2"
    );
    assert!(!t
        .wait_released(1, 2, 1, Duration::from_millis(100))
        .unwrap());
    // The ring would retire slot 2 now (consumer 1 holds use 1 of it);
    // the other consumer goes on over slots 3, 0 and 1.
    d.retired[2] = true;
    for frame in 3..15 {
        assert_ne!(d.frame(&mut t, &[0], frame, false), 2);
    }
    d.collect(&mut t, 0, &mut a);
    verified(&a, 0..15, None, "the consumer that goes on");
    assert!(a.iter().all(|c| c.slot != 2 || c.frame == 2));
    assert_eq!(t.released(1, 2).unwrap(), 0, "its fence of the held slot");
    blocker_host.signal(1).unwrap();
    assert!(
        t.wait_released(1, 2, 1, WAIT).unwrap(),
        "released once unblocked"
    );
    stopped.push(next(&mut t, 1));
    assert_eq!(
        stopped.iter().map(|c| c.frame).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    Box::new(t).close().unwrap();
}

/// A consumer whose stream never drains is not freed under the device:
/// close waits a bounded time, leaks it and says so (a typed timeout);
/// the others were stopped cleanly. Nothing panics.
#[test]
fn close_leaks_a_consumer_that_never_drains_and_says_so() {
    let (_serial, _sim, ctx) = sim();
    let mut t = CudaFanout::open(&ctx, SimExporter, G, 2).unwrap();
    let blocker_host: SimTimeline = t.exporter_mut().export_timeline(0).unwrap();
    let blocker = import_timeline(&ctx, blocker_host.export_fd().unwrap()).unwrap();
    t.attach(0, check_invert(WAIT)).unwrap();
    let stall = CudaWork::new(stalling_work(blocker, 0), COPY).unwrap();
    t.attach(1, ConsumerSpec::fifo(stall, Duration::from_millis(100)))
        .unwrap();
    let mut d = Driver::new(&t);
    d.frame(&mut t, &[0, 1], 0, false);
    let mut a = Vec::new();
    d.collect(&mut t, 0, &mut a);
    let start = Instant::now();
    let e = Box::new(t).close().unwrap_err();
    assert!(e.is_timeout(), "{e}");
    assert!(e.to_string().contains("1 consumer"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(30));
    drop(blocker_host);
}

// ---- The "Done when" tests, through the multicast ring ----------

type SimRing = MulticastRing<CudaFanout<SimExporter>>;

/// A ring of `slots` over the simulator's exporter.
fn ring(ctx: &Context, slots: usize) -> SimRing {
    MulticastRing::new(CudaFanout::open(ctx, SimExporter, G, slots).unwrap()).unwrap()
}

/// Check-and-invert that also keeps its stream busy for `delay` per frame
/// (a host function on the stream after the kernel): a slow consumer that
/// still verifies every frame it takes.
struct Slowed {
    inner: CheckInvert,
    delay: Duration,
    /// From this frame on the stream also waits for `blocker` (a consumer
    /// stopped mid-run), when there is one.
    stop: Option<(u64, ExternalSemaphore)>,
}

impl Slowed {
    fn boxed(delay: Duration, stop: Option<(u64, ExternalSemaphore)>) -> Box<dyn FrameWork> {
        Box::new(Slowed {
            inner: CheckInvert::new(),
            delay,
            stop,
        })
    }
}

impl FrameWork for Slowed {
    fn name(&self) -> &str {
        "slowed check-and-invert"
    }
    fn prepare(
        &mut self,
        ctx: &Context,
        layout: FrameLayout,
        slots: usize,
        placement: Placement,
    ) -> Result<(), WorkError> {
        self.inner.prepare(ctx, layout, slots, placement)
    }
    fn queue(&mut self, frame: &DeviceFrame<'_>, stream: &Stream) -> Result<(), WorkError> {
        if let Some((at, blocker)) = &self.stop {
            if frame.number() >= *at {
                stream
                    .wait(blocker, WaitParams::timeline(1))
                    .map_err(|e| WorkError::driver("waiting for the blocker", e))?;
            }
        }
        self.inner.queue(frame, stream)?;
        if !self.delay.is_zero() {
            let delay = self.delay;
            stream
                .launch_host_fn(move || std::thread::sleep(delay))
                .map_err(|e| WorkError::driver("queueing the delay", e))?;
        }
        Ok(())
    }
    fn finished(&mut self, slot: usize, frame: u64) -> Result<u64, WorkError> {
        self.inner.finished(slot, frame)
    }
}

fn spec(mode: Mode, work: Box<dyn FrameWork>, limit: Duration) -> ConsumerSpec<CudaWork> {
    let work = CudaWork::new(work, COPY).unwrap();
    match mode {
        Mode::Fifo => ConsumerSpec::fifo(work, limit),
        Mode::Mailbox => ConsumerSpec::mailbox(work, limit),
    }
}

/// Writes the next frame (its test pattern; one byte wrong for frame
/// `damaged`) and hands it over; its number.
fn produce_one(r: &mut SimRing, damaged: Option<u64>) -> u64 {
    let mut lease = r.acquire().unwrap();
    let frame = lease.frame();
    let bytes = lease.bytes_mut().unwrap();
    TestPattern::new(frame, G.stride).fill(bytes);
    if damaged == Some(frame) {
        bytes[9] ^= 0x01;
    }
    r.hand_over(lease).unwrap();
    frame
}

/// What a run saw: each consumer's finished frames (frame, mismatches) and
/// the events.
#[derive(Default)]
struct Seen {
    finished: std::collections::BTreeMap<ConsumerId, Vec<(u64, u64)>>,
    events: Vec<(Instant, ConsumerEvent)>,
}

impl Seen {
    fn take(&mut self, polled: Vec<Polled>) {
        for p in polled {
            match p {
                Polled::Finished(d) => self
                    .finished
                    .entry(d.consumer)
                    .or_default()
                    .push((d.completion.frame, d.completion.mismatches)),
                Polled::Event(e) => self.events.push((Instant::now(), e)),
            }
        }
    }

    fn frames(&self, c: ConsumerId) -> Vec<u64> {
        self.finished
            .get(&c)
            .map_or(Vec::new(), |v| v.iter().map(|f| f.0).collect())
    }

    /// Every frame `c` finished verified: no mismatch but in `damaged`,
    /// exactly one there.
    fn all_verified(&self, c: ConsumerId, damaged: Option<u64>) {
        for &(frame, m) in self.finished.get(&c).into_iter().flatten() {
            assert_eq!(m, u64::from(Some(frame) == damaged), "{c}: frame {frame}");
        }
    }
}

/// Four consumers (two FIFO, two mailbox), each its own streams: every
/// FIFO consumer finishes every frame in order, verified (the damaged
/// frame caught, only it); each mailbox consumer finishes an increasing
/// subset, each verified: it finished every frame it took, and took or
/// skipped every frame.
#[test]
fn four_consumers_two_fifo_two_mailbox_each_verify_their_frames() {
    let (_serial, _sim, ctx) = sim();
    let mut r = ring(&ctx, 8);
    let fifo =
        [Mode::Fifo, Mode::Fifo].map(|m| r.attach(spec(m, CheckInvert::boxed(), WAIT)).unwrap());
    let slow = Duration::from_millis(2);
    let mail = [0, 1].map(|_| {
        r.attach(spec(Mode::Mailbox, Slowed::boxed(slow, None), WAIT))
            .unwrap()
    });
    let (frames, damaged) = (80, Some(41));
    let mut seen = Seen::default();
    for _ in 0..frames {
        produce_one(&mut r, damaged);
        seen.take(r.poll().unwrap());
    }
    seen.take(r.drain(WAIT).unwrap());
    for c in fifo {
        assert_eq!(seen.frames(c), (0..frames).collect::<Vec<_>>(), "{c}");
        seen.all_verified(c, damaged);
        assert_eq!(r.report(c).unwrap().mismatches, 1);
    }
    for c in mail {
        let got = seen.frames(c);
        assert!(got.windows(2).all(|w| w[0] < w[1]), "{c}: {got:?}");
        assert!(!got.is_empty());
        seen.all_verified(c, damaged);
        let s = r.report(c).unwrap().stats;
        assert_eq!(s.taken, got.len() as u64, "{c}: {s:?}");
        assert_eq!(s.taken + s.skipped, frames, "{c}: {s:?}");
        assert_eq!(
            s.stalls, 0,
            "{c}: a mailbox consumer made the producer wait"
        );
    }
    r.close().unwrap();
}

/// A mailbox consumer more than ten times slower than the producer (the
/// producer paced at 2 ms a frame, the consumer's stream busy 50 ms a
/// frame) never makes the producer wait (the ring counts no stall for it,
/// and the run takes the producer's own time, far from the 3 s that
/// waiting for its every frame would take), and counts the frames it
/// skipped. A FIFO consumer beside it finishes every frame. The bounds
/// leave room for a slow machine (the CI's qemu run).
#[test]
fn a_slow_mailbox_consumer_never_slows_the_producer_and_counts_its_skips() {
    let (_serial, _sim, ctx) = sim();
    let mut r = ring(&ctx, 4);
    let fast = r
        .attach(spec(Mode::Fifo, CheckInvert::boxed(), WAIT))
        .unwrap();
    let (period, frames) = (Duration::from_millis(2), 60u64);
    let delay = period * 25;
    let slow = r
        .attach(spec(Mode::Mailbox, Slowed::boxed(delay, None), WAIT))
        .unwrap();
    let mut seen = Seen::default();
    let start = Instant::now();
    for f in 0..frames {
        produce_one(&mut r, None);
        seen.take(r.poll().unwrap());
        if let Some(left) = (start + period * (f as u32 + 1)).checked_duration_since(Instant::now())
        {
            std::thread::sleep(left);
        }
    }
    let produced_in = start.elapsed();
    seen.take(r.drain(WAIT).unwrap());
    let waiting_for_it = delay * frames as u32;
    assert!(
        produced_in < waiting_for_it / 2,
        "{produced_in:?} against {waiting_for_it:?}"
    );
    let s = r.report(slow).unwrap().stats;
    assert_eq!(s.stalls, 0, "{s:?}");
    assert!(
        s.skipped >= frames / 2,
        "it skipped only {}: {s:?}",
        s.skipped
    );
    assert_eq!(s.taken, seen.frames(slow).len() as u64, "{s:?}");
    assert_eq!(s.taken + s.skipped, frames, "{s:?}");
    seen.all_verified(slow, None);
    assert_eq!(seen.frames(fast), (0..frames).collect::<Vec<_>>());
    seen.all_verified(fast, None);
    r.close().unwrap();
}

/// A FIFO consumer stopped mid-run (from frame 5 its stream waits for a
/// semaphore nobody signals) is disconnected with a typed event within its
/// limit, its slot is retired, and the three others finish and verify
/// every frame. Once the semaphore comes its release does too and the
/// slot is restored.
#[test]
fn a_consumer_stopped_mid_run_is_disconnected_within_its_limit_and_the_others_go_on() {
    let (_serial, _sim, ctx) = sim();
    let mut r = ring(&ctx, 8);
    let blocker_host: SimTimeline = SimExporter.export_timeline(0).unwrap();
    let blocker = import_timeline(&ctx, blocker_host.export_fd().unwrap()).unwrap();
    let limit = Duration::from_millis(300);
    let others: Vec<ConsumerId> = [Mode::Fifo, Mode::Fifo, Mode::Mailbox]
        .into_iter()
        .map(|m| r.attach(spec(m, CheckInvert::boxed(), WAIT)).unwrap())
        .collect();
    let stopped = r
        .attach(spec(
            Mode::Fifo,
            Slowed::boxed(Duration::ZERO, Some((5, blocker))),
            limit,
        ))
        .unwrap();
    let (frames, damaged) = (60u64, Some(30));
    let mut seen = Seen::default();
    for _ in 0..frames {
        produce_one(&mut r, damaged);
        seen.take(r.poll().unwrap());
    }
    seen.take(r.drain(WAIT).unwrap());
    let waited = seen
        .events
        .iter()
        .find_map(|(_, e)| match e {
            ConsumerEvent::Disconnected {
                consumer,
                reason: DisconnectReason::Timeout { frame: 5, waited },
            } if *consumer == stopped => Some(*waited),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no timeout disconnect of {stopped}: {:?}", seen.events));
    assert!(
        waited >= limit && waited < limit + Duration::from_secs(2),
        "{waited:?}"
    );
    let retired: Vec<usize> = seen
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            ConsumerEvent::SlotRetired { slot, consumer, .. } if *consumer == stopped => {
                Some(*slot)
            }
            _ => None,
        })
        .collect();
    assert!(!retired.is_empty(), "{:?}", seen.events);
    assert!(!r.is_attached(stopped));
    assert_eq!(seen.frames(stopped), (0..5).collect::<Vec<_>>());
    for &c in &others[..2] {
        assert_eq!(seen.frames(c), (0..frames).collect::<Vec<_>>(), "{c}");
        seen.all_verified(c, damaged);
    }
    seen.all_verified(others[2], damaged);
    // The fence comes: the slot goes back to the pool.
    blocker_host.signal(1).unwrap();
    let deadline = Instant::now() + WAIT;
    while !seen
        .events
        .iter()
        .any(|(_, e)| matches!(e, ConsumerEvent::SlotRestored { .. }))
    {
        assert!(
            Instant::now() < deadline,
            "no slot restored: {:?}",
            seen.events
        );
        seen.take(r.wait_poll(Duration::from_millis(20)).unwrap());
    }
    produce_one(&mut r, None);
    seen.take(r.drain(WAIT).unwrap());
    r.close().unwrap();
}

/// A consumer of a schedule: its id, mode, first frame and last frame
/// (`None`: it took none).
type Span = (ConsumerId, Mode, u64, Option<u64>);

/// One step of a random schedule: `gap` frames, then an attach (FIFO or
/// mailbox) or the detach of one of the consumers attached.
#[derive(Clone, Copy, Debug)]
struct Step {
    gap: u8,
    attach: bool,
    pick: u8,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0u8..5, any::<bool>(), any::<u8>()).prop_map(|(gap, attach, pick)| Step {
            gap,
            attach,
            pick,
        }),
        1..10,
    )
}

/// Runs `steps` over a ring of eight on the simulator, one FIFO consumer
/// attached throughout; the ring checks every release value it reads
/// against the uses the consumer took (a wrong one is a typed
/// `MulticastError::Fence`), so the run itself is the check that the
/// transport's fence values stay exact across attach and detach. Returns
/// what was seen and, per consumer, its first and last frame.
fn run_schedule(steps: &[Step]) -> (Seen, Vec<Span>, u64) {
    let (_serial, _sim, ctx) = sim();
    let mut r = ring(&ctx, 8);
    let mut seen = Seen::default();
    let mut modes = vec![(
        r.attach(spec(Mode::Fifo, CheckInvert::boxed(), WAIT))
            .unwrap(),
        Mode::Fifo,
    )];
    let mut attached = vec![modes[0].0];
    let mut frames = 0u64;
    for s in steps {
        for _ in 0..s.gap {
            produce_one(&mut r, None);
            frames += 1;
            seen.take(r.poll().unwrap());
        }
        if s.attach {
            let mode = if s.pick % 2 == 0 {
                Mode::Fifo
            } else {
                Mode::Mailbox
            };
            match r.attach(spec(mode, CheckInvert::boxed(), WAIT)) {
                Ok(c) => {
                    modes.push((c, mode));
                    attached.push(c);
                }
                Err(MulticastError::Full | MulticastError::Capacity { .. }) => {}
                Err(e) => panic!("attach: {e}"),
            }
        } else if attached.len() > 1 {
            let c = attached.remove(1 + usize::from(s.pick) % (attached.len() - 1));
            r.detach(c).unwrap();
        }
        seen.take(r.poll().unwrap());
    }
    produce_one(&mut r, None);
    frames += 1;
    seen.take(r.drain(WAIT).unwrap());
    r.close().unwrap();
    let spans = modes
        .into_iter()
        .map(|(c, mode)| {
            let first = seen.events.iter().find_map(|(_, e)| match e {
                ConsumerEvent::Attached {
                    consumer,
                    first_frame,
                } if *consumer == c => Some(*first_frame),
                _ => None,
            });
            let last = seen.events.iter().find_map(|(_, e)| match e {
                ConsumerEvent::Detached {
                    consumer,
                    last_frame,
                } if *consumer == c => Some(*last_frame),
                _ => None,
            });
            (c, mode, first.unwrap(), last.unwrap_or(Some(frames - 1)))
        })
        .collect();
    (seen, spans, frames)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// Late attach and detach at random frames: no fence value the ring
    /// reads is off, every FIFO consumer finishes exactly the frames from
    /// its attach to its detach (verified), every mailbox consumer an
    /// increasing subset of them (verified), and the first consumer every
    /// frame.
    #[test]
    fn attach_and_detach_at_random_frames_keep_every_fence_exact(steps in steps()) {
        let (seen, spans, frames) = run_schedule(&steps);
        for (c, mode, first, last) in spans {
            let got = seen.frames(c);
            seen.all_verified(c, None);
            let Some(last) = last else {
                prop_assert!(got.is_empty(), "{}: {:?}", c, got);
                continue;
            };
            match mode {
                Mode::Fifo => prop_assert_eq!(got, (first..=last).collect::<Vec<_>>(), "{}", c),
                Mode::Mailbox => prop_assert!(
                    got.windows(2).all(|w| w[0] < w[1]) && got.iter().all(|f| (first..=last).contains(f)),
                    "{}: {:?} outside {}..={}", c, got, first, last
                ),
            }
        }
        prop_assert!(frames >= 1);
    }
}

/// The descriptors open in this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Every descriptor the transport hands out is consumed exactly once: after
/// attaches (a late one too), a detach, frames and the close, and the
/// simulated driver gone, the process has the descriptors it had before.
#[test]
fn every_descriptor_is_consumed_once_and_none_is_left_open() {
    let serial = serial();
    let before = open_fds();
    {
        let sim = Sim::new().unwrap();
        twin::register(&sim);
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let mut t = CudaFanout::open(&ctx, SimExporter, G, 3).unwrap();
        t.attach(0, check_invert(WAIT)).unwrap();
        let mut d = Driver::new(&t);
        for frame in 0..5 {
            d.frame(&mut t, &[0], frame, false);
        }
        t.attach(1, check_invert(WAIT)).unwrap();
        for frame in 5..12 {
            d.frame(&mut t, &[0, 1], frame, false);
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        d.collect(&mut t, 0, &mut a);
        d.collect(&mut t, 1, &mut b);
        verified(&a, 0..12, None, "consumer 0");
        verified(&b, 5..12, None, "consumer 1");
        t.detach(1).unwrap();
        Box::new(t).close().unwrap();
    }
    assert_eq!(open_fds(), before, "descriptors left open");
    drop(serial);
}
