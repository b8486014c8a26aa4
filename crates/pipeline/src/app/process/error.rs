//! The typed error of the two-process mode.

use std::fmt;
use std::time::Duration;

use tegra_interop::driver::nvsci::IpcError;
use tegra_interop::driver::Error;

/// One side of the two-process mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// The process that writes the frames on the CPU (`--role camera`).
    Camera,
    /// The process that processes them with CUDA (`--role cuda`, or the
    /// one the user started).
    Cuda,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Peer::Camera => "camera process",
            Peer::Cuda => "CUDA process",
        })
    }
}

/// Why a side of the two-process mode failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ProcessError {
    /// A CUDA, NvSciBuf or NvSciSync call failed.
    Driver {
        /// What was being done.
        what: &'static str,
        /// The driver's error (the raw `CUresult` / `NvSciError` inside).
        source: Error,
    },
    /// A reconciliation failed (the driver's error and the keys in
    /// conflict).
    Reconcile {
        /// What was reconciled.
        what: &'static str,
        /// The driver's reconciliation error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The peer did not do what was waited for within the limit
    /// (`--peer-timeout`): it is stopped, stuck or not started.
    Timeout {
        /// The side waited for.
        peer: Peer,
        /// What was waited for.
        waiting_for: String,
        /// The limit.
        limit: Duration,
    },
    /// An NvSciIpc transfer failed: above all, the connection was reset
    /// because the peer ended.
    Ipc {
        /// The side at the other end.
        peer: Peer,
        /// What was being transferred.
        what: String,
        /// The driver's IPC error.
        source: IpcError,
    },
    /// The peer sent something this protocol does not allow (it is not
    /// trusted: checked before use).
    Protocol {
        /// The side that sent it.
        peer: Peer,
        /// What was wrong.
        detail: String,
    },
    /// The ring refused a move (a bug of this side, or of the peer's
    /// messages that slipped past the checks).
    Ring(String),
    /// This process's consumer (its CUDA stream) did not report a frame
    /// finished in time, or its completion channel closed.
    Consumer(String),
    /// The options do not allow this mode.
    Options(String),
    /// The per-frame figures could not be kept (a histogram refused).
    Figures(String),
    /// Starting or supervising the camera process failed.
    Io {
        /// What was being done.
        what: &'static str,
        /// The system's error.
        source: std::io::Error,
    },
    /// The camera process the CUDA process started failed.
    CameraFailed(std::process::ExitStatus),
    /// The two sides were started with options that differ (`--frames`,
    /// `--ring`, the frame's size and format, or two different `--fault`s).
    Mismatch {
        /// The other side.
        peer: Peer,
        /// The options that differ, with both values.
        detail: String,
    },
    /// The NvSciIpc configuration file cannot be used (the simulator's
    /// reason: the file, its line, what is wrong).
    Config {
        /// Why the file was refused.
        reason: String,
        /// The call's own error (on the simulator `NvSciIpcInit`'s
        /// `NotPermitted`).
        source: IpcError,
    },
    /// The CUDA process failed, and how the camera process it started
    /// ended.
    WithCamera {
        /// The CUDA process's error.
        error: Box<ProcessError>,
        /// The camera process's exit status.
        camera: std::process::ExitStatus,
        /// Whether it was still running after the failure and this process
        /// ended it.
        ended_here: bool,
    },
    /// The CUDA process that started this camera process ended before the
    /// two connected.
    ParentGone {
        /// Its pid.
        pid: u32,
    },
}

/// How a process ended, in words ("exited with status 1", "was killed by
/// signal 9 (SIGKILL)").
pub(crate) fn ended(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => {
            let name = match sig {
                libc_signal::SIGKILL => " (SIGKILL)",
                libc_signal::SIGTERM => " (SIGTERM)",
                libc_signal::SIGSEGV => " (SIGSEGV)",
                libc_signal::SIGABRT => " (SIGABRT)",
                _ => "",
            };
            format!("was killed by signal {sig}{name}")
        }
        (None, None) => format!("ended ({status})"),
    }
}

/// The Linux signal numbers [`ended`] names.
mod libc_signal {
    pub const SIGABRT: i32 = 6;
    pub const SIGKILL: i32 = 9;
    pub const SIGSEGV: i32 = 11;
    pub const SIGTERM: i32 = 15;
}

impl fmt::Display for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProcessError::Driver { what, source } => write!(f, "{what}: {source}"),
            ProcessError::Reconcile { what, source } => write!(f, "{what}: {source}"),
            ProcessError::Timeout {
                peer,
                waiting_for,
                limit,
            } => write!(
                f,
                "timed out after {limit:?} waiting for the {peer}: {waiting_for} (is it stopped or stuck? --peer-timeout sets the limit)"
            ),
            ProcessError::Ipc { peer, what, source } => {
                write!(f, "{what} (the {peer} at the other end): {source}")
            }
            ProcessError::Protocol { peer, detail } => {
                write!(f, "the {peer} broke the protocol: {detail}")
            }
            ProcessError::Ring(e) => write!(f, "ring: {e}"),
            ProcessError::Consumer(e) => write!(f, "the CUDA stream: {e}"),
            ProcessError::Options(e) => f.write_str(e),
            ProcessError::Figures(e) => write!(f, "per-frame figures: {e}"),
            ProcessError::Io { what, source } => write!(f, "{what}: {source}"),
            ProcessError::CameraFailed(status) => {
                write!(f, "the camera process failed: it {}", ended(status))
            }
            ProcessError::Mismatch { peer, detail } => write!(
                f,
                "the {peer} was started with other options: {detail} (start both roles with the same --frames, --ring, --width, --height and --format; give --fault to one side, or the same to both)"
            ),
            ProcessError::Config { reason, source } => write!(
                f,
                "the NvSciIpc configuration cannot be used: {reason} (so: {source})"
            ),
            ProcessError::WithCamera {
                error,
                camera,
                ended_here: true,
            } => write!(
                f,
                "{error}; the camera process was still running and was ended by this process: it {}",
                ended(camera)
            ),
            ProcessError::WithCamera { error, camera, .. } => {
                write!(f, "{error}; the camera process {}", ended(camera))
            }
            ProcessError::ParentGone { pid } => write!(
                f,
                "the CUDA process that started this camera process (pid {pid}) has ended; nothing is left to connect to"
            ),
        }
    }
}

impl std::error::Error for ProcessError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ProcessError::Driver { source, .. } => Some(source),
            ProcessError::Reconcile { source, .. } => Some(source.as_ref()),
            ProcessError::Ipc { source, .. } => Some(source),
            ProcessError::Io { source, .. } => Some(source),
            ProcessError::Config { source, .. } => Some(source),
            ProcessError::WithCamera { error, .. } => Some(error.as_ref()),
            _ => None,
        }
    }
}

impl ProcessError {
    /// An IPC error while waiting for `peer` to do `what`: a timeout of the
    /// endpoint becomes [`ProcessError::Timeout`].
    pub(crate) fn ipc(peer: Peer, what: impl Into<String>, e: IpcError) -> ProcessError {
        match e {
            IpcError::Timeout { waited, .. } => ProcessError::Timeout {
                peer,
                waiting_for: what.into(),
                limit: waited,
            },
            source => ProcessError::Ipc {
                peer,
                what: what.into(),
                source,
            },
        }
    }
}

/// Names what a driver call was for.
pub(crate) trait Context<T> {
    /// The error as [`ProcessError`], naming `what`.
    fn ctx(self, what: &'static str) -> Result<T, ProcessError>;
}

impl<T> Context<T> for Result<T, Error> {
    fn ctx(self, what: &'static str) -> Result<T, ProcessError> {
        self.map_err(|source| ProcessError::Driver { what, source })
    }
}

impl<T, K> Context<T> for Result<T, tegra_interop::driver::nvsci::ReconcileError<K>>
where
    K: fmt::Debug + Send + Sync + 'static,
{
    fn ctx(self, what: &'static str) -> Result<T, ProcessError> {
        self.map_err(|e| ProcessError::Reconcile {
            what,
            source: Box::new(e),
        })
    }
}
