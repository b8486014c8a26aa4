//! NvSciIpc endpoints ([`endpoint`], [`config`]: the BSP's configuration file, frames,
//! events, resets) and the IPC export/import of buffer objects, sync
//! objects, fences and attribute lists.
//!
//! Exporting an object sends its memfd over the endpoint's connection
//! (`SCM_RIGHTS`, beside the application's frames) tagged with a transfer
//! id, and the export descriptor carries the id; importing takes the
//! message with that id (others wait for later imports). The descriptor
//! bytes themselves travel however the application likes (NvSciIpc frames
//! on a real system), as with the real library.

mod buffers;
mod calls;
mod config;
pub(crate) mod endpoint;
mod fences;
mod lists;
mod version;
mod wire;

pub(crate) use self::buffers::*;
pub(crate) use self::calls::*;
pub(crate) use self::config::IpcTable;
pub use self::config::{
    IpcConfigError, IpcConfigFile, IpcConfigProblem, MAX_CHANNEL_BYTES, MAX_CONFIG_BYTES,
    MAX_FRAME_SIZE, MAX_NFRAMES,
};
pub(crate) use self::endpoint::IpcState;
pub(crate) use self::fences::*;
pub(crate) use self::lists::*;
pub(crate) use self::version::*;

use std::ffi::c_void;
use std::sync::Arc;

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
use crate::cmem::{CMut, CPtr, Handle};
use crate::fence::{self, FenceContent, SimFence};
use crate::instance::Call;
use crate::shm::{SemaphoreKind, SharedSemaphore};
use crate::DiagnosticKind as D;

const BUF_TAG: u64 = u64::from_le_bytes(*b"TISIMBUF");
const SYNC_TAG: u64 = u64::from_le_bytes(*b"TISIMSYN");
const FENCE_TAG: u64 = u64::from_le_bytes(*b"TISIMFIP");

/// Waits for the fd of the object with transfer id `id` that the peer
/// exported over `e`, for the import call `what`: at most the caller's
/// `timeout_us` where it is a valid NvSci timeout (-1 and the infinite
/// value: as long as it takes), and never longer than the simulator's
/// `hang_timeout`. The real libraries do not wait here (NvSciBuf ignores
/// the timeout, NvSciSync 6.0.10 leaves it unused): their object travels
/// with the descriptor. The simulator's travels beside it, and is normally
/// there first (it goes before the descriptor on the same connection); a
/// descriptor of an object never sent answers `Timeout` once the limit
/// passes, with a diagnostic saying what was waited for.
pub(super) fn await_object(
    c: &Call,
    e: &endpoint::Endpoint,
    id: u64,
    timeout_us: i64,
    what: &str,
) -> R<std::os::fd::OwnedFd> {
    let hang = c.inst.config.hang_timeout;
    let asked = sync::timeout(timeout_us).ok().flatten();
    let limit = asked.map_or(hang, |l| l.min(hang));
    let r = e.receive_object(id, limit);
    if r.as_ref().err() == Some(&err::TIMEOUT) {
        let (kind, whose) = match asked {
            Some(a) if a <= hang => (D::Misuse, "the caller's timeout"),
            _ => (
                D::Hang,
                "the simulator's hang_timeout; the caller's timeout is longer or infinite",
            ),
        };
        c.diag(
            kind,
            format!(
                "{what}: the object of transfer id {id:#x} did not arrive over endpoint {:?} within {limit:?} ({whose}): a descriptor of an object never sent, or sent over another endpoint (the real library does not wait here; refused with Timeout)",
                e.name
            ),
        );
    }
    r
}

// ---------------------------------------------------------------- buffers

// ---------------------------------------------------------------- sync objects and fences
