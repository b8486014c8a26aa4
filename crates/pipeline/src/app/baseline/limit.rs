//! The machine's limit for the pipeline's work, measured in the same run as
//! the pipeline (`pipeline_vs_cuda`): what each piece of one frame's work
//! costs on this machine when nothing else runs, so that ours / limit says
//! how close the pipeline comes to what the hardware allows.
//!
//! The pieces ([`Pieces`]), each the mean over `reps` repetitions:
//! - a pinned copy of one frame host -> device and device -> host
//!   (`cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` from device-mapped pinned
//!   host memory), each alone, then both directions at once on two streams
//!   (the per-frame time of each while the other runs);
//! - the consumer's check-and-invert kernel ([`consumer::KERNEL_SOURCE`](crate::consumer::KERNEL_SOURCE),
//!   compiled with NVRTC through the driver) over mapped pinned host memory
//!   (zero-copy: the kernel reads and writes over PCIe) and over device
//!   memory, each on a frame holding the pattern it expects (no
//!   mismatches, as in the pipeline);
//! - the CPU's pattern write and read-back check of a frame on the
//!   pipeline's persistent band pools, at the pipeline's thread count
//!   ([`frame_threads`]), both running at once over warmed frames as in
//!   the pipeline (measured one after the other, each pool's threads fell
//!   asleep while the other worked, and the pieces came out about twice
//!   what the pipeline's own stages took).
//!
//! The limit of each mode ([`ModeLimit`]) is the slowest piece that mode
//! needs per frame, since a pipeline that overlaps its stages runs at best
//! at the rate of its slowest: zero-copy needs the mapped-memory kernel and
//! the CPU's write and check; copy mode needs the two copies (at their
//! both-directions-at-once time, the copy engines carrying one frame in and
//! another out at once), the device-memory kernel and the same CPU work.
//! [`ModeLimit::gpu_frames_per_s`] is the same bound without the CPU pieces.
//!
//! Each mode's limit is computed from its pieces measured all at once
//! ([`Loaded`]: the mode's GPU piece while the CPU fills and checks), since
//! in the pipeline they share the host's memory; the alone pieces are
//! reported beside them.
//!
//! Every call goes through the driver's function table, so the measurement
//! also runs on the simulator (with meaningless times: its tests check the
//! structure and the arithmetic, not the numbers).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tegra_interop::driver::{Backend, Context};

use crate::camera::{frame_threads, TestPattern};
use crate::consumer::bench::{Bench, BenchConfig, Target};
use crate::transport::{DriverResultExt, FrameGeometry, TransportError};

/// Trials of the CPU pieces and of each mode's all-at-once pieces; each
/// piece reported is its best trial's mean.
const TRIALS: usize = 3;

/// How long one measurement may take before it counts as stuck.
const STUCK: Duration = Duration::from_secs(30);

/// What each piece of one frame's work costs on this machine (mean per
/// frame; the CPU's and the all-at-once pieces the best of 3
/// trials), see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Pieces {
    /// Pinned host -> device copy of one frame, alone (us).
    pub copy_h2d_us: f64,
    /// Device -> pinned host copy of one frame, alone (us).
    pub copy_d2h_us: f64,
    /// Host -> device, while a device -> host copy runs on another stream (us).
    pub both_h2d_us: f64,
    /// Device -> host, while a host -> device copy runs on another stream (us).
    pub both_d2h_us: f64,
    /// The check-and-invert kernel over mapped pinned host memory (us).
    pub kernel_mapped_us: f64,
    /// The check-and-invert kernel over device memory (us).
    pub kernel_device_us: f64,
    /// The CPU's pattern write of one frame on the persistent pool, while
    /// the check runs (us; the GPU idle).
    pub cpu_fill_us: f64,
    /// The CPU's read-back check of one frame on its persistent pool,
    /// while the fill runs (us; the GPU idle).
    pub cpu_check_us: f64,
    /// The check of a frame the GPU just copied into pinned host memory,
    /// alone, one check after each copy (us): reported beside the limit
    /// (not in it) to compare with the warm frames of `cpu_check_us`.
    pub cpu_check_dma_us: f64,
    /// Each mode's pieces measured all at once, as the pipeline runs them
    /// (what the limit of each mode is computed from).
    pub loaded: Loaded,
    /// Threads of each CPU piece (the pipeline's [`frame_threads`]).
    pub threads: usize,
    /// Repetitions each mean is over.
    pub reps: u32,
}

/// Each mode's pieces measured while the others run: the GPU piece on the
/// calling thread, the CPU's fill and check on their pools at the same
/// time (as in the pipeline), each a mean per frame in us. Measured alone,
/// each piece has the host's memory to itself; in the pipeline the PCIe
/// transfers (or the mapped kernel's reads and writes) and the CPU's
/// writes and checks share it, so the alone pieces overstate what the
/// machine does for the whole work.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Loaded {
    /// Zero-copy: the mapped-memory kernel while the CPU fills and checks.
    pub kernel_mapped_us: f64,
    /// Zero-copy: the CPU's fill meanwhile.
    pub zero_copy_fill_us: f64,
    /// Zero-copy: the CPU's check meanwhile.
    pub zero_copy_check_us: f64,
    /// Copy mode: host -> device with device -> host at once, while the
    /// CPU fills and checks.
    pub both_h2d_us: f64,
    /// Copy mode: device -> host meanwhile.
    pub both_d2h_us: f64,
    /// Copy mode: the CPU's fill meanwhile.
    pub copy_fill_us: f64,
    /// Copy mode: the CPU's check meanwhile.
    pub copy_check_us: f64,
}

impl Loaded {
    /// Each piece at the better (smaller) of `self`'s and `other`'s.
    fn best(&self, other: &Loaded) -> Loaded {
        Loaded {
            kernel_mapped_us: self.kernel_mapped_us.min(other.kernel_mapped_us),
            zero_copy_fill_us: self.zero_copy_fill_us.min(other.zero_copy_fill_us),
            zero_copy_check_us: self.zero_copy_check_us.min(other.zero_copy_check_us),
            both_h2d_us: self.both_h2d_us.min(other.both_h2d_us),
            both_d2h_us: self.both_d2h_us.min(other.both_d2h_us),
            copy_fill_us: self.copy_fill_us.min(other.copy_fill_us),
            copy_check_us: self.copy_check_us.min(other.copy_check_us),
        }
    }
}

/// The limit of one mode: the slowest piece it needs per frame.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ModeLimit {
    /// The slowest piece's time per frame (us).
    pub frame_us: f64,
    /// Its name (a field of [`Pieces`], without `_us`).
    pub bound_by: &'static str,
    /// 1e6 / `frame_us`.
    pub frames_per_s: f64,
    /// The same bound over the GPU pieces only (copies, kernel), frames/s.
    pub gpu_frames_per_s: f64,
    /// The GPU piece that bounds `gpu_frames_per_s`.
    pub gpu_bound_by: &'static str,
}

impl ModeLimit {
    /// The limit over `gpu` and `cpu` pieces (name, us per frame).
    fn over(gpu: &[(&'static str, f64)], cpu: &[(&'static str, f64)]) -> ModeLimit {
        let slowest = |pieces: &mut dyn Iterator<Item = (&'static str, f64)>| {
            pieces.fold(("none", 0.0f64), |a, b| if b.1 > a.1 { b } else { a })
        };
        let (gpu_bound_by, gpu_us) = slowest(&mut gpu.iter().copied());
        let (bound_by, frame_us) = slowest(&mut gpu.iter().chain(cpu).copied());
        let rate = |us: f64| if us > 0.0 { 1e6 / us } else { f64::INFINITY };
        ModeLimit {
            frame_us,
            bound_by,
            frames_per_s: rate(frame_us),
            gpu_frames_per_s: rate(gpu_us),
            gpu_bound_by,
        }
    }
}

impl Pieces {
    /// Zero-copy: the mapped-memory kernel and the CPU's work, measured
    /// all at once ([`Loaded`]).
    pub fn zero_copy(&self) -> ModeLimit {
        let l = &self.loaded;
        ModeLimit::over(
            &[("kernel_mapped", l.kernel_mapped_us)],
            &[
                ("cpu_fill", l.zero_copy_fill_us),
                ("cpu_check", l.zero_copy_check_us),
            ],
        )
    }

    /// Copy mode: both copies at once and the CPU's work, measured all at
    /// once ([`Loaded`]), and the device-memory kernel (alone: it touches
    /// only device memory).
    pub fn copy(&self) -> ModeLimit {
        let l = &self.loaded;
        ModeLimit::over(
            &[
                ("both_h2d", l.both_h2d_us),
                ("both_d2h", l.both_d2h_us),
                ("kernel_device", self.kernel_device_us),
            ],
            &[("cpu_fill", l.copy_fill_us), ("cpu_check", l.copy_check_us)],
        )
    }

    /// The limit of zero-copy (`copy == false`) or copy mode.
    pub fn mode(&self, copy: bool) -> ModeLimit {
        if copy {
            self.copy()
        } else {
            self.zero_copy()
        }
    }
}

/// What the measurement works with: one frame in pinned mapped host memory
/// and one in device memory, a second pair for the other direction, two
/// streams, four timing events, the kernels: a [`Bench`] of the consumer
/// module (which queues the copies and the kernel and keeps the host off
/// memory the GPU still uses).
struct Rig {
    bench: Bench,
}

/// Microseconds per repetition of `total`.
fn per_rep(total: Duration, reps: u32) -> f64 {
    total.as_secs_f64() * 1e6 / f64::from(reps.max(1))
}

impl Rig {
    fn new(ctx: &Context, geometry: FrameGeometry) -> Result<Rig, TransportError> {
        let config = BenchConfig {
            geometry,
            frames: 2,
            device: true,
            streams: 2,
            events: 4,
            timing: true,
        };
        Ok(Rig {
            bench: Bench::new(ctx, config)?,
        })
    }

    fn geometry(&self) -> FrameGeometry {
        self.bench.config().geometry
    }

    fn record(&mut self, event: usize, stream: usize) -> Result<(), TransportError> {
        self.bench.record(event, stream)
    }

    /// Waits for both streams and returns the time between events `a` and
    /// `b`.
    fn span(&mut self, a: usize, b: usize) -> Result<Duration, TransportError> {
        for s in 0..2 {
            self.bench.synchronize(s)?;
        }
        self.bench.elapsed(a, b)
    }

    /// Queues `reps` host -> device copies on stream `s` (pair `s`).
    fn h2d(&mut self, s: usize, reps: u32) -> Result<(), TransportError> {
        for _ in 0..reps {
            self.bench.copy_in(s, s)?;
        }
        Ok(())
    }

    /// Queues `reps` device -> host copies on stream `s` (pair `s`).
    fn d2h(&mut self, s: usize, reps: u32) -> Result<(), TransportError> {
        for _ in 0..reps {
            self.bench.copy_out(s, s)?;
        }
        Ok(())
    }

    /// The copies: (h2d alone, d2h alone, h2d with d2h, d2h with h2d), us.
    fn copies(&mut self, reps: u32) -> Result<[f64; 4], TransportError> {
        self.record(0, 0)?;
        self.h2d(0, reps)?;
        self.record(1, 0)?;
        let h2d = per_rep(self.span(0, 1)?, reps);
        self.record(0, 1)?;
        self.d2h(1, reps)?;
        self.record(1, 1)?;
        let d2h = per_rep(self.span(0, 1)?, reps);
        let [both_h2d, both_d2h] = self.both(reps)?;
        Ok([h2d, d2h, both_h2d, both_d2h])
    }

    /// Both directions at once on the two streams: (h2d, d2h), us per
    /// frame of each while the other runs.
    fn both(&mut self, reps: u32) -> Result<[f64; 2], TransportError> {
        // The second stream starts when the first does.
        self.record(0, 0)?;
        self.bench.wait_event(1, 0)?;
        self.record(2, 1)?;
        self.h2d(0, reps)?;
        self.d2h(1, reps)?;
        self.record(1, 0)?;
        self.record(3, 1)?;
        let both_h2d = per_rep(self.span(0, 1)?, reps);
        let both_d2h = per_rep(self.span(2, 3)?, reps);
        Ok([both_h2d, both_d2h])
    }

    /// The CPU's read-back check of a frame the GPU just wrote into pinned
    /// host memory (a device -> host copy before each check, outside the
    /// timed span), on the check's pool at `threads` threads, us per frame:
    /// what the pipeline's verify stage reads (frames the GPU wrote over
    /// PCIe), against the warm frames of the CPU pieces. Reported beside
    /// the limit, not in it (one thread alternating copy and check).
    fn check_after_dma(&mut self, threads: usize, reps: u32) -> Result<f64, TransportError> {
        let g = self.geometry();
        let pattern = TestPattern::new(0, g.stride);
        pattern.fill(self.bench.host_mut(0)?);
        self.bench.copy_in(0, 0)?;
        self.bench.synchronize(0)?;
        let mut total = Duration::ZERO;
        for index in 0..u64::from(reps) {
            // Spoiled, so that a copy back that did not happen is caught.
            if let Some(b) = self.bench.host_mut(0)?.first_mut() {
                *b ^= 0xff;
            }
            self.bench.copy_out(0, 0)?;
            self.bench.synchronize(0)?;
            let host = self.bench.host(0)?;
            let t = Instant::now();
            let found = pattern.first_mismatch_parallel(host, 0, threads);
            total += t.elapsed();
            if let Some(at) = found {
                return Err(TransportError::frame_check(
                    0,
                    index,
                    format!("the CPU check found byte {at} off the pattern the GPU copied back"),
                ));
            }
        }
        Ok(per_rep(total, reps))
    }

    /// The kernel over pinned mapped memory (`mapped`) or device memory,
    /// us per frame; each repetition sees a frame holding its pattern.
    fn kernel(&mut self, mapped: bool, reps: u32) -> Result<f64, TransportError> {
        let g = self.geometry();
        let mut total = Duration::ZERO;
        for index in 0..u64::from(reps) {
            TestPattern::new(index, g.stride).fill(self.bench.host_mut(0)?);
            if !mapped {
                self.bench.copy_in(0, 0)?;
            }
            self.record(0, 0)?;
            let target = match mapped {
                true => Target::Host,
                false => Target::Device,
            };
            self.bench.check_and_invert(0, target, 0, index)?;
            self.record(1, 0)?;
            total += self.span(0, 1)?;
            let mismatches = self.bench.take_mismatches(0)?;
            if mismatches != 0 {
                return Err(TransportError::frame_check(
                    0,
                    index,
                    format!(
                    "the kernel found {mismatches} bytes off the pattern in a frame that holds it: the measurement does not run the pipeline's work"
                ),
                ));
            }
        }
        Ok(per_rep(total, reps))
    }
}

/// Frames each CPU piece cycles through (the pipeline's default ring): the
/// working set the camera's pool writes and the check's pool reads is as
/// large as in the pipeline, so neither piece runs from a cache the
/// pipeline would not have.
const CPU_FRAMES: usize = 4;

/// The frames the CPU pieces work on, warmed: every frame written once
/// (page faults and first touches outside the measurement); the check's
/// frames hold the pattern of their index in the ring, which the check
/// expects.
struct CpuFrames {
    written: Vec<Vec<u8>>,
    checked: Vec<Vec<u8>>,
}

impl CpuFrames {
    fn new(geometry: FrameGeometry, threads: usize) -> CpuFrames {
        let ring = || -> Vec<Vec<u8>> {
            (0..CPU_FRAMES)
                .map(|k| {
                    let mut f = vec![0u8; geometry.frame_len()];
                    TestPattern::new(k as u64, geometry.stride).fill_parallel(&mut f, threads);
                    f
                })
                .collect()
        };
        CpuFrames {
            written: ring(),
            checked: ring(),
        }
    }
}

/// The CPU pieces, measured as the pipeline runs them: the camera's
/// pattern write on its persistent band pool and the read-back check on
/// its own, at `threads` threads each, both at the same time (each from
/// its own thread, back to back, as the camera and the verify stage do),
/// each over a ring of [`CPU_FRAMES`] warmed frames of cached host memory
/// (what the pipeline's frames are: host-cached Vulkan memory, or the
/// producer's read-back copy), while `gpu` runs on the calling thread.
/// Each piece runs at least `min_reps` times and until `gpu` returned;
/// gives `gpu`'s result and the fill's and the check's mean per frame (us).
///
/// Measuring them one after the other instead (fill, then check, then the
/// next fill) let each pool's threads fall asleep while the other pool
/// worked, and waking them cost about as much as the work: on the H100
/// host that measured 409 / 458 us per frame where the pipeline's own
/// stages took 214 / 222 us, a "limit" the pipeline beat by 1.2-1.9 times.
fn cpu_at_once<R>(
    frames: &mut CpuFrames,
    geometry: FrameGeometry,
    threads: usize,
    min_reps: u32,
    gpu: impl FnOnce() -> Result<R, TransportError>,
) -> Result<(R, f64, f64), TransportError> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stride = geometry.stride;
    let (start, stop) = (std::sync::Barrier::new(3), AtomicBool::new(false));
    let more = |n: u64| n < u64::from(min_reps.max(1)) || !stop.load(Ordering::Acquire);
    let mean = |total: Duration, n: u64| total.as_secs_f64() * 1e6 / n.max(1) as f64;
    let CpuFrames { written, checked } = frames;
    let (gpu, fill, check) = std::thread::scope(|scope| {
        let filler = scope.spawn(|| {
            start.wait();
            let (mut total, mut n) = (Duration::ZERO, 0u64);
            while more(n) {
                let frame = &mut written[n as usize % CPU_FRAMES];
                let t = Instant::now();
                TestPattern::new(n, stride).fill_parallel(frame, threads);
                total += t.elapsed();
                n += 1;
            }
            mean(total, n)
        });
        let checker = scope.spawn(|| {
            start.wait();
            let (mut total, mut n) = (Duration::ZERO, 0u64);
            while more(n) {
                let k = n as usize % CPU_FRAMES;
                let t = Instant::now();
                let found = TestPattern::new(k as u64, stride).first_mismatch_parallel(
                    &checked[k],
                    0,
                    threads,
                );
                total += t.elapsed();
                if let Some(at) = found {
                    return Err((n, at));
                }
                n += 1;
            }
            Ok(mean(total, n))
        });
        start.wait();
        let gpu = gpu();
        stop.store(true, Ordering::Release);
        // Neither loop can panic; a thread that did anyway fails the
        // measurement rather than giving a time.
        (gpu, filler.join().ok(), checker.join().ok())
    });
    let lost = || TransportError::misuse("a CPU piece's measuring thread panicked");
    let fill = fill.ok_or_else(lost)?;
    let check = check.ok_or_else(lost)?.map_err(|(index, at)| {
        TransportError::frame_check(
            0,
            index,
            format!("the CPU check found byte {at} off the pattern the frame holds"),
        )
    })?;
    Ok((gpu?, fill, check))
}

/// Measures the [`Pieces`] for frames of `geometry` in `ctx`, each the mean
/// of `reps` repetitions (after one unmeasured round that warms up the
/// copies, the kernels and the CPU pools).
pub fn measure(
    ctx: &Context,
    geometry: FrameGeometry,
    reps: u32,
) -> Result<Pieces, TransportError> {
    if geometry.frame_len() == 0 || reps == 0 {
        return Err(TransportError::refused(
            "the limit needs a frame of at least one byte and one repetition",
        ));
    }
    let started = Instant::now();
    let threads = frame_threads(geometry.frame_len());
    let mut rig = Rig::new(ctx, geometry)?;
    let mut frames = CpuFrames::new(geometry, threads);
    rig.copies(1)?;
    rig.kernel(true, 1)?;
    rig.kernel(false, 1)?;
    cpu_at_once(&mut frames, geometry, threads, 1, || Ok(()))?;
    let [copy_h2d_us, copy_d2h_us, both_h2d_us, both_d2h_us] = rig.copies(reps)?;
    let kernel_mapped_us = rig.kernel(true, reps)?;
    let kernel_device_us = rig.kernel(false, reps)?;
    // Best of TRIALS for what runs all at once: an upper bound takes the
    // machine at its best, and one trial disturbed by the rest of the host
    // (one measured the fill at 323 us against 162-200 in the others)
    // would make the limit a pessimistic one.
    let (mut cpu_fill_us, mut cpu_check_us) = (f64::INFINITY, f64::INFINITY);
    let mut loaded: Option<Loaded> = None;
    for _ in 0..TRIALS {
        let ((), fill, check) = cpu_at_once(&mut frames, geometry, threads, reps, || Ok(()))?;
        cpu_fill_us = cpu_fill_us.min(fill);
        cpu_check_us = cpu_check_us.min(check);
        let (kernel_mapped_us, zero_copy_fill_us, zero_copy_check_us) =
            cpu_at_once(&mut frames, geometry, threads, 1, || rig.kernel(true, reps))?;
        let ([both_h2d_us, both_d2h_us], copy_fill_us, copy_check_us) =
            cpu_at_once(&mut frames, geometry, threads, 1, || rig.both(reps))?;
        let trial = Loaded {
            kernel_mapped_us,
            zero_copy_fill_us,
            zero_copy_check_us,
            both_h2d_us,
            both_d2h_us,
            copy_fill_us,
            copy_check_us,
        };
        loaded = Some(loaded.map_or(trial, |l| l.best(&trial)));
    }
    let loaded = loaded.ok_or_else(|| TransportError::misuse("no trial of the limit ran"))?;
    let cpu_check_dma_us = rig.check_after_dma(threads, reps)?;
    if started.elapsed() > STUCK {
        log_slow(started.elapsed());
    }
    Ok(Pieces {
        copy_h2d_us,
        copy_d2h_us,
        both_h2d_us,
        both_d2h_us,
        kernel_mapped_us,
        kernel_device_us,
        cpu_fill_us,
        cpu_check_us,
        cpu_check_dma_us,
        loaded,
        threads,
        reps,
    })
}

fn log_slow(took: Duration) {
    eprintln!("note: measuring the machine's limit took {took:?}");
}

/// [`measure`] on the real driver, device 0.
pub fn measure_real(geometry: FrameGeometry, reps: u32) -> Result<Pieces, TransportError> {
    let backend: Arc<Backend> = Backend::real().during("CUDA driver")?;
    let ctx = Context::new(backend, 0).during("CUDA context")?;
    measure(&ctx, geometry, reps)
}

/// One mode of the comparison: ours, plain CUDA and the limit.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModeRow {
    /// `zero-copy` or `copy`.
    pub mode: &'static str,
    /// The pipeline's frames/s (`None`: its run failed).
    pub ours_frames_per_s: Option<f64>,
    /// The plain-CUDA baseline's frames/s (`None`: its run failed).
    pub plain_frames_per_s: Option<f64>,
    /// The machine's limit for the mode (`None`: not measured).
    pub limit: Option<ModeLimit>,
    /// ours / limit.
    pub ours_over_limit: Option<f64>,
    /// Whether ours stayed at or below the limit (`None`: either is
    /// missing). A limit is an upper bound: `false` means its measurement
    /// underestimates the machine, not that the pipeline beat it.
    pub limit_holds: Option<bool>,
    /// ours / the GPU-only bound.
    pub ours_over_gpu_bound: Option<f64>,
    /// plain CUDA / limit.
    pub plain_over_limit: Option<f64>,
    /// ours / plain CUDA.
    pub ours_over_plain: Option<f64>,
    /// Ours' latency (the producer starts writing a frame -> the host sees
    /// the consumer's work on it done), median, in microseconds (`None`:
    /// not measured).
    pub ours_latency_p50_us: Option<f64>,
    /// Ours' latency, 99th percentile, in microseconds.
    pub ours_latency_p99_us: Option<f64>,
}

impl ModeRow {
    /// The row for `copy` mode from the measured rates and pieces: every
    /// ratio is computed here, from them.
    pub fn new(
        copy: bool,
        ours: Option<f64>,
        plain: Option<f64>,
        pieces: Option<&Pieces>,
    ) -> ModeRow {
        let limit = pieces.map(|p| p.mode(copy));
        let over = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
        let rate = limit.map(|l| l.frames_per_s);
        ModeRow {
            mode: if copy { "copy" } else { "zero-copy" },
            ours_frames_per_s: ours,
            plain_frames_per_s: plain,
            limit,
            ours_over_limit: over(ours, rate),
            limit_holds: ours.zip(rate).map(|(o, l)| o <= l),
            ours_over_gpu_bound: over(ours, limit.map(|l| l.gpu_frames_per_s)),
            plain_over_limit: over(plain, rate),
            ours_over_plain: ours.zip(plain).map(|(o, p)| o / p),
            ours_latency_p50_us: None,
            ours_latency_p99_us: None,
        }
    }

    /// The row with ours' latency percentiles (nanoseconds in, as the
    /// pipeline's report has them; microseconds kept).
    pub fn with_latency(mut self, p50_ns: u64, p99_ns: u64) -> ModeRow {
        self.ours_latency_p50_us = Some(p50_ns as f64 / 1e3);
        self.ours_latency_p99_us = Some(p99_ns as f64 / 1e3);
        self
    }
}

/// `pipeline_vs_cuda`'s whole result (its `--json` output).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// Version of this layout (1).
    pub schema_version: u32,
    /// The GPU's name as the driver reports it (device 0; `None`: not known).
    pub device: Option<String>,
    /// Bytes per line.
    pub stride: usize,
    /// Lines per frame.
    pub rows: usize,
    /// Ring slots of ours and the baseline.
    pub ring: usize,
    /// Frames per run.
    pub frames: u64,
    /// The limit's pieces (`None`: the measurement failed).
    pub pieces: Option<Pieces>,
    /// One row per mode run.
    pub modes: Vec<ModeRow>,
    /// Whether every run passed (verification included).
    pub passed: bool,
}

impl Comparison {
    /// The markdown table of the rows.
    pub fn table(&self) -> String {
        let f = |v: Option<f64>, digits: usize| v.map_or("-".into(), |v| format!("{v:.digits$}"));
        let mut out = String::from(
            "| mode | ours frames/s | plain CUDA frames/s | limit frames/s (bound by) | ours / limit | ours / GPU bound | plain / limit | ours / plain | ours latency p50 / p99 us |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &self.modes {
            let limit = r.limit.map_or("-".into(), |l| {
                format!("{:.1} ({})", l.frames_per_s, l.bound_by)
            });
            out.push_str(&format!(
                "| {} | {} | {} | {limit} | {} | {} | {} | {} | {} / {} |\n",
                r.mode,
                f(r.ours_frames_per_s, 1),
                f(r.plain_frames_per_s, 1),
                f(r.ours_over_limit, 3),
                f(r.ours_over_gpu_bound, 3),
                f(r.plain_over_limit, 3),
                f(r.ours_over_plain, 3),
                f(r.ours_latency_p50_us, 1),
                f(r.ours_latency_p99_us, 1),
            ));
        }
        out
    }

    /// One line per mode whose limit ours exceeded (a defect of the
    /// measurement, said as such), empty when every limit held.
    pub fn limit_warnings(&self) -> String {
        self.modes
            .iter()
            .filter(|r| r.limit_holds == Some(false))
            .map(|r| {
                format!(
                    "warning: ours ran above the measured limit in {} mode (ours / limit {:.3}): the limit's measurement underestimates this machine, so it is no upper bound\n",
                    r.mode,
                    r.ours_over_limit.unwrap_or(f64::NAN)
                )
            })
            .collect()
    }

    /// The pieces in one line (us per frame).
    pub fn pieces_line(&self) -> String {
        match &self.pieces {
            None => "limit: not measured".into(),
            Some(p) => format!(
                "limit pieces (us per frame, mean of {}): copy h2d {:.1}, d2h {:.1}; both at once h2d {:.1}, d2h {:.1}; kernel mapped {:.1}, device {:.1}; CPU fill {:.1}, check {:.1} ({} threads; fill and check at once, best of 3; check of a frame the GPU just wrote {:.1}); all at once (best of 3): zero-copy kernel mapped {:.1}, fill {:.1}, check {:.1}; copy both h2d {:.1}, d2h {:.1}, fill {:.1}, check {:.1}",
                p.reps,
                p.copy_h2d_us,
                p.copy_d2h_us,
                p.both_h2d_us,
                p.both_d2h_us,
                p.kernel_mapped_us,
                p.kernel_device_us,
                p.cpu_fill_us,
                p.cpu_check_us,
                p.threads,
                p.cpu_check_dma_us,
                p.loaded.kernel_mapped_us,
                p.loaded.zero_copy_fill_us,
                p.loaded.zero_copy_check_us,
                p.loaded.both_h2d_us,
                p.loaded.both_d2h_us,
                p.loaded.copy_fill_us,
                p.loaded.copy_check_us,
            ),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use tegra_interop_sim::kernels::KernelSpec;
    use tegra_interop_sim::Sim;

    /// A simulator with the consumer's four kernels registered (their
    /// Rust twins).
    pub(crate) fn sim_with_kernels() -> Sim {
        let sim = Sim::new().unwrap();
        crate::consumer::twin::register(&sim);
        sim
    }

    fn pieces(h2d: f64, d2h: f64, mapped: f64, device: f64, fill: f64, check: f64) -> Pieces {
        Pieces {
            copy_h2d_us: h2d * 0.9,
            copy_d2h_us: d2h * 0.9,
            both_h2d_us: h2d,
            both_d2h_us: d2h,
            kernel_mapped_us: mapped,
            kernel_device_us: device,
            cpu_fill_us: fill,
            cpu_check_us: check,
            cpu_check_dma_us: check,
            loaded: Loaded {
                kernel_mapped_us: mapped,
                zero_copy_fill_us: fill,
                zero_copy_check_us: check,
                both_h2d_us: h2d,
                both_d2h_us: d2h,
                copy_fill_us: fill,
                copy_check_us: check,
            },
            threads: 4,
            reps: 10,
        }
    }

    #[test]
    fn each_mode_is_bound_by_its_slowest_piece() {
        // The H100 figures: mapped kernel 255 us, copies 168 / 170 us
        // both at once, device kernel 16 us; CPU faster than all.
        let p = pieces(168.0, 170.0, 255.0, 16.0, 120.0, 150.0);
        let z = p.zero_copy();
        assert_eq!((z.bound_by, z.frame_us), ("kernel_mapped", 255.0));
        assert!((z.frames_per_s - 1e6 / 255.0).abs() < 1e-9);
        let c = p.copy();
        assert_eq!((c.bound_by, c.frame_us), ("both_d2h", 170.0));
        assert_eq!(c.gpu_bound_by, "both_d2h");
        // A slow CPU check bounds both modes; the GPU bound stays.
        let p = pieces(168.0, 170.0, 255.0, 16.0, 120.0, 336.0);
        assert_eq!(p.zero_copy().bound_by, "cpu_check");
        assert_eq!(p.copy().bound_by, "cpu_check");
        assert!((p.copy().gpu_frames_per_s - 1e6 / 170.0).abs() < 1e-9);
        assert_eq!(p.mode(true), p.copy());
        assert_eq!(p.mode(false), p.zero_copy());
    }

    /// A pipeline that overlaps its stages perfectly, each stage taking
    /// exactly its piece's time, runs at 1e6 / (its slowest stage): a limit
    /// is never below that rate for any mix of pieces, every piece a mode
    /// needs can bound it (none is left out), and a pipeline at that rate
    /// is within the limit (`limit_holds`) while one above it is reported.
    #[test]
    fn a_limit_is_never_below_a_pipeline_made_of_its_pieces() {
        let values = [5.0, 14.7, 152.0, 163.9, 214.0, 261.8, 409.2];
        let mut seen_bounds = std::collections::BTreeSet::new();
        for (i, &a) in values.iter().enumerate() {
            for (j, &b) in values.iter().enumerate() {
                for &c in &values {
                    let v = |k: usize| values[(i + j + k) % values.len()];
                    // Alone, every piece is faster than all at once.
                    let p = Pieces {
                        copy_h2d_us: v(0) * 0.9,
                        copy_d2h_us: v(1) * 0.9,
                        both_h2d_us: a * 0.5,
                        both_d2h_us: v(2) * 0.5,
                        kernel_mapped_us: b * 0.5,
                        kernel_device_us: v(3),
                        cpu_fill_us: c * 0.5,
                        cpu_check_us: v(4) * 0.5,
                        cpu_check_dma_us: v(4) * 3.0,
                        loaded: Loaded {
                            kernel_mapped_us: b,
                            zero_copy_fill_us: c,
                            zero_copy_check_us: v(4),
                            both_h2d_us: a,
                            both_d2h_us: v(2),
                            copy_fill_us: v(5),
                            copy_check_us: v(6),
                        },
                        threads: 4,
                        reps: 1,
                    };
                    let zero_copy = [b, c, v(4)];
                    let copy = [a, v(2), v(3), v(5), v(6)];
                    for (limit, stages) in [(p.zero_copy(), &zero_copy[..]), (p.copy(), &copy[..])]
                    {
                        let slowest = stages.iter().copied().fold(0.0, f64::max);
                        let pipeline = 1e6 / slowest;
                        assert!(
                            limit.frames_per_s >= pipeline * (1.0 - 1e-12),
                            "{p:?}: {limit:?}"
                        );
                        assert!(limit.gpu_frames_per_s >= limit.frames_per_s, "{limit:?}");
                        seen_bounds.insert(limit.bound_by);
                        let row = ModeRow::new(stages.len() == 5, Some(pipeline), None, Some(&p));
                        assert_eq!(row.limit_holds, Some(true), "{row:?}");
                        let above =
                            ModeRow::new(stages.len() == 5, Some(pipeline * 1.01), None, Some(&p));
                        assert_eq!(above.limit_holds, Some(false), "{above:?}");
                    }
                }
            }
        }
        let all = [
            "both_h2d",
            "both_d2h",
            "kernel_mapped",
            "kernel_device",
            "cpu_fill",
            "cpu_check",
        ];
        for name in all {
            assert!(
                seen_bounds.contains(name),
                "{name} never bounds a limit: {seen_bounds:?}"
            );
        }
    }

    #[test]
    fn the_best_trial_keeps_each_piece_at_its_smallest() {
        let a = pieces(170.0, 160.0, 250.0, 15.0, 200.0, 300.0).loaded;
        let b = pieces(180.0, 150.0, 260.0, 15.0, 190.0, 310.0).loaded;
        let best = a.best(&b);
        assert_eq!(best, b.best(&a));
        assert_eq!(
            (best.both_h2d_us, best.both_d2h_us, best.kernel_mapped_us),
            (170.0, 150.0, 250.0)
        );
        assert_eq!((best.copy_fill_us, best.copy_check_us), (190.0, 300.0));
        assert_eq!(
            (best.zero_copy_fill_us, best.zero_copy_check_us),
            (190.0, 300.0)
        );
    }

    #[test]
    fn rows_compute_every_ratio_from_the_measured_pieces() {
        let p = pieces(168.0, 170.0, 255.0, 16.0, 120.0, 200.0);
        let r = ModeRow::new(true, Some(2800.0), Some(3000.0), Some(&p));
        assert_eq!(r.mode, "copy");
        assert!((r.ours_over_limit.unwrap() - 2800.0 * 200.0 / 1e6).abs() < 1e-9);
        assert!((r.ours_over_gpu_bound.unwrap() - 2800.0 * 170.0 / 1e6).abs() < 1e-9);
        assert!((r.plain_over_limit.unwrap() - 3000.0 * 200.0 / 1e6).abs() < 1e-9);
        assert!((r.ours_over_plain.unwrap() - 2800.0 / 3000.0).abs() < 1e-12);
        let failed = ModeRow::new(false, None, Some(3000.0), Some(&p));
        assert_eq!(
            (failed.ours_over_limit, failed.ours_over_plain),
            (None, None)
        );
        assert!(failed.plain_over_limit.is_some());
        let unmeasured = ModeRow::new(false, Some(2800.0), Some(3000.0), None);
        assert_eq!(unmeasured.limit, None);
        assert_eq!(unmeasured.limit_holds, None);
        assert_eq!(unmeasured.ours_over_limit, None);
        assert!(unmeasured.ours_over_plain.is_some());
    }

    /// The comparison's JSON has every field the report promises.
    fn assert_json_has_every_field(c: &Comparison) {
        let json: serde_json::Value = serde_json::to_value(c).unwrap();
        assert_eq!(json["schema_version"], 1);
        assert_eq!(json["device"], "NVIDIA H100 80GB HBM3");
        for key in [
            "copy_h2d_us",
            "copy_d2h_us",
            "both_h2d_us",
            "both_d2h_us",
            "kernel_mapped_us",
            "kernel_device_us",
            "cpu_fill_us",
            "cpu_check_us",
            "cpu_check_dma_us",
            "threads",
            "reps",
        ] {
            assert!(json["pieces"][key].is_number(), "{key}: {json}");
        }
        for key in [
            "kernel_mapped_us",
            "zero_copy_fill_us",
            "zero_copy_check_us",
            "both_h2d_us",
            "both_d2h_us",
            "copy_fill_us",
            "copy_check_us",
        ] {
            assert!(json["pieces"]["loaded"][key].is_number(), "{key}: {json}");
        }
        assert_eq!(json["modes"][0]["mode"], "zero-copy");
        assert_eq!(json["modes"][1]["mode"], "copy");
        for m in 0..2 {
            for key in ["ours_over_limit", "ours_over_gpu_bound", "plain_over_limit"] {
                assert!(json["modes"][m][key].is_number(), "{key}: {json}");
            }
            assert!(json["modes"][m]["limit"]["bound_by"].is_string());
        }
    }

    /// The whole measurement runs on the simulator through the driver's
    /// function table (copies, events, NVRTC, module, launches, CPU pools),
    /// and the report built from it has every field, each ratio equal to
    /// the one computed from the measured pieces.
    #[test]
    #[cfg_attr(miri, ignore = "runs the simulator's stream threads and NVRTC model")]
    fn the_limit_is_measured_on_the_simulator_and_reported() {
        let sim = sim_with_kernels();
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let g = FrameGeometry {
            stride: 64 * 4,
            rows: 48,
        };
        let p = measure(&ctx, g, 3).unwrap();
        assert_eq!((p.reps, p.threads), (3, frame_threads(g.frame_len())));
        for v in [
            p.copy_h2d_us,
            p.copy_d2h_us,
            p.both_h2d_us,
            p.both_d2h_us,
            p.kernel_mapped_us,
            p.kernel_device_us,
            p.cpu_fill_us,
            p.cpu_check_us,
            p.cpu_check_dma_us,
            p.loaded.kernel_mapped_us,
            p.loaded.zero_copy_fill_us,
            p.loaded.zero_copy_check_us,
            p.loaded.both_h2d_us,
            p.loaded.both_d2h_us,
            p.loaded.copy_fill_us,
            p.loaded.copy_check_us,
        ] {
            assert!(v.is_finite() && v >= 0.0, "{p:?}");
        }
        let (ours, plain) = (1000.0, 1200.0);
        let modes: Vec<ModeRow> = [false, true]
            .iter()
            .map(|&copy| ModeRow::new(copy, Some(ours), Some(plain), Some(&p)))
            .collect();
        let mut modes = modes;
        modes[0] = modes[0].clone().with_latency(1_500, 2_250_000);
        assert_eq!(modes[1].ours_latency_p50_us, None);
        for (r, limit) in modes.iter().zip([p.zero_copy(), p.copy()]) {
            assert_eq!(r.limit, Some(limit));
            let want = ours / limit.frames_per_s;
            assert!((r.ours_over_limit.unwrap() - want).abs() <= 1e-12 * want.max(1.0));
        }
        let c = Comparison {
            schema_version: 1,
            device: Some("NVIDIA H100 80GB HBM3".into()),
            stride: g.stride,
            rows: g.rows,
            ring: 4,
            frames: 10,
            pieces: Some(p),
            modes,
            passed: true,
        };
        assert_json_has_every_field(&c);
        let json: serde_json::Value = serde_json::to_value(&c).unwrap();
        assert_eq!(json["modes"][0]["ours_latency_p50_us"], 1.5);
        assert_eq!(json["modes"][0]["ours_latency_p99_us"], 2250.0);
        assert!(json["modes"][1]["ours_latency_p99_us"].is_null());
        let table = c.table();
        assert_eq!(table.lines().count(), 4, "{table}");
        assert!(table.contains("| 1.5 / 2250.0 |"), "{table}");
        assert!(table.contains("| - / - |"), "{table}");
        assert!(c.pieces_line().contains("both at once"));
    }

    /// A kernel that does not see the pattern is an error, not a time: the
    /// measurement checks that it ran the pipeline's work.
    #[test]
    #[cfg_attr(miri, ignore = "runs the simulator's stream threads and NVRTC model")]
    fn a_kernel_that_miscounts_fails_the_measurement() {
        let sim = sim_with_kernels();
        sim.register_kernel(
            KernelSpec::new("check_and_invert_sysmem", &[8, 8, 8, 4, 8]),
            |k| {
                let counter = k.arg_u64(4)?;
                k.write(counter, &1u64.to_ne_bytes())
            },
        );
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let g = FrameGeometry {
            stride: 32,
            rows: 4,
        };
        let e = measure(&ctx, g, 2).unwrap_err().to_string();
        assert!(e.contains("bytes off the pattern"), "{e}");
    }
}
