//! `multicast::cuda::CudaFanout` on a discrete GPU: the Vulkan exporter
//! (`transport::export::VulkanFdExporter`, the Vulkan device whose UUID is
//! CUDA device 0's) as the producer, two consumers each on its own CUDA
//! streams, both verifying every frame with the check-and-invert kernel on
//! their own device copies of the slot.
//!
//! The test needs a GPU and is `#[ignore]`d: run it on the GPU machine with
//! `--include-ignored` (crates/testkit/gpu-machine/build.sh builds it). It
//! has not run yet (written in session 13 without a GPU).
#![cfg(feature = "vulkan")]
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tegra_interop::driver::{Backend, Context};
use tegra_interop_pipeline::camera::TestPattern;
use tegra_interop_pipeline::consumer::{CheckInvert, CopyWith, Placement};
use tegra_interop_pipeline::multicast::cuda::CudaFanout;
use tegra_interop_pipeline::multicast::ring::{MulticastRing, Polled};
use tegra_interop_pipeline::multicast::{
    ConsumerId, ConsumerSpec, CudaWork, FanoutTransport, Queued,
};
use tegra_interop_pipeline::transport::export::VulkanFdExporter;
use tegra_interop_pipeline::transport::{Completion, FrameGeometry};

/// 1920x1080 RGBA8.
const G: FrameGeometry = FrameGeometry {
    stride: 1920 * 4,
    rows: 1080,
};
const SLOTS: usize = 4;
const FRAMES: u64 = 600;
const DAMAGED: u64 = 123;
const WAIT: Duration = Duration::from_secs(10);

/// CUDA device 0's context, and the Vulkan exporter on the same device.
fn open() -> (Context, VulkanFdExporter) {
    let backend = Backend::real().unwrap();
    let uuid = backend.device(0).and_then(|d| d.uuid()).unwrap();
    let ctx = Context::new(Arc::clone(&backend), 0).unwrap();
    (ctx, VulkanFdExporter::open(uuid, None).unwrap())
}

fn consumer() -> ConsumerSpec<CudaWork> {
    let work = CudaWork::new(
        CheckInvert::boxed(),
        Placement::DeviceCopy(CopyWith::Engines),
    )
    .unwrap();
    ConsumerSpec::fifo(work, WAIT)
}

/// Waits (bounded) for consumer `id`'s next completion.
fn next(t: &mut CudaFanout<VulkanFdExporter>, id: usize) -> Completion {
    let start = Instant::now();
    loop {
        if let Some(c) = t.try_complete(id).unwrap() {
            return c;
        }
        assert!(
            start.elapsed() < WAIT,
            "consumer {id}: no frame in {WAIT:?}"
        );
        std::thread::yield_now();
    }
}

/// Writes frame `frame` into `slot` as its use `use_` (the test pattern,
/// one byte wrong in frame [`DAMAGED`]) and publishes it.
fn produce(t: &mut CudaFanout<VulkanFdExporter>, slot: usize, frame: u64, use_: u64) {
    let mut memory = t.take_slot(slot, frame, use_).unwrap();
    let bytes = memory.bytes_mut().unwrap();
    TestPattern::new(frame, G.stride).fill(bytes);
    if frame == DAMAGED {
        bytes[1000] ^= 0x08;
    }
    t.signal_ready(slot, use_, memory).unwrap();
}

/// Two consumers on their own streams take every frame of a ring of four
/// (slot `f % 4`, use `f / 4 + 1`; before each use the producer waits for
/// both consumers' release of the previous one): both verify every frame
/// and both catch the damaged one, and only it. The slots still hold what
/// the producer wrote (no consumer wrote the shared memory).
#[test]
#[ignore = "needs a GPU (NVIDIA driver and a Vulkan loader): run on the GPU machine"]
fn two_consumers_on_different_streams_both_verify_every_frame() {
    let (ctx, vk) = open();
    let mut t = CudaFanout::open(&ctx, vk, G, SLOTS).unwrap();
    t.attach(0, consumer()).unwrap();
    t.attach(1, consumer()).unwrap();
    let mut done: [Vec<Completion>; 2] = [Vec::new(), Vec::new()];
    let start = Instant::now();
    for frame in 0..FRAMES {
        let (slot, use_) = ((frame % SLOTS as u64) as usize, frame / SLOTS as u64 + 1);
        for id in 0..2 {
            if use_ > 1 {
                assert!(t.wait_released(id, slot, use_ - 1, WAIT).unwrap());
            }
        }
        produce(&mut t, slot, frame, use_);
        for (id, d) in done.iter_mut().enumerate() {
            t.queue(id, Queued { frame, slot, use_ }).unwrap();
            while let Some(c) = t.try_complete(id).unwrap() {
                d.push(c);
            }
        }
    }
    for (id, d) in done.iter_mut().enumerate() {
        while d.len() < FRAMES as usize {
            d.push(next(&mut t, id));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{FRAMES} frames to 2 consumers in {secs:.3} s ({:.0} frames/s)",
        FRAMES as f64 / secs
    );
    for (id, d) in done.iter().enumerate() {
        let frames: Vec<u64> = d.iter().map(|c| c.frame).collect();
        assert_eq!(frames, (0..FRAMES).collect::<Vec<_>>(), "consumer {id}");
        for c in d {
            let want = u64::from(c.frame == DAMAGED);
            assert_eq!(c.mismatches, want, "consumer {id}, frame {}", c.frame);
        }
    }
    let mut back = vec![0u8; G.frame_len()];
    let mut want = vec![0u8; G.frame_len()];
    for slot in 0..SLOTS {
        t.read_frame(slot, &mut back).unwrap();
        TestPattern::new(FRAMES - SLOTS as u64 + slot as u64, G.stride).fill(&mut want);
        assert!(back == want, "slot {slot} was written by a consumer");
    }
    t.detach(0).unwrap();
    t.detach(1).unwrap();
    Box::new(t).close().unwrap();
}

/// The same through the multicast ring (its pool, fence rule and
/// collection): two FIFO consumers and one mailbox consumer on their own
/// streams; both FIFO consumers finish every frame verified (the damaged
/// one caught), the mailbox consumer an increasing subset, each verified,
/// and it never makes the producer wait.
#[test]
#[ignore = "needs a GPU (NVIDIA driver and a Vulkan loader): run on the GPU machine"]
fn the_ring_over_the_vulkan_exporter_verifies_every_consumers_frames() {
    let (ctx, vk) = open();
    let mut ring = MulticastRing::new(CudaFanout::open(&ctx, vk, G, 6).unwrap()).unwrap();
    let fifo = [0, 1].map(|_| ring.attach(consumer()).unwrap());
    let work = CudaWork::new(
        CheckInvert::boxed(),
        Placement::DeviceCopy(CopyWith::Engines),
    )
    .unwrap();
    let mailbox = ring.attach(ConsumerSpec::mailbox(work, WAIT)).unwrap();
    let mut finished: Vec<(ConsumerId, u64, u64)> = Vec::new();
    let mut take = |polled: Vec<Polled>| {
        for p in polled {
            if let Polled::Finished(d) = p {
                finished.push((d.consumer, d.completion.frame, d.completion.mismatches));
            }
        }
    };
    let start = Instant::now();
    for _ in 0..FRAMES {
        let mut lease = ring.acquire().unwrap();
        let frame = lease.frame();
        let bytes = lease.bytes_mut().unwrap();
        TestPattern::new(frame, G.stride).fill(bytes);
        if frame == DAMAGED {
            bytes[77] ^= 0x20;
        }
        ring.hand_over(lease).unwrap();
        take(ring.poll().unwrap());
    }
    take(ring.drain(WAIT).unwrap());
    let secs = start.elapsed().as_secs_f64();
    println!(
        "ring: {FRAMES} frames, 2 FIFO + 1 mailbox consumers, {:.0} frames/s",
        FRAMES as f64 / secs
    );
    let of = |c: ConsumerId| -> Vec<(u64, u64)> {
        finished
            .iter()
            .filter(|f| f.0 == c)
            .map(|f| (f.1, f.2))
            .collect()
    };
    for c in fifo {
        let want: Vec<(u64, u64)> = (0..FRAMES).map(|f| (f, u64::from(f == DAMAGED))).collect();
        assert_eq!(of(c), want, "{c}");
    }
    let got = of(mailbox);
    assert!(!got.is_empty());
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "{got:?}");
    assert!(
        got.iter().all(|&(f, m)| m == u64::from(f == DAMAGED)),
        "{got:?}"
    );
    let stats = ring.report(mailbox).unwrap().stats;
    assert_eq!(stats.stalls, 0, "{stats:?}");
    println!(
        "mailbox consumer: {} finished, {} skipped",
        got.len(),
        stats.skipped
    );
    ring.close().unwrap();
}
