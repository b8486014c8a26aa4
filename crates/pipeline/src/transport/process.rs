//! `--processes 2`: the camera and the CUDA consumer in two processes,
//! connected only by an NvSciIpc endpoint pair, the way a Jetson / DRIVE
//! system splits them.
//!
//! The CUDA process (the one started by the user) starts the camera process
//! (the same binary with `--role camera`) and both open their end of the
//! pair: on the simulator a pair of a configuration file in the BSP's format
//! that the CUDA process writes (`--nvsciipc-config` to use another); on a
//! Jetson the pair named with `--endpoints <camera>,<cuda>` (an
//! `INTER_PROCESS` line of `/etc/nvsciipc.cfg`).
//!
//! Set-up, per slot of the ring, exactly as the libraries require across
//! processes (each side opens its own modules; lists travel from the waiter
//! to the signaller; the signaller reconciles, allocates and sends the
//! reconciled list with the object):
//! - the frame buffer: the CUDA process sends its buffer list (its GPU,
//!   read-write); the camera reconciles it with its own (CPU access,
//!   read-write), allocates and sends the buffer;
//! - *ready* (the camera signals from the CPU, CUDA waits): the CUDA process
//!   sends its waiter list; the camera reconciles, allocates, sends;
//! - *free* (CUDA signals, the camera waits on the CPU): the camera sends its
//!   waiter list; the CUDA process reconciles, allocates, sends.
//!
//! Per frame k in slot k % ring: the camera waits for the slot's *free*
//! fence, checks the processed bytes of the frame the slot held (every byte
//! inverted), writes frame k, flushes, signals *ready* and sends "frame k";
//! the CUDA process waits for *ready* on its stream, processes the frame in
//! place (counting bytes that differ from the pattern, inverting all),
//! signals *free* and sends "done k". Fences: with deterministic fences
//! (NvSciSync 2.3, 2.5+) only the first fence of each object crosses, to
//! learn its counter; the later ones are built by the waiter. Without them
//! every fence crosses.
//!
//! At the end the camera sends its figures; the summary reports both
//! sides. `--role camera` / `--role cuda` run one side alone (the other
//! started by hand or by a test), with `--nvsciipc-config` naming the file
//! both use. A peer that dies gives the other process a typed error
//! ("connection reset") and a non-zero exit; no wait is queued on the GPU
//! before the fence it waits for arrived, so a dead camera leaves no stuck
//! stream behind.
//!
//! Processing on the simulator is a stream-ordered host function over the
//! mapped memory (as the in-process NvSci transport does there); the CUDA
//! kernel path of a Jetson is not written for this mode, which says so.
#![allow(unsafe_code)] // transitional: see "Unsafe code" in lib.rs

use std::ffi::OsString;
use std::process::{Child, Command, ExitCode};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tegra_interop::core::nvsci::GpuId;
use tegra_interop::core::DeterministicCounter;
use tegra_interop::driver::nvsci::{
    BufAttrs, BufModule, BufObj, BufPerm, BufType, CpuWaitContext, Fence, FenceSource, IpcEndpoint,
    NvSciIpc, SyncAttrs, SyncModule, SyncObj, SyncPerm, Timeout,
};
use tegra_interop::driver::{Backend, Context, Stream};
use tegra_interop_sim::nvsci::IpcConfigFile;
use tegra_interop_sim::{Sim, SimConfig};

use crate::app::cli::{self, BackendChoice, Command as CliCommand, Options};
use crate::camera::TestPattern;
use crate::transport::process_frame;

/// The endpoint names the CUDA process writes into its configuration file
/// on the simulator.
const SIM_PAIR: (&str, &str) = ("tegra-interop-camera", "tegra-interop-cuda");
/// How long either side waits for the other.
const PATIENCE: Duration = Duration::from_secs(30);

/// The flags of this mode, taken out of the command line before the common
/// options are parsed.
#[derive(Debug, Default)]
struct SplitFlags {
    processes: u32,
    camera: bool,
    /// `--role` given: run this side only (the other is started elsewhere).
    role_given: bool,
    config: Option<String>,
    endpoints: Option<(String, String)>,
    /// For tests: the camera process ends abruptly at this message.
    die_at: u32,
}

fn take_flags(args: Vec<OsString>) -> Result<(SplitFlags, Vec<OsString>), String> {
    let mut f = SplitFlags {
        processes: 1,
        ..SplitFlags::default()
    };
    let mut rest = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .and_then(|v| v.into_string().ok())
                .ok_or_else(|| format!("{name} expects a value"))
        };
        match a.to_str() {
            Some("--processes") => {
                f.processes = match value("--processes")?.as_str() {
                    "1" => 1,
                    "2" => 2,
                    v => return Err(format!("--processes is 1 or 2, got `{v}`")),
                }
            }
            Some("--role") => {
                f.role_given = true;
                match value("--role")?.as_str() {
                    "camera" => f.camera = true,
                    "cuda" => f.camera = false,
                    v => return Err(format!("--role is camera or cuda, got `{v}`")),
                }
            }
            Some("--nvsciipc-config") => f.config = Some(value("--nvsciipc-config")?),
            Some("--endpoints") => {
                let v = value("--endpoints")?;
                let (a, b) = v
                    .split_once(',')
                    .ok_or("--endpoints expects <camera>,<cuda>")?;
                f.endpoints = Some((a.to_owned(), b.to_owned()));
            }
            Some("--die-at") => {
                f.die_at = value("--die-at")?
                    .parse()
                    .map_err(|_| "--die-at expects a number")?
            }
            _ => rest.push(a),
        }
    }
    Ok((f, rest))
}

/// Runs the two-process mode if the command line asks for it; `None` when
/// it does not (the usual one-process pipeline runs).
pub fn main_if_requested(args: &[OsString]) -> Option<ExitCode> {
    if !args.iter().any(|a| a == "--processes" || a == "--role") {
        return None;
    }
    let (flags, rest) = match take_flags(args.to_vec()) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            return Some(ExitCode::from(2));
        }
    };
    if flags.processes == 1 && !flags.role_given {
        return None;
    }
    let opts = match cli::parse(rest.clone()) {
        Ok(CliCommand::Run(o)) => o,
        Ok(CliCommand::Help) => return None,
        Err(e) => {
            eprintln!("error: {e}");
            return Some(ExitCode::from(2));
        }
    };
    let result = if flags.camera {
        camera_process(&opts, &flags).map(|_| None)
    } else if flags.role_given {
        // The CUDA side alone; its camera was started by someone else.
        run_cuda(&opts, &flags, flags.config.as_deref()).map(Some)
    } else {
        cuda_process(&opts, &flags, &rest).map(Some)
    };
    Some(match result {
        Ok(Some(summary)) => {
            if opts.json {
                println!("{}", summary.json());
            } else {
                print!("{}", summary.human());
            }
            if summary.passed() {
                ExitCode::SUCCESS
            } else {
                eprintln!("error: frames failed verification");
                ExitCode::FAILURE
            }
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => {
            let who = if flags.camera {
                "camera process"
            } else {
                "cuda process"
            };
            eprintln!("error ({who}): {e}");
            ExitCode::FAILURE
        }
    })
}

/// One process's simulator or the real driver, and the endpoint names.
struct Setup {
    backend: Arc<Backend>,
    _sim: Option<Sim>,
    camera_ep: String,
    cuda_ep: String,
    simulated: bool,
}

fn setup(opts: &Options, flags: &SplitFlags, config: Option<&str>) -> Result<Setup, String> {
    let real = match opts.backend {
        BackendChoice::Jetson => true,
        BackendChoice::Sim => false,
        BackendChoice::Auto => flags.endpoints.is_some(),
        other => {
            return Err(format!(
                "--processes 2 runs over NvSci: --backend auto, sim or jetson (not {})",
                other.name()
            ))
        }
    };
    if real {
        let (camera_ep, cuda_ep) = flags
            .endpoints
            .clone()
            .ok_or("on a Jetson, name the BSP's endpoint pair: --endpoints <camera>,<cuda>")?;
        let backend = Backend::real().map_err(|e| format!("the CUDA driver: {e}"))?;
        return Ok(Setup {
            backend,
            _sim: None,
            camera_ep,
            cuda_ep,
            simulated: false,
        });
    }
    let config = config.ok_or("no NvSciIpc configuration file")?;
    let sim = Sim::with_config(SimConfig::tegra().with_nvsciipc_config(config))
        .map_err(|e| format!("simulator: {e}"))?;
    let (camera_ep, cuda_ep) = flags
        .endpoints
        .clone()
        .unwrap_or((SIM_PAIR.0.to_owned(), SIM_PAIR.1.to_owned()));
    Ok(Setup {
        backend: sim.backend(),
        _sim: Some(sim),
        camera_ep,
        cuda_ep,
        simulated: true,
    })
}

fn err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// The endpoint with the message count the `--die-at` test hook uses.
struct Ep {
    inner: NvSciIpc,
    count: u32,
    die_at: u32,
}

impl Ep {
    fn tick(&mut self) {
        self.count += 1;
        if self.count == self.die_at {
            // The test hook: end without any cleanup, as a crash would.
            std::process::exit(0);
        }
    }
    fn send_text(&mut self, text: &str) -> Result<(), String> {
        self.send(text.as_bytes()).map_err(err("send"))
    }
    fn expect(&mut self, text: &str) -> Result<(), String> {
        let got = self.recv().map_err(err("receive"))?;
        if got != text.as_bytes() {
            return Err(format!(
                "expected {text:?}, received {:?}",
                String::from_utf8_lossy(&got)
            ));
        }
        Ok(())
    }
}

// SAFETY: `handle` forwards to the wrapped `NvSciIpc`, which keeps its
// endpoint open for as long as this value lives.
unsafe impl IpcEndpoint for Ep {
    fn handle(&self) -> u64 {
        self.inner.handle()
    }
    fn send(&mut self, m: &[u8]) -> Result<(), tegra_interop::driver::nvsci::IpcError> {
        self.tick();
        self.inner.send(m)
    }
    fn recv(&mut self) -> Result<Vec<u8>, tegra_interop::driver::nvsci::IpcError> {
        self.tick();
        self.inner.recv()
    }
}

/// What both sides must agree on.
fn hello(opts: &Options) -> String {
    format!(
        "hello {} {} {} {} {}",
        opts.frames,
        opts.ring,
        opts.sensor.width,
        opts.sensor.height,
        opts.sensor.format.bytes_per_pixel()
    )
}

fn geometry(opts: &Options) -> (usize, usize) {
    let stride = opts.sensor.width as usize * opts.sensor.format.bytes_per_pixel();
    (stride, stride * opts.sensor.height as usize)
}

/// The fence of the `k`-th signal (1-based) of `obj`: received for the first
/// signal (and always without deterministic fences), built after.
fn next_fence(
    obj: &SyncObj,
    source: FenceSource,
    counter: &mut Option<DeterministicCounter>,
    k: u64,
    ep: &mut Ep,
) -> Result<Fence, String> {
    match (source, counter.as_ref()) {
        (FenceSource::Built, Some(c)) => obj
            .fence_for_value(c.value_of_signal(k))
            .map_err(err("FenceUpdateFence")),
        _ => {
            let f = obj.receive_fence(ep).map_err(err("fence"))?;
            if source == FenceSource::Built {
                *counter = Some(
                    obj.counter_from_fence(k, &f)
                        .map_err(err("fence counter"))?,
                );
            }
            Ok(f)
        }
    }
}

/// Whether the `k`-th signal's fence must cross.
fn fence_crosses(source: FenceSource, k: u64) -> bool {
    source == FenceSource::Received || k == 1
}

// ------------------------------------------------------------ the camera

fn camera_process(opts: &Options, flags: &SplitFlags) -> Result<(), String> {
    let s = setup(opts, flags, flags.config.as_deref())?;
    let inner = NvSciIpc::open(&s.backend, &s.camera_ep, PATIENCE).map_err(err("NvSciIpc"))?;
    let mut ep = Ep {
        inner,
        count: 0,
        die_at: flags.die_at,
    };
    ep.expect(&hello(opts))?;
    let (stride, len) = geometry(opts);
    let bufs = BufModule::open(&s.backend).map_err(err("NvSciBuf"))?;
    let syncs = SyncModule::open(&s.backend).map_err(err("NvSciSync"))?;
    let source = syncs.fence_source();
    let mut mine = BufAttrs::new();
    mine.types(&[BufType::RawBuffer])
        .and_then(|a| a.raw_size(len as u64))
        .and_then(|a| a.need_cpu_access(true))
        .and_then(|a| a.required_perm(BufPerm::ReadWrite))
        .map_err(err("buffer attributes"))?;
    let mut signal = SyncAttrs::new();
    signal
        .need_cpu_access(true)
        .and_then(|a| a.required_perm(SyncPerm::SignalOnly))
        .map_err(err("sync attributes"))?;
    if source == FenceSource::Built {
        signal
            .require_deterministic_fences(true)
            .map_err(err("sync attributes"))?;
    }
    let mut wait = SyncAttrs::new();
    wait.need_cpu_access(true)
        .and_then(|a| a.required_perm(SyncPerm::WaitOnly))
        .map_err(err("sync attributes"))?;
    let mut slots = Vec::with_capacity(opts.ring);
    for _ in 0..opts.ring {
        // The buffer and *ready*: the CUDA process's lists come, we allocate.
        let theirs = bufs
            .receive_unreconciled(&mut ep)
            .map_err(err("buffer list"))?;
        let ours = bufs.attr_list(&mine).map_err(err("buffer list"))?;
        let buf = bufs
            .reconcile_and_alloc(&[&ours, &theirs])
            .map_err(err("buffer reconciliation"))?;
        buf.send(Some(BufPerm::ReadWrite), &mut ep)
            .map_err(err("buffer export"))?;
        let waiter = syncs
            .receive_unreconciled(&mut ep)
            .map_err(err("ready list"))?;
        let ours = syncs.attr_list(&signal).map_err(err("ready list"))?;
        let ready = syncs
            .reconcile_and_alloc(&[&ours, &waiter])
            .map_err(err("ready reconciliation"))?;
        ready
            .send(Some(SyncPerm::WaitOnly), &mut ep)
            .map_err(err("ready export"))?;
        // *free*: our waiter list goes, the object comes back.
        let own = syncs.attr_list(&wait).map_err(err("free list"))?;
        syncs
            .send_unreconciled(&[&own], &mut ep)
            .map_err(err("free list"))?;
        let free = syncs
            .receive_obj(
                &mut ep,
                &[&own],
                SyncPerm::WaitOnly,
                Timeout::After(PATIENCE),
            )
            .map_err(err("free import"))?;
        let ptr = buf.cpu_ptr().map_err(err("NvSciBufObjGetCpuPtr"))?;
        slots.push(CameraSlot {
            buf,
            ptr,
            ready,
            free,
            ready_counter: None,
            free_counter: None,
            held: None,
        });
    }
    let mut cx = CpuWaitContext::new(&syncs).map_err(err("CPU wait context"))?;
    let start = Instant::now();
    let (mut verified, mut failed) = (0u64, 0u64);
    let mut write_time = Duration::ZERO;
    for k in 0..opts.frames {
        let slot = (k % opts.ring as u64) as usize;
        let use_n = k / opts.ring as u64 + 1;
        let sl = &mut slots[slot];
        if let Some(prev) = sl.held.take() {
            let ok = sl.take_back(&mut ep, source, use_n - 1, prev, stride, len, &mut cx)?;
            verified += 1;
            failed += u64::from(!ok);
        }
        let t = Instant::now();
        // SAFETY: the CPU mapping of this slot's buffer is `len` bytes (the
        // reconciled size, checked by the library against our list) and
        // lives as long as `sl.buf`; the consumer is done with it: its free
        // fence for the previous frame was waited for above (or the slot was
        // never used).
        let bytes = unsafe { std::slice::from_raw_parts_mut(sl.ptr.as_ptr(), len) };
        TestPattern::new(k, stride).fill(bytes);
        write_time += t.elapsed();
        sl.buf
            .flush_cpu_cache_range(0, len as u64)
            .map_err(err("NvSciBufObjFlushCpuCacheRange"))?;
        let fence = sl.ready.generate_fence().map_err(err("ready fence"))?;
        if source == FenceSource::Built && sl.ready_counter.is_none() {
            sl.ready_counter = Some(
                sl.ready
                    .counter_from_fence(use_n, &fence)
                    .map_err(err("ready counter"))?,
            );
        }
        sl.ready.cpu_signal().map_err(err("NvSciSyncObjSignal"))?;
        ep.send_text(&format!("frame {k}"))?;
        if fence_crosses(source, use_n) {
            fence.send(&mut ep).map_err(err("ready fence"))?;
        }
        sl.held = Some(k);
    }
    // The last frame of every slot, in frame order (as "done" comes).
    for prev in opts.frames.saturating_sub(opts.ring as u64)..opts.frames {
        let sl = &mut slots[(prev % opts.ring as u64) as usize];
        if sl.held.take() == Some(prev) {
            let use_n = prev / opts.ring as u64 + 1;
            let ok = sl.take_back(&mut ep, source, use_n, prev, stride, len, &mut cx)?;
            verified += 1;
            failed += u64::from(!ok);
        }
    }
    let elapsed = start.elapsed();
    ep.send_text(&format!(
        "camera {} {verified} {failed} {} {}",
        std::process::id(),
        write_time.as_micros() / u128::from(opts.frames.max(1)),
        elapsed.as_micros(),
    ))?;
    ep.inner.close().map_err(err("close"))?;
    Ok(())
}

struct CameraSlot {
    buf: BufObj,
    ptr: std::ptr::NonNull<u8>,
    ready: SyncObj,
    free: SyncObj,
    ready_counter: Option<DeterministicCounter>,
    free_counter: Option<DeterministicCounter>,
    /// The frame the slot holds until its free fence comes.
    held: Option<u64>,
}

impl CameraSlot {
    /// Waits for the slot's `use_n`-th free signal ("done" first), then checks
    /// the processed bytes of `frame`: every byte the inverted pattern.
    #[allow(clippy::too_many_arguments)]
    fn take_back(
        &mut self,
        ep: &mut Ep,
        source: FenceSource,
        use_n: u64,
        frame: u64,
        stride: usize,
        len: usize,
        cx: &mut CpuWaitContext,
    ) -> Result<bool, String> {
        ep.expect(&format!("done {frame}"))?;
        let fence = next_fence(&self.free, source, &mut self.free_counter, use_n, ep)?;
        // Waited for in slices, watching the connection: a CUDA process that
        // dies before its GPU ran the signal leaves the fence unsignalled.
        let deadline = Instant::now() + PATIENCE;
        while !fence
            .wait(cx, Timeout::After(Duration::from_millis(50)))
            .map_err(err("free fence"))?
        {
            if let Err(e) = ep.inner.check_connection() {
                return Err(format!(
                    "frame {frame}: its free fence never signalled: {e}"
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "frame {frame}: the free fence did not signal in {PATIENCE:?}"
                ));
            }
        }
        self.buf
            .flush_cpu_cache_range(0, len as u64)
            .map_err(err("NvSciBufObjFlushCpuCacheRange"))?;
        // SAFETY: as in the write above; the consumer signalled free after
        // its last access, and the fence was waited for.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), len) };
        Ok(TestPattern::new(frame, stride)
            .first_mismatch(bytes, 0xff)
            .is_none())
    }
}

// ------------------------------------------------------------ the CUDA side

fn spawn_camera(rest: &[OsString], config: Option<&str>, die_at: u32) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(err("current executable"))?;
    // A cross test run without binfmt names its emulator here (see
    // targets/aarch64-unknown-linux-gnu.toml); the child goes through it too.
    let mut c = match std::env::var("TEGRA_INTEROP_TEST_RUNNER") {
        Ok(r) if !r.trim().is_empty() => {
            let mut words = r.split_whitespace();
            let mut c = Command::new(words.next().unwrap_or_default());
            c.args(words).arg(exe);
            c
        }
        _ => Command::new(exe),
    };
    c.args(rest).args(["--role", "camera"]);
    if let Some(p) = config {
        c.args(["--nvsciipc-config", p]);
    }
    if die_at > 0 {
        c.args(["--die-at", &die_at.to_string()]);
    }
    c.spawn().map_err(err("starting the camera process"))
}

fn cuda_process(opts: &Options, flags: &SplitFlags, rest: &[OsString]) -> Result<Summary, String> {
    if !matches!(
        opts.backend,
        BackendChoice::Auto | BackendChoice::Sim | BackendChoice::Jetson
    ) {
        return Err(format!(
            "--processes 2 runs over NvSci: --backend auto, sim or jetson (not {})",
            opts.backend.name()
        ));
    }
    if opts.backend == BackendChoice::Jetson || flags.endpoints.is_some() {
        return Err(
            "--processes 2 runs on the simulator only: its CUDA side on a Jetson (the NVRTC kernel path) is not written; the hw_jetson suite has the two-process NvSci flow for hardware"
                .into(),
        );
    }
    // On the simulator without a given file: a pair of our own.
    let own_config = match (&flags.config, &flags.endpoints) {
        (None, None) if opts.backend != BackendChoice::Jetson => Some(
            IpcConfigFile::inter_process(&[(SIM_PAIR.0, SIM_PAIR.1, 16, 4096)])
                .map_err(err("NvSciIpc configuration"))?,
        ),
        _ => None,
    };
    let config = own_config
        .as_ref()
        .map(|c| c.path().display().to_string())
        .or(flags.config.clone());
    let mut camera = spawn_camera(rest, config.as_deref(), flags.die_at)?;
    let result = run_cuda(opts, flags, config.as_deref());
    let status = camera.wait().map_err(err("camera process"))?;
    let summary = result?;
    if !status.success() {
        return Err(format!("the camera process failed: {status}"));
    }
    Ok(summary)
}

fn run_cuda(opts: &Options, flags: &SplitFlags, config: Option<&str>) -> Result<Summary, String> {
    let s = setup(opts, flags, config)?;
    if !s.simulated {
        return Err("the CUDA side of --processes 2 needs the simulator".into());
    }
    let inner = NvSciIpc::open(&s.backend, &s.cuda_ep, PATIENCE).map_err(err("NvSciIpc"))?;
    // `--die-at` is the camera's unless this process runs the CUDA side alone.
    let mut ep = Ep {
        inner,
        count: 0,
        die_at: if flags.role_given { flags.die_at } else { 0 },
    };
    ep.send_text(&hello(opts))?;
    let (stride, len) = geometry(opts);
    let ctx = Context::create(Arc::clone(&s.backend), 0, 0).map_err(err("CUDA context"))?;
    let gpu = GpuId(
        s.backend
            .device(0)
            .and_then(|d| d.uuid())
            .map_err(err("device UUID"))?,
    );
    let bufs = BufModule::open(&s.backend).map_err(err("NvSciBuf"))?;
    let syncs = SyncModule::open(&s.backend).map_err(err("NvSciSync"))?;
    let source = syncs.fence_source();
    let mut mine = BufAttrs::new();
    mine.types(&[BufType::RawBuffer])
        .and_then(|a| a.raw_size(len as u64))
        .and_then(|a| a.gpus(&[gpu]))
        .and_then(|a| a.required_perm(BufPerm::ReadWrite))
        .map_err(err("buffer attributes"))?;
    let stream = Stream::new(&ctx).map_err(err("stream"))?;
    let mut slots = Vec::with_capacity(opts.ring);
    for _ in 0..opts.ring {
        let ours = bufs.attr_list(&mine).map_err(err("buffer list"))?;
        bufs.send_unreconciled(&[&ours], &mut ep)
            .map_err(err("buffer list"))?;
        let buf = bufs
            .receive_obj(
                &mut ep,
                &[&ours],
                BufPerm::ReadWrite,
                Timeout::After(PATIENCE),
            )
            .map_err(err("buffer import"))?;
        let waiter = syncs.cuda_waiter_attrs(&ctx).map_err(err("ready list"))?;
        syncs
            .send_unreconciled(&[&waiter], &mut ep)
            .map_err(err("ready list"))?;
        let ready = syncs
            .receive_obj(
                &mut ep,
                &[&waiter],
                SyncPerm::WaitOnly,
                Timeout::After(PATIENCE),
            )
            .map_err(err("ready import"))?;
        let theirs = syncs
            .receive_unreconciled(&mut ep)
            .map_err(err("free list"))?;
        let mut ours = syncs.cuda_signaler_attrs(&ctx).map_err(err("free list"))?;
        if source == FenceSource::Built {
            let mut det = SyncAttrs::new();
            det.require_deterministic_fences(true)
                .map_err(err("sync attributes"))?;
            ours.set(&det).map_err(err("free list"))?;
        }
        let free = syncs
            .reconcile_and_alloc(&[&ours, &theirs])
            .map_err(err("free reconciliation"))?;
        free.send(Some(SyncPerm::WaitOnly), &mut ep)
            .map_err(err("free export"))?;
        let mem = buf.import_cuda(&ctx).map_err(err("NvSciBuf import"))?;
        let map = mem.map_whole().map_err(err("mapping"))?;
        let waiter = ready
            .import_cuda_waiter(&ctx)
            .map_err(err("ready semaphore"))?;
        let signaler = free
            .import_cuda_signaler(&ctx)
            .map_err(err("free semaphore"))?;
        slots.push((
            buf,
            mem,
            map,
            ready,
            waiter,
            free,
            signaler,
            None::<DeterministicCounter>,
        ));
    }
    let (tx, rx) = mpsc::channel::<u64>();
    let start = Instant::now();
    let mut mismatches = 0u64;
    for k in 0..opts.frames {
        let slot = (k % opts.ring as u64) as usize;
        let use_n = k / opts.ring as u64 + 1;
        ep.expect(&format!("frame {k}"))?;
        let (_, _, map, ready, waiter, _, signaler, counter) = &mut slots[slot];
        let fence = next_fence(ready, source, counter, use_n, &mut ep)?;
        // The fence arrived, so its signal was made: the wait cannot be left
        // pending by a camera that dies now.
        waiter.wait(&stream, &fence).map_err(err("GPU wait"))?;
        let ptr = map.device_ptr() as usize;
        let tx = tx.clone();
        stream
            .launch_host_fn(move || {
                // SAFETY: on the simulator (checked above) device pointers
                // are host addresses of the mapping's memory, which is `len`
                // bytes (the reconciled size) and outlives the stream's work
                // (the stream is synchronised before the mappings drop);
                // the camera touches the bytes only after the free signal
                // queued after this function.
                let bytes = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
                let _ = tx.send(process_frame(k, stride, bytes));
            })
            .map_err(err("cuLaunchHostFunc"))?;
        let free_fence = signaler.signal(&stream).map_err(err("free signal"))?;
        mismatches += rx
            .recv_timeout(PATIENCE)
            .map_err(|_| format!("frame {k}: processing did not finish"))?;
        ep.send_text(&format!("done {k}"))?;
        if fence_crosses(source, use_n) {
            free_fence.send(&mut ep).map_err(err("free fence"))?;
        }
    }
    stream.synchronize().map_err(err("stream"))?;
    let elapsed = start.elapsed();
    let camera = ep.recv().map_err(err("camera figures"))?;
    let camera = String::from_utf8_lossy(&camera).into_owned();
    let f: Vec<&str> = camera.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    let (Some(pid), Some(verified), Some(failed), Some(write_us), Some(camera_us)) =
        (num(1), num(2), num(3), num(4), num(5))
    else {
        return Err(format!("the camera's figures are malformed: {camera:?}"));
    };
    drop(slots);
    Ok(Summary {
        frames: opts.frames,
        mismatches,
        source,
        cuda_pid: std::process::id(),
        camera_pid: pid,
        camera_verified: verified,
        camera_failed: failed,
        camera_write_us: write_us,
        camera_us,
        cuda_us: elapsed.as_micros() as u64,
    })
}

/// Both sides' figures.
#[derive(Debug)]
pub struct Summary {
    frames: u64,
    mismatches: u64,
    source: FenceSource,
    cuda_pid: u32,
    camera_pid: u64,
    camera_verified: u64,
    camera_failed: u64,
    camera_write_us: u64,
    camera_us: u64,
    cuda_us: u64,
}

impl Summary {
    /// Every frame arrived intact and came back processed.
    pub fn passed(&self) -> bool {
        self.mismatches == 0 && self.camera_failed == 0 && self.camera_verified == self.frames
    }

    /// The human summary.
    pub fn human(&self) -> String {
        let fps = |us: u64| self.frames as f64 / (us.max(1) as f64 / 1e6);
        format!(
            "two processes over NvSciIpc (simulated), fences {}\n\
             cuda   (pid {}): {} frames processed, {} bytes differed from the pattern, {:.1} frames/s\n\
             camera (pid {}): {}/{} frames read back verified, {} failed, write {} us/frame, {:.1} frames/s\n\
             result: {}\n",
            self.source.name(),
            self.cuda_pid,
            self.frames,
            self.mismatches,
            fps(self.cuda_us),
            self.camera_pid,
            self.camera_verified,
            self.frames,
            self.camera_failed,
            self.camera_write_us,
            fps(self.camera_us),
            if self.passed() { "PASS" } else { "FAIL" },
        )
    }

    /// The JSON summary.
    pub fn json(&self) -> String {
        format!(
            "{{\"processes\":2,\"frames\":{},\"fences\":\"{}\",\"passed\":{},\"cuda\":{{\"pid\":{},\"mismatched_bytes\":{},\"elapsed_us\":{}}},\"camera\":{{\"pid\":{},\"verified\":{},\"failed\":{},\"write_us_per_frame\":{},\"elapsed_us\":{}}}}}",
            self.frames,
            self.source.name(),
            self.passed(),
            self.cuda_pid,
            self.mismatches,
            self.cuda_us,
            self.camera_pid,
            self.camera_verified,
            self.camera_failed,
            self.camera_write_us,
            self.camera_us,
        )
    }
}
