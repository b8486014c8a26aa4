//! NvSciBuf over IPC: buffer objects exported and imported.

use super::*;

pub(crate) fn NvSciBufObjIpcExport(
    c: &Call,
    obj: Handle<NvSciBufObj>,
    perm: NvSciBufAttrValAccessPerm,
    ep: NvSciIpcEndpoint,
    desc: CMut<NvSciBufObjIpcExportDescriptor>,
) -> NvSciError {
    let h = obj.addr();
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
        let e = endpoint(c, ep)?;
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
            4 => granted as u32,
            p if p > have => {
                c.diag(
                    D::Misuse,
                    format!("cannot export permission {p} from a handle with {have}"),
                );
                return Err(err::BAD_PARAMETER);
            }
            p if u64::from(p) < granted => {
                c.diag(
                    D::Misuse,
                    format!("export permission {p} is below the {granted} the peer was granted at reconciliation"),
                );
                return Err(err::INVALID_OPERATION);
            }
            p => p,
        };
        let id = new_uid();
        e.send_object(c, id, &core.fd)?;
        // The descriptor is packed: fill aligned words, then move them in.
        let mut words = [0u64; 32];
        words[..4].copy_from_slice(&[BUF_TAG, id, core.size, u64::from(grant)]);
        let d = NvSciBufObjIpcExportDescriptor { data: words };
        desc.write(d);
        Ok(())
    })();
    super::super::done(r)
}

pub(crate) fn NvSciBufObjIpcImport(
    c: &Call,
    ep: NvSciIpcEndpoint,
    desc: CPtr<NvSciBufObjIpcExportDescriptor>,
    list: Handle<NvSciBufAttrList>,
    min_perm: NvSciBufAttrValAccessPerm,
    timeout_us: i64,
    out: CMut<NvSciBufObj>,
) -> NvSciError {
    let r = (|| {
        let d = get(desc)?;
        if out.is_null() || d.data[0] != BUF_TAG {
            return Err(err::BAD_PARAMETER);
        }
        let (id, size, grant) = (d.data[1], d.data[2], d.data[3] as u32);
        let (module, map) = list::reconciled(c, false, list.addr())?;
        if attrs::buf_size(&map) != size {
            c.diag(
                D::Misuse,
                "the reconciled list does not describe the exported object".into(),
            );
            return Err(err::BAD_PARAMETER);
        }
        let e = endpoint(c, ep)?;
        if e.claimed(id) {
            c.diag(D::Misuse, "this NvSciBuf object descriptor was imported already (a descriptor imports once; the real library's answer is not known, refused)".into());
            return Err(err::BAD_PARAMETER);
        }
        // The header says the timeout is ignored (the real library does not
        // wait); the simulator's fd waits at most the caller's limit.
        let fd = await_object(c, &e, id, timeout_us, "NvSciBufObjIpcImport")?;
        // From here on a refusal drops `fd`: nothing stays behind.
        if let Err(why) = buf::check_imported_memory(std::os::fd::AsFd::as_fd(&fd), size) {
            c.diag(
                D::Misuse,
                format!("NvSciBufObjIpcImport refused: {why} (nvscibuf.h: BadParameter for an invalid descriptor)"),
            );
            return Err(err::BAD_PARAMETER);
        }
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
        out.write(h as NvSciBufObj);
        Ok(())
    })();
    super::super::done(r)
}
