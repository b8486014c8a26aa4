//! `multicast_bench`: the multicast ring measured as NvSciStream would be
//! judged, against the one-consumer lease ring in the same run.
//!
//! Frames of `--width` x `--height` RGBA8 (1920x1080 by default), the
//! test pattern written by the producer, every consumer running the
//! check-and-invert kernel on its own device copy of the slot (the
//! multicast ring's consumers may not write the shared slot), each frame
//! verified. Rows:
//!
//! - `ring`: the one-consumer [`Ring`] with the same work and placement
//!   (the baseline of the ratio): on the simulator its NvSci transport with
//!   the work on a device copy, as the multicast consumers do it; on the
//!   GPU its Vulkan transport (`GpuTransport`) in its device-copy mode
//!   (which also copies the processed frame back into the slot);
//! - multicast rows over `CudaFanout` (the simulator's memfd exporter, or
//!   the Vulkan exporter with `--backend gpu`): 1 and 4 FIFO consumers (per-hop
//!   latency), then 1, 2 and 4 consumers one of which is a mailbox
//!   consumer `--slow` times slower than the producer (throughput, its
//!   skips, the producer's waits for it).
//!
//! Per-hop latency: from the host stamp taken when the transport's
//! `signal_ready` returned (the camera's release: bytes handed over,
//! *ready* signalled or, on the GPU, submitted) to a host function the
//! consumer's work stream runs before the work (its wait for *ready*
//! passed and its copy of the slot done). Rows with a slow consumer are
//! not stamped (its delay is a host function too, and a driver may run a
//! context's host functions one at a time).
//!
//! Exit status: 0 every row verified; 1 a failure or a row not verified;
//! 2 bad arguments.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use tegra_interop::driver::Context;
use tegra_interop_pipeline::app::multicast::{
    attach_all, finish, hops, line_json, lines, produce, summary_json, ConsumerArg, ConsumerLine,
    Member, Produced, Stamped, Timed, LIMIT, PLACEMENT,
};
use tegra_interop_pipeline::app::stats::{Samples, Summary};
use tegra_interop_pipeline::camera::TestPattern;
use tegra_interop_pipeline::consumer::{CheckInvert, FrameWork};
use tegra_interop_pipeline::multicast::cuda::CudaFanout;
use tegra_interop_pipeline::multicast::ring::MulticastRing;
use tegra_interop_pipeline::multicast::Mode;
use tegra_interop_pipeline::ring::Ring;
use tegra_interop_pipeline::transport::export::Exporter;
use tegra_interop_pipeline::transport::{
    Completion, FrameGeometry, FrameTransport, PeekedFrame, SlotMemory, Ticket, TransportError,
    TransportInfo,
};

/// Where the bench runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    /// The built-in simulator (no GPU; not GPU figures).
    Sim,
    /// A discrete GPU: the Vulkan exporter and CUDA (needs --features vulkan).
    Gpu,
}

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "multicast_bench",
    about = "multicast ring latency and throughput"
)]
struct Args {
    /// Frames per row (10..=100000)
    #[arg(long, default_value = "300", value_parser = clap::value_parser!(u64).range(10..=100_000))]
    frames: u64,
    /// Where to run
    #[arg(long, value_enum, default_value = "sim")]
    backend: BackendArg,
    /// Frame width in pixels (RGBA8)
    #[arg(long, default_value = "1920", value_parser = clap::value_parser!(u32).range(16..=8192))]
    width: u32,
    /// Frame height in pixels
    #[arg(long, default_value = "1080", value_parser = clap::value_parser!(u32).range(16..=8192))]
    height: u32,
    /// Slots of every ring (4..=8)
    #[arg(long, default_value = "4", value_parser = clap::value_parser!(u64).range(4..=8))]
    slots: u64,
    /// How many times slower than the producer the slow mailbox consumer is
    #[arg(long, default_value = "10", value_parser = clap::value_parser!(u32).range(2..=1000))]
    slow: u32,
    /// One JSON object on stdout instead of the table
    #[arg(long)]
    json: bool,
}

/// One measured row.
#[derive(Debug)]
struct Row {
    name: String,
    backend: String,
    produced: Produced,
    hop: Option<Summary>,
    /// The slow consumer's line, where the row has one.
    slow: Option<ConsumerLine>,
    /// Its last delay per frame.
    slow_delay: Option<Duration>,
    lines: Vec<ConsumerLine>,
    verified: bool,
}

/// The simulator (kept alive) and its context, or the GPU.
enum Target {
    Sim(
        #[allow(dead_code)] tegra_interop_pipeline::sim::Sim,
        Context,
    ),
    #[cfg(feature = "vulkan")]
    Gpu,
}

fn open_target(b: BackendArg) -> Result<Target, String> {
    match b {
        BackendArg::Sim => {
            let config = tegra_interop_pipeline::sim::SimConfig::tegra();
            let sim = tegra_interop_pipeline::sim::Sim::with_config(config)
                .map_err(|e| format!("simulator: {e}"))?;
            tegra_interop_pipeline::consumer::twin::register(&sim);
            let ctx = Context::new(sim.backend(), 0).map_err(|e| format!("context: {e}"))?;
            Ok(Target::Sim(sim, ctx))
        }
        #[cfg(feature = "vulkan")]
        BackendArg::Gpu => Ok(Target::Gpu),
        #[cfg(not(feature = "vulkan"))]
        BackendArg::Gpu => Err("--backend gpu needs a build with --features vulkan".into()),
    }
}

/// What a multicast row runs.
struct Plan<'a> {
    name: &'a str,
    args: &'a [ConsumerArg],
    frames: u64,
    geometry: FrameGeometry,
    slots: usize,
    stamp: bool,
}

fn fanout_row<E: Exporter>(ctx: &Context, exporter: E, p: &Plan<'_>) -> Result<Row, String> {
    let fanout = CudaFanout::open(ctx, exporter, p.geometry, p.slots).map_err(String::from)?;
    let backend = format!("cuda-fanout ({})", fanout.exporter_name());
    let mut ring = MulticastRing::new(Timed::new(fanout, p.frames)).map_err(|e| e.to_string())?;
    let mut members = attach_all(&mut ring, p.args, p.frames, p.stamp)?;
    let row = produce(&mut ring, &mut members, p.frames).and_then(|produced| {
        let all: Vec<&Member> = members.iter().collect();
        let lines = lines(&ring, &members, p.frames)?;
        let slow_at = members.iter().position(|m| m.arg.slow > 1);
        Ok(Row {
            name: p.name.to_string(),
            backend,
            produced,
            hop: hops(&ring, &all)?.summary(),
            slow: slow_at.and_then(|i| lines.get(i).cloned()),
            slow_delay: slow_at.map(|i| {
                Duration::from_nanos(members[i].delay.load(std::sync::atomic::Ordering::Relaxed))
            }),
            verified: lines.iter().all(|l| l.passed),
            lines,
        })
    });
    let closed = finish(ring);
    let row = row?;
    closed?;
    Ok(row)
}

impl Target {
    fn fanout(&self, p: &Plan<'_>) -> Result<Row, String> {
        match self {
            Target::Sim(_, ctx) => fanout_row(
                ctx,
                tegra_interop_pipeline::transport::export::SimExporter,
                p,
            ),
            #[cfg(feature = "vulkan")]
            Target::Gpu => {
                let (ctx, exporter) = tegra_interop_pipeline::app::multicast::open_gpu()?;
                fanout_row(&ctx, exporter, p)
            }
        }
    }

    /// The one-consumer ring's transport with `work`.
    fn ring_transport(
        &self,
        work: Box<dyn FrameWork>,
        g: FrameGeometry,
        slots: usize,
    ) -> Result<Box<dyn FrameTransport>, String> {
        match self {
            Target::Sim(_, ctx) => {
                use tegra_interop_pipeline::transport::nvsci::NvSciTransport;
                let t = NvSciTransport::with_work(ctx, "nvsci-sim", work, PLACEMENT, g, slots)
                    .map_err(String::from)?;
                Ok(Box::new(t))
            }
            #[cfg(feature = "vulkan")]
            Target::Gpu => {
                use tegra_interop_pipeline::transport::gpu::{GpuOptions, GpuTransport, Mode};
                let options = GpuOptions::new(Mode::DeviceCopy);
                let t =
                    GpuTransport::open_with_work(g, slots, options, work).map_err(String::from)?;
                Ok(Box::new(t))
            }
        }
    }
}

/// The one-consumer ring's transport, stamping when each frame's
/// `signal_ready` returned.
struct TimedRing {
    inner: Box<dyn FrameTransport>,
    ready: Arc<Mutex<Vec<Option<Instant>>>>,
}

impl FrameTransport for TimedRing {
    fn info(&self) -> TransportInfo {
        self.inner.info()
    }
    fn take_slot(&mut self, t: &Ticket) -> Result<SlotMemory, TransportError> {
        self.inner.take_slot(t)
    }
    fn put_back(&mut self, t: &Ticket, memory: SlotMemory) -> Result<(), TransportError> {
        self.inner.put_back(t, memory)
    }
    fn signal_ready(&mut self, t: &Ticket, memory: SlotMemory) -> Result<(), TransportError> {
        self.inner.signal_ready(t, memory)?;
        let now = Instant::now();
        if let Ok(mut r) = self.ready.lock() {
            if let Some(at) = r.get_mut(t.frame() as usize) {
                *at = Some(now);
            }
        }
        Ok(())
    }
    fn queue_consumer(&mut self, t: &Ticket) -> Result<(), TransportError> {
        self.inner.queue_consumer(t)
    }
    fn try_complete(&mut self) -> Result<Option<Completion>, TransportError> {
        self.inner.try_complete()
    }
    fn wait_complete(&mut self) -> Result<Completion, TransportError> {
        self.inner.wait_complete()
    }
    fn lend(
        &mut self,
        slot: usize,
        frame: u64,
        free_reached: u64,
    ) -> Result<Option<PeekedFrame>, TransportError> {
        self.inner.lend(slot, frame, free_reached)
    }
    fn details(&self) -> Option<String> {
        self.inner.details()
    }
    fn close(self: Box<Self>) -> Result<(), TransportError> {
        self.inner.close()
    }
}

/// Frames the one-consumer ring finished: (verified in order, failed).
fn ring_loop(ring: &mut Ring, frames: u64) -> Result<(Produced, Vec<u64>, u64), String> {
    let stride = ring.geometry().stride;
    let (mut verified, mut failed) = (Vec::new(), 0u64);
    let mut file = |c: Completion| match c.mismatches {
        0 => verified.push(c.frame),
        _ => failed += 1,
    };
    let start = Instant::now();
    let mut own = Duration::ZERO;
    for _ in 0..frames {
        let mut lease = ring.acquire().map_err(|e| e.to_string())?;
        let began = Instant::now();
        let frame = lease.frame();
        TestPattern::new(frame, stride).fill(lease.bytes_mut().map_err(|e| e.to_string())?);
        ring.hand_over(lease).map_err(|e| e.to_string())?;
        own += began.elapsed();
        while let Some(f) = ring.collect().map_err(|e| e.to_string())? {
            file(f.completion);
        }
    }
    let wall = start.elapsed();
    let deadline = Instant::now() + LIMIT;
    while ring.pending() > 0 && Instant::now() < deadline {
        file(ring.wait_collect().map_err(|e| e.to_string())?.completion);
    }
    let produced = Produced { wall, own, frames };
    Ok((produced, verified, failed))
}

fn ring_row(t: &Target, frames: u64, g: FrameGeometry, slots: usize) -> Result<Row, String> {
    let delay = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let work = Stamped::new(CheckInvert::boxed(), frames, true, delay);
    let starts = work.starts().ok_or("no start stamps")?;
    let ready = Arc::new(Mutex::new(vec![None; frames as usize]));
    let inner = t.ring_transport(Box::new(work), g, slots)?;
    let backend = format!("ring ({})", inner.info().backend);
    let timed = TimedRing {
        inner,
        ready: Arc::clone(&ready),
    };
    let mut ring = Ring::new(timed).map_err(|e| e.to_string())?;
    let run = ring_loop(&mut ring, frames);
    let closed = ring.close().map_err(|e| e.to_string());
    let (produced, verified, failed) = run?;
    closed?;
    let mut hop = Samples::new()?;
    let (starts, ready) = (
        starts.lock().map_err(|_| "start stamps")?,
        ready.lock().map_err(|_| "ready stamps")?,
    );
    for (s, r) in starts.iter().zip(ready.iter()) {
        if let (Some(s), Some(r)) = (s, r) {
            hop.push(s.saturating_duration_since(*r).as_nanos() as u64);
        }
    }
    let all: Vec<u64> = (0..frames).collect();
    Ok(Row {
        name: "ring: 1 consumer (baseline)".into(),
        backend,
        produced,
        hop: hop.summary(),
        slow: None,
        slow_delay: None,
        lines: Vec::new(),
        verified: verified == all && failed == 0,
    })
}

/// Every row of the bench, the ring first.
fn rows(a: &Args) -> Result<Vec<Row>, String> {
    let target = open_target(a.backend)?;
    let g = FrameGeometry {
        stride: a.width as usize * 4,
        rows: a.height as usize,
    };
    let slots = a.slots as usize;
    let fifo = ConsumerArg {
        mode: Mode::Fifo,
        slow: 1,
    };
    let slow = ConsumerArg {
        mode: Mode::Mailbox,
        slow: a.slow,
    };
    let plans: [(&str, Vec<ConsumerArg>, bool); 5] = [
        ("multicast: 1 fifo", vec![fifo], true),
        ("multicast: 4 fifo", vec![fifo; 4], true),
        ("multicast: 1 = slow mailbox", vec![slow], false),
        (
            "multicast: 2 = fifo + slow mailbox",
            vec![fifo, slow],
            false,
        ),
        (
            "multicast: 4 = 3 fifo + slow mailbox",
            vec![fifo, fifo, fifo, slow],
            false,
        ),
    ];
    let mut out = vec![ring_row(&target, a.frames, g, slots)?];
    for (name, args, stamp) in &plans {
        let plan = Plan {
            name,
            args,
            frames: a.frames,
            geometry: g,
            slots,
            stamp: *stamp,
        };
        out.push(target.fanout(&plan)?);
    }
    Ok(out)
}

fn us(s: &Option<Summary>, p99: bool) -> String {
    match s {
        Some(s) => format!("{:.1}", (if p99 { s.p99 } else { s.p50 }) as f64 / 1000.0),
        None => "-".into(),
    }
}

fn table(a: &Args, rows: &[Row]) -> String {
    let base = rows.first().map(|r| r.produced.fps()).unwrap_or(0.0);
    let mut s = format!(
        "{} frames of {}x{} RGBA8 per row, {} slots, slow mailbox {}x slower than the producer\n",
        a.frames, a.width, a.height, a.slots, a.slow
    );
    s += &format!(
        "{:<38} {:<26} {:>9} {:>7} {:>10} {:>10} {:>8} {:>11} {:>9}\n",
        "row",
        "transport",
        "frames/s",
        "x ring",
        "hop p50us",
        "hop p99us",
        "skipped",
        "slow waits",
        "verified"
    );
    for r in rows {
        let slow = |f: fn(&ConsumerLine) -> u64| {
            r.slow
                .as_ref()
                .map(|l| f(l).to_string())
                .unwrap_or("-".into())
        };
        s += &format!(
            "{:<38} {:<26} {:>9.1} {:>7.2} {:>10} {:>10} {:>8} {:>11} {:>9}\n",
            r.name,
            r.backend,
            r.produced.fps(),
            r.produced.fps() / base.max(1e-9),
            us(&r.hop, false),
            us(&r.hop, true),
            slow(|l| l.skipped),
            slow(|l| l.producer_waits),
            if r.verified { "yes" } else { "NO" }
        );
    }
    s
}

fn json(a: &Args, rows: &[Row]) -> serde_json::Value {
    let base = rows.first().map(|r| r.produced.fps()).unwrap_or(0.0);
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "name": r.name, "transport": r.backend,
                "consumers": r.lines.len().max(1),
                "frames": r.produced.frames, "wall_s": r.produced.wall.as_secs_f64(),
                "fps": r.produced.fps(), "ratio_to_ring": r.produced.fps() / base.max(1e-9),
                "producer_own_ms_per_frame": r.produced.own.as_secs_f64() * 1000.0 / r.produced.frames as f64,
                "hop": summary_json(&r.hop),
                "slow_skipped": r.slow.as_ref().map(|l| l.skipped),
                "producer_waits_for_slow": r.slow.as_ref().map(|l| l.producer_waits),
                "slow_delay_ms": r.slow_delay.map(|d| d.as_secs_f64() * 1000.0),
                "verified": r.verified,
                "consumer_lines": r.lines.iter().map(line_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::json!({
        "schema_version": 1,
        "ok": rows.iter().all(|r| r["verified"] == true),
        "backend": match a.backend { BackendArg::Sim => "sim", BackendArg::Gpu => "gpu" },
        "frames": a.frames, "width": a.width, "height": a.height, "slots": a.slots,
        "slow_factor": a.slow,
        "hop_measures": "host stamp when signal_ready returned -> host function on the consumer's work stream before its work (after its ready wait and its copy of the slot)",
        "rows": rows,
    })
}

fn main() -> ExitCode {
    let a = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return match e.use_stderr() {
                true => ExitCode::from(2),
                false => ExitCode::SUCCESS,
            };
        }
    };
    let rows = match rows(&a) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("multicast_bench: {e}");
            if a.json {
                println!("{}", serde_json::json!({"ok": false, "error": e}));
            }
            return ExitCode::FAILURE;
        }
    };
    let ok = rows.iter().all(|r| r.verified);
    match a.json {
        true => println!("{}", json(&a, &rows)),
        false => print!("{}", table(&a, &rows)),
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        eprintln!("multicast_bench: a row was not verified");
        ExitCode::FAILURE
    }
}
