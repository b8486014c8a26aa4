//! Attribute lists over IPC, for NvSciBuf and NvSciSync alike: the waiter's
//! unreconciled lists travel to the signaller (export/import
//! unreconciled), the reconciled list travels back (export/import
//! reconciled). An imported unreconciled list remembers the endpoint it
//! came over; reconciliation records those peers, and an object (and, for
//! NvSciBuf, the reconciled list) may only be exported back along one of
//! them.
//!
//! One generic body per call serves both libraries (`sync` picks the
//! library); the `NvSciBuf*` / `NvSciSync*` entry points are thin wrappers.
//!
//! Descriptors handed to the caller are malloc'ed copies the caller owns
//! until it gives them back with `AttrListFreeDesc` (see
//! [`crate::cmem::HandedOut`]).

use super::*;
use crate::cmem::{CMut, Handle};

/// Hands `bytes` to the caller as a descriptor it frees with the
/// library's `AttrListFreeDesc`.
fn hand_out(c: &Call, sync: bool, bytes: Vec<u8>, desc: CMut<*mut c_void>, len: CMut<usize>) -> R {
    if desc.is_null() || len.is_null() {
        return Err(err::BAD_PARAMETER);
    }
    let Some(p) = c.state().nvsci.descriptors.copy_of(&bytes, sync) else {
        return Err(err::INSUFFICIENT_MEMORY);
    };
    desc.write(p as *mut c_void);
    len.write(bytes.len());
    Ok(())
}

/// Parses an attribute-list descriptor (the caller's bytes; NULL: `None`).
///
/// The bytes come from a peer, so nothing in them is trusted: a descriptor
/// that carries one of the simulator's private keys (which export strips:
/// the IPC topology, [`attrs::PRIVATE_PEER`] and up) is forged, and is
/// refused with BadParameter (nvscibuf.h / nvscisync.h give that code for a
/// descriptor whose list holds keys with invalid values). So is one beyond
/// the parse's bounds (parts, keys in a part, bytes of a value, a key
/// twice: `attrs::wire`), before anything is allocated for it.
fn parse(c: &Call, desc: Option<&[u8]>) -> R<Vec<AttrMap>> {
    let Some(bytes) = desc.filter(|d| !d.is_empty()) else {
        return Err(err::BAD_PARAMETER);
    };
    let parts = match attrs::deserialize(bytes) {
        Ok(parts) => parts,
        Err(attrs::WireError::Malformed) => return Err(err::BAD_PARAMETER),
        Err(attrs::WireError::Bound(why)) => {
            c.diag(
                D::Misuse,
                format!("an imported attribute-list descriptor of {} bytes was refused at parse: {why} (the simulator's bounds; refused with BadParameter, the headers' code for an invalid descriptor)", bytes.len()),
            );
            return Err(err::BAD_PARAMETER);
        }
    };
    if let Some(k) = parts
        .iter()
        .flat_map(|p| p.keys())
        .find(|k| **k >= attrs::PRIVATE_PEER)
    {
        c.diag(
            D::Misuse,
            format!("an imported attribute-list descriptor carries the private key {k:#x}, which export never sends (a forged descriptor; refused with BadParameter)"),
        );
        return Err(err::BAD_PARAMETER);
    }
    Ok(parts)
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

/// `Nv*AttrListIpcExportUnreconciled`.
fn export_unreconciled<T>(
    c: &Call,
    sync: bool,
    lists: Option<&[*mut T]>,
    ep: NvSciIpcEndpoint,
    desc: CMut<*mut c_void>,
    len: CMut<usize>,
) -> NvSciError {
    let r = (|| {
        let hs = list::handles(lists)?;
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
    desc: CMut<*mut c_void>,
    len: CMut<usize>,
) -> NvSciError {
    let r = (|| {
        let (_, map) = list::reconciled(c, sync, list)?;
        endpoint(c, ep)?;
        let peer = attrs::peers(&map).into_iter().find(|(e, _)| *e == ep);
        // NvSciBuf (nvscibuf.h of every checked release, 5.2.6 to 6.0.10): a
        // reconciled list goes back only the way one of its unreconciled
        // lists came. NvSciSync's twin documents no such refusal.
        if !sync && peer.is_none() {
            c.diag(
                D::Misuse,
                format!("reconciled NvSciBuf list exported over endpoint {ep:#x}, which no unreconciled list of its reconciliation came by (import the peer's list with NvSciBufAttrListIpcImportUnreconciled over this endpoint before reconciling)"),
            );
            return Err(err::NOT_PERMITTED);
        }
        // The peer's ActualPerm is what its own lists required.
        let mut m = (*map).clone();
        if let Some((_, perm)) = peer {
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

/// `Nv*AttrListIpcImportUnreconciled`.
fn import_unreconciled<T>(
    c: &Call,
    sync: bool,
    module: usize,
    ep: NvSciIpcEndpoint,
    desc: Option<&[u8]>,
    out: CMut<*mut T>,
) -> NvSciError {
    let r = (|| {
        let mut parts = parse(c, desc)?;
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
        out.write(h as *mut T);
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

/// `Nv*AttrListIpcImportReconciled`: `inputs` is the caller's array of
/// `n` handles (NULL: `None`), checked only when `n > 0`.
#[allow(clippy::too_many_arguments)]
fn import_reconciled<T>(
    c: &Call,
    sync: bool,
    module: usize,
    ep: NvSciIpcEndpoint,
    desc: Option<&[u8]>,
    inputs: Option<&[*mut T]>,
    n: usize,
    out: CMut<*mut T>,
) -> NvSciError {
    let r = (|| {
        let mut parts = parse(c, desc)?;
        if out.is_null() || parts.len() != 1 {
            return Err(err::BAD_PARAMETER);
        }
        let map = parts.remove(0);
        endpoint(c, ep)?;
        live_module(c, sync, module)?;
        if n > 0 {
            let hs = list::handles(inputs)?;
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
        out.write(h as *mut T);
        Ok(())
    })();
    super::super::done(r)
}

fn free_desc(c: &Call, sync: bool, desc: usize) {
    let freed = c.state().nvsci.descriptors.free(desc, sync);
    if !freed {
        c.diag(
            D::Misuse,
            format!(
                "{desc:#x} is not a descriptor this library handed out (or it was freed already)"
            ),
        );
    }
}

macro_rules! list_ipc {
    ($sync:literal, $module:ty, $list:ty,
     $eu:ident, $er:ident, $iu:ident, $ir:ident, $free:ident) => {
        pub(crate) fn $eu(
            c: &Call,
            lists: Option<&[$list]>,
            ep: NvSciIpcEndpoint,
            desc: CMut<*mut c_void>,
            len: CMut<usize>,
        ) -> NvSciError {
            export_unreconciled(c, $sync, lists, ep, desc, len)
        }

        pub(crate) fn $er(
            c: &Call,
            list: Handle<$list>,
            ep: NvSciIpcEndpoint,
            desc: CMut<*mut c_void>,
            len: CMut<usize>,
        ) -> NvSciError {
            export_reconciled(c, $sync, list.addr(), ep, desc, len)
        }

        pub(crate) fn $iu(
            c: &Call,
            module: Handle<$module>,
            ep: NvSciIpcEndpoint,
            desc: Option<&[u8]>,
            out: CMut<$list>,
        ) -> NvSciError {
            import_unreconciled(c, $sync, module.addr(), ep, desc, out)
        }

        pub(crate) fn $ir(
            c: &Call,
            module: Handle<$module>,
            ep: NvSciIpcEndpoint,
            desc: Option<&[u8]>,
            inputs: Option<&[$list]>,
            n: usize,
            out: CMut<$list>,
        ) -> NvSciError {
            import_reconciled(c, $sync, module.addr(), ep, desc, inputs, n, out)
        }

        pub(crate) fn $free(c: &Call, desc: CMut<c_void>) {
            free_desc(c, $sync, desc.addr())
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
