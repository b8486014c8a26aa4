//! NvSciBuf over IPC: buffer objects and attribute lists exported and imported.

use super::*;

pub(crate) unsafe fn NvSciBufObjIpcExport(
    c: &Call,
    obj: NvSciBufObj,
    perm: NvSciBufAttrValAccessPerm,
    ep: NvSciIpcEndpoint,
    desc: *mut NvSciBufObjIpcExportDescriptor,
) -> NvSciError {
    let h = obj as usize;
    let r = (|| {
        if desc.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        let (core, have) = core_and_perm(c, |ns| &ns.buf_objs, "NvSciBuf object", h)?;
        if !matches!(perm.0, attrs::BUF_READONLY | attrs::BUF_READWRITE | 4) {
            c.diag(
                D::Misuse,
                format!(
                    "export permission {} is not Readonly, ReadWrite or Auto",
                    perm.0
                ),
            );
            return Err(err::BAD_PARAMETER);
        }
        channel(c, ep)?;
        // The object goes back along the path its peers' unreconciled lists
        // came by; the peer gets at least what it was granted.
        let Some(&(_, granted)) = attrs::peers(&core.attrs).iter().find(|(e, _)| *e == ep) else {
            c.diag(
                D::Misuse,
                format!("NvSciBuf object exported over endpoint {ep:#x}, which no unreconciled list of its reconciliation came by (import the peer's list with AttrListIpcImportUnreconciled over this endpoint before reconciling)"),
            );
            return Err(err::NOT_PERMITTED);
        };
        let grant = match perm.0 {
            4 => granted,
            p if p > have => {
                c.diag(
                    D::Misuse,
                    format!("cannot export permission {p} from a handle with {have}"),
                );
                return Err(err::BAD_PARAMETER);
            }
            p if p < granted => {
                c.diag(
                    D::Misuse,
                    format!("export permission {p} is below the {granted} the peer was granted at reconciliation"),
                );
                return Err(err::INVALID_OPERATION);
            }
            p => p,
        };
        let ch = channel(c, ep)?;
        let id = new_uid();
        ch.send(id, &core.fd).map_err(|_| err::RESOURCE_ERROR)?;
        // The descriptor is packed: fill aligned words, then move them in.
        let mut words = [0u64; 32];
        words[..4].copy_from_slice(&[BUF_TAG, id, core.size, u64::from(grant)]);
        let d = NvSciBufObjIpcExportDescriptor { data: words };
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { desc.write(d) };
        Ok(())
    })();
    super::super::done(r)
}

pub(crate) unsafe fn NvSciBufObjIpcImport(
    c: &Call,
    ep: NvSciIpcEndpoint,
    desc: *const NvSciBufObjIpcExportDescriptor,
    list: NvSciBufAttrList,
    min_perm: NvSciBufAttrValAccessPerm,
    timeout_us: i64,
    out: *mut NvSciBufObj,
) -> NvSciError {
    let r = (|| {
        // SAFETY: forwarded caller pointer.
        let d = unsafe { get(desc) }?;
        if out.is_null() || d.data[0] != BUF_TAG {
            return Err(err::BAD_PARAMETER);
        }
        let (id, size, grant) = (d.data[1], d.data[2], d.data[3] as u32);
        let (module, map) = list::reconciled(c, false, list as usize)?;
        if attrs::buf_size(&map) != size {
            c.diag(
                D::Misuse,
                "the reconciled list does not describe the exported object".into(),
            );
            return Err(err::BAD_PARAMETER);
        }
        // The header says the timeout is ignored; the simulator waits for
        // the descriptor's memory at most `hang_timeout`.
        let _ = timeout_us;
        let ch = channel(c, ep)?;
        if ch.claimed(id) {
            c.diag(D::Misuse, "this NvSciBuf object descriptor was imported already (a descriptor imports once; the real library's answer is not known, refused)".into());
            return Err(err::BAD_PARAMETER);
        }
        let fd = ch.receive(id, Some(c.inst.config.hang_timeout))?;
        let min = match min_perm.0 {
            attrs::BUF_READWRITE => attrs::BUF_READWRITE,
            _ => attrs::BUF_READONLY,
        };
        if grant < min {
            c.diag(
                D::Misuse,
                format!("the exporter granted permission {grant}, the importer needs {min}"),
            );
            return Err(err::ACCESS_DENIED);
        }
        let mut m = (*map).clone();
        m.insert(bk::ACTUAL_PERM, attrs::enc_u32s(&[grant]));
        let core = Arc::new(BufCore::new(fd, size, Arc::new(m))?);
        let h = buf::register(&mut c.state(), core, grant, module)?;
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { out.write(h as NvSciBufObj) };
        Ok(())
    })();
    super::super::done(r)
}

pub(super) fn hand_out(c: &Call, bytes: Vec<u8>, desc: *mut *mut c_void, len: *mut usize) -> R {
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
    c.state().nvsci.descriptors.insert(p as usize);
    // SAFETY: both checked non-null; caller out-pointers.
    unsafe {
        desc.write(p.cast());
        len.write(bytes.len());
    }
    Ok(())
}

pub(crate) unsafe fn NvSciBufAttrListIpcExportUnreconciled(
    c: &Call,
    lists: *const NvSciBufAttrList,
    n: usize,
    ep: NvSciIpcEndpoint,
    desc: *mut *mut c_void,
    len: *mut usize,
) -> NvSciError {
    let r = (|| {
        // SAFETY: forwarded caller array.
        let hs = unsafe { list::handles(lists.cast::<*mut c_void>(), n) }?;
        channel(c, ep)?;
        let bytes = {
            let st = c.state();
            let (_, parts) = list::gather(c, &st.nvsci, false, &hs)?;
            let refs: Vec<&AttrMap> = parts.iter().collect();
            attrs::serialize(&refs)
        };
        hand_out(c, bytes, desc, len)
    })();
    super::super::done(r)
}

pub(crate) fn NvSciBufAttrListIpcExportReconciled(
    c: &Call,
    list: NvSciBufAttrList,
    ep: NvSciIpcEndpoint,
    desc: *mut *mut c_void,
    len: *mut usize,
) -> NvSciError {
    let r = (|| {
        let (_, map) = list::reconciled(c, false, list as usize)?;
        channel(c, ep)?;
        // The peer's ActualPerm: the largest RequiredPerm of its own lists.
        let mut m = (*map).clone();
        if let Some((_, perm)) = attrs::peers(&map).into_iter().find(|(e, _)| *e == ep) {
            m.insert(bk::ACTUAL_PERM, attrs::enc_u32s(&[perm]));
        }
        hand_out(c, attrs::serialize(&[&m]), desc, len)
    })();
    super::super::done(r)
}

/// Parses an attribute-list descriptor.
///
/// # Safety
/// `desc` must point at `len` readable bytes.
pub(super) unsafe fn parse(desc: *const c_void, len: usize) -> R<Vec<AttrMap>> {
    if desc.is_null() || len == 0 {
        return Err(err::BAD_PARAMETER);
    }
    // SAFETY: the caller passes `len` readable bytes.
    let bytes = unsafe { crate::cmem::bytes(desc.cast::<u8>(), len) };
    attrs::deserialize(bytes).ok_or(err::BAD_PARAMETER)
}

pub(super) fn live_module(c: &Call, m: usize) -> R {
    let st = c.state();
    match st.nvsci.buf_modules.get(&m) {
        Some(rec) if !rec.closed => Ok(()),
        _ => Err(unknown(c, &st.nvsci, "buf module", m)),
    }
}

pub(crate) unsafe fn NvSciBufAttrListIpcImportUnreconciled(
    c: &Call,
    module: NvSciBufModule,
    ep: NvSciIpcEndpoint,
    desc: *const c_void,
    len: usize,
    out: *mut NvSciBufAttrList,
) -> NvSciError {
    let r = (|| {
        // SAFETY: forwarded caller buffer.
        let parts = unsafe { parse(desc, len) }?;
        if out.is_null() || parts.is_empty() {
            return Err(err::BAD_PARAMETER);
        }
        channel(c, ep)?;
        live_module(c, module as usize)?;
        let mut parts = parts;
        for p in &mut parts {
            p.insert(attrs::PRIVATE_PEER, attrs::enc_u64s(&[ep]));
        }
        let h = list::add_list(
            &mut c.state().nvsci,
            false,
            module as usize,
            ListKind::Unreconciled(parts),
        );
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { out.write(h as NvSciBufAttrList) };
        Ok(())
    })();
    super::super::done(r)
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn NvSciBufAttrListIpcImportReconciled(
    c: &Call,
    module: NvSciBufModule,
    ep: NvSciIpcEndpoint,
    desc: *const c_void,
    len: usize,
    inputs: *const NvSciBufAttrList,
    n: usize,
    out: *mut NvSciBufAttrList,
) -> NvSciError {
    let r = (|| {
        // SAFETY: forwarded caller buffer.
        let mut parts = unsafe { parse(desc, len) }?;
        if out.is_null() || parts.len() != 1 {
            return Err(err::BAD_PARAMETER);
        }
        let map = parts.remove(0);
        channel(c, ep)?;
        live_module(c, module as usize)?;
        if n > 0 {
            // SAFETY: forwarded caller array.
            let hs = unsafe { list::handles(inputs.cast::<*mut c_void>(), n) }?;
            let st = c.state();
            let (_, mine) = list::gather(c, &st.nvsci, false, &hs)?;
            let types = map
                .get(&bk::TYPES)
                .map(|v| attrs::u32s(v))
                .unwrap_or_default();
            let size = attrs::get_u64(&map, bk::RAW_SIZE).unwrap_or(0);
            for p in &mine {
                let t_ok = p
                    .get(&bk::TYPES)
                    .is_none_or(|v| attrs::u32s(v).iter().all(|t| types.contains(t)));
                let s_ok = attrs::get_u64(p, bk::RAW_SIZE).is_none_or(|s| s == size);
                if !(t_ok && s_ok) {
                    c.diag(
                        D::Misuse,
                        "the imported reconciled list does not satisfy the importer's own list"
                            .into(),
                    );
                    return Err(err::ATTR_LIST_VALIDATION_FAILED);
                }
            }
        }
        let h = list::add_list(
            &mut c.state().nvsci,
            false,
            module as usize,
            ListKind::Reconciled(Arc::new(map)),
        );
        // SAFETY: checked non-null; caller out-pointer.
        unsafe { out.write(h as NvSciBufAttrList) };
        Ok(())
    })();
    super::super::done(r)
}

pub(crate) fn NvSciBufAttrListFreeDesc(c: &Call, desc: *mut c_void) {
    let p = desc as usize;
    if c.state().nvsci.descriptors.remove(&p) {
        // SAFETY: `p` came from our own malloc in `hand_out` and is freed once.
        unsafe { libc::free(desc) };
    } else {
        c.diag(
            D::Misuse,
            format!("{p:#x} is not a descriptor handed out by the simulator (or freed twice)"),
        );
    }
}
