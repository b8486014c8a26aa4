//! NvSciIpc endpoints the way a BSP sets them up: named pairs from a
//! configuration file, frames of a fixed size, events, resets.
//!
//! # The model
//! `NvSciIpcInit` reads the configuration (the path in
//! [`SimConfig::nvsciipc_config`](crate::SimConfig), else `/etc/nvsciipc.cfg`
//! as on the BSP). Lines have the BSP's form `INTER_PROCESS <ep_a> <ep_b>
//! <nframes> <frame_size>` (or `INTER_THREAD`, same fields); `#` starts a
//! comment; `INTER_VM` / `INTER_CHIP` lines name endpoints of backends the
//! simulator does not provide (opening one answers `NotSupported`, the
//! header's code for "API is not supported on provided endpoint backend
//! type").
//!
//! An open endpoint is a Unix `SOCK_SEQPACKET` connection to its peer, in
//! this process or another: both ends meet at an abstract-namespace socket
//! named after the configuration file and the pair. A second open of the
//! same endpoint name, in any process using the same file, is refused with
//! `Busy` (each open endpoint holds an abstract name of its own). When a
//! process dies its sockets close, and the peer sees a connection reset.
//!
//! Frames and flow control follow `nvsciipc.h`: `WriteSafe` posts one frame
//! of at most `frame_size` bytes (the rest zero-filled), and refuses with
//! `InsufficientMemory` while `nframes` frames are unread at the peer;
//! `ReadSafe` copies the next frame (trailing bytes beyond `size` are
//! discarded) or answers `InsufficientMemory` on an empty channel; both
//! answer `ConnectionReset` before the connection is established or after
//! it was lost. `GetEventSafe` reports CONN_EST / CONN_RESET once each
//! (edge events) and READ / WRITE / WRITE_EMPTY while they hold (FIFO
//! status), as the header describes. The endpoint's event fd (an epoll fd
//! over the endpoint's sockets) becomes readable when something arrives.
//!
//! The life-cycle preconditions the header states (event fd before the
//! reset, exactly one reset before events, reads and writes; `Deinit` only
//! after every endpoint closed) are enforced: the header names no code for
//! a violated precondition, so the simulator refuses with `InvalidState`
//! (the header's "invalid operation state") and a diagnostic saying so.
//!
//! The objects NvSciBuf / NvSciSync export over an endpoint travel on the
//! same connection, invisible to the frames (`SCM_RIGHTS` messages tagged
//! with a transfer id the export descriptor carries).

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tegra_interop_sys::nvsci::{NvSciError, NvSciIpcEndpoint, NvSciIpcEndpointInfo};

use super::super::{err, R};
use crate::instance::Call;
use crate::DiagnosticKind as D;

/// `NV_SCI_IPC_EVENT_*` bits (nvsciipc.h).
pub(crate) mod event {
    pub(crate) const READ: u32 = 0x01;
    pub(crate) const WRITE: u32 = 0x02;
    pub(crate) const CONN_EST: u32 = 0x04;
    pub(crate) const CONN_RESET: u32 = 0x08;
    pub(crate) const WRITE_EMPTY: u32 = 0x10;
}

/// `NVSCIIPC_MAX_ENDPOINT_NAME`: name bytes including the terminating NUL.
const MAX_NAME: usize = 64;
/// Where the BSP keeps the configuration.
const DEFAULT_CONFIG: &str = "/etc/nvsciipc.cfg";

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
    key: u64,
    endpoints: HashMap<String, EndpointConfig>,
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl IpcTable {
    /// Reads and checks the configuration at `path`.
    pub(crate) fn load(path: &Path) -> Result<IpcTable, String> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "cannot read the NvSciIpc configuration {}: {e}",
                path.display()
            )
        })?;
        let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut t = IpcTable::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        t.key = fnv(canonical.as_os_str().as_encoded_bytes());
        Ok(t)
    }

    /// Parses configuration text (BSP format).
    pub(crate) fn parse(text: &str) -> Result<IpcTable, String> {
        let mut endpoints = HashMap::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let at = n + 1;
            let name_ok = |s: &str| !s.is_empty() && s.len() < MAX_NAME;
            let mut add = |name: &str, cfg: EndpointConfig| {
                if !name_ok(name) {
                    return Err(format!(
                        "line {at}: endpoint name {name:?} is empty or longer than {} bytes",
                        MAX_NAME - 1
                    ));
                }
                if endpoints.insert(name.to_owned(), cfg).is_some() {
                    return Err(format!("line {at}: endpoint {name:?} is declared twice"));
                }
                Ok(())
            };
            match f[0] {
                "INTER_PROCESS" | "INTER_THREAD" => {
                    let [_, a, b, nframes, frame_size] = f[..] else {
                        return Err(format!(
                            "line {at}: expected `{} <ep_a> <ep_b> <nframes> <frame_size>`",
                            f[0]
                        ));
                    };
                    let num = |s: &str, what: &str| match s.parse::<u32>() {
                        Ok(v) if v > 0 => Ok(v),
                        _ => Err(format!("line {at}: {what} {s:?} is not a positive number")),
                    };
                    if a == b {
                        return Err(format!("line {at}: an endpoint cannot be its own peer"));
                    }
                    let cfg = EndpointConfig {
                        backend: Backend::Local,
                        pair: (a.to_owned(), b.to_owned()),
                        nframes: num(nframes, "nframes")?,
                        frame_size: num(frame_size, "frame_size")?,
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
                other => return Err(format!("line {at}: unknown backend {other:?}")),
            }
        }
        Ok(IpcTable { key: 0, endpoints })
    }
}

/// A configuration file in the BSP's format, written to a unique temporary
/// path and removed on drop: give its [`path`](IpcConfigFile::path) to
/// [`SimConfig::with_nvsciipc_config`](crate::SimConfig::with_nvsciipc_config)
/// in every process (simulator) that opens its endpoints. Endpoint names
/// are private to the file, so tests running in parallel can all use "a"
/// and "b".
///
/// ```
/// use tegra_interop_sim::nvsci::IpcConfigFile;
/// let cfg = IpcConfigFile::inter_process(&[("cam", "cuda", 16, 4096)]).unwrap();
/// let text = std::fs::read_to_string(cfg.path()).unwrap();
/// assert_eq!(text, "INTER_PROCESS cam cuda 16 4096\n");
/// ```
#[derive(Debug)]
pub struct IpcConfigFile {
    path: PathBuf,
}

impl IpcConfigFile {
    /// Writes one `INTER_PROCESS <a> <b> <nframes> <frame_size>` line per
    /// pair.
    pub fn inter_process(pairs: &[(&str, &str, u32, u32)]) -> io::Result<IpcConfigFile> {
        let text: String = pairs
            .iter()
            .map(|(a, b, n, f)| format!("INTER_PROCESS {a} {b} {n} {f}\n"))
            .collect();
        IpcConfigFile::with_text(&text)
    }

    /// Writes `text` as the configuration.
    pub fn with_text(text: &str) -> io::Result<IpcConfigFile> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "tegra-interop-sim-nvsciipc-{}-{n}-{nanos}.cfg",
            std::process::id()
        ));
        std::fs::write(&path, text)?;
        Ok(IpcConfigFile { path })
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for IpcConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The NvSciIpc part of one simulator ("process").
#[derive(Default)]
pub(crate) struct IpcState {
    table: Option<IpcTable>,
    pub(crate) endpoints: HashMap<u64, Arc<Endpoint>>,
    /// Endpoints still open when `NvSciIpcDeinit` ran: unusable, still
    /// counted as open in the ledger (a leak the application made).
    pub(crate) orphans: Vec<Arc<Endpoint>>,
    next: u64,
}

impl IpcState {
    /// Whether `NvSciIpcInit` succeeded and no `Deinit` followed.
    pub(crate) fn initialized(&self) -> bool {
        self.table.is_some()
    }

    /// Endpoints open now, orphans included.
    pub(crate) fn open_count(&self) -> usize {
        self.endpoints.len() + self.orphans.len()
    }
}

// ---------------------------------------------------------------- wire

const MAGIC: u32 = u32::from_le_bytes(*b"TIPC");
const HEADER: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
enum Kind {
    /// The sender has reset its endpoint and is ready.
    Hello = 1,
    /// One application frame follows the header.
    Frame = 2,
    /// The receiver consumed one frame.
    Ack = 3,
    /// An exported object's descriptor (`SCM_RIGHTS`); arg = transfer id.
    Object = 4,
    /// The sender reset an established connection (de-init).
    Bye = 5,
}

impl Kind {
    fn from_u32(v: u32) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Frame,
            3 => Kind::Ack,
            4 => Kind::Object,
            5 => Kind::Bye,
            _ => return None,
        })
    }
}

fn header(kind: Kind, arg: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&(kind as u32).to_le_bytes());
    h[8..].copy_from_slice(&arg.to_le_bytes());
    h
}

// ---------------------------------------------------------------- sockets

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(last_err());
    }
    // SAFETY: a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An abstract-namespace address (`sun_path[0] == 0`).
fn abstract_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_un is a valid value of this C struct.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    let n = bytes.len().min(a.sun_path.len() - 1);
    for (d, s) in a.sun_path[1..=n].iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + n;
    (a, len as libc::socklen_t)
}

fn bind(fd: &OwnedFd, name: &str) -> io::Result<()> {
    let (a, len) = abstract_addr(name);
    // SAFETY: `a` is a valid address of `len` bytes.
    let r = unsafe { libc::bind(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) };
    if r != 0 {
        return Err(last_err());
    }
    Ok(())
}

fn connect(fd: &OwnedFd, name: &str) -> io::Result<()> {
    let (a, len) = abstract_addr(name);
    // SAFETY: `a` is a valid address of `len` bytes.
    let r = unsafe { libc::connect(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) };
    if r != 0 {
        return Err(last_err());
    }
    Ok(())
}

fn epoll_add(ep: &OwnedFd, fd: RawFd) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
        u64: fd as u64,
    };
    // SAFETY: both descriptors are open; `ev` is a valid event record.
    if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
        return Err(last_err());
    }
    Ok(())
}

fn epoll_del(ep: &OwnedFd, fd: RawFd) {
    // SAFETY: both descriptors are open; a NULL event is allowed for DEL.
    unsafe {
        libc::epoll_ctl(
            ep.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            fd,
            std::ptr::null_mut(),
        )
    };
}

/// Sends one message (header, payload, optionally one descriptor).
fn send(sock: &OwnedFd, head: &[u8; HEADER], payload: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut iov = [
        libc::iovec {
            iov_base: head.as_ptr() as *mut libc::c_void,
            iov_len: head.len(),
        },
        libc::iovec {
            iov_base: payload.as_ptr() as *mut libc::c_void,
            iov_len: payload.len(),
        },
    ];
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: an all-zero msghdr is a valid value of this plain C struct.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = if payload.is_empty() { 1 } else { 2 };
    if let Some(fd) = fd {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer has room for one header carrying one
        // descriptor; CMSG_FIRSTHDR / CMSG_DATA stay inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            if cmsg.is_null() {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
            libc::CMSG_DATA(cmsg)
                .cast::<libc::c_int>()
                .write_unaligned(fd);
        }
    }
    // SAFETY: `msg` points at buffers that live for the call.
    let n = unsafe {
        libc::sendmsg(
            sock.as_raw_fd(),
            &msg,
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(last_err());
    }
    Ok(())
}

enum Received {
    /// A message: header fields, payload, descriptor.
    Message(u32, u32, u64, Vec<u8>, Option<OwnedFd>),
    /// Nothing waiting.
    Empty,
    /// The peer closed or the connection failed.
    Closed,
}

fn recv(sock: &OwnedFd, max_payload: usize) -> Received {
    let mut buf = vec![0u8; HEADER + max_payload + 1];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: an all-zero msghdr is a valid value of this plain C struct.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at live buffers; received descriptors are close-on-exec.
    let n = unsafe {
        libc::recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if n < 0 {
        let e = last_err();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Received::Empty,
            _ => Received::Closed,
        };
    }
    if n == 0 {
        return Received::Closed;
    }
    let mut fd = None;
    // SAFETY: walking the control buffer the kernel filled, with the libc
    // macros that stay inside `msg_controllen`.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let raw = libc::CMSG_DATA(cmsg).cast::<libc::c_int>().read_unaligned();
                fd = Some(OwnedFd::from_raw_fd(raw));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    let n = n as usize;
    if n < HEADER || msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Received::Message(0, 0, 0, Vec::new(), fd);
    }
    let word = |r: std::ops::Range<usize>| buf.get(r).and_then(|s| s.try_into().ok());
    let magic = word(0..4).map(u32::from_le_bytes).unwrap_or(0);
    let kind = word(4..8).map(u32::from_le_bytes).unwrap_or(0);
    let arg = buf
        .get(8..16)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0);
    buf.truncate(n);
    let payload = buf.split_off(HEADER);
    Received::Message(magic, kind, arg, payload, fd)
}

// ---------------------------------------------------------------- endpoints

/// One open endpoint.
pub(crate) struct Endpoint {
    pub(crate) name: String,
    cfg: EndpointConfig,
    /// The event fd handed out by `NvSciIpcGetLinuxEventFd`.
    epoll: OwnedFd,
    /// Holds the endpoint's abstract name while it is open (`Busy` for a
    /// second opener anywhere).
    _lock: OwnedFd,
    conn: Mutex<Conn>,
    /// Serialises the blocking receivers of exported objects.
    rx: Mutex<()>,
}

#[derive(Default)]
struct Conn {
    listener: Option<OwnedFd>,
    sock: Option<OwnedFd>,
    fd_asked: bool,
    resets: u32,
    hello_sent: bool,
    peer_hello: bool,
    established: bool,
    lost: bool,
    pending_est: bool,
    pending_reset: bool,
    frames: VecDeque<Vec<u8>>,
    outstanding: u32,
    objects: HashMap<u64, OwnedFd>,
    claimed: HashSet<u64>,
    /// Why the connection was lost (for diagnostics).
    lost_why: Option<String>,
}

fn lock(m: &Mutex<Conn>) -> MutexGuard<'_, Conn> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Endpoint {
    fn open(table: &IpcTable, name: &str, cfg: EndpointConfig) -> Result<Endpoint, NvSciError> {
        let base = format!("tegra-interop-sim/nvsciipc/{:016x}", table.key);
        let lock_sock = seqpacket().map_err(|_| err::RESOURCE_ERROR)?;
        match bind(
            &lock_sock,
            &format!("{base}/ep/{:016x}", fnv(name.as_bytes())),
        ) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => return Err(err::BUSY),
            Err(_) => return Err(err::RESOURCE_ERROR),
        }
        let pair = format!(
            "{base}/pair/{:016x}{:016x}",
            fnv(cfg.pair.0.as_bytes()),
            fnv(cfg.pair.1.as_bytes())
        );
        // SAFETY: plain epoll_create1 call; the result is checked.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(err::RESOURCE_ERROR);
        }
        // SAFETY: a new descriptor nobody else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(ep) };
        let mut conn = Conn::default();
        // The first opener of the pair listens, the second connects.
        for _ in 0..8 {
            let s = seqpacket().map_err(|_| err::RESOURCE_ERROR)?;
            match bind(&s, &pair) {
                Ok(()) => {
                    // SAFETY: listen(2) on a bound socket we own.
                    if unsafe { libc::listen(s.as_raw_fd(), 1) } != 0 {
                        return Err(err::RESOURCE_ERROR);
                    }
                    epoll_add(&epoll, s.as_raw_fd()).map_err(|_| err::RESOURCE_ERROR)?;
                    conn.listener = Some(s);
                    break;
                }
                Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {}
                Err(_) => return Err(err::RESOURCE_ERROR),
            }
            let s = seqpacket().map_err(|_| err::RESOURCE_ERROR)?;
            match connect(&s, &pair) {
                Ok(()) => {
                    epoll_add(&epoll, s.as_raw_fd()).map_err(|_| err::RESOURCE_ERROR)?;
                    conn.sock = Some(s);
                    break;
                }
                // The listener went away between bind and connect: again.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ECONNREFUSED) | Some(libc::EAGAIN)
                    ) => {}
                Err(_) => return Err(err::RESOURCE_ERROR),
            }
        }
        if conn.listener.is_none() && conn.sock.is_none() {
            return Err(err::RESOURCE_ERROR);
        }
        Ok(Endpoint {
            name: name.to_owned(),
            cfg,
            epoll,
            _lock: lock_sock,
            conn: Mutex::new(conn),
            rx: Mutex::new(()),
        })
    }

    fn frame_size(&self) -> u32 {
        self.cfg.frame_size
    }

    /// Takes in whatever arrived: a pending connection, messages.
    fn pump(&self, c: &mut Conn) {
        if let Some(l) = &c.listener {
            // SAFETY: accept4 on a listening socket we own; NULL address out-pointers are allowed.
            let fd = unsafe {
                libc::accept4(
                    l.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                )
            };
            if fd >= 0 {
                // SAFETY: a new descriptor nobody else owns.
                let s = unsafe { OwnedFd::from_raw_fd(fd) };
                epoll_del(&self.epoll, l.as_raw_fd());
                c.listener = None;
                if epoll_add(&self.epoll, s.as_raw_fd()).is_err() {
                    self.lose(c, "the connection could not be watched".into());
                    return;
                }
                c.sock = Some(s);
            }
        }
        if c.sock.is_some() && c.resets >= 1 && !c.hello_sent && !c.lost {
            self.say(c, Kind::Hello, 0);
        }
        loop {
            let Some(sock) = &c.sock else { return };
            if c.lost {
                return;
            }
            match recv(sock, self.frame_size() as usize) {
                Received::Empty => return,
                Received::Closed => {
                    self.lose(
                        c,
                        "the peer closed its endpoint (or its process ended)".into(),
                    );
                    return;
                }
                Received::Message(magic, kind, arg, payload, fd) => {
                    if magic != MAGIC {
                        self.lose(c, "a message that is not the simulator's arrived".into());
                        return;
                    }
                    match (Kind::from_u32(kind), fd) {
                        (Some(Kind::Hello), None) => {
                            c.peer_hello = true;
                            if c.resets >= 1 && !c.established {
                                c.established = true;
                                c.pending_est = true;
                            }
                        }
                        (Some(Kind::Frame), None)
                            if payload.len() <= self.frame_size() as usize =>
                        {
                            let mut f = payload;
                            f.resize(self.frame_size() as usize, 0);
                            c.frames.push_back(f);
                        }
                        (Some(Kind::Ack), None) => c.outstanding = c.outstanding.saturating_sub(1),
                        (Some(Kind::Object), Some(fd)) => {
                            c.objects.insert(arg, fd);
                        }
                        (Some(Kind::Bye), None) => {
                            self.lose(c, "the peer reset the established connection".into());
                            return;
                        }
                        _ => {
                            self.lose(c, format!("a malformed message (kind {kind})"));
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Sends a control message; a failure loses the connection.
    fn say(&self, c: &mut Conn, kind: Kind, arg: u64) {
        let Some(sock) = &c.sock else { return };
        match send(sock, &header(kind, arg), &[], None) {
            Ok(()) => {
                if kind == Kind::Hello {
                    c.hello_sent = true;
                    if c.peer_hello && !c.established {
                        c.established = true;
                        c.pending_est = true;
                    }
                }
            }
            Err(e) => self.lose(c, format!("sending to the peer failed: {e}")),
        }
    }

    fn lose(&self, c: &mut Conn, why: String) {
        if !c.lost {
            c.lost = true;
            c.pending_reset = true;
            c.lost_why = Some(why);
        }
    }

    /// Sends an exported object's descriptor to the peer.
    pub(crate) fn send_object(&self, call: &Call, id: u64, fd: &OwnedFd) -> R {
        let mut c = lock(&self.conn);
        self.pump(&mut c);
        if c.lost {
            call.diag(
                D::Misuse,
                format!(
                    "object exported over endpoint {:?}, whose connection was reset (the real library's answer is not known; refused with ConnectionReset)",
                    self.name
                ),
            );
            return Err(err::CONNECTION_RESET);
        }
        let Some(sock) = c.sock.as_ref().filter(|_| c.established) else {
            call.diag(
                D::Misuse,
                format!(
                    "object exported over endpoint {:?}, whose connection is not established (reset the endpoint and wait for CONN_EST first; the real library's answer is not known; refused)",
                    self.name
                ),
            );
            return Err(err::BAD_PARAMETER);
        };
        if let Err(e) = send(sock, &header(Kind::Object, id), &[], Some(fd.as_raw_fd())) {
            self.lose(&mut c, format!("sending to the peer failed: {e}"));
            return Err(err::CONNECTION_RESET);
        }
        Ok(())
    }

    /// Whether the object with transfer id `id` was imported already.
    pub(crate) fn claimed(&self, id: u64) -> bool {
        lock(&self.conn).claimed.contains(&id)
    }

    /// Waits (at most `limit`) for the exported object `id`; once per id.
    pub(crate) fn receive_object(&self, id: u64, limit: Option<Duration>) -> R<OwnedFd> {
        let deadline = limit.and_then(|l| Instant::now().checked_add(l));
        let _rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let raw = {
                let mut c = lock(&self.conn);
                self.pump(&mut c);
                if let Some(fd) = c.objects.remove(&id) {
                    c.claimed.insert(id);
                    return Ok(fd);
                }
                if c.lost {
                    return Err(err::RESOURCE_ERROR);
                }
                self.epoll.as_raw_fd()
            };
            let ms = match deadline {
                None => 100,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(err::TIMEOUT);
                    }
                    (d - now).as_millis().clamp(1, 100) as libc::c_int
                }
            };
            let mut pfd = libc::pollfd {
                fd: raw,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd on a descriptor this endpoint keeps open.
            unsafe { libc::poll(&mut pfd, 1, ms) };
        }
    }
}

// ---------------------------------------------------------------- entry points

/// The open endpoint `h`, or the code the library gives for it.
pub(crate) fn endpoint(c: &Call, h: NvSciIpcEndpoint) -> R<Arc<Endpoint>> {
    let st = c.state();
    let ipc = &st.nvsci.ipc;
    if !ipc.initialized() {
        return Err(err::NOT_INITIALIZED);
    }
    match ipc.endpoints.get(&h) {
        Some(e) => Ok(Arc::clone(e)),
        None => {
            c.diag(D::Misuse, format!("endpoint {h:#x} is not open"));
            Err(err::BAD_PARAMETER)
        }
    }
}

/// A violated life-cycle precondition: no code is documented for it.
fn precondition(c: &Call, what: String) -> NvSciError {
    c.diag(
        D::Misuse,
        format!("{what} (nvsciipc.h states this as a precondition and names no error code; refused with InvalidState)"),
    );
    err::INVALID_STATE
}

pub(crate) fn NvSciIpcInit(c: &Call) -> NvSciError {
    if c.state().nvsci.ipc.initialized() {
        return precondition(
            c,
            "NvSciIpcInit while already initialised (the library promises no reference count: initialise once per process)".into(),
        );
    }
    let path = c
        .inst
        .config
        .nvsciipc_config
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
    match IpcTable::load(&path) {
        Ok(t) => {
            c.state().nvsci.ipc.table = Some(t);
            err::SUCCESS
        }
        Err(why) => {
            c.diag(
                D::Misuse,
                format!("{why} (SimConfig::with_nvsciipc_config names the file)"),
            );
            err::NOT_PERMITTED
        }
    }
}

pub(crate) fn NvSciIpcDeinit(c: &Call) {
    let mut st = c.state();
    let ipc = &mut st.nvsci.ipc;
    if !ipc.initialized() {
        drop(st);
        c.diag(D::Misuse, "NvSciIpcDeinit without NvSciIpcInit".into());
        return;
    }
    let open: Vec<String> = ipc.endpoints.values().map(|e| e.name.clone()).collect();
    ipc.table = None;
    let left: Vec<Arc<Endpoint>> = ipc.endpoints.drain().map(|(_, e)| e).collect();
    ipc.orphans.extend(left);
    drop(st);
    if !open.is_empty() {
        c.diag(
            D::Misuse,
            format!("NvSciIpcDeinit with endpoints still open ({open:?}): nvsciipc.h requires closing every endpoint first; they are unusable now"),
        );
    }
}

pub(crate) unsafe fn NvSciIpcOpenEndpoint(
    c: &Call,
    name: *const std::ffi::c_char,
    out: *mut NvSciIpcEndpoint,
) -> NvSciError {
    if name.is_null() || out.is_null() {
        return err::BAD_PARAMETER;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let name = unsafe { crate::cmem::c_str(name) };
    if name.to_bytes().len() >= MAX_NAME {
        return err::BAD_PARAMETER;
    }
    let name = name.to_string_lossy().into_owned();
    let (table, cfg) = {
        let st = c.state();
        let ipc = &st.nvsci.ipc;
        let Some(table) = &ipc.table else {
            return err::NOT_INITIALIZED;
        };
        let Some(cfg) = table.endpoints.get(&name) else {
            drop(st);
            c.diag(
                D::Misuse,
                format!("endpoint {name:?} is not in the NvSciIpc configuration"),
            );
            return err::NO_SUCH_ENTRY;
        };
        if let Backend::Other(b) = &cfg.backend {
            let b = b.clone();
            drop(st);
            c.diag(D::Misuse, format!("endpoint {name:?} belongs to backend {b}, which the simulator does not provide"));
            return err::NOT_SUPPORTED;
        }
        if ipc.endpoints.values().any(|e| e.name == name) {
            return err::BUSY;
        }
        (table.clone(), cfg.clone())
    };
    let ep = match Endpoint::open(&table, &name, cfg) {
        Ok(ep) => ep,
        Err(e) => return e,
    };
    let mut st = c.state();
    let ipc = &mut st.nvsci.ipc;
    if !ipc.initialized() {
        return err::NOT_INITIALIZED;
    }
    ipc.next += 1;
    let h = ipc.next | (0x5e_u64 << 56);
    ipc.endpoints.insert(h, Arc::new(ep));
    // SAFETY: checked non-null; caller out-pointer.
    unsafe { crate::cmem::write(out, h) };
    err::SUCCESS
}

fn close(c: &Call, h: NvSciIpcEndpoint) -> NvSciError {
    let mut st = c.state();
    let ipc = &mut st.nvsci.ipc;
    if !ipc.initialized() {
        return err::NOT_INITIALIZED;
    }
    if ipc.endpoints.remove(&h).is_some() {
        err::SUCCESS
    } else {
        drop(st);
        c.diag(D::Misuse, format!("endpoint {h:#x} is not open"));
        err::BAD_PARAMETER
    }
}

pub(crate) fn NvSciIpcCloseEndpointSafe(c: &Call, h: NvSciIpcEndpoint, _clear: bool) -> NvSciError {
    close(c, h)
}

pub(crate) fn NvSciIpcCloseEndpoint(c: &Call, h: NvSciIpcEndpoint) {
    let _ = close(c, h);
}

pub(crate) unsafe fn NvSciIpcGetLinuxEventFd(
    c: &Call,
    h: NvSciIpcEndpoint,
    fd: *mut i32,
) -> NvSciError {
    let e = match endpoint(c, h) {
        Ok(e) => e,
        Err(code) => return code,
    };
    if fd.is_null() {
        return err::BAD_PARAMETER;
    }
    lock(&e.conn).fd_asked = true;
    // SAFETY: checked non-null; caller out-pointer.
    unsafe { crate::cmem::write(fd, e.epoll.as_raw_fd()) };
    err::SUCCESS
}

pub(crate) unsafe fn NvSciIpcGetEndpointInfo(
    c: &Call,
    h: NvSciIpcEndpoint,
    info: *mut NvSciIpcEndpointInfo,
) -> NvSciError {
    let e = match endpoint(c, h) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let v = NvSciIpcEndpointInfo {
        nframes: e.cfg.nframes,
        frame_size: e.cfg.frame_size,
    };
    // SAFETY: NULL-checked by `write`; otherwise a caller out-pointer.
    if unsafe { crate::cmem::write(info, v) } {
        err::SUCCESS
    } else {
        err::BAD_PARAMETER
    }
}

pub(crate) fn NvSciIpcResetEndpointSafe(c: &Call, h: NvSciIpcEndpoint) -> NvSciError {
    let e = match endpoint(c, h) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let mut k = lock(&e.conn);
    if !k.fd_asked {
        drop(k);
        return precondition(
            c,
            format!(
                "NvSciIpcResetEndpointSafe on {:?} before NvSciIpcGetLinuxEventFd",
                e.name
            ),
        );
    }
    if k.resets == 0 {
        k.resets = 1;
        k.frames.clear();
        e.pump(&mut k);
        return err::SUCCESS;
    }
    if k.established && !k.lost {
        // The de-init reset: tell the peer, stop using the channel.
        e.say(&mut k, Kind::Bye, 0);
        k.resets += 1;
        k.lost = true;
        k.established = false;
        k.frames.clear();
        return err::SUCCESS;
    }
    drop(k);
    precondition(
        c,
        format!("a second NvSciIpcResetEndpointSafe on {:?}: allowed once at init and once at de-init, and only on an established connection", e.name),
    )
}

/// The endpoint after the checks every frame operation shares.
fn ready(c: &Call, h: NvSciIpcEndpoint, what: &str) -> R<Arc<Endpoint>> {
    let e = endpoint(c, h)?;
    let resets = lock(&e.conn).resets;
    if resets == 0 {
        return Err(precondition(
            c,
            format!("{what} on {:?} before NvSciIpcResetEndpointSafe", e.name),
        ));
    }
    Ok(e)
}

pub(crate) unsafe fn NvSciIpcGetEventSafe(
    c: &Call,
    h: NvSciIpcEndpoint,
    events: *mut u32,
) -> NvSciError {
    let e = match ready(c, h, "NvSciIpcGetEventSafe") {
        Ok(e) => e,
        Err(code) => return code,
    };
    if events.is_null() {
        return err::BAD_PARAMETER;
    }
    let mut k = lock(&e.conn);
    if k.resets >= 2 {
        drop(k);
        return precondition(
            c,
            format!(
                "NvSciIpcGetEventSafe on {:?} after its de-init reset",
                e.name
            ),
        );
    }
    e.pump(&mut k);
    let mut ev = 0;
    if k.pending_est {
        k.pending_est = false;
        ev |= event::CONN_EST;
    }
    if k.pending_reset {
        k.pending_reset = false;
        k.established = false;
        k.frames.clear();
        ev |= event::CONN_RESET;
        if let Some(why) = k.lost_why.clone() {
            c.diag(
                D::Misuse,
                format!("endpoint {:?}: connection reset: {why}", e.name),
            );
        }
    } else if k.established && !k.lost {
        if !k.frames.is_empty() {
            ev |= event::READ;
        }
        if k.outstanding < e.cfg.nframes {
            ev |= event::WRITE;
        }
        if k.outstanding == 0 {
            ev |= event::WRITE_EMPTY;
        }
    }
    drop(k);
    // SAFETY: checked non-null; caller out-pointer.
    unsafe { crate::cmem::write(events, ev) };
    err::SUCCESS
}

pub(crate) unsafe fn NvSciIpcReadSafe(
    c: &Call,
    h: NvSciIpcEndpoint,
    buf: *mut std::ffi::c_void,
    size: u32,
    bytes: *mut u32,
) -> NvSciError {
    let e = match ready(c, h, "NvSciIpcReadSafe") {
        Ok(e) => e,
        Err(code) => return code,
    };
    if buf.is_null() || bytes.is_null() || size == 0 || size > e.frame_size() {
        return err::BAD_PARAMETER;
    }
    let mut k = lock(&e.conn);
    if !k.established {
        return err::CONNECTION_RESET;
    }
    e.pump(&mut k);
    let Some(frame) = k.frames.pop_front() else {
        return if k.lost {
            err::CONNECTION_RESET
        } else {
            err::INSUFFICIENT_MEMORY
        };
    };
    if !k.lost {
        e.say(&mut k, Kind::Ack, 0);
    }
    drop(k);
    let n = (size as usize).min(frame.len());
    // SAFETY: the caller's buffer holds `size` bytes (>= n); checked non-null.
    unsafe { crate::cmem::copy_to(buf.cast(), &frame[..n]) };
    // SAFETY: checked non-null; caller out-pointer.
    unsafe { crate::cmem::write(bytes, n as u32) };
    err::SUCCESS
}

pub(crate) unsafe fn NvSciIpcWriteSafe(
    c: &Call,
    h: NvSciIpcEndpoint,
    buf: *const std::ffi::c_void,
    size: u32,
    bytes: *mut u32,
) -> NvSciError {
    let e = match ready(c, h, "NvSciIpcWriteSafe") {
        Ok(e) => e,
        Err(code) => return code,
    };
    if buf.is_null() || bytes.is_null() || size == 0 || size > e.frame_size() {
        return err::BAD_PARAMETER;
    }
    // SAFETY: the caller's buffer holds `size` readable bytes; checked non-null.
    let data = unsafe { crate::cmem::bytes(buf.cast(), size as usize) };
    let mut k = lock(&e.conn);
    e.pump(&mut k);
    if !k.established || k.lost {
        return err::CONNECTION_RESET;
    }
    if k.outstanding >= e.cfg.nframes {
        return err::INSUFFICIENT_MEMORY;
    }
    let Some(sock) = &k.sock else {
        return err::CONNECTION_RESET;
    };
    match send(sock, &header(Kind::Frame, 0), data, None) {
        Ok(()) => {}
        // The socket buffer is smaller than nframes frames: full for now.
        Err(x) if x.raw_os_error() == Some(libc::EAGAIN) => return err::INSUFFICIENT_MEMORY,
        Err(x) => {
            e.lose(&mut k, format!("sending to the peer failed: {x}"));
            return err::CONNECTION_RESET;
        }
    }
    k.outstanding += 1;
    drop(k);
    // SAFETY: checked non-null; caller out-pointer.
    unsafe { crate::cmem::write(bytes, size) };
    err::SUCCESS
}

#[cfg(test)]
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
        ] {
            assert!(IpcTable::parse(bad).is_err(), "{bad}");
        }
        let long = "x".repeat(64);
        assert!(IpcTable::parse(&format!("INTER_PROCESS {long} b 1 1")).is_err());
    }
}
