//! NvSciSync: [`SyncModule`], [`SyncAttrList`], [`SyncObj`], [`Fence`],
//! [`CpuWaitContext`], and the CUDA semaphore [`NvSciSemaphore`] whose role
//! (signaller / waiter) is part of its type.
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;
use std::sync::Arc;

use tegra_interop_core::nvsci::{SyncAttr, SyncAttrSet};
use tegra_interop_core::{
    DeterministicCounter, NvSciError, NvSciSyncAttrFlags, PrimitiveWidth, SemaphoreImport,
    ValidationError,
};
use tegra_interop_sys::nvsci::{
    NvSciSyncAttrKey, NvSciSyncAttrList, NvSciSyncAttrValPrimitiveType, NvSciSyncCpuWaitContext,
    NvSciSyncFence,
};

use super::attrs::SyncAttrInput;
use super::common::{AttrList, Module, Obj, SyncLib};
use super::version::{self};
use super::Timeout;
use crate::ffi::{self, call};
use crate::semaphore::{SemaphoreSignal, SemaphoreWait, Tracking};
use crate::{Context, Error, ExternalSemaphore, Stream};

type K = NvSciSyncAttrKey;

/// How a waiter gets the fence of the k-th signal of a deterministic sync
/// object ([`SyncModule::fence_source`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FenceSource {
    /// The waiter builds it itself with `NvSciSyncFenceUpdateFence` (id 0,
    /// the k-th value) without receiving anything: NvSciSync 2.3 and 2.5+.
    Built,
    /// The signaller hands each fence to the waiter (the standard NvSci
    /// flow): libraries without `FenceUpdateFence` (2.0, the 2.4 flavour).
    Received,
}

impl FenceSource {
    /// `"built"` / `"received"`.
    pub fn name(self) -> &'static str {
        match self {
            FenceSource::Built => "built",
            FenceSource::Received => "received",
        }
    }
}

/// What a sync object handle may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SyncPerm {
    /// `NvSciSyncAccessPerm_WaitOnly`.
    WaitOnly,
    /// `NvSciSyncAccessPerm_SignalOnly`.
    SignalOnly,
    /// `NvSciSyncAccessPerm_WaitSignal`.
    WaitSignal,
}

impl SyncPerm {
    /// The C value.
    pub fn raw(self) -> u64 {
        match self {
            SyncPerm::WaitOnly => 1,
            SyncPerm::SignalOnly => 2,
            SyncPerm::WaitSignal => 3,
        }
    }

    /// From the C value (`None` for 0, Auto and unknown bits).
    pub fn from_raw(raw: u64) -> Option<Self> {
        match raw {
            1 => Some(SyncPerm::WaitOnly),
            2 => Some(SyncPerm::SignalOnly),
            3 => Some(SyncPerm::WaitSignal),
            _ => None,
        }
    }

    /// Signalling is allowed.
    pub fn can_signal(self) -> bool {
        self.raw() & 2 != 0
    }

    /// Waiting is allowed.
    pub fn can_wait(self) -> bool {
        self.raw() & 1 != 0
    }

    /// `true` when `self` allows everything `other` allows.
    pub fn covers(self, other: SyncPerm) -> bool {
        other.raw() & !self.raw() == 0
    }
}

/// Every NvSciSync key the project describes (`SyncAttr`), read back from
/// conflict lists (only those the loaded library knows are asked for).
pub(crate) const ALL_KEYS: &[u32] = &[1, 2, 3, 4, 5, 6, 7, 9, 10, 12];

/// An open NvSciSync module (`NvSciSyncModuleOpen`): see [`Module`]. Every
/// fence and wait context keeps it open too.
pub type SyncModule = Module<SyncLib>;
/// An NvSciSync attribute list, freed with `NvSciSyncAttrListFree`: see
/// [`AttrList`].
pub type SyncAttrList = AttrList<SyncLib>;
/// An NvSciSync object handle, freed with `NvSciSyncObjFree`: see [`Obj`].
pub type SyncObj = Obj<SyncLib>;

impl Module<SyncLib> {
    /// How waiters get fences of deterministic objects with this library:
    /// [`FenceSource::Built`] when it has `FenceUpdateFence` and
    /// `FenceExtractFence` (version and symbols), else
    /// [`FenceSource::Received`].
    pub fn fence_source(&self) -> FenceSource {
        let source = if self
            .check_extract_update("NvSciSyncFenceUpdateFence")
            .is_ok()
            && self.api().NvSciSyncFenceUpdateFence.is_some()
            && self.api().NvSciSyncFenceExtractFence.is_some()
        {
            FenceSource::Built
        } else {
            FenceSource::Received
        };
        crate::logging::debug!(
            target: crate::logging::NVSCI,
            "NvSciSync {}: fence source {} (FenceUpdateFence {}, FenceExtractFence {})",
            self.0.version,
            source.name(),
            if self.api().NvSciSyncFenceUpdateFence.is_some() { "present" } else { "absent" },
            if self.api().NvSciSyncFenceExtractFence.is_some() { "present" } else { "absent" }
        );
        source
    }

    /// Refuses `key` when the loaded library does not know it.
    pub(crate) fn check_key(&self, key: K) -> Result<(), Error> {
        self.0.version.sync_key(key).map_err(|needed| {
            version::too_old(
                version::sync_key_name(key),
                "NvSciSync",
                needed,
                self.0.version,
            )
        })
    }

    /// Refuses `FenceExtractFence` / `FenceUpdateFence` (`item`) on a
    /// library version without them.
    fn check_extract_update(&self, item: &'static str) -> Result<(), Error> {
        self.0
            .version
            .sync_has_extract_update()
            .map_err(|needed| version::too_old(item, "NvSciSync", needed, self.0.version))
    }

    /// A new unreconciled list holding `attrs` (create + `SetAttrs`), for a
    /// CPU participant for example (`NeedCpuAccess`, `RequiredPerm`).
    pub fn attr_list(&self, attrs: &(impl SyncAttrInput + ?Sized)) -> Result<SyncAttrList, Error> {
        let mut list = self.empty_attr_list()?;
        list.set(attrs)?;
        Ok(list)
    }

    /// A new list filled by CUDA for `ctx`'s device with `flags`
    /// (`cuDeviceGetNvSciSyncAttributes`).
    pub fn cuda_attr_list(
        &self,
        ctx: &Context,
        flags: NvSciSyncAttrFlags,
    ) -> Result<SyncAttrList, Error> {
        let mut list = self.empty_attr_list()?;
        list.add_cuda_attributes(ctx, flags)?;
        Ok(list)
    }

    /// The list of a CUDA signaller on `ctx`'s device.
    pub fn cuda_signaler_attrs(&self, ctx: &Context) -> Result<SyncAttrList, Error> {
        self.cuda_attr_list(ctx, NvSciSyncAttrFlags::SIGNAL)
    }

    /// The list of a CUDA waiter on `ctx`'s device.
    pub fn cuda_waiter_attrs(&self, ctx: &Context) -> Result<SyncAttrList, Error> {
        self.cuda_attr_list(ctx, NvSciSyncAttrFlags::WAIT)
    }
}

fn get_attr(
    module: &SyncModule,
    list: NvSciSyncAttrList,
    key: K,
) -> Result<Option<SyncAttr>, Error> {
    module.check_key(key)?;
    // The list is live (held by the caller).
    ffi::get_sync_attr(module.api(), list, key)
}

impl AttrList<SyncLib> {
    /// Adds `attrs` (`NvSciSyncAttrListSetAttrs`). A key the loaded library
    /// does not know is refused before the call
    /// ([`Error::NotInLibraryVersion`]).
    pub fn set(&mut self, attrs: &(impl SyncAttrInput + ?Sized)) -> Result<(), Error> {
        attrs.set_on(self)
    }

    /// [`set`](Self::set) for the core's fixed-capacity set.
    pub(crate) fn set_from<const N: usize>(&mut self, attrs: &SyncAttrSet<N>) -> Result<(), Error> {
        for attr in attrs.attrs() {
            self.module.check_key(attr.key())?;
        }
        let pairs = attrs.lower()?;
        if pairs.is_empty() {
            return Ok(());
        }
        // SAFETY: `pairs` is a slice of pairs pointing into `attrs`, which outlives the call, the
        // count passed; the list is live and ours (`&mut`).
        unsafe {
            call::NvSciSyncAttrListSetAttrs(
                self.module.api(),
                self.raw,
                pairs.as_slice().as_ptr(),
                pairs.len(),
            )
        }
    }

    /// Lets CUDA add what it needs to signal and/or wait on `ctx`'s device
    /// (`cuDeviceGetNvSciSyncAttributes`). The list must not have
    /// `RequiredPerm` yet (CUDA sets it from `flags`).
    pub fn add_cuda_attributes(
        &mut self,
        ctx: &Context,
        flags: NvSciSyncAttrFlags,
    ) -> Result<(), Error> {
        if !Arc::ptr_eq(ctx.backend(), self.module.backend()) {
            return Err(Error::Unsupported {
                operation: "SyncAttrList::add_cuda_attributes",
                reason: "the context and the module use different backends",
            });
        }
        let flags = flags.for_device_query()?;
        // SAFETY: the list is a live unreconciled NvSciSync list and ours (`&mut`), passed as the
        // opaque pointer the entry expects; the device comes from a live context.
        unsafe {
            call::cuDeviceGetNvSciSyncAttributes(
                ctx.api(),
                self.raw.cast::<c_void>(),
                ctx.device(),
                flags,
            )
        }
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: K) -> Result<Option<SyncAttr>, Error> {
        get_attr(&self.module, self.raw, key)
    }
}

fn no_attr(operation: &'static str, reason: &'static str) -> Error {
    Error::Unsupported { operation, reason }
}

impl Obj<SyncLib> {
    /// The value of `key` in the object's reconciled list (owned by the
    /// object, `NvSciSyncObjGetAttrList`).
    pub fn attr(&self, key: K) -> Result<Option<SyncAttr>, Error> {
        let mut list: NvSciSyncAttrList = ptr::null_mut();
        // SAFETY: `list` is a local the library writes one handle to (owned by the object, not
        // freed by us).
        unsafe { call::NvSciSyncObjGetAttrList(self.module.api(), self.raw, &mut list) }?;
        get_attr(&self.module, list, key)
    }

    /// What this handle may do (`ActualPerm`).
    pub fn actual_perm(&self) -> Result<SyncPerm, Error> {
        match self.attr(K::NvSciSyncAttrKey_ActualPerm)? {
            Some(SyncAttr::ActualPerm(p)) => SyncPerm::from_raw(p.0)
                .ok_or(Error::Validation(ValidationError::InvalidPerm { raw: p.0 })),
            _ => Err(no_attr(
                "SyncObj::actual_perm",
                "the reconciled list has no ActualPerm",
            )),
        }
    }

    /// The primitive the reconciliation chose (`PrimitiveInfo`).
    pub fn primitive_type(&self) -> Result<NvSciSyncAttrValPrimitiveType, Error> {
        match self.attr(K::NvSciSyncAttrKey_PrimitiveInfo)? {
            Some(SyncAttr::PrimitiveInfo(v)) => v
                .first()
                .copied()
                .ok_or_else(|| no_attr("SyncObj::primitive_type", "PrimitiveInfo is empty")),
            _ => Err(no_attr(
                "SyncObj::primitive_type",
                "the reconciled list has no PrimitiveInfo",
            )),
        }
    }

    /// The counter width of the primitive (fence values wrap at it): from
    /// `PrimitiveInfo` (NvSciSync 2.5+), else from `MaxPrimitiveValue`
    /// (2.3: `u32::MAX` or `u64::MAX`). Libraries with neither (2.0, the
    /// 2.4 flavour) give [`Error::NotInLibraryVersion`].
    pub fn width(&self) -> Result<PrimitiveWidth, Error> {
        if self
            .module
            .check_key(K::NvSciSyncAttrKey_PrimitiveInfo)
            .is_ok()
        {
            return Ok(PrimitiveWidth::from_primitive_type(self.primitive_type()?)?);
        }
        match self.attr(K::NvSciSyncAttrKey_MaxPrimitiveValue)? {
            Some(SyncAttr::MaxPrimitiveValue(v)) if v == u64::from(u32::MAX) => {
                Ok(PrimitiveWidth::U32)
            }
            Some(SyncAttr::MaxPrimitiveValue(u64::MAX)) => Ok(PrimitiveWidth::U64),
            Some(_) => Err(no_attr(
                "SyncObj::width",
                "MaxPrimitiveValue is neither u32::MAX nor u64::MAX",
            )),
            None => Err(no_attr(
                "SyncObj::width",
                "the reconciled list has neither PrimitiveInfo nor MaxPrimitiveValue",
            )),
        }
    }

    /// Whether the object was reconciled with `RequireDeterministicFences`
    /// (`false` on a library that does not know the key).
    pub fn is_deterministic(&self) -> Result<bool, Error> {
        if self
            .module
            .check_key(K::NvSciSyncAttrKey_RequireDeterministicFences)
            .is_err()
        {
            return Ok(false);
        }
        Ok(matches!(
            self.attr(K::NvSciSyncAttrKey_RequireDeterministicFences)?,
            Some(SyncAttr::RequireDeterministicFences(true))
        ))
    }

    /// A counter of this object's signals, learned from a fence: `fence` is
    /// the fence of signal `k` (the library's generated fence of a CPU
    /// signal, or one received from the signaller), read back with
    /// `NvSciSyncFenceExtractFence`. This is how a waiter that builds
    /// fences ([`FenceSource::Built`]) learns the initial value, which is
    /// stated nowhere; a CUDA signaller's [`NvSciSemaphore`] learns its own
    /// counter from its first signal.
    ///
    /// # Errors
    /// [`Error::Unsupported`] unless the object was reconciled with
    /// `RequireDeterministicFences`, or for a cleared fence; a library
    /// without `FenceExtractFence` gives [`Error::NotInLibraryVersion`]
    /// (fences are then received, and no counter is needed).
    pub fn counter_from_fence(&self, k: u64, fence: &Fence) -> Result<DeterministicCounter, Error> {
        if !self.is_deterministic()? {
            return Err(no_attr(
                "SyncObj::counter_from_fence",
                "the object was not reconciled with RequireDeterministicFences",
            ));
        }
        let Some(seen) = fence.extract()? else {
            return Err(no_attr(
                "SyncObj::counter_from_fence",
                "the fence is cleared: pass the fence of a signal",
            ));
        };
        let mut counter = DeterministicCounter::new(self.width()?, 0)?;
        counter.learn(k, seen.value)?;
        Ok(counter)
    }

    /// The fence of the next CPU signal (`NvSciSyncObjGenerateFence`); follow
    /// it with [`cpu_signal`](Self::cpu_signal).
    pub fn generate_fence(&self) -> Result<Fence, Error> {
        let mut fence = Fence::new(&self.module);
        // SAFETY: `fence.raw` is a zeroed fence the library writes whole.
        unsafe { call::NvSciSyncObjGenerateFence(self.module.api(), self.raw, &mut fence.raw) }?;
        Ok(fence)
    }

    /// Signals from the CPU (`NvSciSyncObjSignal`).
    pub fn cpu_signal(&self) -> Result<(), Error> {
        call::NvSciSyncObjSignal(self.module.api(), self.raw)
    }

    /// The fence that completes when the primitive reaches `value`
    /// (`NvSciSyncFenceUpdateFence` with id 0): with deterministic fences,
    /// the fence of a future signal, built without receiving it.
    pub fn fence_for_value(&self, value: u64) -> Result<Fence, Error> {
        let mut fence = Fence::new(&self.module);
        fence.update(self, 0, value)?;
        Ok(fence)
    }

    fn import<R: Role>(
        &self,
        ctx: &Context,
        operation: &'static str,
    ) -> Result<NvSciSemaphore<R>, Error> {
        let perm = self.actual_perm()?;
        if (R::SIGNALS && !perm.can_signal()) || (R::WAITS && !perm.can_wait()) {
            return Err(Error::Unsupported {
                operation,
                reason: "the object's ActualPerm does not allow this role",
            });
        }
        // A signaller of a deterministic object counts its signals (the
        // second-stream rule applies from the first signal); the counter's
        // initial value is learned from the first signal's fence where the
        // library can read fences back, else it stays unread (fences are
        // then received, and values are never reported).
        let counter = if R::SIGNALS && self.is_deterministic()? {
            let readable = self.module.fence_source() == FenceSource::Built;
            let width = if readable {
                self.width()?
            } else {
                // The width is unknown on such libraries; the counter's
                // values are never read, only its stream rule.
                self.width().unwrap_or(PrimitiveWidth::U64)
            };
            let learn = if readable {
                Learn::Pending
            } else {
                Learn::Unreadable
            };
            Some((DeterministicCounter::new(width, 0)?, learn))
        } else {
            None
        };
        let obj = self.dup()?;
        let import = SemaphoreImport::nvscisync(obj.raw.cast_const().cast())?;
        // `obj` is a live NvSciSyncObj (kept by the returned value) whose
        // permission allows the role (checked above).
        let mut sem = ExternalSemaphore::import_desc(ctx, &import)?;
        let learn = match counter {
            Some((counter, learn)) => {
                sem = sem.with_deterministic_counter(counter)?;
                learn
            }
            None => Learn::NotCounted,
        };
        Ok(NvSciSemaphore {
            sem,
            obj,
            learn,
            _role: PhantomData,
        })
    }

    /// Imports the object into `ctx` as a CUDA semaphore that can only
    /// signal. Refused (before the driver sees it) when `ActualPerm` has no
    /// signal permission.
    pub fn import_cuda_signaler(&self, ctx: &Context) -> Result<NvSciSemaphore<Signaler>, Error> {
        self.import(ctx, "SyncObj::import_cuda_signaler")
    }

    /// Imports the object into `ctx` as a CUDA semaphore that can only wait.
    pub fn import_cuda_waiter(&self, ctx: &Context) -> Result<NvSciSemaphore<Waiter>, Error> {
        self.import(ctx, "SyncObj::import_cuda_waiter")
    }

    /// Imports the object as a CUDA semaphore that can signal and wait.
    pub fn import_cuda_signal_wait(
        &self,
        ctx: &Context,
    ) -> Result<NvSciSemaphore<SignalWait>, Error> {
        self.import(ctx, "SyncObj::import_cuda_signal_wait")
    }
}

/// A fence's primitive id and value (`NvSciSyncFenceExtractFence`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FenceValue {
    /// Primitive instance id (0 for deterministic fences).
    pub id: u64,
    /// The value that completes the fence.
    pub value: u64,
}

/// An `NvSciSyncFence`, zeroed (cleared) on creation and cleared on drop
/// (`NvSciSyncFenceClear`), tied to its module.
pub struct Fence {
    module: SyncModule,
    raw: NvSciSyncFence,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("cleared", &self.is_cleared())
            .finish_non_exhaustive()
    }
}

impl Fence {
    /// A cleared fence (all zero; waiting on it completes at once).
    pub fn new(module: &SyncModule) -> Fence {
        Fence {
            module: module.clone(),
            raw: NvSciSyncFence::default(),
        }
    }

    /// The module.
    pub fn module(&self) -> &SyncModule {
        &self.module
    }

    /// `true` when cleared (all zero).
    pub fn is_cleared(&self) -> bool {
        self.raw.payload.iter().all(|w| *w == 0)
    }

    /// The C fence.
    pub fn as_raw(&self) -> &NvSciSyncFence {
        &self.raw
    }

    /// The C fence, writable.
    ///
    /// # Safety
    /// Only NvSciSync (or CUDA) may write it: whatever is written must be a
    /// fence the library produced, or zero.
    #[allow(unsafe_code)] // the caller promises what is written
    pub unsafe fn as_raw_mut(&mut self) -> &mut NvSciSyncFence {
        &mut self.raw
    }

    /// Clears the fence (`NvSciSyncFenceClear`), dropping what it refers to.
    pub fn clear(&mut self) {
        if self.is_cleared() {
            return;
        }
        // SAFETY: `self.raw` is this fence, holding a value produced by the library (a table
        // without the entry has nothing to release).
        let _ = unsafe { call::NvSciSyncFenceClear(self.module.api(), &mut self.raw) };
        self.raw = NvSciSyncFence::default();
    }

    /// A copy of the fence (`NvSciSyncFenceDup`).
    pub fn dup(&self) -> Result<Fence, Error> {
        let mut out = Fence::new(&self.module);
        // SAFETY: `self.raw` is a live fence the library reads; `out.raw` is a cleared fence it
        // writes.
        unsafe { call::NvSciSyncFenceDup(self.module.api(), &self.raw, &mut out.raw) }?;
        Ok(out)
    }

    /// The primitive id and value (`NvSciSyncFenceExtractFence`); `None`
    /// for a cleared fence.
    pub fn extract(&self) -> Result<Option<FenceValue>, Error> {
        self.module
            .check_extract_update("NvSciSyncFenceExtractFence")?;
        let (mut id, mut value) = (0u64, 0u64);
        // SAFETY: `self.raw` is a live fence the library reads; `id` and `value` are locals it
        // writes one `u64` each to.
        match unsafe {
            call::NvSciSyncFenceExtractFence(self.module.api(), &self.raw, &mut id, &mut value)
        } {
            Ok(()) => Ok(Some(FenceValue { id, value })),
            Err(Error::NvSci {
                code: NvSciError::CLEARED_FENCE,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Makes this the fence of `obj`'s primitive `id` reaching `value`
    /// (`NvSciSyncFenceUpdateFence`; clears the old content first).
    pub fn update(&mut self, obj: &SyncObj, id: u64, value: u64) -> Result<(), Error> {
        self.module
            .check_extract_update("NvSciSyncFenceUpdateFence")?;
        if self.module.api().NvSciSyncFenceUpdateFence.is_none() {
            // Refused before the old content is cleared.
            // SAFETY: the entry is missing, so nothing is called: this only reports it.
            return unsafe {
                call::NvSciSyncFenceUpdateFence(
                    self.module.api(),
                    obj.raw,
                    id,
                    value,
                    &mut self.raw,
                )
            };
        }
        self.clear();
        // SAFETY: `self.raw` is this fence, cleared and writable; `obj` is a live object.
        unsafe {
            call::NvSciSyncFenceUpdateFence(self.module.api(), obj.raw, id, value, &mut self.raw)
        }
    }

    /// Waits on the CPU until the fence completes (`NvSciSyncFenceWait`).
    /// `Ok(false)` when `timeout` passed first.
    pub fn wait(
        &self,
        context: &mut CpuWaitContext,
        timeout: impl Into<Timeout>,
    ) -> Result<bool, Error> {
        // SAFETY: `self.raw` is a live fence the library reads; the wait context is live and used
        // by this wait only (`&mut`).
        let waited = unsafe {
            call::NvSciSyncFenceWait(
                self.module.api(),
                &self.raw,
                context.raw,
                timeout.into().as_micros(),
            )
        };
        match waited {
            Ok(()) => Ok(true),
            Err(Error::NvSci {
                code: NvSciError::TIMEOUT,
                ..
            }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn raw_mut(&mut self) -> &mut NvSciSyncFence {
        &mut self.raw
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        self.clear();
    }
}

/// An `NvSciSyncCpuWaitContext`: what a CPU wait needs. Not for concurrent
/// use, so [`Fence::wait`] takes it by `&mut`; one per waiting thread.
pub struct CpuWaitContext {
    module: SyncModule,
    raw: NvSciSyncCpuWaitContext,
}

// SAFETY: the wait context is a C handle of NvSciSync, which lets any
// thread use it (one at a time), plus the module keeping it alive.
#[allow(unsafe_code)]
unsafe impl Send for CpuWaitContext {}
// No `Sync`: a wait context is never shared (waits take `&mut`).

impl std::fmt::Debug for CpuWaitContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuWaitContext")
            .field("raw", &self.raw)
            .finish()
    }
}

impl CpuWaitContext {
    /// Allocates a wait context (`NvSciSyncCpuWaitContextAlloc`).
    pub fn new(module: &SyncModule) -> Result<CpuWaitContext, Error> {
        let mut raw: NvSciSyncCpuWaitContext = ptr::null_mut();
        // SAFETY: `raw` is a local the library writes one wait-context handle to.
        unsafe { call::NvSciSyncCpuWaitContextAlloc(module.api(), module.as_raw(), &mut raw) }?;
        Ok(CpuWaitContext {
            module: module.clone(),
            raw,
        })
    }
}

impl Drop for CpuWaitContext {
    fn drop(&mut self) {
        // Ours, freed once, no wait in progress (`&mut` waits).
        let _ = call::NvSciSyncCpuWaitContextFree(self.module.api(), self.raw);
    }
}

mod sealed {
    pub trait Sealed {}
}

/// What an [`NvSciSemaphore`] may do (sealed).
pub trait Role: sealed::Sealed {
    /// The role signals.
    const SIGNALS: bool;
    /// The role waits.
    const WAITS: bool;
}

/// Roles that may signal.
pub trait CanSignal: Role {}
/// Roles that may wait.
pub trait CanWait: Role {}

/// Role: signal only.
#[derive(Debug)]
pub enum Signaler {}
/// Role: wait only.
#[derive(Debug)]
pub enum Waiter {}
/// Role: signal and wait.
#[derive(Debug)]
pub enum SignalWait {}

impl sealed::Sealed for Signaler {}
impl sealed::Sealed for Waiter {}
impl sealed::Sealed for SignalWait {}
impl Role for Signaler {
    const SIGNALS: bool = true;
    const WAITS: bool = false;
}
impl Role for Waiter {
    const SIGNALS: bool = false;
    const WAITS: bool = true;
}
impl Role for SignalWait {
    const SIGNALS: bool = true;
    const WAITS: bool = true;
}
impl CanSignal for Signaler {}
impl CanSignal for SignalWait {}
impl CanWait for Waiter {}
impl CanWait for SignalWait {}

/// An NvSciSync object imported into a CUDA context as a semaphore, with
/// its role in the type: only `Signaler` / `SignalWait` semaphores have
/// `signal`, only `Waiter` / `SignalWait` ones have `wait`.
///
/// ```compile_fail
/// # fn f(sem: tegra_interop_driver::nvsci::NvSciSemaphore<tegra_interop_driver::nvsci::Waiter>,
/// #      stream: &tegra_interop_driver::Stream) {
/// let mut sem = sem;
/// sem.signal(stream); // a wait-only semaphore has no `signal`
/// # }
/// ```
///
/// Signals return the fence they produce; waits take `&Fence`. A signaller
/// of an object reconciled with `RequireDeterministicFences` keeps its
/// [`DeterministicCounter`] inside: signals from a second stream are
/// refused unless ordered ([`order_streams`](Self::order_streams)), and the
/// counter's initial value (stated nowhere for a CUDA-signalled primitive)
/// is learned from the first signal's fence, after which
/// [`counter`](Self::counter) tells the value of any signal.
///
/// The import holds its own handle to the object; dropping the semaphore
/// destroys the CUDA import (after its queued work), then frees the handle.
pub struct NvSciSemaphore<R: Role> {
    sem: ExternalSemaphore,
    obj: SyncObj,
    learn: Learn,
    _role: PhantomData<fn() -> R>,
}

/// Where a signaller's deterministic counter stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Learn {
    /// Not deterministic, or a waiter: no counter.
    NotCounted,
    /// Counted; the initial value is read back from the next signal's fence.
    Pending,
    /// Counted and learned: values are true.
    Learned,
    /// Counted for the stream rule only: the library cannot read fences
    /// back (fences are received), so values are never reported.
    Unreadable,
}

impl<R: Role> std::fmt::Debug for NvSciSemaphore<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvSciSemaphore")
            .field("semaphore", &self.sem)
            .field("signals", &R::SIGNALS)
            .field("waits", &R::WAITS)
            .field("counter", &self.learn)
            .finish()
    }
}

impl<R: Role> NvSciSemaphore<R> {
    /// The CUDA semaphore.
    pub fn semaphore(&self) -> &ExternalSemaphore {
        &self.sem
    }

    /// The object it was imported from.
    pub fn object(&self) -> &SyncObj {
        &self.obj
    }

    /// Destroys the import now (after its queued work) and reports the
    /// driver's answer; the object handle is freed afterwards.
    pub fn destroy(self) -> Result<(), Error> {
        let NvSciSemaphore { sem, obj, .. } = self;
        let r = sem.destroy();
        drop(obj);
        r
    }

    fn same_module(&self, fence: &Fence) -> Result<(), Error> {
        if self.obj.module.same(&fence.module) {
            Ok(())
        } else {
            Err(Error::Unsupported {
                operation: "NvSciSemaphore signal/wait",
                reason: "the fence belongs to another NvSciSync module than the semaphore's object",
            })
        }
    }
}

impl<R: CanSignal> NvSciSemaphore<R> {
    /// The deterministic counter of this signaller, once its initial value
    /// was learned (after the first signal, on libraries that can read
    /// fences back); `None` before, for objects without deterministic
    /// fences, and where fences are received ([`FenceSource::Received`]).
    pub fn counter(&self) -> Option<&DeterministicCounter> {
        match (self.learn, self.sem.tracking()) {
            (Learn::Learned, Tracking::Deterministic(c)) => Some(c),
            _ => None,
        }
    }

    /// States that `later`'s signals run after `earlier`'s (see
    /// [`ExternalSemaphore::order_streams`]): needed before signalling a
    /// deterministic object from a second stream.
    pub fn order_streams(&mut self, later: &Stream, earlier: &Stream) -> Result<(), Error> {
        self.sem.order_streams(later, earlier)
    }

    /// Queues a signal on `stream` and returns the fence the driver wrote
    /// for it (wait on it, hand it to another process, or read its value).
    /// The first successful signal of a deterministic object teaches the
    /// counter its initial value (see [`counter`](Self::counter)); if the
    /// fence cannot be read back then, the signal still stands and the next
    /// signal tries again.
    pub fn signal(&mut self, stream: &Stream) -> Result<Fence, Error> {
        let mut fence = Fence::new(&self.obj.module);
        stream.signal_batch(&mut [SemaphoreSignal::nvscisync(&mut self.sem, fence.raw_mut())])?;
        self.learn_from(&fence);
        Ok(fence)
    }

    /// [`signal`](Self::signal) without the NvSciBuf memory synchronisation
    /// (`CUDA_EXTERNAL_SEMAPHORE_SIGNAL_SKIP_NVSCIBUF_MEMSYNC`).
    ///
    /// # Safety
    /// Sound only when no work queued on `stream` before this signal (since
    /// the previous signal of this object) wrote NvSciBuf-backed memory that
    /// a waiter of this fence reads afterwards, or when every such write
    /// was made coherent by other means (for example the reader only uses
    /// the fence to know it may overwrite a buffer it has finished reading).
    /// Otherwise a waiter may read stale data.
    #[allow(unsafe_code)] // the caller takes on the memsync contract
    pub unsafe fn signal_skip_memsync(&mut self, stream: &Stream) -> Result<Fence, Error> {
        let mut fence = Fence::new(&self.obj.module);
        // SAFETY: the caller accepted the condition above, which is the
        // contract of the driver's and the core's opt-in.
        let signal =
            unsafe { SemaphoreSignal::nvscisync_skip_memsync(&mut self.sem, fence.raw_mut()) };
        stream.signal_batch(&mut [signal])?;
        self.learn_from(&fence);
        Ok(fence)
    }

    /// After a successful signal whose fence is `fence`: learn the
    /// counter's initial value if it is still pending.
    fn learn_from(&mut self, fence: &Fence) {
        if self.learn != Learn::Pending {
            return;
        }
        let Ok(Some(seen)) = fence.extract() else {
            return;
        };
        if let Some(counter) = self.sem.deterministic_mut() {
            let k = counter.signal_count();
            if counter.learn(k, seen.value).is_ok() {
                self.learn = Learn::Learned;
            }
        }
    }
}

impl<R: CanWait> NvSciSemaphore<R> {
    /// Queues a wait for `fence` on `stream` (a cleared fence: no wait).
    pub fn wait(&self, stream: &Stream, fence: &Fence) -> Result<(), Error> {
        self.same_module(fence)?;
        // SAFETY: `fence` is a driver `Fence` of this semaphore's module
        // (checked above): cleared or produced by the library, and only the
        // library writes it.
        let wait = unsafe { SemaphoreWait::nvscisync(&self.sem, fence.as_raw()) };
        stream.wait_batch(&[wait])
    }

    /// [`wait`](Self::wait) without the NvSciBuf memory synchronisation
    /// (`CUDA_EXTERNAL_SEMAPHORE_WAIT_SKIP_NVSCIBUF_MEMSYNC`).
    ///
    /// # Safety
    /// Sound only when no work queued on `stream` after this wait reads
    /// NvSciBuf-backed memory that the signaller wrote before signalling
    /// `fence`, or when those writes are already coherent for this reader
    /// (for example the wait only orders a write-after-read of a buffer
    /// this stream does not read). Otherwise the work after the wait may
    /// read stale data.
    #[allow(unsafe_code)] // the caller takes on the memsync contract
    pub unsafe fn wait_skip_memsync(&self, stream: &Stream, fence: &Fence) -> Result<(), Error> {
        self.same_module(fence)?;
        // SAFETY: the caller accepted the memsync condition above; `fence` is
        // a driver `Fence` of this semaphore's module (checked above).
        let wait = unsafe { SemaphoreWait::nvscisync_skip_memsync(&self.sem, fence.as_raw()) };
        stream.wait_batch(&[wait])
    }
}
