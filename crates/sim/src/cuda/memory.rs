//! Device allocations, host copies and memset.

use super::*;

/// Finds the live range holding `[p, p + n)`; reports freed ones.
pub(super) fn device_range(c: &Call, st: &State, p: CUdeviceptr, n: usize) -> R<()> {
    if p == 0 {
        return Err(INVALID_VALUE);
    }
    if let Some((start, a)) = st.allocations.range(..=p).next_back() {
        let end = start.saturating_add(a.len as u64);
        if p < end && matches!(a.kind, AllocKind::Host { mapped: false, .. }) {
            c.diag(
                D::Misuse,
                format!("{p:#x} is pinned host memory allocated without CU_MEMHOSTALLOC_DEVICEMAP: not device-accessible"),
            );
            return Err(INVALID_VALUE);
        }
        if p < end {
            if p.saturating_add(n as u64) <= end {
                return Ok(());
            }
            c.diag(
                D::OutOfBounds,
                format!("{n} bytes at {p:#x} run past the end of the allocation at {start:#x} ({} bytes)", a.len),
            );
            return Err(INVALID_VALUE);
        }
    }
    if st.gone.contains_key(&p) {
        return Err(not_live(c, st, "device pointer", p, false, INVALID_VALUE));
    }
    c.diag(
        D::UnknownHandle,
        format!("{p:#x} is not device memory of this simulator"),
    );
    Err(INVALID_VALUE)
}

/// Synchronous copies run after the work of the legacy NULL stream.
pub(super) fn legacy_sync(c: &Call) -> R {
    let cores = {
        let st = c.state();
        init(&st)?;
        let ctx = current_ctx(c, &st)?;
        blocking_cores(&st, ctx)
    };
    wait_cores(c, cores, "a synchronous copy")
}

pub(crate) fn cuMemAlloc(c: &Call, out: CMut<CUdeviceptr>, size: usize) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let ctx = current_ctx(c, &st)?;
        if out.is_null() || size == 0 {
            return Err(INVALID_VALUE);
        }
        let region = Region::anonymous(size).map_err(|_| OUT_OF_MEMORY)?;
        let p = st.add_allocation(region.base(), ctx, size, AllocKind::Alloc, region);
        put(out, p)
    })();
    done(r)
}

pub(crate) fn cuMemFree(c: &Call, p: CUdeviceptr) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        if p == 0 {
            return Ok(());
        }
        if st.egl_streams.presents(p) {
            c.diag(
                D::Misuse,
                format!(
                    "cuMemFree({p:#x}): the memory of a frame presented to an EGLStream is freed \
                     before the producer disconnected (the header: undefined behaviour); the \
                     simulator keeps it"
                ),
            );
            return Err(INVALID_VALUE);
        }
        if let Some(a) = st.allocations.get(&p) {
            if matches!(a.kind, AllocKind::Host { .. }) {
                c.diag(
                    D::Misuse,
                    format!("cuMemFree({p:#x}): pinned host memory is freed with cuMemFreeHost (registered memory is unregistered with cuMemHostUnregister)"),
                );
                return Err(INVALID_VALUE);
            }
        }
        match st.allocations.remove(&p) {
            Some(a) => {
                drop(a);
                st.gone.insert(p, GoneWhy::Destroyed);
                Ok(())
            }
            None => Err(not_live(c, &st, "device pointer", p, true, INVALID_VALUE)),
        }
    })();
    done(r)
}

/// What the synchronous host<->device copies share: the legacy stream synchronises, nothing
/// happens for `n == 0`, a NULL host pointer is refused, the device range must lie in one live
/// allocation; then `copy` runs with the state lock held (keeping that allocation alive).
fn sync_copy(
    c: &Call,
    host_null: bool,
    device: CUdeviceptr,
    n: usize,
    copy: impl FnOnce(&State) -> bool,
) -> CUresult {
    let r = (|| {
        legacy_sync(c)?;
        if n == 0 {
            return Ok(());
        }
        if host_null {
            return Err(INVALID_VALUE);
        }
        let st = c.state();
        device_range(c, &st, device, n)?;
        if !copy(&st) {
            c.diag(
                D::Internal,
                format!("{n} bytes at {device:#x}: a checked device range without its mapping"),
            );
            return Err(INVALID_VALUE);
        }
        Ok(())
    })();
    done(r)
}

pub(crate) fn cuMemcpyHtoD(c: &Call, dst: CUdeviceptr, src: Option<&[u8]>, n: usize) -> CUresult {
    sync_copy(c, src.is_none(), dst, n, |st| {
        src.is_some_and(|src| st.device_write(dst, src))
    })
}

pub(crate) fn cuMemcpyDtoH(
    c: &Call,
    dst: Option<&mut [u8]>,
    src: CUdeviceptr,
    n: usize,
) -> CUresult {
    let null = dst.is_none();
    sync_copy(c, null, src, n, |st| {
        dst.is_some_and(|dst| st.device_read(src, dst))
    })
}

pub(crate) fn cuMemsetD8(c: &Call, dst: CUdeviceptr, v: u8, n: usize) -> CUresult {
    let r = (|| {
        legacy_sync(c)?;
        if n == 0 {
            return Ok(());
        }
        let st = c.state();
        device_range(c, &st, dst, n)?;
        if !st.device_fill(dst, v, n) {
            c.diag(
                D::Internal,
                format!("{n} bytes at {dst:#x}: a checked device range without its mapping"),
            );
            return Err(INVALID_VALUE);
        }
        Ok(())
    })();
    done(r)
}
