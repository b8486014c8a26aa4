//! NvSciSync fences: generate, signal, CPU wait, duplicate, clear, extract/update, timestamps.

use super::*;

/// The core of a handle that may signal from the CPU.
pub(super) fn cpu_signaler(c: &Call, h: usize) -> R<Arc<SyncCore>> {
    let st = c.state();
    let Some(rec) = st.nvsci.sync_objs.get(&h) else {
        return Err(unknown(c, &st.nvsci, "NvSciSync object", h));
    };
    if rec.perm & attrs::PERM_SIGNAL == 0 || !attrs::get_bool(&rec.core.attrs, sk::NEED_CPU) {
        c.diag(
            D::Misuse,
            format!("object {h:#x}: a CPU signal needs signal permission and NeedCpuAccess"),
        );
        return Err(err::BAD_PARAMETER);
    }
    Ok(Arc::clone(&rec.core))
}

pub(crate) fn NvSciSyncObjGenerateFence(
    c: &Call,
    obj: Handle<NvSciSyncObj>,
    out: CMut<NvSciSyncFence>,
) -> NvSciError {
    if out.is_null() {
        return err::BAD_PARAMETER;
    }
    let r = cpu_signaler(c, obj.addr()).map(|core| {
        let value = core.sem.reserve_next();
        out.write(fence::encode(SimFence {
            object_id: core.id,
            value,
        }));
    });
    super::super::done(r)
}

pub(crate) fn NvSciSyncObjSignal(c: &Call, obj: Handle<NvSciSyncObj>) -> NvSciError {
    super::super::done(cpu_signaler(c, obj.addr()).map(|core| {
        core.sem.increment();
    }))
}

/// The infinite timeout of `FenceWait` (and of IPC imports), in microseconds.
pub(crate) const INFINITE_US: i64 = i64::MAX / 1000;

/// A timeout in microseconds: -1 or `[0, i64::MAX / 1000]`, the maximum
/// also meaning infinite (`None`); anything else BadParameter.
pub(crate) fn timeout(us: i64) -> R<Option<Duration>> {
    if us == -1 || us == INFINITE_US {
        Ok(None)
    } else if !(0..INFINITE_US).contains(&us) {
        Err(err::BAD_PARAMETER)
    } else {
        Ok(Some(Duration::from_micros(us.unsigned_abs())))
    }
}

pub(crate) fn NvSciSyncFenceWait(
    c: &Call,
    f: CPtr<NvSciSyncFence>,
    ctx: Handle<NvSciSyncCpuWaitContext>,
    timeout_us: i64,
) -> NvSciError {
    let r = (|| {
        let f = get(f)?;
        let limit = timeout(timeout_us)?;
        let (sem, busy, target) = {
            let st = c.state();
            let Some(w) = st.nvsci.wait_contexts.get(&(ctx.addr())) else {
                return Err(unknown(c, &st.nvsci, "CPU wait context", ctx.addr()));
            };
            let busy = Arc::clone(&w.busy);
            let sf = match fence::decode(&f) {
                FenceContent::Cleared => return Ok(()),
                FenceContent::Garbage => {
                    c.diag(
                        D::Misuse,
                        "NvSciSyncFence holds bytes the simulator did not write".into(),
                    );
                    return Err(err::BAD_PARAMETER);
                }
                FenceContent::Fence(sf) => sf,
            };
            let cpu_waiter = st.nvsci.sync_objs.values().any(|r| {
                r.core.id == sf.object_id
                    && r.perm & attrs::PERM_WAIT != 0
                    && attrs::get_bool(&r.core.attrs, sk::NEED_CPU)
            });
            let nvsci_object = st
                .nvsci
                .sync_objs
                .values()
                .any(|r| r.core.id == sf.object_id);
            if nvsci_object && !cpu_waiter {
                c.diag(
                    D::Misuse,
                    "a CPU wait needs an object handle with wait permission whose list asked for NeedCpuAccess".into(),
                );
                return Err(err::BAD_PARAMETER);
            }
            let Some(e) = st.sync_objects.values().find(|e| e.id == sf.object_id) else {
                c.diag(
                    D::Misuse,
                    format!("fence of sync object {} waited on after every handle of the object was freed (the real library keeps the object alive while fences refer to it; the simulator does not)", sf.object_id),
                );
                return Err(err::BAD_PARAMETER);
            };
            (Arc::clone(&e.sem), busy, sf.value)
        };
        if busy.swap(true, Ordering::AcqRel) {
            c.diag(
                D::Misuse,
                "a CPU wait context used by two waits at once (it is not for concurrent use)"
                    .into(),
            );
            return Err(err::BUSY);
        }
        let hang = c.inst.config.hang_timeout;
        let deadline = Instant::now().checked_add(limit.unwrap_or(hang));
        let end = sem.wait(target, deadline, &|| false);
        busy.store(false, Ordering::Release);
        match (end, limit) {
            (WaitEnd::Reached, _) => Ok(()),
            (_, Some(_)) => Err(err::TIMEOUT),
            (_, None) => {
                c.diag(D::Hang, format!("an infinite CPU wait on fence value {target} was still waiting after {hang:?}"));
                Err(err::TIMEOUT)
            }
        }
    })();
    super::super::done(r)
}

pub(crate) fn NvSciSyncFenceDup(
    c: &Call,
    src: CPtr<NvSciSyncFence>,
    dst: CMut<NvSciSyncFence>,
) -> NvSciError {
    let r = (|| {
        if src.addr() == dst.addr() {
            c.diag(
                D::Misuse,
                "FenceDup with the same fence as source and destination".into(),
            );
            return Err(err::BAD_PARAMETER);
        }
        let f = get(src)?;
        if fence::decode(&f) == FenceContent::Garbage {
            c.diag(
                D::Misuse,
                "NvSciSyncFence holds bytes the simulator did not write".into(),
            );
            return Err(err::BAD_PARAMETER);
        }
        put(dst, f)
    })();
    super::super::done(r)
}

pub(crate) fn NvSciSyncFenceClear(_c: &Call, f: CMut<NvSciSyncFence>) {
    if !f.is_null() {
        f.write(NvSciSyncFence::default());
    }
}

pub(crate) fn NvSciSyncFenceExtractFence(
    c: &Call,
    f: CPtr<NvSciSyncFence>,
    id: CMut<u64>,
    value: CMut<u64>,
) -> NvSciError {
    let r = (|| {
        let f = get(f)?;
        if id.is_null() || value.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        match fence::decode(&f) {
            FenceContent::Cleared => Err(err::CLEARED_FENCE),
            FenceContent::Garbage => {
                c.diag(
                    D::Misuse,
                    "NvSciSyncFence holds bytes the simulator did not write".into(),
                );
                Err(err::BAD_PARAMETER)
            }
            FenceContent::Fence(sf) => {
                id.write(0);
                value.write(sf.value);
                Ok(())
            }
        }
    })();
    super::super::done(r)
}

/// `NvSciSyncFenceUpdateFence`: the output is cleared first; an id or value
/// outside the primitive's range is Overflow (ids `[0, u32::MAX - 1]` for
/// syncpoints, `[0, primitives - 1]` for semaphores, and the simulated
/// objects have one primitive; values up to MaxPrimitiveValue). Deterministic
/// fences are not required.
pub(crate) fn NvSciSyncFenceUpdateFence(
    c: &Call,
    obj: Handle<NvSciSyncObj>,
    id: u64,
    value: u64,
    f: CMut<NvSciSyncFence>,
) -> NvSciError {
    let h = obj.addr();
    let r = (|| {
        if f.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        let st = c.state();
        let Some(rec) = st.nvsci.sync_objs.get(&h) else {
            return Err(unknown(c, &st.nvsci, "NvSciSync object", h));
        };
        f.write(NvSciSyncFence::default());
        let prim = attrs::get_u32(&rec.core.attrs, sk::PRIMITIVE).unwrap_or(attrs::PRIM_SYNCPOINT);
        let id_max = if prim == attrs::PRIM_SYNCPOINT {
            u64::from(u32::MAX) - 1
        } else {
            0
        };
        if id > id_max {
            c.diag(
                D::Misuse,
                format!("fence id {id} is outside [0, {id_max}] for primitive type {prim}"),
            );
            return Err(err::OVERFLOW);
        }
        let max = attrs::get_u64(&rec.core.attrs, sk::MAX_VALUE).unwrap_or(u64::from(u32::MAX));
        if value > max {
            c.diag(
                D::Misuse,
                format!("fence value {value} is above the primitive's maximum {max}"),
            );
            return Err(err::OVERFLOW);
        }
        if id != 0 {
            c.diag(
                D::Unimplemented,
                format!("fence id {id}: a simulated object has one syncpoint (id 0); fences on other syncpoints are not simulated"),
            );
            return Err(err::NOT_SUPPORTED);
        }
        f.write(fence::encode(SimFence {
            object_id: rec.core.id,
            value,
        }));
        Ok(())
    })();
    super::super::done(r)
}

/// `NvSciSyncFenceGetTimestamp`: ClearedFence for a cleared fence; any
/// other fence has no timestamps here (the simulator refuses
/// WaiterRequireTimestamps at reconciliation), which the header answers
/// with BadParameter.
pub(crate) fn NvSciSyncFenceGetTimestamp(
    c: &Call,
    f: CPtr<NvSciSyncFence>,
    us: CMut<u64>,
) -> NvSciError {
    let r = (|| {
        let f = get(f)?;
        if us.is_null() {
            return Err(err::BAD_PARAMETER);
        }
        match fence::decode(&f) {
            FenceContent::Cleared => Err(err::CLEARED_FENCE),
            _ => {
                c.diag(
                    D::Misuse,
                    "FenceGetTimestamp on a fence whose object did not reconcile timestamps".into(),
                );
                Err(err::BAD_PARAMETER)
            }
        }
    })();
    super::super::done(r)
}
