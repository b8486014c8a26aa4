//! The NvSciIpc configuration file in the BSP's format, and a writer of
//! such files for tests ([`IpcConfigFile`]).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

/// `NV_SCI_IPC_EVENT_*` bits (nvsciipc.h).
pub(crate) mod event {
    pub(crate) const READ: u32 = 0x01;
    pub(crate) const WRITE: u32 = 0x02;
    pub(crate) const CONN_EST: u32 = 0x04;
    pub(crate) const CONN_RESET: u32 = 0x08;
    pub(crate) const WRITE_EMPTY: u32 = 0x10;
}

/// `NVSCIIPC_MAX_ENDPOINT_NAME`: name bytes including the terminating NUL.
pub(crate) const MAX_NAME: usize = 64;
/// Where the BSP keeps the configuration.
pub(crate) const DEFAULT_CONFIG: &str = "/etc/nvsciipc.cfg";

/// The most bytes of a configuration file the simulator reads. A chosen
/// bound: a BSP's file has one short line per channel (a few KiB), and no
/// NVIDIA document states a size.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The largest `frame_size` the simulator accepts. A chosen bound: no
/// header or NVIDIA guide states one (the DRIVE OS 6.0.9 guide says there
/// is no upper limit); the simulator carries each frame as one
/// `SOCK_SEQPACKET` message, which must fit a socket's default send buffer
/// (Linux: 212,992 bytes), and 64 KiB is that with room to spare.
pub const MAX_FRAME_SIZE: u32 = 1 << 16;
/// The largest `nframes` the simulator accepts. A chosen bound: none is
/// documented; `nframes` also bounds how many exported objects (one fd
/// each) a peer can make this end hold, which must stay well inside the
/// usual limit of 1024 open fds.
pub const MAX_NFRAMES: u32 = 256;
/// The most bytes one direction of a channel may queue (`nframes x
/// frame_size`): what a receiver may have to hold for its peer. A chosen
/// bound (4 MiB, e.g. 64 frames of 64 KiB); the BSP's examples queue
/// kilobytes.
pub const MAX_CHANNEL_BYTES: u64 = 4 << 20;

/// Why the simulator cannot use an NvSciIpc configuration file: the file
/// and the reason. `Display` says both.
#[derive(Debug)]
pub struct IpcConfigError {
    /// The file, as it was named.
    pub path: PathBuf,
    /// What is wrong with it.
    pub problem: IpcConfigProblem,
}

/// What is wrong with an NvSciIpc configuration file (see [`IpcConfigError`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum IpcConfigProblem {
    /// It could not be opened, examined or read.
    Unreadable(io::Error),
    /// It is not a regular file (a FIFO, a device, a socket, a directory):
    /// it is opened without blocking, examined and refused, never read (a
    /// FIFO could block and a device never end).
    NotRegular {
        /// What it is instead.
        kind: &'static str,
    },
    /// It holds more than [`MAX_CONFIG_BYTES`].
    TooLarge {
        /// The most bytes read.
        max: u64,
    },
    /// It is not UTF-8 text.
    NotText,
    /// A line is not of the BSP's form.
    Malformed {
        /// The line number (from 1).
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A number beyond the simulator's bound.
    OutOfRange {
        /// The line number (from 1).
        line: usize,
        /// The field: `nframes`, `frame_size` or `nframes x frame_size`.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The most accepted.
        max: u64,
    },
}

impl std::fmt::Display for IpcConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = self.path.display();
        match &self.problem {
            IpcConfigProblem::Unreadable(e) => {
                write!(f, "cannot read the NvSciIpc configuration {path}: {e}")
            }
            IpcConfigProblem::NotRegular { kind } => write!(
                f,
                "the NvSciIpc configuration {path} is not a regular file but a {kind}; it was not read (only a regular file is: a FIFO could block and a device never end)"
            ),
            IpcConfigProblem::TooLarge { max } => write!(
                f,
                "the NvSciIpc configuration {path} is larger than {max} bytes, the most the simulator reads"
            ),
            IpcConfigProblem::NotText => {
                write!(f, "the NvSciIpc configuration {path} is not UTF-8 text")
            }
            IpcConfigProblem::Malformed { line, reason } => {
                write!(f, "the NvSciIpc configuration {path}, line {line}: {reason}")
            }
            IpcConfigProblem::OutOfRange {
                line,
                field,
                value,
                max,
            } => write!(
                f,
                "the NvSciIpc configuration {path}, line {line}: {field} {value} is beyond the simulator's bound (at most {max}; no NVIDIA document states a limit, the simulator's own is in its README)"
            ),
        }
    }
}

impl std::error::Error for IpcConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.problem {
            IpcConfigProblem::Unreadable(e) => Some(e),
            _ => None,
        }
    }
}

/// What a non-regular file is, in words.
fn kind_of(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// Reads at most [`MAX_CONFIG_BYTES`] of the regular file at `path`. The
/// file is opened without blocking (a FIFO without a writer would block the
/// open) and examined (`fstat`) before anything is read from it.
fn read_bounded(path: &Path) -> Result<String, IpcConfigProblem> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(IpcConfigProblem::Unreadable)?;
    let meta = file.metadata().map_err(IpcConfigProblem::Unreadable)?;
    if !meta.file_type().is_file() {
        return Err(IpcConfigProblem::NotRegular {
            kind: kind_of(meta.file_type()),
        });
    }
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(IpcConfigProblem::Unreadable)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(IpcConfigProblem::TooLarge {
            max: MAX_CONFIG_BYTES,
        });
    }
    String::from_utf8(bytes).map_err(|_| IpcConfigProblem::NotText)
}

/// The kind of channel a configuration line declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    /// `INTER_PROCESS` or `INTER_THREAD`: simulated.
    Local,
    /// Any other backend (`INTER_VM`, `INTER_CHIP`...): not simulated.
    Other(String),
}

/// One endpoint of the configuration.
#[derive(Clone, Debug)]
pub(crate) struct EndpointConfig {
    pub(crate) backend: Backend,
    /// The pair as written on its line (first, second).
    pub(crate) pair: (String, String),
    pub(crate) nframes: u32,
    pub(crate) frame_size: u32,
}

/// A parsed configuration file.
#[derive(Clone, Debug)]
pub(crate) struct IpcTable {
    /// Tells apart the simulations using different files (part of every
    /// socket name).
    pub(crate) key: u64,
    pub(crate) endpoints: HashMap<String, EndpointConfig>,
}

pub(crate) fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What tells one configuration file from another (the socket names are
/// derived from it): its canonical path, or, for a file reached through a
/// descriptor (`/proc/self/fd/N`, as [`IpcConfigFile::in_memory`] names
/// its memory file), the target of that link, which is the same in every
/// process that inherited the descriptor and differs between files.
fn file_identity(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::fs::read_link(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

impl IpcTable {
    /// Reads and checks the configuration at `path` (a regular file of at
    /// most [`MAX_CONFIG_BYTES`], values within the simulator's bounds).
    pub(crate) fn load(path: &Path) -> Result<IpcTable, IpcConfigError> {
        let error = |problem| IpcConfigError {
            path: path.to_path_buf(),
            problem,
        };
        let text = read_bounded(path).map_err(error)?;
        let canonical = file_identity(path);
        let mut t = IpcTable::parse(&text).map_err(error)?;
        t.key = fnv(canonical.as_os_str().as_encoded_bytes());
        Ok(t)
    }

    /// Parses configuration text (BSP format), values within the bounds
    /// ([`MAX_NFRAMES`], [`MAX_FRAME_SIZE`], [`MAX_CHANNEL_BYTES`]).
    pub(crate) fn parse(text: &str) -> Result<IpcTable, IpcConfigProblem> {
        let mut endpoints = HashMap::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let at = n + 1;
            let malformed = |reason: String| IpcConfigProblem::Malformed { line: at, reason };
            let name_ok = |s: &str| !s.is_empty() && s.len() < MAX_NAME;
            let mut add = |name: &str, cfg: EndpointConfig| {
                if !name_ok(name) {
                    return Err(malformed(format!(
                        "endpoint name {name:?} is empty or longer than {} bytes",
                        MAX_NAME - 1
                    )));
                }
                if endpoints.insert(name.to_owned(), cfg).is_some() {
                    return Err(malformed(format!("endpoint {name:?} is declared twice")));
                }
                Ok(())
            };
            match f[0] {
                "INTER_PROCESS" | "INTER_THREAD" => {
                    let [_, a, b, nframes, frame_size] = f[..] else {
                        return Err(malformed(format!(
                            "expected `{} <ep_a> <ep_b> <nframes> <frame_size>`",
                            f[0]
                        )));
                    };
                    let num = |s: &str, field: &'static str, max: u32| match s.parse::<u64>() {
                        Ok(0) | Err(_) => {
                            Err(malformed(format!("{field} {s:?} is not a positive number")))
                        }
                        Ok(v) if v > u64::from(max) => Err(IpcConfigProblem::OutOfRange {
                            line: at,
                            field,
                            value: v,
                            max: u64::from(max),
                        }),
                        Ok(v) => Ok(v as u32),
                    };
                    if a == b {
                        return Err(malformed("an endpoint cannot be its own peer".into()));
                    }
                    let nframes = num(nframes, "nframes", MAX_NFRAMES)?;
                    let frame_size = num(frame_size, "frame_size", MAX_FRAME_SIZE)?;
                    let queued = u64::from(nframes) * u64::from(frame_size);
                    if queued > MAX_CHANNEL_BYTES {
                        return Err(IpcConfigProblem::OutOfRange {
                            line: at,
                            field: "nframes x frame_size",
                            value: queued,
                            max: MAX_CHANNEL_BYTES,
                        });
                    }
                    let cfg = EndpointConfig {
                        backend: Backend::Local,
                        pair: (a.to_owned(), b.to_owned()),
                        nframes,
                        frame_size,
                    };
                    add(a, cfg.clone())?;
                    add(b, cfg)?;
                }
                other if other.starts_with("INTER_") && f.len() >= 2 => {
                    let cfg = EndpointConfig {
                        backend: Backend::Other(other.to_owned()),
                        pair: (f[1].to_owned(), String::new()),
                        nframes: 0,
                        frame_size: 0,
                    };
                    add(f[1], cfg)?;
                }
                other => return Err(malformed(format!("unknown backend {other:?}"))),
            }
        }
        Ok(IpcTable { key: 0, endpoints })
    }
}

/// A configuration file in the BSP's format for the simulator's NvSciIpc:
/// give its [`path`](IpcConfigFile::path) to
/// [`SimConfig::with_nvsciipc_config`](crate::SimConfig::with_nvsciipc_config)
/// in every process (simulator) that opens its endpoints. Endpoint names
/// are private to the file, so tests running in parallel can all use "a"
/// and "b".
///
/// Two kinds:
/// - [`inter_process`](IpcConfigFile::inter_process) /
///   [`with_text`](IpcConfigFile::with_text): a file at a unique temporary
///   path, removed on drop (a process killed before the drop leaves it
///   behind);
/// - [`in_memory`](IpcConfigFile::in_memory): an anonymous memory file
///   (`memfd_create`) that never has a name in any directory, reached as
///   `/proc/self/fd/N`; a child process started with
///   [`share_with`](IpcConfigFile::share_with) inherits descriptor `N` and
///   so the same path. Nothing is left behind however the processes end.
///
/// ```
/// use tegra_interop_sim::nvsci::IpcConfigFile;
/// let cfg = IpcConfigFile::inter_process(&[("cam", "cuda", 16, 4096)]).unwrap();
/// let text = std::fs::read_to_string(cfg.path()).unwrap();
/// assert_eq!(text, "INTER_PROCESS cam cuda 16 4096\n");
/// let mem = IpcConfigFile::in_memory(&[("cam", "cuda", 16, 4096)]).unwrap();
/// assert_eq!(std::fs::read_to_string(mem.path()).unwrap(), text);
/// ```
#[derive(Debug)]
pub struct IpcConfigFile {
    path: PathBuf,
    /// The memory file of [`IpcConfigFile::in_memory`] (`None`: a file on
    /// disk at `path`).
    memory: Option<std::os::fd::OwnedFd>,
}

fn lines(pairs: &[(&str, &str, u32, u32)]) -> String {
    pairs
        .iter()
        .map(|(a, b, n, f)| format!("INTER_PROCESS {a} {b} {n} {f}\n"))
        .collect()
}

/// A name no other configuration of this or another living process has
/// (the process id, a counter, the clock's nanoseconds).
fn unique_name() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "tegra-interop-sim-nvsciipc-{}-{n}-{nanos}.cfg",
        std::process::id()
    )
}

impl IpcConfigFile {
    /// Writes one `INTER_PROCESS <a> <b> <nframes> <frame_size>` line per
    /// pair to a temporary file.
    pub fn inter_process(pairs: &[(&str, &str, u32, u32)]) -> io::Result<IpcConfigFile> {
        IpcConfigFile::with_text(&lines(pairs))
    }

    /// Writes `text` as the configuration, to a temporary file.
    pub fn with_text(text: &str) -> io::Result<IpcConfigFile> {
        let path = std::env::temp_dir().join(unique_name());
        std::fs::write(&path, text)?;
        Ok(IpcConfigFile { path, memory: None })
    }

    /// The same lines as [`inter_process`](IpcConfigFile::inter_process),
    /// in an anonymous memory file (never in a directory: nothing to
    /// remove, whatever ends the process).
    pub fn in_memory(pairs: &[(&str, &str, u32, u32)]) -> io::Result<IpcConfigFile> {
        let fd = memfd::create(&unique_name())?;
        let mut file = std::fs::File::from(fd);
        io::Write::write_all(&mut file, lines(pairs).as_bytes())?;
        let fd = std::os::fd::OwnedFd::from(file);
        let path = PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&fd)
        ));
        Ok(IpcConfigFile {
            path,
            memory: Some(fd),
        })
    }

    /// Has the child that `cmd` starts inherit the configuration, so that
    /// [`path`](IpcConfigFile::path) names it there too. A memory file's
    /// descriptor is close-on-exec in this process (no other child gets
    /// it); only `cmd`'s child keeps it open across its `exec`. A file on
    /// disk needs nothing.
    pub fn share_with(&self, cmd: &mut std::process::Command) {
        if let Some(fd) = &self.memory {
            memfd::inherit(cmd, std::os::fd::AsRawFd::as_raw_fd(fd));
        }
    }

    /// Where the file is (`/proc/self/fd/N` for a memory file).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for IpcConfigFile {
    fn drop(&mut self) {
        if self.memory.is_none() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The two system calls of [`IpcConfigFile::in_memory`].
#[allow(unsafe_code)]
mod memfd {
    use std::io;
    use std::os::fd::{FromRawFd, OwnedFd, RawFd};
    use std::os::unix::process::CommandExt;

    /// A new close-on-exec memory file named `name` (the name is only shown
    /// in `/proc`; it is in no directory).
    pub(super) fn create(name: &str) -> io::Result<OwnedFd> {
        let name = std::ffi::CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in the name"))?;
        // SAFETY: `name` is a NUL-terminated string that outlives the call;
        // the flags are valid.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Clears close-on-exec on `fd` in `cmd`'s child only, after its fork.
    pub(super) fn inherit(cmd: &mut std::process::Command, fd: RawFd) {
        // SAFETY: the hook runs in the child between fork and exec and only
        // calls fcntl(2), which is async-signal-safe; `fd` is open there
        // (the child's table is a copy of ours, and the caller's
        // `IpcConfigFile` keeps it open while it spawns).
        unsafe {
            cmd.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

/// The NvSciIpc part of one simulator ("process").
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_bsp_format() {
        let t = IpcTable::parse(
            "# comment\nINTER_PROCESS cam_0 cuda_0 16 24576 # trailing\n\nINTER_THREAD t0 t1 2 64\nINTER_VM vm_ep 3 0\n",
        )
        .unwrap();
        assert_eq!(t.endpoints.len(), 5);
        let c = &t.endpoints["cuda_0"];
        assert_eq!((c.nframes, c.frame_size), (16, 24576));
        assert_eq!(c.pair, ("cam_0".to_owned(), "cuda_0".to_owned()));
        assert_eq!(
            t.endpoints["vm_ep"].backend,
            Backend::Other("INTER_VM".into())
        );
    }

    #[test]
    fn refuses_malformed_lines() {
        for bad in [
            "INTER_PROCESS a b 16",
            "INTER_PROCESS a a 16 64",
            "INTER_PROCESS a b 0 64",
            "INTER_PROCESS a b 16 x",
            "INTER_PROCESS a b 1 1\nINTER_PROCESS a c 1 1",
            "SOMETHING a b 1 1",
            "INTER_PROCESS a b 16 4294967295",
            "INTER_PROCESS a b 16 65537",
            "INTER_PROCESS a b 257 64",
            "INTER_PROCESS a b 256 65536",
        ] {
            assert!(IpcTable::parse(bad).is_err(), "{bad}");
        }
        let long = "x".repeat(64);
        assert!(IpcTable::parse(&format!("INTER_PROCESS {long} b 1 1")).is_err());
    }

    /// A memory configuration is read through its `/proc/self/fd` path,
    /// leaves nothing in the temporary directory, and two of them get
    /// different socket keys although their paths may be reused.
    #[test]
    #[cfg_attr(miri, ignore = "memfd_create and /proc/self/fd")]
    fn a_memory_configuration_is_in_no_directory() {
        let a = IpcConfigFile::in_memory(&[("a", "b", 16, 64)]).unwrap();
        let b = IpcConfigFile::in_memory(&[("a", "b", 16, 64)]).unwrap();
        assert!(a.path().starts_with("/proc/self/fd"));
        let ta = IpcTable::load(a.path()).unwrap();
        let tb = IpcTable::load(b.path()).unwrap();
        assert_eq!(ta.endpoints["b"].nframes, 16);
        assert_ne!(ta.key, tb.key, "two configurations share socket names");
        assert_eq!(ta.key, IpcTable::load(a.path()).unwrap().key);
        let name = std::fs::read_link(a.path()).unwrap();
        assert!(
            name.to_string_lossy()
                .starts_with("/memfd:tegra-interop-sim-nvsciipc-"),
            "{name:?}"
        );
    }
}
