//! [`Channel`]: length-prefixed messages plus `SCM_RIGHTS` fds over a Unix
//! stream socket, with the untrusted-peer rules of the module docs.
//!
//! A message is a 4-byte little-endian length, then that many bytes of
//! body; its fds travel as the ancillary data of the `sendmsg` that carries
//! the length. The receiver reads the length and the body with separate
//! `recvmsg` calls sized to what is still missing, so it never reads into
//! the next message, and collects the fds of each call at once as
//! [`OwnedFd`]s.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::{FdError, FdMsg, Limits, SCM_MAX_FD};

/// The peer's credentials as the kernel reports them (`SO_PEERCRED`: the
/// process that connected, or made the pair).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Its process id.
    pub pid: i32,
    /// Its user id.
    pub uid: u32,
    /// Its group id.
    pub gid: u32,
}

/// One received message: its body and the fds that came with it (owned:
/// dropping them closes them).
#[derive(Debug)]
pub struct Received {
    /// The body (at most [`Limits::max_message`] bytes).
    pub body: Vec<u8>,
    /// The fds (at most [`Limits::max_fds`]).
    pub fds: Vec<OwnedFd>,
}

/// One end of the connection (see the module docs for its rules).
#[derive(Debug)]
pub struct Channel {
    stream: UnixStream,
    limits: Limits,
    peer: PeerCred,
    broken: Option<String>,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> FdError {
    let what = what.into();
    move |source| FdError::Io { what, source }
}

fn errno(what: &str) -> impl FnOnce(Errno) -> FdError + '_ {
    move |e| FdError::Io {
        what: what.to_owned(),
        source: e.into(),
    }
}

impl Channel {
    /// A connected pair in this process (the started child gets one end).
    ///
    /// # Errors
    /// The limits are outside the hard bounds, or the pair cannot be made.
    pub fn pair(limits: Limits) -> Result<(Channel, Channel), FdError> {
        let (a, b) = UnixStream::pair().map_err(io_err("socketpair"))?;
        Ok((Channel::new(a, limits)?, Channel::new(b, limits)?))
    }

    /// The channel over a connected stream; the peer must run as this
    /// process's uid.
    ///
    /// # Errors
    /// [`FdError::WrongUid`], or `SO_PEERCRED` fails (not a Unix socket).
    pub fn new(stream: UnixStream, limits: Limits) -> Result<Channel, FdError> {
        let ours = rustix::process::getuid().as_raw();
        Channel::with_expected_uid(stream, limits, ours)
    }

    /// The channel over a connected stream whose peer must run as `uid`
    /// (the check of [`Channel::new`] with the expected uid given: a
    /// service that takes frames from one other user, or a test that
    /// cannot change its uid and instead expects one the peer does not
    /// have).
    ///
    /// # Errors
    /// [`FdError::WrongUid`] (with `ours` = `uid`), or `SO_PEERCRED` fails.
    pub fn with_expected_uid(
        stream: UnixStream,
        limits: Limits,
        uid: u32,
    ) -> Result<Channel, FdError> {
        let limits = limits.checked()?;
        let c = rustix::net::sockopt::socket_peercred(&stream)
            .map_err(errno("SO_PEERCRED of the peer's socket"))?;
        let peer = PeerCred {
            pid: c.pid.as_raw_pid(),
            uid: c.uid.as_raw(),
            gid: c.gid.as_raw(),
        };
        if peer.uid != uid {
            return Err(FdError::WrongUid {
                ours: uid,
                peer: peer.uid,
            });
        }
        Ok(Channel {
            stream,
            limits,
            peer,
            broken: None,
        })
    }

    /// Connects to the socket at `path` (waits at most the limit for the
    /// listener to appear).
    ///
    /// # Errors
    /// [`FdError::Timeout`] when nobody listens there in time, else as
    /// [`Channel::new`].
    pub fn connect(path: &Path, limits: Limits) -> Result<Channel, FdError> {
        let deadline = Instant::now() + limits.timeout;
        loop {
            match UnixStream::connect(path) {
                Ok(s) => return Channel::new(s, limits),
                Err(e) if Instant::now() >= deadline => {
                    return Err(match e.kind() {
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                            FdError::Timeout {
                                waiting_for: format!("a listener at {}", path.display()),
                                limit: limits.timeout,
                            }
                        }
                        _ => FdError::Io {
                            what: format!("connecting to {}", path.display()),
                            source: e,
                        },
                    })
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    /// Accepts one connection on `listener` (waits at most the limit).
    ///
    /// # Errors
    /// [`FdError::Timeout`] when nobody connects in time, else as
    /// [`Channel::new`].
    pub fn accept(listener: &UnixListener, limits: Limits) -> Result<Channel, FdError> {
        listener
            .set_nonblocking(true)
            .map_err(io_err("a non-blocking listener"))?;
        let deadline = Instant::now() + limits.timeout;
        loop {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false)
                        .map_err(io_err("a blocking connection"))?;
                    return Channel::new(s, limits);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(FdError::Timeout {
                            waiting_for: "the peer to connect".into(),
                            limit: limits.timeout,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(io_err("accepting the peer")(e)),
            }
        }
    }

    /// The peer's credentials, as checked when the channel was made.
    pub fn peer(&self) -> PeerCred {
        self.peer
    }

    /// The limits this channel applies.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The socket (to poll it, or to hand it to a child process).
    pub fn socket(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    /// The socket, to hand to a started child (its stdin).
    pub fn into_socket(self) -> OwnedFd {
        OwnedFd::from(self.stream)
    }

    /// Whether the peer has closed its end (it ended), looked at without
    /// waiting and without taking anything: `false` while it is connected,
    /// also when a message is waiting.
    ///
    /// # Errors
    /// The socket cannot be looked at.
    pub fn peer_closed(&self) -> Result<bool, FdError> {
        let mut b = [MaybeUninit::<u8>::uninit(); 1];
        let flags = RecvFlags::PEEK | RecvFlags::DONTWAIT;
        match rustix::net::recv(&self.stream, &mut b[..], flags) {
            Ok((_, 0)) => Ok(true),
            Ok(_) | Err(Errno::AGAIN) | Err(Errno::INTR) => Ok(false),
            Err(Errno::CONNRESET) => Ok(true),
            Err(e) => Err(errno("looking at the peer's socket")(e)),
        }
    }

    fn check_broken(&self) -> Result<(), FdError> {
        match &self.broken {
            Some(e) => Err(FdError::Broken(e.clone())),
            None => Ok(()),
        }
    }

    /// Marks the channel broken by `e` (framing lost) and returns `e`.
    fn breaks(&mut self, e: FdError) -> FdError {
        self.broken = Some(e.to_string());
        e
    }

    /// Sends one message: `body` (at most [`Limits::max_message`] bytes)
    /// with `fds` (at most [`Limits::max_fds`]; the peer gets duplicates,
    /// these stay open here).
    ///
    /// # Errors
    /// Over the limits, [`FdError::Timeout`] when the peer takes nothing
    /// within the limit, [`FdError::Closed`] when it ended.
    pub fn send(&mut self, body: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), FdError> {
        self.check_broken()?;
        if body.len() > self.limits.max_message {
            return Err(FdError::MessageTooLarge {
                declared: body.len() as u64,
                max: self.limits.max_message,
            });
        }
        if fds.len() > self.limits.max_fds {
            return Err(FdError::TooManyFds {
                received: fds.len(),
                max: self.limits.max_fds,
                truncated: false,
            });
        }
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
        frame.extend_from_slice(body);
        self.send_raw(&frame, fds, "the peer to take a message")
    }

    /// Sends `bytes` as they are (no length prefix added), `fds` with the
    /// first of them: the raw half of [`Channel::send`], for tests that
    /// play a hostile peer (forged lengths, floods).
    ///
    /// # Errors
    /// As [`Channel::send`]; the limits are not applied.
    pub fn send_raw(
        &mut self,
        bytes: &[u8],
        fds: &[BorrowedFd<'_>],
        waiting_for: &str,
    ) -> Result<(), FdError> {
        let deadline = Instant::now() + self.limits.timeout;
        let mut sent = 0usize;
        let n = fds.len().min(SCM_MAX_FD);
        let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(n))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(FdError::BadLimits(format!("{} fds do not fit", fds.len())));
        }
        while sent < bytes.len() {
            self.set_timeout(deadline, waiting_for, false)?;
            let iov = [IoSlice::new(&bytes[sent..])];
            let r = rustix::net::sendmsg(&self.stream, &iov, &mut control, SendFlags::NOSIGNAL);
            match r {
                Ok(n) => {
                    sent += n;
                    control = SendAncillaryBuffer::default();
                }
                Err(Errno::INTR) => {}
                Err(e) => return Err(self.map_errno(e, waiting_for, "sending a message")),
            }
        }
        Ok(())
    }

    /// Sets the socket's send or receive timeout to what is left before
    /// `deadline` ([`FdError::Timeout`] when nothing is left).
    fn set_timeout(&self, deadline: Instant, waiting_for: &str, read: bool) -> Result<(), FdError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(FdError::Timeout {
                waiting_for: waiting_for.to_owned(),
                limit: self.limits.timeout,
            });
        }
        let left = left.max(Duration::from_millis(1));
        let r = match read {
            true => self.stream.set_read_timeout(Some(left)),
            false => self.stream.set_write_timeout(Some(left)),
        };
        r.map_err(io_err("the socket's timeout"))
    }

    fn map_errno(&self, e: Errno, waiting_for: &str, doing: &str) -> FdError {
        match e {
            Errno::AGAIN => FdError::Timeout {
                waiting_for: waiting_for.to_owned(),
                limit: self.limits.timeout,
            },
            Errno::PIPE | Errno::CONNRESET => FdError::Closed {
                waiting_for: waiting_for.to_owned(),
            },
            e => FdError::Io {
                what: format!("{doing} (waiting for {waiting_for})"),
                source: e.into(),
            },
        }
    }

    /// Receives one message; `waiting_for` names it in errors. The fds
    /// that came with it are checked against [`Limits::max_fds`] and owned
    /// (closed on any error).
    ///
    /// # Errors
    /// See the module docs: [`FdError::Timeout`], [`FdError::Closed`],
    /// [`FdError::TooManyFds`], [`FdError::StrayFds`],
    /// [`FdError::MessageTooLarge`], [`FdError::Truncated`].
    pub fn recv(&mut self, waiting_for: &dyn Fn() -> String) -> Result<Received, FdError> {
        self.check_broken()?;
        let deadline = Instant::now() + self.limits.timeout;
        let mut header = [0u8; 4];
        let mut fds = Vec::new();
        let what = waiting_for();
        let got = self.read_exact(&mut header, &mut fds, deadline, &what)?;
        if got == 0 {
            return Err(FdError::Closed { waiting_for: what });
        }
        if got < header.len() {
            let e = FdError::Truncated {
                expected: header.len(),
                got,
            };
            return Err(self.breaks(e));
        }
        let len = u32::from_le_bytes(header) as usize;
        if len > self.limits.max_message {
            let e = FdError::MessageTooLarge {
                declared: len as u64,
                max: self.limits.max_message,
            };
            return Err(self.breaks(e));
        }
        let mut body = vec![0u8; len];
        let mut stray = Vec::new();
        let got = self.read_exact(&mut body, &mut stray, deadline, &what)?;
        if !stray.is_empty() {
            let e = FdError::StrayFds { count: stray.len() };
            return Err(self.breaks(e));
        }
        if got < len {
            let e = FdError::Truncated {
                expected: 4 + len,
                got: 4 + got,
            };
            return Err(self.breaks(e));
        }
        // The whole message was read, so the stream stays framed: a flood
        // costs the peer this message only (its fds close here).
        if fds.len() > self.limits.max_fds {
            return Err(FdError::TooManyFds {
                received: fds.len(),
                max: self.limits.max_fds,
                truncated: false,
            });
        }
        Ok(Received { body, fds })
    }

    /// Reads until `buf` is full or the peer closes; returns the bytes
    /// read. The fds of every call go to `fds` at once (owned).
    fn read_exact(
        &mut self,
        buf: &mut [u8],
        fds: &mut Vec<OwnedFd>,
        deadline: Instant,
        waiting_for: &str,
    ) -> Result<usize, FdError> {
        let mut got = 0usize;
        while got < buf.len() {
            if let Err(e) = self.set_timeout(deadline, waiting_for, true) {
                return Err(self.mid_message(e, got));
            }
            let n = self.limits.fd_buffer;
            let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(n))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [IoSliceMut::new(&mut buf[got..])];
            let flags = RecvFlags::CMSG_CLOEXEC;
            let r = rustix::net::recvmsg(&self.stream, &mut iov, &mut control, flags);
            let before = fds.len();
            for m in control.drain() {
                if let RecvAncillaryMessage::ScmRights(it) = m {
                    fds.extend(it);
                }
            }
            match r {
                Ok(m) if m.flags.contains(ReturnFlags::CTRUNC) => {
                    let e = FdError::TooManyFds {
                        received: fds.len() - before,
                        max: self.limits.max_fds,
                        truncated: true,
                    };
                    return Err(self.breaks(e));
                }
                Ok(m) if m.bytes == 0 => return Ok(got),
                Ok(m) => got += m.bytes,
                Err(Errno::INTR) => {}
                Err(e) => {
                    let e = self.map_errno(e, waiting_for, "receiving a message");
                    return Err(self.mid_message(e, got));
                }
            }
        }
        Ok(got)
    }

    /// An error after `got` bytes of a message: the framing is lost (the
    /// channel breaks) unless nothing of the message was read.
    fn mid_message(&mut self, e: FdError, got: usize) -> FdError {
        match got {
            0 => e,
            _ => self.breaks(e),
        }
    }

    /// Sends a typed message with exactly the fds its kind carries.
    ///
    /// # Errors
    /// [`FdError::WrongFdCount`], else as [`Channel::send`].
    pub fn send_msg(&mut self, m: &FdMsg, fds: &[BorrowedFd<'_>]) -> Result<(), FdError> {
        if fds.len() != m.fds() {
            return Err(FdError::WrongFdCount {
                kind: m.kind(),
                want: m.fds(),
                got: fds.len(),
            });
        }
        self.send(&m.encode(), fds)
    }

    /// Receives a typed message and exactly the fds its kind carries.
    ///
    /// # Errors
    /// [`FdError::BadMessage`], [`FdError::WrongFdCount`] (every fd
    /// closed), else as [`Channel::recv`].
    pub fn recv_msg(
        &mut self,
        waiting_for: &dyn Fn() -> String,
    ) -> Result<(FdMsg, Vec<OwnedFd>), FdError> {
        let r = self.recv(waiting_for)?;
        let m = FdMsg::decode(&r.body)?;
        if r.fds.len() != m.fds() {
            return Err(FdError::WrongFdCount {
                kind: m.kind(),
                want: m.fds(),
                got: r.fds.len(),
            });
        }
        Ok((m, r.fds))
    }
}
