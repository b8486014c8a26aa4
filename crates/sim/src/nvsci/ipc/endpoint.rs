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
//! status), as the header describes: WRITE exactly while a `WriteSafe`
//! would post a frame ([`Endpoint::write_room`]).
//!
//! The write FIFO is full when `nframes` frames are unread at the peer, or
//! when the connection's socket holds as much as it may (frames reach the
//! peer's queue only when the peer's library runs, so a peer that calls
//! nothing leaves them in the socket). A frame goes only while the socket's
//! unreceived bytes (`SIOCOUTQ`) are below half its send buffer: the
//! kernel takes a message below the whole buffer, so the send cannot fail
//! for room, and the other half stays for the control messages
//! (acknowledgements) that must not be refused. Each socket asks for a
//! send buffer of four frames; the kernel caps it (`wmem_max`). The endpoint's event fd (an epoll fd
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
//!
//! # A peer is untrusted: what it can make us hold is bounded
//! Each exported object's fd waits at the receiver until an import takes
//! it. Both ends bound that per connection by the endpoint's `nframes` (the
//! queue depth the configuration gives the pair, which `GetEndpointInfo`
//! reports): an export while `nframes` of this end's objects are neither
//! imported nor refused by the peer answers `InsufficientMemory` (the
//! documented code of `ObjIpcExport` for "no room", as `WriteSafe` answers
//! for a full frame queue) and sends nothing; the connection stays up and
//! the export works again once the peer imports one. The receiver tells the
//! exporter (a `Released` message) when an import took or refused an
//! object. A receiver never holds more than `nframes` objects or frames
//! from its peer: a message beyond that (only a peer that bypasses the
//! library can send one) stays in the socket, unread, until there is room
//! (the kernel then pushes back on the sender), so neither the fd table nor
//! the frame queue grows with what the peer sends.
//!
//! The socket, epoll and poll syscalls are in `ipc::wire`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tegra_interop_sys::nvsci::NvSciError;

use super::config::{fnv, EndpointConfig, IpcTable};
use super::wire::{
    accept, ask_send_buffer, bind, connect, epoll_add, epoll_del, epoll_new, header, listen,
    peek_kind, poll_readable, recv, send, send_queue, seqpacket, Kind, Received, HEADER, MAGIC,
};
use crate::instance::Call;
use crate::nvsci::{err, R};
use crate::DiagnosticKind as D;

#[derive(Default)]
pub(crate) struct IpcState {
    pub(super) table: Option<IpcTable>,
    pub(crate) endpoints: HashMap<u64, Arc<Endpoint>>,
    /// Endpoints still open when `NvSciIpcDeinit` ran: unusable, still
    /// counted as open in the ledger (a leak the application made).
    pub(crate) orphans: Vec<Arc<Endpoint>>,
    pub(super) next: u64,
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

// ---------------------------------------------------------------- endpoints

/// One open endpoint.
pub(crate) struct Endpoint {
    pub(crate) name: String,
    pub(super) cfg: EndpointConfig,
    /// The event fd handed out by `NvSciIpcGetLinuxEventFd`.
    pub(super) epoll: OwnedFd,
    /// Holds the endpoint's abstract name while it is open (`Busy` for a
    /// second opener anywhere).
    _lock: OwnedFd,
    pub(super) conn: Mutex<Conn>,
    /// Serialises the blocking receivers of exported objects.
    rx: Mutex<()>,
}

#[derive(Default)]
pub(super) struct Conn {
    pub(super) listener: Option<OwnedFd>,
    pub(super) sock: Option<OwnedFd>,
    pub(super) fd_asked: bool,
    pub(super) resets: u32,
    pub(super) hello_sent: bool,
    pub(super) peer_hello: bool,
    pub(super) established: bool,
    pub(super) lost: bool,
    pub(super) pending_est: bool,
    pub(super) pending_reset: bool,
    pub(super) frames: VecDeque<Vec<u8>>,
    pub(super) outstanding: u32,
    /// Objects the peer exported over this connection that no import took
    /// yet (at most `nframes`), by transfer id.
    pub(super) objects: HashMap<u64, OwnedFd>,
    pub(super) claimed: HashSet<u64>,
    /// Objects this end exported that the peer neither imported nor
    /// refused yet (at most `nframes`).
    pub(super) objects_out: u32,
    /// A frame's send found the socket full (`EAGAIN`); cleared by the next
    /// frame that goes or the peer's next acknowledgement. Only consulted
    /// where the kernel does not report the socket's queue (see
    /// [`Endpoint::write_room`]).
    pub(super) write_blocked: bool,
    /// Why the connection was lost.
    pub(super) lost_why: Option<String>,
    /// Whether every frame sent had been read when the connection was lost
    /// (WRITE_EMPTY had occurred before the reset).
    pub(super) empty_at_loss: bool,
}

/// The send buffer each connection's socket asks for: four frames of
/// `frame_size` with their headers and the kernel's bookkeeping.
fn send_buffer_wanted(frame_size: u32) -> usize {
    4 * (frame_size as usize + HEADER + 4096)
}

pub(super) fn lock(m: &Mutex<Conn>) -> MutexGuard<'_, Conn> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Endpoint {
    pub(super) fn open(
        table: &IpcTable,
        name: &str,
        cfg: EndpointConfig,
    ) -> Result<Endpoint, NvSciError> {
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
        let epoll = epoll_new().map_err(|_| err::RESOURCE_ERROR)?;
        let mut conn = Conn::default();
        // The first opener of the pair listens, the second connects.
        for _ in 0..8 {
            let s = seqpacket().map_err(|_| err::RESOURCE_ERROR)?;
            match bind(&s, &pair) {
                Ok(()) => {
                    listen(&s).map_err(|_| err::RESOURCE_ERROR)?;
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
                    ask_send_buffer(&s, send_buffer_wanted(cfg.frame_size));
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

    pub(super) fn frame_size(&self) -> u32 {
        self.cfg.frame_size
    }

    /// Whether a frame may be posted now: fewer than `nframes` unread at the
    /// peer, and room in the socket (its unreceived bytes below half its
    /// send buffer; where the kernel does not say, the last send did not
    /// find it full). `WriteSafe` posts exactly when this holds and
    /// `GetEventSafe` reports WRITE exactly when it holds.
    pub(super) fn write_room(&self, c: &Conn) -> bool {
        if c.outstanding >= self.cfg.nframes {
            return false;
        }
        match c.sock.as_ref().and_then(send_queue) {
            Some((queued, size)) => queued < size / 2,
            None => !c.write_blocked,
        }
    }

    /// Whether the next waiting message would take the receiver past its
    /// bounds (`nframes` frames, `nframes` objects): then it stays queued.
    fn over_bounds(&self, c: &Conn, sock: &OwnedFd) -> bool {
        let limit = self.cfg.nframes as usize;
        if c.frames.len() < limit && c.objects.len() < limit {
            return false;
        }
        match peek_kind(sock).and_then(Kind::from_u32) {
            Some(Kind::Frame) => c.frames.len() >= limit,
            Some(Kind::Object) => c.objects.len() >= limit,
            _ => false,
        }
    }

    /// Takes in whatever arrived: a pending connection, messages.
    pub(super) fn pump(&self, c: &mut Conn) {
        if let Some(l) = &c.listener {
            if let Some(s) = accept(l) {
                epoll_del(&self.epoll, l.as_raw_fd());
                c.listener = None;
                if epoll_add(&self.epoll, s.as_raw_fd()).is_err() {
                    self.lose(c, "the connection could not be watched".into());
                    return;
                }
                ask_send_buffer(&s, send_buffer_wanted(self.frame_size()));
                c.sock = Some(s);
            }
        }
        if c.sock.is_some() && c.resets >= 1 && !c.hello_sent && !c.lost {
            self.say(c, Kind::Hello, 0);
        }
        loop {
            let Some(sock) = &c.sock else { return };
            if c.lost || self.over_bounds(c, sock) {
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
                        (Some(Kind::Ack), None) => {
                            c.outstanding = c.outstanding.saturating_sub(1);
                            c.write_blocked = false;
                        }
                        (Some(Kind::Object), Some(fd)) => {
                            if c.claimed.contains(&arg) || c.objects.contains_key(&arg) {
                                // A transfer id seen before: the peer is not
                                // the library. Closed at once (`fd` drops).
                                self.lose(c, format!("the peer sent object {arg:#x} twice"));
                                return;
                            }
                            c.objects.insert(arg, fd);
                        }
                        (Some(Kind::Released), None) => {
                            c.objects_out = c.objects_out.saturating_sub(1);
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
    pub(super) fn say(&self, c: &mut Conn, kind: Kind, arg: u64) {
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

    pub(super) fn lose(&self, c: &mut Conn, why: String) {
        if !c.lost {
            c.lost = true;
            c.pending_reset = true;
            c.lost_why = Some(why);
            c.empty_at_loss = c.established && c.outstanding == 0;
        }
    }

    /// Sends an exported object's descriptor to the peer; `InsufficientMemory`
    /// while `nframes` earlier ones wait at the peer (see the module doc).
    pub(crate) fn send_object(&self, call: &Call, id: u64, fd: &OwnedFd) -> R {
        let mut c = lock(&self.conn);
        self.pump(&mut c);
        if c.lost {
            call.diag(
                D::Misuse,
                format!(
                    "object exported over endpoint {:?}, whose connection was reset ({}; the real library's answer is not known; refused with ConnectionReset)",
                    self.name,
                    c.lost_why.as_deref().unwrap_or("reason unknown")
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
        if c.objects_out >= self.cfg.nframes {
            return Err(err::INSUFFICIENT_MEMORY);
        }
        match send(sock, &header(Kind::Object, id), &[], Some(fd.as_raw_fd())) {
            Ok(()) => {}
            // The socket is full for now: no room, as above.
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                return Err(err::INSUFFICIENT_MEMORY)
            }
            Err(e) => {
                self.lose(&mut c, format!("sending to the peer failed: {e}"));
                return Err(err::CONNECTION_RESET);
            }
        }
        c.objects_out += 1;
        Ok(())
    }

    /// Whether the object with transfer id `id` was imported already.
    pub(crate) fn claimed(&self, id: u64) -> bool {
        lock(&self.conn).claimed.contains(&id)
    }

    /// Waits at most `limit` for the exported object `id` (`Timeout` when it
    /// does not come); once per id.
    pub(crate) fn receive_object(&self, id: u64, limit: Duration) -> R<OwnedFd> {
        let deadline = Instant::now().checked_add(limit);
        let _rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            {
                let mut c = lock(&self.conn);
                self.pump(&mut c);
                if let Some(fd) = c.objects.remove(&id) {
                    c.claimed.insert(id);
                    // The import has it now (and keeps or refuses it): the
                    // exporter's window reopens.
                    if !c.lost {
                        self.say(&mut c, Kind::Released, id);
                    }
                    return Ok(fd);
                }
                if c.lost {
                    return Err(err::RESOURCE_ERROR);
                }
            }
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
            poll_readable(&self.epoll, ms);
        }
    }
}
