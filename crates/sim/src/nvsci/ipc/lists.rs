//! Attribute lists over IPC, for NvSciBuf and NvSciSync alike: the waiter's
//! unreconciled lists travel to the signaller (export/import
//! unreconciled), the reconciled list travels back (export/import
//! reconciled). An imported unreconciled list remembers the endpoint it
//! came over; reconciliation records those peers, and an object may only
//! be exported back along one of them (`NotPermitted` otherwise).
//!
//! One generic body per call serves both libraries (`sync` picks the
//! library); the `NvSciBuf*` / `NvSciSync*` entry points are thin wrappers.
//!
//! # Safety
//! Not converted yet: the NvSci bodies still take the raw C pointers
//! (their trampolines pass them unchanged) and carry the C contract of
//! their entry point as `unsafe fn`s; see `crate::cmem`.

#![allow(unsafe_code)]

use super::*;

/// Hands `bytes` to the caller as a descriptor it frees with the
/// library's `AttrListFreeDesc`.
fn hand_out(c: &Call, sync: bool, bytes: Vec<u8>, desc: *mut *mut c_void, len: *mut usize) -> R {
    if desc.is_null() || len.is_null() {
        return Err(err::BAD_PARAMETER);
    }
    // SAFETY: plain allocation of at least one byte.
    let p = unsafe { libc::malloc(bytes.len().max(1)) }.cast::<u8>();
    if p.is_null() {
        return Err(err::INSUFFICIENT_MEMORY);
    }
    // SAFETY: `p` has room for `bytes.len()` bytes; the regions are distinct.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
    c.state().nvsci.descriptors.insert(p as usize, sync);
    // SAFETY: both checked non-null; caller out-pointers.
    unsafe {
        crate::cmem::write(desc, p.cast());
        crate::cmem::write(len, bytes.len());
    }
    Ok(())
}

/// Parses an attribute-list descriptor.
///
/// # Safety
/// `desc` is NULL or points at `len` readable bytes.
unsafe fn parse(desc: *const c_void, len: usize) -> R<Vec<AttrMap>> {
    if desc.is_null() || len == 0 {
        return Err(err::BAD_PARAMETER);
    }
    // SAFETY: the caller passes `len` readable bytes.
    let bytes = unsafe { crate::cmem::bytes(desc.cast::<u8>(), len) };
    attrs::deserialize(bytes).ok_or(err::BAD_PARAMETER)
}

fn live_module(c: &Call, sync: bool, m: usize) -> R {
    let st = c.state();
    let map = if sync {
        &st.nvsci.sync_modules
    } else {
        &st.nvsci.buf_modules
    };
    match map.get(&m) {
        Some(rec) if !rec.closed => Ok(()),
        _ => Err(unknown(c, &st.nvsci, "module", m)),
    }
}

/// # Safety
/// The C contract of `Nv*AttrListIpcExportUnreconciled`.
unsafe fn export_unreconciled(
    c: &Call,
    sync: bool,
    lists: *const *mut c_void,
    n: usize,
    ep: NvSciIpcEndpoint,
    desc: *mut *mut c_void,
    len: *mut usize,
) -> NvSciError {
    let r = (|| {
        // SAFETY: forwarded caller array.
        let hs = unsafe { list::handles(lists, n) }?;
        endpoint(c, ep)?;
        let bytes = {
            let st = c.state();
            let (_, parts) = list::gather(c, &st.nvsci, sync, &hs)?;
            let refs: Vec<&AttrMap> = parts.iter().collect();
            attrs::serialize(&refs)
        };
        hand_out(c, sync, bytes, desc, len)
    })();
    super::super::done(r)
}

fn export_reconciled(
    c: &Call,
    sync: bool,
    list: usize,
    ep: NvSciIpcEndpoint,
    desc: *mut *mut c_void,
    len: *mut usize,
) -> NvSciError {
    let r = (|| {
        let (_, map) = list::reconciled(c, sync, list)?;
        endpoint(c, ep)?;
        // The peer's ActualPerm is what its own lists required.
        let mut m = (*map).clone();
        if let Some((_, perm)) = attrs::peers(&map).into_iter().find(|(e, _)| *e == ep) {
            if sync {
                m.insert(sk::ACTUAL_PERM, attrs::enc_u64s(&[perm]));
            } else {
                m.insert(bk::ACTUAL_PERM, attrs::enc_u32s(&[perm as u32]));
            }
        }
        hand_out(c, sync, attrs::serialize(&[&m]), desc, len)
    })();
    super::super::done(r)
}

/// # Safety
/// The C contract of `Nv*AttrListIpcImportUnreconciled`.
unsafe fn import_unreconciled(
    c: &Call,
    sync: bool,
    module: usize,
    ep: NvSciIpcEndpoint,
    desc: *const c_void,
    len: usize,
    out: *mut *mut c_void,
) -> NvSciError {
    let r = (|| {
        // SAFETY: forwarded caller buffer.
        let mut parts = unsafe { parse(desc, len) }?;
        if out.is_null() || parts.is_empty() {
            return Err(err::BAD_PARAMETER);
        }
        endpoint(c, ep)?;
        live_module(c, sync, module)?;
        for p in &mut parts {
            p.insert(attrs::PRIVATE_PEER, attrs::enc_u64s(&[ep]));
        }
        let h = list::add_list(
            &mut c.state().nvsci,
            sync,
            module,
            ListKind::Unreconciled(parts),
        );
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { crate::cmem::write(out, h as *mut c_void) };
        Ok(())
    })();
    super::super::done(r)
}

/// Whether the reconciled list `map` satisfies the importer's own part `p`.
fn satisfies(sync: bool, map: &AttrMap, p: &AttrMap) -> bool {
    if sync {
        let granted = attrs::get_u64(map, sk::ACTUAL_PERM).unwrap_or(0);
        let asked = attrs::get_u64(p, sk::REQ_PERM).unwrap_or(0);
        return asked & !granted == 0;
    }
    let types = map
        .get(&bk::TYPES)
        .map(|v| attrs::u32s(v))
        .unwrap_or_default();
    let size = attrs::get_u64(map, bk::RAW_SIZE).unwrap_or(0);
    let t_ok = p
        .get(&bk::TYPES)
        .is_none_or(|v| attrs::u32s(v).iter().all(|t| types.contains(t)));
    let s_ok = attrs::get_u64(p, bk::RAW_SIZE).is_none_or(|s| s == size);
    t_ok && s_ok
}

/// # Safety
/// The C contract of `Nv*AttrListIpcImportReconciled`.
#[allow(clippy::too_many_arguments)]
unsafe fn import_reconciled(
    c: &Call,
    sync: bool,
    module: usize,
    ep: NvSciIpcEndpoint,
    desc: *const c_void,
    len: usize,
    inputs: *const *mut c_void,
    n: usize,
    out: *mut *mut c_void,
) -> NvSciError {
    let r = (|| {
        // SAFETY: forwarded caller buffer.
        let mut parts = unsafe { parse(desc, len) }?;
        if out.is_null() || parts.len() != 1 {
            return Err(err::BAD_PARAMETER);
        }
        let map = parts.remove(0);
        endpoint(c, ep)?;
        live_module(c, sync, module)?;
        if n > 0 {
            // SAFETY: forwarded caller array.
            let hs = unsafe { list::handles(inputs, n) }?;
            let st = c.state();
            let (_, mine) = list::gather(c, &st.nvsci, sync, &hs)?;
            if !mine.iter().all(|p| satisfies(sync, &map, p)) {
                drop(st);
                c.diag(
                    D::Misuse,
                    "the imported reconciled list does not satisfy the importer's own list".into(),
                );
                return Err(err::ATTR_LIST_VALIDATION_FAILED);
            }
        }
        let h = list::add_list(
            &mut c.state().nvsci,
            sync,
            module,
            ListKind::Reconciled(Arc::new(map)),
        );
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { crate::cmem::write(out, h as *mut c_void) };
        Ok(())
    })();
    super::super::done(r)
}

fn free_desc(c: &Call, sync: bool, desc: *mut c_void) {
    let p = desc as usize;
    let mine = {
        let mut st = c.state();
        match st.nvsci.descriptors.get(&p) {
            Some(&s) if s == sync => st.nvsci.descriptors.remove(&p).is_some(),
            _ => false,
        }
    };
    if mine {
        // SAFETY: `p` came from our own malloc in `hand_out` and is freed once.
        unsafe { libc::free(desc) };
    } else {
        c.diag(
            D::Misuse,
            format!("{p:#x} is not a descriptor this library handed out (or it was freed already)"),
        );
    }
}

macro_rules! list_ipc {
    ($sync:literal, $module:ty, $list:ty,
     $eu:ident, $er:ident, $iu:ident, $ir:ident, $free:ident) => {
        pub(crate) unsafe fn $eu(
            c: &Call,
            lists: *const $list,
            n: usize,
            ep: NvSciIpcEndpoint,
            desc: *mut *mut c_void,
            len: *mut usize,
        ) -> NvSciError {
            // SAFETY: same contract, forwarded.
            unsafe { export_unreconciled(c, $sync, lists.cast(), n, ep, desc, len) }
        }

        pub(crate) fn $er(
            c: &Call,
            list: $list,
            ep: NvSciIpcEndpoint,
            desc: *mut *mut c_void,
            len: *mut usize,
        ) -> NvSciError {
            export_reconciled(c, $sync, list as usize, ep, desc, len)
        }

        pub(crate) unsafe fn $iu(
            c: &Call,
            module: $module,
            ep: NvSciIpcEndpoint,
            desc: *const c_void,
            len: usize,
            out: *mut $list,
        ) -> NvSciError {
            // SAFETY: same contract, forwarded.
            unsafe { import_unreconciled(c, $sync, module as usize, ep, desc, len, out.cast()) }
        }

        #[allow(clippy::too_many_arguments)]
        pub(crate) unsafe fn $ir(
            c: &Call,
            module: $module,
            ep: NvSciIpcEndpoint,
            desc: *const c_void,
            len: usize,
            inputs: *const $list,
            n: usize,
            out: *mut $list,
        ) -> NvSciError {
            // SAFETY: same contract, forwarded.
            unsafe {
                import_reconciled(
                    c,
                    $sync,
                    module as usize,
                    ep,
                    desc,
                    len,
                    inputs.cast(),
                    n,
                    out.cast(),
                )
            }
        }

        pub(crate) fn $free(c: &Call, desc: *mut c_void) {
            free_desc(c, $sync, desc)
        }
    };
}

list_ipc!(
    false,
    NvSciBufModule,
    NvSciBufAttrList,
    NvSciBufAttrListIpcExportUnreconciled,
    NvSciBufAttrListIpcExportReconciled,
    NvSciBufAttrListIpcImportUnreconciled,
    NvSciBufAttrListIpcImportReconciled,
    NvSciBufAttrListFreeDesc
);
list_ipc!(
    true,
    tegra_interop_sys::nvsci::NvSciSyncModule,
    NvSciSyncAttrList,
    NvSciSyncAttrListIpcExportUnreconciled,
    NvSciSyncAttrListIpcExportReconciled,
    NvSciSyncAttrListIpcImportUnreconciled,
    NvSciSyncAttrListIpcImportReconciled,
    NvSciSyncAttrListFreeDesc
);
