//! Command line of the `pipeline` program, parsed by clap (derive).
//!
//! [`parse`] turns the arguments into a [`Command`]: help, or a validated
//! [`Options`]. Every mistake is one line on stderr and exit status 2 (see
//! [`main`](crate::app::main)): clap's own errors (unknown argument, a value
//! that is not one of the choices) and the checks after parsing (numbers
//! outside their range, options that do not go together, e.g. `--fault`
//! with `--processes 2`), each naming the option(s) concerned.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};

use crate::camera::{PixelFormat, SensorConfig};
use crate::ring::MAX_SLOTS;
use crate::transport::host::Fault;

pub mod env;
pub use env::Environment;

/// Most frames one run may have.
pub const MAX_FRAMES: u64 = 1_000_000;

/// Most threads `--frame-threads` may ask for.
pub const MAX_FRAME_THREADS: usize = crate::camera::MAX_FRAME_THREADS;

/// Most device buffers `--egl-pool` may ask for.
pub const MAX_EGL_POOL: usize = crate::transport::egl::MAX_POOL;

/// What `--help` prints after the options: the exit statuses and every
/// environment variable that still changes what the program does.
pub const AFTER_HELP: &str = "\
Exit status: 0 all frames verified; 1 run or verification failure, or stdout could not be
written (a closed pipe is not a failure: the status stays the run's); 2 bad arguments or a bad
environment variable. With --json, stdout always carries one JSON object: the report, or
{\"ok\": false, \"stage\": \"arguments\" | \"run\", \"error\": ...}.

Environment (read once, at the start; each overrides a built-in choice, none is needed; unset or
empty: the default; any other value outside the accepted ones is refused, exit status 2):
  TEGRA_INTEROP_FRAME_THREADS  threads that write and check a large frame, 1..=64
                               (--frame-threads wins where both are given)
  TEGRA_INTEROP_CAMERA_AHEAD   on or 1 (default) | off or 0: --camera-ahead where not given
  TEGRA_INTEROP_EGL_POOL       --backend egl: the producer's device buffers, ring+1..=64
                               (--egl-pool wins where both are given)
  TEGRA_INTEROP_GPU_HANDOVER   --backend gpu: queue (default) | host-only (a diagnosis
                               control that is expected to fail verification)
  TEGRA_INTEROP_GPU_EARLY      --backend gpu: 1 (default) | 0
  TEGRA_INTEROP_GPU_COPY_WITH  --backend gpu --copy: engines (default) | kernels
  TEGRA_INTEROP_GPU_COPY_FROM  --backend gpu --copy: registered (default: the frames' host
                               mapping page-locked for CUDA) | import (the earlier path)
  TEGRA_INTEROP_GPU_RECLAIM_AFTER  --backend gpu: later frames released before a slot is
                               taken back, 0..=8 (default 1)
  TEGRA_INTEROP_VK_QUEUE       --backend gpu: the Vulkan queue family of the handover:
                               first-compute | compute-only | transfer-only
                               (default: transfer-only where the device has one)";

/// Which interop backend to run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// jetson, else gpu, else sim (each refusal says why)
    Auto,
    /// NvSciBuf/NvSciSync ring on the built-in simulated Tegra driver (not hardware)
    Sim,
    /// Vulkan frames and semaphores imported into CUDA, an NVRTC kernel consumes them (needs --features vulkan)
    Gpu,
    /// the sim backend's NvSci ring on a Jetson's real driver, an NVRTC kernel processes the frames
    Jetson,
    /// frames through an EGLStream (FIFO) from a CUDA producer to the CUDA consumer (the JetPack camera path); the simulator where no real EGL display and GPU are present
    Egl,
    /// host-reference: host memory + threads, a reference and testing transport, not the simulator and not CUDA
    #[value(alias = "host-reference")]
    Host,
    /// --processes 2 only: the fd transport (memfds and timeline semaphores over a Unix socket, SCM_RIGHTS) on the built-in simulator; `gpu` is the same with Vulkan
    SimFd,
}

impl BackendChoice {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Sim => "sim",
            BackendChoice::Gpu => "gpu",
            BackendChoice::Jetson => "jetson",
            BackendChoice::Egl => "egl",
            BackendChoice::Host => "host",
            BackendChoice::SimFd => "sim-fd",
        }
    }
}

/// The CUDA driver release the simulator presents (`--sim-driver`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum SimDriver {
    /// CUDA 12.9, the release the project's bindings come from
    #[default]
    #[value(name = "12.9")]
    Cuda12_9,
    /// CUDA 11.4 (JetPack 5, DRIVE OS 6.0): no entry point introduced later
    #[value(name = "11.4")]
    Cuda11_4,
}

impl SimDriver {
    /// The release as `cuDriverGetVersion` reports it (11040).
    pub fn version(self) -> i32 {
        match self {
            SimDriver::Cuda12_9 => tegra_interop_sim::SimConfig::CUDA_12_9,
            SimDriver::Cuda11_4 => tegra_interop_sim::SimConfig::CUDA_11_4,
        }
    }

    /// The name used on the command line (`11.4`).
    pub fn name(self) -> &'static str {
        match self {
            SimDriver::Cuda12_9 => "12.9",
            SimDriver::Cuda11_4 => "11.4",
        }
    }
}

/// When the producer checks a processed frame (every frame is checked once
/// either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Readback {
    /// on a second thread while the camera writes a later frame into another
    /// slot (rings of 3 or more; smaller rings check inline)
    Overlap,
    /// on the producer thread, just before the camera overwrites the slot
    Inline,
}

/// `--camera-ahead` on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Switch {
    /// the camera thread writes frame f + 1 while frame f is handed over
    On,
    /// the serial loop: write, hand over, then the next frame
    Off,
}

/// Which side of the two-process mode this process runs alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// the camera side: writes frames, checks them when they come back
    Camera,
    /// the CUDA side: processes the frames
    Cuda,
    /// one consumer process of --consumer-processes (started by the
    /// producer, its socket on stdin)
    Consumer,
}

/// `--format` on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum FormatArg {
    /// one byte per pixel
    Raw8,
    /// two bytes per pixel
    Raw16,
    /// four bytes per pixel
    Rgba8,
}

/// `--fault` on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum FaultArg {
    /// behave correctly
    None,
    /// the consumer reports success but does not process the frame
    SkipProcess,
    /// one byte of every frame is damaged on its way to the consumer
    Corrupt,
}

/// How long either side of the two-process mode waits for the other
/// unless `--peer-timeout` says.
pub const DEFAULT_PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The shortest `--peer-timeout`: 1 ms. A shorter limit cannot be met by
/// any peer (a message takes longer to cross), and one that rounds to no
/// time at all would make every wait fail at once.
pub const MIN_PEER_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(1);

/// A validated run configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Frames to run.
    pub frames: u64,
    /// Ring size.
    pub ring: usize,
    /// Camera configuration.
    pub sensor: SensorConfig,
    /// Backend choice.
    pub backend: BackendChoice,
    /// The CUDA driver release the simulator presents (`--backend sim`).
    pub sim_driver: SimDriver,
    /// Copy-based variant.
    pub copy: bool,
    /// JSON summary.
    pub json: bool,
    /// No progress bar.
    pub quiet: bool,
    /// Injected defect (host and sim backends only).
    pub fault: Fault,
    /// When processed frames are read back and checked.
    pub readback: Readback,
    /// 1: everything in this process; 2: the camera in a second process.
    pub processes: u8,
    /// The two-process mode's side this process runs alone (the other is
    /// started elsewhere); `None` when this process runs the whole mode.
    pub role: Option<Role>,
    /// The NvSciIpc configuration file of the two-process mode (on the
    /// simulator, instead of the one the CUDA process makes in memory).
    pub nvsciipc_config: Option<PathBuf>,
    /// The endpoint pair `(camera, cuda)` of the two-process mode.
    pub endpoints: Option<(String, String)>,
    /// How long a side of the two-process mode waits for the other before
    /// it gives up with a timeout error (`--peer-timeout`).
    pub peer_timeout: std::time::Duration,
    /// `--frame-threads`: threads that write and check a large frame
    /// (`None`: `TEGRA_INTEROP_FRAME_THREADS`, else the default; see
    /// [`Options::frame_threads_setting`]).
    pub frame_threads: Option<usize>,
    /// `--egl-pool`, else `TEGRA_INTEROP_EGL_POOL`: the EGL transport's
    /// device buffers (`None`: the least that works).
    pub egl_pool: Option<usize>,
    /// What the `TEGRA_INTEROP_*` variables asked for (read by [`parse`]).
    /// A process of the two-process mode reads its own (it inherits them),
    /// so [`Options::to_args`] leaves them out.
    pub env: Environment,
    /// `--trace`: where each frame's stages go as a Chrome trace (see
    /// [`crate::app::trace`]); `-`: stdout ([`Options::trace_to_stdout`]);
    /// `None`: no trace.
    pub trace: Option<PathBuf>,
    /// `--trace-frames`: how many frames (the first) the trace records.
    pub trace_frames: u64,
    /// `--camera-ahead`: the camera writes the next frame on its own thread
    /// while the producer thread hands the previous one over (where the
    /// transport leases its slots and the ring has two or more; the serial
    /// loop otherwise).
    pub camera_ahead: bool,
    /// `--source`: where the frames come from.
    pub source: SourceChoice,
    /// `--consumers`: a multicast ring with these consumers
    /// ([`crate::app::multicast`]); empty: the one-consumer ring.
    pub consumers: Vec<crate::app::multicast::ConsumerArg>,
    /// `--consumer-processes`: each `--consumers` entry in a process of its
    /// own ([`crate::app::process::fd_multicast`]).
    pub consumer_processes: bool,
    /// `--publish zenoh/...` and the other Zenoh options
    /// ([`crate::app::zenoh`]).
    pub zenoh: crate::app::zenoh::ZenohOptions,
}

/// Where the frames come from (`--source`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum SourceChoice {
    /// `sensor`: the built-in sensor model ([`crate::camera`]).
    #[default]
    Sensor,
    /// `gst:<description>`: a GStreamer pipeline description, run by
    /// `source::gst::GstSource` (feature `gstreamer`).
    Gst {
        /// The description after `gst:`.
        description: String,
        /// Whether `--width`/`--height` fix the frame size (the appsink
        /// asks for it); otherwise the size is the stream's, in the
        /// `--format` asked for.
        fixed_size: bool,
    },
    /// `zenoh/<topic>`: a Zenoh subscriber of the topic's images (feature
    /// `zenoh`; [`crate::app::zenoh`]).
    Zenoh {
        /// The topic after `zenoh/`.
        topic: String,
    },
}

fn source_arg(v: &str) -> Result<SourceChoice, String> {
    if v == "sensor" {
        return Ok(SourceChoice::Sensor);
    }
    if let Some(topic) = crate::app::zenoh::topic_of(v)? {
        return Ok(SourceChoice::Zenoh { topic });
    }
    let Some(description) = v.strip_prefix("gst:").map(str::trim) else {
        return Err(format!(
            "`{v}` is not a source: `sensor`, `gst:<GStreamer pipeline description>` or `zenoh/<topic>`"
        ));
    };
    if description.is_empty() {
        return Err(
            "`gst:` needs a GStreamer pipeline description after it, e.g. \
             \"gst:videotestsrc ! video/x-raw,format=RGBA,width=1280,height=720\""
                .into(),
        );
    }
    if !cfg!(feature = "gstreamer") {
        return Err("this program was built without GStreamer: build it with \
             `--features gstreamer` (cargo run --release -p tegra-interop-pipeline \
             --features gstreamer -- --source \"gst:...\")"
            .into());
    }
    Ok(SourceChoice::Gst {
        description: description.to_owned(),
        fixed_size: false,
    })
}

impl Options {
    /// Whether this run is the two-process mode (either side or both).
    pub fn two_process(&self) -> bool {
        self.processes == 2 || self.role.is_some()
    }

    /// Whether `--trace -` sends the trace to stdout (the human-readable
    /// report then goes to stderr).
    pub fn trace_to_stdout(&self) -> bool {
        self.trace.as_deref() == Some(std::path::Path::new(crate::app::trace::STDOUT))
    }

    /// The threads for a large frame this run asks for: `--frame-threads`,
    /// else `TEGRA_INTEROP_FRAME_THREADS`; `None`: the default.
    pub fn frame_threads_setting(&self) -> Option<usize> {
        self.frame_threads.or(self.env.frame_threads)
    }

    /// The command-line arguments that give these options (defaults left
    /// out): what one process passes to the other in the two-process mode.
    pub fn to_args(&self) -> Vec<OsString> {
        let d = Options::default();
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |k: &str, v: String| {
            a.push(k.into());
            a.push(v.into());
        };
        push("--frames", self.frames.to_string());
        push("--ring", self.ring.to_string());
        push("--width", self.sensor.width.to_string());
        push("--height", self.sensor.height.to_string());
        push("--format", format_name(self.sensor.format).to_string());
        push("--backend", self.backend.name().to_string());
        if self.sim_driver != d.sim_driver {
            push("--sim-driver", self.sim_driver.name().to_string());
        }
        if self.readback != d.readback {
            push("--readback", "inline".to_string());
        }
        if self.fault != d.fault {
            let f = match self.fault {
                Fault::None => "none",
                Fault::SkipProcess => "skip-process",
                Fault::Corrupt => "corrupt",
            };
            push("--fault", f.to_string());
        }
        if self.processes != d.processes {
            push("--processes", self.processes.to_string());
        }
        if let Some(r) = self.role {
            let r = match r {
                Role::Camera => "camera",
                Role::Cuda => "cuda",
                Role::Consumer => "consumer",
            };
            push("--role", r.to_string());
        }
        if let Some((cam, cuda)) = &self.endpoints {
            push("--endpoints", format!("{cam},{cuda}"));
        }
        if self.peer_timeout != d.peer_timeout {
            push(
                "--peer-timeout",
                self.peer_timeout.as_secs_f64().to_string(),
            );
        }
        if let Some(n) = self.frame_threads {
            push("--frame-threads", n.to_string());
        }
        if let Some(n) = self.egl_pool {
            push("--egl-pool", n.to_string());
        }
        if let Some(p) = &self.nvsciipc_config {
            a.push("--nvsciipc-config".into());
            a.push(p.clone().into_os_string());
        }
        for (on, flag) in [
            (self.copy, "--copy"),
            (self.json, "--json"),
            (self.quiet, "--quiet"),
        ] {
            if on {
                a.push(flag.into());
            }
        }
        a
    }
}

/// The command-line name of a pixel format.
pub fn format_name(f: PixelFormat) -> &'static str {
    match f {
        PixelFormat::Raw8 => "raw8",
        PixelFormat::Raw16 => "raw16",
        PixelFormat::Rgba8 => "rgba8",
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            frames: 300,
            ring: 4,
            sensor: SensorConfig {
                width: 640,
                height: 480,
                fps: 60,
                format: PixelFormat::Rgba8,
            },
            backend: BackendChoice::Auto,
            sim_driver: SimDriver::default(),
            copy: false,
            json: false,
            quiet: false,
            fault: Fault::None,
            readback: Readback::Overlap,
            processes: 1,
            role: None,
            nvsciipc_config: None,
            endpoints: None,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            frame_threads: None,
            egl_pool: None,
            env: Environment::default(),
            trace: None,
            trace_frames: crate::app::trace::DEFAULT_TRACE_FRAMES,
            camera_ahead: true,
            source: SourceChoice::Sensor,
            consumers: Vec::new(),
            consumer_processes: false,
            zenoh: crate::app::zenoh::ZenohOptions::default(),
        }
    }
}

/// A number in `lo..=hi`; says "not a number" for text and names the range
/// for a number outside it (whatever its size).
fn ranged(value: &str, lo: u64, hi: u64, why: &str) -> Result<u64, String> {
    let n: i128 = value
        .trim()
        .parse()
        .map_err(|_| format!("`{value}` is not a number (expected {lo}..={hi}{why})"))?;
    if n < i128::from(lo) || n > i128::from(hi) {
        return Err(format!("{value} is outside {lo}..={hi}{why}"));
    }
    // In range, so it fits.
    u64::try_from(n).map_err(|_| format!("{value} is outside {lo}..={hi}{why}"))
}

fn frames_arg(v: &str) -> Result<u64, String> {
    ranged(v, 1, MAX_FRAMES, "")
}

fn ring_arg(v: &str) -> Result<usize, String> {
    let why = format!(": the ring has a fixed capacity of {MAX_SLOTS} slots");
    ranged(v, 1, MAX_SLOTS as u64, &why).map(|n| n as usize)
}

fn width_arg(v: &str) -> Result<u16, String> {
    ranged(v, 1, u64::from(SensorConfig::MAX_WIDTH), "").map(|n| n as u16)
}

fn height_arg(v: &str) -> Result<u16, String> {
    ranged(v, 1, u64::from(SensorConfig::MAX_HEIGHT), "").map(|n| n as u16)
}

fn processes_arg(v: &str) -> Result<u8, String> {
    ranged(v, 1, 2, "").map(|n| n as u8)
}

fn threads_arg(v: &str) -> Result<usize, String> {
    ranged(v, 1, MAX_FRAME_THREADS as u64, "").map(|n| n as usize)
}

fn egl_pool_arg(v: &str) -> Result<usize, String> {
    ranged(v, 2, MAX_EGL_POOL as u64, ": ring+1 at least").map(|n| n as usize)
}

fn peer_timeout_arg(v: &str) -> Result<std::time::Duration, String> {
    let min = MIN_PEER_TIMEOUT.as_secs_f64();
    match v.trim().parse::<f64>() {
        Ok(s) if s >= min && s <= 86_400.0 => Ok(std::time::Duration::from_secs_f64(s)),
        Ok(s) if s > 0.0 && s < min => Err(format!(
            "{v} s is below the shortest limit, {min} s (1 ms): no peer answers sooner"
        )),
        _ => Err(format!(
            "`{v}` is not a number of seconds in [{min}, 86400]"
        )),
    }
}

fn endpoints_arg(v: &str) -> Result<(String, String), String> {
    match v.split_once(',') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(',') => {
            Ok((a.to_owned(), b.to_owned()))
        }
        _ => Err(format!(
            "`{v}` is not an endpoint pair CAMERA,CUDA (two names and one comma)"
        )),
    }
}

/// The command line as clap parses it; [`Args::validate`] makes it an
/// [`Options`].
#[derive(Debug, Parser)]
#[command(
    name = "pipeline",
    about = "camera -> consumer zero-copy frame pipeline",
    after_help = AFTER_HELP,
    allow_negative_numbers = true,
    args_override_self = true,
    disable_version_flag = true
)]
pub struct Args {
    /// Frames to run (1..=1000000)
    #[arg(long, value_name = "N", default_value = "300", value_parser = frames_arg)]
    frames: u64,
    /// Frame buffers in the ring (1..=8)
    #[arg(long, value_name = "K", default_value = "4", value_parser = ring_arg)]
    ring: usize,
    /// Frame width in pixels (1..=4096)
    #[arg(long, value_name = "W", default_value = "640", value_parser = width_arg)]
    width: u16,
    /// Frame height in lines (1..=4096)
    #[arg(long, value_name = "H", default_value = "480", value_parser = height_arg)]
    height: u16,
    /// Pixel format
    #[arg(long, value_name = "F", value_enum, default_value = "rgba8")]
    format: FormatArg,
    /// Interop backend
    #[arg(long, value_name = "B", value_enum, default_value = "auto")]
    backend: BackendChoice,
    /// The CUDA driver release the simulator presents (--backend sim): 11.4
    /// is a JetPack 5 / DRIVE OS 6.0 driver, without the entry points
    /// introduced later (crates/sys/CUDA_VERSIONS.md)
    #[arg(long, value_name = "V", value_enum, default_value = "12.9")]
    sim_driver: SimDriver,
    /// Copy each frame into the ring instead of writing in place (gpu: the
    /// consumer copies it into device memory and back)
    #[arg(long)]
    copy: bool,
    /// When the producer checks a processed frame
    #[arg(long, value_name = "R", value_enum, default_value = "overlap")]
    readback: Readback,
    /// Print a machine-readable summary (JSON, with a schema_version) on stdout
    #[arg(long)]
    json: bool,
    /// No progress display (there is none anyway unless stderr is a terminal)
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Inject a defect, to see verification catch it (testing; --backend host or sim)
    #[arg(long, value_name = "F", value_enum, default_value = "none")]
    fault: FaultArg,
    /// 1: everything in this process; 2: the camera in a second process,
    /// connected to this CUDA process only by NvSciIpc (--backend sim, or
    /// auto without --endpoints: the simulator, over a BSP-style
    /// configuration it keeps in memory; --backend jetson with --endpoints:
    /// a Jetson's pair, built but never run on one), or by a Unix socket
    /// carrying the slots' memory and timeline semaphores as fds
    /// (--backend sim-fd on the simulator, --backend gpu with Vulkan)
    #[arg(long, value_name = "P", default_value = "1", value_parser = processes_arg)]
    processes: u8,
    /// Run one side of the two-process mode alone (the other is started
    /// elsewhere, with the same options and --nvsciipc-config)
    #[arg(long, value_name = "ROLE", value_enum)]
    role: Option<Role>,
    /// The two-process mode's NvSciIpc configuration file (on the simulator,
    /// instead of the one the CUDA process makes in memory)
    #[arg(long, value_name = "PATH")]
    nvsciipc_config: Option<PathBuf>,
    /// The two-process mode's endpoint pair (an INTER_PROCESS line of the
    /// configuration file; on a Jetson, of /etc/nvsciipc.cfg)
    #[arg(long, value_name = "CAMERA,CUDA", value_parser = endpoints_arg)]
    endpoints: Option<(String, String)>,
    /// The two-process mode (and --consumer-processes): seconds either side
    /// waits for the other (its connection, each message, each fence)
    /// before it ends with a timeout error naming what it waited for
    /// (0.001 <= S <= 86400)
    #[arg(long, value_name = "S", default_value = "30", value_parser = peer_timeout_arg)]
    peer_timeout: std::time::Duration,
    /// Threads that write and check a frame of 1 MiB or more (1..=64; default:
    /// a quarter of the machine's cores, 1..=8; not in the two-process mode)
    #[arg(long, value_name = "N", value_parser = threads_arg)]
    frame_threads: Option<usize>,
    /// --backend egl: the producer's device buffers (ring+1..=64; default
    /// ring+1, the least that works; more for measuring how waiting for the
    /// driver to return presented buffers limits the frame rate)
    #[arg(long, value_name = "N", value_parser = egl_pool_arg)]
    egl_pool: Option<usize>,
    /// Write each frame's stages (camera write, handover, consumer,
    /// read-back check, the producer's waits) to FILE as a Chrome trace
    /// (JSON; open it in ui.perfetto.dev or chrome://tracing; `-`: stdout,
    /// and the report goes to stderr; not with --json). The trace is
    /// written beside FILE and replaces it only once complete (a run that
    /// fails before it starts leaves FILE as it was); a FILE that exists
    /// and is not a regular file (a FIFO, a device) is refused before the
    /// run (one-process mode only)
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Whether the camera writes the next frame on its own thread while the
    /// producer thread hands the previous one over (default on, or
    /// TEGRA_INTEROP_CAMERA_AHEAD; off: the serial loop; rings of 1 and
    /// transports that cannot lease a slot run serially anyway; one-process
    /// mode only)
    #[arg(long, value_name = "ON|OFF", value_enum)]
    camera_ahead: Option<Switch>,
    /// How many frames --trace records, the first ones (1..=1000000, default
    /// 10000; the file says how many were left out; under 1 KiB of memory a
    /// frame)
    #[arg(long, value_name = "N", value_parser = frames_arg)]
    trace_frames: Option<u64>,
    /// Where the frames come from: `sensor` (the built-in sensor model) or
    /// `gst:DESCRIPTION`, a GStreamer pipeline whose end the program links
    /// to an appsink (build with --features gstreamer; the frame size is
    /// the stream's unless --width/--height are given; every frame is
    /// checked against a digest taken inside GStreamer)
    #[arg(long, value_name = "SOURCE", default_value = "sensor", value_parser = source_arg)]
    source: SourceChoice,
    /// A multicast ring with these consumers, comma-separated: fifo |
    /// mailbox, each optionally :slow=N (its stream N times slower than the
    /// producer), e.g. fifo,fifo,mailbox:slow=10 (--backend sim or gpu;
    /// every consumer verifies each frame it takes on its own copy)
    #[arg(long, value_name = "LIST")]
    consumers: Option<String>,
    /// Each --consumers entry in a process of its own (this program with
    /// --role consumer), given the slots' memory and fences as fds over a
    /// Unix socket (--backend sim-fd on the simulator, or gpu)
    #[arg(long)]
    consumer_processes: bool,
    #[command(flatten)]
    zenoh: crate::app::zenoh::ZenohArgs,
}

impl FormatArg {
    /// The frame format this argument names.
    fn pixel_format(self) -> PixelFormat {
        match self {
            FormatArg::Raw8 => PixelFormat::Raw8,
            FormatArg::Raw16 => PixelFormat::Raw16,
            FormatArg::Rgba8 => PixelFormat::Rgba8,
        }
    }
}

impl FaultArg {
    /// The fault this argument names.
    fn fault(self) -> Fault {
        match self {
            FaultArg::None => Fault::None,
            FaultArg::SkipProcess => Fault::SkipProcess,
            FaultArg::Corrupt => Fault::Corrupt,
        }
    }
}

impl Args {
    /// The checks that involve more than one option; each error names the
    /// options that conflict.
    pub fn validate(self, env: Environment) -> Result<Options, String> {
        let (format, fault) = (self.format.pixel_format(), self.fault.fault());
        let o = Options {
            frames: self.frames,
            ring: self.ring,
            sensor: SensorConfig {
                width: self.width,
                height: self.height,
                format,
                ..Options::default().sensor
            },
            backend: self.backend,
            sim_driver: self.sim_driver,
            copy: self.copy,
            json: self.json,
            quiet: self.quiet,
            fault,
            readback: self.readback,
            processes: self.processes,
            role: self.role,
            nvsciipc_config: self.nvsciipc_config,
            endpoints: self.endpoints,
            peer_timeout: self.peer_timeout,
            frame_threads: self.frame_threads,
            egl_pool: self.egl_pool.or(env.egl_pool),
            env,
            trace: self.trace,
            trace_frames: self
                .trace_frames
                .unwrap_or(crate::app::trace::DEFAULT_TRACE_FRAMES),
            camera_ahead: match self.camera_ahead {
                Some(s) => s == Switch::On,
                None => env.camera_ahead.unwrap_or(true),
            },
            zenoh: (self.zenoh).options(matches!(self.source, SourceChoice::Zenoh { .. }))?,
            source: self.source,
            consumers: crate::app::multicast::from_arg(self.consumers.as_deref())?,
            consumer_processes: self.consumer_processes,
        };
        crate::app::multicast::conflicts(&o).and(crate::app::zenoh::conflicts(&o))?;
        output_and_pool_conflicts(&o, self.egl_pool.is_some())?;
        source_and_ahead_conflicts(&o, self.camera_ahead.is_some())?;
        if self.trace_frames.is_some() && o.trace.is_none() {
            return Err("--trace-frames only applies with --trace FILE".into());
        }
        if o.fault != Fault::None
            && !matches!(
                o.backend,
                BackendChoice::Host | BackendChoice::Sim | BackendChoice::SimFd
            )
        {
            return Err(format!(
                "--fault only applies to --backend host or --backend sim (not --backend {})",
                o.backend.name()
            ));
        }
        if o.sim_driver != SimDriver::default()
            && (o.backend != BackendChoice::Sim || o.two_process())
        {
            return Err(format!(
                "--sim-driver only applies to --backend sim in one process (not --backend {}{})",
                o.backend.name(),
                if o.two_process() {
                    " with --processes 2 / --role"
                } else {
                    ""
                }
            ));
        }
        mode_conflicts(&o)?;
        Ok(o)
    }
}

/// The options the two-process mode cannot carry out: a source other than
/// the sensor model, and `--camera-ahead` (`ahead_given`).
fn source_and_ahead_conflicts(o: &Options, ahead_given: bool) -> Result<(), String> {
    if o.source != SourceChoice::Sensor && o.two_process() {
        return Err(
            "--source gst:... cannot be used with --processes 2 or --role: the \
             two-process mode's camera is the sensor model"
                .into(),
        );
    }
    if ahead_given && o.two_process() {
        return Err(
            "--camera-ahead cannot be used with --processes 2 or --role: the two-process mode does not carry it out"
                .into(),
        );
    }
    Ok(())
}

/// The two-process mode's conflicts ([`two_process_conflicts`]), or, in
/// one process, its options given anyway.
fn mode_conflicts(o: &Options) -> Result<(), String> {
    if o.two_process() {
        return two_process_conflicts(o);
    }
    for (given, flag) in [
        (o.nvsciipc_config.is_some(), "--nvsciipc-config"),
        (o.endpoints.is_some(), "--endpoints"),
        (
            o.peer_timeout != Options::default().peer_timeout && !o.consumer_processes,
            "--peer-timeout",
        ),
    ] {
        if given {
            return Err(format!(
                "{flag} only applies to the two-process mode (--processes 2 or --role)"
            ));
        }
    }
    Ok(())
}

/// `--trace -` with `--json` (both would write JSON to stdout), and
/// `--egl-pool` (given on the command line: `flag`) without `--backend egl`
/// or outside ring+1..=64, are refused, naming the options.
fn output_and_pool_conflicts(o: &Options, flag: bool) -> Result<(), String> {
    if o.trace_to_stdout() && o.json {
        return Err(
            "--trace - cannot be used with --json: both would write JSON to stdout; give --trace a FILE"
                .into(),
        );
    }
    if flag && o.backend != BackendChoice::Egl {
        return Err(format!(
            "--egl-pool only applies to --backend egl (not --backend {})",
            o.backend.name()
        ));
    }
    match o.egl_pool {
        Some(n) if flag && !(o.ring + 1..=MAX_EGL_POOL).contains(&n) => Err(format!(
            "--egl-pool {n} is outside {}..={MAX_EGL_POOL} for --ring {} (ring+1 at least)",
            o.ring + 1,
            o.ring
        )),
        _ => Ok(()),
    }
}

/// Applies what the options set for the whole process (before any frame):
/// the threads for a large frame ([`Options::frame_threads_setting`]).
/// Both programs that run the pipeline call it once.
pub fn apply_process_settings(o: &Options) -> Result<(), String> {
    if let Some(n) = o.frame_threads_setting() {
        crate::camera::set_frame_threads(n).map_err(|e| format!("--frame-threads: {e}"))?;
    }
    Ok(())
}

/// What the two-process mode does not carry out is refused, naming both
/// options (the command line's check; [`crate::app::process::run`]
/// makes it again for options built in code).
pub fn two_process_conflicts(o: &Options) -> Result<(), String> {
    if crate::app::process::fd::selected(o) {
        return crate::app::process::fd::conflicts(o);
    }
    let mode = if o.role.is_some() {
        "--role"
    } else {
        "--processes 2"
    };
    if !matches!(
        o.backend,
        BackendChoice::Auto | BackendChoice::Sim | BackendChoice::Jetson
    ) {
        return Err(format!(
            "--backend {} cannot be used with {mode}: the two-process mode runs over NvSci (--backend auto, sim or jetson) or over fds (--backend sim-fd or gpu)",
            o.backend.name()
        ));
    }
    // The whole mode in one command on the simulator runs over a pair it
    // writes in memory, unless a configuration file is named.
    if o.role.is_none()
        && o.endpoints.is_some()
        && o.backend == BackendChoice::Sim
        && o.nvsciipc_config.is_none()
    {
        return Err(
            "--endpoints cannot be used with --backend sim --processes 2 without --nvsciipc-config: on the simulator that mode runs over a pair it makes; --endpoints names a Jetson's pair (--backend jetson or auto) or a pair of the named file".into(),
        );
    }
    let refused = [
        (o.copy, "--copy"),
        (o.readback == Readback::Inline, "--readback inline"),
        (o.frame_threads.is_some(), "--frame-threads"),
        (o.trace.is_some(), "--trace"),
    ];
    for (given, flag) in refused {
        if given {
            return Err(format!(
                "{flag} cannot be used with {mode}: the two-process mode does not carry it out"
            ));
        }
    }
    Ok(())
}

/// What the command line asks for.
// Made once per process and matched at once: boxing the options would buy
// nothing but a change to every caller.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Print the help text ([`help`]).
    Help,
    /// Run the pipeline.
    Run(Options),
}

/// The full help text (`--help`).
pub fn help() -> String {
    Args::command().render_long_help().to_string()
}

/// Makes a clap error one line: its message, without the usage and the
/// "for more information" lines (shared by the project's programs).
pub fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut parts: Vec<&str> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            if !parts.is_empty() {
                break;
            }
            continue;
        }
        parts.push(line);
    }
    let msg = parts.join(" ");
    let msg = msg.strip_prefix("error: ").unwrap_or(&msg).to_owned();
    format!("{msg} (see --help)")
}

/// Parses the arguments after the program name, and the process's
/// `TEGRA_INTEROP_*` variables ([`mod@env`]).
pub fn parse<I: IntoIterator<Item = OsString>>(args: I) -> Result<Command, String> {
    parse_with_env(args, &|name| std::env::var_os(name))
}

/// [`parse`] with the variables read through `var` instead of the
/// process's environment.
pub fn parse_with_env<I: IntoIterator<Item = OsString>>(
    args: I,
    var: &dyn Fn(&str) -> Option<OsString>,
) -> Result<Command, String> {
    let argv = std::iter::once(OsString::from("pipeline")).chain(args);
    let matches = match Args::command().try_get_matches_from(argv) {
        Ok(m) => m,
        Err(e) => {
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp
                | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    Ok(Command::Help)
                }
                _ => Err(one_line(&e)),
            }
        }
    };
    let explicit_processes =
        matches.value_source("processes") == Some(clap::parser::ValueSource::CommandLine);
    let size_given = ["width", "height"]
        .iter()
        .any(|a| matches.value_source(a) == Some(clap::parser::ValueSource::CommandLine));
    let mut args = Args::from_arg_matches(&matches).map_err(|e| one_line(&e))?;
    if let SourceChoice::Gst { fixed_size, .. } = &mut args.source {
        *fixed_size = size_given;
    }
    if args.role.is_some() && explicit_processes && args.processes == 1 {
        return Err(
            "--role cannot be used with --processes 1: a role is one side of the two-process mode"
                .into(),
        );
    }
    let env = Environment::read(var, args.ring)?;
    args.validate(env).map(Command::Run)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Options, String> {
        run_with(args, &[])
    }

    /// Parses `args` with only the variables `vars` set.
    fn run_with(args: &[&str], vars: &[(&str, &str)]) -> Result<Options, String> {
        let var = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        };
        match parse_with_env(args.iter().map(OsString::from), &var)? {
            Command::Run(o) => Ok(o),
            Command::Help => Err("help".into()),
        }
    }

    #[test]
    fn source_is_the_sensor_or_a_gstreamer_description() {
        assert_eq!(run(&[]).unwrap().source, SourceChoice::Sensor);
        assert_eq!(
            run(&["--source", "sensor"]).unwrap().source,
            SourceChoice::Sensor
        );
        for bad in ["camera", "gst", "gst:", "gst:   ", ""] {
            let e = run(&["--source", bad]).unwrap_err();
            assert!(e.contains("source") || e.contains("gst:"), "{bad:?}: {e}");
        }
        let desc = "gst:videotestsrc ! video/x-raw,format=RGBA,width=1280,height=720";
        if cfg!(feature = "gstreamer") {
            let o = run(&["--source", desc]).unwrap();
            assert_eq!(
                o.source,
                SourceChoice::Gst {
                    description: desc[4..].to_owned(),
                    fixed_size: false
                }
            );
            let o = run(&["--source", desc, "--height", "720"]).unwrap();
            assert!(matches!(
                o.source,
                SourceChoice::Gst {
                    fixed_size: true,
                    ..
                }
            ));
            let e = run(&["--source", desc, "--processes", "2"]).unwrap_err();
            assert!(e.contains("--processes 2"), "{e}");
        } else {
            let e = run(&["--source", desc]).unwrap_err();
            assert!(e.contains("--features gstreamer"), "{e}");
        }
    }

    #[test]
    fn clap_definition_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let o = run(&[]).unwrap();
        assert_eq!(o, Options::default());
        assert_eq!((o.frames, o.ring, o.backend), (300, 4, BackendChoice::Auto));
        assert_eq!((o.processes, o.role), (1, None));
    }

    #[test]
    fn all_options() {
        let o = run(&[
            "--frames",
            "10",
            "--ring=8",
            "--width",
            "32",
            "--height=16",
            "--format",
            "raw16",
            "--backend",
            "host",
            "--copy",
            "--json",
            "--quiet",
            "--fault",
            "corrupt",
            "--frame-threads",
            "3",
            "--processes=1",
        ])
        .unwrap();
        assert_eq!(o.frames, 10);
        assert_eq!(o.ring, 8);
        assert_eq!((o.sensor.width, o.sensor.height), (32, 16));
        assert_eq!(o.sensor.format, PixelFormat::Raw16);
        assert_eq!(o.backend, BackendChoice::Host);
        assert!(o.copy && o.json && o.quiet);
        assert_eq!(o.fault, Fault::Corrupt);
        assert_eq!(o.frame_threads, Some(3));
        assert_eq!(
            run(&["--backend", "host-reference"]).unwrap().backend,
            BackendChoice::Host
        );
        assert_eq!(parse(["-h"].map(OsString::from)).unwrap(), Command::Help);
        assert_eq!(
            parse(["--processes", "2", "--help"].map(OsString::from)).unwrap(),
            Command::Help
        );
    }

    #[test]
    fn two_process_options() {
        let o = run(&[
            "--role",
            "cuda",
            "--nvsciipc-config",
            "/tmp/x.cfg",
            "--endpoints",
            "cam,cuda",
        ])
        .unwrap();
        assert_eq!(o.role, Some(Role::Cuda));
        assert_eq!(o.nvsciipc_config, Some(PathBuf::from("/tmp/x.cfg")));
        assert_eq!(o.endpoints, Some(("cam".into(), "cuda".into())));
        assert!(o.two_process());
        let o = run(&["--role", "camera"]).unwrap();
        assert_eq!(o.role, Some(Role::Camera));
        assert!(o.two_process());
    }

    #[test]
    fn to_args_round_trips() {
        for args in [
            &["--backend", "sim", "--processes", "2", "--frames", "7"][..],
            &[
                "--role",
                "cuda",
                "--nvsciipc-config",
                "/tmp/a b.cfg",
                "--endpoints",
                "x,y",
                "--peer-timeout",
                "2.5",
                "--json",
                "--quiet",
            ][..],
            &[
                "--backend",
                "host",
                "--copy",
                "--readback",
                "inline",
                "--fault",
                "skip-process",
                "--frame-threads",
                "2",
            ][..],
            &["--backend", "egl", "--ring", "2", "--egl-pool", "5"][..],
        ] {
            let o = run(args).unwrap();
            let again = match parse_with_env(o.to_args(), &|_| None).unwrap() {
                Command::Run(o) => o,
                Command::Help => panic!("help"),
            };
            assert_eq!(again, o, "{args:?}");
        }
    }

    #[test]
    fn bad_input_gives_one_line_errors_naming_the_option() {
        let cases: &[(&[&str], &[&str])] = &[
            (&["--frames", "0"], &["--frames", "outside 1..=1000000"]),
            (&["--frames", "-3"], &["--frames", "outside 1..=1000000"]),
            (&["--frames", "1000001"], &["outside 1..=1000000"]),
            (&["--ring", "0"], &["--ring", "fixed capacity"]),
            (&["--ring", "9"], &["--ring", "outside 1..=8"]),
            (&["--ring", "abc"], &["--ring", "not a number"]),
            (&["--width", "0"], &["--width", "outside 1..=4096"]),
            (&["--width", "99999"], &["--width", "outside 1..=4096"]),
            (&["--height", "5000"], &["--height", "outside"]),
            (&["--format", "yuv"], &["--format", "yuv", "raw8"]),
            (&["--backend", "opencl"], &["--backend", "opencl", "host"]),
            (&["--frames"], &["--frames"]),
            (&["--json=yes"], &["--json"]),
            (&["--bogus"], &["--bogus"]),
            (&["--die-at", "3"], &["--die-at"]),
            (&["--fault", "corrupt"], &["--fault", "only applies"]),
            (&["--processes", "3"], &["--processes", "outside 1..=2"]),
            (
                &["--processes", "2", "--copy"],
                &["--copy", "--processes 2"],
            ),
            (
                &["--processes", "2", "--readback", "inline"],
                &["--readback inline", "--processes 2"],
            ),
            (
                &["--processes", "2", "--backend", "host"],
                &["--backend host", "--processes 2"],
            ),
            (
                &["--role", "cuda", "--backend", "egl"],
                &["--backend egl", "--role"],
            ),
            (
                &["--role", "cuda", "--processes", "1"],
                &["--role", "--processes 1"],
            ),
            (&["--endpoints", "a,b"], &["--endpoints", "two-process"]),
            (
                &["--nvsciipc-config", "x"],
                &["--nvsciipc-config", "two-process"],
            ),
            (
                &["--processes", "2", "--endpoints", "ab"],
                &["--endpoints", "CAMERA,CUDA"],
            ),
            (&["--frame-threads", "65"], &["--frame-threads", "1..=64"]),
        ];
        for (args, want) in cases {
            let e = run(args).unwrap_err();
            for w in *want {
                assert!(e.contains(w), "{args:?}: {e} (wanted {w:?})");
            }
            assert!(!e.contains('\n'), "{args:?}: {e}");
        }
    }

    #[test]
    fn the_environment_becomes_options_and_a_flag_wins() {
        let o = run_with(
            &[],
            &[(env::FRAME_THREADS, "5"), (env::CAMERA_AHEAD, "off")],
        )
        .unwrap();
        assert_eq!(
            (o.frame_threads, o.frame_threads_setting()),
            (None, Some(5))
        );
        assert!(!o.camera_ahead);
        let o = run_with(&["--frame-threads", "3"], &[(env::FRAME_THREADS, "5")]).unwrap();
        assert_eq!(o.frame_threads_setting(), Some(3));
        let o = run_with(&["--camera-ahead", "on"], &[(env::CAMERA_AHEAD, "0")]).unwrap();
        assert!(o.camera_ahead);
        let egl = ["--backend", "egl", "--ring", "3"];
        assert_eq!(
            run_with(&egl, &[(env::EGL_POOL, "9")]).unwrap().egl_pool,
            Some(9)
        );
        let mut flag = egl.to_vec();
        flag.extend(["--egl-pool", "4"]);
        assert_eq!(
            run_with(&flag, &[(env::EGL_POOL, "9")]).unwrap().egl_pool,
            Some(4)
        );
        // The variable is checked against the ring even where the flag wins.
        let e = run_with(&flag, &[(env::EGL_POOL, "3")]).unwrap_err();
        assert!(e.contains(env::EGL_POOL) && e.contains("4..=64"), "{e}");
        let o = run_with(&["--backend", "gpu"], &[(env::GPU_EARLY, "0")]).unwrap();
        assert_eq!(o.env.gpu.early, Some(false));
        // The two-process mode reads the variables in each process.
        let o = run_with(&["--processes", "2"], &[(env::FRAME_THREADS, "2")]).unwrap();
        assert_eq!(o.frame_threads_setting(), Some(2));
        assert!(!o.to_args().iter().any(|a| a == "--frame-threads"));
    }

    #[test]
    fn trace_to_stdout_and_the_egl_pool_are_checked() {
        let o = run(&["--trace", "-"]).unwrap();
        assert!(o.trace_to_stdout());
        assert!(!run(&["--trace", "./-"]).unwrap().trace_to_stdout());
        for (args, want) in [
            (
                &["--trace", "-", "--json"][..],
                &["--trace -", "--json"][..],
            ),
            (&["--egl-pool", "6"], &["--egl-pool", "--backend egl"]),
            (
                &["--backend", "egl", "--ring", "8", "--egl-pool", "8"],
                &["--egl-pool 8", "9..=64"],
            ),
            (
                &["--backend", "egl", "--egl-pool", "65"],
                &["--egl-pool", "2..=64"],
            ),
        ] {
            let e = run(args).unwrap_err();
            for w in want {
                assert!(e.contains(w), "{args:?}: {e} (wanted {w:?})");
            }
        }
    }

    #[test]
    fn the_two_process_entry_point_refuses_what_it_does_not_carry_out() {
        let o = Options {
            processes: 2,
            copy: true,
            ..Options::default()
        };
        let e = crate::app::process::run(&o).unwrap_err().to_string();
        assert!(e.contains("--copy") && e.contains("--processes 2"), "{e}");
    }

    #[test]
    fn help_lists_options_and_environment() {
        let h = help();
        for w in [
            "--processes",
            "--role",
            "--endpoints",
            "--nvsciipc-config",
            "--frame-threads",
            "--trace <FILE>",
            "--trace-frames <N>",
            "TEGRA_INTEROP_FRAME_THREADS",
            "TEGRA_INTEROP_CAMERA_AHEAD",
            "--camera-ahead <ON|OFF>",
            "TEGRA_INTEROP_EGL_POOL",
            "--egl-pool <N>",
            "Exit status",
        ] {
            assert!(h.contains(w), "{w}: {h}");
        }
        for w in env::ALL {
            assert!(h.contains(w), "{w}: {h}");
        }
        assert!(!h.contains("--die-at"));
    }
}
