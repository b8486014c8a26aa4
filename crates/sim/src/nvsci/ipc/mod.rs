//! NvSciIpc endpoints and the IPC export/import of buffer objects, sync
//! objects, fences and buffer attribute lists.
//!
//! An endpoint name maps to a Unix `SOCK_SEQPACKET` socket registered with
//! `Sim::nvsci_register_endpoint`. Exporting an object sends its memfd over
//! that socket (`SCM_RIGHTS`) tagged with a transfer id, and the export
//! descriptor carries the id; importing receives messages until the one
//! with that id arrives (others are kept for later imports). The descriptor
//! bytes themselves travel however the application likes, as with the real
//! library.

mod buffers;
mod fences;

pub(crate) use self::buffers::*;
pub(crate) use self::fences::*;

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tegra_interop_sys::nvsci::{
    NvSciBufAttrList, NvSciBufAttrValAccessPerm, NvSciBufModule, NvSciBufObj,
    NvSciBufObjIpcExportDescriptor, NvSciError, NvSciIpcEndpoint, NvSciSyncAccessPerm,
    NvSciSyncAttrList, NvSciSyncFence, NvSciSyncFenceIpcExportDescriptor, NvSciSyncObj,
    NvSciSyncObjIpcExportDescriptor,
};

use super::attrs::{self, bk, sk, AttrMap, ListKind};
use super::buf::{self, BufCore};
use super::sync::{self, SyncCore};
use super::{core_and_perm, err, get, list, new_uid, unknown, R};
use crate::fence::{self, FenceContent, SimFence};
use crate::instance::Call;
use crate::shm::{SemaphoreKind, SharedSemaphore};
use crate::DiagnosticKind as D;

const MSG_MAGIC: u64 = u64::from_le_bytes(*b"TISIMIPC");
const BUF_TAG: u64 = u64::from_le_bytes(*b"TISIMBUF");
const SYNC_TAG: u64 = u64::from_le_bytes(*b"TISIMSYN");
const FENCE_TAG: u64 = u64::from_le_bytes(*b"TISIMFIP");

/// A connected pair of `AF_UNIX` `SOCK_SEQPACKET` sockets (close-on-exec):
/// register one end in each participant with
/// [`Sim::nvsci_register_endpoint`](crate::Sim::nvsci_register_endpoint).
/// To hand one end to a child process, clear its close-on-exec flag.
pub fn endpoint_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for the new descriptors.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socketpair returned two new descriptors that nobody else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Lets `fd` survive `exec` (clears close-on-exec) or not, to hand an
/// endpoint socket to a child process.
pub fn set_inheritable(fd: std::os::fd::BorrowedFd<'_>, inheritable: bool) -> io::Result<()> {
    let flags = if inheritable { 0 } else { libc::FD_CLOEXEC };
    // SAFETY: F_SETFD on a descriptor the caller holds open.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One registered socket: the descriptors received and not yet claimed.
pub(crate) struct Channel {
    sock: OwnedFd,
    inbox: Mutex<HashMap<u64, OwnedFd>>,
    rx: Mutex<()>,
    /// Transfer ids already imported (a descriptor imports once).
    claimed: Mutex<std::collections::HashSet<u64>>,
}

impl Channel {
    pub(crate) fn new(sock: OwnedFd) -> Channel {
        Channel {
            sock,
            inbox: Mutex::new(HashMap::new()),
            rx: Mutex::new(()),
            claimed: Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// Sends `fd` tagged with `id`.
    fn send(&self, id: u64, fd: &OwnedFd) -> io::Result<()> {
        let mut header = [0u8; 16];
        header[..8].copy_from_slice(&MSG_MAGIC.to_le_bytes());
        header[8..].copy_from_slice(&id.to_le_bytes());
        with_msghdr(&mut header, |msg| {
            // SAFETY: `msg` describes a control buffer with room for one header
            // carrying one descriptor; CMSG_FIRSTHDR / CMSG_DATA stay inside it.
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(msg);
                if cmsg.is_null() {
                    return Err(io::Error::from_raw_os_error(libc::EINVAL));
                }
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
                libc::CMSG_DATA(cmsg)
                    .cast::<libc::c_int>()
                    .write_unaligned(fd.as_raw_fd());
            }
            // SAFETY: `msg` points at live buffers for the duration of the call.
            let n = unsafe { libc::sendmsg(self.sock.as_raw_fd(), msg, libc::MSG_NOSIGNAL) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })
    }

    /// Receives one message: its id and descriptor.
    fn recv_one(&self, wait: Option<Duration>) -> Result<(u64, OwnedFd), NvSciError> {
        let ms = match wait {
            None => -1,
            Some(d) => libc::c_int::try_from(d.as_millis()).unwrap_or(libc::c_int::MAX),
        };
        let mut pfd = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r == 0 {
            return Err(err::TIMEOUT);
        }
        if r < 0 {
            return Err(err::RESOURCE_ERROR);
        }
        let mut header = [0u8; 16];
        let (n, got) = with_msghdr(&mut header, |msg| {
            // SAFETY: `msg` points at live buffers; received descriptors are
            // close-on-exec.
            let n = unsafe { libc::recvmsg(self.sock.as_raw_fd(), msg, libc::MSG_CMSG_CLOEXEC) };
            if n <= 0 {
                // 0: the peer closed its end.
                return Err(err::RESOURCE_ERROR);
            }
            let mut got = None;
            // SAFETY: walking the control buffer the kernel filled, with the
            // libc macros that stay inside `msg_controllen`.
            unsafe {
                let mut cmsg = libc::CMSG_FIRSTHDR(msg);
                while !cmsg.is_null() {
                    if (*cmsg).cmsg_level == libc::SOL_SOCKET
                        && (*cmsg).cmsg_type == libc::SCM_RIGHTS
                    {
                        let raw = libc::CMSG_DATA(cmsg).cast::<libc::c_int>().read_unaligned();
                        got = Some(OwnedFd::from_raw_fd(raw));
                    }
                    cmsg = libc::CMSG_NXTHDR(msg, cmsg);
                }
            }
            Ok((n, got))
        })?;
        let fd = got.ok_or(err::RESOURCE_ERROR)?;
        let magic = u64::from_le_bytes(header[..8].try_into().map_err(|_| err::RESOURCE_ERROR)?);
        if n != 16 || magic != MSG_MAGIC {
            return Err(err::RESOURCE_ERROR);
        }
        let id = u64::from_le_bytes(header[8..].try_into().map_err(|_| err::RESOURCE_ERROR)?);
        Ok((id, fd))
    }

    /// Whether the descriptor with transfer id `id` was imported already.
    fn claimed(&self, id: u64) -> bool {
        self.claimed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&id)
    }

    /// Waits for the descriptor sent with `id` (once per id).
    fn receive(&self, id: u64, limit: Option<Duration>) -> R<OwnedFd> {
        let fd = self.receive_inner(id, limit)?;
        self.claimed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id);
        Ok(fd)
    }

    fn receive_inner(&self, id: u64, limit: Option<Duration>) -> R<OwnedFd> {
        let deadline = limit.and_then(|l| Instant::now().checked_add(l));
        loop {
            if let Some(fd) = self
                .inbox
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id)
            {
                return Ok(fd);
            }
            let _rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(fd) = self
                .inbox
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id)
            {
                return Ok(fd);
            }
            let wait = match deadline {
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(err::TIMEOUT);
                    }
                    Some(d - now)
                }
            };
            let (got, fd) = self.recv_one(wait)?;
            if got == id {
                return Ok(fd);
            }
            self.inbox
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(got, fd);
        }
    }
}

/// An endpoint opened with `NvSciIpcOpenEndpoint`.
pub(crate) struct OpenEndpoint {
    name: String,
    channel: Arc<Channel>,
}

static NEXT_ENDPOINT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

pub(crate) fn NvSciIpcInit(c: &Call) -> NvSciError {
    c.state().nvsci.ipc_inits += 1;
    err::SUCCESS
}

pub(crate) fn NvSciIpcDeinit(c: &Call) {
    let mut st = c.state();
    if st.nvsci.ipc_inits == 0 {
        c.diag(D::Misuse, "NvSciIpcDeinit without NvSciIpcInit".into());
    } else {
        st.nvsci.ipc_inits -= 1;
    }
}

pub(crate) unsafe fn NvSciIpcOpenEndpoint(
    c: &Call,
    name: *const c_char,
    out: *mut NvSciIpcEndpoint,
) -> NvSciError {
    let r = (|| {
        if name.is_null() || out.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        // SAFETY: the caller passes a NUL-terminated string.
        let name = unsafe { crate::cmem::c_str(name) }
            .to_string_lossy()
            .into_owned();
        let mut st = c.state();
        let ns = &mut st.nvsci;
        if ns.ipc_inits == 0 {
            return Err(err::NOT_INITIALIZED);
        }
        let Some(channel) = ns.registered.get(&name).cloned() else {
            c.diag(
                D::Misuse,
                format!("endpoint {name:?} is not registered (Sim::nvsci_register_endpoint)"),
            );
            return Err(err::BAD_PARAMETER);
        };
        if ns.endpoints.values().any(|e| e.name == name) {
            return Err(err::ALREADY_IN_USE);
        }
        let h = NEXT_ENDPOINT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) | (0x5eu64 << 56);
        ns.endpoints.insert(h, OpenEndpoint { name, channel });
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { out.write(h) };
        Ok(())
    })();
    super::done(r)
}

pub(crate) fn NvSciIpcCloseEndpoint(c: &Call, h: NvSciIpcEndpoint) {
    if c.state().nvsci.endpoints.remove(&h).is_none() {
        c.diag(D::Misuse, format!("endpoint {h:#x} is not open"));
    }
}

fn channel(c: &Call, ep: NvSciIpcEndpoint) -> R<Arc<Channel>> {
    let st = c.state();
    match st.nvsci.endpoints.get(&ep) {
        Some(e) => Ok(Arc::clone(&e.channel)),
        None => {
            c.diag(D::Misuse, format!("endpoint {ep:#x} is not open"));
            Err(err::BAD_PARAMETER)
        }
    }
}

// ---------------------------------------------------------------- buffers

// ---------------------------------------------------------------- sync objects and fences

/// Runs `f` with a message header whose one data buffer is `header` and whose control buffer
/// has room for one message carrying one descriptor: the frame `sendmsg` and `recvmsg` of a
/// channel share.
fn with_msghdr<T>(header: &mut [u8; 16], f: impl FnOnce(&mut libc::msghdr) -> T) -> T {
    let mut iov = libc::iovec {
        iov_base: header.as_mut_ptr().cast(),
        iov_len: header.len(),
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
    f(&mut msg)
}
