//! Attribute lists, shared by both halves: NvSciBuf and NvSciSync lists are
//! the same records (`AttrListRec`) in one registry, told apart by `sync`;
//! creating, freeing, setting, reading back, gathering and reconciling them is
//! one implementation, which the entry points of `buf.rs` and `sync.rs` call.

use std::ffi::c_void;
use std::sync::Arc;

use tegra_interop_sys::nvsci::NvSciError;

use super::attrs::{self, bk, AttrListRec, AttrMap, Bad, Dir, Fail, ListKind, Lookup};
use super::{err, new_handle, unknown, Kind, NvSciState, R};
use crate::cmem::{CArr, CMut, KeyValuePair};
use crate::instance::Call;
use crate::DiagnosticKind as D;

/// Closes a buf or sync module.
pub(crate) fn close_module(c: &Call, sync: bool, m: usize) {
    let mut st = c.state();
    let ns = &mut st.nvsci;
    let map = if sync {
        &mut ns.sync_modules
    } else {
        &mut ns.buf_modules
    };
    match map.get_mut(&m) {
        Some(rec) if !rec.closed => {
            rec.closed = true;
            if rec.users == 0 {
                map.remove(&m);
            }
            ns.gone.insert(m);
        }
        Some(_) => c.diag(D::DoubleDestroy, format!("module {m:#x} closed twice")),
        None => {
            let _ = unknown(c, ns, "module", m);
        }
    }
}

/// Creates an empty unreconciled list of a buf or sync module.
pub(crate) fn create_list(c: &Call, sync: bool, module: usize) -> R<usize> {
    let mut st = c.state();
    let ns = &mut st.nvsci;
    if ns.retain_module(sync, module).is_err() {
        return Err(unknown(c, ns, "module", module));
    }
    let h = new_handle(if sync { Kind::SyncList } else { Kind::BufList });
    ns.lists.insert(
        h,
        AttrListRec {
            sync,
            module,
            kind: ListKind::Unreconciled(vec![AttrMap::new()]),
            owner: None,
            writable: true,
        },
    );
    Ok(h)
}

/// Adds a finished list (reconciled, conflict or imported) to `module`.
pub(crate) fn add_list(ns: &mut NvSciState, sync: bool, module: usize, kind: ListKind) -> usize {
    let h = new_handle(if sync { Kind::SyncList } else { Kind::BufList });
    ns.add_module_user(sync, module);
    ns.lists.insert(
        h,
        AttrListRec {
            sync,
            module,
            kind,
            owner: None,
            writable: false,
        },
    );
    h
}

/// Frees a buf or sync list.
pub(crate) fn free_list(c: &Call, sync: bool, h: usize) {
    let mut st = c.state();
    let ns = &mut st.nvsci;
    match ns.lists.get(&h) {
        Some(l) if l.sync == sync && l.owner.is_some() => c.diag(
            D::Misuse,
            format!("attribute list {h:#x} belongs to its object (ObjGetAttrList); it is freed with the object"),
        ),
        Some(l) if l.sync == sync => {
            let module = l.module;
            ns.lists.remove(&h);
            ns.gone.insert(h);
            ns.release_module(sync, module);
        }
        _ => {
            if ns.gone.contains(&h) {
                c.diag(D::DoubleDestroy, format!("attribute list {h:#x} freed twice"));
            } else {
                let _ = unknown(c, ns, "attribute list", h);
            }
        }
    }
}

/// Sets `pairs` (key, bytes) on a list made by `AttrListCreate`, after the
/// header rules: the list is unreconciled and writable (not imported or
/// appended), every key is a key of the claimed release, input (not
/// output-only), set at most once (per call and per list), of a valid
/// length and value, and (NvSciBuf) of a buffer type named by the Types
/// already set or set in the same call. Everything is checked before
/// anything is stored.
pub(crate) fn set_pairs(c: &Call, sync: bool, h: usize, pairs: Vec<(u32, Vec<u8>)>) -> R {
    let release = c.inst.config.nvsci_release;
    let mut st = c.state();
    let ns = &mut st.nvsci;
    let Some(l) = ns.lists.get_mut(&h).filter(|l| l.sync == sync) else {
        return Err(unknown(c, ns, "attribute list", h));
    };
    let writable = l.writable;
    let ListKind::Unreconciled(parts) = &mut l.kind else {
        c.diag(
            D::Misuse,
            format!("SetAttrs on the reconciled or conflict list {h:#x} (only unreconciled lists are writable)"),
        );
        return Err(err::BAD_PARAMETER);
    };
    let ([map], true) = (parts.as_mut_slice(), writable) else {
        c.diag(
            D::Misuse,
            format!("SetAttrs on the imported or appended list {h:#x} (read-only)"),
        );
        return Err(err::BAD_PARAMETER);
    };
    let lib = if sync { "NvSciSync" } else { "NvSciBuf" };
    for (i, (key, bytes)) in pairs.iter().enumerate() {
        let found = if sync {
            attrs::sync_key(release, *key)
        } else {
            attrs::buf_key(release, *key)
        };
        let info = match found {
            Lookup::Known(info) => info,
            Lookup::NotInRelease(name) => {
                c.diag(
                    D::Misuse,
                    format!("{lib} key {key:#x} ({name}) does not exist in {}: refused like any unknown key", release.name()),
                );
                return Err(err::BAD_PARAMETER);
            }
            Lookup::NotSimulated(name) => {
                c.diag(
                    D::Unimplemented,
                    format!("{lib} key {key:#x} ({name}) is not simulated (refused; not known how the real library behaves with it here)"),
                );
                return Err(err::NOT_SUPPORTED);
            }
            Lookup::Unknown => {
                c.diag(D::Misuse, format!("{key:#x} is not an {lib} attribute key"));
                return Err(err::BAD_PARAMETER);
            }
        };
        if info.dir == Dir::Out {
            c.diag(
                D::Misuse,
                format!(
                    "{lib} key {key:#x} ({}) is output-only: the library writes it",
                    info.name
                ),
            );
            return Err(err::BAD_PARAMETER);
        }
        if map.contains_key(key) || pairs[..i].iter().any(|(k, _)| k == key) {
            c.diag(
                D::Misuse,
                format!("{lib} key {key:#x} ({}) is already set on list {h:#x} or given twice (each key at most once per list)", info.name),
            );
            return Err(err::BAD_PARAMETER);
        }
        match attrs::check_value(release, &info, bytes) {
            Ok(()) => {}
            Err(Bad::Invalid(m)) => {
                c.diag(D::Misuse, format!("{lib} key {key:#x}: {m}"));
                return Err(err::BAD_PARAMETER);
            }
            Err(Bad::NotSimulated(m)) => {
                c.diag(D::Unimplemented, format!("{lib} key {key:#x}: {m}"));
                return Err(err::NOT_SUPPORTED);
            }
        }
        if let (false, Some(t)) = (sync, attrs::buf_key_type(*key)) {
            let types = map
                .get(&bk::TYPES)
                .map(|v| attrs::u32s(v))
                .or_else(|| {
                    pairs
                        .iter()
                        .find(|(k, _)| *k == bk::TYPES)
                        .map(|(_, v)| attrs::u32s(v))
                })
                .unwrap_or_default();
            if !types.contains(&t) {
                c.diag(
                    D::Misuse,
                    format!("NvSciBuf key {key:#x} ({}) belongs to buffer type {t}, which the list's Types {types:?} (set before or in the same call) does not name", info.name),
                );
                return Err(err::BAD_PARAMETER);
            }
        }
    }
    for (key, bytes) in pairs {
        map.insert(key, bytes.into_boxed_slice());
    }
    Ok(())
}

/// Looks a list up for `GetAttrs` and answers each key with a pointer into
/// the list's storage (NULL / 0 when not set). Keys the claimed release
/// lacks: BadParameter. NvSciBuf also refuses output-only keys on
/// unreconciled lists and input-only keys on reconciled ones (header rule);
/// NvSciSync documents no such restriction.
pub(crate) fn lookup(
    c: &Call,
    sync: bool,
    h: usize,
    keys: &[u32],
) -> R<Vec<(*const c_void, usize)>> {
    let release = c.inst.config.nvsci_release;
    let st = c.state();
    let ns = &st.nvsci;
    let Some(l) = ns.lists.get(&h).filter(|l| l.sync == sync) else {
        return Err(unknown(c, ns, "attribute list", h));
    };
    let Some(map) = l.readable() else {
        c.diag(D::Misuse, format!("GetAttrs on the multi-part list {h:#x}"));
        return Err(err::BAD_PARAMETER);
    };
    let reconciled = matches!(l.kind, ListKind::Reconciled(_));
    let lib = if sync { "NvSciSync" } else { "NvSciBuf" };
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        let found = if sync {
            attrs::sync_key(release, *k)
        } else {
            attrs::buf_key(release, *k)
        };
        match found {
            Lookup::Known(info) if !sync && reconciled && info.dir == Dir::In => {
                c.diag(
                    D::Misuse,
                    format!(
                        "GetAttrs of the input-only key {k:#x} ({}) on a reconciled list",
                        info.name
                    ),
                );
                return Err(err::BAD_PARAMETER);
            }
            Lookup::Known(info) if !sync && !reconciled && info.dir == Dir::Out => {
                c.diag(
                    D::Misuse,
                    format!(
                        "GetAttrs of the output-only key {k:#x} ({}) on an unreconciled list",
                        info.name
                    ),
                );
                return Err(err::BAD_PARAMETER);
            }
            Lookup::Known(_) => {}
            Lookup::NotInRelease(name) => {
                c.diag(
                    D::Misuse,
                    format!(
                        "{lib} key {k:#x} ({name}) does not exist in {}",
                        release.name()
                    ),
                );
                return Err(err::BAD_PARAMETER);
            }
            Lookup::NotSimulated(name) => {
                c.diag(
                    D::Unimplemented,
                    format!("{lib} key {k:#x} ({name}) is not simulated"),
                );
                return Err(err::NOT_SUPPORTED);
            }
            Lookup::Unknown => {
                c.diag(D::Misuse, format!("{k:#x} is not an {lib} attribute key"));
                return Err(err::BAD_PARAMETER);
            }
        }
        // The bytes live in a boxed slice owned by the list (or by the
        // reconciled map shared with objects): they stay put while the
        // list lives and is not modified, as GetAttrs promises.
        out.push(match map.get(k) {
            Some(v) => (v.as_ptr().cast::<c_void>(), v.len()),
            None => (std::ptr::null(), 0),
        });
    }
    Ok(out)
}

/// Reads a handle array (from `crate::abi`); NULL or empty: BadParameter.
pub(crate) fn handles<T>(lists: Option<&[*mut T]>) -> R<Vec<usize>> {
    match lists {
        Some(l) if !l.is_empty() => Ok(l.iter().map(|h| *h as usize).collect()),
        _ => Err(err::BAD_PARAMETER),
    }
}

/// Checks that `hs` are unreconciled lists of one module and returns the
/// module and every part.
pub(crate) fn gather(
    c: &Call,
    ns: &NvSciState,
    sync: bool,
    hs: &[usize],
) -> R<(usize, Vec<AttrMap>)> {
    let mut module = None;
    let mut parts = Vec::new();
    for (i, h) in hs.iter().enumerate() {
        if hs[..i].contains(h) {
            c.diag(
                D::Misuse,
                format!("list {h:#x} appears twice in the reconcile input"),
            );
            return Err(err::BAD_PARAMETER);
        }
        let Some(l) = ns.lists.get(h).filter(|l| l.sync == sync) else {
            return Err(unknown(c, ns, "attribute list", *h));
        };
        let ListKind::Unreconciled(p) = &l.kind else {
            c.diag(
                D::Misuse,
                format!(
                    "list {h:#x} is not unreconciled; reconcile takes the participants' own lists"
                ),
            );
            return Err(err::BAD_PARAMETER);
        };
        if module.is_some_and(|m| m != l.module) {
            c.diag(
                D::Misuse,
                "lists of different modules reconciled together".into(),
            );
            return Err(err::BAD_PARAMETER);
        }
        module = Some(l.module);
        parts.extend(p.iter().cloned());
    }
    module.map(|m| (m, parts)).ok_or(err::BAD_PARAMETER)
}

/// The outcome of a reconciliation attempt: the reconciled map and module,
/// or the code, having created the conflict list if asked for.
pub(crate) fn reconcile(
    c: &Call,
    sync: bool,
    hs: &[usize],
    conflict_out: Option<&mut usize>,
) -> R<(usize, Arc<AttrMap>)> {
    let ctx = attrs::Ctx {
        integrated: c.inst.config.integrated,
        gpus: (0..c.inst.config.devices)
            .map(crate::cuda::device_uuid)
            .collect(),
        release: c.inst.config.nvsci_release,
    };
    let mut st = c.state();
    let ns = &mut st.nvsci;
    let (module, parts) = gather(c, ns, sync, hs)?;
    let refs: Vec<&AttrMap> = parts.iter().collect();
    let result = if sync {
        attrs::reconcile_sync(&refs, &ctx)
    } else {
        attrs::reconcile_buf(&refs, &ctx)
    };
    let (code, conflict, why) = match result {
        Ok(m) => return Ok((module, Arc::new(m))),
        Err(Fail::Conflict(m, why)) => (err::RECONCILIATION_FAILED, Some(m), why),
        Err(Fail::Unsupported(m, why)) => (err::UNSUPPORTED_CONFIG, Some(m), why),
        Err(Fail::Bad(why)) => (err::BAD_PARAMETER, None, why),
        Err(Fail::NotSimulated(why)) => {
            c.diag(D::Unimplemented, format!("not simulated: {why}"));
            return Err(err::NOT_SUPPORTED);
        }
    };
    c.diag(D::Misuse, format!("reconciliation refused: {why}"));
    if let (Some(out), Some(m)) = (conflict_out, conflict) {
        *out = add_list(ns, sync, module, ListKind::Conflict(m));
    }
    Err(code)
}

/// `AttrListReconcile` for buf and sync lists: `lists` is the caller's
/// handle array (NULL: `None`), `out` / `conflict` its out-pointers.
pub(crate) fn reconcile_entry<T>(
    c: &Call,
    sync: bool,
    lists: Option<&[*mut T]>,
    out: CMut<*mut T>,
    conflict: CMut<*mut T>,
) -> NvSciError {
    let r = (|| {
        if out.is_null() || conflict.is_null() {
            // The conflict list pointer is required (non-safety builds).
            return Err(err::BAD_PARAMETER);
        }
        let hs = handles(lists)?;
        let mut conflict_h = 0usize;
        let want_conflict = !conflict.is_null();
        let res = reconcile(c, sync, &hs, want_conflict.then_some(&mut conflict_h));
        if want_conflict {
            conflict.write(conflict_h as *mut T);
        }
        let (module, map) = res?;
        let h = add_list(
            &mut c.state().nvsci,
            sync,
            module,
            ListKind::Reconciled(map),
        );
        out.write(h as *mut T);
        Ok(())
    })();
    super::done(r)
}

/// The reconciled map and module of a reconciled list.
pub(crate) fn reconciled(c: &Call, sync: bool, h: usize) -> R<(usize, Arc<AttrMap>)> {
    let st = c.state();
    let ns = &st.nvsci;
    match ns.lists.get(&h).filter(|l| l.sync == sync) {
        Some(AttrListRec {
            kind: ListKind::Reconciled(m),
            module,
            ..
        }) => Ok((*module, Arc::clone(m))),
        Some(_) => {
            c.diag(D::Misuse, format!("list {h:#x} is not a reconciled list"));
            Err(err::BAD_PARAMETER)
        }
        None => Err(unknown(c, ns, "attribute list", h)),
    }
}

/// Reads the pairs' keys and value bytes (SetAttrs of either half); a NULL
/// or empty array, or a pair with a NULL or empty value: BadParameter.
pub(crate) fn read_pairs<P: KeyValuePair>(pairs: Option<CArr<P>>) -> R<Vec<(u32, Vec<u8>)>> {
    let Some(pairs) = pairs.filter(|p| p.len() != 0) else {
        return Err(err::BAD_PARAMETER);
    };
    let mut out = Vec::with_capacity(pairs.len());
    for p in pairs.iter() {
        let Some(bytes) = p.value_bytes() else {
            return Err(err::BAD_PARAMETER);
        };
        out.push((p.key(), bytes.to_vec()));
    }
    Ok(out)
}

/// GetAttrs of either half: reads the pairs' keys, asks `lookup` for their
/// values and writes them back into the pairs; a NULL or empty array:
/// BadParameter.
pub(crate) fn get_pairs<P: KeyValuePair>(
    pairs: Option<&mut [P]>,
    lookup: impl FnOnce(&[u32]) -> R<Vec<(*const c_void, usize)>>,
) -> R {
    let Some(pairs) = pairs.filter(|p| !p.is_empty()) else {
        return Err(err::BAD_PARAMETER);
    };
    let keys: Vec<u32> = pairs.iter().map(|p| p.key()).collect();
    let found = lookup(&keys)?;
    for (p, (value, len)) in pairs.iter_mut().zip(found) {
        p.set_value(value, len);
    }
    Ok(())
}
