//! The Zenoh consumer and source as a library, in one process on the
//! simulator: the host reader of `CudaFanout` (beside a CUDA consumer),
//! the publisher attached to a multicast ring as a mailbox consumer, and
//! the source taking its samples over TCP loopback, plus the source's
//! typed refusals.
#![cfg(feature = "zenoh")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tegra_interop::driver::Context;
use tegra_interop_pipeline::camera::TestPattern;
use tegra_interop_pipeline::consumer::{twin, CheckInvert, CopyWith, Placement};
use tegra_interop_pipeline::frame::{FrameLayout, FrameMut, PixelFormat};
use tegra_interop_pipeline::multicast::cuda::{CudaFanout, HostRead, HostSlot};
use tegra_interop_pipeline::multicast::ring::{MulticastRing, Polled};
use tegra_interop_pipeline::multicast::{ConsumerSpec, CudaWork};
use tegra_interop_pipeline::sim::Sim;
use tegra_interop_pipeline::source::{Source, SourceError};
use tegra_interop_pipeline::transport::export::SimExporter;
use tegra_interop_pipeline::transport::{FrameGeometry, TransportError};
use tegra_interop_pipeline::zenoh::publish::{PublishConfig, ZenohPublisher};
use tegra_interop_pipeline::zenoh::source::{SampleFault, SourceConfig, ZenohSource};
use tegra_interop_pipeline::zenoh::wire::{encode_prefix, image_key, ImageHeader};
use tegra_interop_pipeline::zenoh::ZenohEndpoints;
use zenoh::Wait as _;

const LIMIT: Duration = Duration::from_secs(10);

/// Frames a host reader read, with their numbers.
type Kept = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// A host reader that keeps a copy of every frame it read.
struct Keep(Kept);

impl HostRead for Keep {
    fn name(&self) -> &str {
        "keep"
    }
    fn frame(&mut self, frame: u64, slot: &HostSlot<'_>) -> Result<u64, TransportError> {
        let mut out = vec![0u8; slot.len()];
        assert!(
            slot.read_into(&mut out[1..]).is_err(),
            "a short buffer is refused"
        );
        slot.read_into(&mut out)?;
        self.0.lock().unwrap().push((frame, out));
        Ok(0)
    }
}

fn sim() -> (Sim, Context) {
    let sim = Sim::new().unwrap();
    twin::register(&sim);
    let ctx = Context::new(sim.backend(), 0).unwrap();
    (sim, ctx)
}

fn produce<T: tegra_interop_pipeline::multicast::FanoutTransport>(
    ring: &mut MulticastRing<T>,
    frames: u64,
) -> Vec<Polled> {
    let stride = ring.info().geometry.stride;
    let mut polled = Vec::new();
    for _ in 0..frames {
        let mut lease = ring.acquire().unwrap();
        let frame = lease.frame();
        TestPattern::new(frame, stride).fill(lease.bytes_mut().unwrap());
        ring.hand_over(lease).unwrap();
        polled.extend(ring.poll().unwrap());
    }
    polled.extend(ring.drain(LIMIT).unwrap());
    polled
}

#[test]
fn a_host_reader_reads_every_frame_beside_a_cuda_consumer() {
    let (_sim, ctx) = sim();
    let g = FrameGeometry {
        stride: 64,
        rows: 4,
    };
    let mut ring = MulticastRing::new(CudaFanout::open(&ctx, SimExporter, g, 4).unwrap()).unwrap();
    let copy = Placement::DeviceCopy(CopyWith::Engines);
    let cuda = ring
        .attach(ConsumerSpec::fifo(
            CudaWork::new(CheckInvert::boxed(), copy).unwrap(),
            LIMIT,
        ))
        .unwrap();
    let kept = Arc::new(Mutex::new(Vec::new()));
    let work = CudaWork::host(Box::new(Keep(Arc::clone(&kept))));
    assert_eq!(work.placement(), Placement::ReadBack);
    let host = ring.attach(ConsumerSpec::fifo(work, LIMIT)).unwrap();
    let polled = produce(&mut ring, 20);
    let finished = |id| {
        polled
            .iter()
            .filter(|p| matches!(p, Polled::Finished(d) if d.consumer == id && d.completion.mismatches == 0))
            .count()
    };
    assert_eq!((finished(cuda), finished(host)), (20, 20));
    let kept = kept.lock().unwrap();
    for (i, (frame, bytes)) in kept.iter().enumerate() {
        assert_eq!(*frame, i as u64);
        let mut want = vec![0u8; g.frame_len()];
        TestPattern::new(*frame, g.stride).fill(&mut want);
        assert_eq!(bytes, &want, "frame {frame}");
    }
    ring.detach(host).unwrap();
    ring.detach(cuda).unwrap();
    ring.poll().unwrap();
    ring.close().unwrap();
}

/// A free TCP port on loopback (the listener is closed before use).
fn port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn peers() -> (zenoh::Session, zenoh::Session) {
    let ep = format!("tcp/127.0.0.1:{}", port());
    let listen = ZenohEndpoints {
        listen: vec![ep.clone()],
        ..ZenohEndpoints::default()
    };
    let connect = ZenohEndpoints {
        connect: vec![ep],
        ..ZenohEndpoints::default()
    };
    let a = listen.open().unwrap();
    let b = connect.open().unwrap();
    (a, b)
}

fn layout() -> FrameLayout {
    FrameLayout::packed(8, 4, PixelFormat::Rgba8).unwrap()
}

fn source_config(topic: &str) -> SourceConfig {
    SourceConfig {
        topic: topic.into(),
        domain: 0,
        layout: layout(),
        queue: 64,
        first_limit: LIMIT,
        limit: LIMIT,
    }
}

#[test]
fn published_frames_reach_a_zenoh_source_over_loopback() {
    let (_sim, ctx) = sim();
    let (sub_session, pub_session) = peers();
    let mut source = ZenohSource::subscribe(&sub_session, source_config("t/one")).unwrap();
    let log = std::env::temp_dir().join(format!("zenoh-consumer-{}.log", std::process::id()));
    let config = PublishConfig {
        topic: "t/one".into(),
        domain: 0,
        queue: 64,
        frame_id: "camera".into(),
        layout: layout(),
        log: Some(log.clone()),
        wait_subscriber: LIMIT,
    };
    let publisher = ZenohPublisher::start(&pub_session, &config).unwrap();
    assert!(publisher.matched_at_start());
    assert_eq!(publisher.key(), source.key());
    let g = FrameGeometry {
        stride: layout().pitch(),
        rows: 4,
    };
    let mut ring = MulticastRing::new(CudaFanout::open(&ctx, SimExporter, g, 4).unwrap()).unwrap();
    let reader = CudaWork::host(Box::new(publisher.reader()));
    let id = ring.attach(ConsumerSpec::mailbox(reader, LIMIT)).unwrap();
    produce(&mut ring, 30);
    ring.detach(id).unwrap();
    ring.poll().unwrap();
    ring.close().unwrap();
    let stats = publisher.finish(LIMIT).unwrap();
    assert_eq!(stats.offered, 30);
    assert_eq!(stats.published + stats.dropped, 30);
    let lines = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    assert_eq!(lines.lines().count() as u64, stats.published);
    let mut bytes = vec![0u8; layout().frame_len()];
    for line in lines.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        let frame: u64 = parts[1].parse().unwrap();
        let mut f = FrameMut::new(frame, layout(), &mut bytes).unwrap();
        let filled = source.fill(&mut f).unwrap();
        let mut want = vec![0u8; layout().frame_len()];
        TestPattern::new(frame, layout().pitch()).fill(&mut want);
        assert_eq!(bytes, want, "frame {frame}");
        let crc = u32::from_str_radix(parts[2], 16).unwrap();
        assert_eq!(filled.digest, Some(u64::from(crc)));
    }
    assert_eq!(source.counts().refused(), 0);
    assert_eq!(source.counts().sequence_gaps.load(Ordering::Relaxed), 0);
}

fn image(width: u32, data_len: usize) -> Vec<u8> {
    let header = ImageHeader {
        sec: 1,
        nanosec: 2,
        frame_id: "f".into(),
        height: 4,
        width,
        encoding: "rgba8".into(),
        is_bigendian: 0,
        step: width * 4,
    };
    let mut out = Vec::new();
    encode_prefix(&header, data_len, &mut out).unwrap();
    out.resize(out.len() + data_len, 7);
    out
}

#[test]
fn the_source_refuses_bad_samples_by_kind_and_goes_on() {
    let (sub_session, pub_session) = peers();
    let mut source = ZenohSource::subscribe(&sub_session, source_config("t/bad")).unwrap();
    let key = image_key(0, "t/bad").unwrap();
    let wrong = "0/t/bad/sensor_msgs::msg::dds_::Image_/RIHS01_other";
    let good = image(8, layout().frame_len());
    let mut truncated = good.clone();
    truncated.truncate(good.len() - 3);
    let sends: Vec<(&str, Vec<u8>)> = vec![
        (wrong, good.clone()),
        (&key, vec![0u8; 10 * layout().frame_len()]),
        (&key, truncated),
        (&key, image(4, 64)),
        (&key, good.clone()),
    ];
    let wait = std::time::Instant::now() + LIMIT;
    while std::time::Instant::now() < wait {
        let p = pub_session.declare_publisher(key.clone()).wait().unwrap();
        if p.matching_status().wait().unwrap().matching() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (k, payload) in sends {
        pub_session.put(k, payload).wait().unwrap();
    }
    let mut bytes = vec![0u8; layout().frame_len()];
    let mut f = FrameMut::new(0, layout(), &mut bytes).unwrap();
    let filled = source.fill(&mut f).unwrap();
    assert_eq!(
        filled.digest,
        Some(u64::from(crc32fast::hash(&good[good.len() - 128..])))
    );
    assert!(bytes.iter().all(|&b| b == 7));
    let c = source.counts();
    let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    assert_eq!(
        (
            n(&c.wrong_key),
            n(&c.oversized),
            n(&c.malformed),
            n(&c.layout)
        ),
        (1, 1, 1, 1)
    );
    assert!(matches!(
        source.last_fault(),
        Some(SampleFault::Layout { .. })
    ));
    // Nothing more comes: a typed timeout within the limit.
    let mut short = source_config("t/bad");
    short.first_limit = Duration::from_millis(200);
    let mut idle = ZenohSource::subscribe(&sub_session, short).unwrap();
    let mut f = FrameMut::new(0, layout(), &mut bytes).unwrap();
    assert!(matches!(
        idle.fill(&mut f),
        Err(SourceError::Timeout { .. })
    ));
}
