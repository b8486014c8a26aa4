//! NvSciIpc endpoints: the life cycle `nvsciipc.h` documents, and a message
//! channel on top of the endpoint's fixed-size frames.
//!
//! [`NvSciIpc::open`] runs the documented init sequence: `NvSciIpcInit`
//! (once per process, reference-counted here because the library promises
//! no count of its own), `NvSciIpcOpenEndpoint`, `NvSciIpcGetLinuxEventFd`,
//! `NvSciIpcGetEndpointInfo`, `NvSciIpcResetEndpointSafe` once, then
//! `NvSciIpcGetEventSafe` + `poll` on the event fd until the connection is
//! established. Every read and write checks the events first, as the
//! header requires. Dropping the endpoint closes it
//! (`NvSciIpcCloseEndpointSafe`), and the last endpoint of the process
//! calls `NvSciIpcDeinit`.
//!
//! Messages larger than a frame are split: each frame carries a 16-byte
//! header (`"TIMF"`, message sequence number, total length, offset) and a
//! chunk. The receiver trusts nothing: a frame that is not ours, out of
//! order, of another message, or announcing more than [`MAX_MESSAGE`] bytes
//! is a typed [`IpcError`], never a panic or an unbounded allocation.

use std::ffi::CString;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tegra_interop_sys::nvsci::{NvSciIpcEndpoint as RawEndpoint, NvSciIpcEndpointInfo};

use super::ipc::{IpcEndpoint, IpcError};
use super::check;
use crate::{Backend, Error};

/// The largest message [`NvSciIpc`] sends or accepts (attribute-list
/// descriptors, the largest messages of the NvSci flows, are kilobytes).
pub const MAX_MESSAGE: usize = 1 << 20;

/// Bytes of the header each frame carries.
const FRAME_HEADER: usize = 16;
const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"TIMF");

/// `NV_SCI_IPC_EVENT_*` (nvsciipc.h).
const EV_READ: u32 = 0x01;
const EV_WRITE: u32 = 0x02;
const EV_CONN_EST: u32 = 0x04;
const EV_CONN_RESET: u32 = 0x08;

/// `NvSciError_InsufficientMemory`: the read channel is empty / the write
/// channel is full (nvsciipc.h).
const CHANNEL_EMPTY_OR_FULL: u32 = 0x30;
/// `NvSciError_ConnectionReset`.
const CONNECTION_RESET: u32 = 0x1200;

/// Process-wide `NvSciIpcInit` counts, one per loaded library (keyed by
/// the address of its `NvSciIpcInit`).
static INITS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// One use of `NvSciIpcInit`; the last one dropped calls `NvSciIpcDeinit`.
struct InitGuard {
    backend: Arc<Backend>,
    key: usize,
}

impl InitGuard {
    fn acquire(backend: &Arc<Backend>) -> Result<InitGuard, Error> {
        let api = &backend.table().nvsciipc;
        let init = need!(api, NvSciIpcInit);
        need!(api, NvSciIpcDeinit);
        let key = init as usize;
        let mut inits = INITS.lock().unwrap_or_else(|e| e.into_inner());
        match inits.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => {
                // SAFETY: no arguments; balanced by the Deinit of the last guard.
                check("NvSciIpcInit", unsafe { init() })?;
                inits.push((key, 1));
            }
        }
        Ok(InitGuard {
            backend: Arc::clone(backend),
            key,
        })
    }
}

impl Drop for InitGuard {
    fn drop(&mut self) {
        let mut inits = INITS.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = inits.iter().position(|(k, _)| *k == self.key) else {
            return;
        };
        inits[i].1 -= 1;
        if inits[i].1 == 0 {
            inits.swap_remove(i);
            if let Some(deinit) = self.backend.table().nvsciipc.NvSciIpcDeinit {
                // SAFETY: balances the NvSciIpcInit of the first guard; every
                // endpoint of this library was closed before its guard dropped.
                unsafe { deinit() };
            }
        }
    }
}

/// The geometry of an endpoint's channel (`NvSciIpcGetEndpointInfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// Frames the channel holds.
    pub nframes: u32,
    /// Bytes per frame.
    pub frame_size: u32,
}

/// An open, connected NvSciIpc endpoint and a message channel over its
/// frames. See the [module docs](self).
pub struct NvSciIpc {
    backend: Arc<Backend>,
    handle: RawEndpoint,
    name: String,
    event_fd: i32,
    info: EndpointInfo,
    timeout: Duration,
    next_send: u32,
    next_recv: u32,
    /// Frames of a message not yet complete: (sequence, total, bytes).
    partial: Option<(u32, usize, Vec<u8>)>,
    /// Dropped after the endpoint closed (field order).
    _init: InitGuard,
}

impl fmt::Debug for NvSciIpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NvSciIpc")
            .field("name", &self.name)
            .field("handle", &self.handle)
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl NvSciIpc {
    /// Opens the endpoint `name` (one of the BSP's configured names) and
    /// waits at most `timeout` for the peer to connect.
    ///
    /// Fails with [`IpcError::Driver`] for the library's refusals (an
    /// unknown name is `NoSuchEntry`, an endpoint open elsewhere `Busy`),
    /// [`IpcError::Timeout`] when the peer does not come, and
    /// [`IpcError::FrameTooSmall`] for a channel whose frames cannot hold
    /// this channel's frame header. Nothing stays open on an error.
    pub fn open(backend: &Arc<Backend>, name: &str, timeout: Duration) -> Result<NvSciIpc, IpcError> {
        let api = &backend.table().nvsciipc;
        let open = need!(api, NvSciIpcOpenEndpoint);
        let get_fd = need!(api, NvSciIpcGetLinuxEventFd);
        let get_info = need!(api, NvSciIpcGetEndpointInfo);
        let reset = need!(api, NvSciIpcResetEndpointSafe);
        need!(api, NvSciIpcCloseEndpointSafe);
        need!(api, NvSciIpcGetEventSafe);
        need!(api, NvSciIpcReadSafe);
        need!(api, NvSciIpcWriteSafe);
        let cname = CString::new(name).map_err(|_| Error::Unsupported {
            operation: "NvSciIpc::open",
            reason: "the endpoint name contains a NUL byte",
        })?;
        let init = InitGuard::acquire(backend)?;
        let mut handle: RawEndpoint = 0;
        // SAFETY: a NUL-terminated name and a valid out-pointer.
        check("NvSciIpcOpenEndpoint", unsafe { open(cname.as_ptr(), &mut handle) })?;
        // From here on the endpoint is ours: `ep` closes it on every path.
        let mut ep = NvSciIpc {
            backend: Arc::clone(backend),
            handle,
            name: name.to_owned(),
            event_fd: -1,
            info: EndpointInfo {
                nframes: 0,
                frame_size: 0,
            },
            timeout,
            next_send: 0,
            next_recv: 0,
            partial: None,
            _init: init,
        };
        // SAFETY: an open endpoint and a valid out-pointer.
        check("NvSciIpcGetLinuxEventFd", unsafe { get_fd(handle, &mut ep.event_fd) })?;
        let mut info = NvSciIpcEndpointInfo::default();
        // SAFETY: an open endpoint and a valid out-pointer.
        check("NvSciIpcGetEndpointInfo", unsafe { get_info(handle, &mut info) })?;
        ep.info = EndpointInfo {
            nframes: info.nframes,
            frame_size: info.frame_size,
        };
        if (info.frame_size as usize) <= FRAME_HEADER {
            return Err(IpcError::FrameTooSmall {
                frame_size: info.frame_size,
                needed: FRAME_HEADER + 1,
            });
        }
        // SAFETY: an open endpoint whose event fd was asked for; once.
        check("NvSciIpcResetEndpointSafe", unsafe { reset(handle) })?;
        let deadline = Instant::now() + timeout;
        ep.wait_for(EV_CONN_EST, deadline)?;
        Ok(ep)
    }

    /// The endpoint's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Frames and frame size of the channel.
    pub fn info(&self) -> EndpointInfo {
        self.info
    }

    /// How long a send or receive waits for the peer (default: the open
    /// timeout).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn events(&self) -> Result<u32, IpcError> {
        let get = need!(self.backend.table().nvsciipc, NvSciIpcGetEventSafe);
        let mut ev = 0u32;
        // SAFETY: an open, reset endpoint and a valid out-pointer.
        check("NvSciIpcGetEventSafe", unsafe { get(self.handle, &mut ev) })?;
        Ok(ev)
    }

    /// Waits until one of `want` is reported; a reset connection is
    /// [`IpcError::ConnectionReset`].
    fn wait_for(&self, want: u32, deadline: Instant) -> Result<u32, IpcError> {
        loop {
            let ev = self.events()?;
            if ev & EV_CONN_RESET != 0 {
                return Err(IpcError::ConnectionReset {
                    endpoint: self.name.clone(),
                });
            }
            if ev & want != 0 {
                return Ok(ev);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(IpcError::Timeout {
                    endpoint: self.name.clone(),
                    waited: self.timeout,
                });
            }
            let ms = (deadline - now).as_millis().clamp(1, 1000) as libc::c_int;
            let mut pfd = libc::pollfd {
                fd: self.event_fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd on the library's event fd, which lives
            // as long as the endpoint.
            unsafe { libc::poll(&mut pfd, 1, ms) };
        }
    }

    fn reset_error(&self) -> IpcError {
        IpcError::ConnectionReset {
            endpoint: self.name.clone(),
        }
    }

    fn write_frame(&self, frame: &[u8], deadline: Instant) -> Result<(), IpcError> {
        let write = need!(self.backend.table().nvsciipc, NvSciIpcWriteSafe);
        let len = u32::try_from(frame.len()).map_err(|_| IpcError::Malformed("frame length"))?;
        loop {
            self.wait_for(EV_WRITE, deadline)?;
            let mut n = 0u32;
            // SAFETY: `frame` holds `len` readable bytes; valid out-pointer.
            let code = unsafe { write(self.handle, frame.as_ptr().cast(), len, &mut n) };
            match code.0 {
                0 => return Ok(()),
                CHANNEL_EMPTY_OR_FULL => continue,
                CONNECTION_RESET => return Err(self.reset_error()),
                _ => return Err(failed("NvSciIpcWriteSafe", code)),
            }
        }
    }

    fn read_frame(&self, buf: &mut [u8], deadline: Instant) -> Result<(), IpcError> {
        let read = need!(self.backend.table().nvsciipc, NvSciIpcReadSafe);
        let len = u32::try_from(buf.len()).map_err(|_| IpcError::Malformed("frame length"))?;
        loop {
            let mut n = 0u32;
            // SAFETY: `buf` has room for `len` bytes; valid out-pointer.
            let code = unsafe { read(self.handle, buf.as_mut_ptr().cast(), len, &mut n) };
            match code.0 {
                0 => return Ok(()),
                CHANNEL_EMPTY_OR_FULL => {
                    self.wait_for(EV_READ, deadline)?;
                }
                CONNECTION_RESET => return Err(self.reset_error()),
                _ => return Err(failed("NvSciIpcReadSafe", code)),
            }
        }
    }
}

/// The typed error of a failed call.
fn failed(call: &'static str, code: tegra_interop_sys::nvsci::NvSciError) -> IpcError {
    IpcError::Driver(Error::NvSci {
        call,
        code: tegra_interop_core::NvSciError(code.0),
    })
}

fn word(b: &[u8], i: usize) -> u32 {
    let mut w = [0u8; 4];
    if let Some(s) = b.get(i * 4..i * 4 + 4) {
        w.copy_from_slice(s);
    }
    u32::from_le_bytes(w)
}

/// Checks one received frame against the message in progress and appends
/// its chunk; `Some(message)` when complete. Public to the crate for the
/// fuzz target's sake.
pub(crate) fn accept_frame(
    frame: &[u8],
    expected_seq: u32,
    partial: &mut Option<(u32, usize, Vec<u8>)>,
) -> Result<Option<Vec<u8>>, IpcError> {
    if frame.len() <= FRAME_HEADER {
        return Err(IpcError::Malformed("a frame shorter than its header"));
    }
    if word(frame, 0) != FRAME_MAGIC {
        return Err(IpcError::Malformed("a frame that is not a message frame"));
    }
    let (seq, total, offset) = (word(frame, 1), word(frame, 2) as usize, word(frame, 3) as usize);
    if total > MAX_MESSAGE {
        return Err(IpcError::TooLarge {
            len: total,
            max: MAX_MESSAGE,
        });
    }
    if seq != expected_seq {
        return Err(IpcError::Malformed("a frame of another message (out of order)"));
    }
    let cap = frame.len() - FRAME_HEADER;
    match partial {
        None if offset == 0 => *partial = Some((seq, total, Vec::with_capacity(total))),
        Some((s, t, got)) if *s == seq && *t == total && got.len() == offset => {}
        _ => return Err(IpcError::Malformed("a frame at the wrong offset (out of order)")),
    }
    let Some((_, _, got)) = partial.as_mut() else {
        return Err(IpcError::Malformed("no message in progress"));
    };
    let chunk = cap.min(total - offset);
    got.extend_from_slice(&frame[FRAME_HEADER..FRAME_HEADER + chunk]);
    if got.len() == total {
        return Ok(partial.take().map(|(_, _, m)| m));
    }
    Ok(None)
}

/// The frames of `message` with sequence number `seq`, `frame_size` bytes
/// each (the last one may be shorter).
pub(crate) fn frames(message: &[u8], seq: u32, frame_size: usize) -> Vec<Vec<u8>> {
    let cap = frame_size.saturating_sub(FRAME_HEADER).max(1);
    let total = message.len() as u32;
    let mut out = Vec::new();
    let mut offset = 0usize;
    loop {
        let chunk = cap.min(message.len() - offset);
        let mut f = Vec::with_capacity(FRAME_HEADER + chunk);
        for w in [FRAME_MAGIC, seq, total, offset as u32] {
            f.extend_from_slice(&w.to_le_bytes());
        }
        f.extend_from_slice(&message[offset..offset + chunk]);
        out.push(f);
        offset += chunk;
        if offset >= message.len() {
            return out;
        }
    }
}

impl IpcEndpoint for NvSciIpc {
    fn handle(&self) -> RawEndpoint {
        self.handle
    }

    fn send(&mut self, message: &[u8]) -> Result<(), IpcError> {
        if message.len() > MAX_MESSAGE {
            return Err(IpcError::TooLarge {
                len: message.len(),
                max: MAX_MESSAGE,
            });
        }
        let deadline = Instant::now() + self.timeout;
        for f in frames(message, self.next_send, self.info.frame_size as usize) {
            self.write_frame(&f, deadline)?;
        }
        self.next_send = self.next_send.wrapping_add(1);
        Ok(())
    }

    fn recv(&mut self) -> Result<Vec<u8>, IpcError> {
        let deadline = Instant::now() + self.timeout;
        let mut buf = vec![0u8; self.info.frame_size as usize];
        loop {
            self.read_frame(&mut buf, deadline)?;
            if let Some(m) = accept_frame(&buf, self.next_recv, &mut self.partial)? {
                self.next_recv = self.next_recv.wrapping_add(1);
                return Ok(m);
            }
        }
    }
}

impl Drop for NvSciIpc {
    fn drop(&mut self) {
        if let Some(close) = self.backend.table().nvsciipc.NvSciIpcCloseEndpointSafe {
            // SAFETY: opened by us, closed once; its event fd is not used after.
            let _ = unsafe { close(self.handle, false) };
        }
        // `_init` drops after this: the last endpoint's guard deinitialises.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_split_and_reassemble() {
        for (len, fs) in [(0usize, 17usize), (1, 17), (100, 20), (4096, 64), (10, 4096)] {
            let msg: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut partial = None;
            let fr = frames(&msg, 7, fs);
            let mut out = None;
            for (i, mut f) in fr.into_iter().enumerate() {
                f.resize(fs, 0);
                let r = accept_frame(&f, 7, &mut partial).unwrap();
                if r.is_some() {
                    out = r;
                    assert!(partial.is_none(), "frame {i}");
                }
            }
            assert_eq!(out.as_deref(), Some(&msg[..]), "len {len} frame {fs}");
        }
    }

    #[test]
    fn untrusted_frames_are_typed_errors() {
        let msg = vec![9u8; 100];
        let fr = frames(&msg, 3, 32);
        let mut p = None;
        assert!(matches!(accept_frame(&fr[0], 4, &mut p), Err(IpcError::Malformed(_))));
        let mut p = None;
        assert!(matches!(accept_frame(&fr[1], 3, &mut p), Err(IpcError::Malformed(_))), "no start");
        let mut p = None;
        accept_frame(&fr[0], 3, &mut p).unwrap();
        assert!(matches!(accept_frame(&fr[2], 3, &mut p), Err(IpcError::Malformed(_))), "gap");
        let mut big = fr[0].clone();
        big[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(accept_frame(&big, 3, &mut None), Err(IpcError::TooLarge { .. })));
        assert!(matches!(accept_frame(&[0u8; 32], 3, &mut None), Err(IpcError::Malformed(_))));
        assert!(matches!(accept_frame(&[0u8; 4], 3, &mut None), Err(IpcError::Malformed(_))));
    }
}
