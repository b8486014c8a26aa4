//! `pipeline --consumers fifo,fifo,mailbox:slow=10`: the sensor model's
//! frames through a [`MulticastRing`] over [`CudaFanout`] (the simulator's
//! memfd exporter, or with `--backend gpu` the Vulkan exporter in a build
//! with `--features vulkan`), one consumer per entry of the list, each
//! verifying every frame it takes with the check-and-invert kernel on its
//! own device copy of the slot. The report has one line per consumer.
//!
//! Also the measuring parts the `multicast_bench` program shares:
//! [`Timed`] (a transport wrapper that stamps each frame's *ready* signal
//! on the host) and [`Stamped`] (a work wrapper that stamps, in stream
//! order, when the consumer's stream reached the work, and slows the
//! consumer down where asked).
//!
//! A consumer `slow=N` keeps its stream busy, per frame, for N times the
//! producer's running mean time per frame (a host function sleeping on its
//! stream after its work): for a mailbox consumer the producer's frame
//! period (wall time over frames so far); for a FIFO consumer, which holds
//! the producer back, the producer's own time per frame (writing the frame
//! and handing it over, its waits left out: the period would chase the
//! consumer's own delay).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tegra_interop::driver::{Context, Stream};

use crate::app::cli::{BackendChoice, Options};
use crate::app::stats::{Samples, Summary};
use crate::camera::TestPattern;
use crate::consumer::{CheckInvert, CopyWith, DeviceFrame, FrameWork, Placement, WorkError};
use crate::frame::{FrameLayout, PixelFormat as WorkFormat};
use crate::multicast::cuda::CudaFanout;
use crate::multicast::ring::{MulticastRing, Polled};
use crate::multicast::{
    Completion, ConsumerEvent, ConsumerId, ConsumerSpec, CudaWork, FanoutInfo, FanoutTransport,
    FrameGeometry, Mode, Queued, SlotMemory, TransportError, MAX_CONSUMERS,
};
use crate::transport::export::Exporter;

/// Largest `slow=N` factor.
pub const MAX_SLOW: u32 = 1000;

/// How long a consumer's oldest frame may take before the ring
/// disconnects it, and how long the end of a run waits for the rest.
pub const LIMIT: Duration = Duration::from_secs(30);

/// One entry of `--consumers`: a mode and how much slower than the
/// producer the consumer is (1: as fast as it can).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumerArg {
    /// FIFO or mailbox.
    pub mode: Mode,
    /// `slow=N`: its stream busy N times the producer's time per frame
    /// (see the module docs); 1 where not given (no added delay).
    pub slow: u32,
}

impl ConsumerArg {
    /// `fifo`, `mailbox`, with `:slow=N` where N > 1.
    pub fn name(&self) -> String {
        let mode = match self.mode {
            Mode::Fifo => "fifo",
            Mode::Mailbox => "mailbox",
        };
        match self.slow {
            1 => mode.to_string(),
            n => format!("{mode}:slow={n}"),
        }
    }
}

/// Why a `--consumers` list was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsumerArgError {
    /// No consumer, or an empty entry.
    Empty,
    /// More than [`MAX_CONSUMERS`] entries.
    TooMany {
        /// How many were given.
        given: usize,
    },
    /// An entry whose mode is neither `fifo` nor `mailbox`.
    Mode {
        /// The entry.
        entry: String,
    },
    /// An option other than `slow=N`.
    Option {
        /// The entry.
        entry: String,
    },
    /// A `slow=N` whose N is not a whole number in `1..=MAX_SLOW`.
    Slow {
        /// The entry.
        entry: String,
    },
}

impl fmt::Display for ConsumerArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConsumerArgError::Empty => write!(
                f,
                "--consumers needs a comma-separated list of fifo | mailbox entries, none empty"
            ),
            ConsumerArgError::TooMany { given } => write!(
                f,
                "--consumers: {given} consumers given, a multicast ring serves at most {MAX_CONSUMERS}"
            ),
            ConsumerArgError::Mode { entry } => write!(
                f,
                "--consumers: `{entry}` is not fifo or mailbox (optionally :slow=N)"
            ),
            ConsumerArgError::Option { entry } => write!(
                f,
                "--consumers: `{entry}`: the only option of a consumer is slow=N"
            ),
            ConsumerArgError::Slow { entry } => write!(
                f,
                "--consumers: `{entry}`: slow=N takes a whole number N in 1..={MAX_SLOW}"
            ),
        }
    }
}

impl std::error::Error for ConsumerArgError {}

/// Parses `--consumers`: `fifo | mailbox [:slow=N]`, comma-separated.
///
/// ```
/// use tegra_interop_pipeline::app::multicast::{parse_consumers, ConsumerArgError};
/// use tegra_interop_pipeline::multicast::Mode;
///
/// let c = parse_consumers("fifo,mailbox:slow=10")?;
/// assert_eq!((c[0].mode, c[1].mode, c[1].slow), (Mode::Fifo, Mode::Mailbox, 10));
/// assert!(matches!(parse_consumers("lifo"), Err(ConsumerArgError::Mode { .. })));
/// # Ok::<(), ConsumerArgError>(())
/// ```
///
/// # Errors
/// A [`ConsumerArgError`] naming the entry that is wrong.
pub fn parse_consumers(list: &str) -> Result<Vec<ConsumerArg>, ConsumerArgError> {
    let entries: Vec<&str> = list.split(',').map(str::trim).collect();
    if entries.len() > MAX_CONSUMERS {
        return Err(ConsumerArgError::TooMany {
            given: entries.len(),
        });
    }
    entries.into_iter().map(parse_entry).collect()
}

fn parse_entry(entry: &str) -> Result<ConsumerArg, ConsumerArgError> {
    let owned = || entry.to_string();
    let (mode, option) = match entry.split_once(':') {
        Some((m, o)) => (m, Some(o)),
        None => (entry, None),
    };
    let mode = match mode {
        "" => return Err(ConsumerArgError::Empty),
        "fifo" => Mode::Fifo,
        "mailbox" => Mode::Mailbox,
        _ => return Err(ConsumerArgError::Mode { entry: owned() }),
    };
    let slow = match option {
        None => 1,
        Some(o) => {
            let n = o
                .strip_prefix("slow=")
                .ok_or(ConsumerArgError::Option { entry: owned() })?;
            match n.parse::<u32>() {
                Ok(n) if (1..=MAX_SLOW).contains(&n) => n,
                _ => return Err(ConsumerArgError::Slow { entry: owned() }),
            }
        }
    };
    Ok(ConsumerArg { mode, slow })
}

/// `--consumers LIST` where given (empty where not).
///
/// # Errors
/// [`parse_consumers`]'s error, as one line.
pub fn from_arg(list: Option<&str>) -> Result<Vec<ConsumerArg>, String> {
    list.map_or(Ok(Vec::new()), |l| {
        parse_consumers(l).map_err(|e| e.to_string())
    })
}

/// The options `--consumers` cannot go with (checked by the command line;
/// nothing to check without `--consumers`).
///
/// # Errors
/// One line naming the conflicting option.
pub fn conflicts(o: &Options) -> Result<(), String> {
    if o.consumers.is_empty() {
        return Ok(());
    }
    if !matches!(
        o.backend,
        BackendChoice::Auto | BackendChoice::Sim | BackendChoice::Gpu
    ) {
        return Err(format!(
            "--consumers runs on --backend sim or gpu (auto: sim), not --backend {}",
            o.backend.name()
        ));
    }
    for (given, flag) in [
        (o.two_process(), "--processes 2 / --role"),
        (o.copy, "--copy"),
        (o.trace.is_some(), "--trace"),
        (o.fault != crate::transport::host::Fault::None, "--fault"),
        (
            o.source != crate::app::cli::SourceChoice::Sensor,
            "--source",
        ),
    ] {
        if given {
            return Err(format!("--consumers cannot be used with {flag}"));
        }
    }
    Ok(())
}

/// When each frame's *ready* was signalled, by frame.
type Stamps = Arc<Mutex<Vec<Option<Instant>>>>;

/// A [`FanoutTransport`] that stamps, on the host, the moment its inner
/// transport's `signal_ready` returned for each frame (the camera's
/// release: the frame's bytes handed to the exporter and its *ready*
/// signalled, or on a device queued to be).
pub struct Timed<T> {
    inner: T,
    writing: [Option<u64>; crate::slots::MAX_SLOTS],
    ready: Vec<Option<Instant>>,
}

impl<T> fmt::Debug for Timed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timed")
            .field("frames", &self.ready.len())
            .finish_non_exhaustive()
    }
}

impl<T: FanoutTransport> Timed<T> {
    /// `inner`, stamping frames `0..frames` (later frames are not stamped).
    pub fn new(inner: T, frames: u64) -> Timed<T> {
        Timed {
            inner,
            writing: [None; crate::slots::MAX_SLOTS],
            ready: vec![None; frames as usize],
        }
    }

    /// When frame `frame`'s *ready* signal returned, if it was stamped.
    pub fn ready_at(&self, frame: u64) -> Option<Instant> {
        self.ready.get(frame as usize).copied().flatten()
    }
}

impl<T: FanoutTransport> FanoutTransport for Timed<T> {
    type Work = T::Work;
    fn info(&self) -> FanoutInfo {
        self.inner.info()
    }
    fn attach(&mut self, id: usize, spec: ConsumerSpec<T::Work>) -> Result<(), TransportError> {
        self.inner.attach(id, spec)
    }
    fn detach(&mut self, id: usize) -> Result<(), TransportError> {
        self.inner.detach(id)
    }
    fn take_slot(
        &mut self,
        slot: usize,
        frame: u64,
        use_: u64,
    ) -> Result<SlotMemory, TransportError> {
        let memory = self.inner.take_slot(slot, frame, use_)?;
        if let Some(w) = self.writing.get_mut(slot) {
            *w = Some(frame);
        }
        Ok(memory)
    }
    fn put_back(&mut self, slot: usize, memory: SlotMemory) -> Result<(), TransportError> {
        self.inner.put_back(slot, memory)
    }
    fn signal_ready(
        &mut self,
        slot: usize,
        use_: u64,
        memory: SlotMemory,
    ) -> Result<(), TransportError> {
        self.inner.signal_ready(slot, use_, memory)?;
        let now = Instant::now();
        if let Some(Some(frame)) = self.writing.get(slot) {
            if let Some(r) = self.ready.get_mut(*frame as usize) {
                *r = Some(now);
            }
        }
        Ok(())
    }
    fn queue(&mut self, id: usize, q: Queued) -> Result<(), TransportError> {
        self.inner.queue(id, q)
    }
    fn released(&mut self, id: usize, slot: usize) -> Result<u64, TransportError> {
        self.inner.released(id, slot)
    }
    fn wait_released(
        &mut self,
        id: usize,
        slot: usize,
        value: u64,
        limit: Duration,
    ) -> Result<bool, TransportError> {
        self.inner.wait_released(id, slot, value, limit)
    }
    fn try_complete(&mut self, id: usize) -> Result<Option<Completion>, TransportError> {
        self.inner.try_complete(id)
    }
    fn close(self: Box<Self>) -> Result<(), TransportError> {
        Box::new(self.inner).close()
    }
}

/// A work wrapper: before the inner work, a host function on the work's
/// stream stamps when the stream got there (the consumer's start: its
/// wait for *ready* passed and, with [`Placement::DeviceCopy`], its copy
/// of the slot done); after it, where `delay` is not zero, a host function
/// sleeping that long (a slow consumer).
pub struct Stamped {
    inner: Box<dyn FrameWork>,
    starts: Option<Stamps>,
    delay: Arc<AtomicU64>,
}

impl fmt::Debug for Stamped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stamped")
            .field("inner", &self.inner.name())
            .field("stamps", &self.starts.is_some())
            .finish_non_exhaustive()
    }
}

impl Stamped {
    /// `inner`, stamping frames `0..frames` where `stamp` (their starts:
    /// [`Stamped::starts`]), slowed by `delay` nanoseconds per frame (read
    /// at each frame; the caller may change it).
    pub fn new(inner: Box<dyn FrameWork>, frames: u64, stamp: bool, delay: Arc<AtomicU64>) -> Self {
        Stamped {
            inner,
            starts: stamp.then(|| Arc::new(Mutex::new(vec![None; frames as usize]))),
            delay,
        }
    }

    /// Where the starts go (frame index; `None` where not stamping).
    pub fn starts(&self) -> Option<Stamps> {
        self.starts.clone()
    }
}

impl FrameWork for Stamped {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn pixel_format(&self) -> WorkFormat {
        self.inner.pixel_format()
    }
    fn prepare(
        &mut self,
        ctx: &Context,
        layout: FrameLayout,
        slots: usize,
        placement: Placement,
    ) -> Result<(), WorkError> {
        self.inner.prepare(ctx, layout, slots, placement)
    }
    fn queue(&mut self, frame: &DeviceFrame<'_>, stream: &Stream) -> Result<(), WorkError> {
        if let Some(starts) = &self.starts {
            let (starts, n) = (Arc::clone(starts), frame.number() as usize);
            stream
                .launch_host_fn(move || {
                    let now = Instant::now();
                    if let Ok(mut s) = starts.lock() {
                        if let Some(at) = s.get_mut(n) {
                            *at = Some(now);
                        }
                    }
                })
                .map_err(|e| WorkError::driver("queueing the start stamp", e))?;
        }
        self.inner.queue(frame, stream)?;
        let delay = Duration::from_nanos(self.delay.load(Ordering::Relaxed));
        if !delay.is_zero() {
            stream
                .launch_host_fn(move || std::thread::sleep(delay))
                .map_err(|e| WorkError::driver("queueing the slow consumer's delay", e))?;
        }
        Ok(())
    }
    fn finished(&mut self, slot: usize, frame: u64) -> Result<u64, WorkError> {
        self.inner.finished(slot, frame)
    }
}

/// A consumer of a run: what it was asked to be, its id, and what it saw.
#[derive(Debug)]
pub struct Member {
    /// Its `--consumers` entry.
    pub arg: ConsumerArg,
    /// Its id on the ring.
    pub id: ConsumerId,
    /// Its stream-ordered start stamps (where stamping).
    pub starts: Option<Stamps>,
    /// Its delay per frame, in nanoseconds.
    pub delay: Arc<AtomicU64>,
    /// Frames it finished with no mismatch, in the order it finished them.
    pub verified: Vec<u64>,
    /// Frames it finished with mismatches.
    pub failed: u64,
    /// Why the ring disconnected it, if it did.
    pub disconnected: Option<String>,
}

/// The copy of the slot each consumer works on.
pub const PLACEMENT: Placement = Placement::DeviceCopy(CopyWith::Engines);

/// Attaches one check-and-invert consumer per entry of `args`, each
/// stamping its starts where `stamp`.
///
/// # Errors
/// The ring's refusal, as one line.
pub fn attach_all<T: FanoutTransport<Work = CudaWork>>(
    ring: &mut MulticastRing<T>,
    args: &[ConsumerArg],
    frames: u64,
    stamp: bool,
) -> Result<Vec<Member>, String> {
    let mut out = Vec::with_capacity(args.len());
    for arg in args {
        let delay = Arc::new(AtomicU64::new(0));
        let work = Stamped::new(CheckInvert::boxed(), frames, stamp, Arc::clone(&delay));
        let starts = work.starts();
        let work = CudaWork::new(Box::new(work), PLACEMENT).map_err(|e| e.to_string())?;
        let spec = match arg.mode {
            Mode::Fifo => ConsumerSpec::fifo(work, LIMIT),
            Mode::Mailbox => ConsumerSpec::mailbox(work, LIMIT),
        };
        let id = ring
            .attach(spec)
            .map_err(|e| format!("attaching consumer {} ({}): {e}", out.len(), arg.name()))?;
        out.push(Member {
            arg: *arg,
            id,
            starts,
            delay,
            verified: Vec::new(),
            failed: 0,
            disconnected: None,
        });
    }
    Ok(out)
}

/// Files what the ring reported under its consumers.
pub fn take(members: &mut [Member], polled: Vec<Polled>) {
    for p in polled {
        let (id, what) = match p {
            Polled::Finished(d) => (d.consumer, Ok(d.completion)),
            Polled::Event(ConsumerEvent::Disconnected { consumer, reason }) => {
                (consumer, Err(format!("{reason:?}")))
            }
            Polled::Event(_) => continue,
        };
        let Some(m) = members.iter_mut().find(|m| m.id == id) else {
            continue;
        };
        match what {
            Ok(c) if c.mismatches == 0 => m.verified.push(c.frame),
            Ok(_) => m.failed += 1,
            Err(e) => m.disconnected = Some(e),
        }
    }
}

/// What the producer of a run measured.
#[derive(Clone, Copy, Debug)]
pub struct Produced {
    /// From the first acquire to the last hand-over.
    pub wall: Duration,
    /// The producer's own time (writing and handing over), in all.
    pub own: Duration,
    /// Frames handed over.
    pub frames: u64,
}

impl Produced {
    /// Frames per second handed over.
    pub fn fps(&self) -> f64 {
        self.frames as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// Sets each slow consumer's delay from what the producer measured so far
/// (see the module docs).
fn pace(members: &[Member], wall: Duration, own: Duration, frames: u64) {
    let frames = frames.max(1) as u128;
    for m in members.iter().filter(|m| m.arg.slow > 1) {
        let per_frame = match m.arg.mode {
            Mode::Mailbox => wall.as_nanos() / frames,
            Mode::Fifo => own.as_nanos() / frames,
        };
        let ns = per_frame.saturating_mul(u128::from(m.arg.slow));
        m.delay
            .store(u64::try_from(ns).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

/// Produces `frames` test-pattern frames through `ring` (each consumer's
/// finished frames filed under it as they come), then drains the ring.
///
/// # Errors
/// The ring's failure, as one line.
pub fn produce<T: FanoutTransport>(
    ring: &mut MulticastRing<T>,
    members: &mut [Member],
    frames: u64,
) -> Result<Produced, String> {
    let stride = ring.info().geometry.stride;
    let start = Instant::now();
    let mut own = Duration::ZERO;
    for f in 0..frames {
        let mut lease = ring.acquire().map_err(|e| e.to_string())?;
        let began = Instant::now();
        let frame = lease.frame();
        TestPattern::new(frame, stride).fill(lease.bytes_mut().map_err(|e| e.to_string())?);
        ring.hand_over(lease).map_err(|e| e.to_string())?;
        own += began.elapsed();
        take(members, ring.poll().map_err(|e| e.to_string())?);
        pace(members, start.elapsed(), own, f + 1);
    }
    let wall = start.elapsed();
    take(members, ring.drain(LIMIT).map_err(|e| e.to_string())?);
    Ok(Produced { wall, own, frames })
}

/// Per-hop latencies of `members` (those stamping): for each frame each
/// took, its stream-ordered start minus the frame's *ready* stamp. Starts
/// stamped before the host's stamp (the device passed the wait before
/// `signal_ready` returned on the host) count as zero.
pub fn hops<T: FanoutTransport>(
    ring: &MulticastRing<Timed<T>>,
    members: &[&Member],
) -> Result<Samples, String> {
    let mut s = Samples::new()?;
    for m in members {
        let Some(starts) = &m.starts else { continue };
        let starts = starts.lock().map_err(|_| "a start stamp's lock")?;
        for (f, at) in starts.iter().enumerate() {
            if let (Some(at), Some(ready)) = (at, ring.transport().ready_at(f as u64)) {
                s.push(at.saturating_duration_since(ready).as_nanos() as u64);
            }
        }
    }
    Ok(s)
}

/// One consumer's line of the report.
#[derive(Clone, Debug)]
pub struct ConsumerLine {
    /// Its index on the ring.
    pub index: usize,
    /// Its `--consumers` entry.
    pub spec: String,
    /// Frames it finished, each verified (no mismatch).
    pub verified: u64,
    /// Frames it finished with mismatches.
    pub failed: u64,
    /// Frames skipped (a mailbox replaced them before it took them).
    pub skipped: u64,
    /// Frames dropped when it left.
    pub dropped: u64,
    /// Times the producer waited for it.
    pub producer_waits: u64,
    /// Its per-hop latency (ready signalled to its start).
    pub hop: Option<Summary>,
    /// Why it was disconnected, if it was.
    pub disconnected: Option<String>,
    /// Verified: a FIFO consumer every frame in order, a mailbox every
    /// frame it took and each other one skipped; none failed, not
    /// disconnected.
    pub passed: bool,
}

/// The report lines of `members` after a run of `frames`.
///
/// # Errors
/// A consumer the ring no longer knows.
pub fn lines<T: FanoutTransport>(
    ring: &MulticastRing<Timed<T>>,
    members: &[Member],
    frames: u64,
) -> Result<Vec<ConsumerLine>, String> {
    let mut out = Vec::with_capacity(members.len());
    for m in members {
        let r = ring
            .report(m.id)
            .ok_or_else(|| format!("consumer {} has no report", m.id))?;
        let all: Vec<u64> = (0..frames).collect();
        let in_order = m.verified.windows(2).all(|w| w[0] < w[1]);
        let complete = match m.arg.mode {
            Mode::Fifo => m.verified == all,
            Mode::Mailbox => in_order && m.verified.len() as u64 + r.stats.skipped == frames,
        };
        out.push(ConsumerLine {
            index: m.id.index(),
            spec: m.arg.name(),
            verified: m.verified.len() as u64,
            failed: m.failed,
            skipped: r.stats.skipped,
            dropped: r.stats.dropped,
            producer_waits: r.stats.stalls,
            hop: hops(ring, &[m])?.summary(),
            disconnected: m.disconnected.clone(),
            passed: complete && m.failed == 0 && m.disconnected.is_none(),
        });
    }
    Ok(out)
}

/// Detaches every consumer and closes the ring.
///
/// # Errors
/// The ring's failure, as one line.
pub fn finish<T: FanoutTransport>(mut ring: MulticastRing<T>) -> Result<(), String> {
    let ids: Vec<ConsumerId> = ring.consumers().collect();
    for id in ids {
        ring.detach(id).map_err(|e| e.to_string())?;
    }
    ring.poll().map_err(|e| e.to_string())?;
    ring.close().map_err(|e| e.to_string())
}

/// What `pipeline --consumers` reports.
#[derive(Clone, Debug)]
pub struct MulticastReport {
    /// The transport and its exporter.
    pub backend: String,
    /// Frames produced.
    pub frames: u64,
    /// Slots of the ring.
    pub slots: usize,
    /// Frame size.
    pub geometry: FrameGeometry,
    /// What the producer measured.
    pub produced: Produced,
    /// Per-hop latency over every consumer.
    pub hop: Option<Summary>,
    /// One line per consumer.
    pub consumers: Vec<ConsumerLine>,
}

impl MulticastReport {
    /// Whether every consumer passed.
    pub fn passed(&self) -> bool {
        self.consumers.iter().all(|c| c.passed)
    }
}

/// Runs the multicast ring over `exporter` in `ctx` with the options.
///
/// # Errors
/// Set-up or run failure, as one line.
pub fn run_on<E: Exporter>(
    opts: &Options,
    ctx: &Context,
    exporter: E,
) -> Result<MulticastReport, String> {
    let bpp = opts.sensor.format.bytes_per_pixel();
    let geometry = FrameGeometry {
        stride: opts.sensor.width as usize * bpp,
        rows: opts.sensor.height as usize,
    };
    let fanout = CudaFanout::open(ctx, exporter, geometry, opts.ring).map_err(String::from)?;
    let backend = format!("{} ({})", fanout.info().backend, fanout.exporter_name());
    let mut ring =
        MulticastRing::new(Timed::new(fanout, opts.frames)).map_err(|e| e.to_string())?;
    let mut members = attach_all(&mut ring, &opts.consumers, opts.frames, true)?;
    let produced = produce(&mut ring, &mut members, opts.frames);
    let report = produced.and_then(|produced| {
        let all: Vec<&Member> = members.iter().collect();
        Ok(MulticastReport {
            backend,
            frames: opts.frames,
            slots: opts.ring,
            geometry,
            produced,
            hop: hops(&ring, &all)?.summary(),
            consumers: lines(&ring, &members, opts.frames)?,
        })
    });
    let closed = finish(ring);
    let report = report?;
    closed?;
    Ok(report)
}

/// `pipeline --consumers ...` (see the module docs).
///
/// # Errors
/// Set-up or run failure, as one line.
pub fn run(opts: &Options) -> Result<MulticastReport, String> {
    if opts.backend == BackendChoice::Gpu {
        return run_gpu(opts);
    }
    let sim = crate::sim::Sim::new().map_err(|e| format!("cannot start the simulator: {e}"))?;
    crate::consumer::twin::register(&sim);
    let ctx = Context::new(sim.backend(), 0).map_err(|e| format!("CUDA context: {e}"))?;
    run_on(opts, &ctx, crate::transport::export::SimExporter)
}

/// CUDA device 0's context and the Vulkan exporter on the same device.
///
/// # Errors
/// No GPU, no Vulkan device of that UUID.
#[cfg(feature = "vulkan")]
pub fn open_gpu() -> Result<(Context, crate::transport::export::VulkanFdExporter), String> {
    let backend = tegra_interop::driver::Backend::real().map_err(|e| format!("CUDA: {e}"))?;
    let uuid = backend
        .device(0)
        .and_then(|d| d.uuid())
        .map_err(|e| format!("CUDA device 0's UUID: {e}"))?;
    let ctx = Context::new(Arc::clone(&backend), 0).map_err(|e| format!("CUDA context: {e}"))?;
    let exporter =
        crate::transport::export::VulkanFdExporter::open(uuid, None).map_err(String::from)?;
    Ok((ctx, exporter))
}

#[cfg(feature = "vulkan")]
fn run_gpu(opts: &Options) -> Result<MulticastReport, String> {
    let (ctx, exporter) = open_gpu()?;
    run_on(opts, &ctx, exporter)
}

#[cfg(not(feature = "vulkan"))]
fn run_gpu(_: &Options) -> Result<MulticastReport, String> {
    Err("--backend gpu needs a build with --features vulkan".into())
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// A latency summary as JSON (microseconds), `null` where none.
pub fn summary_json(s: &Option<Summary>) -> serde_json::Value {
    match s {
        Some(s) => serde_json::json!({
            "count": s.count, "p50_us": us(s.p50), "p99_us": us(s.p99),
            "max_us": us(s.max), "mean_us": s.mean / 1000.0,
        }),
        None => serde_json::Value::Null,
    }
}

/// A consumer line as JSON.
pub fn line_json(c: &ConsumerLine) -> serde_json::Value {
    serde_json::json!({
        "index": c.index, "spec": c.spec, "verified": c.verified, "failed": c.failed,
        "skipped": c.skipped, "dropped": c.dropped, "producer_waits": c.producer_waits,
        "hop": summary_json(&c.hop), "disconnected": c.disconnected, "passed": c.passed,
    })
}

impl MulticastReport {
    /// The report as one JSON object.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "schema_version": crate::app::report::SCHEMA_VERSION,
            "ok": self.passed(), "mode": "multicast", "backend": self.backend,
            "frames": self.frames, "ring": self.slots,
            "frame_len": self.geometry.frame_len(),
            "wall_s": self.produced.wall.as_secs_f64(), "fps": self.produced.fps(),
            "hop": summary_json(&self.hop),
            "consumers": self.consumers.iter().map(line_json).collect::<Vec<_>>(),
        })
    }

    /// The report as text, one line per consumer.
    pub fn human(&self) -> String {
        let mut s = format!(
            "backend: {}\nframes: {} through a multicast ring of {} ({} bytes each), {:.1} frames/s\n",
            self.backend,
            self.frames,
            self.slots,
            self.geometry.frame_len(),
            self.produced.fps()
        );
        if let Some(h) = &self.hop {
            s += &format!(
                "hop (ready signalled -> consumer start): p50 {:.1} us, p99 {:.1} us\n",
                us(h.p50),
                us(h.p99)
            );
        }
        for c in &self.consumers {
            s += &format!(
                "consumer {} {}: {} frames verified, {} failed, {} skipped, {} dropped, producer waited {} times{}: {}\n",
                c.index, c.spec, c.verified, c.failed, c.skipped, c.dropped, c.producer_waits,
                c.disconnected.as_ref().map(|d| format!(", disconnected: {d}")).unwrap_or_default(),
                if c.passed { "verified" } else { "FAILED" }
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_lists_parse_and_bad_ones_are_named() {
        let fifo = ConsumerArg {
            mode: Mode::Fifo,
            slow: 1,
        };
        let slow = ConsumerArg {
            mode: Mode::Mailbox,
            slow: 10,
        };
        assert_eq!(
            parse_consumers("fifo,fifo,mailbox:slow=10"),
            Ok(vec![fifo, fifo, slow])
        );
        assert_eq!(slow.name(), "mailbox:slow=10");
        assert_eq!(parse_consumers("fifo,,fifo"), Err(ConsumerArgError::Empty));
        assert!(matches!(
            parse_consumers("lifo"),
            Err(ConsumerArgError::Mode { .. })
        ));
        assert!(matches!(
            parse_consumers("fifo:fast=2"),
            Err(ConsumerArgError::Option { .. })
        ));
        for bad in ["mailbox:slow=0", "mailbox:slow=x", "mailbox:slow=1001"] {
            assert!(
                matches!(parse_consumers(bad), Err(ConsumerArgError::Slow { .. })),
                "{bad}"
            );
        }
        assert_eq!(
            parse_consumers(&["fifo"; 9].join(",")),
            Err(ConsumerArgError::TooMany { given: 9 })
        );
    }
}
