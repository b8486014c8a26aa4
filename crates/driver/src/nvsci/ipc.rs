//! Sharing NvSci objects and fences with another process.
//!
//! NvSci exports produce descriptors bound to an NvSciIpc endpoint (the
//! library makes the object reachable for the peer of that endpoint); the
//! descriptor bytes then travel to the peer, which imports them on its end.
//! [`IpcEndpoint`] is both: the endpoint handle and a message channel for
//! the descriptor bytes. [`NvSciIpc`](super::NvSciIpc) is the real one: a
//! named NvSciIpc endpoint whose frames carry the messages.
//!
//! The sequence the libraries require across processes: the waiter (or
//! consumer) sends its unreconciled lists ([`SyncModule::send_unreconciled`],
//! [`BufModule::send_unreconciled`]); the signaller (producer) receives them
//! over the same endpoint, reconciles them with its own, allocates, and
//! sends the object ([`SyncObj::send`], [`BufObj::send`]: the reconciled
//! list, then the object's descriptor); the waiter imports both
//! ([`SyncModule::receive_obj`], [`BufModule::receive_obj`]). An object can
//! only go back over an endpoint a peer's unreconciled list came by.
//!
//! Imports check permissions: the library refuses a handle weaker than the
//! importer asks for, and the imported handle's `ActualPerm` is checked
//! again here ([`IpcError::BufPermission`] / [`IpcError::SyncPermission`]).
//!
//! The peer is not trusted. What it sends reaches the libraries only through
//! their import calls, which validate it: a descriptor that does not match
//! the memory that came with it, or a list carrying keys only the library
//! may set, is refused, and the receive returns that refusal as
//! [`IpcError::Driver`] (the raw `NvSciError` inside); an export while the
//! peer has not taken the earlier ones is refused the same way (no room).
//! After a refusal the two sides' messages may be out of step: close the
//! endpoint, which also releases what the peer had sent.
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::ffi::c_void;
use std::fmt;
use std::io;
use std::ptr;

use tegra_interop_sys::nvsci::{
    NvSciBufAttrList, NvSciBufAttrValAccessPerm, NvSciBufObj, NvSciBufObjIpcExportDescriptor,
    NvSciIpcEndpoint, NvSciSyncAccessPerm, NvSciSyncAttrList, NvSciSyncFenceIpcExportDescriptor,
    NvSciSyncObj, NvSciSyncObjIpcExportDescriptor,
};

use super::buf::{BufAttrList, BufModule, BufObj, BufPerm};
use super::common::AttrList;
use super::sync::{Fence, SyncAttrList, SyncModule, SyncObj, SyncPerm};
use super::Timeout;
use crate::ffi::{call, require};
use crate::Error;

/// One end of an NvSciIpc connection: the endpoint handle NvSci exports and
/// imports are bound to, plus a channel for the descriptor bytes.
///
/// [`NvSciIpc`](super::NvSciIpc) implements it; a wrapper around one (to
/// count or log messages) forwards [`handle`](Self::handle) to it.
///
/// # Safety
/// The driver passes [`handle`](Self::handle) to the NvSci libraries as an
/// endpoint. It must return an endpoint opened with `NvSciIpcOpenEndpoint`
/// through the table of the backend the objects and modules used with it
/// belong to, open (not closed or reset) for as long as the value lives,
/// and the same one on every call.
pub unsafe trait IpcEndpoint {
    /// The `NvSciIpcEndpoint` handle.
    fn handle(&self) -> NvSciIpcEndpoint;
    /// Sends one message to the peer.
    fn send(&mut self, message: &[u8]) -> Result<(), IpcError>;
    /// Receives the peer's next message.
    fn recv(&mut self) -> Result<Vec<u8>, IpcError>;
}

/// Why an IPC transfer failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum IpcError {
    /// An NvSci (or CUDA) call failed.
    Driver(Error),
    /// The descriptor channel failed.
    Transport(io::Error),
    /// A message of the wrong size arrived where a descriptor was expected.
    Descriptor {
        /// What was expected.
        what: &'static str,
        /// Bytes expected.
        expected: usize,
        /// Bytes received.
        got: usize,
    },
    /// The imported buffer handle grants less than required.
    BufPermission {
        /// What the handle grants.
        granted: BufPerm,
        /// What the importer required.
        required: BufPerm,
    },
    /// The imported sync handle grants less than required.
    SyncPermission {
        /// What the handle grants.
        granted: SyncPerm,
        /// What the importer required.
        required: SyncPerm,
    },
    /// The connection was reset: the peer closed its endpoint, reset it, or
    /// its process ended. Close this endpoint; a new connection needs a new
    /// open on both sides.
    ConnectionReset {
        /// The local endpoint's name.
        endpoint: String,
    },
    /// The peer did not answer in time.
    Timeout {
        /// The local endpoint's name.
        endpoint: String,
        /// How long was waited.
        waited: std::time::Duration,
        /// What was waited for (e.g. "room in the write channel").
        waiting_for: &'static str,
    },
    /// A message larger than this side accepts was sent or announced.
    TooLarge {
        /// Its length in bytes.
        len: usize,
        /// The most accepted.
        max: usize,
    },
    /// The peer sent something that is not a well-formed message of this
    /// protocol (garbage, frames out of order, a truncated message).
    Malformed(&'static str),
    /// A frame the message codec refused (garbage, out of order).
    Frame(tegra_interop_core::ipc::FrameError),
    /// The endpoint's frames are too small for this channel's frame header:
    /// configure a larger `frame_size` for the pair.
    FrameTooSmall {
        /// The configured frame size.
        frame_size: u32,
        /// The least this channel needs.
        needed: usize,
    },
}

impl fmt::Display for IpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpcError::Driver(e) => write!(f, "{e}"),
            IpcError::Transport(e) => write!(f, "IPC transport failed: {e}"),
            IpcError::Descriptor {
                what,
                expected,
                got,
            } => {
                write!(
                    f,
                    "expected a {what} of {expected} bytes, received {got} bytes"
                )
            }
            IpcError::BufPermission { granted, required } => write!(
                f,
                "the imported buffer grants {granted:?}, the importer requires {required:?}"
            ),
            IpcError::SyncPermission { granted, required } => write!(
                f,
                "the imported sync object grants {granted:?}, the importer requires {required:?}"
            ),
            IpcError::ConnectionReset { endpoint } => write!(
                f,
                "NvSciIpc endpoint {endpoint:?}: the connection was reset (the peer closed or reset its endpoint, or its process ended); close this endpoint and open both ends again"
            ),
            IpcError::Timeout {
                endpoint,
                waited,
                waiting_for,
            } => write!(
                f,
                "NvSciIpc endpoint {endpoint:?}: gave up after {waited:?} waiting for {waiting_for} (is the peer process running, using the paired endpoint name, and reading?)"
            ),
            IpcError::TooLarge { len, max } => {
                write!(f, "a message of {len} bytes; at most {max} are accepted")
            }
            IpcError::Malformed(what) => write!(f, "the peer sent {what}"),
            IpcError::Frame(e) => write!(f, "the peer sent {e}"),
            IpcError::FrameTooSmall { frame_size, needed } => write!(
                f,
                "the endpoint's frames hold {frame_size} bytes; this channel needs at least {needed} (configure a larger frame_size for the pair)"
            ),
        }
    }
}

impl std::error::Error for IpcError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            IpcError::Driver(e) => Some(e),
            IpcError::Transport(e) => Some(e),
            _ => None,
        }
    }
}

impl From<Error> for IpcError {
    fn from(value: Error) -> Self {
        IpcError::Driver(value)
    }
}

impl From<io::Error> for IpcError {
    fn from(value: io::Error) -> Self {
        IpcError::Transport(value)
    }
}

fn words_to_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

fn bytes_to_words(what: &'static str, bytes: &[u8], out: &mut [u64]) -> Result<(), IpcError> {
    if bytes.len() != out.len() * 8 {
        return Err(IpcError::Descriptor {
            what,
            expected: out.len() * 8,
            got: bytes.len(),
        });
    }
    for (w, c) in out.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        *w = u64::from_ne_bytes(b);
    }
    Ok(())
}

/// The attribute-list IPC of one library, written once for both: sending
/// and receiving unreconciled lists, and the reconciled list that travels
/// ahead of an object (exported by the sender, imported by the receiver
/// with its own lists, which the library checks it against).
macro_rules! list_ipc {
    ($module:ty, $list:ty, $raw:ty, $name:literal,
     $export_u:ident, $import_u:ident, $export_r:ident, $import_r:ident, $free:ident) => {
        impl $module {
            #[doc = concat!("Sends unreconciled lists to the peer (`", stringify!($export_u), "`): the")]
            /// requirements of the side that waits (or consumes) go to the
            /// side that reconciles. This puts the peer into the object's
            /// IPC topology: the object can only come back over the
            /// endpoint the lists went by.
            pub fn send_unreconciled(
                &self,
                lists: &[&$list],
                ep: &mut impl IpcEndpoint,
            ) -> Result<(), IpcError> {
                require::$export_u(self.api())?;
                let raws: Vec<$raw> = lists.iter().map(|l| l.as_raw()).collect();
                let (mut desc, mut len) = (ptr::null_mut::<c_void>(), 0usize);
                // SAFETY: `raws` holds `raws.len()` live list handles, the count passed; `desc` and
                // `len` are locals the library writes one value each to.
                unsafe { call::$export_u(self.api(), raws.as_ptr(), raws.len(), ep.handle(), &mut desc, &mut len) }?;
                // SAFETY: a successful export pointed `desc` at `len` readable bytes, valid until
                // the library's free, which `take_desc` calls once with that same pointer.
                let bytes = unsafe { crate::ffi::take_desc(desc, len, |d| call::$free(self.api(), d)) };
                ep.send(&bytes)
            }

            #[doc = concat!("Receives the peer's unreconciled lists (`", stringify!($import_u), "`) as")]
            /// one list to reconcile with local ones.
            pub fn receive_unreconciled(&self, ep: &mut impl IpcEndpoint) -> Result<$list, IpcError> {
                require::$import_u(self.api())?;
                let bytes = ep.recv()?;
                let mut raw: $raw = ptr::null_mut();
                // SAFETY: `bytes` is `bytes.len()` readable bytes, the length passed, alive for the
                // call; `raw` is a local the library writes one list handle to.
                unsafe { call::$import_u(self.api(), self.as_raw(), ep.handle(), bytes.as_ptr().cast(), bytes.len(), &mut raw) }?;
                Ok(AttrList::wrap(self.clone(), raw, false))
            }

            /// The reconciled list sent ahead of an object, imported with
            /// this side's own lists `own` (the library refuses a list that
            /// does not satisfy them).
            fn receive_reconciled(&self, ep: &mut impl IpcEndpoint, own: &[&$list]) -> Result<$list, IpcError> {
                require::$import_r(self.api())?;
                let bytes = ep.recv()?;
                let own_raw: Vec<$raw> = own.iter().map(|l| l.as_raw()).collect();
                let mut raw: $raw = ptr::null_mut();
                // SAFETY: `bytes` is `bytes.len()` readable bytes and `own_raw` `own_raw.len()`
                // live list handles, the lengths passed; `raw` is a local the library writes one
                // list handle to.
                unsafe {
                    call::$import_r(
                        self.api(), self.as_raw(), ep.handle(), bytes.as_ptr().cast(), bytes.len(),
                        own_raw.as_ptr(), own_raw.len(), &mut raw,
                    )
                }?;
                Ok(AttrList::wrap(self.clone(), raw, true))
            }

            /// Sends the reconciled list `list` (of an object about to go).
            fn send_reconciled(&self, list: $raw, ep: &mut impl IpcEndpoint) -> Result<(), IpcError> {
                require::$export_r(self.api())?;
                let (mut desc, mut len) = (ptr::null_mut::<c_void>(), 0usize);
                // SAFETY: `desc` and `len` are locals the library writes one value each to; `list`
                // is the live reconciled list of the object being sent.
                unsafe { call::$export_r(self.api(), list, ep.handle(), &mut desc, &mut len) }?;
                // SAFETY: a successful export pointed `desc` at `len` readable bytes, valid until
                // the library's free, which `take_desc` calls once with that same pointer.
                let bytes = unsafe { crate::ffi::take_desc(desc, len, |d| call::$free(self.api(), d)) };
                ep.send(&bytes)
            }
        }
    };
}

list_ipc!(
    BufModule,
    BufAttrList,
    NvSciBufAttrList,
    "NvSciBuf",
    NvSciBufAttrListIpcExportUnreconciled,
    NvSciBufAttrListIpcImportUnreconciled,
    NvSciBufAttrListIpcExportReconciled,
    NvSciBufAttrListIpcImportReconciled,
    NvSciBufAttrListFreeDesc
);
list_ipc!(
    SyncModule,
    SyncAttrList,
    NvSciSyncAttrList,
    "NvSciSync",
    NvSciSyncAttrListIpcExportUnreconciled,
    NvSciSyncAttrListIpcImportUnreconciled,
    NvSciSyncAttrListIpcExportReconciled,
    NvSciSyncAttrListIpcImportReconciled,
    NvSciSyncAttrListFreeDesc
);

const AUTO_BUF: NvSciBufAttrValAccessPerm = NvSciBufAttrValAccessPerm::NvSciBufAccessPerm_Auto;

impl BufModule {
    /// Receives a buffer sent with [`BufObj::send`]: its reconciled list
    /// (checked against the importer's own lists `own`) and the object,
    /// with at least `required` permission (checked by the library and
    /// again on the imported handle). `timeout` goes to the import call:
    /// NvSciBuf ignores it (its object comes with the descriptor); the
    /// simulator waits at most that long for the object to arrive.
    pub fn receive_obj(
        &self,
        ep: &mut impl IpcEndpoint,
        own: &[&BufAttrList],
        required: BufPerm,
        timeout: Timeout,
    ) -> Result<BufObj, IpcError> {
        require::NvSciBufObjIpcImport(self.api())?;
        let list = self.receive_reconciled(ep, own)?;
        // The descriptor is packed (alignment 1): fill an aligned copy of its
        // words, then move them in.
        let mut words = [0u64; 32];
        bytes_to_words("buffer descriptor", &ep.recv()?, &mut words)?;
        let desc = NvSciBufObjIpcExportDescriptor { data: words };
        let mut raw: NvSciBufObj = ptr::null_mut();
        // SAFETY: `desc` is a local descriptor of the size the library reads; `raw` is a local the
        // library writes one object handle to; `list` is live.
        unsafe {
            call::NvSciBufObjIpcImport(
                self.api(),
                ep.handle(),
                &desc,
                list.as_raw(),
                required.raw(),
                timeout.as_micros(),
                &mut raw,
            )
        }?;
        let obj = BufObj::from_raw(self.clone(), raw);
        let granted = obj.actual_perm()?;
        if granted < required {
            return Err(IpcError::BufPermission { granted, required });
        }
        Ok(obj)
    }
}

impl BufObj {
    /// Sends this buffer to the peer of `ep`: its reconciled attribute list
    /// (`NvSciBufAttrListIpcExportReconciled`) and the object
    /// (`NvSciBufObjIpcExport`) granting `perm` (`None`: what the peer's
    /// lists asked for, NvSci's Auto). The peer's unreconciled list must
    /// have come over `ep` before reconciliation
    /// ([`BufModule::receive_unreconciled`]); otherwise the library refuses
    /// with NotPermitted (nvscibuf.h: the object and its reconciled list
    /// alike).
    pub fn send(&self, perm: Option<BufPerm>, ep: &mut impl IpcEndpoint) -> Result<(), IpcError> {
        require::NvSciBufAttrListIpcExportReconciled(self.module().api())?;
        require::NvSciBufObjIpcExport(self.module().api())?;
        let list = self.raw_attr_list()?;
        let mut obj_desc = NvSciBufObjIpcExportDescriptor::default();
        let perm = perm.map_or(AUTO_BUF, BufPerm::raw);
        // SAFETY: `obj_desc` is a local descriptor the library writes whole; the object is live
        // (`&self`).
        unsafe {
            call::NvSciBufObjIpcExport(
                self.module().api(),
                self.as_raw(),
                perm,
                ep.handle(),
                &mut obj_desc,
            )
        }?;
        self.module().send_reconciled(list, ep)?;
        // Packed descriptor: copy its words out instead of borrowing them.
        let words = obj_desc.data;
        ep.send(&words_to_bytes(&words))?;
        Ok(())
    }
}

impl SyncModule {
    /// Receives a sync object sent with [`SyncObj::send`]: its reconciled
    /// list (`NvSciSyncAttrListIpcImportReconciled`, checked by the library
    /// against this side's own lists `own`), then the object
    /// (`NvSciSyncObjIpcImport` with that reconciled list, as the library
    /// requires) with at least `required` permission (checked by the library
    /// and again on the imported handle). `timeout` goes to the import
    /// call: NvSciSync 6.0.10 leaves it unused (its object comes with the
    /// descriptor); the simulator waits at most that long for the object to
    /// arrive.
    pub fn receive_obj(
        &self,
        ep: &mut impl IpcEndpoint,
        own: &[&SyncAttrList],
        required: SyncPerm,
        timeout: Timeout,
    ) -> Result<SyncObj, IpcError> {
        require::NvSciSyncObjIpcImport(self.api())?;
        let list = self.receive_reconciled(ep, own)?;
        let mut desc = NvSciSyncObjIpcExportDescriptor::default();
        bytes_to_words("sync object descriptor", &ep.recv()?, &mut desc.payload)?;
        let mut raw: NvSciSyncObj = ptr::null_mut();
        // SAFETY: `desc` is a local descriptor of the size the library reads; `raw` is a local the
        // library writes one object handle to; `list` is live.
        unsafe {
            call::NvSciSyncObjIpcImport(
                self.api(),
                ep.handle(),
                &desc,
                list.as_raw(),
                NvSciSyncAccessPerm(required.raw()),
                timeout.as_micros(),
                &mut raw,
            )
        }?;
        let obj = SyncObj::from_raw(self.clone(), raw);
        let granted = obj.actual_perm()?;
        if !granted.covers(required) {
            return Err(IpcError::SyncPermission { granted, required });
        }
        Ok(obj)
    }
}

impl SyncObj {
    /// Sends this object to the peer of `ep`: its reconciled attribute list
    /// (`NvSciSyncAttrListIpcExportReconciled`) and the object
    /// (`NvSciSyncObjIpcExport`) granting `perm` (`None`: what the peer's
    /// lists asked for, NvSci's Auto). The peer's unreconciled list must
    /// have come over `ep` before reconciliation
    /// ([`SyncModule::receive_unreconciled`]); otherwise the library refuses
    /// (nvscisync.h of DRIVE OS 6.0.5 to 6.0.10 names BadParameter for an
    /// endpoint outside the object's topology).
    pub fn send(&self, perm: Option<SyncPerm>, ep: &mut impl IpcEndpoint) -> Result<(), IpcError> {
        let api = self.module().api();
        require::NvSciSyncAttrListIpcExportReconciled(api)?;
        require::NvSciSyncObjIpcExport(api)?;
        let list = self.raw_attr_list()?;
        let perm = NvSciSyncAccessPerm(perm.map_or(1 << 63, SyncPerm::raw));
        let mut desc = NvSciSyncObjIpcExportDescriptor::default();
        // SAFETY: `desc` is a local descriptor the library writes whole; the object is live
        // (`&self`).
        unsafe { call::NvSciSyncObjIpcExport(api, self.as_raw(), perm, ep.handle(), &mut desc) }?;
        self.module().send_reconciled(list, ep)?;
        ep.send(&words_to_bytes(&desc.payload))?;
        Ok(())
    }

    /// Receives a fence of this object sent with [`Fence::send`]
    /// (`NvSciSyncIpcImportFence`).
    pub fn receive_fence(&self, ep: &mut impl IpcEndpoint) -> Result<Fence, IpcError> {
        require::NvSciSyncIpcImportFence(self.module().api())?;
        let mut desc = NvSciSyncFenceIpcExportDescriptor::default();
        bytes_to_words("fence descriptor", &ep.recv()?, &mut desc.payload)?;
        let mut fence = Fence::new(self.module());
        // SAFETY: `desc` is a local received descriptor the library reads; the fence is cleared and
        // writable (`raw_mut`); the object is live.
        unsafe {
            call::NvSciSyncIpcImportFence(
                self.module().api(),
                self.as_raw(),
                &desc,
                fence.raw_mut(),
            )
        }?;
        Ok(fence)
    }
}

impl Fence {
    /// Sends this fence to the peer of `ep` (`NvSciSyncIpcExportFence`).
    pub fn send(&self, ep: &mut impl IpcEndpoint) -> Result<(), IpcError> {
        require::NvSciSyncIpcExportFence(self.module().api())?;
        let mut desc = NvSciSyncFenceIpcExportDescriptor::default();
        // SAFETY: `self.as_raw()` points to this live fence, which the library reads; `desc` is a
        // local it writes whole.
        unsafe {
            call::NvSciSyncIpcExportFence(
                self.module().api(),
                self.as_raw(),
                ep.handle(),
                &mut desc,
            )
        }?;
        ep.send(&words_to_bytes(&desc.payload))?;
        Ok(())
    }
}
