//! The simulator's messages on an endpoint's connection and the socket
//! calls under them (Unix `SOCK_SEQPACKET`, abstract names, epoll).
//!
//! # Safety
//! The unsafe code here is socket, epoll and poll syscalls on descriptors
//! the simulator owns, with buffers and control messages it builds itself.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

// ---------------------------------------------------------------- wire

pub(crate) const MAGIC: u32 = u32::from_le_bytes(*b"TIPC");
pub(crate) const HEADER: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Kind {
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
    /// The receiver let go of the exported object `arg` (imported it, or
    /// refused its import): the exporter's window reopens by one.
    Released = 6,
}

impl Kind {
    pub(crate) fn from_u32(v: u32) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Frame,
            3 => Kind::Ack,
            4 => Kind::Object,
            5 => Kind::Bye,
            6 => Kind::Released,
            _ => return None,
        })
    }
}

pub(crate) fn header(kind: Kind, arg: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&(kind as u32).to_le_bytes());
    h[8..].copy_from_slice(&arg.to_le_bytes());
    h
}

// ---------------------------------------------------------------- sockets

pub(crate) fn last_err() -> io::Error {
    io::Error::last_os_error()
}

pub(crate) fn seqpacket() -> io::Result<OwnedFd> {
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
pub(crate) fn abstract_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
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

pub(crate) fn bind(fd: &OwnedFd, name: &str) -> io::Result<()> {
    let (a, len) = abstract_addr(name);
    // SAFETY: `a` is a valid address of `len` bytes.
    let r = unsafe { libc::bind(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) };
    if r != 0 {
        return Err(last_err());
    }
    Ok(())
}

pub(crate) fn connect(fd: &OwnedFd, name: &str) -> io::Result<()> {
    let (a, len) = abstract_addr(name);
    // SAFETY: `a` is a valid address of `len` bytes.
    let r = unsafe { libc::connect(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) };
    if r != 0 {
        return Err(last_err());
    }
    Ok(())
}

pub(crate) fn epoll_add(ep: &OwnedFd, fd: RawFd) -> io::Result<()> {
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

pub(crate) fn epoll_del(ep: &OwnedFd, fd: RawFd) {
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

/// A new epoll instance (close-on-exec).
pub(crate) fn epoll_new() -> io::Result<OwnedFd> {
    // SAFETY: plain epoll_create1 call; the result is checked.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(last_err());
    }
    // SAFETY: a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ep) })
}

/// Makes a bound socket listen (backlog 1).
pub(crate) fn listen(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: listen(2) on a socket descriptor we own.
    if unsafe { libc::listen(fd.as_raw_fd(), 1) } != 0 {
        return Err(last_err());
    }
    Ok(())
}

/// Accepts a pending connection on a listening socket (non-blocking,
/// close-on-exec); `None` when there is none (or accept fails).
pub(crate) fn accept(listener: &OwnedFd) -> Option<OwnedFd> {
    // SAFETY: accept4 on a socket we own; NULL address out-pointers are allowed.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a new descriptor nobody else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What the kernel looks at before it takes a message on `sock`: the bytes
/// this end sent that the peer has not received yet (`SIOCOUTQ`) and the
/// socket's send buffer size (`SO_SNDBUF`). A message is taken while the
/// first is below the second; `None` where the kernel does not answer.
pub(crate) fn send_queue(sock: &OwnedFd) -> Option<(usize, usize)> {
    let mut queued: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (= SIOCOUTQ) on a socket we own writes one int to
    // the live local `queued`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::TIOCOUTQ, &mut queued) } != 0 {
        return None;
    }
    let mut size: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the live local `size`.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&mut size as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return None;
    }
    Some((queued.max(0) as usize, size.max(0) as usize))
}

/// Asks for a send buffer of `bytes` on `sock` (the kernel caps the request
/// at its `wmem_max`); best effort, a refusal leaves the default.
pub(crate) fn ask_send_buffer(sock: &OwnedFd, bytes: usize) {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: setsockopt reads one int from the live local `v`.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
}

/// Waits at most `ms` milliseconds for `fd` to become readable (the
/// outcome is not reported: callers look again).
pub(crate) fn poll_readable(fd: &OwnedFd, ms: libc::c_int) {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on a descriptor the caller keeps open.
    unsafe { libc::poll(&mut pfd, 1, ms) };
}

/// Sends one message (header, payload, optionally one descriptor).
pub(crate) fn send(
    sock: &OwnedFd,
    head: &[u8; HEADER],
    payload: &[u8],
    fd: Option<RawFd>,
) -> io::Result<()> {
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

/// The kind word of the next message waiting on `sock`, without taking it
/// (`None`: nothing waiting, or not even a header's worth).
pub(crate) fn peek_kind(sock: &OwnedFd) -> Option<u32> {
    let mut head = [0u8; HEADER];
    // SAFETY: recv(2) into a live buffer of HEADER bytes; MSG_PEEK leaves
    // the message (and any descriptor it carries) queued.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            head.as_mut_ptr().cast(),
            head.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n < HEADER as isize {
        return None;
    }
    Some(u32::from_le_bytes([head[4], head[5], head[6], head[7]]))
}

pub(crate) enum Received {
    /// A message: header fields, payload, descriptor.
    Message(u32, u32, u64, Vec<u8>, Option<OwnedFd>),
    /// Nothing waiting.
    Empty,
    /// The peer closed or the connection failed.
    Closed,
}

pub(crate) fn recv(sock: &OwnedFd, max_payload: usize) -> Received {
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
