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

use std::process::{Child, Command};
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

use crate::app::cli::{two_process_conflicts, BackendChoice, Options, Role};
use crate::app::report::{Report, Verification};
use crate::app::stats::Summary as Figures;
use crate::camera::TestPattern;
use crate::transport::process_frame;

/// The endpoint names the CUDA process writes into its configuration file
/// on the simulator.
const SIM_PAIR: (&str, &str) = ("tegra-interop-camera", "tegra-interop-cuda");
/// How long either side waits for the other.
const PATIENCE: Duration = Duration::from_secs(30);

/// This mode's options, taken from [`Options`].
#[derive(Debug, Default)]
struct SplitFlags {
    camera: bool,
    /// `--role` given: run this side only (the other is started elsewhere).
    role_given: bool,
    config: Option<String>,
    endpoints: Option<(String, String)>,
}

impl SplitFlags {
    fn from_options(opts: &Options) -> Result<SplitFlags, String> {
        let config = match &opts.nvsciipc_config {
            None => None,
            Some(p) => Some(
                p.to_str()
                    .ok_or_else(|| {
                        format!("--nvsciipc-config {}: the path is not UTF-8", p.display())
                    })?
                    .to_owned(),
            ),
        };
        Ok(SplitFlags {
            camera: opts.role == Some(Role::Camera),
            role_given: opts.role.is_some(),
            config,
            endpoints: opts.endpoints.clone(),
        })
    }
}

/// Runs the two-process mode as `opts` asks (`opts.processes == 2` or
/// `opts.role` set); options this mode does not carry out are refused
/// ([`two_process_conflicts`], as the command line does). Returns the report of the CUDA side, the same
/// [`Report`] the one-process mode gives; `None` for the camera side run
/// alone (`--role camera`), whose figures go to the CUDA process.
pub fn run(opts: &Options) -> Result<Option<Report>, String> {
    two_process_conflicts(opts)?;
    let flags = SplitFlags::from_options(opts)?;
    if flags.camera {
        camera_process(opts, &flags)?;
        return Ok(None);
    }
    let summary = if flags.role_given {
        // The CUDA side alone; its camera was started by someone else.
        run_cuda(opts, &flags, flags.config.as_deref())?
    } else {
        cuda_process(opts, &flags)?
    };
    Ok(Some(summary.report(opts)))
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

/// The endpoint, with this mode's text messages.
struct Ep {
    inner: NvSciIpc,
}

impl Ep {
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
        self.inner.send(m)
    }
    fn recv(&mut self) -> Result<Vec<u8>, tegra_interop::driver::nvsci::IpcError> {
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
    let mut ep = Ep { inner };
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

fn spawn_camera(opts: &Options, config: Option<&str>) -> Result<Child, String> {
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
    // The same run, as its camera side, on this side's configuration file.
    let camera = Options {
        role: Some(Role::Camera),
        nvsciipc_config: config.map(std::path::PathBuf::from),
        json: false,
        ..opts.clone()
    };
    c.args(camera.to_args());
    c.spawn().map_err(err("starting the camera process"))
}

fn cuda_process(opts: &Options, flags: &SplitFlags) -> Result<Summary, String> {
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
            "--processes 2 runs on the simulator only, over the pair it writes: --endpoints (a Jetson's pair) and --backend jetson are refused because its CUDA side on a Jetson (the NVRTC kernel path) is not written; the hw_jetson suite has the two-process NvSci flow for hardware (on the simulator, --role camera / --role cuda with --nvsciipc-config and --endpoints name another pair)"
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
    let mut camera = spawn_camera(opts, config.as_deref())?;
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
    let mut ep = Ep { inner };
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
    let (mut mismatches, mut bad_frames) = (0u64, 0u64);
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
        let differ = rx
            .recv_timeout(PATIENCE)
            .map_err(|_| format!("frame {k}: processing did not finish"))?;
        mismatches += differ;
        bad_frames += u64::from(differ != 0);
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
        bad_frames,
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
    /// Frames in which the consumer found bytes that differ.
    bad_frames: u64,
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
    /// The run's [`Report`], as the one-process mode gives it: the figures
    /// this mode measures, the per-frame timings it does not take marked
    /// as not measured.
    fn report(&self, opts: &Options) -> Report {
        let missing = self.frames.saturating_sub(self.camera_verified);
        let first_failure = if self.bad_frames > 0 {
            Some(format!(
                "the consumer saw {} byte(s) that differ from the camera pattern in {} frame(s)",
                self.mismatches, self.bad_frames
            ))
        } else if self.camera_failed > 0 || missing > 0 {
            Some(format!(
                "the camera read back {}/{} frames, {} of them wrong",
                self.camera_verified, self.frames, self.camera_failed
            ))
        } else {
            None
        };
        let v = Verification {
            consumer_ok: self.frames.saturating_sub(self.bad_frames),
            readback_ok: self.camera_verified.saturating_sub(self.camera_failed),
            pulses: None,
            failed: self.bad_frames + self.camera_failed + missing,
            first_failure,
        };
        let (_, len) = geometry(opts);
        Report {
            processes: 2,
            backend: "nvsci-ipc-sim",
            why: format!(
                "--processes 2: the camera in a second process, connected to this CUDA process only by NvSciIpc on the built-in simulator; fences {}",
                self.source.name()
            ),
            note: Some(
                "sim: processing runs as a stream-ordered host function over simulated device memory",
            ),
            details: Some(format!(
                "cuda pid {}: {} frames processed in {} us, {} bytes differed from the pattern; camera pid {}: {}/{} frames read back verified, {} failed, write {} us/frame, {} us",
                self.cuda_pid,
                self.frames,
                self.cuda_us,
                self.mismatches,
                self.camera_pid,
                self.camera_verified,
                self.frames,
                self.camera_failed,
                self.camera_write_us,
                self.camera_us,
            )),
            frames: self.frames,
            ring: opts.ring,
            width: opts.sensor.width,
            height: opts.sensor.height,
            format: crate::app::cli::format_name(opts.sensor.format),
            frame_len: len,
            copy: false,
            wall: Duration::from_micros(self.cuda_us),
            latency: Figures::NOT_MEASURED,
            write: Figures::NOT_MEASURED,
            process: Figures::NOT_MEASURED,
            queued: Figures::NOT_MEASURED,
            held: Figures::NOT_MEASURED,
            overhead: Figures::NOT_MEASURED,
            stages: Vec::new(),
            verification: v,
        }
    }
}
