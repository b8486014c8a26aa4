//! The NvSciIpc entry points over the simulator's endpoints
//! ([`super::endpoint`]).

use std::path::PathBuf;
use std::sync::Arc;

use tegra_interop_sys::nvsci::{NvSciError, NvSciIpcEndpoint, NvSciIpcEndpointInfo};

use super::config::{event, Backend, IpcTable, DEFAULT_CONFIG, MAX_NAME};
use super::endpoint::{lock, Endpoint};
use super::wire::{header, send, Kind};
use crate::cmem::{CMut, CPtr};
use crate::instance::Call;
use crate::nvsci::{err, R};
use crate::DiagnosticKind as D;
use std::os::fd::AsRawFd;

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

pub(crate) fn NvSciIpcOpenEndpoint(
    c: &Call,
    name: CPtr<std::ffi::c_char>,
    out: CMut<NvSciIpcEndpoint>,
) -> NvSciError {
    if name.is_null() || out.is_null() {
        return err::BAD_PARAMETER;
    }
    let Some(name) = name.c_str() else {
        return err::BAD_PARAMETER;
    };
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
    out.write(h);
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

pub(crate) fn NvSciIpcGetLinuxEventFd(c: &Call, h: NvSciIpcEndpoint, fd: CMut<i32>) -> NvSciError {
    let e = match endpoint(c, h) {
        Ok(e) => e,
        Err(code) => return code,
    };
    if fd.is_null() {
        return err::BAD_PARAMETER;
    }
    lock(&e.conn).fd_asked = true;
    fd.write(e.epoll.as_raw_fd());
    err::SUCCESS
}

pub(crate) fn NvSciIpcGetEndpointInfo(
    c: &Call,
    h: NvSciIpcEndpoint,
    info: CMut<NvSciIpcEndpointInfo>,
) -> NvSciError {
    let e = match endpoint(c, h) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let v = NvSciIpcEndpointInfo {
        nframes: e.cfg.nframes,
        frame_size: e.cfg.frame_size,
    };
    if info.write(v) {
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

pub(crate) fn NvSciIpcGetEventSafe(c: &Call, h: NvSciIpcEndpoint, events: CMut<u32>) -> NvSciError {
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
        // Events are those that occurred since the last call: the write
        // FIFO had emptied before the reset.
        if k.empty_at_loss {
            ev |= event::WRITE_EMPTY;
        }
    } else if k.established && !k.lost {
        if !k.frames.is_empty() {
            ev |= event::READ;
        }
        if e.write_room(&k) {
            ev |= event::WRITE;
        }
        if k.outstanding == 0 {
            ev |= event::WRITE_EMPTY;
        }
    }
    drop(k);
    events.write(ev);
    err::SUCCESS
}

pub(crate) fn NvSciIpcReadSafe(
    c: &Call,
    h: NvSciIpcEndpoint,
    buf: Option<&mut [u8]>,
    size: u32,
    bytes: CMut<u32>,
) -> NvSciError {
    let e = match ready(c, h, "NvSciIpcReadSafe") {
        Ok(e) => e,
        Err(code) => return code,
    };
    let Some(buf) = buf.filter(|_| !bytes.is_null() && size != 0 && size <= e.frame_size()) else {
        return err::BAD_PARAMETER;
    };
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
    // The buffer holds `size` bytes (`crate::abi`), so at least `n`.
    buf[..n].copy_from_slice(&frame[..n]);
    bytes.write(n as u32);
    err::SUCCESS
}

pub(crate) fn NvSciIpcWriteSafe(
    c: &Call,
    h: NvSciIpcEndpoint,
    buf: Option<&[u8]>,
    size: u32,
    bytes: CMut<u32>,
) -> NvSciError {
    let e = match ready(c, h, "NvSciIpcWriteSafe") {
        Ok(e) => e,
        Err(code) => return code,
    };
    // `buf` holds `size` bytes (`crate::abi`).
    let Some(data) = buf.filter(|_| !bytes.is_null() && size != 0 && size <= e.frame_size()) else {
        return err::BAD_PARAMETER;
    };
    let mut k = lock(&e.conn);
    e.pump(&mut k);
    if !k.established || k.lost {
        return err::CONNECTION_RESET;
    }
    // Full: `nframes` unread at the peer, or the socket holds what it may
    // (the same rule as the WRITE event).
    if !e.write_room(&k) {
        return err::INSUFFICIENT_MEMORY;
    }
    let Some(sock) = &k.sock else {
        return err::CONNECTION_RESET;
    };
    match send(sock, &header(Kind::Frame, 0), data, None) {
        Ok(()) => k.write_blocked = false,
        // Full after all (only where the kernel does not report its queue).
        Err(x) if x.raw_os_error() == Some(libc::EAGAIN) => {
            k.write_blocked = true;
            return err::INSUFFICIENT_MEMORY;
        }
        Err(x) => {
            e.lose(&mut k, format!("sending to the peer failed: {x}"));
            return err::CONNECTION_RESET;
        }
    }
    k.outstanding += 1;
    drop(k);
    bytes.write(size);
    err::SUCCESS
}

// ------------------------------------------------------------ the legacy calls
//
// The life cycle before the `*Safe` calls (DRIVE OS 5.2.6, where they are the
// only ones; deprecated but present later): each behaves as its `*Safe` twin,
// with the old types (a void reset, `size_t` sizes, `int32_t` counts).

pub(crate) fn NvSciIpcResetEndpoint(c: &Call, h: NvSciIpcEndpoint) {
    let r = NvSciIpcResetEndpointSafe(c, h);
    if r != err::SUCCESS {
        c.diag(
            D::Misuse,
            format!("NvSciIpcResetEndpoint on {h:#x} failed with {:#x} (void: the caller cannot see it)", r.0),
        );
    }
}

pub(crate) fn NvSciIpcGetEvent(c: &Call, h: NvSciIpcEndpoint, events: CMut<u32>) -> NvSciError {
    NvSciIpcGetEventSafe(c, h, events)
}

/// The legacy read or write: `size_t` size and `int32_t` count around the
/// `*Safe` twin `safe`.
fn legacy(
    size: usize,
    bytes: CMut<i32>,
    safe: impl FnOnce(u32, CMut<u32>) -> NvSciError,
) -> NvSciError {
    let Ok(size) = u32::try_from(size) else {
        return err::BAD_PARAMETER;
    };
    if bytes.is_null() {
        return err::BAD_PARAMETER;
    }
    let mut n = 0u32;
    let r = safe(size, CMut::from_mut(&mut n));
    if r == err::SUCCESS {
        bytes.write(i32::try_from(n).unwrap_or(i32::MAX));
    }
    r
}

pub(crate) fn NvSciIpcRead(
    c: &Call,
    h: NvSciIpcEndpoint,
    buf: Option<&mut [u8]>,
    size: usize,
    bytes: CMut<i32>,
) -> NvSciError {
    legacy(size, bytes, |size, n| NvSciIpcReadSafe(c, h, buf, size, n))
}

pub(crate) fn NvSciIpcWrite(
    c: &Call,
    h: NvSciIpcEndpoint,
    buf: Option<&[u8]>,
    size: usize,
    bytes: CMut<i32>,
) -> NvSciError {
    legacy(size, bytes, |size, n| NvSciIpcWriteSafe(c, h, buf, size, n))
}
