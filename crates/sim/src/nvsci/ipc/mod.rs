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

// ---------------------------------------------------------------- buffers

// ---------------------------------------------------------------- sync objects and fences
