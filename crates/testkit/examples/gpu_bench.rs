//! Overhead of the safe API against the bare CUDA driver calls, on a real GPU (feature
//! `vulkan`; Vulkan exports the memory and semaphores CUDA imports).
//!
//! ```text
//! cargo build --release -p tegra-interop-testkit --features vulkan --example gpu_bench
//! ./target/release/examples/gpu_bench [OUTPUT.md] [--json RESULT.json]
//! ```
//!
//! Everything runs in one process, side by side: the same context (cudarc's primary context,
//! as `Context::new` makes it), the same stream, semaphores and memory of the same kind. "raw"
//! is the C-level baseline: the bare function pointers of libcuda.so.1
//! (`tegra_interop_testkit::raw_cuda`), called with prepared parameter blocks and a check of the
//! result code, nothing else.
//!
//! With `GPU_BENCH_HANDOVER_ONLY` set, only the handover-latency table is
//! printed (the exporter's queue family is chosen with `TEGRA_INTEROP_VK_QUEUE`).
//!
//! - signal / wait / batched (8) signal / batched (8) wait: blocks of `BLOCK` calls, the two
//!   sides alternating block by block (and which goes first alternating too), the stream
//!   synchronised between blocks outside the timed region; the figure is the median over the
//!   blocks of the mean time per call. Waits are for a timeline value already reached.
//! - import+map and unmap+destroy of a 64 KiB device-local Vulkan allocation: one operation per
//!   sample (a fresh fd each time, exported outside the timed region), median over the samples.
//! - a steady-state frame loop (Vulkan compute batch waits for CUDA's previous frame and
//!   signals "ready"; a CUDA stream waits for "ready" and signals "done"; at most two frames in
//!   flight) with a counting global allocator: heap allocations per frame in our calls and in
//!   the whole frame (our calls + the Vulkan exporter's submit + the pacing wait).
//!
//! Writes a markdown report to stdout and, when given, to the file named by the first argument;
//! with `--json FILE`, the same rows as JSON (`tegra_interop_testkit::bench_json`, schema
//! version 1: times in ns, ratios ours/raw, the device's name).
#![allow(clippy::unwrap_used)]

use tegra_interop_testkit::bench_json::{
    median, percentile, BenchReport, FrameLoop, HandoverRow, PerCallRow,
};
use tegra_interop_testkit::raw_cuda;

use clap::Parser;

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use raw_cuda::RawCuda;
use tegra_interop::core::{SignalParams, WaitParams};
use tegra_interop::driver::stream::TimelineSignals;
use tegra_interop::driver::{
    Backend, Context, ExternalMemory, ExternalSemaphore, SemaphoreSignal, SemaphoreWait, Stream,
};
use tegra_interop::sys::cuda as sys;
use tegra_interop_platform::vulkan::{
    format_uuid, MemoryLocation, QueueChoice, SemaphoreOp, VulkanExporter,
};

// ---- counting allocator ----------------------------------------------------------------------

/// Counts every allocation (alloc, alloc_zeroed, realloc) made through Rust's allocator.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call unchanged to the system allocator; the counter has no effect on
// the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

// ---- measurement -----------------------------------------------------------------------------

/// Calls per timed block of the per-call benchmarks.
const BLOCK: u64 = 100;
/// Untimed warm-up blocks (per side) before the recorded ones.
const WARM_BLOCKS: usize = 50;
/// Recorded blocks per side.
const BLOCKS: usize = 2000;
/// Recorded import/destroy samples per side (plus `WARM_SAMPLES` untimed ones).
const SAMPLES: usize = 400;
const WARM_SAMPLES: usize = 20;
/// Frames of the frame loop (after `WARM_FRAMES` untimed ones).
const FRAMES: u64 = 5000;
const WARM_FRAMES: u64 = 200;
const WAIT: Duration = Duration::from_secs(10);

/// One timed measurement: mean time per call and allocations per call.
#[derive(Clone, Copy, Default)]
struct Sample {
    ns: f64,
    allocs: f64,
}

/// Runs `f` (which makes `calls` calls) and times it, counting allocations.
fn timed(calls: u64, f: impl FnOnce()) -> Sample {
    let a = allocations();
    let t = Instant::now();
    f();
    let ns = t.elapsed().as_nanos() as f64;
    let allocs = (allocations() - a) as f64;
    Sample {
        ns: ns / calls as f64,
        allocs: allocs / calls as f64,
    }
}

/// Ends a single-operation measurement started at (`allocations()`, `Instant::now()`).
fn stop(allocs_before: u64, start: Instant) -> Sample {
    let ns = start.elapsed().as_nanos() as f64;
    Sample {
        ns,
        allocs: (allocations() - allocs_before) as f64,
    }
}

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "gpu_bench",
    about = "Our driver calls against the raw libcuda calls, on a GPU with Vulkan as the exporter"
)]
struct Args {
    /// Also write the markdown report to this file
    output: Option<std::path::PathBuf>,
    /// Also write the results as JSON (schema version 1) to this file
    #[arg(long, value_name = "FILE")]
    json: Option<std::path::PathBuf>,
}

struct Row {
    name: String,
    ours: Vec<f64>,
    raw: Vec<f64>,
    ours_allocs: f64,
    raw_allocs: f64,
}

impl Row {
    fn ours_median(&mut self) -> f64 {
        median(&mut self.ours)
    }
    fn raw_median(&mut self) -> f64 {
        median(&mut self.raw)
    }
    /// The JSON row (the samples are sorted in place).
    fn json(&mut self) -> PerCallRow {
        PerCallRow::from_samples(
            &self.name,
            &mut self.ours,
            &mut self.raw,
            self.ours_allocs,
            self.raw_allocs,
        )
    }
}

/// Alternates `ours` and `raw` `warm + rounds` times (the first of the pair alternating too)
/// and collects the last `rounds` samples of each. Each call returns `K` samples (e.g. import
/// and destroy), which become `K` rows named by `names`.
fn compare<const K: usize>(
    names: [&str; K],
    warm: usize,
    rounds: usize,
    mut ours: impl FnMut() -> [Sample; K],
    mut raw: impl FnMut() -> [Sample; K],
) -> [Row; K] {
    let mut rows = names.map(|n| Row {
        name: n.to_owned(),
        ours: Vec::with_capacity(rounds),
        raw: Vec::with_capacity(rounds),
        ours_allocs: 0.0,
        raw_allocs: 0.0,
    });
    for round in 0..warm + rounds {
        let (o, r) = if round % 2 == 0 {
            let o = ours();
            (o, raw())
        } else {
            let r = raw();
            (ours(), r)
        };
        if round < warm {
            continue;
        }
        for k in 0..K {
            rows[k].ours.push(o[k].ns);
            rows[k].raw.push(r[k].ns);
            rows[k].ours_allocs += o[k].allocs / rounds as f64;
            rows[k].raw_allocs += r[k].allocs / rounds as f64;
        }
    }
    rows
}

/// Panics with the driver's name for a failed raw call.
fn ok(cu: &RawCuda, call: &'static str, r: sys::CUresult) {
    if let Err(e) = cu.check(call, r) {
        panic!("{e}");
    }
}

fn machine_line(cu: &RawCuda, vk: &VulkanExporter) -> String {
    let dev = cu.device(0).unwrap();
    let mut version = 0;
    // SAFETY: valid out pointer.
    ok(cu, "cuDriverGetVersion", unsafe {
        (cu.f.cuDriverGetVersion)(&mut version)
    });
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let (family, flags) = vk.queue_family();
    format!(
        "{} (uuid {}), CUDA driver API {}.{}, Vulkan {} ({} {}), queue family {family} \
         ({flags:?}); CPU {} ({} threads), kernel {}",
        cu.device_name(dev).unwrap(),
        format_uuid(&cu.device_uuid(dev).unwrap()),
        version / 1000,
        (version % 1000) / 10,
        vk.device_info().api_version_string(),
        vk.device_info().driver_name,
        vk.device_info().driver_info,
        cpu,
        cores,
        kernel
    )
}

/// Our side of the per-call semaphore rows: our stream and semaphores, and the values our
/// signals reach next.
struct OursSems<'a> {
    stream: &'a Stream,
    one: &'a mut ExternalSemaphore,
    eight: &'a mut [ExternalSemaphore; 8],
    value: u64,
    batch_value: u64,
}

impl<'o> OursSems<'o> {
    /// `BLOCK` signals of `one`, each to the next value.
    fn signal(&mut self) -> Sample {
        timed(BLOCK, || {
            for _ in 0..BLOCK {
                self.value += 1;
                self.stream
                    .signal(self.one, SignalParams::timeline(self.value))
                    .unwrap();
            }
        })
    }

    /// `BLOCK` waits on `one` for the value 1 (already reached).
    fn wait(&mut self) -> Sample {
        timed(BLOCK, || {
            for _ in 0..BLOCK {
                self.stream.wait(self.one, WaitParams::timeline(1)).unwrap();
            }
        })
    }

    /// `BLOCK` batched signals of `eight`, each to the next value.
    fn signal_batch(&mut self) -> Sample {
        timed(BLOCK, || {
            for _ in 0..BLOCK {
                self.batch_value += 1;
                let v = self.batch_value;
                self.stream
                    .signal_batch(
                        &mut self
                            .eight
                            .each_mut()
                            .map(|sem| SemaphoreSignal::timeline(sem, v)),
                    )
                    .unwrap();
            }
        })
    }

    /// `BLOCK` batched waits on `eight` for the value 1 (already reached).
    fn wait_batch(&mut self) -> Sample {
        timed(BLOCK, || {
            for _ in 0..BLOCK {
                self.stream
                    .wait_batch(
                        &self
                            .eight
                            .each_ref()
                            .map(|sem| SemaphoreWait::timeline(sem, 1)),
                    )
                    .unwrap();
            }
        })
    }
}

/// The raw side of the per-call semaphore rows: bare driver calls on the same stream, with
/// semaphores of its own and the values its signals reach next (cells, so that two closures of
/// one row can both signal the same counter).
struct RawSems<'a> {
    cu: &'a RawCuda,
    s: sys::CUstream,
    one: sys::CUexternalSemaphore,
    eight: [sys::CUexternalSemaphore; 8],
    value: std::cell::Cell<u64>,
    batch_value: std::cell::Cell<u64>,
}

impl<'r> RawSems<'r> {
    /// `BLOCK` signals of `one`, each to the next value, each after `bind()`.
    fn signal<B: Fn()>(&self, bind: &B) -> Sample {
        let f = self.cu.f;
        let mut p = sys::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
        timed(BLOCK, || {
            for _ in 0..BLOCK {
                let v = self.value.get() + 1;
                self.value.set(v);
                p.params.fence.value = v;
                bind();
                // SAFETY: a live imported semaphore, one parameter block, a live stream.
                let r = unsafe { (f.cuSignalExternalSemaphoresAsync)(&self.one, &p, 1, self.s) };
                ok(self.cu, "cuSignalExternalSemaphoresAsync", r);
            }
        })
    }

    /// `BLOCK` waits on `one` for the value 1 (already reached), each after `bind()`.
    fn wait<B: Fn()>(&self, bind: &B) -> Sample {
        let f = self.cu.f;
        let mut p = sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default();
        p.params.fence.value = 1;
        timed(BLOCK, || {
            for _ in 0..BLOCK {
                bind();
                // SAFETY: a live imported semaphore, one parameter block, a live stream.
                let r = unsafe { (f.cuWaitExternalSemaphoresAsync)(&self.one, &p, 1, self.s) };
                ok(self.cu, "cuWaitExternalSemaphoresAsync", r);
            }
        })
    }

    /// `BLOCK` batched signals of `eight`, each to the next value, each after `bind()`.
    fn signal_batch<B: Fn()>(&self, bind: &B) -> Sample {
        let f = self.cu.f;
        let mut p = [sys::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default(); 8];
        timed(BLOCK, || {
            for _ in 0..BLOCK {
                let v = self.batch_value.get() + 1;
                self.batch_value.set(v);
                for q in &mut p {
                    q.params.fence.value = v;
                }
                bind();
                // SAFETY: 8 live imported semaphores and 8 parameter blocks, a live stream.
                let r = unsafe {
                    (f.cuSignalExternalSemaphoresAsync)(self.eight.as_ptr(), p.as_ptr(), 8, self.s)
                };
                ok(self.cu, "cuSignalExternalSemaphoresAsync", r);
            }
        })
    }

    /// `BLOCK` batched waits on `eight` for the value 1 (already reached), each after `bind()`.
    fn wait_batch<B: Fn()>(&self, bind: &B) -> Sample {
        let f = self.cu.f;
        let mut p = [sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default(); 8];
        for q in &mut p {
            q.params.fence.value = 1;
        }
        timed(BLOCK, || {
            for _ in 0..BLOCK {
                bind();
                // SAFETY: 8 live imported semaphores and 8 parameter blocks, a live stream.
                let r = unsafe {
                    (f.cuWaitExternalSemaphoresAsync)(self.eight.as_ptr(), p.as_ptr(), 8, self.s)
                };
                ok(self.cu, "cuWaitExternalSemaphoresAsync", r);
            }
        })
    }
}

/// The four per-call semaphore rows (signal, wait, batched signal, batched wait, named by
/// `names`), `blocks` recorded blocks each; the raw side calls `bind` before each call (a no-op
/// closure for the plain rows; monomorphised, so it costs nothing there) and both sides
/// synchronise the stream with `sync` after each block, outside the timed region.
fn semaphore_rows<'o, 'r, B: Fn()>(
    names: [&str; 4],
    blocks: usize,
    ours: &mut OursSems<'o>,
    raw: &RawSems<'r>,
    bind: &B,
    sync: &impl Fn(),
) -> [Row; 4] {
    type OursFn<'o> = fn(&mut OursSems<'o>) -> Sample;
    type RawFn<'r, B> = fn(&RawSems<'r>, &B) -> Sample;
    let cases: [(OursFn<'o>, RawFn<'r, B>); 4] = [
        (OursSems::signal, RawSems::signal::<B>),
        (OursSems::wait, RawSems::wait::<B>),
        (OursSems::signal_batch, RawSems::signal_batch::<B>),
        (OursSems::wait_batch, RawSems::wait_batch::<B>),
    ];
    let mut k = 0;
    names.map(|name| {
        let (ours_block, raw_block) = cases[k];
        k += 1;
        let [row] = compare(
            [name],
            WARM_BLOCKS,
            blocks,
            || {
                let sample = ours_block(ours);
                sync();
                [sample]
            },
            || {
                let sample = raw_block(raw, bind);
                sync();
                [sample]
            },
        );
        row
    })
}

/// Writes the JSON report where `--json` asks for it.
fn write_json(args: &Args, report: &BenchReport) {
    if let Some(path) = &args.json {
        report.write_json(path).unwrap();
        println!("(JSON written to {})", path.display());
    }
}

fn main() {
    let args = Args::parse();
    let out_path = args.output.clone();

    let cu = RawCuda::load().unwrap();
    cu.init().unwrap();
    let uuid = cu.device_uuid(cu.device(0).unwrap()).unwrap();
    // The queue family `TEGRA_INTEROP_VK_QUEUE` asks for (the first with compute by default).
    let vk = VulkanExporter::with_queue(uuid, QueueChoice::from_env().unwrap()).unwrap();
    let machine = machine_line(&cu, &vk);
    println!("machine: {machine}");
    let device = cu.device_name(cu.device(0).unwrap()).unwrap();

    let backend = Backend::real().unwrap();
    let ctx = Context::new(backend.clone(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    ctx.bind().unwrap(); // the raw side relies on the context being current
    let s = stream.as_raw();
    let f = cu.f;
    if std::env::var_os("GPU_BENCH_HANDOVER_ONLY").is_some() {
        // Only the handover-latency table (for a queue family without
        // compute, whose exporter cannot run the frame loop's shader).
        println!("| handover | median | p10..p90 |\n|---|---:|---:|");
        let (family, flags) = vk.queue_family();
        let queue = format!("family {family} ({flags:?})");
        let mut json_rows = Vec::new();
        for (name, mut samples) in handover_latency(&cu, &vk, s) {
            json_rows.push(HandoverRow::from_samples(&queue, name, &mut samples));
            let m = median(&mut samples);
            let (p10, p90) = (percentile(&mut samples, 0.1), percentile(&mut samples, 0.9));
            println!(
                "| {name} | {} | {}..{} |",
                fmt_ns(m),
                fmt_ns(p10),
                fmt_ns(p90)
            );
        }
        write_json(
            &args,
            &BenchReport::new(machine, device, Vec::new(), None, json_rows),
        );
        return;
    }
    let sync = || {
        // SAFETY: a live stream.
        let r = unsafe { (f.cuStreamSynchronize)(s) };
        ok(&cu, "cuStreamSynchronize", r);
    };

    // Semaphores: each side its own Vulkan timeline semaphores (8 for the batches).
    let mut vk_sems = Vec::new();
    let mut ours_sems = Vec::new();
    for _ in 0..9 {
        let (fd, sem) = vk.export_timeline_semaphore(0).unwrap();
        sem.signal(1).unwrap(); // value 1 reached: the waits below never block
        vk_sems.push(sem);
        ours_sems.push(ExternalSemaphore::timeline_fd(&ctx, fd).unwrap());
    }
    let mut ours_one = ours_sems.remove(0);
    let mut ours_eight: [ExternalSemaphore; 8] = match ours_sems.try_into() {
        Ok(a) => a,
        Err(_) => unreachable!("8 semaphores were imported"),
    };
    let mut raw_sems: Vec<sys::CUexternalSemaphore> = Vec::new();
    for _ in 0..9 {
        let (fd, sem) = vk.export_timeline_semaphore(0).unwrap();
        sem.signal(1).unwrap();
        vk_sems.push(sem);
        raw_sems.push(cu.import_semaphore_fd(fd, true).unwrap());
    }
    let mut ours = OursSems {
        stream: &stream,
        one: &mut ours_one,
        eight: &mut ours_eight,
        value: 1,
        batch_value: 1,
    };
    let raw = RawSems {
        cu: &cu,
        s,
        one: raw_sems[0],
        eight: raw_sems[1..9].try_into().unwrap(),
        value: std::cell::Cell::new(1),
        batch_value: std::cell::Cell::new(1),
    };

    let mut rows: Vec<Row> = Vec::new();

    // -- signal, wait, batched signal (8), batched wait (8) --
    rows.extend(semaphore_rows(
        [
            "`Stream::signal` (timeline)",
            "`Stream::wait` (timeline, value reached)",
            "`Stream::signal_batch` (8 timelines, one call)",
            "`Stream::wait_batch` (8 timelines, one call)",
        ],
        BLOCKS,
        &mut ours,
        &raw,
        &|| {},
        &sync,
    ));

    // -- what our calls add: cuCtxSetCurrent (every call of ours makes its context current) --
    let c = ctx.as_raw();
    let raw_set_current = || {
        [timed(BLOCK, || {
            for _ in 0..BLOCK {
                // SAFETY: a live context.
                let r = unsafe { (f.cuCtxSetCurrent)(c) };
                ok(&cu, "cuCtxSetCurrent", r);
            }
        })]
    };
    let [row] = compare(
        ["(diagnosis) `Context::bind` vs raw `cuCtxSetCurrent`"],
        WARM_BLOCKS,
        BLOCKS / 4,
        || {
            [timed(BLOCK, || {
                for _ in 0..BLOCK {
                    ctx.bind().unwrap();
                }
            })]
        },
        raw_set_current,
    );
    rows.push(row);

    // -- what a "skip the bind when already current" check would cost --
    let [row] = compare(
        ["(diagnosis) raw `cuCtxGetCurrent` + compare vs raw `cuCtxSetCurrent`"],
        WARM_BLOCKS,
        BLOCKS / 4,
        || {
            [timed(BLOCK, || {
                for _ in 0..BLOCK {
                    let mut cur: sys::CUcontext = std::ptr::null_mut();
                    // SAFETY: a valid out pointer.
                    let r = unsafe { (f.cuCtxGetCurrent)(&mut cur) };
                    ok(&cu, "cuCtxGetCurrent", r);
                    assert_eq!(std::hint::black_box(cur), c);
                }
            })]
        },
        raw_set_current,
    );
    rows.push(row);

    // -- ours against raw calls that also make the context current first: what ours adds
    //    beyond the bind --
    rows.extend(semaphore_rows(
        [
            "(diagnosis) `Stream::signal` vs raw `cuCtxSetCurrent` + signal",
            "(diagnosis) `Stream::wait` vs raw `cuCtxSetCurrent` + wait",
            "(diagnosis) `Stream::signal_batch` (8) vs raw `cuCtxSetCurrent` + signal (8)",
            "(diagnosis) `Stream::wait_batch` (8) vs raw `cuCtxSetCurrent` + wait (8)",
        ],
        BLOCKS / 2,
        &mut ours,
        &raw,
        &|| {
            // SAFETY: a live context.
            ok(&cu, "cuCtxSetCurrent", unsafe { (f.cuCtxSetCurrent)(c) });
        },
        &sync,
    ));

    // -- the same eight semaphores as a `TimelineSignals` set (the fixed checks made once) --
    {
        // The values go on from the batch rows'; nothing signals these eight later.
        let mut v = ours.batch_value;
        let stream = ours.stream;
        let mut set = TimelineSignals::new(stream, ours.eight.iter_mut()).unwrap();
        let [row] = compare(
            ["`TimelineSignals::signal` (the same 8, a set made once; Vulkan reads the last values) vs raw `cuCtxSetCurrent` + signal (8)"],
            WARM_BLOCKS,
            BLOCKS / 2,
            || {
                let sample = timed(BLOCK, || {
                    for _ in 0..BLOCK {
                        v += 1;
                        set.signal(stream, &[v; 8]).unwrap();
                    }
                });
                sync();
                [sample]
            },
            || {
                let sample = raw.signal_batch(&|| {
                    // SAFETY: a live context.
                    ok(&cu, "cuCtxSetCurrent", unsafe { (f.cuCtxSetCurrent)(c) });
                });
                sync();
                [sample]
            },
        );
        rows.push(row);
        // The signals reached the device: each exporter-side semaphore reads
        // the last value (the bench stops here otherwise).
        sync();
        for (i, sem) in vk_sems[1..9].iter().enumerate() {
            assert_eq!(sem.value().unwrap(), v, "semaphore {i} of the set");
        }
    }

    // -- does an explicit stream need its context current? --
    let (experiment, other_ctx, foreign_signal_ok) = context_experiment(&cu, &vk, c, s);
    // Both sides signal the same raw semaphore, alternately: one increasing counter.
    if foreign_signal_ok {
        let [row] = compare(
            ["(diagnosis) raw signal with another context current vs with its own current"],
            WARM_BLOCKS,
            BLOCKS / 4,
            || {
                // SAFETY: a live context (created by the experiment).
                ok(&cu, "cuCtxSetCurrent", unsafe {
                    (f.cuCtxSetCurrent)(other_ctx)
                });
                let sample = raw.signal(&|| {});
                // SAFETY: a live context.
                ok(&cu, "cuCtxSetCurrent", unsafe { (f.cuCtxSetCurrent)(c) });
                sync();
                [sample]
            },
            || {
                let sample = raw.signal(&|| {});
                sync();
                [sample]
            },
        );
        rows.push(row);
    }
    // The value of the last raw signal must have arrived in Vulkan.
    assert!(vk_sems[9].wait(raw.value.get(), WAIT).unwrap());
    // SAFETY: the context made by the experiment; nothing of ours lives in it; it is not
    // current (the bench's own context is).
    ok(&cu, "cuCtxDestroy", unsafe { (f.cuCtxDestroy)(other_ctx) });
    // SAFETY: a live context.
    ok(&cu, "cuCtxSetCurrent", unsafe { (f.cuCtxSetCurrent)(c) });

    // -- import + map, unmap + destroy --
    const MEM_SIZE: u64 = 64 * 1024;
    let vk_mem = vk
        .allocate_memory(MEM_SIZE, MemoryLocation::DeviceLocal)
        .unwrap();
    let mem_size = vk_mem.size();
    let import_rows = compare(
        [
            "`ExternalMemory::opaque_fd` + `map_whole` (64 KiB)",
            "`MappedBuffer::destroy` + `ExternalMemory::destroy`",
        ],
        WARM_SAMPLES,
        SAMPLES,
        || {
            let fd = vk_mem.export_fd().unwrap();
            let (a, t) = (allocations(), Instant::now());
            let memory = ExternalMemory::opaque_fd(&ctx, fd, mem_size).unwrap();
            let buffer = memory.map_whole().unwrap();
            let import = stop(a, t);
            let (a, t) = (allocations(), Instant::now());
            buffer.destroy().unwrap();
            memory.destroy().unwrap();
            let destroy = stop(a, t);
            [import, destroy]
        },
        || {
            let fd = vk_mem.export_fd().unwrap();
            let raw_fd = fd.as_raw_fd();
            let mut handles = (std::ptr::null_mut(), 0);
            let import = timed(1, || {
                let mut desc = sys::CUDA_EXTERNAL_MEMORY_HANDLE_DESC {
                    type_: sys::CUexternalMemoryHandleType_enum::CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD,
                    size: mem_size,
                    ..Default::default()
                };
                desc.handle.fd = raw_fd;
                let mut mem: sys::CUexternalMemory = std::ptr::null_mut();
                // SAFETY: a fully initialised descriptor naming an fd we own.
                ok(&cu, "cuImportExternalMemory", unsafe {
                    (f.cuImportExternalMemory)(&mut mem, &desc)
                });
                let buf = sys::CUDA_EXTERNAL_MEMORY_BUFFER_DESC {
                    size: mem_size,
                    ..Default::default()
                };
                let mut ptr: sys::CUdeviceptr = 0;
                // SAFETY: a live import and a descriptor inside it.
                ok(&cu, "cuExternalMemoryGetMappedBuffer", unsafe {
                    (f.cuExternalMemoryGetMappedBuffer)(&mut ptr, mem, &buf)
                });
                handles = (mem, ptr);
            });
            // The driver owns the fd after a successful import.
            let _ = std::os::fd::IntoRawFd::into_raw_fd(fd);
            let (mem, ptr) = handles;
            let destroy = timed(1, || {
                // SAFETY: the mapping and the import made above, each released once.
                ok(&cu, "cuMemFree", unsafe { (f.cuMemFree)(ptr) });
                // SAFETY: as above.
                ok(&cu, "cuDestroyExternalMemory", unsafe {
                    (f.cuDestroyExternalMemory)(mem)
                });
            });
            [import, destroy]
        },
    );
    rows.extend(import_rows);

    // -- steady-state frame loop --
    let counter_mem = vk
        .allocate_memory(
            vk.storage_offset_alignment().max(4),
            MemoryLocation::DeviceLocal,
        )
        .unwrap();
    vk.upload(&counter_mem, 0, &0u32.to_ne_bytes(), &[], &[])
        .unwrap();
    let increment = vk.counter_incrementer(&counter_mem, 0).unwrap();
    let (ready_fd, ready) = vk.export_timeline_semaphore(0).unwrap();
    let (done_fd, done) = vk.export_timeline_semaphore(0).unwrap();
    let ready_cuda = ExternalSemaphore::timeline_fd(&ctx, ready_fd).unwrap();
    let mut done_cuda = ExternalSemaphore::timeline_fd(&ctx, done_fd).unwrap();
    let mut ours_allocs = 0u64;
    let mut frame_allocs = 0u64;
    let mut frame_ns = Vec::with_capacity(FRAMES as usize);
    for frame in 1..=WARM_FRAMES + FRAMES {
        let a0 = allocations();
        let t0 = Instant::now();
        vk.submit_increment(
            &increment,
            &[SemaphoreOp::timeline(&done, frame - 1)],
            &[SemaphoreOp::timeline(&ready, frame)],
        )
        .unwrap();
        let a1 = allocations();
        stream
            .wait(&ready_cuda, WaitParams::timeline(frame))
            .unwrap();
        stream
            .signal(&mut done_cuda, SignalParams::timeline(frame))
            .unwrap();
        let a2 = allocations();
        if frame > 2 {
            assert!(done.wait(frame - 2, WAIT).unwrap(), "frame {frame} stalled");
        }
        let elapsed = t0.elapsed();
        let a3 = allocations();
        if frame > WARM_FRAMES {
            ours_allocs += a2 - a1;
            frame_allocs += a3 - a0;
            frame_ns.push(elapsed.as_nanos() as f64);
        }
    }
    stream.synchronize().unwrap();
    let total = WARM_FRAMES + FRAMES;
    assert!(done.wait(total, WAIT).unwrap());
    assert!(vk.wait_idle(WAIT).unwrap());
    let mut bytes = [0u8; 4];
    vk.download(&counter_mem, 0, &mut bytes, &[], &[]).unwrap();
    let counted = u64::from(u32::from_ne_bytes(bytes));
    assert_eq!(counted, total, "the frame loop lost or repeated a frame");

    // -- report --
    let mut md = String::new();
    writeln!(md, "Machine: {machine}\n").unwrap();
    writeln!(
        md,
        "Per-call figures: median over {BLOCKS} blocks of {BLOCK} calls per side (after \
         {WARM_BLOCKS} warm-up blocks), sides alternating; import/destroy: median over \
         {SAMPLES} single operations per side (after {WARM_SAMPLES}).\n"
    )
    .unwrap();
    writeln!(
        md,
        "| operation | ours (median) | raw (median) | ratio ours/raw | ours p10..p90 | raw p10..p90 | heap allocs per call (ours / raw) |"
    )
    .unwrap();
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|").unwrap();
    let mut worst = 0.0f64;
    let mut json_rows = Vec::new();
    for row in &mut rows {
        json_rows.push(row.json());
        let (o, r) = (row.ours_median(), row.raw_median());
        let ratio = o / r;
        if !row.name.starts_with("(diagnosis)") {
            worst = worst.max(ratio);
        }
        let (o10, o90) = (
            percentile(&mut row.ours, 0.1),
            percentile(&mut row.ours, 0.9),
        );
        let (r10, r90) = (percentile(&mut row.raw, 0.1), percentile(&mut row.raw, 0.9));
        writeln!(
            md,
            "| {} | {} | {} | {:.3} | {}..{} | {}..{} | {:.2} / {:.2} |",
            row.name,
            fmt_ns(o),
            fmt_ns(r),
            ratio,
            fmt_ns(o10),
            fmt_ns(o90),
            fmt_ns(r10),
            fmt_ns(r90),
            row.ours_allocs,
            row.raw_allocs
        )
        .unwrap();
    }
    let frame_median = median(&mut frame_ns);
    let frame_loop = FrameLoop {
        frames: FRAMES,
        median_frame_ns: frame_median,
        ours_allocations: ours_allocs,
        frame_allocations: frame_allocs,
    };
    writeln!(
        md,
        "\nFrame loop: {FRAMES} steady-state frames (after {WARM_FRAMES}), counter checked \
         ({counted} increments). Median frame {} (host side: Vulkan submit + CUDA wait + CUDA \
         signal + pacing wait for frame n-2).\n",
        fmt_ns(frame_median)
    )
    .unwrap();
    writeln!(md, "| heap allocations | total | per frame |").unwrap();
    writeln!(md, "|---|---:|---:|").unwrap();
    writeln!(
        md,
        "| our calls (`Stream::wait` + `Stream::signal`) | {ours_allocs} | {:.3} |",
        ours_allocs as f64 / FRAMES as f64
    )
    .unwrap();
    writeln!(
        md,
        "| whole frame (incl. Vulkan exporter submit and pacing wait) | {frame_allocs} | {:.3} |",
        frame_allocs as f64 / FRAMES as f64
    )
    .unwrap();
    writeln!(
        md,
        "\nGoals: ratio <= 1.05 (worst per-call ratio here: {worst:.3}: {}); zero heap \
         allocations per steady-state frame ({}).",
        if worst <= 1.05 { "met" } else { "MISSED" },
        if ours_allocs == 0 && frame_allocs == 0 {
            "met"
        } else {
            "MISSED"
        }
    )
    .unwrap();
    writeln!(
        md,
        "\nContext-current experiment (raw calls on the bench's stream, whose context is A; B \
         is a second context made with `cuCtxCreate`):\n"
    )
    .unwrap();
    for line in &experiment {
        writeln!(md, "- {line}").unwrap();
    }
    writeln!(
        md,
        "\nHandover latency, raw calls only, one handover in flight at a time (median over \
         {LATENCY_SAMPLES} after {LATENCY_WARM}; completion seen by spinning on \
         `cuStreamQuery` or `vkGetSemaphoreCounterValue` on the host):\n"
    )
    .unwrap();
    writeln!(md, "| handover | median | p10..p90 |").unwrap();
    writeln!(md, "|---|---:|---:|").unwrap();
    // The bench's exporter (queue family as `TEGRA_INTEROP_VK_QUEUE` says, the first with
    // compute by default), then a second one on a transfer-only family where there is one.
    let (family, flags) = vk.queue_family();
    let transfer = VulkanExporter::with_queue(uuid, QueueChoice::TransferOnly).ok();
    let mut exporters = vec![(format!("family {family} ({flags:?})"), &vk)];
    if let Some(t) = &transfer {
        let (family, flags) = t.queue_family();
        exporters.push((format!("family {family} ({flags:?})"), t));
    }
    let mut handover_rows = Vec::new();
    for (queue, exporter) in exporters {
        for (name, mut samples) in handover_latency(&cu, exporter, s) {
            handover_rows.push(HandoverRow::from_samples(&queue, name, &mut samples));
            let m = median(&mut samples);
            let (p10, p90) = (percentile(&mut samples, 0.1), percentile(&mut samples, 0.9));
            writeln!(
                md,
                "| [{queue}] {name} | {} | {}..{} |",
                fmt_ns(m),
                fmt_ns(p10),
                fmt_ns(p90)
            )
            .unwrap();
        }
    }
    print!("{md}");
    if let Some(path) = out_path {
        std::fs::write(&path, &md).unwrap();
        println!("(written to {})", path.display());
    }
    write_json(
        &args,
        &BenchReport::new(machine, device, json_rows, Some(frame_loop), handover_rows),
    );

    // -- teardown (explicit, checked) --
    drop(increment);
    for sem in raw_sems {
        cu.destroy_semaphore(sem).unwrap();
    }
    drop((ready_cuda, done_cuda, ours_one, ours_eight));
    stream.destroy().unwrap();
    ctx.destroy().unwrap();
    let errors = backend.take_drop_errors();
    assert!(errors.is_empty(), "{errors:?}");
}

/// Checks on the real driver whether `cuSignalExternalSemaphoresAsync` /
/// `cuWaitExternalSemaphoresAsync` on an explicit stream need the stream's context to be current:
/// with another context current, and with none, each call's result code and whether the value
/// arrives (signal) or is honoured (wait). Returns the findings, one line each, and the second
/// context (for the timing row; the caller destroys it) and whether a signal with it current
/// succeeded. Leaves context A current.
fn context_experiment(
    cu: &RawCuda,
    vk: &VulkanExporter,
    a: sys::CUcontext,
    s: sys::CUstream,
) -> (Vec<String>, sys::CUcontext, bool) {
    let f = cu.f;
    let mut lines = Vec::new();
    let mut foreign_signal_ok = false;
    let name = |r: sys::CUresult| match cu.check("call", r) {
        Ok(()) => "CUDA_SUCCESS".to_owned(),
        Err(e) => format!("{} ({})", e.name, e.code),
    };
    let set = |c: sys::CUcontext| {
        // SAFETY: a live context or null (unbinds).
        ok(cu, "cuCtxSetCurrent", unsafe { (f.cuCtxSetCurrent)(c) });
    };
    let dev = cu.device(0).unwrap();
    let mut b: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out pointer and device; the new context becomes current.
    ok(cu, "cuCtxCreate", unsafe {
        (f.cuCtxCreate)(&mut b, 0, dev)
    });
    let mut stream_ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: a live stream and a valid out pointer.
    ok(cu, "cuStreamGetCtx", unsafe {
        (f.cuStreamGetCtx)(s, &mut stream_ctx)
    });
    lines.push(format!(
        "`cuStreamGetCtx(stream)` is A: {}",
        stream_ctx == a
    ));
    let (fd, vsem) = vk.export_timeline_semaphore(0).unwrap();
    let sem = cu.import_semaphore_fd(fd, true).unwrap();
    let query = || {
        set(a);
        // SAFETY: a live stream.
        let r = unsafe { (f.cuStreamQuery)(s) };
        name(r)
    };
    for (label, current) in [
        ("B current", b),
        ("no context current", std::ptr::null_mut()),
    ] {
        // Signal: value arrives?
        let value = vsem.value().unwrap() + 1;
        let mut p = sys::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
        p.params.fence.value = value;
        set(current);
        // SAFETY: a live semaphore imported into A, one parameter block, A's live stream.
        let r = unsafe { (f.cuSignalExternalSemaphoresAsync)(&sem, &p, 1, s) };
        let signal_code = name(r);
        if current == b && r.0 == 0 {
            foreign_signal_ok = true;
        }
        set(a);
        cu.sync(s).unwrap();
        let arrived = vsem.wait(value, Duration::from_secs(2)).unwrap();
        lines.push(format!(
            "{label}: signal of {value} on A's stream returned {signal_code}; value reached              Vulkan: {arrived} (Vulkan reads {})",
            vsem.value().unwrap()
        ));
        // Wait: honoured (stream blocked until Vulkan signals)?
        let value = vsem.value().unwrap() + 1;
        let mut p = sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default();
        p.params.fence.value = value;
        set(current);
        // SAFETY: as above, for a wait.
        let r = unsafe { (f.cuWaitExternalSemaphoresAsync)(&sem, &p, 1, s) };
        let wait_code = name(r);
        std::thread::sleep(Duration::from_millis(20));
        let before = query();
        vsem.signal(value).unwrap();
        set(a);
        cu.sync(s).unwrap();
        let after = query();
        lines.push(format!(
            "{label}: wait for {value} on A's stream returned {wait_code}; stream before the              Vulkan signal: {before}, after it: {after}"
        ));
    }
    set(a);
    cu.destroy_semaphore(sem).unwrap();
    drop(vsem);
    (lines, b, foreign_signal_ok)
}

/// Samples per handover-latency row, and warm-up handovers before them.
const LATENCY_SAMPLES: usize = 300;
const LATENCY_WARM: usize = 30;

/// How long a handover takes to be seen on the other side, with raw calls
/// only (the floor under any handover built on the same mechanism): from the
/// host call that makes the value available to the other side observing it.
/// One handover in flight; the stream is idle or blocked in the wait.
fn handover_latency(
    cu: &RawCuda,
    vk: &VulkanExporter,
    s: sys::CUstream,
) -> Vec<(&'static str, Vec<f64>)> {
    let f = cu.f;
    let (fd, vsem) = vk.export_timeline_semaphore(0).unwrap();
    let sem = cu.import_semaphore_fd(fd, true).unwrap();
    // Host-only: tells the host that a batch finished.
    let (_batch_fd, batch_done) = vk.export_timeline_semaphore(0).unwrap();
    let mut value = 0u64;
    let stream_done = || loop {
        // SAFETY: a live stream.
        let r = unsafe { (f.cuStreamQuery)(s) };
        if r.0 == 0 {
            break;
        }
        ok(
            cu,
            "cuStreamQuery (not ready is 600)",
            if r.0 == 600 { sys::CUresult(0) } else { r },
        );
        std::hint::spin_loop();
    };
    let cuda_wait = |v: u64| {
        let mut p = sys::CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default();
        p.params.fence.value = v;
        // SAFETY: a live imported semaphore, one parameter block, a live stream.
        let r = unsafe { (f.cuWaitExternalSemaphoresAsync)(&sem, &p, 1, s) };
        ok(cu, "cuWaitExternalSemaphoresAsync", r);
    };
    let cuda_signal = |v: u64| {
        let mut p = sys::CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
        p.params.fence.value = v;
        // SAFETY: as above, for a signal.
        let r = unsafe { (f.cuSignalExternalSemaphoresAsync)(&sem, &p, 1, s) };
        ok(cu, "cuSignalExternalSemaphoresAsync", r);
    };
    let host_sees = |v: u64| {
        while vsem.value().unwrap() < v {
            std::hint::spin_loop();
        }
    };
    let mut run = |name: &'static str, one: &mut dyn FnMut(u64) -> Duration| {
        let mut samples = Vec::with_capacity(LATENCY_SAMPLES);
        for i in 0..LATENCY_WARM + LATENCY_SAMPLES {
            value += 1;
            let d = one(value);
            if i >= LATENCY_WARM {
                samples.push(d.as_nanos() as f64);
            }
        }
        (name, samples)
    };
    let mut rows = Vec::new();
    rows.push(run(
        "Vulkan queue submission that signals -> host sees the value",
        &mut |v| {
            let t0 = Instant::now();
            vk.submit(&[], &[SemaphoreOp::timeline(&vsem, v)]).unwrap();
            host_sees(v);
            t0.elapsed()
        },
    ));
    rows.push(run(
        "Vulkan queue submission that signals -> CUDA stream (blocked in the wait) past it",
        &mut |v| {
            cuda_wait(v);
            let t0 = Instant::now();
            vk.submit(&[], &[SemaphoreOp::timeline(&vsem, v)]).unwrap();
            stream_done();
            t0.elapsed()
        },
    ));
    rows.push(run(
        "host `vkSignalSemaphore` -> CUDA stream (blocked in the wait) past it",
        &mut |v| {
            cuda_wait(v);
            let t0 = Instant::now();
            vsem.signal(v).unwrap();
            stream_done();
            t0.elapsed()
        },
    ));
    rows.push(run(
        "Vulkan queue submission, host waits for it, host `vkSignalSemaphore` -> CUDA stream \
         (blocked in the wait) past it (a handover measured for the pipeline and dropped)",
        &mut |v| {
            cuda_wait(v);
            let t0 = Instant::now();
            vk.submit(&[], &[SemaphoreOp::timeline(&batch_done, v)])
                .unwrap();
            while batch_done.value().unwrap() < v {
                std::hint::spin_loop();
            }
            vsem.signal(v).unwrap();
            stream_done();
            t0.elapsed()
        },
    ));
    rows.push(run(
        "Vulkan queue submission that signals, CUDA wait queued after it -> stream past it",
        &mut |v| {
            let t0 = Instant::now();
            vk.submit(&[], &[SemaphoreOp::timeline(&vsem, v)]).unwrap();
            cuda_wait(v);
            stream_done();
            t0.elapsed()
        },
    ));
    rows.push(run(
        "Vulkan queue submission that signals, host waits for it, then the CUDA wait \
         (value reached) queued on the idle stream -> stream past it",
        &mut |v| {
            let t0 = Instant::now();
            vk.submit(&[], &[SemaphoreOp::timeline(&vsem, v)]).unwrap();
            host_sees(v);
            cuda_wait(v);
            stream_done();
            t0.elapsed()
        },
    ));
    rows.push(run(
        "Vulkan queue submission, host waits for it, then a CUDA signal on the idle stream \
         -> host sees the value (no wait: the context switch alone)",
        &mut |v| {
            let t0 = Instant::now();
            vk.submit(&[], &[SemaphoreOp::timeline(&batch_done, v)])
                .unwrap();
            while batch_done.value().unwrap() < v {
                std::hint::spin_loop();
            }
            cuda_signal(v);
            host_sees(v);
            t0.elapsed()
        },
    ));
    rows.push(run(
        "CUDA signal on an idle stream -> host sees the value",
        &mut |v| {
            let t0 = Instant::now();
            cuda_signal(v);
            host_sees(v);
            t0.elapsed()
        },
    ));
    cu.sync(s).unwrap();
    cu.destroy_semaphore(sem).unwrap();
    drop((vsem, batch_done));
    rows
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 10_000.0 {
        format!("{:.1} us", ns / 1000.0)
    } else {
        format!("{ns:.0} ns")
    }
}
