//! Faults around the Zenoh consumer and source, over TCP loopback in peer
//! mode: a subscriber process killed, a subscriber that comes back, a
//! peer publisher that goes away, malformed and oversized samples, a key
//! expression that does not match (and one that is refused), and a
//! subscriber ten times slower than the producer. The subscriber
//! processes are `zenoh_bench sub` (this package's program).
//!
//! No assertion here is on a time: the waits are bounded (a failure says
//! what it waited for) and the slow-subscriber test counts the producer's
//! waits and the frames each consumer got.
#![cfg(feature = "zenoh")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tegra_interop::driver::Context;
use tegra_interop_pipeline::consumer::twin;
use tegra_interop_pipeline::frame::{FrameLayout, FrameMut, PixelFormat};
use tegra_interop_pipeline::multicast::cuda::{CudaFanout, HostRead, HostSlot};
use tegra_interop_pipeline::multicast::ring::{MulticastRing, Polled};
use tegra_interop_pipeline::multicast::{ConsumerEvent, ConsumerId, ConsumerSpec, CudaWork};
use tegra_interop_pipeline::sim::Sim;
use tegra_interop_pipeline::source::{Source, SourceError};
use tegra_interop_pipeline::transport::export::SimExporter;
use tegra_interop_pipeline::transport::{FrameGeometry, TransportError};
use tegra_interop_pipeline::zenoh::publish::{PublishConfig, PublishStats, ZenohPublisher};
use tegra_interop_pipeline::zenoh::source::{SampleFault, SourceConfig, ZenohSource};
use tegra_interop_pipeline::zenoh::wire::{encode_prefix, image_key, Attachment, ImageHeader};
use tegra_interop_pipeline::zenoh::{WireError, ZenohEndpoints, ZenohError};
use zenoh::Wait as _;

const LIMIT: Duration = Duration::from_secs(20);

type Ring = MulticastRing<CudaFanout<SimExporter>>;

fn endpoint() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    format!("tcp/127.0.0.1:{}", l.local_addr().unwrap().port())
}

fn session(listen: Option<&str>, connect: Option<&str>) -> zenoh::Session {
    ZenohEndpoints {
        listen: listen.into_iter().map(String::from).collect(),
        connect: connect.into_iter().map(String::from).collect(),
        config: None,
    }
    .open()
    .unwrap()
}

fn layout(width: u32, height: u32) -> FrameLayout {
    FrameLayout::packed(width, height, PixelFormat::Rgba8).unwrap()
}

/// A local consumer of the ring: counts frames and checks each one's
/// number, which the producer writes at both ends of the frame (the
/// rest of the slot is left as it is: the test is about the frames'
/// flow, and a debug build copies fast but writes patterns slowly).
struct Local {
    seen: Arc<AtomicU64>,
    wrong: Arc<AtomicU64>,
}

/// The frame number at both ends of `bytes`.
fn stamp(frame: u64, bytes: &mut [u8]) {
    let n = bytes.len();
    bytes[..8].copy_from_slice(&frame.to_le_bytes());
    bytes[n - 8..].copy_from_slice(&frame.to_le_bytes());
}

impl HostRead for Local {
    fn name(&self) -> &str {
        "local"
    }
    fn frame(&mut self, frame: u64, slot: &HostSlot<'_>) -> Result<u64, TransportError> {
        let mut got = vec![0u8; slot.len()];
        slot.read_into(&mut got)?;
        let n = got.len();
        let ends = [&got[..8], &got[n - 8..]];
        if ends.iter().any(|e| *e != frame.to_le_bytes()) {
            self.wrong.fetch_add(1, Ordering::Relaxed);
        }
        self.seen.fetch_add(1, Ordering::Relaxed);
        Ok(0)
    }
}

/// A ring on the simulator with a local FIFO consumer and the Zenoh
/// consumer (a mailbox) publishing on `topic` through `session`.
struct Rig {
    _sim: Sim,
    _ctx: Context,
    ring: Ring,
    publisher: Option<ZenohPublisher>,
    local: ConsumerId,
    zenoh: ConsumerId,
    seen: Arc<AtomicU64>,
    wrong: Arc<AtomicU64>,
    polled: Vec<Polled>,
}

fn rig(session: &zenoh::Session, topic: &str, layout: FrameLayout) -> Rig {
    let sim = Sim::new().unwrap();
    twin::register(&sim);
    let ctx = Context::new(sim.backend(), 0).unwrap();
    let g = FrameGeometry {
        stride: layout.pitch(),
        rows: layout.height() as usize,
    };
    let mut ring = MulticastRing::new(CudaFanout::open(&ctx, SimExporter, g, 4).unwrap()).unwrap();
    let config = PublishConfig {
        topic: topic.into(),
        domain: 0,
        queue: 2,
        frame_id: "faults".into(),
        layout,
        log: None,
        wait_subscriber: LIMIT,
    };
    let publisher = ZenohPublisher::start(session, &config).unwrap();
    assert!(publisher.matched_at_start(), "no subscriber on {topic}");
    let (seen, wrong) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let local = Local {
        seen: Arc::clone(&seen),
        wrong: Arc::clone(&wrong),
    };
    let local = ring
        .attach(ConsumerSpec::fifo(CudaWork::host(Box::new(local)), LIMIT))
        .unwrap();
    let work = CudaWork::host(Box::new(publisher.reader()));
    let zenoh = ring.attach(ConsumerSpec::mailbox(work, LIMIT)).unwrap();
    Rig {
        _sim: sim,
        _ctx: ctx,
        ring,
        publisher: Some(publisher),
        local,
        zenoh,
        seen,
        wrong,
        polled: Vec::new(),
    }
}

impl Rig {
    /// Hands `n` frames over, one every `pace` (on a schedule: a late
    /// frame does not push the next ones back).
    fn produce(&mut self, n: u64, pace: Duration) {
        let start = Instant::now();
        for i in 0..n {
            if let Some(left) = (start + pace * i as u32).checked_duration_since(Instant::now()) {
                std::thread::sleep(left);
            }
            let mut lease = self.ring.acquire().unwrap();
            let frame = lease.frame();
            stamp(frame, lease.bytes_mut().unwrap());
            self.ring.hand_over(lease).unwrap();
            self.polled.extend(self.ring.poll().unwrap());
        }
    }

    /// Drains the ring; the producer's waits for (local, zenoh).
    fn drain(&mut self) -> (u64, u64) {
        self.polled.extend(self.ring.drain(LIMIT).unwrap());
        let stalls = |id| self.ring.report(id).unwrap().stats.stalls;
        (stalls(self.local), stalls(self.zenoh))
    }

    /// The publisher's counts so far.
    fn stats(&self) -> PublishStats {
        self.publisher.as_ref().unwrap().stats()
    }

    /// Stops the publisher (bounded); its final counts.
    fn finish(&mut self) -> PublishStats {
        self.publisher.take().unwrap().finish(LIMIT).unwrap()
    }

    /// No consumer was disconnected.
    fn no_disconnect(&self) -> bool {
        !self.polled.iter().any(|p| {
            matches!(
                p,
                Polled::Event(
                    ConsumerEvent::Disconnected { .. } | ConsumerEvent::SlotRetired { .. }
                )
            )
        })
    }

    fn close(mut self) {
        self.ring.detach(self.local).unwrap();
        self.ring.detach(self.zenoh).unwrap();
        self.ring.poll().unwrap();
        self.ring.close().unwrap();
    }
}

/// `zenoh_bench sub` on `ep`/`key`: stops after `frames` samples.
fn subscriber(ep: &str, key: &str, frames: u64, delay_us: u64) -> Child {
    Command::new(env!("CARGO_BIN_EXE_zenoh_bench"))
        .args(["sub", "--connect", ep, "--key", key, "--cdr"])
        .args(["--frames", &frames.to_string()])
        .args(["--delay-us", &delay_us.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits (bounded) for the child; its report line.
fn report(mut child: Child, until: impl Fn()) -> serde_json::Value {
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the subscriber did not end");
        until();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits (bounded) until `session` has no peer left.
fn wait_no_peer(session: &zenoh::Session) {
    let deadline = Instant::now() + LIMIT;
    while session.info().peers_zid().wait().next().is_some() {
        assert!(Instant::now() < deadline, "the killed peer is still seen");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_subscriber_process_leaves_the_ring_running() {
    let ep = endpoint();
    let s = session(Some(&ep), None);
    let key = image_key(0, "faults/kill").unwrap();
    let mut child = subscriber(&ep, &key, u64::MAX, 0);
    let mut r = rig(&s, "faults/kill", layout(64, 16));
    r.produce(40, Duration::from_millis(2));
    child.kill().unwrap();
    child.wait().unwrap();
    wait_no_peer(&s);
    let before = r.stats();
    r.produce(40, Duration::from_millis(2));
    let (local_waits, zenoh_waits) = r.drain();
    assert_eq!(zenoh_waits, 0, "the producer waited for the Zenoh consumer");
    assert_eq!(local_waits, r.ring.report(r.local).unwrap().stats.stalls);
    assert_eq!(r.seen.load(Ordering::Relaxed), 80);
    assert_eq!(r.wrong.load(Ordering::Relaxed), 0);
    assert!(r.no_disconnect(), "{:?}", r.polled);
    let taken = r.ring.report(r.zenoh).unwrap().stats;
    assert_eq!(taken.taken + taken.skipped, 80, "{taken:?}");
    let stats = r.finish();
    assert!(stats.offered > before.offered, "{before:?} {stats:?}");
    assert_eq!(stats.published + stats.dropped, stats.offered);
    assert_eq!(stats.failed, 0, "a put with no subscriber is no failure");
    r.close();
}

#[test]
fn a_subscriber_that_comes_back_gets_frames_again() {
    let ep = endpoint();
    let s = session(Some(&ep), None);
    let key = image_key(0, "faults/again").unwrap();
    let first = subscriber(&ep, &key, 5, 0);
    let mut r = rig(&s, "faults/again", layout(64, 16));
    let ring = std::cell::RefCell::new(&mut r);
    let step = || ring.borrow_mut().produce(1, Duration::from_millis(5));
    let got = report(first, step);
    assert_eq!(
        (got["received"].as_u64(), got["malformed"].as_u64()),
        (Some(5), Some(0))
    );
    wait_no_peer(&s);
    let again = subscriber(&ep, &key, 5, 0);
    let got = report(again, step);
    assert_eq!(
        (got["received"].as_u64(), got["malformed"].as_u64()),
        (Some(5), Some(0))
    );
    let (_, zenoh_waits) = r.drain();
    assert_eq!(zenoh_waits, 0);
    assert_eq!(r.wrong.load(Ordering::Relaxed), 0);
    let handed = r.ring.next_frame();
    assert_eq!(r.seen.load(Ordering::Relaxed), handed);
    assert_eq!(r.finish().failed, 0);
    r.close();
}

#[test]
fn a_subscriber_ten_times_slower_does_not_slow_the_producer_or_the_local_consumer() {
    const FRAMES: u64 = 200;
    let ep = endpoint();
    let s = session(Some(&ep), None);
    let key = image_key(0, "faults/slow").unwrap();
    // 256 KiB frames, one every 10 ms at most; the subscriber takes one
    // per 100 ms (with the TCP buffers full, the publisher's puts wait).
    let mut child = subscriber(&ep, &key, u64::MAX, 100_000);
    let mut r = rig(&s, "faults/slow", layout(256, 256));
    let start = Instant::now();
    r.produce(FRAMES, Duration::from_millis(10));
    let produced_fps = FRAMES as f64 / start.elapsed().as_secs_f64();
    let (local_waits, zenoh_waits) = r.drain();
    assert_eq!(zenoh_waits, 0, "the producer waited for the Zenoh consumer");
    assert_eq!(
        r.seen.load(Ordering::Relaxed),
        FRAMES,
        "the local consumer lost frames"
    );
    assert_eq!(r.wrong.load(Ordering::Relaxed), 0);
    assert!(r.no_disconnect(), "{:?}", r.polled);
    let stats = r.finish();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(stats.published + stats.dropped, stats.offered);
    // The slow subscriber did hold the publisher back: the consumer's
    // queue dropped frames (counted) instead of the producer waiting.
    assert!(stats.dropped > 0, "{stats:?}");
    assert!(stats.published < FRAMES, "{stats:?}");
    eprintln!(
        "slow subscriber: {stats:?}; producer {produced_fps:.1} frames/s, \
         its waits for the local consumer {local_waits}"
    );
    r.close();
}

/// A CDR image of `layout` with its data set to `fill`, and rmw_zenoh's
/// attachment for `sequence`.
fn image(layout: FrameLayout, fill: u8, sequence: i64) -> (Vec<u8>, Vec<u8>) {
    let header = ImageHeader {
        sec: 1,
        nanosec: 2,
        frame_id: "f".into(),
        height: layout.height(),
        width: layout.width(),
        encoding: "rgba8".into(),
        is_bigendian: 0,
        step: layout.pitch() as u32,
    };
    let mut out = Vec::new();
    encode_prefix(&header, layout.frame_len(), &mut out).unwrap();
    out.resize(out.len() + layout.frame_len(), fill);
    let a = Attachment {
        sequence_number: sequence,
        source_timestamp: 3,
        source_gid: [9; 16],
    };
    (out, a.encode())
}

/// A publisher peer for a source on `ep`, once it matches.
fn peer_publisher(s: &zenoh::Session, key: &str) -> zenoh::pubsub::Publisher<'static> {
    let p = s.declare_publisher(key.to_string()).wait().unwrap();
    let deadline = Instant::now() + LIMIT;
    while !p.matching_status().wait().unwrap().matching() {
        assert!(Instant::now() < deadline, "no source matched {key}");
        std::thread::sleep(Duration::from_millis(10));
    }
    p
}

fn source(s: &zenoh::Session, topic: &str, layout: FrameLayout, limit: Duration) -> ZenohSource {
    let config = SourceConfig {
        topic: topic.into(),
        domain: 0,
        layout,
        queue: 16,
        first_limit: limit,
        limit,
    };
    ZenohSource::subscribe(s, config).unwrap()
}

#[test]
fn malformed_and_oversized_samples_between_good_ones_are_counted_and_skipped() {
    let ep = endpoint();
    let (a, b) = (session(Some(&ep), None), session(None, Some(&ep)));
    let l = layout(16, 4);
    let mut src = source(&a, "faults/bad", l, LIMIT);
    let p = peer_publisher(&b, src.key());
    let (good, _) = image(l, 1, 1);
    let mut bad_encapsulation = good.clone();
    bad_encapsulation[1] = 0x00; // big-endian CDR: not what rmw_zenoh sends
    let mut long_string = good.clone();
    long_string[12..16].copy_from_slice(&u32::MAX.to_le_bytes()); // frame_id length
    let mut over = good.clone();
    over.resize(good.len() + 4096, 0); // past the largest message a frame can be
    let bads = [
        b"not a CDR image".to_vec(),
        bad_encapsulation,
        long_string,
        over,
    ];
    for (i, bad) in bads.into_iter().enumerate() {
        let (g, att) = image(l, i as u8 + 10, i as i64 + 1);
        p.put(bad).wait().unwrap();
        p.put(g).attachment(att).wait().unwrap();
    }
    // A good image with an attachment that is not rmw_zenoh's.
    p.put(good.clone())
        .attachment(vec![1u8, 2, 3])
        .wait()
        .unwrap();
    let (last, att) = image(l, 20, 5);
    p.put(last).attachment(att).wait().unwrap();
    let mut bytes = vec![0u8; l.frame_len()];
    for (i, fill) in [10u8, 11, 12, 13, 20].into_iter().enumerate() {
        let mut f = FrameMut::new(i as u64, l, &mut bytes).unwrap();
        src.fill(&mut f).unwrap();
        assert!(bytes.iter().all(|&x| x == fill), "frame {i}");
    }
    let c = src.counts();
    let n = |v: &AtomicU64| v.load(Ordering::Relaxed);
    assert_eq!(n(&c.accepted), 5);
    assert_eq!(n(&c.oversized), 1);
    assert_eq!(n(&c.malformed), 3);
    assert_eq!(n(&c.attachment), 1);
    assert_eq!(c.refused(), 5);
    assert_eq!(n(&c.sequence_gaps), 0);
    assert!(matches!(src.last_fault(), Some(SampleFault::Attachment(_))));
}

#[test]
fn a_key_mismatch_ends_in_a_typed_timeout_naming_the_key() {
    let ep = endpoint();
    let (a, b) = (session(Some(&ep), None), session(None, Some(&ep)));
    let l = layout(16, 4);
    let mut src = source(&a, "faults/here", l, Duration::from_millis(500));
    let elsewhere = b
        .declare_publisher(image_key(0, "faults/there").unwrap())
        .wait()
        .unwrap();
    let (good, att) = image(l, 5, 1);
    for _ in 0..5 {
        elsewhere
            .put(good.clone())
            .attachment(att.clone())
            .wait()
            .unwrap();
    }
    let mut bytes = vec![0u8; l.frame_len()];
    let mut f = FrameMut::new(0, l, &mut bytes).unwrap();
    match src.fill(&mut f) {
        Err(SourceError::Timeout { waiting_for, .. }) => {
            assert!(waiting_for.contains(src.key()), "{waiting_for}");
        }
        other => panic!("a typed timeout, not {other:?}"),
    }
    assert_eq!(src.counts().accepted.load(Ordering::Relaxed), 0);
    // Refused up front: a topic that is no key expression.
    for bad in ["", "a/*/b", "a//b", "a$b"] {
        assert!(image_key(0, bad).is_err(), "{bad:?} was taken");
        let config = SourceConfig {
            topic: bad.into(),
            domain: 0,
            layout: l,
            queue: 1,
            first_limit: LIMIT,
            limit: LIMIT,
        };
        let refused = ZenohSource::subscribe(&a, config);
        assert!(matches!(refused, Err(ZenohError::Wire(_))), "{bad:?}");
    }
    assert!(matches!(
        image_key(0, "a/*/b"),
        Err(WireError::Topic { .. })
    ));
}

#[test]
fn a_publisher_that_goes_away_ends_the_source_in_a_typed_timeout() {
    let ep = endpoint();
    let a = session(Some(&ep), None);
    let l = layout(16, 4);
    let mut src = source(&a, "faults/gone", l, Duration::from_millis(700));
    let b = session(None, Some(&ep));
    let p = peer_publisher(&b, src.key());
    let (good, att) = image(l, 4, 1);
    p.put(good).attachment(att).wait().unwrap();
    let mut bytes = vec![0u8; l.frame_len()];
    let mut f = FrameMut::new(0, l, &mut bytes).unwrap();
    src.fill(&mut f).unwrap();
    drop(p);
    b.close().wait().unwrap();
    wait_no_peer(&a);
    let mut f = FrameMut::new(1, l, &mut bytes).unwrap();
    match src.fill(&mut f) {
        Err(SourceError::Timeout { waiting_for, .. }) => {
            assert!(waiting_for.contains(src.key()), "{waiting_for}");
        }
        other => panic!("a typed timeout, not {other:?}"),
    }
}
