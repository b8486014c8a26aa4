//! NvSciSync over IPC: sync objects and fences exported and imported.

use super::*;
use crate::nvsci::NvSciRelease;

pub(crate) fn NvSciSyncObjIpcExport(
    c: &Call,
    obj: Handle<NvSciSyncObj>,
    perm: NvSciSyncAccessPerm,
    ep: NvSciIpcEndpoint,
    desc: CMut<NvSciSyncObjIpcExportDescriptor>,
) -> NvSciError {
    let h = obj.addr();
    let r = (|| {
        if desc.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        let (core, have) = core_and_perm(c, |ns| &ns.sync_objs, "NvSciSync object", h)?;
        let e = endpoint(c, ep)?;
        let release = c.inst.config.nvsci_release;
        // The object goes back along the path its waiters' unreconciled
        // lists came by: nvscisync.h of 6.0.5 to 6.0.10 counts an endpoint
        // outside the object's topology among the BadParameter cases; the
        // 5.2.6 header names no such rule, so there it stays refused (with
        // the only refusal code that header gives the call).
        let Some(&(_, asked)) = attrs::peers(&core.attrs).iter().find(|(x, _)| *x == ep) else {
            let why = if release == NvSciRelease::V5_2_6 {
                " (the DRIVE OS 5.2.6 header documents no such rule; the real answer is not known: refused)"
            } else {
                ""
            };
            c.diag(
                D::Misuse,
                format!("NvSciSync object exported over endpoint {ep:#x}, which no unreconciled list of its reconciliation came by (import the peer's list with NvSciSyncAttrListIpcImportUnreconciled over this endpoint before reconciling){why}"),
            );
            return Err(err::BAD_PARAMETER);
        };
        // DRIVE OS 5.2.6's header allows only WaitOnly or Auto: a permission
        // with signalling rights is a BadParameter there. What its Auto
        // grants a peer that asked to signal is not documented: refused.
        if release == NvSciRelease::V5_2_6 {
            let signals = match perm.0 {
                attrs::PERM_AUTO => asked & 2 != 0,
                p => p & 2 != 0,
            };
            if signals {
                c.diag(
                    D::Misuse,
                    format!("NvSciSync 2.0 (DRIVE OS 5.2.6) exports wait permission only; permission {:#x} for a peer that required {asked:#x} grants signalling (refused)", perm.0),
                );
                return Err(err::BAD_PARAMETER);
            }
        }
        let grant = match perm.0 {
            attrs::PERM_AUTO if asked != 0 && asked & !have == 0 => asked,
            attrs::PERM_AUTO => have,
            p @ 1..=3 if p & !have == 0 && asked & !p == 0 => p,
            p => {
                c.diag(
                    D::Misuse,
                    format!("cannot export permission {p:#x} from a handle with {have:#x} to a peer that required {asked:#x} (the real library's answer is not known; refused)"),
                );
                return Err(err::BAD_PARAMETER);
            }
        };
        let id = new_uid();
        e.send_object(c, id, &core.sem_fd)?;
        let a = &core.attrs;
        let mut d = NvSciSyncObjIpcExportDescriptor::default();
        d.payload[..9].copy_from_slice(&[
            SYNC_TAG,
            id,
            core.uid,
            grant,
            u64::from(attrs::get_u32(a, sk::PRIMITIVE).unwrap_or(attrs::PRIM_SYNCPOINT)),
            attrs::get_u64(a, sk::MAX_VALUE).unwrap_or(u64::from(u32::MAX)),
            u64::from(attrs::get_bool(a, sk::NEED_CPU)),
            u64::from(attrs::get_bool(a, sk::DETERMINISTIC)),
            u64::from(attrs::get_bool(a, sk::CTX_INSENSITIVE)),
        ]);
        desc.write(d);
        Ok(())
    })();
    super::super::done(r)
}

pub(crate) fn NvSciSyncObjIpcImport(
    c: &Call,
    ep: NvSciIpcEndpoint,
    desc: CPtr<NvSciSyncObjIpcExportDescriptor>,
    list: Handle<NvSciSyncAttrList>,
    perm: NvSciSyncAccessPerm,
    timeout_us: i64,
    out: CMut<NvSciSyncObj>,
) -> NvSciError {
    let r = (|| {
        let d = get(desc)?;
        let p = d.payload;
        if out.is_null() || p[0] != SYNC_TAG {
            return Err(err::BAD_PARAMETER);
        }
        let (id, uid, grant) = (p[1], p[2], p[3]);
        // The list must be the reconciled one the signaller exported
        // (NvSciSyncAttrListIpcImportReconciled); its ActualPerm is what
        // this side asked for.
        let (module, required) = {
            let st = c.state();
            let ns = &st.nvsci;
            match ns.lists.get(&(list.addr())).filter(|l| l.sync) {
                Some(l) => match &l.kind {
                    ListKind::Reconciled(m) => {
                        (l.module, attrs::get_u64(m, sk::ACTUAL_PERM).unwrap_or(0))
                    }
                    _ => {
                        drop(st);
                        c.diag(
                            D::Misuse,
                            "NvSciSyncObjIpcImport needs the reconciled list from NvSciSyncAttrListIpcImportReconciled, not an unreconciled list".into(),
                        );
                        return Err(err::BAD_PARAMETER);
                    }
                },
                None => return Err(unknown(c, ns, "attribute list", list.addr())),
            }
        };
        // Take the descriptor off the socket first, so a refused import
        // leaves nothing behind for later imports to skip over.
        sync::timeout(timeout_us)?;
        let e = endpoint(c, ep)?;
        if e.claimed(id) {
            c.diag(D::Misuse, "this NvSciSync object descriptor was imported already (a descriptor imports once; the real library's answer is not known, refused)".into());
            return Err(err::BAD_PARAMETER);
        }
        let fd = await_object(c, &e, id, timeout_us, "NvSciSyncObjIpcImport")?;
        let want = if perm.0 == attrs::PERM_AUTO {
            grant
        } else {
            perm.0
        };
        if want & !grant != 0 || required & !grant != 0 || want == 0 {
            c.diag(
                D::Misuse,
                format!("the exporter granted {grant:#x}; the importer asks for {want:#x} (its list requires {required:#x})"),
            );
            return Err(err::ACCESS_DENIED);
        }
        let Some(sem) = SharedSemaphore::open(std::os::fd::AsFd::as_fd(&fd)) else {
            return Err(err::BAD_PARAMETER);
        };
        if !matches!(sem.kind(), SemaphoreKind::Deterministic { .. }) {
            return Err(err::BAD_PARAMETER);
        }
        let mut m = AttrMap::new();
        m.insert(sk::ACTUAL_PERM, attrs::enc_u64s(&[want]));
        m.insert(sk::PRIMITIVE, attrs::enc_u32s(&[p[4] as u32]));
        m.insert(sk::MAX_VALUE, attrs::enc_u64s(&[p[5]]));
        m.insert(sk::NEED_CPU, attrs::enc_bool(p[6] != 0));
        m.insert(sk::DETERMINISTIC, attrs::enc_bool(p[7] != 0));
        m.insert(sk::CTX_INSENSITIVE, attrs::enc_bool(p[8] != 0));
        let core = Arc::new(SyncCore {
            id: sync::new_fence_id(),
            uid,
            sem: Arc::new(sem),
            sem_fd: fd,
            attrs: Arc::new(m),
        });
        let h = sync::register(&mut c.state(), core, want, module);
        out.write(h as NvSciSyncObj);
        Ok(())
    })();
    super::super::done(r)
}

pub(crate) fn NvSciSyncIpcExportFence(
    c: &Call,
    f: CPtr<NvSciSyncFence>,
    ep: NvSciIpcEndpoint,
    desc: CMut<NvSciSyncFenceIpcExportDescriptor>,
) -> NvSciError {
    let r = (|| {
        let f = get(f)?;
        if desc.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        endpoint(c, ep)?;
        let d = match fence::decode(&f) {
            FenceContent::Cleared => NvSciSyncFenceIpcExportDescriptor::default(),
            FenceContent::Garbage => return Err(err::BAD_PARAMETER),
            FenceContent::Fence(sf) => {
                let st = c.state();
                let Some(rec) = st
                    .nvsci
                    .sync_objs
                    .values()
                    .find(|r| r.core.id == sf.object_id)
                else {
                    c.diag(
                        D::Misuse,
                        "fence of an object that has no NvSciSync handle here".into(),
                    );
                    return Err(err::BAD_PARAMETER);
                };
                NvSciSyncFenceIpcExportDescriptor {
                    payload: [FENCE_TAG, rec.core.uid, sf.value, 0, 0, 0, 0],
                }
            }
        };
        desc.write(d);
        Ok(())
    })();
    super::super::done(r)
}

pub(crate) fn NvSciSyncIpcImportFence(
    c: &Call,
    obj: Handle<NvSciSyncObj>,
    desc: CPtr<NvSciSyncFenceIpcExportDescriptor>,
    f: CMut<NvSciSyncFence>,
) -> NvSciError {
    let h = obj.addr();
    let r = (|| {
        let d = get(desc)?;
        if f.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        let st = c.state();
        let Some(rec) = st.nvsci.sync_objs.get(&h) else {
            return Err(unknown(c, &st.nvsci, "NvSciSync object", h));
        };
        let fence = if d.payload.iter().all(|w| *w == 0) {
            NvSciSyncFence::default()
        } else if d.payload[0] == FENCE_TAG && d.payload[1] == rec.core.uid {
            fence::encode(SimFence {
                object_id: rec.core.id,
                value: d.payload[2],
            })
        } else {
            c.diag(
                D::Misuse,
                "the fence descriptor belongs to another sync object".into(),
            );
            return Err(err::BAD_PARAMETER);
        };
        f.write(fence);
        Ok(())
    })();
    super::super::done(r)
}
