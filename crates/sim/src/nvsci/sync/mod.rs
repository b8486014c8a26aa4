//! NvSciSync entry points: sync objects over the simulator's shared
//! deterministic semaphores, fences, CPU signal and CPU wait.

mod fences;

pub(crate) use self::fences::*;

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tegra_interop_sys::cuda::{CUdevice, CUresult};
use tegra_interop_sys::nvsci::{
    NvSciError, NvSciSyncAttrKeyValuePair, NvSciSyncAttrList, NvSciSyncCpuWaitContext,
    NvSciSyncFence, NvSciSyncModule, NvSciSyncObj,
};

use super::attrs::{self, sk, AttrMap, ListKind};
use super::{err, get, list, new_handle, put, unknown, Kind, ModuleRec, WaitCtxRec, R};
use crate::cmem::{CArr, CMut, CPtr, Handle};
use crate::fence::{self, FenceContent, SimFence};
use crate::instance::{self, Call, State, SyncObjectEntry, Tag};
use crate::shm::{SemaphoreKind, SharedSemaphore, WaitEnd};
use crate::{codes, DiagnosticKind as D};

/// The primitive behind one or more sync object handles.
pub(crate) struct SyncCore {
    /// The id written into this process's fences.
    pub(crate) id: u64,
    /// The id shared with other processes (fence IPC).
    pub(crate) uid: u64,
    pub(crate) sem: Arc<SharedSemaphore>,
    pub(crate) sem_fd: OwnedFd,
    pub(crate) attrs: Arc<AttrMap>,
}

/// One `NvSciSyncObj` handle; its permissions are wait 1 | signal 2.
pub(crate) type SyncObjRec = super::ObjRec<SyncCore, u64>;

/// Registers a handle for `core` (also in the CUDA side's registry).
pub(crate) fn register(st: &mut State, core: Arc<SyncCore>, perm: u64, module: usize) -> usize {
    let h = instance::new_handle(Tag::SyncObject) as usize;
    st.sync_objects.insert(
        h,
        SyncObjectEntry {
            id: core.id,
            sem: Arc::clone(&core.sem),
            can_signal: perm & attrs::PERM_SIGNAL != 0,
            can_wait: perm & attrs::PERM_WAIT != 0,
        },
    );
    st.nvsci.add_module_user(true, module);
    st.nvsci.sync_objs.insert(
        h,
        SyncObjRec {
            core,
            perm,
            module,
            list: None,
        },
    );
    h
}

/// A fresh process-local fence id.
pub(crate) fn new_fence_id() -> u64 {
    instance::new_handle(Tag::SyncObject)
}

pub(crate) fn NvSciSyncModuleOpen(c: &Call, out: CMut<NvSciSyncModule>) -> NvSciError {
    let h = new_handle(Kind::SyncModule);
    let r = put(out, h as NvSciSyncModule);
    if r.is_ok() {
        c.state().nvsci.sync_modules.insert(h, ModuleRec::default());
    }
    super::done(r)
}

pub(crate) fn NvSciSyncModuleClose(c: &Call, m: Handle<NvSciSyncModule>) {
    list::close_module(c, true, m.addr());
}

pub(crate) fn NvSciSyncCpuWaitContextAlloc(
    c: &Call,
    module: Handle<NvSciSyncModule>,
    out: CMut<NvSciSyncCpuWaitContext>,
) -> NvSciError {
    if out.is_null() {
        return err::BAD_PARAMETER;
    }
    let mut st = c.state();
    let ns = &mut st.nvsci;
    let m = module.addr();
    if ns.retain_module(true, m).is_err() {
        return unknown(c, ns, "sync module", m);
    }
    let h = new_handle(Kind::WaitContext);
    ns.wait_contexts.insert(
        h,
        WaitCtxRec {
            module: m,
            busy: Arc::default(),
        },
    );
    out.write(h as NvSciSyncCpuWaitContext);
    err::SUCCESS
}

pub(crate) fn NvSciSyncCpuWaitContextFree(c: &Call, ctx: Handle<NvSciSyncCpuWaitContext>) {
    let h = ctx.addr();
    let mut st = c.state();
    let ns = &mut st.nvsci;
    match ns.wait_contexts.remove(&h) {
        Some(w) => {
            ns.gone.insert(h);
            ns.release_module(true, w.module);
        }
        None if ns.gone.contains(&h) => {
            c.diag(
                D::DoubleDestroy,
                format!("CPU wait context {h:#x} freed twice"),
            );
        }
        None => {
            let _ = unknown(c, ns, "CPU wait context", h);
        }
    }
}

pub(crate) fn NvSciSyncAttrListCreate(
    c: &Call,
    module: Handle<NvSciSyncModule>,
    out: CMut<NvSciSyncAttrList>,
) -> NvSciError {
    if out.is_null() {
        return err::BAD_PARAMETER;
    }
    let r =
        list::create_list(c, true, module.addr()).and_then(|h| put(out, h as NvSciSyncAttrList));
    super::done(r)
}

pub(crate) fn NvSciSyncAttrListFree(c: &Call, list: Handle<NvSciSyncAttrList>) {
    list::free_list(c, true, list.addr());
}

pub(crate) fn NvSciSyncAttrListSetAttrs(
    c: &Call,
    list: Handle<NvSciSyncAttrList>,
    pairs: Option<CArr<NvSciSyncAttrKeyValuePair>>,
) -> NvSciError {
    let r = list::read_pairs(pairs).and_then(|v| list::set_pairs(c, true, list.addr(), v));
    super::done(r)
}

pub(crate) fn NvSciSyncAttrListGetAttrs(
    c: &Call,
    list: Handle<NvSciSyncAttrList>,
    pairs: Option<&mut [NvSciSyncAttrKeyValuePair]>,
) -> NvSciError {
    let r = list::get_pairs(pairs, |keys| list::lookup(c, true, list.addr(), keys));
    super::done(r)
}

pub(crate) fn NvSciSyncAttrListReconcile(
    c: &Call,
    lists: Option<&[NvSciSyncAttrList]>,
    out: CMut<NvSciSyncAttrList>,
    conflict: CMut<NvSciSyncAttrList>,
) -> NvSciError {
    list::reconcile_entry(c, true, lists, out, conflict)
}

fn new_object(c: &Call, module: usize, map: Arc<AttrMap>) -> R<usize> {
    let prim = attrs::get_u32(&map, sk::PRIMITIVE).unwrap_or(attrs::PRIM_SYNCPOINT);
    let wrap32 = prim != attrs::PRIM_SYSMEM_SEMAPHORE_64;
    let perm = attrs::get_u64(&map, sk::ACTUAL_PERM).unwrap_or(0);
    let mut st = c.state();
    let initial = st.nvsci.next_sync_initial.take().unwrap_or(0);
    let initial = if wrap32 {
        initial & 0xffff_ffff
    } else {
        initial
    };
    let (fd, sem) = SharedSemaphore::create(SemaphoreKind::Deterministic { wrap32 }, initial)
        .map_err(|_| err::INSUFFICIENT_MEMORY)?;
    let core = Arc::new(SyncCore {
        id: new_fence_id(),
        uid: super::new_uid(),
        sem: Arc::new(sem),
        sem_fd: fd,
        attrs: map,
    });
    Ok(register(&mut st, core, perm, module))
}

pub(crate) fn NvSciSyncAttrListReconcileAndObjAlloc(
    c: &Call,
    lists: Option<&[NvSciSyncAttrList]>,
    obj: CMut<NvSciSyncObj>,
    conflict: CMut<NvSciSyncAttrList>,
) -> NvSciError {
    let r = (|| {
        if obj.is_null() || conflict.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        let hs = list::handles(lists)?;
        let mut conflict_h = 0usize;
        let want = !conflict.is_null();
        let res = list::reconcile(c, true, &hs, want.then_some(&mut conflict_h));
        if want {
            conflict.write(conflict_h as NvSciSyncAttrList);
        }
        let (module, map) = res?;
        let h = new_object(c, module, map)?;
        obj.write(h as NvSciSyncObj);
        Ok(())
    })();
    super::done(r)
}

pub(crate) fn NvSciSyncObjAlloc(
    c: &Call,
    list: Handle<NvSciSyncAttrList>,
    obj: CMut<NvSciSyncObj>,
) -> NvSciError {
    let r = (|| {
        if obj.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        let (module, map) = list::reconciled(c, true, list.addr())?;
        let h = new_object(c, module, map)?;
        obj.write(h as NvSciSyncObj);
        Ok(())
    })();
    super::done(r)
}

pub(crate) fn NvSciSyncObjDup(
    c: &Call,
    obj: Handle<NvSciSyncObj>,
    out: CMut<NvSciSyncObj>,
) -> NvSciError {
    let h = obj.addr();
    if out.is_null() {
        return err::BAD_PARAMETER;
    }
    let mut st = c.state();
    let Some(rec) = st.nvsci.sync_objs.get(&h) else {
        return unknown(c, &st.nvsci, "NvSciSync object", h);
    };
    let (core, perm, module) = (Arc::clone(&rec.core), rec.perm, rec.module);
    let d = register(&mut st, core, perm, module);
    out.write(d as NvSciSyncObj);
    err::SUCCESS
}

pub(crate) fn NvSciSyncObjFree(c: &Call, obj: Handle<NvSciSyncObj>) {
    let h = obj.addr();
    let mut st = c.state();
    match st.nvsci.sync_objs.remove(&h) {
        Some(rec) => {
            st.sync_objects.remove(&h);
            if let Some(l) = rec.list {
                st.nvsci.lists.remove(&l);
                st.nvsci.gone.insert(l);
            }
            st.nvsci.gone.insert(h);
            st.nvsci.release_module(true, rec.module);
        }
        None if st.nvsci.gone.contains(&h) => {
            c.diag(
                D::DoubleDestroy,
                format!("NvSciSync object {h:#x} freed twice"),
            );
        }
        None => {
            let _ = unknown(c, &st.nvsci, "NvSciSync object", h);
        }
    }
}

pub(crate) fn NvSciSyncObjGetAttrList(
    c: &Call,
    obj: Handle<NvSciSyncObj>,
    out: CMut<NvSciSyncAttrList>,
) -> NvSciError {
    let h = obj.addr();
    if out.is_null() {
        return err::BAD_PARAMETER;
    }
    let mut st = c.state();
    let ns = &mut st.nvsci;
    let Some(rec) = ns.sync_objs.get_mut(&h) else {
        return unknown(c, ns, "NvSciSync object", h);
    };
    let list = attrs::object_list(
        &mut ns.lists,
        &mut rec.list,
        h,
        rec.module,
        true,
        &rec.core.attrs,
        (sk::ACTUAL_PERM, attrs::enc_u64s(&[rec.perm])),
    );
    out.write(list as NvSciSyncAttrList);
    err::SUCCESS
}

/// `NvSciSyncCheckVersionCompatibility`: compatible iff the same major
/// version and a requested minor no newer than the claimed library's.
pub(crate) fn NvSciSyncCheckVersionCompatibility(
    c: &Call,
    major: u32,
    minor: u32,
    out: CMut<bool>,
) -> NvSciError {
    let (lib_major, lib_minor) = c.inst.config.nvsci_release.sync_version();
    super::done(put(out, major == lib_major && minor <= lib_minor))
}

/// `cuDeviceGetNvSciSyncAttributes` (see [`super::cuda_fill_sync_attrs`]).
pub(crate) fn cuda_fill(c: &Call, list: usize, dev: CUdevice, flags: i32) -> CUresult {
    let d = usize::try_from(dev).unwrap_or(0);
    let integrated = c.inst.config.integrated;
    let mut st = c.state();
    let ns = &mut st.nvsci;
    let Some(l) = ns.lists.get_mut(&list).filter(|l| l.sync) else {
        c.diag(
            D::UnknownHandle,
            format!("{list:#x} is not an NvSciSync attribute list of this simulator"),
        );
        return codes::INVALID_VALUE;
    };
    let ListKind::Unreconciled(parts) = &mut l.kind else {
        c.diag(
            D::Misuse,
            "cuDeviceGetNvSciSyncAttributes needs an unreconciled list".into(),
        );
        return codes::INVALID_VALUE;
    };
    let [map] = parts.as_mut_slice() else {
        return codes::INVALID_VALUE;
    };
    if map.contains_key(&sk::REQ_PERM) {
        c.diag(
            D::Misuse,
            "the list already has RequiredPerm; give CUDA a fresh list".into(),
        );
        return codes::INVALID_VALUE;
    }
    let mut perm = 0u64;
    if flags & 1 != 0 {
        perm |= attrs::PERM_SIGNAL;
    }
    if flags & 2 != 0 {
        perm |= attrs::PERM_WAIT;
    }
    if perm == 0 || flags & !3 != 0 {
        return codes::INVALID_VALUE;
    }
    map.insert(sk::REQ_PERM, attrs::enc_u64s(&[perm]));
    let prims: &[u32] = if integrated {
        &[attrs::PRIM_SYNCPOINT]
    } else {
        &[attrs::PRIM_SYSMEM_SEMAPHORE, 4]
    };
    map.entry(sk::PRIMITIVE)
        .or_insert_with(|| attrs::enc_u32s(prims));
    map.entry(sk::GPU_ID)
        .or_insert_with(|| crate::cuda::device_uuid(d).to_vec().into_boxed_slice());
    codes::SUCCESS
}
