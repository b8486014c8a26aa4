//! `--processes 2`: the camera and the CUDA consumer in two processes,
//! connected only by an NvSciIpc endpoint pair, the way a Jetson / DRIVE
//! system splits them.
//!
//! The CUDA process (the one started by the user) starts the camera process
//! (the same binary with `--role camera`) and both open their end of the
//! pair: on the simulator a pair of a configuration the CUDA process makes
//! in memory (an anonymous memory file the camera process inherits, so no
//! file is left behind whatever ends the processes; `--nvsciipc-config` to
//! use a file instead); on a Jetson the pair named with `--endpoints
//! <camera>,<cuda>` (an `INTER_PROCESS` line of `/etc/nvsciipc.cfg`).
//!
//! With `--backend gpu` (a discrete GPU) or `--backend sim-fd` the mode
//! runs over fds passed on a Unix socket instead: see [`fd`].
//!
//! # One protocol
//! The CUDA process drives the ring's state machine ([`crate::slots::Slots`]), the
//! one slot protocol of every transport; its transport,
//! [`cuda::RemoteCamera`], has its producer side in the camera process:
//! each ticket crosses to the camera, which waits for the slot's *free*
//! fence, checks the processed bytes of the slot's previous frame (every
//! byte inverted), writes the frame, signals *ready* and answers
//! "written"; the CUDA process then waits for *ready* on its stream,
//! runs the user's work on the frame in place, signals *free*. The camera
//! checks every ticket against a ring of its own that follows the same
//! protocol.
//!
//! Set-up, per slot, exactly as the libraries require across processes
//! (each side opens its own modules; lists travel from the waiter to the
//! signaller; the signaller reconciles, allocates and sends the reconciled
//! list with the object): the buffer and *ready* are allocated by the
//! camera from the CUDA process's lists, *free* by the CUDA process from
//! the camera's waiter list. Fences: with deterministic fences (NvSciSync
//! 2.3, 2.5+) only the first fence of each object crosses, to learn its
//! counter; the later ones are built by the waiter. Without them every
//! fence crosses.
//!
//! # Bounded
//! Every wait for the other side (its connection, each message, each
//! object, each fence, the camera process's exit) is bounded by
//! `--peer-timeout` (default [`DEFAULT_PEER_TIMEOUT`]); a stopped or stuck
//! peer ends this side with [`ProcessError::Timeout`], naming what it
//! waited for; a peer that died gives [`ProcessError::Ipc`] (the
//! connection reset). The CUDA process ends the camera process it started
//! when it fails, and its error says how that process ended
//! ([`ProcessError::WithCamera`]). The camera process it starts watches it
//! until the two are connected, and ends at once if it died before
//! ([`ProcessError::ParentGone`]). First the CUDA side sends its options
//! and `--fault`; the camera answers with the run's fault (the one either
//! side was given) or with its own options, which the CUDA side names
//! where they differ ([`ProcessError::Mismatch`]). No wait is queued on the GPU before the fence it waits
//! for was signalled, so a dead camera leaves no stuck stream behind.
//!
//! `--role camera` / `--role cuda` run one side alone (the other started by
//! hand or by a test), with `--nvsciipc-config` naming the file both use.
//!
//! # The work, and where it runs
//! The CUDA process's consumer is the in-process NvSci transport's
//! (`transport::nvsci::nvsci_consumer`): the work the one-process
//! NvSci mode chooses (the check-and-invert kernel for the sensor model's
//! frames, the only source this mode has) is compiled with NVRTC, loaded
//! and launched on the consumer's stream after its wait for *ready*, over
//! the NvSciBuf buffer mapped into CUDA, and *free* is signalled after it.
//! The driver's backend selects where that runs, not a separate code path:
//! `--backend jetson`, or `auto` with `--endpoints`, opens the real driver
//! once the Jetson probe finds an integrated GPU, the NvSci libraries and
//! NVRTC (refused with its reason otherwise), and the kernel runs on the
//! GPU; on the simulator it runs as its registered Rust twin, which counts
//! its launches for the report. The Jetson side is built for aarch64 in CI
//! and has never run on a Jetson.

mod camera;
pub mod cuda;
mod error;
pub mod fd;
mod fd_camera;
mod fd_consumer;
mod fd_cuda;
pub mod fd_multicast;
mod summary;
mod wire;

use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tegra_interop::driver::Backend;
use tegra_interop_sim::nvsci::IpcConfigFile;
use tegra_interop_sim::{Sim, SimConfig};

use crate::app::cli::{two_process_conflicts, BackendChoice, Options, Role};
use crate::app::probe::{Probe, Verdict};
use crate::app::report::Report;
use crate::transport::host::Fault;
use crate::transport::FrameGeometry;

pub use error::{Peer, ProcessError};
pub use summary::Summary;

/// The endpoint names of the simulator's pair.
const SIM_PAIR: (&str, &str) = ("tegra-interop-camera", "tegra-interop-cuda");
pub use crate::app::cli::DEFAULT_PEER_TIMEOUT;

/// Runs the two-process mode as `opts` asks (`opts.processes == 2` or
/// `opts.role` set); options this mode does not carry out are refused
/// ([`two_process_conflicts`], as the command line does). Returns the
/// report of the CUDA side, the same [`Report`] the one-process mode gives;
/// `None` for the camera side run alone (`--role camera`), whose figures go
/// to the CUDA process.
pub fn run(opts: &Options) -> Result<Option<Report>, ProcessError> {
    if fd::selected(opts) {
        return fd::run(opts);
    }
    two_process_conflicts(opts).map_err(ProcessError::Options)?;
    let settings = Settings::new(opts);
    let config = match &opts.nvsciipc_config {
        None => None,
        Some(p) => Some(p.to_str().map(str::to_owned).ok_or_else(|| {
            ProcessError::Options(format!(
                "--nvsciipc-config {}: the path is not UTF-8",
                p.display()
            ))
        })?),
    };
    let endpoints = opts.endpoints.as_ref();
    let summary = match opts.role {
        Some(Role::Camera) => {
            let watch = camera::watch_parent()?;
            let s = setup(&settings, endpoints, config.as_deref())?;
            camera::run(&settings, &s, watch)?;
            return Ok(None);
        }
        // The CUDA side alone; its camera was started by someone else.
        Some(Role::Cuda) => run_cuda(&settings, endpoints, config.as_deref())?,
        Some(Role::Consumer) => {
            return Err(ProcessError::Options(
                "--role consumer runs over fds: --backend sim-fd or gpu".into(),
            ))
        }
        None => cuda_process(opts, &settings, config)?,
    };
    Ok(Some(summary.report(opts, &settings)))
}

/// What the two sides run with (and must agree on).
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    frames: u64,
    ring: usize,
    width: u32,
    height: u32,
    bytes_per_pixel: usize,
    geometry: FrameGeometry,
    limit: Duration,
    backend: BackendChoice,
    /// The defect to inject (`--fault`): the camera damages a byte of each
    /// frame (`corrupt`), the CUDA side skips the processing
    /// (`skip-process`); verification must catch either.
    fault: Fault,
}

impl Settings {
    fn new(opts: &Options) -> Settings {
        let bytes_per_pixel = opts.sensor.format.bytes_per_pixel();
        let stride = opts.sensor.width as usize * bytes_per_pixel;
        Settings {
            frames: opts.frames,
            ring: opts.ring,
            width: u32::from(opts.sensor.width),
            height: u32::from(opts.sensor.height),
            bytes_per_pixel,
            geometry: FrameGeometry {
                stride,
                rows: opts.sensor.height as usize,
            },
            limit: opts.peer_timeout,
            backend: opts.backend,
            fault: opts.fault,
        }
    }

    fn hello(&self) -> wire::Hello {
        wire::Hello {
            frames: self.frames,
            ring: self.ring as u64,
            width: u64::from(self.width),
            height: u64::from(self.height),
            bytes_per_pixel: self.bytes_per_pixel as u64,
            fault: self.fault,
        }
    }
}

/// One process's simulator or the real driver, and the endpoint names.
pub(crate) struct Setup {
    backend: Arc<Backend>,
    /// This process's simulator (`None` on the real driver).
    sim: Option<Sim>,
    camera_ep: String,
    cuda_ep: String,
}

fn refuse_backend(b: BackendChoice) -> Result<(), ProcessError> {
    match b {
        BackendChoice::Auto | BackendChoice::Sim | BackendChoice::Jetson => Ok(()),
        other => Err(ProcessError::Options(format!(
            "--processes 2 runs over NvSci: --backend auto, sim or jetson (not {})",
            other.name()
        ))),
    }
}

fn setup(
    settings: &Settings,
    endpoints: Option<&(String, String)>,
    config: Option<&str>,
) -> Result<Setup, ProcessError> {
    refuse_backend(settings.backend)?;
    if real_driver(settings.backend, endpoints) {
        let (camera_ep, cuda_ep) = endpoints.cloned().ok_or_else(|| {
            ProcessError::Options(
                "on a Jetson, name the BSP's endpoint pair: --endpoints <camera>,<cuda>".into(),
            )
        })?;
        // The one-process mode's test for a Jetson: an integrated GPU, the
        // NvSci libraries and their symbols, NVRTC (the kernel's compiler).
        let probe = Probe::new();
        let backend = match (probe.jetson(), probe.real) {
            (Verdict::Available(_), Ok(backend)) => backend,
            (Verdict::Unavailable(why), _) | (Verdict::Available(_), Err(why)) => {
                return Err(ProcessError::Options(format!(
                    "--processes 2 on the real driver (the NvSci pair {camera_ep},{cuda_ep}) needs a Jetson: {why}"
                )))
            }
        };
        return Ok(Setup {
            backend,
            sim: None,
            camera_ep,
            cuda_ep,
        });
    }
    let config = config.ok_or_else(|| {
        ProcessError::Options("no NvSciIpc configuration (--nvsciipc-config)".into())
    })?;
    sim_setup(SimConfig::tegra().with_nvsciipc_config(config), endpoints)
}

/// This process's simulator (`config` names the NvSciIpc configuration).
fn sim_setup(
    config: SimConfig,
    endpoints: Option<&(String, String)>,
) -> Result<Setup, ProcessError> {
    let sim = Sim::with_config(config)
        .map_err(|e| ProcessError::Options(format!("the simulator: {e}")))?;
    let (camera_ep, cuda_ep) = endpoints
        .cloned()
        .unwrap_or((SIM_PAIR.0.to_owned(), SIM_PAIR.1.to_owned()));
    Ok(Setup {
        backend: sim.backend(),
        sim: Some(sim),
        camera_ep,
        cuda_ep,
    })
}

fn run_cuda(
    settings: &Settings,
    endpoints: Option<&(String, String)>,
    config: Option<&str>,
) -> Result<Summary, ProcessError> {
    let s = setup(settings, endpoints, config)?;
    cuda::run(settings, &s)
}

/// The CUDA process with the camera process it starts.
fn cuda_process(
    opts: &Options,
    settings: &Settings,
    config: Option<String>,
) -> Result<Summary, ProcessError> {
    refuse_backend(settings.backend)?;
    if real_driver(settings.backend, opts.endpoints.as_ref()) {
        // A Jetson: the pair is the BSP's (`/etc/nvsciipc.cfg`), both
        // processes on the real driver; checked before the camera starts.
        let s = setup(settings, opts.endpoints.as_ref(), None)?;
        let camera = spawn_camera(opts, None, None)?;
        let result = cuda::run(settings, &s);
        return finish_with_camera(camera, result, settings.limit);
    }
    // A configuration of our own in memory, unless a file is named.
    let (own, config) = match config {
        Some(p) => (None, p),
        None => {
            let c = IpcConfigFile::in_memory(&[(SIM_PAIR.0, SIM_PAIR.1, 16, 4096)]).map_err(
                |source| ProcessError::Io {
                    what: "the NvSciIpc configuration",
                    source,
                },
            )?;
            let p = c.path().display().to_string();
            (Some(c), p)
        }
    };
    let camera = spawn_camera(opts, Some(&config), own.as_ref())?;
    let result = run_cuda(settings, opts.endpoints.as_ref(), Some(&config));
    finish_with_camera(camera, result, settings.limit)
}

/// Whether the run is on the real driver: `--backend jetson`, or `auto`
/// with a Jetson's endpoint pair named (`--endpoints`); else the
/// simulator.
fn real_driver(backend: BackendChoice, endpoints: Option<&(String, String)>) -> bool {
    backend == BackendChoice::Jetson || (backend == BackendChoice::Auto && endpoints.is_some())
}

/// The CUDA side's `result` once the camera process it started exited
/// (see [`reap`]), or its failure.
fn finish_with_camera(
    camera: Child,
    result: Result<Summary, ProcessError>,
    limit: Duration,
) -> Result<Summary, ProcessError> {
    let (status, ended_here) = reap(camera, result.is_ok(), limit)?;
    match result {
        Ok(summary) if status.success() => Ok(summary),
        Ok(_) => Err(ProcessError::CameraFailed(status)),
        Err(error) => Err(ProcessError::WithCamera {
            error: Box::new(error),
            camera: status,
            ended_here,
        }),
    }
}

/// Starts this program as the camera side of the same run, on `config`
/// (inherited where it is `own`, a memory file; `None` on a Jetson, whose
/// pair the options name).
fn spawn_camera(
    opts: &Options,
    config: Option<&str>,
    own: Option<&IpcConfigFile>,
) -> Result<Child, ProcessError> {
    let exe = std::env::current_exe().map_err(|source| ProcessError::Io {
        what: "the current executable",
        source,
    })?;
    let camera = Options {
        role: Some(Role::Camera),
        processes: 1,
        nvsciipc_config: config.map(Into::into),
        json: false,
        ..opts.clone()
    };
    let mut cmd = Command::new(exe);
    cmd.args(camera.to_args())
        .env(camera::PARENT_VAR, std::process::id().to_string());
    if let Some(c) = own {
        c.share_with(&mut cmd);
    }
    cmd.spawn().map_err(|source| ProcessError::Io {
        what: "starting the camera process",
        source,
    })
}

/// Waits for the camera process to exit: at most `limit` after a run that
/// went well (it only sends its figures and closes), a moment after one
/// that failed (the camera is then dead, stopped or stuck); a camera still
/// running then is killed, so that this process never waits for it
/// without a limit. Its exit status, and whether it was ended here.
fn reap(mut camera: Child, ok: bool, limit: Duration) -> Result<(ExitStatus, bool), ProcessError> {
    let io = |what| move |source| ProcessError::Io { what, source };
    let grace = if ok {
        limit
    } else {
        limit.min(Duration::from_secs(1))
    };
    let deadline = Instant::now() + grace;
    loop {
        if let Some(status) = camera
            .try_wait()
            .map_err(io("waiting for the camera process"))?
        {
            return Ok((status, false));
        }
        if Instant::now() >= deadline {
            camera.kill().map_err(io("ending the camera process"))?;
            let status = camera
                .wait()
                .map_err(io("waiting for the camera process"))?;
            if ok {
                return Err(ProcessError::Timeout {
                    peer: Peer::Camera,
                    waiting_for: "its exit after its figures".into(),
                    limit,
                });
            }
            return Ok((status, true));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tegra_interop::driver::nvsci::FenceSource;
    use tegra_interop_sim::nvsci::NvSciRelease;

    /// Both sides in two threads of this process, each with a simulator of
    /// its own, under a release with deterministic fences (only the first
    /// fence of each object crosses) and one without (every fence crosses).
    #[test]
    #[cfg_attr(miri, ignore = "sockets and memory files")]
    fn every_frame_crosses_with_built_and_with_received_fences() {
        for (release, want) in [
            (NvSciRelease::V6_0_10, FenceSource::Built),
            (NvSciRelease::V5_2_6, FenceSource::Received),
        ] {
            let cfg = IpcConfigFile::in_memory(&[(SIM_PAIR.0, SIM_PAIR.1, 16, 4096)]).unwrap();
            let opts = Options {
                frames: 20,
                ring: 3,
                peer_timeout: Duration::from_secs(20),
                backend: BackendChoice::Sim,
                ..Options::default()
            };
            let settings = Settings::new(&opts);
            let sim = || {
                let c = SimConfig::tegra().with_nvsci_release(release);
                sim_setup(c.with_nvsciipc_config(cfg.path()), None)
            };
            let summary = std::thread::scope(|s| {
                let camera = s.spawn(|| camera::run(&settings, &sim()?, None));
                let summary = cuda::run(&settings, &sim().unwrap());
                camera.join().unwrap().unwrap();
                summary.unwrap()
            });
            assert_eq!(summary.source, want, "{release:?}");
            assert!(summary.passed(), "{release:?}: {summary:?}");
            assert_eq!(summary.camera.verified, 20);
            // Every frame went through the kernel (its simulator twin).
            assert_eq!(summary.kernel_launches, Some(20), "{release:?}");
            assert!(!summary.real);
        }
    }
}
