//! The simulated NvSciBuf / NvSciSync / NvSciIpc subset.
//!
//! The entry points follow the real NvSci headers' declarations and
//! documentation (the crate README's tables give the source of each
//! rule): modules, attribute lists with reconciliation,
//! buffer objects over shared memory (memfd), sync objects with
//! deterministic fences over the simulator's shared semaphores, CPU waits
//! with timeouts (futex on shared memory), and IPC between real processes:
//! NvSciIpc endpoints from a BSP-style configuration file, each a Unix
//! `SOCK_SEQPACKET` connection to its peer carrying the application's frames
//! and, beside them, the memfds of exported objects (`SCM_RIGHTS`); see
//! `ipc::endpoint`.
//!
//! Objects made here are registered in the CUDA side's registries, so
//! `cuImportExternalMemory(NVSCIBUF)` and `cuImportExternalSemaphore(NVSCISYNC)`
//! accept them unchanged; `cuDeviceGetNvSciSyncAttributes` fills the
//! simulator's sync attribute lists (RequiredPerm, PrimitiveInfo, GpuId).
//!
//! # Rules and sources
//!
//! The simulator is at least as strict as the real NvSciBuf / NvSciSync:
//! every rule of the fact sheet's "Checked against the real headers"
//! section is enforced with the documented code, decoding the raw
//! key/value pairs itself (module `attrs`); the full table (rule, source, test)
//! is in the crate README. A simulator claiming an older
//! [`NvSciRelease`] lacks that release's later keys (BadParameter, like any
//! unknown key) and entry points (table entry `None`).
//!
//! # Choices where the real library's answer is not known
//!
//! Where the header documentation does not say what the real library
//! answers, the simulator refuses (it never guesses leniently) and records
//! a diagnostic saying so:
//!
//! - Unknown or freed handles (the real library panics): BadParameter + a
//!   `UseAfterDestroy` / `UnknownHandle` diagnostic.
//! - Real keys, types and values the simulator does not model (tensor,
//!   array, pyramid, surface-based image keys, PeerLocationInfo,
//!   PeerHwEngineArray, video memory, interlaced or VPR images, padding,
//!   colour formats whose plane layout the fact sheet does not give,
//!   timestamps, a fence on a syncpoint other than the object's own):
//!   NotSupported + an `Unimplemented` diagnostic.
//! - A sync list without RequiredPerm in a reconciliation: UnsupportedConfig.
//! - A second import of the same object descriptor: BadParameter.
//! - A CPU wait context used by two waits at once: Busy.
//! - DRIVE OS 5.2.6's NvSciSync object export: outside the object's IPC
//!   topology (a rule that header does not state) still BadParameter; Auto
//!   for a peer that asked to signal BadParameter too (the header allows
//!   exporting wait permission only). The Jetson "2.4" flavour has no
//!   `NvSciIpcCheckVersionCompatibility` (its NvSciIpc is not known).
//! - Image layout: pitch-linear with tight rows (block-linear is laid out
//!   the same), plane offsets aligned to `PlaneBaseAddrAlign` (default 256);
//!   code must read pitch, offsets and sizes back. RawBuffer Align defaults
//!   to 1. EnableGpuCompression always reconciles to None (the documented
//!   fallback when the driver does not grant compression).
//! - The sync primitive when nobody names one: syncpoint first on an
//!   integrated GPU, sysmem semaphore first otherwise; fences carry
//!   primitive id 0 and every object counts +1 per signal (deterministic),
//!   whether or not `RequireDeterministicFences` was asked for.
//! - `cuDeviceGetNvSciSyncAttributes`: PrimitiveInfo `[Syncpoint]` on an
//!   integrated GPU, `[SysmemSemaphore, SysmemSemaphorePayload64b]`
//!   otherwise, and GpuId, written into the list whatever the claimed
//!   release (CUDA sets them as internal attributes on older libraries).
//! - CPU signal (`GenerateFence` + `ObjSignal`) needs signal permission and
//!   NeedCpuAccess. An infinite CPU wait is cut off after
//!   `SimConfig::hang_timeout` with a `Hang` diagnostic and `Timeout`. A
//!   fence whose object has no live handle left cannot be waited on
//!   (`BadParameter`; the real library keeps the object alive).
//! - Memsync: the CUDA side records each NvSciSync signal and wait it
//!   enqueues, and whether the skip flag was set
//!   ([`crate::Sim::nvsci_memsync_log`]); shared memory is coherent, so
//!   skipping changes no data here.
//! - NvSciSync IPC: the function table has no NvSciSync attribute-list IPC,
//!   so a sync import takes the importer's own list (it must ask for no
//!   more than was granted) and the export path is not checked; the real
//!   library wants the reconciled list from `AttrListIpcImportReconciled`.

mod attrs;
pub mod forge;
// Entry-point bodies carry their C names: the generated trampolines find them by name.
#[allow(non_snake_case)]
mod buf;
// Entry-point bodies carry their C names: the generated trampolines find them by name.
#[allow(non_snake_case)]
pub(crate) mod ipc;
mod list;
mod release;
mod slots;
// Entry-point bodies carry their C names: the generated trampolines find them by name.
#[allow(non_snake_case)]
mod sync;

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tegra_interop_sys::cuda::{CUdevice, CUresult};
use tegra_interop_sys::nvsci::NvSciError;

use crate::cmem::{CMut, CPtr, Plain};
use crate::instance::Call;
use crate::{codes, DiagnosticKind};

pub(crate) use attrs::AttrListRec;
pub(crate) use slots::{buf_table, ipc_table, run_ret, run_void, sync_table};

/// The bodies of the NvSci entry points, each under its C name (the
/// generated trampolines find them here).
pub(crate) mod bodies {
    pub(crate) use super::buf::*;
    pub(crate) use super::ipc::*;
    pub(crate) use super::sync::*;
}

pub use attrs::color;
pub use ipc::{
    IpcConfigError, IpcConfigFile, IpcConfigProblem, MAX_CHANNEL_BYTES, MAX_CONFIG_BYTES,
    MAX_FRAME_SIZE, MAX_NFRAMES,
};
pub use release::NvSciRelease;

/// `NvSciError` values the simulator returns (named by the generated bindings).
pub(crate) mod err {
    use tegra_interop_sys::nvsci::NvSciError;

    pub(crate) const SUCCESS: NvSciError = NvSciError::NvSciError_Success;
    pub(crate) const UNKNOWN: NvSciError = NvSciError::NvSciError_Unknown;
    pub(crate) const NOT_SUPPORTED: NvSciError = NvSciError::NvSciError_NotSupported;
    pub(crate) const ACCESS_DENIED: NvSciError = NvSciError::NvSciError_AccessDenied;
    pub(crate) const NOT_PERMITTED: NvSciError = NvSciError::NvSciError_NotPermitted;
    pub(crate) const INVALID_OPERATION: NvSciError = NvSciError::NvSciError_InvalidOperation;
    pub(crate) const NOT_INITIALIZED: NvSciError = NvSciError::NvSciError_NotInitialized;
    pub(crate) const INSUFFICIENT_MEMORY: NvSciError = NvSciError::NvSciError_InsufficientMemory;
    pub(crate) const RESOURCE_ERROR: NvSciError = NvSciError::NvSciError_ResourceError;
    pub(crate) const BAD_PARAMETER: NvSciError = NvSciError::NvSciError_BadParameter;
    pub(crate) const OVERFLOW: NvSciError = NvSciError::NvSciError_Overflow;
    pub(crate) const TIMEOUT: NvSciError = NvSciError::NvSciError_Timeout;
    pub(crate) const BUSY: NvSciError = NvSciError::NvSciError_Busy;
    pub(crate) const INVALID_STATE: NvSciError = NvSciError::NvSciError_InvalidState;
    pub(crate) const NO_SUCH_ENTRY: NvSciError = NvSciError::NvSciError_NoSuchEntry;
    pub(crate) const CONNECTION_RESET: NvSciError = NvSciError::NvSciError_ConnectionReset;
    pub(crate) const RECONCILIATION_FAILED: NvSciError =
        NvSciError::NvSciError_ReconciliationFailed;
    pub(crate) const ATTR_LIST_VALIDATION_FAILED: NvSciError =
        NvSciError::NvSciError_AttrListValidationFailed;
    pub(crate) const UNSUPPORTED_CONFIG: NvSciError = NvSciError::NvSciError_UnsupportedConfig;
    pub(crate) const CLEARED_FENCE: NvSciError = NvSciError::NvSciError_ClearedFence;
}

pub(crate) type R<T = ()> = Result<T, NvSciError>;

pub(crate) fn done(r: R) -> NvSciError {
    match r {
        Ok(()) => err::SUCCESS,
        Err(e) => e,
    }
}

/// Writes `v` to a caller out-pointer, refusing NULL.
pub(crate) fn put<T: Plain>(p: CMut<T>, v: T) -> R {
    p.write(v).then_some(()).ok_or(err::BAD_PARAMETER)
}

/// Reads a caller in-pointer, refusing NULL.
pub(crate) fn get<T: Plain>(p: CPtr<T>) -> R<T> {
    p.read().ok_or(err::BAD_PARAMETER)
}

/// Kinds of NvSci handles, in the upper bits of their values (a namespace of
/// their own, next to the CUDA side's tags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    BufModule = 0x7c20,
    SyncModule = 0x7c21,
    BufList = 0x7c22,
    SyncList = 0x7c23,
    WaitContext = 0x7c24,
}

static NEXT: AtomicU64 = AtomicU64::new(1);

/// A new process-unique handle value of `kind` (never reused).
pub(crate) fn new_handle(kind: Kind) -> usize {
    let n = NEXT.fetch_add(1, Ordering::Relaxed) & 0x0000_0fff_ffff_ffff;
    (((kind as u64) << 48) | (n << 4)) as usize
}

/// A process-independent id (for fences and objects that cross processes).
pub(crate) fn new_uid() -> u64 {
    let pid = u64::from(std::process::id());
    (pid << 40) ^ NEXT.fetch_add(1, Ordering::Relaxed) ^ 0x5151_0000_0000_0000
}

/// A module (buf or sync): closed by the application, kept while objects
/// made from it live.
#[derive(Debug, Default)]
pub(crate) struct ModuleRec {
    pub(crate) closed: bool,
    pub(crate) users: usize,
}

/// A CPU wait context.
pub(crate) struct WaitCtxRec {
    pub(crate) module: usize,
    pub(crate) busy: Arc<std::sync::atomic::AtomicBool>,
}

/// Which side of a semaphore operation ran (or skipped) its memsync.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemsyncOp {
    /// `cuSignalExternalSemaphoresAsync`: the flush of NvSciBuf memory
    /// written before the signal.
    Signal,
    /// `cuWaitExternalSemaphoresAsync`: the invalidation of NvSciBuf memory
    /// read after the wait.
    Wait,
}

/// One NvSciSync signal or wait enqueued by the CUDA side: whether the
/// NvSciBuf memory synchronisation ran or was skipped
/// (`SKIP_NVSCIBUF_MEMSYNC`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemsyncEvent {
    /// Signal or wait.
    pub op: MemsyncOp,
    /// The sync object's fence id (the object id in
    /// [`crate::fence::SimFence`]).
    pub object_id: u64,
    /// `true` when the memory synchronisation ran, `false` when the skip
    /// flag was set.
    pub ran: bool,
}

/// The NvSci objects a simulator holds; see [`crate::Sim::nvsci_ledger`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NvSciLedger {
    /// Buf and sync modules not closed yet, or closed but still used by
    /// lists, objects or wait contexts.
    pub modules: usize,
    /// Attribute lists the application must free (created, reconciled,
    /// conflict, imported).
    pub attr_lists: usize,
    /// NvSciBuf object handles (alloc, dup, import).
    pub buf_objects: usize,
    /// NvSciSync object handles.
    pub sync_objects: usize,
    /// CPU wait contexts.
    pub cpu_wait_contexts: usize,
    /// Open NvSciIpc endpoints.
    pub open_endpoints: usize,
    /// Attribute-list export descriptors not freed with
    /// `NvSciBufAttrListFreeDesc`.
    pub export_descriptors: usize,
    /// `NvSciIpcInit` calls not matched by `NvSciIpcDeinit`.
    pub ipc_inits: usize,
}

impl NvSciLedger {
    /// `true` when nothing is held.
    pub fn is_clean(&self) -> bool {
        *self == NvSciLedger::default()
    }
}

impl fmt::Display for NvSciLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "modules {}, attr lists {}, buf objects {}, sync objects {}, cpu wait contexts {}, endpoints {}, descriptors {}, ipc inits {}",
            self.modules,
            self.attr_lists,
            self.buf_objects,
            self.sync_objects,
            self.cpu_wait_contexts,
            self.open_endpoints,
            self.export_descriptors,
            self.ipc_inits
        )
    }
}

/// Everything the NvSci part of one simulator owns (a field of the
/// simulator's state, so it is freed with it and by `shutdown`).
#[derive(Default)]
pub(crate) struct NvSciState {
    pub(crate) buf_modules: HashMap<usize, ModuleRec>,
    pub(crate) sync_modules: HashMap<usize, ModuleRec>,
    pub(crate) lists: HashMap<usize, AttrListRec>,
    pub(crate) buf_objs: HashMap<usize, buf::BufObjRec>,
    pub(crate) sync_objs: HashMap<usize, sync::SyncObjRec>,
    pub(crate) wait_contexts: HashMap<usize, WaitCtxRec>,
    /// NvSciIpc: the configuration, open endpoints.
    pub(crate) ipc: ipc::IpcState,
    /// Attribute-list descriptors handed out and not freed: address ->
    /// whether NvSciSync (true) or NvSciBuf made it.
    pub(crate) descriptors: crate::cmem::HandedOut<bool>,
    /// The most recent NvSciSync memsync events (bounded: see `journal`).
    pub(crate) memsync: crate::journal::Journal<MemsyncEvent>,
    pub(crate) next_sync_initial: Option<u64>,
    /// Handles that were live once (for use-after-free diagnostics).
    pub(crate) gone: HashSet<usize>,
}

impl NvSciState {
    pub(crate) fn ledger(&self) -> NvSciLedger {
        NvSciLedger {
            modules: self.buf_modules.len() + self.sync_modules.len(),
            attr_lists: self.lists.values().filter(|l| l.owner.is_none()).count(),
            buf_objects: self.buf_objs.len(),
            sync_objects: self.sync_objs.len(),
            cpu_wait_contexts: self.wait_contexts.len(),
            open_endpoints: self.ipc.open_count(),
            export_descriptors: self.descriptors.len(),
            ipc_inits: usize::from(self.ipc.initialized()),
        }
    }

    /// Takes one use of a module (a list, object or wait context made
    /// from it). `Err` when the handle is not a live module of this kind.
    pub(crate) fn retain_module(&mut self, sync: bool, module: usize) -> R {
        let map = if sync {
            &mut self.sync_modules
        } else {
            &mut self.buf_modules
        };
        match map.get_mut(&module) {
            Some(m) if !m.closed => {
                m.users += 1;
                Ok(())
            }
            _ => Err(err::BAD_PARAMETER),
        }
    }

    /// Gives one use back (an object of a module that the application may
    /// already have closed); the module goes when closed and unused.
    pub(crate) fn release_module(&mut self, sync: bool, module: usize) {
        let map = if sync {
            &mut self.sync_modules
        } else {
            &mut self.buf_modules
        };
        if let Some(m) = map.get_mut(&module) {
            m.users = m.users.saturating_sub(1);
            if m.closed && m.users == 0 {
                map.remove(&module);
            }
        }
    }

    /// Adds a use to a module whatever its state (for objects that share
    /// the module of an existing object).
    pub(crate) fn add_module_user(&mut self, sync: bool, module: usize) {
        let map = if sync {
            &mut self.sync_modules
        } else {
            &mut self.buf_modules
        };
        if let Some(m) = map.get_mut(&module) {
            m.users += 1;
        }
    }
}

/// Reports a handle the NvSci part does not know and returns BAD_PARAMETER.
/// One object handle of either half: NvSciBuf handles are
/// `ObjRec<BufCore, u32>`, NvSciSync handles `ObjRec<SyncCore, u64>` (the
/// same record over each half's object and permission type).
pub(crate) struct ObjRec<C, P> {
    /// The object this handle refers to (shared by its duplicates).
    pub(crate) core: Arc<C>,
    /// This handle's permission.
    pub(crate) perm: P,
    /// The module the object was made with.
    pub(crate) module: usize,
    /// The list `ObjGetAttrList` handed out (owned by the object).
    pub(crate) list: Option<usize>,
}

/// The object and permission of handle `h` in the registry `pick` selects,
/// or the unknown-handle answer (naming `what`) of either half.
pub(crate) fn core_and_perm<C, P: Copy>(
    c: &Call,
    pick: fn(&NvSciState) -> &HashMap<usize, ObjRec<C, P>>,
    what: &str,
    h: usize,
) -> R<(Arc<C>, P)> {
    let st = c.state();
    let Some(rec) = pick(&st.nvsci).get(&h) else {
        return Err(unknown(c, &st.nvsci, what, h));
    };
    Ok((Arc::clone(&rec.core), rec.perm))
}

pub(crate) fn unknown(c: &Call, st: &NvSciState, what: &str, h: usize) -> NvSciError {
    if st.gone.contains(&h) {
        c.diag(
            DiagnosticKind::UseAfterDestroy,
            format!("{what} {h:#x} used after it was freed"),
        );
    } else {
        c.diag(
            DiagnosticKind::UnknownHandle,
            format!("{what} {h:#x} is unknown to this simulator"),
        );
    }
    err::BAD_PARAMETER
}

/// `cuDeviceGetNvSciSyncAttributes` on a simulator with NvSci: fills an
/// unreconciled sync attribute list of this simulator with what CUDA needs
/// on `dev`: `RequiredPerm` from the flags (SIGNAL = 1, WAIT = 2),
/// `PrimitiveInfo` (syncpoints on an integrated GPU, sysmem semaphores
/// otherwise) and `GpuId` (the device UUID). INVALID_VALUE when the list is
/// not one, is reconciled, already has `RequiredPerm`, or no flag is given.
pub(crate) fn cuda_fill_sync_attrs(
    c: &Call,
    list: *mut c_void,
    dev: CUdevice,
    flags: i32,
) -> CUresult {
    sync::cuda_fill(c, list as usize, dev, flags)
}

/// Records whether an NvSciSync signal or wait ran its NvSciBuf memory
/// synchronisation (called by the CUDA side when it enqueues one).
pub(crate) fn record_memsync(
    st: &mut crate::instance::State,
    op: MemsyncOp,
    object_id: u64,
    skipped: bool,
) {
    st.nvsci.memsync.push(MemsyncEvent {
        op,
        object_id,
        ran: !skipped,
    });
}

/// Maps the answer of `Instance::enter` to an NvSci code: the
/// "driver is shut down" answer becomes NotInitialized, an injected code
/// is returned as the NvSciError of the same number.
pub(crate) fn entry_code(shut: bool, code: CUresult) -> NvSciError {
    if shut && code == codes::DEINITIALIZED {
        err::NOT_INITIALIZED
    } else {
        NvSciError(code.0)
    }
}

impl crate::Sim {
    /// What the NvSci part holds now (modules, attribute lists, objects,
    /// wait contexts, endpoints, descriptors). A correct teardown leaves it
    /// [`NvSciLedger::is_clean`].
    pub fn nvsci_ledger(&self) -> NvSciLedger {
        self.inner.lock_state().nvsci.ledger()
    }

    /// Makes the next `NvSciSyncObjAlloc` start its counter at `value`
    /// instead of 0 (wrapped to 32 bits for 32-bit primitives), to reach a
    /// wrap-around without billions of signals. Applies once.
    pub fn nvsci_set_next_sync_initial(&self, value: u64) {
        self.inner.lock_state().nvsci.next_sync_initial = Some(value);
    }

    /// The NvSciSync signals and waits the CUDA side enqueued, with whether
    /// their NvSciBuf memory synchronisation ran: the most recent
    /// [`LOG_LIMIT`](crate::LOG_LIMIT) of them, oldest first.
    pub fn nvsci_memsync_log(&self) -> Vec<MemsyncEvent> {
        self.inner.lock_state().nvsci.memsync.to_vec()
    }
}
