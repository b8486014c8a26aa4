//! `zenoh_bench`: the ring's Zenoh publishing path against raw Zenoh, in
//! one run, one process to another over TCP loopback (peer mode, no
//! router); and a memory soak with a slow subscriber.
//!
//! `zenoh_bench` (the `throughput` mode) runs two rows, each with a fresh
//! pair of sessions (this process listens on a free loopback port, a child
//! process of this program connects and subscribes):
//!
//! - `raw`: a plain Zenoh publisher (congestion control *block*, as
//!   Zenoh's `z_pub_thr` example) puts the same `--width` x `--height` x 4
//!   byte payload (8,294,400 bytes by default) `--frames` times, as fast
//!   as Zenoh takes it (the ratio's baseline);
//! - `raw+copy`: the same, each put a fresh copy of the payload (the one
//!   copy an application that publishes a camera's frames makes at least);
//! - `ours`: the ring on the simulator (`CudaFanout`, 4 slots) with the
//!   Zenoh consumer ([`ZenohPublisher`], a mailbox consumer) attached; the
//!   producer hands over frames at `--rate` frames/s (default: the rate
//!   the raw row of the same round reached, times `--rate-factor`, 1.0)
//!   until `--frames` messages were published. The producer writes the pixels of
//!   a slot on its first use only, then only the frame number (as a
//!   camera's DMA writes the pixels, not the CPU); the consumer copies every
//!   frame it is handed into its message, as it always does.
//!
//! Every row counts frames/s at the subscriber, from its first sample to
//! its last; `ours` also gives the latency from the message's header
//! stamp (taken when the ring handed the frame to the consumer) to its
//! arrival, on the same host clock. `--rounds` rounds (3) of raw then
//! ours; the ratio ours/raw is of the two medians of frames/s.
//!
//! `zenoh_bench rss` runs the ring with a local FIFO consumer and the
//! Zenoh consumer, a subscriber that takes 1/`--slow` of the producer's
//! rate, for `--frames` frames, and reads this process's `VmRSS` every
//! `--every` frames; it reports the readings, the producer's waits for
//! each consumer, and the local consumer's frame count, and fails (exit
//! status 1) when the local consumer missed a frame or the producer
//! waited for the Zenoh consumer.
//!
//! Exit status: 0 done; 1 a failure; 2 bad arguments.

use std::io::{BufRead as _, BufReader, Read as _};
use std::net::TcpListener;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};
use tegra_interop::driver::Context;
use tegra_interop_pipeline::app::stats::Samples;
use tegra_interop_pipeline::camera::TestPattern;
use tegra_interop_pipeline::frame::{FrameLayout, PixelFormat};
use tegra_interop_pipeline::multicast::cuda::{CudaFanout, HostRead, HostSlot};
use tegra_interop_pipeline::multicast::ring::MulticastRing;
use tegra_interop_pipeline::multicast::{ConsumerId, ConsumerSpec, CudaWork};
use tegra_interop_pipeline::sim::Sim;
use tegra_interop_pipeline::transport::export::SimExporter;
use tegra_interop_pipeline::transport::{FrameGeometry, TransportError};
use tegra_interop_pipeline::zenoh::publish::{PublishConfig, PublishStats, ZenohPublisher};
use tegra_interop_pipeline::zenoh::wire::{image_key, CDR_LE};
use tegra_interop_pipeline::zenoh::ZenohEndpoints;
use zenoh::handlers::FifoChannel;
use zenoh::qos::CongestionControl;
use zenoh::Wait as _;

/// Every wait of the bench for the other process ends after this.
const LIMIT: Duration = Duration::from_secs(60);

/// Slots of the ring.
const SLOTS: usize = 4;

#[derive(Parser, Debug)]
#[command(about = "The ring's Zenoh publishing path against raw Zenoh over TCP loopback")]
struct Cli {
    #[command(subcommand)]
    mode: Option<Mode>,
    #[command(flatten)]
    throughput: Throughput,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Raw Zenoh and ours, and the ratio (the default).
    Throughput(Throughput),
    /// Memory with a slow subscriber: VmRSS every `--every` frames.
    Rss(Rss),
    /// The subscriber child (started by the other modes).
    #[command(hide = true)]
    Sub(Sub),
}

#[derive(Args, Debug, Clone)]
struct Throughput {
    /// Messages per row.
    #[arg(long, default_value_t = 200)]
    frames: u64,
    /// Frame width (RGBA8).
    #[arg(long, default_value_t = 1920)]
    width: u32,
    /// Frame height.
    #[arg(long, default_value_t = 1080)]
    height: u32,
    /// The Zenoh consumer's queue (`--publish-queue`).
    #[arg(long, default_value_t = 2)]
    queue: usize,
    /// The producer's rate in the `ours` rows (frames/s; default: the
    /// round's raw rate times `--rate-factor`).
    #[arg(long)]
    rate: Option<f64>,
    /// The `ours` rows' rate as a multiple of the round's raw rate.
    #[arg(long, default_value_t = 1.0)]
    rate_factor: f64,
    /// Rounds of raw then ours.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug, Clone)]
struct Rss {
    /// Frames the producer hands over.
    #[arg(long, default_value_t = 100_000)]
    frames: u64,
    /// Frame width (RGBA8).
    #[arg(long, default_value_t = 320)]
    width: u32,
    /// Frame height.
    #[arg(long, default_value_t = 240)]
    height: u32,
    /// The producer's rate, frames/s.
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// The subscriber takes 1/slow of the producer's rate.
    #[arg(long, default_value_t = 10)]
    slow: u32,
    /// Read VmRSS every this many frames.
    #[arg(long, default_value_t = 10_000)]
    every: u64,
    /// The Zenoh consumer's queue.
    #[arg(long, default_value_t = 2)]
    queue: usize,
}

#[derive(Args, Debug, Clone)]
struct Sub {
    /// Endpoint to connect to.
    #[arg(long)]
    connect: String,
    /// Key expression.
    #[arg(long)]
    key: String,
    /// Stop after this many samples.
    #[arg(long)]
    frames: u64,
    /// Decode each sample's CDR header stamp (latency).
    #[arg(long)]
    cdr: bool,
    /// Sleep this long after each sample (a slow subscriber).
    #[arg(long, default_value_t = 0)]
    delay_us: u64,
    /// Stop after this long without a sample (after the first).
    #[arg(long, default_value_t = 3000)]
    idle_ms: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.mode {
        None => throughput(&cli.throughput),
        Some(Mode::Throughput(t)) => throughput(&t),
        Some(Mode::Rss(r)) => rss(&r),
        Some(Mode::Sub(s)) => subscriber(&s),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zenoh_bench: {e}");
            ExitCode::from(1)
        }
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A free loopback endpoint (the probe listener is closed before use).
fn endpoint() -> Result<String, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("a free port: {e}"))?;
    let port = l.local_addr().map_err(|e| e.to_string())?.port();
    Ok(format!("tcp/127.0.0.1:{port}"))
}

fn listen(ep: &str) -> Result<zenoh::Session, String> {
    ZenohEndpoints {
        listen: vec![ep.to_string()],
        ..ZenohEndpoints::default()
    }
    .open()
    .map_err(|e| e.to_string())
}

/// The subscriber child: counts samples, their arrival times and (with
/// `--cdr`) their latency; prints one JSON line at the end.
fn subscriber(a: &Sub) -> Result<(), String> {
    let session = ZenohEndpoints {
        connect: vec![a.connect.clone()],
        ..ZenohEndpoints::default()
    }
    .open()
    .map_err(|e| e.to_string())?;
    let sub = session
        .declare_subscriber(a.key.as_str())
        .with(FifoChannel::new(4))
        .wait()
        .map_err(|e| format!("subscribing to {}: {e}", a.key))?;
    let mut lat = Samples::new()?;
    let (mut received, mut bytes, mut bad) = (0u64, 0u64, 0u64);
    let (mut first, mut last) = (0u64, 0u64);
    while received < a.frames {
        let wait = if received == 0 {
            LIMIT
        } else {
            Duration::from_millis(a.idle_ms)
        };
        let Some(sample) = sub.recv_timeout(wait).map_err(|e| e.to_string())? else {
            break;
        };
        let at = now_ns();
        first = if received == 0 { at } else { first };
        last = at;
        received += 1;
        let payload = sample.payload();
        bytes += payload.len() as u64;
        if a.cdr {
            match stamp_of(payload) {
                Some(stamp) => lat.push(at.saturating_sub(stamp)),
                None => bad += 1,
            }
        }
        if a.delay_us > 0 {
            std::thread::sleep(Duration::from_micros(a.delay_us));
        }
    }
    let s = lat.summary();
    let out = json!({
        "received": received, "bytes": bytes, "malformed": bad,
        "first_ns": first, "last_ns": last,
        "latency_p50_ns": s.map_or(0, |s| s.p50), "latency_p99_ns": s.map_or(0, |s| s.p99),
        "latency_max_ns": s.map_or(0, |s| s.max),
    });
    println!("{out}");
    Ok(())
}

/// The header stamp of a CDR image, in ns since the epoch: read from its
/// first 12 bytes (encapsulation, `sec`, `nanosec`), so the subscriber
/// never makes a contiguous copy of the frame (the raw row's subscriber
/// touches no byte either).
fn stamp_of(payload: &zenoh::bytes::ZBytes) -> Option<u64> {
    let mut head = [0u8; 12];
    payload.reader().read_exact(&mut head).ok()?;
    let (enc, rest) = head.split_at(4);
    let (sec, nanosec) = rest.split_at(4);
    if enc != CDR_LE {
        return None;
    }
    let sec = u64::try_from(i32::from_le_bytes(sec.try_into().ok()?)).ok()?;
    let nanosec = u64::from(u32::from_le_bytes(nanosec.try_into().ok()?));
    Some(sec * 1_000_000_000 + nanosec)
}

/// Starts the subscriber child on `ep`/`key`.
fn spawn_sub(ep: &str, key: &str, frames: u64, cdr: bool, delay_us: u64) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.args(["sub", "--connect", ep, "--key", key])
        .args(["--frames", &frames.to_string()])
        .args(["--delay-us", &delay_us.to_string()]);
    if cdr {
        cmd.arg("--cdr");
    }
    cmd.stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the subscriber: {e}"))
}

/// Waits (bounded) for the child's report line.
fn sub_report(mut child: Child) -> Result<Value, String> {
    let deadline = Instant::now() + LIMIT;
    loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(status) if status.success() => break,
            Some(status) => return Err(format!("the subscriber failed: {status}")),
            None if Instant::now() >= deadline => {
                let _killed = child.kill();
                let _reaped = child.wait();
                return Err(format!("the subscriber did not end within {LIMIT:?}"));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let out = child.stdout.take().ok_or("the subscriber's output")?;
    let mut line = String::new();
    BufReader::new(out)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&line).map_err(|e| format!("the subscriber's report `{line}`: {e}"))
}

/// Frames/s at the subscriber, first sample to last.
fn sub_fps(report: &Value) -> f64 {
    let n = report["received"].as_u64().unwrap_or(0);
    let span = report["last_ns"]
        .as_u64()
        .unwrap_or(0)
        .saturating_sub(report["first_ns"].as_u64().unwrap_or(0));
    if n < 2 || span == 0 {
        return 0.0;
    }
    (n - 1) as f64 / (span as f64 / 1e9)
}

/// Waits up to `LIMIT` for a subscriber matching `p`.
fn wait_matching(p: &zenoh::pubsub::Publisher<'_>) -> Result<(), String> {
    let deadline = Instant::now() + LIMIT;
    while !p
        .matching_status()
        .wait()
        .map_err(|e| e.to_string())?
        .matching()
    {
        if Instant::now() >= deadline {
            return Err(format!(
                "no subscriber matched {} in {LIMIT:?}",
                p.key_expr()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The raw row: a plain publisher puts the same payload `frames` times
/// (`copy`: each put a fresh copy of it, as an application that hands
/// Zenoh a camera's frames must make at least).
fn raw_row(t: &Throughput, copy: bool) -> Result<Value, String> {
    let len = frame_layout(t.width, t.height)?.frame_len();
    let ep = endpoint()?;
    let session = listen(&ep)?;
    let key = "zenoh_bench/raw";
    let child = spawn_sub(&ep, key, t.frames, false, 0)?;
    let publisher = session
        .declare_publisher(key)
        .congestion_control(CongestionControl::Block)
        .wait()
        .map_err(|e| e.to_string())?;
    wait_matching(&publisher)?;
    let frame = vec![0xA5u8; len];
    let payload = zenoh::bytes::ZBytes::from(frame.clone());
    let start = Instant::now();
    for i in 0..t.frames {
        let bytes = match copy {
            true => zenoh::bytes::ZBytes::from(frame.as_slice().to_vec()),
            false => payload.clone(),
        };
        publisher
            .put(bytes)
            .wait()
            .map_err(|e| format!("raw put {i}: {e}"))?;
    }
    let put_s = start.elapsed().as_secs_f64();
    let report = sub_report(child)?;
    drop(publisher);
    session.close().wait().map_err(|e| e.to_string())?;
    let fps = sub_fps(&report);
    Ok(json!({
        "row": if copy { "raw+copy" } else { "raw" }, "payload_bytes": len, "published": t.frames, "put_s": put_s,
        "received": report["received"], "fps": fps, "mb_s": fps * len as f64 / 1e6,
    }))
}

fn frame_layout(width: u32, height: u32) -> Result<FrameLayout, String> {
    FrameLayout::packed(width, height, PixelFormat::Rgba8).map_err(|e| e.to_string())
}

/// The ring on the simulator, and its geometry.
fn open_ring(
    ctx: &Context,
    layout: FrameLayout,
) -> Result<MulticastRing<CudaFanout<SimExporter>>, String> {
    let g = FrameGeometry {
        stride: layout.pitch(),
        rows: layout.height() as usize,
    };
    let fanout = CudaFanout::open(ctx, SimExporter, g, SLOTS).map_err(|e| e.to_string())?;
    MulticastRing::new(fanout).map_err(|e| e.to_string())
}

/// A publisher of `layout` frames on `topic`, waiting for its subscriber.
fn start_publisher(
    session: &zenoh::Session,
    topic: &str,
    layout: FrameLayout,
    queue: usize,
) -> Result<ZenohPublisher, String> {
    let config = PublishConfig {
        topic: topic.into(),
        domain: 0,
        queue,
        frame_id: "zenoh_bench".into(),
        layout,
        log: None,
        wait_subscriber: LIMIT,
    };
    let p = ZenohPublisher::start(session, &config).map_err(|e| e.to_string())?;
    if !p.matched_at_start() {
        return Err(format!("no subscriber matched {} in {LIMIT:?}", p.key()));
    }
    Ok(p)
}

/// What the producer did.
#[derive(Default)]
struct Producing {
    handed: u64,
    /// VmRSS readings (frame, KiB).
    rss: Vec<(u64, u64)>,
    wall: Duration,
}

/// Hands frames over at `rate` until `done` says so (or `max` frames);
/// the slot's pixels are written on its first use only.
fn produce<T: tegra_interop_pipeline::multicast::FanoutTransport>(
    ring: &mut MulticastRing<T>,
    rate: f64,
    max: u64,
    every: u64,
    done: &dyn Fn(u64) -> bool,
) -> Result<Producing, String> {
    let stride = ring.info().geometry.stride;
    let period = Duration::from_secs_f64(1.0 / rate.max(1e-3));
    let mut written = [false; 16];
    let mut out = Producing::default();
    let start = Instant::now();
    while out.handed < max && !done(out.handed) {
        let due = start + period.mul_f64(out.handed as f64);
        if let Some(left) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(left);
        }
        let mut lease = ring.acquire().map_err(|e| e.to_string())?;
        let frame = lease.frame();
        let first_use = !written.get(lease.slot()).copied().unwrap_or(false);
        let bytes = lease.bytes_mut().map_err(|e| e.to_string())?;
        if first_use {
            TestPattern::new(frame, stride).fill(bytes);
        }
        if let Some(head) = bytes.get_mut(..8) {
            head.copy_from_slice(&frame.to_le_bytes());
        }
        if let Some(w) = written.get_mut(lease.slot()) {
            *w = true;
        }
        ring.hand_over(lease).map_err(|e| e.to_string())?;
        ring.poll().map_err(|e| e.to_string())?;
        out.handed += 1;
        if every > 0 && out.handed % every == 0 {
            out.rss.push((out.handed, vm_rss_kib()?));
        }
    }
    out.wall = start.elapsed();
    ring.drain(LIMIT).map_err(|e| e.to_string())?;
    Ok(out)
}

/// This process's resident set, KiB (`VmRSS` of /proc/self/status).
fn vm_rss_kib() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmRSS in /proc/self/status".to_string())
}

fn sim() -> Result<(Sim, Context), String> {
    let sim = Sim::new().map_err(|e| e.to_string())?;
    tegra_interop_pipeline::consumer::twin::register(&sim);
    let ctx = Context::new(sim.backend(), 0).map_err(|e| e.to_string())?;
    Ok((sim, ctx))
}

/// The ours row: the ring and the Zenoh consumer, paced at `rate`.
fn ours_row(t: &Throughput, rate: f64) -> Result<Value, String> {
    let layout = frame_layout(t.width, t.height)?;
    let (_sim, ctx) = sim()?;
    let mut ring = open_ring(&ctx, layout)?;
    let ep = endpoint()?;
    let session = listen(&ep)?;
    let topic = "zenoh_bench/ours";
    let key = image_key(0, topic).map_err(|e| e.to_string())?;
    let child = spawn_sub(&ep, &key, t.frames, true, 0)?;
    let publisher = start_publisher(&session, topic, layout, t.queue)?;
    let work = CudaWork::host(Box::new(publisher.reader()));
    let id = ring
        .attach(ConsumerSpec::mailbox(work, LIMIT))
        .map_err(|e| e.to_string())?;
    let goal = t.frames;
    let max = goal.saturating_mul(20);
    let made = produce(&mut ring, rate, max, 0, &|_| {
        publisher.stats().published >= goal
    })?;
    let stats = publisher.finish(LIMIT).map_err(|e| e.to_string())?;
    let report = sub_report(child)?;
    close_ring(ring, [id])?;
    session.close().wait().map_err(|e| e.to_string())?;
    let fps = sub_fps(&report);
    Ok(json!({
        "row": "ours", "payload_bytes": layout.frame_len(), "offered_rate": rate,
        "handed_over": made.handed, "produced_fps": made.handed as f64 / made.wall.as_secs_f64(),
        "published": stats.published, "dropped": stats.dropped,
        "received": report["received"], "fps": fps, "mb_s": fps * layout.frame_len() as f64 / 1e6,
        "latency_p50_ms": report["latency_p50_ns"].as_u64().unwrap_or(0) as f64 / 1e6,
        "latency_p99_ms": report["latency_p99_ns"].as_u64().unwrap_or(0) as f64 / 1e6,
    }))
}

fn close_ring<T: tegra_interop_pipeline::multicast::FanoutTransport>(
    mut ring: MulticastRing<T>,
    ids: impl IntoIterator<Item = ConsumerId>,
) -> Result<(), String> {
    for id in ids {
        ring.detach(id).map_err(|e| e.to_string())?;
    }
    ring.poll().map_err(|e| e.to_string())?;
    ring.close().map_err(|e| e.to_string())
}

/// The median of `v` (0 when empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Rounds of raw then ours (each ours row offered the rate its round's
/// raw row reached, times `--rate-factor`, unless `--rate` is given); the
/// ratio is of the medians, so a load that comes and goes on a shared
/// machine weighs on both rows alike.
fn throughput(t: &Throughput) -> Result<(), String> {
    let mut rows = Vec::new();
    for _ in 0..t.rounds.max(1) {
        let raw = raw_row(t, false)?;
        let copied = raw_row(t, true)?;
        let raw_fps = raw["fps"].as_f64().unwrap_or(0.0);
        let rate = t.rate.unwrap_or(raw_fps * t.rate_factor).max(1.0);
        let ours = ours_row(t, rate)?;
        if !t.json {
            print_rows(&raw, &copied, &ours);
        }
        rows.push((raw, copied, ours));
    }
    let fps = |i: usize| {
        median(
            rows.iter()
                .map(|r| [&r.0, &r.1, &r.2][i]["fps"].as_f64().unwrap_or(0.0))
                .collect(),
        )
    };
    let (raw_fps, copy_fps, ours_fps) = (fps(0), fps(1), fps(2));
    let ratio = ours_fps / raw_fps.max(1e-9);
    let ratio_copy = ours_fps / copy_fps.max(1e-9);
    let all: Vec<&Value> = rows.iter().flat_map(|r| [&r.0, &r.1, &r.2]).collect();
    if t.json {
        let out = json!({"schema_version": 1, "rows": all, "raw_fps_median": raw_fps,
            "raw_copy_fps_median": copy_fps, "ours_fps_median": ours_fps,
            "ratio_ours_raw": ratio, "ratio_ours_raw_copy": ratio_copy});
        println!("{out}");
        return Ok(());
    }
    println!(
        "median frames/s: raw {raw_fps:.1}, raw+copy {copy_fps:.1}, ours {ours_fps:.1}; \
         ratio ours/raw {ratio:.3}, ours/raw+copy {ratio_copy:.3}"
    );
    Ok(())
}

fn print_rows(raw: &Value, copied: &Value, ours: &Value) {
    let ms = |r: &Value, k: &str| {
        r.get(k)
            .map_or("-".into(), |v| format!("{:.2}", v.as_f64().unwrap_or(0.0)))
    };
    println!("row       payload_B  received   frames/s       MB/s   p50_ms   p99_ms");
    for r in [raw, copied, ours] {
        println!(
            "{:<8} {:>10} {:>9} {:>10.1} {:>10.1} {:>8} {:>8}",
            r["row"].as_str().unwrap_or("?"),
            r["payload_bytes"].as_u64().unwrap_or(0),
            r["received"].as_u64().unwrap_or(0),
            r["fps"].as_f64().unwrap_or(0.0),
            r["mb_s"].as_f64().unwrap_or(0.0),
            ms(r, "latency_p50_ms"),
            ms(r, "latency_p99_ms"),
        );
    }
    println!(
        "ours: offered {:.1} frames/s, handed over {}, published {}, dropped {}",
        ours["offered_rate"].as_f64().unwrap_or(0.0),
        ours["handed_over"],
        ours["published"],
        ours["dropped"]
    );
}

/// A local consumer: counts the frames it read and checks each one's
/// number (the first 8 bytes the producer wrote).
struct Local {
    seen: Arc<AtomicU64>,
    wrong: Arc<AtomicU64>,
}

impl HostRead for Local {
    fn name(&self) -> &str {
        "local"
    }

    fn frame(&mut self, frame: u64, slot: &HostSlot<'_>) -> Result<u64, TransportError> {
        let mut buf = vec![0u8; slot.len()];
        slot.read_into(&mut buf)?;
        let mut head = [0u8; 8];
        head.copy_from_slice(buf.get(..8).unwrap_or(&[0; 8]));
        if u64::from_le_bytes(head) != frame {
            self.wrong.fetch_add(1, Ordering::Relaxed);
        }
        self.seen.fetch_add(1, Ordering::Relaxed);
        Ok(0)
    }
}

fn rss(r: &Rss) -> Result<(), String> {
    let layout = frame_layout(r.width, r.height)?;
    let (_sim, ctx) = sim()?;
    let mut ring = open_ring(&ctx, layout)?;
    let ep = endpoint()?;
    let session = listen(&ep)?;
    let topic = "zenoh_bench/rss";
    let key = image_key(0, topic).map_err(|e| e.to_string())?;
    let delay_us = (1e6 / r.rate * f64::from(r.slow)) as u64;
    let child = spawn_sub(&ep, &key, u64::MAX, true, delay_us)?;
    let publisher = start_publisher(&session, topic, layout, r.queue)?;
    let (seen, wrong) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let local = Local {
        seen: Arc::clone(&seen),
        wrong: Arc::clone(&wrong),
    };
    let fifo = ConsumerSpec::fifo(CudaWork::host(Box::new(local)), LIMIT);
    let local_id = ring.attach(fifo).map_err(|e| e.to_string())?;
    let work = CudaWork::host(Box::new(publisher.reader()));
    let zid = ring
        .attach(ConsumerSpec::mailbox(work, LIMIT))
        .map_err(|e| e.to_string())?;
    let before = vm_rss_kib()?;
    let made = produce(&mut ring, r.rate, r.frames, r.every, &|_| false)?;
    let stalls = |id| ring.report(id).map_or(0, |rep| rep.stats.stalls);
    let (local_stalls, zenoh_stalls) = (stalls(local_id), stalls(zid));
    let stats = publisher.finish(LIMIT).map_err(|e| e.to_string())?;
    close_ring(ring, [local_id, zid])?;
    let report = sub_report(child)?;
    session.close().wait().map_err(|e| e.to_string())?;
    let out = rss_json(
        r,
        before,
        &made,
        &stats,
        &report,
        [local_stalls, zenoh_stalls],
    );
    let (local, wrong) = (seen.load(Ordering::Relaxed), wrong.load(Ordering::Relaxed));
    println!(
        "{}",
        json!({"local_frames": local, "local_wrong": wrong, "run": out})
    );
    if local != made.handed || wrong != 0 || zenoh_stalls != 0 {
        return Err(format!(
            "the local consumer read {local} of {} frames ({wrong} wrong); \
             the producer waited {zenoh_stalls} times for the Zenoh consumer",
            made.handed
        ));
    }
    Ok(())
}

fn rss_json(
    r: &Rss,
    before: u64,
    made: &Producing,
    stats: &PublishStats,
    report: &Value,
    stalls: [u64; 2],
) -> Value {
    json!({
        "schema_version": 1, "frames": made.handed, "frame_bytes": u64::from(r.width) * u64::from(r.height) * 4,
        "rate": r.rate, "produced_fps": made.handed as f64 / made.wall.as_secs_f64(),
        "subscriber_delay_us": (1e6 / r.rate * f64::from(r.slow)) as u64,
        "rss_kib_before": before, "rss_kib": made.rss,
        "producer_waits_local": stalls[0], "producer_waits_zenoh": stalls[1],
        "published": stats.published, "dropped": stats.dropped, "offered": stats.offered,
        "subscriber_received": report["received"],
    })
}
