//! Reconciliation of buf and sync lists: the rules per key, conflicts and unsupported combinations.

#![deny(unsafe_code)]

use super::*;

/// What the reconciliation needs to know about the simulated machine.
pub(crate) struct Ctx {
    /// The GPU is a Tegra iGPU.
    pub(crate) integrated: bool,
    /// The UUIDs of the simulated GPUs.
    pub(crate) gpus: Vec<[u8; 16]>,
    pub(crate) release: NvSciRelease,
}

/// Why a reconciliation failed.
pub(crate) enum Fail {
    /// Conflicting values (ReconciliationFailed), with the keys in conflict.
    Conflict(AttrMap, String),
    /// NvSciSync: a signaller/waiter mismatch or an unsupported combination
    /// (UnsupportedConfig), with the keys in conflict.
    Unsupported(AttrMap, String),
    /// A mandatory key unset or a value unsupported for the types involved
    /// (BadParameter).
    Bad(String),
    /// Something the simulator does not model (NotSupported).
    NotSimulated(String),
}

pub(super) fn conflict(key: u32, value: Box<[u8]>, why: impl Into<String>) -> Fail {
    let mut m = AttrMap::new();
    m.insert(key, value);
    Fail::Conflict(m, why.into())
}

pub(super) fn unsupported(key: u32, value: Box<[u8]>, why: impl Into<String>) -> Fail {
    let mut m = AttrMap::new();
    m.insert(key, value);
    Fail::Unsupported(m, why.into())
}

/// A key every list that sets it must set to the same bytes.
pub(super) fn same(
    parts: &[&AttrMap],
    key: u32,
    name: &str,
    out: &mut AttrMap,
) -> Result<(), Fail> {
    let mut seen: Option<&[u8]> = None;
    for p in parts {
        if let Some(v) = p.get(&key) {
            match seen {
                None => seen = Some(v),
                Some(s) if s == &**v => {}
                Some(_) => {
                    return Err(conflict(
                        key,
                        v.clone(),
                        format!("{name} differs between the lists (they must be equal)"),
                    ))
                }
            }
        }
    }
    if let Some(v) = seen {
        out.insert(key, v.into());
    }
    Ok(())
}

pub(super) fn any_true(parts: &[&AttrMap], key: u32) -> bool {
    parts.iter().any(|p| get_bool(p, key))
}

pub(super) fn gpu_union(parts: &[&AttrMap], key: u32) -> Vec<[u8; 16]> {
    let mut ids: Vec<[u8; 16]> = Vec::new();
    for p in parts {
        if let Some(v) = p.get(&key) {
            for c in v.chunks_exact(16) {
                let id = gpu_id(c);
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
    }
    ids
}

pub(super) fn align_up(v: u64, a: u64) -> Option<u64> {
    let a = a.max(1);
    v.checked_add(a - 1).map(|x| x / a * a)
}

pub(super) fn sorted_set(v: &[u8]) -> Vec<u32> {
    let mut t = u32s(v);
    t.sort_unstable();
    t.dedup();
    t
}

/// Reconciles NvSciBuf lists (already flattened into their parts), after the
/// header documentation: Types mandatory in every list and the same in all
/// (only {Image, Tensor} may mix); RawBuffer Size mandatory and equal in
/// every list that sets it; Align the largest power of two; image Layout,
/// ScanType, PlaneCount, formats and sizes mandatory and equal; GpuId the
/// union; ActualPerm the largest RequiredPerm, Readonly when none.
pub(crate) fn reconcile_buf(parts: &[&AttrMap], ctx: &Ctx) -> Result<AttrMap, Fail> {
    let mut out = AttrMap::new();
    let mut types: Option<(Vec<u32>, &[u8])> = None;
    let mut union: Vec<u32> = Vec::new();
    let mut mixed = false;
    for p in parts {
        let Some(v) = p.get(&bk::TYPES) else {
            return Err(Fail::Bad(
                "a list has no Types (mandatory in every list)".into(),
            ));
        };
        let mine = sorted_set(v);
        for t in &mine {
            if !union.contains(t) {
                union.push(*t);
            }
        }
        match &types {
            None => types = Some((mine, v)),
            Some((t, _)) if *t == mine => {}
            Some(_) => mixed = true,
        }
    }
    union.sort_unstable();
    let Some((first, first_bytes)) = types else {
        return Err(Fail::Bad("no lists".into()));
    };
    let types = if mixed {
        if union != [TYPE_IMAGE, TYPE_TENSOR] {
            return Err(conflict(
                bk::TYPES,
                first_bytes.into(),
                format!("the lists name different Types {union:?}; only exactly {{Image, Tensor}} may mix"),
            ));
        }
        union
    } else {
        first
    };
    if types != [TYPE_RAW] && types != [TYPE_IMAGE] {
        return Err(Fail::NotSimulated(format!(
            "buffer Types {types:?}: the simulator models RawBuffer alone and Image alone"
        )));
    }
    out.insert(bk::TYPES, enc_u32s(&types));
    let need_cpu = any_true(parts, bk::NEED_CPU);
    out.insert(bk::NEED_CPU, enc_bool(need_cpu));
    out.insert(bk::CPU_CACHE, enc_bool(any_true(parts, bk::CPU_CACHE)));
    let perm = parts
        .iter()
        .filter_map(|p| get_u32(p, bk::REQ_PERM))
        .max()
        .unwrap_or(BUF_READONLY);
    out.insert(bk::ACTUAL_PERM, enc_u32s(&[perm]));
    // No ISO engine is simulated, so the CPU never needs software coherency.
    out.insert(bk::CPU_SW_COH, enc_bool(false));
    if parts.iter().any(|p| p.contains_key(&bk::VIDMEM_GPU)) {
        return Err(Fail::NotSimulated(
            "VidMem_GpuId (video memory) is not simulated".into(),
        ));
    }
    let gpus = gpu_union(parts, bk::GPU_ID);
    if !gpus.is_empty() {
        out.insert(bk::GPU_ID, gpus.concat().into_boxed_slice());
    }
    reconcile_gpu_keys(parts, ctx, &gpus, need_cpu, &mut out)?;

    if types.contains(&TYPE_RAW) {
        if !parts.iter().any(|p| p.contains_key(&bk::RAW_SIZE)) {
            return Err(Fail::Bad(
                "RawBuffer Size is mandatory and no list sets it".into(),
            ));
        }
        same(parts, bk::RAW_SIZE, "RawBuffer Size", &mut out)?;
        let align = parts
            .iter()
            .filter_map(|p| get_u64(p, bk::RAW_ALIGN))
            .max()
            .unwrap_or(1);
        out.insert(bk::RAW_ALIGN, enc_u64s(&[align]));
    }
    if types.contains(&TYPE_IMAGE) {
        reconcile_image(parts, &mut out)?;
    }
    record_peers(false, parts, &mut out);
    Ok(out)
}

/// EnableGpuCache (AND per GPU, default true for a Tegra iGPU), the output
/// GpuSwNeedCacheCoherency, and EnableGpuCompression (falls back to None).
pub(super) fn reconcile_gpu_keys(
    parts: &[&AttrMap],
    ctx: &Ctx,
    gpus: &[[u8; 16]],
    need_cpu: bool,
    out: &mut AttrMap,
) -> Result<(), Fail> {
    let mut cache: Vec<bool> = gpus
        .iter()
        .map(|g| ctx.integrated && ctx.gpus.contains(g))
        .collect();
    for p in parts {
        let Some(v) = p.get(&bk::GPU_CACHE) else {
            continue;
        };
        let entries: Vec<&[u8]> = v.chunks_exact(GPU_CACHE_ENTRY).collect();
        let bad = entries.len() != 1
            || !ctx.integrated
            || entries
                .iter()
                .any(|e| !gpus.contains(&gpu_id(e)) || !ctx.gpus.contains(&gpu_id(e)));
        if bad {
            return Err(conflict(
                bk::GPU_CACHE,
                v.clone(),
                "EnableGpuCache must hold one entry, for an iGPU that is also in GpuId",
            ));
        }
        for e in entries {
            if let Some(i) = gpus.iter().position(|g| *g == gpu_id(e)) {
                cache[i] &= e[16] == 1;
            }
        }
    }
    for p in parts {
        let Some(v) = p.get(&bk::GPU_COMPRESSION) else {
            continue;
        };
        for e in v.chunks_exact(GPU_COMPRESSION_ENTRY) {
            if !gpus.contains(&gpu_id(e)) {
                return Err(conflict(
                    bk::GPU_COMPRESSION,
                    v.clone(),
                    "EnableGpuCompression names a GPU that is not in GpuId",
                ));
            }
        }
    }
    // All lists that set compression for a GPU must agree on its type.
    for g in gpus {
        let mut seen: Option<&[u8]> = None;
        for p in parts {
            if let Some(v) = p.get(&bk::GPU_COMPRESSION) {
                for e in v.chunks_exact(GPU_COMPRESSION_ENTRY) {
                    if gpu_id(e) == *g {
                        match seen {
                            None => seen = Some(&e[16..]),
                            Some(s) if s == &e[16..] => {}
                            Some(_) => {
                                return Err(conflict(
                                    bk::GPU_COMPRESSION,
                                    v.clone(),
                                    "EnableGpuCompression differs between the lists for one GPU",
                                ))
                            }
                        }
                    }
                }
            }
        }
    }
    if ctx.release.buf_version() < (2, 8) || gpus.is_empty() {
        return Ok(());
    }
    let any_uncached = cache.iter().any(|c| !c);
    let mut cache_out = Vec::new();
    let mut coherency_out = Vec::new();
    let mut compression_out = Vec::new();
    for (g, c) in gpus.iter().zip(&cache) {
        cache_out.extend_from_slice(g);
        cache_out.push(u8::from(*c));
        coherency_out.extend_from_slice(g);
        coherency_out.push(u8::from(*c && (any_uncached || need_cpu)));
        compression_out.extend_from_slice(g);
        // Whether the driver would grant compression is not known here:
        // the documented fallback (None) is what the simulator answers.
        compression_out.extend_from_slice(&0u32.to_ne_bytes());
    }
    out.insert(bk::GPU_CACHE, cache_out.into_boxed_slice());
    out.insert(bk::GPU_SW_COH, coherency_out.into_boxed_slice());
    out.insert(bk::GPU_COMPRESSION, compression_out.into_boxed_slice());
    Ok(())
}

/// The byte size of an object allocated from a reconciled buf list.
pub(crate) fn buf_size(m: &AttrMap) -> u64 {
    let raw = get_u64(m, bk::RAW_SIZE).unwrap_or(0);
    let image = get_u64(m, bk::IMG_SIZE).unwrap_or(0);
    raw.max(image)
}

/// Reconciles NvSciSync lists (flattened into their parts).
///
/// Exactly one list with the signal permission and at least one with the
/// wait permission, else UnsupportedConfig; WaiterRequireTimestamps needs
/// NeedCpuAccess in the same list (else UnsupportedConfig); video-memory
/// primitives are not supported (UnsupportedConfig); the primitive is one
/// every list accepts (the signaller's order first; a list without
/// PrimitiveInfo accepts Syncpoint and the two sysmem semaphores), else
/// UnsupportedConfig; MaxPrimitiveValue is u64::MAX only for the 64-bit
/// sysmem semaphore; ActualPerm is the union; booleans are or-ed; GpuId the
/// union.
pub(crate) fn reconcile_sync(parts: &[&AttrMap], ctx: &Ctx) -> Result<AttrMap, Fail> {
    let mut perms = Vec::with_capacity(parts.len());
    for p in parts {
        let Some(perm) = get_u64(p, sk::REQ_PERM) else {
            return Err(unsupported(
                sk::REQ_PERM,
                enc_u64s(&[0]),
                "a list without RequiredPerm is neither signaller nor waiter (not known how the real library treats it; refused)",
            ));
        };
        perms.push(perm);
    }
    let signalers = perms.iter().filter(|p| *p & PERM_SIGNAL != 0).count();
    let waiters = perms.iter().filter(|p| *p & PERM_WAIT != 0).count();
    if signalers != 1 || waiters == 0 {
        return Err(unsupported(
            sk::REQ_PERM,
            enc_u64s(&perms),
            format!("{signalers} signaller list(s) and {waiters} waiter list(s); exactly one signaller and at least one waiter are needed"),
        ));
    }
    for p in parts {
        if get_bool(p, sk::TIMESTAMPS) && !get_bool(p, sk::NEED_CPU) {
            return Err(unsupported(
                sk::TIMESTAMPS,
                enc_bool(true),
                "WaiterRequireTimestamps needs NeedCpuAccess in the same list",
            ));
        }
    }
    let vidmem = |t: &u32| matches!(*t, PRIM_VIDMEM_SEMAPHORE | PRIM_VIDMEM_SEMAPHORE_64);
    for p in parts {
        if let Some(v) = p.get(&sk::PRIMITIVE) {
            if u32s(v).iter().any(vidmem) {
                return Err(unsupported(
                    sk::PRIMITIVE,
                    v.clone(),
                    "video-memory semaphore primitives are not supported",
                ));
            }
        }
    }
    if any_true(parts, sk::TIMESTAMPS) {
        return Err(Fail::NotSimulated(
            "WaiterRequireTimestamps (fence timestamps are not simulated)".into(),
        ));
    }
    let signaler = perms
        .iter()
        .position(|p| *p & PERM_SIGNAL != 0)
        .and_then(|i| parts.get(i));
    let default_order: Vec<u32> = if ctx.integrated {
        vec![
            PRIM_SYNCPOINT,
            PRIM_SYSMEM_SEMAPHORE,
            PRIM_SYSMEM_SEMAPHORE_64,
        ]
    } else {
        vec![
            PRIM_SYSMEM_SEMAPHORE,
            PRIM_SYSMEM_SEMAPHORE_64,
            PRIM_SYNCPOINT,
        ]
    };
    let mut candidates = signaler
        .and_then(|p| p.get(&sk::PRIMITIVE))
        .map(|v| u32s(v))
        .unwrap_or(default_order);
    for p in parts {
        if let Some(v) = p.get(&sk::PRIMITIVE) {
            let theirs = u32s(v);
            candidates.retain(|c| theirs.contains(c));
            if candidates.is_empty() {
                return Err(unsupported(
                    sk::PRIMITIVE,
                    v.clone(),
                    "no primitive type that signaller and waiters all support",
                ));
            }
        }
    }
    let Some(&prim) = candidates.first() else {
        return Err(unsupported(
            sk::PRIMITIVE,
            enc_u32s(&[0]),
            "no primitive type",
        ));
    };
    let max = if prim == PRIM_SYSMEM_SEMAPHORE_64 {
        u64::MAX
    } else {
        u64::from(u32::MAX)
    };
    let mut out = AttrMap::new();
    out.insert(
        sk::ACTUAL_PERM,
        enc_u64s(&[perms.iter().fold(0, |a, p| a | p)]),
    );
    out.insert(sk::PRIMITIVE, enc_u32s(&[prim]));
    out.insert(sk::MAX_VALUE, enc_u64s(&[max]));
    for k in [
        sk::NEED_CPU,
        sk::CTX_INSENSITIVE,
        sk::TIMESTAMPS,
        sk::DETERMINISTIC,
    ] {
        if ctx.release.sync_key_known(k) {
            out.insert(k, enc_bool(any_true(parts, k)));
        }
    }
    let gpus = gpu_union(parts, sk::GPU_ID);
    if !gpus.is_empty() {
        out.insert(sk::GPU_ID, gpus.concat().into_boxed_slice());
    }
    record_peers(true, parts, &mut out);
    Ok(out)
}
