//! Device allocations, host copies and memset.

use super::*;

/// Finds the live range holding `[p, p + n)`; reports freed ones.
pub(super) fn device_range(c: &Call, st: &State, p: CUdeviceptr, n: usize) -> R<()> {
    if p == 0 {
        return Err(INVALID_VALUE);
    }
    if let Some((start, a)) = st.allocations.range(..=p).next_back() {
        let end = start.saturating_add(a.len as u64);
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

pub(crate) unsafe fn cuMemAlloc(c: &Call, out: *mut CUdeviceptr, size: usize) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let ctx = current_ctx(c, &st)?;
        if out.is_null() || size == 0 {
            return Err(INVALID_VALUE);
        }
        let region = Region::anonymous(size).map_err(|_| OUT_OF_MEMORY)?;
        let p = st.add_allocation(region.base(), ctx, size, AllocKind::Alloc, region);
        // SAFETY: checked non-null; caller pointer.
        unsafe { put(out, p) }
    })();
    done(r)
}

pub(crate) unsafe fn cuMemFree(c: &Call, p: CUdeviceptr) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        if p == 0 {
            return Ok(());
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
    host: *const c_void,
    device: CUdeviceptr,
    n: usize,
    copy: impl FnOnce(),
) -> CUresult {
    let r = (|| {
        legacy_sync(c)?;
        if n == 0 {
            return Ok(());
        }
        if host.is_null() {
            return Err(INVALID_VALUE);
        }
        let st = c.state();
        device_range(c, &st, device, n)?;
        copy();
        Ok(())
    })();
    done(r)
}

pub(crate) unsafe fn cuMemcpyHtoD(
    c: &Call,
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    sync_copy(c, src, dst, n, || {
        // SAFETY: the destination range lies in a live mapping (checked, and
        // kept alive by the held lock); the source is the caller's `n` bytes.
        unsafe { cmem::copy(src.cast::<u8>(), dst as usize as *mut u8, n) };
    })
}

pub(crate) unsafe fn cuMemcpyDtoH(
    c: &Call,
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
) -> CUresult {
    sync_copy(c, dst.cast_const(), src, n, || {
        // SAFETY: the source range lies in a live mapping (checked, kept
        // alive by the held lock); the destination is the caller's buffer.
        unsafe { cmem::copy(src as usize as *const u8, dst.cast::<u8>(), n) };
    })
}

pub(crate) unsafe fn cuMemsetD8(c: &Call, dst: CUdeviceptr, v: u8, n: usize) -> CUresult {
    let r = (|| {
        legacy_sync(c)?;
        if n == 0 {
            return Ok(());
        }
        let st = c.state();
        device_range(c, &st, dst, n)?;
        // SAFETY: the range lies in a live mapping (checked, lock held).
        unsafe { cmem::fill(dst as usize as *mut u8, v, n) };
        Ok(())
    })();
    done(r)
}
