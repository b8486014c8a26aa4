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
//! calls `NvSciIpcDeinit`. Where the library predates the `*Safe` calls
//! (DRIVE OS 5.2.6) the same sequence runs on their older twins
//! (`NvSciIpcResetEndpoint`, `NvSciIpcGetEvent`, `NvSciIpcRead`,
//! `NvSciIpcWrite`, `NvSciIpcCloseEndpoint`).
//!
//! Messages larger than a frame are split into frames by the core's
//! [`tegra_interop_core::ipc`] codec. The receiver trusts nothing: a frame
//! that is not ours, out of order, of another message, or announcing more
//! than [`MAX_MESSAGE`] bytes is a typed [`IpcError`], never a panic or an
//! unbounded allocation.
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::ffi::CString;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tegra_interop_core::ipc::{Assembly, FrameError, Frames, FRAME_HEADER_LEN};
use tegra_interop_sys::nvsci::{
    NvSciIpcEndpoint as RawEndpoint, NvSciIpcEndpointInfo, NvSciIpcMajorVersion,
    NvSciIpcMinorVersion,
};

use super::ipc::{IpcEndpoint, IpcError};
use super::LibVersion;
use crate::ffi::{call, code, require};
use crate::{Backend, Error};

/// The largest message [`NvSciIpc`] sends or accepts (attribute-list
/// descriptors, the largest messages of the NvSci flows, are kilobytes).
pub const MAX_MESSAGE: usize = 1 << 20;

/// `NV_SCI_IPC_EVENT_*` (nvsciipc.h).
const EV_READ: u32 = 0x01;
const EV_WRITE: u32 = 0x02;
const EV_CONN_EST: u32 = 0x04;
const EV_CONN_RESET: u32 = 0x08;
const EV_WRITE_EMPTY: u32 = 0x10;

/// `NvSciError_InsufficientMemory`: the read channel is empty / the write
/// channel is full (every checked nvsciipc.h: 5.2.6, 6.0.5, 6.0.10).
const CHANNEL_EMPTY_OR_FULL: u32 = 0x30;
/// `NvSciError_TryItAgain`: the project's fact sheet names it for "no frame
/// yet"; no checked header does. Treated like an empty/full channel.
const TRY_AGAIN: u32 = 0x201;
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
        require::NvSciIpcInit(api)?;
        require::NvSciIpcDeinit(api)?;
        let key = api.NvSciIpcInit.map_or(0, |f| f as usize);
        let mut inits = INITS.lock().unwrap_or_else(|e| e.into_inner());
        match inits.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => {
                // Balanced by the Deinit of the last guard.
                call::NvSciIpcInit(api)?;
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
            // Balances the NvSciIpcInit of the first guard; every endpoint of
            // this library was closed before its guard dropped.
            let _ = call::NvSciIpcDeinit(&self.backend.table().nvsciipc);
        }
    }
}

/// Which generation of NvSciIpc calls the library has: the `*Safe` ones
/// (DRIVE OS 6.0.5 on), or the ones before them (5.2.6; deprecated, still
/// present later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Calls {
    Safe,
    Legacy,
}

impl Calls {
    fn of(api: &tegra_interop_sys::table::NvSciIpcApi) -> Result<Calls, Error> {
        let safe = [
            require::NvSciIpcResetEndpointSafe(api),
            require::NvSciIpcCloseEndpointSafe(api),
            require::NvSciIpcGetEventSafe(api),
            require::NvSciIpcReadSafe(api),
            require::NvSciIpcWriteSafe(api),
        ];
        if safe.iter().all(Result::is_ok) {
            return Ok(Calls::Safe);
        }
        let legacy = [
            require::NvSciIpcResetEndpoint(api),
            require::NvSciIpcCloseEndpoint(api),
            require::NvSciIpcGetEvent(api),
            require::NvSciIpcRead(api),
            require::NvSciIpcWrite(api),
        ];
        if legacy.iter().all(Result::is_ok) {
            return Ok(Calls::Legacy);
        }
        // Name a missing *Safe call: the current API.
        safe.into_iter()
            .find_map(Result::err)
            .map_or(Ok(Calls::Safe), Err)
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
/// frames: [`open`](Self::open) runs the init sequence of nvsciipc.h, [`IpcEndpoint::send`] /
/// [`IpcEndpoint::recv`] move messages of up to [`MAX_MESSAGE`] bytes split into frames, dropping
/// closes the endpoint (the last one of the process also deinitialises NvSciIpc).
pub struct NvSciIpc {
    backend: Arc<Backend>,
    handle: RawEndpoint,
    calls: Calls,
    /// The library reported CONN_RESET (it does so once).
    reset_seen: std::cell::Cell<bool>,
    name: String,
    event_fd: i32,
    info: EndpointInfo,
    timeout: Duration,
    next_send: u32,
    next_recv: u32,
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
    pub fn open(
        backend: &Arc<Backend>,
        name: &str,
        timeout: Duration,
    ) -> Result<NvSciIpc, IpcError> {
        let api = &backend.table().nvsciipc;
        require::NvSciIpcOpenEndpoint(api)?;
        require::NvSciIpcGetLinuxEventFd(api)?;
        require::NvSciIpcGetEndpointInfo(api)?;
        let calls = Calls::of(api)?;
        let cname = CString::new(name).map_err(|_| Error::Unsupported {
            operation: "NvSciIpc::open",
            reason: "the endpoint name contains a NUL byte",
        })?;
        let init = InitGuard::acquire(backend)?;
        let mut handle: RawEndpoint = 0;
        // SAFETY: `cname` is a NUL-terminated string alive for the call; `handle` is a local the
        // library writes one endpoint to.
        unsafe { call::NvSciIpcOpenEndpoint(api, cname.as_ptr(), &mut handle) }?;
        // From here on the endpoint is ours: `ep` closes it on every path.
        let mut ep = NvSciIpc {
            backend: Arc::clone(backend),
            handle,
            calls,
            reset_seen: std::cell::Cell::new(false),
            name: name.to_owned(),
            event_fd: -1,
            info: EndpointInfo {
                nframes: 0,
                frame_size: 0,
            },
            timeout,
            next_send: 0,
            next_recv: 0,
            _init: init,
        };
        // SAFETY: `ep.event_fd` is a field the library writes one `int` to (the fd stays the
        // endpoint's).
        unsafe { call::NvSciIpcGetLinuxEventFd(api, handle, &mut ep.event_fd) }?;
        let mut info = NvSciIpcEndpointInfo::default();
        // SAFETY: `info` is a local the library writes one endpoint-info record to.
        unsafe { call::NvSciIpcGetEndpointInfo(api, handle, &mut info) }?;
        ep.info = EndpointInfo {
            nframes: info.nframes,
            frame_size: info.frame_size,
        };
        if (info.frame_size as usize) <= FRAME_HEADER_LEN {
            return Err(IpcError::FrameTooSmall {
                frame_size: info.frame_size,
                needed: FRAME_HEADER_LEN + 1,
            });
        }
        // Once, after the event fd was asked for (nvsciipc.h's order).
        match calls {
            Calls::Safe => call::NvSciIpcResetEndpointSafe(api, handle)?,
            Calls::Legacy => call::NvSciIpcResetEndpoint(api, handle)?,
        }
        let deadline = Instant::now() + timeout;
        ep.wait_for(EV_CONN_EST, deadline, "the peer to connect")?;
        Ok(ep)
    }

    /// The NvSciIpc version the project's declarations follow (the
    /// nvsciipc.h of DRIVE OS 6.0.10: 1.4): what a program built on these
    /// bindings would pass to [`check_version_compatibility`](Self::check_version_compatibility).
    pub const DECLARED_VERSION: LibVersion =
        LibVersion::new(NvSciIpcMajorVersion, NvSciIpcMinorVersion);

    /// Asks the loaded NvSciIpc library whether it serves a program that
    /// needs NvSciIpc `version` (`NvSciIpcCheckVersionCompatibility`):
    /// `true` when the library has the same major version and a minor of
    /// at least `version.minor`. Pass [`DECLARED_VERSION`](Self::DECLARED_VERSION),
    /// or the version a peer says it was built for. It needs no
    /// `NvSciIpcInit` and no endpoint.
    ///
    /// Errors, before any call: [`Error::NotInLibraryVersion`] where the
    /// library predates the call (it arrived with NvSciIpc 1.0, DRIVE OS
    /// 6.0.5; the 5.2.6 library has no version, reported as
    /// [`LibVersion::UNVERSIONED`]); [`Error::NotSupported`] when no NvSciIpc
    /// library is loaded at all. Otherwise the library's own error, kept
    /// in [`Error::NvSci`].
    pub fn check_version_compatibility(
        backend: &Backend,
        version: LibVersion,
    ) -> Result<bool, Error> {
        let api = &backend.table().nvsciipc;
        if api.NvSciIpcCheckVersionCompatibility.is_none() {
            if api.NvSciIpcInit.is_none() {
                // No NvSciIpc library at all: the missing symbol, with the
                // loader's reason where there is one.
                require::NvSciIpcCheckVersionCompatibility(api)?;
            }
            crate::logging::debug!(
                target: crate::logging::NVSCI,
                "NvSciIpc unversioned lacks NvSciIpcCheckVersionCompatibility (needs 1.0, DRIVE OS 6.0.5): NotInLibraryVersion"
            );
            return Err(Error::NotInLibraryVersion {
                item: "NvSciIpcCheckVersionCompatibility",
                library: "NvSciIpc",
                needed: "1.0 (DRIVE OS 6.0.5)",
                loaded: LibVersion::UNVERSIONED,
            });
        }
        let mut compatible = false;
        // SAFETY: `compatible` is a live, writable bool for the call; the
        // version numbers are plain values.
        unsafe {
            call::NvSciIpcCheckVersionCompatibility(
                api,
                version.major,
                version.minor,
                &mut compatible,
            )
        }?;
        Ok(compatible)
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

    /// Waits until the peer has read every frame sent (the WRITE_EMPTY
    /// event nvsciipc.h offers for this), at most the endpoint's timeout.
    ///
    /// Call it before dropping an endpoint whose last message matters: once
    /// the peer's library reports the close (CONN_RESET), frames it had not
    /// read yet are gone.
    pub fn flush(&mut self) -> Result<(), IpcError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let ev = self.events()?;
            // Everything was read, even if the peer closed right after.
            if ev & EV_WRITE_EMPTY != 0 {
                return Ok(());
            }
            if ev & EV_CONN_RESET != 0 {
                return Err(self.reset_error());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.timeout_error("the peer to read every frame sent"));
            }
            crate::fd::poll_readable(self.event_fd, (deadline - now).min(Duration::from_secs(1)));
        }
    }

    /// The typed timeout of this endpoint, waiting for `what`.
    fn timeout_error(&self, waiting_for: &'static str) -> IpcError {
        IpcError::Timeout {
            endpoint: self.name.clone(),
            waited: self.timeout,
            waiting_for,
        }
    }

    /// [`flush`](Self::flush), then closes the endpoint.
    pub fn close(mut self) -> Result<(), IpcError> {
        self.flush()
    }

    fn events(&self) -> Result<u32, IpcError> {
        let mut ev = 0u32;
        let api = &self.backend.table().nvsciipc;
        match self.calls {
            // SAFETY: `ev` is a local the library writes one `u32` to; the endpoint is open (ours
            // until drop).
            Calls::Safe => unsafe { call::NvSciIpcGetEventSafe(api, self.handle, &mut ev) }?,
            // SAFETY: as above.
            Calls::Legacy => unsafe { call::NvSciIpcGetEvent(api, self.handle, &mut ev) }?,
        }
        if ev & EV_CONN_RESET != 0 {
            // Reported once by the library: remembered here.
            self.reset_seen.set(true);
        }
        Ok(ev)
    }

    /// Waits until one of `want` is reported; a reset connection is
    /// [`IpcError::ConnectionReset`], the deadline passing a timeout saying
    /// it waited for `what`.
    fn wait_for(&self, want: u32, deadline: Instant, what: &'static str) -> Result<u32, IpcError> {
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
                // The open's wait (before `self.timeout` may have changed).
                return Err(self.timeout_error(what));
            }
            // The library's event fd lives as long as the endpoint.
            crate::fd::poll_readable(self.event_fd, (deadline - now).min(Duration::from_secs(1)));
        }
    }

    /// Whether the connection still stands: `Err(ConnectionReset)` once the
    /// peer closed, reset or died (checked without reading any frame). For
    /// a side that waits on something else (a fence the peer should
    /// signal) and must notice the peer going away.
    pub fn check_connection(&self) -> Result<(), IpcError> {
        if !self.reset_seen.get() {
            self.events()?;
        }
        if self.reset_seen.get() {
            return Err(self.reset_error());
        }
        Ok(())
    }

    fn reset_error(&self) -> IpcError {
        IpcError::ConnectionReset {
            endpoint: self.name.clone(),
        }
    }

    /// One frame operation: waits for `event` (nvsciipc.h: check the
    /// events before every read and write), then runs `op`; a reset is
    /// [`IpcError::ConnectionReset`]. An empty/full answer waits again, the
    /// deadline checked on every round: a library that reports the event
    /// yet answers "full" (or "empty") is retried after a pause that grows
    /// from 1 ms to 50 ms, never in a spin, and the wait ends with a
    /// timeout saying it waited for `waiting_for`.
    fn transfer(
        &self,
        event: u32,
        deadline: Instant,
        call: &'static str,
        waiting_for: &'static str,
        mut op: impl FnMut() -> Result<tegra_interop_sys::nvsci::NvSciError, Error>,
    ) -> Result<(), IpcError> {
        let mut pause = Duration::from_millis(1);
        loop {
            self.wait_for(event, deadline, waiting_for)?;
            let r = op()?;
            match r.0 {
                0 => return Ok(()),
                CHANNEL_EMPTY_OR_FULL | TRY_AGAIN => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(self.timeout_error(waiting_for));
                    }
                    std::thread::sleep(pause.min(deadline - now));
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                CONNECTION_RESET => return Err(self.reset_error()),
                _ => return Err(failed(call, r)),
            }
        }
    }

    fn write_frame(&self, frame: &[u8], deadline: Instant) -> Result<(), IpcError> {
        let api = &self.backend.table().nvsciipc;
        let len = u32::try_from(frame.len()).map_err(|_| IpcError::Malformed("frame length"))?;
        let (h, p) = (self.handle, frame.as_ptr().cast());
        let waiting_for = "room in the write channel (the peer has not read what was sent)";
        self.transfer(EV_WRITE, deadline, "NvSciIpcWriteSafe", waiting_for, || {
            match self.calls {
                // SAFETY: `p` points to `frame`, `len` readable bytes alive for the call; the byte
                // count goes to a temporary.
                Calls::Safe => unsafe { code::NvSciIpcWriteSafe(api, h, p, len, &mut 0u32) },
                // SAFETY: `p` points to `frame`, `frame.len()` readable bytes alive for the call;
                // the byte count goes to a temporary.
                Calls::Legacy => unsafe { code::NvSciIpcWrite(api, h, p, frame.len(), &mut 0i32) },
            }
        })
    }

    fn read_frame(&self, buf: &mut [u8], deadline: Instant) -> Result<(), IpcError> {
        let api = &self.backend.table().nvsciipc;
        let len = u32::try_from(buf.len()).map_err(|_| IpcError::Malformed("frame length"))?;
        let (h, size, p) = (self.handle, buf.len(), buf.as_mut_ptr().cast());
        let waiting_for = "a frame from the peer";
        self.transfer(
            EV_READ,
            deadline,
            "NvSciIpcReadSafe",
            waiting_for,
            || match self.calls {
                // SAFETY: `p` points to `buf`, `len` writable bytes alive for the call; the byte count
                // goes to a temporary.
                Calls::Safe => unsafe { code::NvSciIpcReadSafe(api, h, p, len, &mut 0u32) },
                // SAFETY: `p` points to `buf`, `size` writable bytes alive for the call; the byte count
                // goes to a temporary.
                Calls::Legacy => unsafe { code::NvSciIpcRead(api, h, p, size, &mut 0i32) },
            },
        )
    }
}

/// The typed error of a failed call.
fn failed(call: &'static str, code: tegra_interop_sys::nvsci::NvSciError) -> IpcError {
    IpcError::Driver(Error::NvSci {
        call,
        code: tegra_interop_core::NvSciError(code.0),
    })
}

impl From<FrameError> for IpcError {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::TooLarge { len, max } => IpcError::TooLarge {
                len: len as usize,
                max: max as usize,
            },
            other => IpcError::Frame(other),
        }
    }
}

// SAFETY: `handle` is the endpoint this value opened with
// `NvSciIpcOpenEndpoint` and closes only on drop, through its backend's table.
unsafe impl IpcEndpoint for NvSciIpc {
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
        let mut buf = vec![0u8; self.info.frame_size as usize];
        for f in Frames::new(message, self.next_send, buf.len()) {
            let n = f.write_to(&mut buf)?;
            self.write_frame(&buf[..n], deadline)?;
        }
        self.next_send = self.next_send.wrapping_add(1);
        Ok(())
    }

    fn recv(&mut self) -> Result<Vec<u8>, IpcError> {
        let deadline = Instant::now() + self.timeout;
        let mut buf = vec![0u8; self.info.frame_size as usize];
        let mut assembly = Assembly::new(self.next_recv, MAX_MESSAGE as u32);
        let mut message = Vec::new();
        loop {
            self.read_frame(&mut buf, deadline)?;
            let chunk = assembly.accept(&buf)?;
            if message.is_empty() {
                // The announced length is checked against MAX_MESSAGE.
                message.reserve_exact(chunk.total);
            }
            message.extend_from_slice(chunk.bytes);
            if assembly.is_complete() {
                self.next_recv = self.next_recv.wrapping_add(1);
                return Ok(message);
            }
        }
    }
}

/// Closes the endpoint at once (`NvSciIpcCloseEndpointSafe`), without
/// waiting for the peer to read what was sent: see [`NvSciIpc::close`].
impl Drop for NvSciIpc {
    fn drop(&mut self) {
        // Opened by us, closed once; its event fd is not used after.
        let api = &self.backend.table().nvsciipc;
        let _ = match self.calls {
            Calls::Safe => call::NvSciIpcCloseEndpointSafe(api, self.handle, false),
            Calls::Legacy => call::NvSciIpcCloseEndpoint(api, self.handle),
        };
        // `_init` drops after this: the last endpoint's guard deinitialises.
    }
}
