//! `--processes 2 --backend gpu` / `--backend sim-fd`: the two-process
//! mode over file descriptors, for a discrete GPU (where NvSci is absent)
//! and for the simulator.
//!
//! The CUDA process (the one the user started) makes a Unix socket pair
//! and starts the camera process (this program with `--role camera`), whose
//! stdin is its end of the pair. Over it ([`crate::transport::fdpass`]: the
//! peer's uid checked, messages and fds bounded, every wait bounded by
//! `--peer-timeout`):
//!
//! 1. the CUDA process sends the run's settings (`hello`, the `--fault`
//!    too); the camera refuses any that differ from its own options;
//! 2. the camera allocates every slot's memory and two timeline semaphores
//!    (*ready*, *free*) with an exporter ([`crate::transport::export`]:
//!    Vulkan on the GPU, the simulator's memfds with `sim-fd`) and sends
//!    them as fds; the CUDA process checks each memory fd's declared size
//!    against the frame it needs and against `fstat` of the fd (a regular
//!    file, the simulator's memfd; a Vulkan `OPAQUE_FD` is not one, and its
//!    size is bounded by the frame rounded up to 2 MiB instead), then
//!    imports them into CUDA;
//! 3. the CUDA process drives the ring ([`crate::slots::Slots`]): per frame
//!    it sends the ticket; the camera waits (bounded) for the slot's *free*
//!    value, checks the slot's previous frame (every byte inverted),
//!    writes the frame and publishes it (*ready*), answers `written`; the
//!    CUDA stream waits for *ready*, runs the user's work (the project's
//!    [`CheckInvert`](crate::consumer::CheckInvert)), which checks every
//!    byte and inverts it, and signals *free*;
//! 4. at the end the camera checks the last frames and sends its figures.
//!
//! So every frame is verified in both processes. A camera whose peer ended
//! sees the socket close while it waits and ends with a typed error; a
//! silent or stopped peer ends either side at the peer timeout.
//!
//! `--role camera` / `--role cuda` with these backends run one side with
//! the socket on stdin (a test, or a supervisor that made the pair).
//!
//! Verified where: `--backend sim-fd` on the simulator in CI
//! (`tests/two_process_fd.rs`); `--backend gpu` builds with `--features
//! vulkan` and has not run on a GPU yet.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::error::{Peer, ProcessError};
use super::Settings;
use crate::app::cli::{format_name, BackendChoice, Options, Readback, Role};
use crate::app::report::{Report, Verification};
use crate::app::stats::Summary as Stat;
use crate::transport::fdpass::{Channel, FdError, Limits};
use crate::transport::host::Fault;

pub(super) use super::fd_cuda::FdSummary;

/// Whether `o` asks for the fd two-process mode.
pub fn selected(o: &Options) -> bool {
    o.two_process() && matches!(o.backend, BackendChoice::Gpu | BackendChoice::SimFd)
}

/// What the fd two-process mode does not carry out, refused naming the
/// option.
///
/// # Errors
/// The refusal's text.
pub fn conflicts(o: &Options) -> Result<(), String> {
    let mode = match o.role {
        Some(_) => "--role",
        None => "--processes 2",
    };
    let backend = o.backend.name();
    if o.backend == BackendChoice::Gpu && !cfg!(feature = "vulkan") {
        return Err(format!(
            "{mode} --backend gpu needs the pipeline built with --features vulkan"
        ));
    }
    let refused = [
        (o.endpoints.is_some(), "--endpoints"),
        (o.nvsciipc_config.is_some(), "--nvsciipc-config"),
        (o.copy, "--copy"),
        (o.readback == Readback::Inline, "--readback inline"),
        (o.frame_threads.is_some(), "--frame-threads"),
        (o.trace.is_some(), "--trace"),
    ];
    for (given, flag) in refused {
        if given {
            return Err(format!(
                "{flag} cannot be used with {mode} --backend {backend}: the fd two-process mode does not carry it out"
            ));
        }
    }
    Ok(())
}

/// The channel's limits for `settings`.
fn limits(settings: &Settings) -> Limits {
    Limits::new(settings.limit)
}

/// The channel error as the process error, `peer` at the other end.
pub(super) fn fd_err(peer: Peer) -> impl Fn(FdError) -> ProcessError {
    move |e| match e {
        FdError::Timeout { waiting_for, limit } => ProcessError::Timeout {
            peer,
            waiting_for,
            limit,
        },
        source => ProcessError::Fd { peer, source },
    }
}

/// The fault as the hello's code.
pub(super) fn fault_code(f: Fault) -> u64 {
    match f {
        Fault::None => 0,
        Fault::Corrupt => 1,
        Fault::SkipProcess => 2,
    }
}

/// Runs the mode as `opts` asks (see [`super::run`]).
pub(super) fn run(opts: &Options) -> Result<Option<Report>, ProcessError> {
    conflicts(opts).map_err(ProcessError::Options)?;
    let settings = Settings::new(opts);
    match opts.role {
        Some(Role::Camera) => {
            let ch = stdin_channel(&settings, Peer::Cuda)?;
            super::fd_camera::run(&settings, ch)?;
            Ok(None)
        }
        Some(Role::Consumer) => {
            super::fd_consumer::run(opts)?;
            Ok(None)
        }
        Some(Role::Cuda) => {
            let ch = stdin_channel(&settings, Peer::Camera)?;
            let s = super::fd_cuda::run(&settings, ch)?;
            Ok(Some(s.report(opts, &settings)))
        }
        None => {
            let (mine, theirs) = Channel::pair(limits(&settings)).map_err(fd_err(Peer::Camera))?;
            let camera = spawn_camera(opts, theirs)?;
            let result = super::fd_cuda::run(&settings, mine);
            let (status, ended_here) = super::reap(camera, result.is_ok(), settings.limit)?;
            match result {
                // The camera ended first: its exit status says how (its own
                // error is on the shared stderr).
                Err(ProcessError::Fd {
                    source: FdError::Closed { .. },
                    ..
                }) if !status.success() => Err(ProcessError::CameraFailed(status)),
                Err(e) => Err(ProcessError::WithCamera {
                    error: Box::new(e),
                    camera: status,
                    ended_here,
                }),
                Ok(_) if !status.success() => Err(ProcessError::CameraFailed(status)),
                Ok(summary) => Ok(Some(summary.report(opts, &settings))),
            }
        }
    }
}

/// The camera side over `channel` (its peer the CUDA side): what `--role
/// camera` runs with the socket on stdin, for a caller that made the
/// connection itself (a test that plays the CUDA process's supervisor).
///
/// # Errors
/// As the camera side fails: the peer's typed errors, timeouts, a hello
/// that differs from `opts`.
pub fn camera_side(opts: &Options, channel: Channel) -> Result<(), ProcessError> {
    conflicts(opts).map_err(ProcessError::Options)?;
    super::fd_camera::run(&Settings::new(opts), channel)
}

/// The channel on this process's stdin (the started side).
fn stdin_channel(settings: &Settings, peer: Peer) -> Result<Channel, ProcessError> {
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| ProcessError::Io {
            what: "duplicating stdin (the socket of --role with an fd backend)",
            source,
        })?;
    Channel::new(UnixStream::from(fd), limits(settings)).map_err(|e| match e {
        FdError::Io { what, source } => ProcessError::Options(format!(
            "--role with --backend {} takes its connected Unix socket on stdin: {what}: {source}",
            settings.backend.name()
        )),
        e => fd_err(peer)(e),
    })
}

/// Starts this program as the camera side, its stdin the socket `theirs`
/// (closed in this process once the child has it).
fn spawn_camera(opts: &Options, theirs: Channel) -> Result<Child, ProcessError> {
    let exe = std::env::current_exe().map_err(|source| ProcessError::Io {
        what: "the current executable",
        source,
    })?;
    let camera = Options {
        role: Some(Role::Camera),
        processes: 1,
        json: false,
        ..opts.clone()
    };
    let mut cmd = Command::new(exe);
    cmd.args(camera.to_args())
        .stdin(Stdio::from(theirs.into_socket()));
    cmd.spawn().map_err(|source| ProcessError::Io {
        what: "starting the camera process",
        source,
    })
    // `cmd` drops here with this process's copy of the camera's end: the
    // camera's exit then closes the connection.
}

impl FdSummary {
    /// Every frame arrived intact and came back processed.
    pub(super) fn passed(&self) -> bool {
        self.mismatches == 0
            && self.camera_failed == 0
            && self.camera_verified == self.frames
            && self.collected == self.frames
    }

    fn verification(&self) -> Verification {
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
        Verification {
            consumer_ok: self.collected.saturating_sub(self.bad_frames),
            readback_ok: self.camera_verified.saturating_sub(self.camera_failed),
            pulses: None,
            failed: self.bad_frames + self.camera_failed + missing,
            first_failure,
            by_digest: false,
        }
    }

    /// The run's report, as the one-process mode gives it.
    pub(super) fn report(&self, opts: &Options, settings: &Settings) -> Report {
        let or_none = |s: Option<Stat>| s.unwrap_or(Stat::NOT_MEASURED);
        let passed = if self.passed() {
            ""
        } else {
            " (NOT all verified)"
        };
        Report {
            processes: 2,
            backend: self.backend,
            why: format!(
                "--processes 2 --backend {}: the camera in a second process, connected to this CUDA process by a Unix socket that carried the slots' memory and timeline semaphores as fds (exporter: {}){passed}",
                settings.backend.name(),
                self.exporter
            ),
            note: self.note,
            details: Some(format!(
                "cuda pid {}: {} frames processed in {} us, {} bytes differed from the pattern; camera pid {}: {}/{} frames read back verified, {} failed, write {} us/frame, {} us",
                self.cuda_pid, self.collected, self.cuda_us, self.mismatches,
                self.camera_pid, self.camera_verified, self.frames, self.camera_failed,
                self.camera_write_us, self.camera_us,
            )),
            frames: self.frames,
            ring: settings.ring,
            width: opts.sensor.width,
            height: opts.sensor.height,
            format: format_name(opts.sensor.format),
            frame_len: settings.geometry.frame_len(),
            copy: false,
            camera_ahead: false,
            wall: Duration::from_micros(self.cuda_us),
            latency: or_none(self.latency),
            write: or_none(self.write),
            process: or_none(self.process),
            queued: or_none(self.queued),
            held: Stat::NOT_MEASURED,
            overhead: Stat::NOT_MEASURED,
            stages: Vec::new(),
            verification: self.verification(),
        }
    }
}
