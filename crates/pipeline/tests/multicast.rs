//! The multicast ring on the host reference transport: four consumers
//! (two FIFO, two mailbox) verifying frames, a slow mailbox consumer that
//! never stalls the producer, late attach and detach at random frames with
//! exact fence values (a property test), and a consumer stopped mid-run,
//! disconnected at its limit while the others verify every frame.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tegra_interop_pipeline::camera::TestPattern;
use tegra_interop_pipeline::consumer::builtin::CheckInvert;
use tegra_interop_pipeline::consumer::{CopyWith, Placement};
use tegra_interop_pipeline::frame::FrameGeometry;
use tegra_interop_pipeline::multicast::fanout::FIFO_DEPTH;
use tegra_interop_pipeline::multicast::host::{pattern_mismatches, Control, HostFanout, HostWork};
use tegra_interop_pipeline::multicast::ring::{ConsumerReport, MulticastRing, Polled, WriteLease};
use tegra_interop_pipeline::multicast::{
    ConsumerEvent, ConsumerId, ConsumerSpec, CudaWork, DisconnectReason, Mode, MulticastError,
};

const G: FrameGeometry = FrameGeometry {
    stride: 64,
    rows: 8,
};
const LIMIT: Duration = Duration::from_secs(10);

type Log = Arc<Mutex<Vec<u64>>>;

/// A consumer's work that records each frame it saw and checks its
/// test pattern; and the control of that consumer.
fn checker() -> (HostWork, Log, Control) {
    let log: Log = Arc::default();
    let seen = Arc::clone(&log);
    let work = HostWork::new(move |frame, bytes| {
        seen.lock().unwrap().push(frame);
        pattern_mismatches(frame, G.stride, bytes)
    });
    let control = work.control();
    (work, log, control)
}

struct Consumer {
    id: ConsumerId,
    log: Log,
    control: Control,
}

fn attach(ring: &mut MulticastRing<HostFanout>, mode: Mode, limit: Duration) -> Consumer {
    let (work, log, control) = checker();
    let spec = ConsumerSpec { mode, limit, work };
    let id = ring.attach(spec).unwrap();
    Consumer { id, log, control }
}

fn fill(lease: &mut WriteLease) {
    let frame = lease.frame();
    TestPattern::new(frame, G.stride).fill(lease.bytes_mut().unwrap());
}

/// Writes one frame; returns (frame, slot, use) and what was polled.
fn produce(ring: &mut MulticastRing<HostFanout>, events: &mut Vec<Polled>) -> (u64, usize, u64) {
    let mut lease = ring.acquire().unwrap();
    fill(&mut lease);
    let t = lease.ticket();
    ring.hand_over(lease).unwrap();
    assert_eq!(ring.transport().ready_value(t.slot()), Some(t.use_()));
    events.extend(ring.poll().unwrap());
    (t.frame(), t.slot(), t.use_())
}

fn report(ring: &MulticastRing<HostFanout>, c: &Consumer) -> ConsumerReport {
    ring.report(c.id).unwrap()
}

#[test]
fn four_consumers_two_fifo_two_mailbox_every_fifo_frame_verified() {
    const FRAMES: u64 = 300;
    let mut ring = MulticastRing::new(HostFanout::new(G, 8).unwrap()).unwrap();
    let fifo = [
        attach(&mut ring, Mode::Fifo, LIMIT),
        attach(&mut ring, Mode::Fifo, LIMIT),
    ];
    let mailbox = [
        attach(&mut ring, Mode::Mailbox, LIMIT),
        attach(&mut ring, Mode::Mailbox, LIMIT),
    ];
    for m in &mailbox {
        m.control.set_delay(Duration::from_millis(2));
    }
    let mut events = Vec::new();
    for _ in 0..FRAMES {
        produce(&mut ring, &mut events);
    }
    events.extend(ring.drain(LIMIT).unwrap());
    for c in &fifo {
        assert_eq!(*c.log.lock().unwrap(), (0..FRAMES).collect::<Vec<_>>());
        let r = report(&ring, c);
        assert_eq!((r.finished, r.mismatches, r.stats.skipped), (FRAMES, 0, 0));
    }
    for c in &mailbox {
        let log = c.log.lock().unwrap().clone();
        assert!(log.windows(2).all(|w| w[0] < w[1]), "mailbox frames go up");
        let r = report(&ring, c);
        assert_eq!(r.mismatches, 0);
        assert_eq!(r.finished, log.len() as u64);
        assert_eq!(
            r.finished + r.stats.skipped,
            FRAMES,
            "every frame taken or skipped"
        );
        assert!(r.stats.skipped > 0, "a 2 ms consumer fed flat out skips");
        assert_eq!(r.stats.stalls, 0, "the producer never waited for a mailbox");
    }
    let finished = events
        .iter()
        .filter(|p| matches!(p, Polled::Finished(_)))
        .count() as u64;
    let taken: u64 = fifo
        .iter()
        .chain(&mailbox)
        .map(|c| report(&ring, c).finished)
        .sum();
    assert_eq!(finished, taken, "every finished frame was polled once");
    ring.close().unwrap();
}

#[test]
fn a_slow_mailbox_consumer_never_stalls_the_producer() {
    const FRAMES: u64 = 200;
    const PERIOD: Duration = Duration::from_millis(2);
    // The least the attach allows: 1 (FIFO) + 2 (mailbox) + 1 (producer).
    let mut ring = MulticastRing::new(HostFanout::new(G, 4).unwrap()).unwrap();
    let fast = attach(&mut ring, Mode::Fifo, LIMIT);
    let slow = attach(&mut ring, Mode::Mailbox, LIMIT);
    slow.control.set_delay(PERIOD * 10);
    let mut events = Vec::new();
    for _ in 0..FRAMES {
        std::thread::sleep(PERIOD);
        produce(&mut ring, &mut events);
    }
    events.extend(ring.drain(LIMIT).unwrap());
    let s = report(&ring, &slow);
    assert_eq!(s.stats.stalls, 0, "acquire waited for the slow mailbox");
    assert!(s.stats.skipped > FRAMES / 2, "10x slower skips most: {s:?}");
    assert_eq!(s.finished + s.stats.skipped, FRAMES);
    assert_eq!(s.mismatches, 0);
    let f = report(&ring, &fast);
    assert_eq!((f.finished, f.mismatches), (FRAMES, 0));
    assert_eq!(*fast.log.lock().unwrap(), (0..FRAMES).collect::<Vec<_>>());
    ring.close().unwrap();
}

#[test]
fn a_slow_fifo_consumer_back_pressures_the_producer() {
    // The same count as above, where it must not be zero.
    let mut ring = MulticastRing::new(HostFanout::new(G, 3).unwrap()).unwrap();
    let slow = attach(&mut ring, Mode::Fifo, LIMIT);
    slow.control.set_delay(Duration::from_millis(5));
    let mut events = Vec::new();
    for _ in 0..20 {
        produce(&mut ring, &mut events);
    }
    ring.drain(LIMIT).unwrap();
    let r = report(&ring, &slow);
    assert!(r.stats.stalls > 0, "{r:?}");
    assert_eq!((r.finished, r.stats.skipped), (20, 0));
    ring.close().unwrap();
}

#[test]
fn a_stopped_fifo_consumer_is_disconnected_at_its_limit_and_the_others_see_every_frame() {
    stopped_consumer(Mode::Fifo);
}

#[test]
fn a_stopped_mailbox_consumer_is_disconnected_at_its_limit_and_the_others_see_every_frame() {
    stopped_consumer(Mode::Mailbox);
}

/// Two FIFO checkers and one consumer of `mode` that stops at frame 50.
fn stopped_consumer(mode: Mode) {
    const FRAMES: u64 = 150;
    const SHORT: Duration = Duration::from_millis(300);
    let mut ring = MulticastRing::new(HostFanout::new(G, 6).unwrap()).unwrap();
    let a = attach(&mut ring, Mode::Fifo, LIMIT);
    let b = attach(&mut ring, Mode::Fifo, LIMIT);
    let dead = attach(&mut ring, mode, SHORT);
    let mut events = Vec::new();
    let mut stopped_at = None;
    let mut disconnected_at = None;
    for f in 0..FRAMES {
        if f == 50 {
            dead.control.stop();
            stopped_at = Some(Instant::now());
        }
        let before = events.len();
        produce(&mut ring, &mut events);
        let gone = events[before..].iter().any(|p| {
            matches!(p, Polled::Event(ConsumerEvent::Disconnected { consumer, .. }) if *consumer == dead.id)
        });
        if gone && disconnected_at.is_none() {
            disconnected_at = Some(Instant::now());
        }
    }
    // A mailbox never holds the producer up: its limit may end in the drain.
    events.extend(ring.drain(LIMIT).unwrap());
    disconnected_at.get_or_insert_with(Instant::now);
    // Typed, with the frame it did not finish and how long it had.
    let reason = events.iter().find_map(|p| match p {
        Polled::Event(ConsumerEvent::Disconnected { consumer, reason }) if *consumer == dead.id => {
            Some(reason.clone())
        }
        _ => None,
    });
    let Some(DisconnectReason::Timeout { frame, waited }) = reason else {
        panic!("no timeout event: {events:?}")
    };
    assert!(waited >= SHORT, "disconnected early: {waited:?}");
    // Not past its stop; a FIFO one at most 6 frames before (its window).
    assert!(frame <= 50, "frame {frame}");
    assert!(mode == Mode::Mailbox || frame + 6 >= 50, "frame {frame}");
    let took = disconnected_at.unwrap() - stopped_at.unwrap();
    assert!(
        took < SHORT + Duration::from_secs(3),
        "took {took:?} for a {SHORT:?} limit"
    );
    // Its slots were retired, not rewritten, and the others missed nothing.
    let retired: Vec<usize> = events
        .iter()
        .filter_map(|p| match p {
            Polled::Event(ConsumerEvent::SlotRetired { slot, consumer, .. })
                if *consumer == dead.id =>
            {
                Some(*slot)
            }
            _ => None,
        })
        .collect();
    assert!(!retired.is_empty());
    for c in [&a, &b] {
        assert_eq!(*c.log.lock().unwrap(), (0..FRAMES).collect::<Vec<_>>());
        assert_eq!(report(&ring, c).mismatches, 0);
    }
    assert!(!ring.is_attached(dead.id));
    // Let it go on: its releases come, the slots come back, it is forgotten.
    dead.control.resume();
    let began = Instant::now();
    while ring.report(dead.id).is_some() && began.elapsed() < LIMIT {
        events.extend(ring.wait_poll(Duration::from_millis(20)).unwrap());
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(ring.fanout().retired_count(), 0);
    let restored = events
        .iter()
        .filter(|p| matches!(p, Polled::Event(ConsumerEvent::SlotRestored { .. })))
        .count();
    assert_eq!(restored, retired.len());
    assert!(events.iter().any(|p| matches!(
        p,
        Polled::Event(ConsumerEvent::Forgotten { consumer, report }) if *consumer == dead.id && report.mismatches == 0
    )));
    ring.close().unwrap();
}

#[test]
fn consumers_never_write_the_shared_slot() {
    let in_place = CudaWork::new(Box::new(CheckInvert::new()), Placement::InPlace);
    assert!(matches!(in_place, Err(MulticastError::InPlace { .. })));
    let copy = CudaWork::new(
        Box::new(CheckInvert::new()),
        Placement::DeviceCopy(CopyWith::Engines),
    );
    assert_eq!(
        copy.unwrap().placement(),
        Placement::DeviceCopy(CopyWith::Engines)
    );
}

#[test]
fn attach_refuses_what_would_let_a_mailbox_stall_the_producer() {
    let mut ring = MulticastRing::new(HostFanout::new(G, 4).unwrap()).unwrap();
    attach(&mut ring, Mode::Fifo, LIMIT);
    attach(&mut ring, Mode::Mailbox, LIMIT);
    let (work, _, _) = checker();
    let refused = ring.attach(ConsumerSpec::mailbox(work, LIMIT));
    assert!(matches!(
        refused,
        Err(MulticastError::Capacity { mailboxes: 2, .. })
    ));
    assert_eq!(
        ring.consumers().count(),
        2,
        "nothing started for the refused one"
    );
    ring.close().unwrap();
}

#[test]
fn a_lease_dropped_unwritten_comes_back_and_a_foreign_one_is_refused() {
    let mut ring = MulticastRing::new(HostFanout::new(G, 2).unwrap()).unwrap();
    let mut other = MulticastRing::new(HostFanout::new(G, 2).unwrap()).unwrap();
    let c = attach(&mut ring, Mode::Fifo, LIMIT);
    let lease = ring.acquire().unwrap();
    let t = lease.ticket();
    drop(lease);
    let mut lease = ring.acquire().unwrap();
    assert_eq!(lease.ticket(), t, "the same frame, slot and use again");
    fill(&mut lease);
    let foreign = other.acquire().unwrap();
    assert!(matches!(
        ring.hand_over(foreign),
        Err(MulticastError::ForeignLease { frame: 0 })
    ));
    ring.hand_over(lease).unwrap();
    ring.drain(LIMIT).unwrap();
    assert_eq!(*c.log.lock().unwrap(), [0]);
    assert_eq!(
        other.acquire().unwrap().frame(),
        0,
        "the foreign lease went home"
    );
    ring.close().unwrap();
    other.close().unwrap();
}

/// A consumer of the property test, and what it must have seen.
struct Tracked {
    c: Consumer,
    mode: Mode,
    first: u64,
    /// The last frame handed over before it detached.
    last: Option<u64>,
}

/// Attaches a tracked consumer that must take frames from `first` on.
fn add(ring: &mut MulticastRing<HostFanout>, all: &mut Vec<Tracked>, mode: Mode, first: u64) {
    let (work, log, control) = checker();
    if let Ok(id) = ring.attach(ConsumerSpec {
        mode,
        limit: LIMIT,
        work,
    }) {
        let c = Consumer { id, log, control };
        all.push(Tracked {
            c,
            mode,
            first,
            last: None,
        });
    }
}

/// One step of the property test: (what, which consumer).
fn step(
    ring: &mut MulticastRing<HostFanout>,
    (what, pick): (u8, u8),
    all: &mut Vec<Tracked>,
    frames: &mut Vec<(usize, u64)>,
    events: &mut Vec<Polled>,
) {
    match what {
        0 | 1 => {
            let first = ring.next_frame();
            add(ring, all, [Mode::Fifo, Mode::Mailbox][what as usize], first);
        }
        2 => {
            let live: Vec<usize> = (0..all.len()).filter(|&i| all[i].last.is_none()).collect();
            if let Some(&i) = live.get(pick as usize % live.len().max(1)) {
                ring.detach(all[i].c.id).unwrap();
                all[i].last = Some(ring.next_frame().wrapping_sub(1));
            }
        }
        _ => {}
    }
    let mut lease = ring.acquire().unwrap();
    if what == 3 {
        // Attached while frame f is written: it takes f + 1 on.
        add(ring, all, Mode::Fifo, lease.frame() + 1);
    }
    fill(&mut lease);
    let t = lease.ticket();
    ring.hand_over(lease).unwrap();
    assert_eq!(frames.len() as u64, t.frame());
    frames.push((t.slot(), t.use_()));
    events.extend(ring.poll().unwrap());
}

/// Checks what one consumer saw against what it had to see.
fn check_consumer(t: &Tracked, events: &[Polled], end: u64) {
    let id = t.c.id;
    let attached = events.iter().any(|p| {
        matches!(p, Polled::Event(ConsumerEvent::Attached { consumer, first_frame })
            if *consumer == id && *first_frame == t.first)
    });
    assert!(attached, "{id}: no Attached event at frame {}", t.first);
    let report = events.iter().find_map(|p| match p {
        Polled::Event(ConsumerEvent::Forgotten { consumer, report }) if *consumer == id => {
            Some(*report)
        }
        _ => None,
    });
    let r = report.unwrap_or_else(|| panic!("{id} was not forgotten"));
    let last = t.last.unwrap_or(end);
    let offered = (last + 1).saturating_sub(t.first);
    let log = t.c.log.lock().unwrap().clone();
    assert_eq!((r.finished, r.mismatches), (log.len() as u64, 0));
    assert!(
        log.iter().all(|f| (t.first..=last).contains(f)),
        "{id}: {log:?}"
    );
    match t.mode {
        Mode::Fifo => {
            let want: Vec<u64> = (t.first..t.first + log.len() as u64).collect();
            assert_eq!(log, want, "{id} missed a frame");
            assert_eq!(log.len() as u64 + r.stats.dropped, offered);
        }
        Mode::Mailbox => {
            assert!(log.windows(2).all(|w| w[0] < w[1]));
            assert_eq!(r.finished + r.stats.skipped + r.stats.dropped, offered);
            assert_eq!(r.stats.stalls, 0);
        }
    }
}

/// The fences at the end: *ready* of each slot is its use count; the
/// *release* of each consumer place and slot is the last use of the slot
/// that a consumer at that place took.
fn check_fences(ring: &MulticastRing<HostFanout>, all: &[Tracked], frames: &[(usize, u64)]) {
    let slots = ring.info().slots;
    for s in 0..slots {
        let uses = frames.iter().filter(|(slot, _)| *slot == s).count() as u64;
        assert_eq!(
            ring.transport().ready_value(s),
            Some(uses),
            "ready of slot {s}"
        );
    }
    let mut want: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    for t in all {
        for &f in t.c.log.lock().unwrap().iter() {
            let (slot, use_) = frames[f as usize];
            let v = want.entry((t.c.id.index(), slot)).or_default();
            *v = (*v).max(use_);
        }
    }
    for place in 0..tegra_interop_pipeline::multicast::MAX_CONSUMERS {
        for s in 0..slots {
            let expected = want.get(&(place, s)).copied().unwrap_or(0);
            assert_eq!(
                ring.transport().release_value(place, s),
                Some(expected),
                "release {place}/{s}"
            );
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
    #[test]
    fn late_attach_and_detach_at_random_frames_keep_the_fences_exact(
        slots in 4usize..=8,
        plan in proptest::collection::vec((0u8..8, proptest::prelude::any::<u8>()), 10..60),
    ) {
        let mut ring = MulticastRing::new(HostFanout::new(G, slots).unwrap()).unwrap();
        let (mut all, mut frames, mut events) = (Vec::new(), Vec::new(), Vec::new());
        for p in plan {
            step(&mut ring, p, &mut all, &mut frames, &mut events);
        }
        events.extend(ring.drain(LIMIT).unwrap());
        let end = frames.len() as u64 - 1;
        for t in all.iter().filter(|t| t.last.is_none()) {
            ring.detach(t.c.id).unwrap();
        }
        events.extend(ring.poll().unwrap());
        for t in &all {
            check_consumer(t, &events, end);
        }
        check_fences(&ring, &all, &frames);
        ring.close().unwrap();
    }
}

#[test]
fn a_consumer_whose_work_panics_is_disconnected_and_the_others_go_on() {
    const FRAMES: u64 = 60;
    let mut ring = MulticastRing::new(HostFanout::new(G, 6).unwrap()).unwrap();
    let good = attach(&mut ring, Mode::Fifo, LIMIT);
    let work = HostWork::new(|frame, _bytes: &[u8]| {
        assert!(frame != 10, "this consumer fails at frame 10");
        0
    });
    let bad = ring.attach(ConsumerSpec::fifo(work, LIMIT)).unwrap();
    let began = Instant::now();
    let mut events = Vec::new();
    for _ in 0..FRAMES {
        produce(&mut ring, &mut events);
    }
    events.extend(ring.drain(LIMIT).unwrap());
    let failed = events.iter().any(|p| {
        matches!(p, Polled::Event(ConsumerEvent::Disconnected { consumer, reason: DisconnectReason::Failed { .. } }) if *consumer == bad)
    });
    assert!(failed, "{events:?}");
    // Its releases of frame 10 (and of 11, if queued to it before its end
    // was seen) never come: those slots stay out, the rest go on; the ring
    // did not wait out its limit.
    let retired = ring.fanout().retired_count();
    assert!((1..=FIFO_DEPTH).contains(&retired), "{retired} retired");
    assert!(began.elapsed() < LIMIT / 2, "{:?}", began.elapsed());
    assert_eq!(*good.log.lock().unwrap(), (0..FRAMES).collect::<Vec<_>>());
    assert_eq!(report(&ring, &good).mismatches, 0);
    ring.close().unwrap();
}

#[test]
fn a_lease_gives_a_typed_frame_view_of_the_rings_size_only() {
    use tegra_interop_pipeline::frame::{FrameLayout, PixelFormat};
    let mut ring = MulticastRing::new(HostFanout::new(G, 2).unwrap()).unwrap();
    let mut lease = ring.acquire().unwrap();
    let wrong = FrameLayout::packed(8, 8, PixelFormat::Rgba8).unwrap();
    assert!(matches!(
        lease.frame_mut(wrong),
        Err(MulticastError::Layout(_))
    ));
    let right = FrameLayout::packed(16, 8, PixelFormat::Rgba8).unwrap();
    let view = lease.frame_mut(right).unwrap();
    assert_eq!(view.index(), 0);
    drop(lease);
    ring.close().unwrap();
}

#[test]
fn the_ring_and_its_leases_move_between_threads() {
    fn send<T: Send>() {}
    send::<MulticastRing<HostFanout>>();
    send::<WriteLease>();
    send::<Polled>();
}
