//! The pipeline's discrete-GPU transport (`tegra_interop_pipeline::gpu`: Vulkan
//! frames and timeline semaphores imported into CUDA, an NVRTC kernel as the
//! consumer) driven directly through the `FrameTransport` protocol, in both
//! modes (zero-copy and copy-based).
//!
//! The tests that need a GPU are `#[ignore]`d: run them on the GPU machine
//! with `--include-ignored` (see BENCHMARKS.md). Without a GPU only the probe
//! test runs, and it checks that the refusal is one line.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use tegra_interop_pipeline::camera::TestPattern;

use tegra_interop_pipeline::gpu::{self, GpuTransport, Mode};
use tegra_interop_pipeline::ring::FenceSchedule;
use tegra_interop_pipeline::transport::{FrameGeometry, FrameTransport};

fn with<R>(
    geometry: FrameGeometry,
    slots: usize,
    mode: Mode,
    f: impl FnOnce(&mut GpuTransport<'_>) -> R,
) -> R {
    let schedule = FenceSchedule::new(slots).unwrap();
    gpu::with_transport(geometry, schedule, mode, |t, note| {
        assert!(!note.is_empty() && !note.contains('\n'));
        f(t)
    })
    .unwrap()
}

/// Acquire, write the pattern (optionally damaged), release, submit.
fn produce(t: &mut dyn FrameTransport, frame: u64, damage: Option<usize>) -> usize {
    let g = t.geometry();
    let slot = (frame % t.slot_count() as u64) as usize;
    let buf = t.producer_acquire(slot, frame).unwrap();
    TestPattern::new(frame, g.stride).fill(buf);
    if let Some(at) = damage {
        buf[at] ^= 0x24;
    }
    t.producer_release(slot, frame).unwrap();
    t.consumer_submit(slot, frame).unwrap();
    slot
}

#[test]
fn probe_answers_in_one_line() {
    let line = match gpu::probe() {
        Ok(why) | Err(why) => why,
    };
    assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
}

/// Frames go round the ring in both modes; the kernel finds no mismatch in
/// good frames and exactly the damaged bytes in bad ones, and the producer
/// reads back the inverted pattern; odd sizes exercise the kernel's tail.
#[test]
#[ignore = "needs an NVIDIA GPU with Vulkan and NVRTC (run on the GPU machine)"]
fn frames_round_trip_in_both_modes() {
    for mode in [Mode::ZeroCopy, Mode::DeviceCopy] {
        for (stride, rows) in [(1920 * 4, 1080), (301, 7), (17, 1)] {
            let g = FrameGeometry { stride, rows };
            with(g, 3, mode, |t| {
                assert_eq!(t.mode(), mode);
                let frames = 24u64;
                for frame in 0..frames {
                    let slot = (frame % 3) as usize;
                    if frame >= 3 {
                        let c = t.wait_complete().unwrap();
                        assert_eq!(c.frame, frame - 3);
                        assert_eq!(c.slot, slot);
                        let want = if (frame - 3) % 5 == 1 { 2 } else { 0 };
                        assert_eq!(c.mismatches, want, "frame {} ({mode:?}, {g:?})", c.frame);
                        let buf = t.producer_acquire(slot, frame).unwrap();
                        let p = TestPattern::new(frame - 3, stride);
                        let first = p.first_mismatch(buf, 0xff);
                        if want == 0 {
                            assert_eq!(first, None, "frame {} not inverted", frame - 3);
                        } else {
                            // The damaged bytes are inverted damaged bytes.
                            assert!(first.is_some());
                        }
                    }
                    let damage = (frame % 5 == 1).then_some(0);
                    let g_len = g.frame_len();
                    let buf = t.producer_acquire(slot, frame).unwrap();
                    TestPattern::new(frame, stride).fill(buf);
                    if damage.is_some() {
                        buf[0] ^= 0x24;
                        buf[g_len - 1] ^= 0x81;
                    }
                    t.producer_release(slot, frame).unwrap();
                    t.consumer_submit(slot, frame).unwrap();
                }
                for _ in 0..3 {
                    let c = t.wait_complete().unwrap();
                    let want = if c.frame % 5 == 1 { 2 } else { 0 };
                    assert_eq!(c.mismatches, want);
                }
                assert!(t.try_complete().unwrap().is_none());
                let times = t.gpu_times();
                assert_eq!(times.frames, frames);
                assert!(times.kernel.as_nanos() > 0);
                println!(
                    "{mode:?} {stride}x{rows} ({:?}): copy-in {:?}, kernel {:?}, tail {:?} per frame",
                    t.memory_location(),
                    times.copy_in,
                    times.kernel,
                    times.tail
                );
            });
        }
    }
}

/// The consumer is queued before the producer signals (wait before signal);
/// it must not run before the release.
#[test]
#[ignore = "needs an NVIDIA GPU with Vulkan and NVRTC (run on the GPU machine)"]
fn consumer_waits_for_the_release() {
    let g = FrameGeometry {
        stride: 256,
        rows: 64,
    };
    with(g, 2, Mode::ZeroCopy, |t| {
        let buf = t.producer_acquire(0, 0).unwrap();
        TestPattern::new(0, 256).fill(buf);
        t.consumer_submit(0, 0).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(t.try_complete().unwrap().is_none(), "ran before release");
        let released = Instant::now();
        t.producer_release(0, 0).unwrap();
        let c = t.wait_complete().unwrap();
        assert_eq!(c.mismatches, 0);
        assert!(c.finished >= released);
    });
}

/// Misuse is refused with a message, never a hang or a panic.
#[test]
#[ignore = "needs an NVIDIA GPU with Vulkan and NVRTC (run on the GPU machine)"]
fn out_of_order_use_is_refused() {
    let g = FrameGeometry {
        stride: 64,
        rows: 4,
    };
    with(g, 2, Mode::DeviceCopy, |t| {
        assert!(t.producer_acquire(1, 0).is_err(), "wrong slot");
        assert!(t.producer_release(0, 0).is_err(), "release before acquire");
        // Frame 2 waits for slot 0 to be freed by frame 0, never submitted.
        assert!(t.producer_acquire(0, 2).is_err());
        assert!(t.wait_complete().is_err(), "nothing in flight");
        produce(t, 0, None);
        assert!(t.consumer_submit(0, 0).is_err(), "submitted twice");
        assert_eq!(t.wait_complete().unwrap().mismatches, 0);
    });
}

/// A consumer left waiting for a frame that is never released does not
/// hang the teardown.
#[test]
#[ignore = "needs an NVIDIA GPU with Vulkan and NVRTC (run on the GPU machine)"]
fn teardown_with_a_waiting_consumer_does_not_hang() {
    let g = FrameGeometry {
        stride: 64,
        rows: 4,
    };
    let t0 = Instant::now();
    with(g, 2, Mode::ZeroCopy, |t| {
        produce(t, 0, None);
        let _ = t.producer_acquire(1, 1).unwrap();
        t.consumer_submit(1, 1).unwrap(); // never released
    });
    assert!(t0.elapsed().as_secs() < 30);
}
