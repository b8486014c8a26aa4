//! NvSciBuf entry points: modules, attribute lists, reconciliation and
//! buffer objects over memfd shared memory.

use std::ffi::c_void;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use tegra_interop_sys::nvsci::{
    NvSciBufAttrKeyValuePair, NvSciBufAttrList, NvSciBufAttrValAccessPerm, NvSciBufModule,
    NvSciBufObj, NvSciError,
};

use super::attrs::{self, bk, AttrMap};
use super::{err, new_handle, put, unknown, Kind, ModuleRec, R};
use crate::cmem::{CArr, CMut, Handle};
use crate::instance::{self, BufObjectEntry, Call, State, Tag};
use crate::shm::{self, Region};
use crate::DiagnosticKind as D;

use super::list::*;

/// The memfd name of NvSciBuf object memory; with the shrink seal
/// [`shm::memfd`] sets, the mark an IPC import checks (see
/// [`check_imported_memory`]).
pub(crate) const MEMFD_NAME: &std::ffi::CStr = c"tegra-interop-sim-nvscibuf";

/// Checks an fd that arrived from a peer for an object import whose
/// descriptor claims `size` bytes: it must be NvSciBuf object memory (the
/// library's memfd, sealed against shrinking, so the file can never become
/// shorter than now) of at least `size` bytes. Anything else would map
/// pages past the file's end, whose first touch is SIGBUS.
pub(crate) fn check_imported_memory(
    fd: std::os::fd::BorrowedFd<'_>,
    size: u64,
) -> Result<(), String> {
    if size == 0 {
        return Err("the descriptor claims 0 bytes".into());
    }
    if !shm::is_exported_memfd(fd, MEMFD_NAME) {
        return Err(
            "the memory that came with it is not NvSciBuf object memory sealed against shrinking"
                .into(),
        );
    }
    match shm::inspect_fd(std::os::fd::AsRawFd::as_raw_fd(&fd)) {
        shm::FdInfo::File(real) if real >= size => Ok(()),
        shm::FdInfo::File(real) => Err(format!(
            "the descriptor claims {size} bytes, the memory that came with it holds {real}"
        )),
        _ => Err("the memory that came with it is not a file".into()),
    }
}

/// The memory behind one or more object handles.
pub(crate) struct BufCore {
    pub(crate) fd: OwnedFd,
    pub(crate) size: u64,
    /// The CPU view of the whole buffer (a shared mapping of `fd`).
    _region: Region,
    ptr: usize,
    pub(crate) attrs: Arc<AttrMap>,
}

impl BufCore {
    /// Maps `fd` (of at least `size` bytes) and wraps it.
    pub(crate) fn new(fd: OwnedFd, size: u64, attrs: Arc<AttrMap>) -> R<BufCore> {
        let len = usize::try_from(size).map_err(|_| err::INSUFFICIENT_MEMORY)?;
        let (region, ptr) =
            Region::map_file(fd.as_fd(), size, 0, len).map_err(|_| err::INSUFFICIENT_MEMORY)?;
        Ok(BufCore {
            fd,
            size,
            _region: region,
            ptr: ptr as usize,
            attrs,
        })
    }
}

/// One `NvSciBufObj` handle; its permission is Readonly 1 / ReadWrite 3.
pub(crate) type BufObjRec = super::ObjRec<BufCore, u32>;

/// Registers a new handle for `core` (also in the CUDA side's registry).
pub(crate) fn register(st: &mut State, core: Arc<BufCore>, perm: u32, module: usize) -> R<usize> {
    let fd = shm::dup(core.fd.as_fd()).map_err(|_| err::RESOURCE_ERROR)?;
    let h = instance::new_handle(Tag::BufObject) as usize;
    st.buf_objects.insert(
        h,
        BufObjectEntry {
            fd,
            size: core.size,
        },
    );
    st.nvsci.add_module_user(false, module);
    st.nvsci.buf_objs.insert(
        h,
        BufObjRec {
            core,
            perm,
            module,
            list: None,
        },
    );
    Ok(h)
}

/// Allocates the memory of a reconciled list.
pub(crate) fn alloc_core(c: &Call, attrs: Arc<AttrMap>) -> R<Arc<BufCore>> {
    let size = attrs::buf_size(&attrs);
    if size == 0 {
        c.diag(D::Misuse, "the reconciled list describes 0 bytes".into());
        return Err(err::BAD_PARAMETER);
    }
    let fd = shm::memfd(MEMFD_NAME, size).map_err(|_| err::INSUFFICIENT_MEMORY)?;
    Ok(Arc::new(BufCore::new(fd, size, attrs)?))
}

pub(crate) fn NvSciBufModuleOpen(c: &Call, out: CMut<NvSciBufModule>) -> NvSciError {
    let h = new_handle(Kind::BufModule);
    let r = put(out, h as NvSciBufModule);
    if r.is_ok() {
        c.state().nvsci.buf_modules.insert(h, ModuleRec::default());
    }
    super::done(r)
}

pub(crate) fn NvSciBufModuleClose(c: &Call, m: Handle<NvSciBufModule>) {
    close_module(c, false, m.addr());
}

pub(crate) fn NvSciBufAttrListCreate(
    c: &Call,
    module: Handle<NvSciBufModule>,
    out: CMut<NvSciBufAttrList>,
) -> NvSciError {
    if out.is_null() {
        return err::BAD_PARAMETER;
    }
    let r = create_list(c, false, module.addr()).and_then(|h| put(out, h as NvSciBufAttrList));
    super::done(r)
}

pub(crate) fn NvSciBufAttrListFree(c: &Call, list: Handle<NvSciBufAttrList>) {
    free_list(c, false, list.addr());
}

pub(crate) fn NvSciBufAttrListSetAttrs(
    c: &Call,
    list: Handle<NvSciBufAttrList>,
    pairs: Option<CArr<NvSciBufAttrKeyValuePair>>,
) -> NvSciError {
    let r = read_pairs(pairs).and_then(|p| set_pairs(c, false, list.addr(), p));
    super::done(r)
}

pub(crate) fn NvSciBufAttrListGetAttrs(
    c: &Call,
    list: Handle<NvSciBufAttrList>,
    pairs: Option<&mut [NvSciBufAttrKeyValuePair]>,
) -> NvSciError {
    let r = get_pairs(pairs, |keys| lookup(c, false, list.addr(), keys));
    super::done(r)
}

pub(crate) fn NvSciBufAttrListReconcile(
    c: &Call,
    lists: Option<&[NvSciBufAttrList]>,
    out: CMut<NvSciBufAttrList>,
    conflict: CMut<NvSciBufAttrList>,
) -> NvSciError {
    reconcile_entry(c, false, lists, out, conflict)
}

/// An allocated object: it always gets ReadWrite (header: "allocated
/// NvSciBufObj gets read-write permissions by default"), whatever ActualPerm
/// the reconciled list says.
fn new_object(c: &Call, module: usize, attrs: Arc<AttrMap>) -> R<usize> {
    let core = alloc_core(c, attrs)?;
    register(&mut c.state(), core, attrs::BUF_READWRITE, module)
}

pub(crate) fn NvSciBufAttrListReconcileAndObjAlloc(
    c: &Call,
    lists: Option<&[NvSciBufAttrList]>,
    obj: CMut<NvSciBufObj>,
    conflict: CMut<NvSciBufAttrList>,
) -> NvSciError {
    let r = (|| {
        if obj.is_null() || conflict.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        let hs = handles(lists)?;
        let mut conflict_h = 0usize;
        let want_conflict = !conflict.is_null();
        let res = reconcile(c, false, &hs, want_conflict.then_some(&mut conflict_h));
        if want_conflict {
            conflict.write(conflict_h as NvSciBufAttrList);
        }
        let (module, map) = res?;
        let h = new_object(c, module, map)?;
        obj.write(h as NvSciBufObj);
        Ok(())
    })();
    super::done(r)
}

pub(crate) fn NvSciBufObjAlloc(
    c: &Call,
    list: Handle<NvSciBufAttrList>,
    obj: CMut<NvSciBufObj>,
) -> NvSciError {
    let r = (|| {
        if obj.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        let (module, map) = reconciled(c, false, list.addr())?;
        let h = new_object(c, module, map)?;
        obj.write(h as NvSciBufObj);
        Ok(())
    })();
    super::done(r)
}

fn dup_with(c: &Call, obj: usize, perm: Option<u32>, out: CMut<NvSciBufObj>) -> R {
    if out.is_null() {
        return Err(err::BAD_PARAMETER);
    }
    let mut st = c.state();
    let Some(rec) = st.nvsci.buf_objs.get(&obj) else {
        return Err(unknown(c, &st.nvsci, "NvSciBuf object", obj));
    };
    let perm = match perm {
        None => rec.perm,
        Some(p) if matches!(p, attrs::BUF_READONLY | attrs::BUF_READWRITE) && p <= rec.perm => p,
        Some(p) => {
            c.diag(
                D::Misuse,
                format!(
                    "permission {p} is not a reduction of the object's {}",
                    rec.perm
                ),
            );
            return Err(err::BAD_PARAMETER);
        }
    };
    let (core, module) = (Arc::clone(&rec.core), rec.module);
    let h = register(&mut st, core, perm, module)?;
    out.write(h as NvSciBufObj);
    Ok(())
}

pub(crate) fn NvSciBufObjDup(
    c: &Call,
    obj: Handle<NvSciBufObj>,
    out: CMut<NvSciBufObj>,
) -> NvSciError {
    super::done(dup_with(c, obj.addr(), None, out))
}

pub(crate) fn NvSciBufObjDupWithReducePerm(
    c: &Call,
    obj: Handle<NvSciBufObj>,
    perm: NvSciBufAttrValAccessPerm,
    out: CMut<NvSciBufObj>,
) -> NvSciError {
    super::done(dup_with(c, obj.addr(), Some(perm.0), out))
}

pub(crate) fn NvSciBufObjFree(c: &Call, obj: Handle<NvSciBufObj>) {
    let h = obj.addr();
    let mut st = c.state();
    match st.nvsci.buf_objs.remove(&h) {
        Some(rec) => {
            st.buf_objects.remove(&h);
            if let Some(l) = rec.list {
                st.nvsci.lists.remove(&l);
                st.nvsci.gone.insert(l);
            }
            st.nvsci.gone.insert(h);
            st.nvsci.release_module(false, rec.module);
        }
        None if st.nvsci.gone.contains(&h) => {
            c.diag(
                D::DoubleDestroy,
                format!("NvSciBuf object {h:#x} freed twice"),
            );
        }
        None => {
            let _ = unknown(c, &st.nvsci, "NvSciBuf object", h);
        }
    }
}

pub(crate) fn NvSciBufObjGetAttrList(
    c: &Call,
    obj: Handle<NvSciBufObj>,
    out: CMut<NvSciBufAttrList>,
) -> NvSciError {
    let h = obj.addr();
    let r = (|| {
        if out.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        let mut st = c.state();
        let ns = &mut st.nvsci;
        let Some(rec) = ns.buf_objs.get_mut(&h) else {
            return Err(unknown(c, ns, "NvSciBuf object", h));
        };
        let list = attrs::object_list(
            &mut ns.lists,
            &mut rec.list,
            h,
            rec.module,
            false,
            &rec.core.attrs,
            (bk::ACTUAL_PERM, attrs::enc_u32s(&[rec.perm])),
        );
        out.write(list as NvSciBufAttrList);
        Ok(())
    })();
    super::done(r)
}

fn cpu_ptr(c: &Call, obj: usize, write: bool) -> R<usize> {
    let st = c.state();
    let Some(rec) = st.nvsci.buf_objs.get(&obj) else {
        return Err(unknown(c, &st.nvsci, "NvSciBuf object", obj));
    };
    if !attrs::get_bool(&rec.core.attrs, bk::NEED_CPU) {
        c.diag(
            D::Misuse,
            "CPU pointer of an object reconciled without NeedCpuAccess".into(),
        );
        return Err(err::BAD_PARAMETER);
    }
    if write && rec.perm != attrs::BUF_READWRITE {
        c.diag(
            D::Misuse,
            "writable CPU pointer of a read-only object handle; use GetConstCpuPtr".into(),
        );
        return Err(err::BAD_PARAMETER);
    }
    Ok(rec.core.ptr)
}

pub(crate) fn NvSciBufObjGetCpuPtr(
    c: &Call,
    obj: Handle<NvSciBufObj>,
    out: CMut<*mut c_void>,
) -> NvSciError {
    let r = cpu_ptr(c, obj.addr(), true).and_then(|p| put(out, p as *mut c_void));
    super::done(r)
}

pub(crate) fn NvSciBufObjGetConstCpuPtr(
    c: &Call,
    obj: Handle<NvSciBufObj>,
    out: CMut<*const c_void>,
) -> NvSciError {
    let r = cpu_ptr(c, obj.addr(), false).and_then(|p| put(out, p as *const c_void));
    super::done(r)
}

pub(crate) fn NvSciBufObjFlushCpuCacheRange(
    c: &Call,
    obj: Handle<NvSciBufObj>,
    offset: u64,
    len: u64,
) -> NvSciError {
    let h = obj.addr();
    let st = c.state();
    let Some(rec) = st.nvsci.buf_objs.get(&h) else {
        return unknown(c, &st.nvsci, "NvSciBuf object", h);
    };
    // Shared memory is coherent here; only the range is checked.
    match offset.checked_add(len) {
        Some(end) if len > 0 && end <= rec.core.size => err::SUCCESS,
        _ => err::BAD_PARAMETER,
    }
}

/// `NvSciBufCheckVersionCompatibility`: compatible iff the same major
/// version and a requested minor no newer than the claimed library's
/// ([`crate::SimConfig::nvsci_release`]); NULL `out` -> BadParameter.
pub(crate) fn NvSciBufCheckVersionCompatibility(
    c: &Call,
    major: u32,
    minor: u32,
    out: CMut<bool>,
) -> NvSciError {
    let (lib_major, lib_minor) = c.inst.config.nvsci_release.buf_version();
    super::done(put(out, major == lib_major && minor <= lib_minor))
}
