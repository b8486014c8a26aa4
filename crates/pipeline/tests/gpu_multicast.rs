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
use tegra_interop_pipeline::multicast::{ConsumerSpec, CudaWork, FanoutTransport, Queued};
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
