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

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
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
use super::{err, get, new_uid, unknown, R};
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
        // SAFETY: `msg` describes `control`, which has room for one header
        // carrying one descriptor; CMSG_FIRSTHDR / CMSG_DATA stay inside it.
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
                .write_unaligned(fd.as_raw_fd());
        }
        // SAFETY: `msg` points at live buffers for the duration of the call.
        let n = unsafe { libc::sendmsg(self.sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
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
        let mut iov = libc::iovec {
            iov_base: header.as_mut_ptr().cast(),
            iov_len: header.len(),
        };
        // SAFETY: pure size computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
        let mut control = vec![0u8; space];
        // SAFETY: an all-zero msghdr is a valid value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: `msg` points at live buffers; received descriptors are
        // close-on-exec.
        let n = unsafe { libc::recvmsg(self.sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n <= 0 {
            // 0: the peer closed its end.
            return Err(err::RESOURCE_ERROR);
        }
        let mut got = None;
        // SAFETY: walking the control buffer the kernel filled, with the
        // libc macros that stay inside `msg_controllen`.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let raw = libc::CMSG_DATA(cmsg).cast::<libc::c_int>().read_unaligned();
                    got = Some(OwnedFd::from_raw_fd(raw));
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
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
        let name = unsafe { CStr::from_ptr(name) }
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

pub(crate) unsafe fn NvSciBufObjIpcExport(
    c: &Call,
    obj: NvSciBufObj,
    perm: NvSciBufAttrValAccessPerm,
    ep: NvSciIpcEndpoint,
    desc: *mut NvSciBufObjIpcExportDescriptor,
) -> NvSciError {
    let h = obj as usize;
    let r = (|| {
        if desc.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        let (core, have) = {
            let st = c.state();
            let Some(rec) = st.nvsci.buf_objs.get(&h) else {
                return Err(unknown(c, &st.nvsci, "NvSciBuf object", h));
            };
            (Arc::clone(&rec.core), rec.perm)
        };
        if !matches!(perm.0, attrs::BUF_READONLY | attrs::BUF_READWRITE | 4) {
            c.diag(
                D::Misuse,
                format!(
                    "export permission {} is not Readonly, ReadWrite or Auto",
                    perm.0
                ),
            );
            return Err(err::BAD_PARAMETER);
        }
        channel(c, ep)?;
        // The object goes back along the path its peers' unreconciled lists
        // came by; the peer gets at least what it was granted.
        let Some(&(_, granted)) = attrs::peers(&core.attrs).iter().find(|(e, _)| *e == ep) else {
            c.diag(
                D::Misuse,
                format!("NvSciBuf object exported over endpoint {ep:#x}, which no unreconciled list of its reconciliation came by (import the peer's list with AttrListIpcImportUnreconciled over this endpoint before reconciling)"),
            );
            return Err(err::NOT_PERMITTED);
        };
        let grant = match perm.0 {
            4 => granted,
            p if p > have => {
                c.diag(
                    D::Misuse,
                    format!("cannot export permission {p} from a handle with {have}"),
                );
                return Err(err::BAD_PARAMETER);
            }
            p if p < granted => {
                c.diag(
                    D::Misuse,
                    format!("export permission {p} is below the {granted} the peer was granted at reconciliation"),
                );
                return Err(err::INVALID_OPERATION);
            }
            p => p,
        };
        let ch = channel(c, ep)?;
        let id = new_uid();
        ch.send(id, &core.fd).map_err(|_| err::RESOURCE_ERROR)?;
        // The descriptor is packed: fill aligned words, then move them in.
        let mut words = [0u64; 32];
        words[..4].copy_from_slice(&[BUF_TAG, id, core.size, u64::from(grant)]);
        let d = NvSciBufObjIpcExportDescriptor { data: words };
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { desc.write(d) };
        Ok(())
    })();
    super::done(r)
}

pub(crate) unsafe fn NvSciBufObjIpcImport(
    c: &Call,
    ep: NvSciIpcEndpoint,
    desc: *const NvSciBufObjIpcExportDescriptor,
    list: NvSciBufAttrList,
    min_perm: NvSciBufAttrValAccessPerm,
    timeout_us: i64,
    out: *mut NvSciBufObj,
) -> NvSciError {
    let r = (|| {
        // SAFETY: forwarded caller pointer.
        let d = unsafe { get(desc) }?;
        if out.is_null() || d.data[0] != BUF_TAG {
            return Err(err::BAD_PARAMETER);
        }
        let (id, size, grant) = (d.data[1], d.data[2], d.data[3] as u32);
        let (module, map) = buf::reconciled(c, false, list as usize)?;
        if attrs::buf_size(&map) != size {
            c.diag(
                D::Misuse,
                "the reconciled list does not describe the exported object".into(),
            );
            return Err(err::BAD_PARAMETER);
        }
        // The header says the timeout is ignored; the simulator waits for
        // the descriptor's memory at most `hang_timeout`.
        let _ = timeout_us;
        let ch = channel(c, ep)?;
        if ch.claimed(id) {
            c.diag(D::Misuse, "this NvSciBuf object descriptor was imported already (a descriptor imports once; the real library's answer is not known, refused)".into());
            return Err(err::BAD_PARAMETER);
        }
        let fd = ch.receive(id, Some(c.inst.config.hang_timeout))?;
        let min = match min_perm.0 {
            attrs::BUF_READWRITE => attrs::BUF_READWRITE,
            _ => attrs::BUF_READONLY,
        };
        if grant < min {
            c.diag(
                D::Misuse,
                format!("the exporter granted permission {grant}, the importer needs {min}"),
            );
            return Err(err::ACCESS_DENIED);
        }
        let mut m = (*map).clone();
        m.insert(bk::ACTUAL_PERM, attrs::enc_u32s(&[grant]));
        let core = Arc::new(BufCore::new(fd, size, Arc::new(m))?);
        let h = buf::register(&mut c.state(), core, grant, module)?;
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { out.write(h as NvSciBufObj) };
        Ok(())
    })();
    super::done(r)
}

fn hand_out(c: &Call, bytes: Vec<u8>, desc: *mut *mut c_void, len: *mut usize) -> R {
    if desc.is_null() || len.is_null() {
        return Err(err::BAD_PARAMETER);
    }
    // SAFETY: plain allocation of at least one byte.
    let p = unsafe { libc::malloc(bytes.len().max(1)) }.cast::<u8>();
    if p.is_null() {
        return Err(err::INSUFFICIENT_MEMORY);
    }
    // SAFETY: `p` has room for `bytes.len()` bytes; the regions are distinct.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
    c.state().nvsci.descriptors.insert(p as usize);
    // SAFETY: both checked non-null; caller out-pointers.
    unsafe {
        desc.write(p.cast());
        len.write(bytes.len());
    }
    Ok(())
}

pub(crate) unsafe fn NvSciBufAttrListIpcExportUnreconciled(
    c: &Call,
    lists: *const NvSciBufAttrList,
    n: usize,
    ep: NvSciIpcEndpoint,
    desc: *mut *mut c_void,
    len: *mut usize,
) -> NvSciError {
    let r = (|| {
        // SAFETY: forwarded caller array.
        let hs = unsafe { buf::handles(lists.cast::<*mut c_void>(), n) }?;
        channel(c, ep)?;
        let bytes = {
            let st = c.state();
            let (_, parts) = buf::gather(c, &st.nvsci, false, &hs)?;
            let refs: Vec<&AttrMap> = parts.iter().collect();
            attrs::serialize(&refs)
        };
        hand_out(c, bytes, desc, len)
    })();
    super::done(r)
}

pub(crate) fn NvSciBufAttrListIpcExportReconciled(
    c: &Call,
    list: NvSciBufAttrList,
    ep: NvSciIpcEndpoint,
    desc: *mut *mut c_void,
    len: *mut usize,
) -> NvSciError {
    let r = (|| {
        let (_, map) = buf::reconciled(c, false, list as usize)?;
        channel(c, ep)?;
        // The peer's ActualPerm: the largest RequiredPerm of its own lists.
        let mut m = (*map).clone();
        if let Some((_, perm)) = attrs::peers(&map).into_iter().find(|(e, _)| *e == ep) {
            m.insert(bk::ACTUAL_PERM, attrs::enc_u32s(&[perm]));
        }
        hand_out(c, attrs::serialize(&[&m]), desc, len)
    })();
    super::done(r)
}

/// Parses an attribute-list descriptor.
///
/// # Safety
/// `desc` must point at `len` readable bytes.
unsafe fn parse(desc: *const c_void, len: usize) -> R<Vec<AttrMap>> {
    if desc.is_null() || len == 0 {
        return Err(err::BAD_PARAMETER);
    }
    // SAFETY: the caller passes `len` readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(desc.cast::<u8>(), len) };
    attrs::deserialize(bytes).ok_or(err::BAD_PARAMETER)
}

fn live_module(c: &Call, m: usize) -> R {
    let st = c.state();
    match st.nvsci.buf_modules.get(&m) {
        Some(rec) if !rec.closed => Ok(()),
        _ => Err(unknown(c, &st.nvsci, "buf module", m)),
    }
}

pub(crate) unsafe fn NvSciBufAttrListIpcImportUnreconciled(
    c: &Call,
    module: NvSciBufModule,
    ep: NvSciIpcEndpoint,
    desc: *const c_void,
    len: usize,
    out: *mut NvSciBufAttrList,
) -> NvSciError {
    let r = (|| {
        // SAFETY: forwarded caller buffer.
        let parts = unsafe { parse(desc, len) }?;
        if out.is_null() || parts.is_empty() {
            return Err(err::BAD_PARAMETER);
        }
        channel(c, ep)?;
        live_module(c, module as usize)?;
        let mut parts = parts;
        for p in &mut parts {
            p.insert(attrs::PRIVATE_PEER, attrs::enc_u64s(&[ep]));
        }
        let h = buf::add_list(
            &mut c.state().nvsci,
            false,
            module as usize,
            ListKind::Unreconciled(parts),
        );
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { out.write(h as NvSciBufAttrList) };
        Ok(())
    })();
    super::done(r)
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn NvSciBufAttrListIpcImportReconciled(
    c: &Call,
    module: NvSciBufModule,
    ep: NvSciIpcEndpoint,
    desc: *const c_void,
    len: usize,
    inputs: *const NvSciBufAttrList,
    n: usize,
    out: *mut NvSciBufAttrList,
) -> NvSciError {
    let r = (|| {
        // SAFETY: forwarded caller buffer.
        let mut parts = unsafe { parse(desc, len) }?;
        if out.is_null() || parts.len() != 1 {
            return Err(err::BAD_PARAMETER);
        }
        let map = parts.remove(0);
        channel(c, ep)?;
        live_module(c, module as usize)?;
        if n > 0 {
            // SAFETY: forwarded caller array.
            let hs = unsafe { buf::handles(inputs.cast::<*mut c_void>(), n) }?;
            let st = c.state();
            let (_, mine) = buf::gather(c, &st.nvsci, false, &hs)?;
            let types = map
                .get(&bk::TYPES)
                .map(|v| attrs::u32s(v))
                .unwrap_or_default();
            let size = attrs::get_u64(&map, bk::RAW_SIZE).unwrap_or(0);
            for p in &mine {
                let t_ok = p
                    .get(&bk::TYPES)
                    .is_none_or(|v| attrs::u32s(v).iter().all(|t| types.contains(t)));
                let s_ok = attrs::get_u64(p, bk::RAW_SIZE).is_none_or(|s| s == size);
                if !(t_ok && s_ok) {
                    c.diag(
                        D::Misuse,
                        "the imported reconciled list does not satisfy the importer's own list"
                            .into(),
                    );
                    return Err(err::ATTR_LIST_VALIDATION_FAILED);
                }
            }
        }
        let h = buf::add_list(
            &mut c.state().nvsci,
            false,
            module as usize,
            ListKind::Reconciled(Arc::new(map)),
        );
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { out.write(h as NvSciBufAttrList) };
        Ok(())
    })();
    super::done(r)
}

pub(crate) fn NvSciBufAttrListFreeDesc(c: &Call, desc: *mut c_void) {
    let p = desc as usize;
    if c.state().nvsci.descriptors.remove(&p) {
        // SAFETY: `p` came from our own malloc in `hand_out` and is freed once.
        unsafe { libc::free(desc) };
    } else {
        c.diag(
            D::Misuse,
            format!("{p:#x} is not a descriptor handed out by the simulator (or freed twice)"),
        );
    }
}

// ---------------------------------------------------------------- sync objects and fences

pub(crate) unsafe fn NvSciSyncObjIpcExport(
    c: &Call,
    obj: NvSciSyncObj,
    perm: NvSciSyncAccessPerm,
    ep: NvSciIpcEndpoint,
    desc: *mut NvSciSyncObjIpcExportDescriptor,
) -> NvSciError {
    let h = obj as usize;
    let r = (|| {
        if desc.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        let (core, have) = {
            let st = c.state();
            let Some(rec) = st.nvsci.sync_objs.get(&h) else {
                return Err(unknown(c, &st.nvsci, "NvSciSync object", h));
            };
            (Arc::clone(&rec.core), rec.perm)
        };
        let grant = match perm.0 {
            attrs::PERM_AUTO => have,
            p @ 1..=3 if p & !have == 0 => p,
            p => {
                c.diag(
                    D::Misuse,
                    format!("cannot export permission {p:#x} from a handle with {have:#x}"),
                );
                return Err(err::BAD_PARAMETER);
            }
        };
        let ch = channel(c, ep)?;
        let id = new_uid();
        ch.send(id, &core.sem_fd).map_err(|_| err::RESOURCE_ERROR)?;
        let a = &core.attrs;
        let mut d = NvSciSyncObjIpcExportDescriptor::default();
        d.payload[..9].copy_from_slice(&[
            SYNC_TAG,
            id,
            core.uid,
            grant,
            u64::from(attrs::get_u32(a, sk::PRIMITIVE).unwrap_or(attrs::PRIM_SYNCPOINT)),
            attrs::get_u64(a, sk::MAX_VALUE).unwrap_or(u64::from(u32::MAX)),
            u64::from(attrs::get_bool(a, sk::NEED_CPU)),
            u64::from(attrs::get_bool(a, sk::DETERMINISTIC)),
            u64::from(attrs::get_bool(a, sk::CTX_INSENSITIVE)),
        ]);
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { desc.write(d) };
        Ok(())
    })();
    super::done(r)
}

pub(crate) unsafe fn NvSciSyncObjIpcImport(
    c: &Call,
    ep: NvSciIpcEndpoint,
    desc: *const NvSciSyncObjIpcExportDescriptor,
    list: NvSciSyncAttrList,
    perm: NvSciSyncAccessPerm,
    timeout_us: i64,
    out: *mut NvSciSyncObj,
) -> NvSciError {
    let r = (|| {
        // SAFETY: forwarded caller pointer.
        let d = unsafe { get(desc) }?;
        let p = d.payload;
        if out.is_null() || p[0] != SYNC_TAG {
            return Err(err::BAD_PARAMETER);
        }
        let (id, uid, grant) = (p[1], p[2], p[3]);
        // The importer's own list: its RequiredPerm must be granted.
        let (module, required) = {
            let st = c.state();
            let ns = &st.nvsci;
            let Some(l) = ns.lists.get(&(list as usize)).filter(|l| l.sync) else {
                return Err(unknown(c, ns, "attribute list", list as usize));
            };
            let required = l
                .readable()
                .and_then(|m| attrs::get_u64(m, sk::REQ_PERM))
                .unwrap_or(0);
            (l.module, required)
        };
        // Take the descriptor off the socket first, so a refused import
        // leaves nothing behind for later imports to skip over.
        let limit = sync::timeout(timeout_us)?;
        let ch = channel(c, ep)?;
        if ch.claimed(id) {
            c.diag(D::Misuse, "this NvSciSync object descriptor was imported already (a descriptor imports once; the real library's answer is not known, refused)".into());
            return Err(err::BAD_PARAMETER);
        }
        let fd = ch.receive(id, limit)?;
        let want = if perm.0 == attrs::PERM_AUTO {
            grant
        } else {
            perm.0
        };
        if want & !grant != 0 || required & !grant != 0 || want == 0 {
            c.diag(
                D::Misuse,
                format!("the exporter granted {grant:#x}; the importer asks for {want:#x} (its list requires {required:#x})"),
            );
            return Err(err::ACCESS_DENIED);
        }
        let Some(sem) = SharedSemaphore::open(std::os::fd::AsFd::as_fd(&fd)) else {
            return Err(err::BAD_PARAMETER);
        };
        if !matches!(sem.kind(), SemaphoreKind::Deterministic { .. }) {
            return Err(err::BAD_PARAMETER);
        }
        let mut m = AttrMap::new();
        m.insert(sk::ACTUAL_PERM, attrs::enc_u64s(&[want]));
        m.insert(sk::PRIMITIVE, attrs::enc_u32s(&[p[4] as u32]));
        m.insert(sk::MAX_VALUE, attrs::enc_u64s(&[p[5]]));
        m.insert(sk::NEED_CPU, attrs::enc_bool(p[6] != 0));
        m.insert(sk::DETERMINISTIC, attrs::enc_bool(p[7] != 0));
        m.insert(sk::CTX_INSENSITIVE, attrs::enc_bool(p[8] != 0));
        let core = Arc::new(SyncCore {
            id: sync::new_fence_id(),
            uid,
            sem: Arc::new(sem),
            sem_fd: fd,
            attrs: Arc::new(m),
        });
        let h = sync::register(&mut c.state(), core, want, module);
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { out.write(h as NvSciSyncObj) };
        Ok(())
    })();
    super::done(r)
}

pub(crate) unsafe fn NvSciSyncIpcExportFence(
    c: &Call,
    f: *const NvSciSyncFence,
    ep: NvSciIpcEndpoint,
    desc: *mut NvSciSyncFenceIpcExportDescriptor,
) -> NvSciError {
    let r = (|| {
        // SAFETY: forwarded caller pointer.
        let f = unsafe { get(f) }?;
        if desc.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        channel(c, ep)?;
        let d = match fence::decode(&f) {
            FenceContent::Cleared => NvSciSyncFenceIpcExportDescriptor::default(),
            FenceContent::Garbage => return Err(err::BAD_PARAMETER),
            FenceContent::Fence(sf) => {
                let st = c.state();
                let Some(rec) = st
                    .nvsci
                    .sync_objs
                    .values()
                    .find(|r| r.core.id == sf.object_id)
                else {
                    c.diag(
                        D::Misuse,
                        "fence of an object that has no NvSciSync handle here".into(),
                    );
                    return Err(err::BAD_PARAMETER);
                };
                NvSciSyncFenceIpcExportDescriptor {
                    payload: [FENCE_TAG, rec.core.uid, sf.value, 0, 0, 0, 0],
                }
            }
        };
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { desc.write(d) };
        Ok(())
    })();
    super::done(r)
}

pub(crate) unsafe fn NvSciSyncIpcImportFence(
    c: &Call,
    obj: NvSciSyncObj,
    desc: *const NvSciSyncFenceIpcExportDescriptor,
    f: *mut NvSciSyncFence,
) -> NvSciError {
    let h = obj as usize;
    let r = (|| {
        // SAFETY: forwarded caller pointer.
        let d = unsafe { get(desc) }?;
        if f.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        let st = c.state();
        let Some(rec) = st.nvsci.sync_objs.get(&h) else {
            return Err(unknown(c, &st.nvsci, "NvSciSync object", h));
        };
        let fence = if d.payload.iter().all(|w| *w == 0) {
            NvSciSyncFence::default()
        } else if d.payload[0] == FENCE_TAG && d.payload[1] == rec.core.uid {
            fence::encode(SimFence {
                object_id: rec.core.id,
                value: d.payload[2],
            })
        } else {
            c.diag(
                D::Misuse,
                "the fence descriptor belongs to another sync object".into(),
            );
            return Err(err::BAD_PARAMETER);
        };
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { f.write(fence) };
        Ok(())
    })();
    super::done(r)
}
