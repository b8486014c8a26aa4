//! The plain-CUDA baseline: what a user would write instead of the interop
//! pipeline on a discrete GPU, doing the same work, so that the ratio of the
//! two measures what the interop costs.
//!
//! A ring of `slots` pinned, device-mapped host buffers
//! ([`PinnedHostBuffer`](tegra_interop::driver::PinnedHostBuffer): `cuMemHostAlloc` with `DEVICEMAP | PORTABLE`), one
//! CUDA stream, one event per slot, all through the driver's function
//! table (so it also runs on the simulator, [`run_in`]). One
//! host thread, per frame: waits for the slot's event (the slot's previous
//! frame is done), checks that frame's processed bytes and its mismatch
//! counter, writes the new frame with the camera model's pattern writer
//! (as many threads as the pipeline's camera, started per call:
//! [`TestPattern::fill_on_new_threads`], faster than the pipeline's pools
//! for this one-thing-after-another loop), then queues the pipeline's own check-and-invert kernel
//! ([`Bench::check_and_invert`]) and records the slot's event. Zero-copy:
//! the kernel works on the host buffer over PCIe. Copy: the stream copies the
//! frame into a device buffer (`cuMemcpyHtoDAsync`), runs the kernel there
//! and copies it back. No Vulkan, no external memory, no semaphores: CUDA's
//! stream order makes the host's writes, done before the copy or kernel is
//! queued, visible to them (host memory allocated by CUDA is coherent with
//! the device for work queued after the writes).
//!
//! Every frame is checked exactly as in the pipeline: the kernel counts the
//! bytes that differ from the pattern, the host reads back the inverted frame.
//!
//! The buffers, the stream and the events are a [`Bench`] of the consumer
//! module, which queues the copies and the kernel and refuses the host's
//! views of a slot until its event says the slot's work is complete.

pub mod limit;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tegra_interop::driver::{Backend, Context};

use crate::camera::{frame_threads, TestPattern};
use crate::consumer::bench::{Bench, BenchConfig, Target};
use crate::transport::{DriverResultExt, FrameGeometry, TransportError};

/// How long the baseline waits for one frame before it counts as stuck.
const STUCK: Duration = Duration::from_secs(10);

/// What one baseline run measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BaselineReport {
    /// Frames run.
    pub frames: u64,
    /// Whether the frames were copied to device memory and back.
    pub copy: bool,
    /// First write to the last frame's completion.
    pub wall: Duration,
    /// Frames that failed a check (consumer count or read-back).
    pub failed: u64,
    /// Mean time per frame of the host's pattern write.
    pub write: Duration,
    /// Mean time per frame of the host's read-back check.
    pub verify: Duration,
}

impl BaselineReport {
    /// Frames per second over the wall time.
    pub fn frames_per_s(&self) -> f64 {
        self.frames as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Wall time per frame in microseconds.
    pub fn frame_time_us(&self) -> f64 {
        self.wall.as_secs_f64() * 1e6 / self.frames.max(1) as f64
    }
}

/// [`run_in`] on the real driver, device 0.
pub fn run(
    geometry: FrameGeometry,
    slots: usize,
    frames: u64,
    copy: bool,
) -> Result<BaselineReport, TransportError> {
    let backend: Arc<Backend> = Backend::real().during("CUDA driver")?;
    let ctx = Context::new(backend, 0).during("creating a CUDA context")?;
    run_in(&ctx, geometry, slots, frames, copy)
}

/// Waits for slot `index`'s frame number `frame` and checks it: the
/// kernel's mismatch count (the slot's counter word) and the host read-back
/// of the inverted pattern. `Ok(true)` when it passed.
fn check(
    bench: &mut Bench,
    index: usize,
    frame: u64,
    threads: usize,
) -> Result<bool, TransportError> {
    bench.synchronize_event(index, STUCK)?;
    let mismatches = bench.take_mismatches(index)?;
    let stride = bench.config().geometry.stride;
    let readback = TestPattern::new(frame, stride).first_mismatch_on_new_threads(
        bench.host(index)?,
        0xff,
        threads,
    );
    Ok(mismatches == 0 && readback.is_none())
}

/// Queues frame number `frame`'s work for slot `index` on the stream: the
/// copy in, the kernel and the copy out (copy mode) or the kernel over the
/// host buffer (zero-copy), then the slot's event.
fn queue(bench: &mut Bench, index: usize, frame: u64) -> Result<(), TransportError> {
    if bench.config().device {
        bench.copy_in(index, 0)?;
        bench.check_and_invert(index, Target::Device, 0, frame)?;
        bench.copy_out(index, 0)?;
    } else {
        bench.check_and_invert(index, Target::Host, 0, frame)?;
    }
    bench.record(index, 0)
}

/// Runs `frames` frames of `geometry` through a ring of `slots` in `ctx`
/// (see the module docs); `copy` selects the copy-based variant.
pub fn run_in(
    ctx: &Context,
    geometry: FrameGeometry,
    slots: usize,
    frames: u64,
    copy: bool,
) -> Result<BaselineReport, TransportError> {
    let len = geometry.frame_len();
    if len == 0 || slots == 0 {
        return Err(TransportError::refused(
            "the baseline needs frames of at least one byte and one slot",
        ));
    }
    let mut bench = Bench::new(
        ctx,
        BenchConfig {
            geometry,
            frames: slots,
            device: copy,
            streams: 1,
            events: slots,
            timing: false,
        },
    )?;
    let threads = frame_threads(len);
    let (mut failed, mut write_ns, mut verify_ns) = (0u64, 0u128, 0u128);
    let n = slots as u64;
    let mut checked = |bench: &mut Bench, index: usize, frame: u64| -> Result<(), TransportError> {
        let t = Instant::now();
        failed += u64::from(!check(bench, index, frame, threads)?);
        verify_ns += t.elapsed().as_nanos();
        Ok(())
    };
    let start = Instant::now();
    for frame in 0..frames {
        let index = (frame % n) as usize;
        if frame >= n {
            checked(&mut bench, index, frame - n)?;
        }
        let t = Instant::now();
        TestPattern::new(frame, geometry.stride)
            .fill_on_new_threads(bench.host_mut(index)?, threads);
        write_ns += t.elapsed().as_nanos();
        queue(&mut bench, index, frame)?;
    }
    let mut last_done = start;
    for frame in frames.saturating_sub(n)..frames {
        let index = (frame % n) as usize;
        checked(&mut bench, index, frame)?;
        last_done = Instant::now();
    }
    let wall = last_done.saturating_duration_since(start);
    bench.synchronize(0)?;
    let n = u128::from(frames.max(1));
    Ok(BaselineReport {
        frames,
        copy,
        wall,
        failed,
        write: Duration::from_nanos((write_ns / n) as u64),
        verify: Duration::from_nanos((verify_ns / n) as u64),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tegra_interop_sim::kernels::KernelSpec;

    /// The baseline runs on the simulator in both modes and verifies every
    /// frame, each slot used several times.
    #[test]
    #[cfg_attr(miri, ignore = "runs the simulator's stream threads and NVRTC model")]
    fn the_baseline_verifies_every_frame_on_the_simulator() {
        let sim = limit::tests::sim_with_kernels();
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let g = FrameGeometry {
            stride: 301,
            rows: 7,
        };
        for copy in [false, true] {
            let r = run_in(&ctx, g, 3, 10, copy).unwrap();
            assert_eq!((r.frames, r.failed, r.copy), (10, 0, copy));
            assert!(r.frames_per_s() > 0.0);
        }
    }

    /// A consumer that does not invert fails every frame's read-back: the
    /// baseline's check can fail.
    #[test]
    #[cfg_attr(miri, ignore = "runs the simulator's stream threads and NVRTC model")]
    fn a_kernel_that_does_not_invert_fails_every_frame() {
        let sim = limit::tests::sim_with_kernels();
        for name in ["check_and_invert", "check_and_invert_sysmem"] {
            sim.register_kernel(KernelSpec::new(name, &[8, 8, 8, 4, 8]), |_| Ok(()));
        }
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let g = FrameGeometry {
            stride: 64,
            rows: 3,
        };
        for copy in [false, true] {
            let r = run_in(&ctx, g, 2, 6, copy).unwrap();
            assert_eq!(r.failed, 6, "copy {copy}");
        }
    }
}
