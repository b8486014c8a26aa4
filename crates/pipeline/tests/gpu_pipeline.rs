//! The pipeline's discrete-GPU transport (`tegra_interop_pipeline::transport::gpu`: Vulkan
//! frames and timeline semaphores imported into CUDA, an NVRTC kernel as the
//! consumer) driven directly through the ring's tickets (the state machine
//! of `tegra_interop_pipeline::slots` and the transport's calls), in both
//! modes (zero-copy and copy-based).
//!
//! The tests that need a GPU are `#[ignore]`d: run them on the GPU machine
//! with `--include-ignored` (BENCHMARKS.md, "Reproducing"). Without a GPU only the probe
//! test runs, and it checks that the refusal is one line.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use tegra_interop_pipeline::camera::TestPattern;

use tegra_interop_pipeline::slots::{SlotState, Slots as Ring, Ticket};
use tegra_interop_pipeline::transport::gpu::{
    self, CopyFrom, CopyWith, GpuOptions, GpuTransport, Mode,
};
use tegra_interop_pipeline::transport::{FrameGeometry, FrameTransport};

/// Opens the transport and a ring of `slots`, runs `f`, closes it.
fn with<R>(
    geometry: FrameGeometry,
    slots: usize,
    mode: Mode,
    f: impl FnOnce(&mut GpuTransport, &mut Ring) -> R,
) -> R {
    with_options(geometry, slots, GpuOptions::new(mode), f)
}

/// [`with`], with every option given.
fn with_options<R>(
    geometry: FrameGeometry,
    slots: usize,
    options: GpuOptions,
    f: impl FnOnce(&mut GpuTransport, &mut Ring) -> R,
) -> R {
    let mut t = GpuTransport::open_with(geometry, slots, options).unwrap();
    assert_eq!(t.options(), options);
    assert!(!t.note().is_empty() && !t.note().contains('\n'));
    let r = f(&mut t, &mut Ring::new(slots).unwrap());
    Box::new(t).close().unwrap();
    r
}

/// Collects every frame in flight.
fn drain(t: &mut dyn FrameTransport, ring: &mut Ring, mut each: impl FnMut(u64, u64)) {
    while ring.in_flight() > 0 {
        let c = t.wait_complete().unwrap();
        ring.complete(&c).unwrap();
        each(c.frame, c.mismatches);
    }
}

/// Wait for the slot, write the pattern (optionally damaged), signal
/// ready, queue the consumer; the ring moves the slot along.
fn produce(t: &mut GpuTransport, ring: &mut Ring, damage: Option<usize>) -> Ticket {
    let g = t.info().geometry;
    let ticket = ring.acquire().unwrap();
    let mut m = t.take_slot(&ticket).unwrap();
    let buf = m.bytes_mut().unwrap();
    TestPattern::new(ticket.frame(), g.stride).fill(buf);
    if let Some(at) = damage {
        buf[at] ^= 0x24;
    }
    t.signal_ready(&ticket, m).unwrap();
    ring.release(&ticket, Instant::now(), 0).unwrap();
    t.queue_consumer(&ticket).unwrap();
    ring.submit(&ticket).unwrap();
    ticket
}

#[test]
fn probe_answers_in_one_line() {
    let line = match gpu::probe() {
        Ok(why) | Err(why) => why,
    };
    assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
}

/// Frames go round the ring in both modes (copy mode by the copy engines,
/// from the page-locked host mappings and from the imports, and by copy
/// kernels, each on two streams); the kernel finds no mismatch
/// in good frames and exactly the damaged bytes in bad ones, and the
/// producer reads back the inverted pattern; odd sizes exercise the
/// kernel's tail and the copies of lengths that are no multiple of 16.
#[test]
#[ignore = "needs an NVIDIA GPU with Vulkan and NVRTC (run on the GPU machine)"]
fn frames_round_trip_in_both_modes() {
    let copy = |copy_with| GpuOptions {
        copy_with,
        ..GpuOptions::new(Mode::DeviceCopy)
    };
    for options in [
        GpuOptions::new(Mode::ZeroCopy),
        copy(CopyWith::Engines),
        GpuOptions {
            copy_from: CopyFrom::Import,
            ..copy(CopyWith::Engines)
        },
        copy(CopyWith::Kernels),
    ] {
        let mode = options.mode;
        for (stride, rows) in [(1920 * 4, 1080), (301, 7), (17, 1)] {
            let g = FrameGeometry { stride, rows };
            with_options(g, 3, options, |t, ring| {
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
                        ring.complete(&c).unwrap();
                    }
                    let ticket = ring.acquire().unwrap();
                    assert_eq!((ticket.frame(), ticket.slot()), (frame, slot));
                    let mut m = t.take_slot(&ticket).unwrap();
                    let buf = m.bytes_mut().unwrap();
                    if frame >= 3 {
                        let want = if (frame - 3) % 5 == 1 { 2 } else { 0 };
                        let p = TestPattern::new(frame - 3, stride);
                        let first = p.first_mismatch(buf, 0xff);
                        if want == 0 {
                            assert_eq!(first, None, "frame {} not inverted", frame - 3);
                        } else {
                            // The damaged bytes are inverted damaged bytes.
                            assert!(first.is_some());
                        }
                    }
                    TestPattern::new(frame, stride).fill(buf);
                    if frame % 5 == 1 {
                        buf[0] ^= 0x24;
                        buf[g.frame_len() - 1] ^= 0x81;
                    }
                    t.signal_ready(&ticket, m).unwrap();
                    ring.release(&ticket, Instant::now(), 0).unwrap();
                    t.queue_consumer(&ticket).unwrap();
                    ring.submit(&ticket).unwrap();
                }
                drain(t, ring, |frame, mismatches| {
                    let want = if frame % 5 == 1 { 2 } else { 0 };
                    assert_eq!(mismatches, want);
                });
                assert!(t.try_complete().unwrap().is_none());
                let times = t.gpu_times();
                assert_eq!(times.frames, frames);
                assert!(times.kernel.as_nanos() > 0);
                println!(
                    "{options:?} {stride}x{rows} ({:?}): copy-in {:?}, kernel {:?}, tail {:?} per frame",
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
/// it must not run before the ready signal.
#[test]
#[ignore = "needs an NVIDIA GPU with Vulkan and NVRTC (run on the GPU machine)"]
fn consumer_waits_for_the_release() {
    let g = FrameGeometry {
        stride: 256,
        rows: 64,
    };
    with(g, 2, Mode::ZeroCopy, |t, ring| {
        let ticket = ring.acquire().unwrap();
        let mut m = t.take_slot(&ticket).unwrap();
        TestPattern::new(0, 256).fill(m.bytes_mut().unwrap());
        t.queue_consumer(&ticket).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(t.try_complete().unwrap().is_none(), "ran before release");
        let released = Instant::now();
        t.signal_ready(&ticket, m).unwrap();
        let c = t.wait_complete().unwrap();
        assert_eq!(c.mismatches, 0);
        assert!(c.finished >= released);
    });
}

/// Misuse is refused with a message, never a hang or a panic: the ring
/// refuses out-of-order moves, the transport a wait with nothing queued.
#[test]
#[ignore = "needs an NVIDIA GPU with Vulkan and NVRTC (run on the GPU machine)"]
fn out_of_order_use_is_refused() {
    let g = FrameGeometry {
        stride: 64,
        rows: 4,
    };
    with(g, 1, Mode::DeviceCopy, |t, ring| {
        assert!(t.wait_complete().is_err(), "nothing in flight");
        let first = produce(t, ring, None);
        assert!(ring.submit(&first).is_err(), "submitted twice");
        // Frame 1 needs slot 0, still in flight.
        assert!(ring.acquire().is_err());
        let c = t.wait_complete().unwrap();
        assert_eq!(c.mismatches, 0);
        ring.complete(&c).unwrap();
        assert!(ring.complete(&c).is_err(), "collected twice");
    });
}

/// A consumer left waiting for a frame that is never signalled ready does
/// not hang the teardown.
#[test]
#[ignore = "needs an NVIDIA GPU with Vulkan and NVRTC (run on the GPU machine)"]
fn teardown_with_a_waiting_consumer_does_not_hang() {
    let g = FrameGeometry {
        stride: 64,
        rows: 4,
    };
    let t0 = Instant::now();
    with(g, 2, Mode::ZeroCopy, |t, ring| {
        produce(t, ring, None);
        let second = ring.acquire().unwrap();
        let m = t.take_slot(&second).unwrap();
        t.queue_consumer(&second).unwrap(); // never signalled ready
        t.put_back(&second, m).unwrap();
    });
    assert!(t0.elapsed().as_secs() < 30);
}

/// The plain-CUDA baseline (`tegra_interop_pipeline::app::baseline`) verifies
/// every frame in both modes, at an odd size and at 1920x1080 RGBA8.
#[test]
#[ignore = "needs an NVIDIA GPU and NVRTC"]
fn plain_cuda_baseline_verifies_every_frame() {
    use tegra_interop_pipeline::app::baseline;
    for geometry in [
        FrameGeometry {
            stride: 1000,
            rows: 37,
        },
        FrameGeometry {
            stride: 7680,
            rows: 1080,
        },
    ] {
        for copy in [false, true] {
            let r = baseline::run(geometry, 3, 20, copy).unwrap();
            assert_eq!((r.frames, r.failed, r.copy), (20, 0, copy), "{geometry:?}");
        }
    }
}

/// The machine's limit (`tegra_interop_pipeline::app::baseline::limit`) on
/// the real GPU: every piece measured and plausible (a copy over PCIe of a
/// 1920x1080 RGBA8 frame takes longer than the kernel over device memory;
/// both directions at once take no less than one alone, within noise), and
/// each mode bound by one of its pieces.
#[test]
#[ignore = "needs an NVIDIA GPU and NVRTC"]
fn the_machine_limit_is_measured_on_the_gpu() {
    use tegra_interop_pipeline::app::baseline::limit;
    let g = FrameGeometry {
        stride: 7680,
        rows: 1080,
    };
    let p = limit::measure_real(g, 20).unwrap();
    println!("{p:?}");
    for v in [
        p.copy_h2d_us,
        p.copy_d2h_us,
        p.both_h2d_us,
        p.both_d2h_us,
        p.kernel_mapped_us,
        p.kernel_device_us,
        p.cpu_fill_us,
        p.cpu_check_us,
    ] {
        assert!(v.is_finite() && v > 0.0, "{p:?}");
    }
    assert!(p.copy_h2d_us > p.kernel_device_us, "{p:?}");
    assert!(p.kernel_mapped_us > p.kernel_device_us, "{p:?}");
    assert!(p.both_h2d_us > 0.8 * p.copy_h2d_us, "{p:?}");
    let z = p.zero_copy();
    assert!(["kernel_mapped", "cpu_fill", "cpu_check"].contains(&z.bound_by));
    let c = p.copy();
    assert!([
        "both_h2d",
        "both_d2h",
        "kernel_device",
        "cpu_fill",
        "cpu_check"
    ]
    .contains(&c.bound_by));
    assert!(c.gpu_frames_per_s >= c.frames_per_s);
}

/// The EGLStream transport on the real driver and a real EGL display:
/// every frame crosses the stream in order and is checked by the kernel
/// (a damaged frame is caught: the check can fail), the processed frame
/// comes back to the slot, for rings of 1, 2 and 4; teardown is clean.
#[test]
#[ignore = "needs a GPU with EGL (the GPU machine)"]
fn egl_stream_transport_verifies_every_frame() {
    use tegra_interop_pipeline::transport::egl;
    let g = FrameGeometry {
        stride: 256 * 4,
        rows: 64,
    };
    for slots in [1usize, 2, 4] {
        let (mut t, backend) = egl::open_real(g, slots).unwrap();
        assert_eq!(t.info().backend, "egl-gpu");
        let mut ring = Ring::new(slots).unwrap();
        let frames = 6 * slots as u64 + 3;
        let damaged = 2 * slots as u64 + 1;
        let mut seen = Vec::new();
        for _ in 0..frames {
            while matches!(ring.state(ring.next_slot()), Some(SlotState::InFlight(_))) {
                let c = t.wait_complete().unwrap();
                ring.complete(&c).unwrap();
                let want = if c.frame == damaged { 1 } else { 0 };
                assert_eq!(c.mismatches, want, "slots {slots}, frame {}", c.frame);
                seen.push(c.frame);
            }
            let ticket = ring.acquire().unwrap();
            let mut m = t.take_slot(&ticket).unwrap();
            let bytes = m.bytes_mut().unwrap();
            if ticket.free_wait() > 0 {
                let prev = ticket.frame() - slots as u64;
                let mut want = vec![0u8; bytes.len()];
                TestPattern::new(prev, g.stride).fill(&mut want);
                if prev == damaged {
                    want[77] ^= 0x24;
                }
                assert!(
                    bytes.iter().zip(&want).all(|(a, b)| *a == !*b),
                    "slots {slots}: frame {prev} read back inverted"
                );
            }
            TestPattern::new(ticket.frame(), g.stride).fill(bytes);
            if ticket.frame() == damaged {
                bytes[77] ^= 0x24;
            }
            t.signal_ready(&ticket, m).unwrap();
            ring.release(&ticket, Instant::now(), 0).unwrap();
            t.queue_consumer(&ticket).unwrap();
            ring.submit(&ticket).unwrap();
        }
        drain(&mut t, &mut ring, |frame, mismatches| {
            let want = if frame == damaged { 1 } else { 0 };
            assert_eq!(mismatches, want, "slots {slots}, frame {frame}");
            seen.push(frame);
        });
        assert_eq!(seen, (0..frames).collect::<Vec<_>>(), "in order, none lost");
        println!("slots {slots}: {}", t.details().unwrap());
        Box::new(t).close().unwrap();
        let errors = backend.take_drop_errors();
        assert!(errors.is_empty(), "{errors:?}");
    }
}
