//! Pinned host memory (`cuMemHostAlloc`, `cuMemFreeHost`,
//! `cuMemHostGetDevicePointer`), the caller's memory page-locked in place
//! (`cuMemHostRegister`, `cuMemHostUnregister`) and the asynchronous copies
//! (`cuMemcpy{HtoD,DtoH,DtoD}Async`), which run in stream order.
//!
//! Registered memory is the caller's: the simulator reads and writes it in
//! place (copies, kernels through its device address) and never frees it.
//! The caller promised, by registering, that it stays mapped until it is
//! unregistered; that is all the simulator can rely on, so what it cannot
//! know about the range (I/O memory, read-only registration, ranges that
//! are not page-aligned, overlaps with its own memory) it refuses, saying
//! so (crate README).
//!
//! Pinned memory is an anonymous mapping of the simulator; its device
//! address is its host address (unified addressing, as on the measured
//! 64-bit machines). Asynchronous copies are modelled only between memory
//! the simulator owns (device ranges and pinned host memory): a pageable
//! host pointer is refused (the simulator cannot keep a caller's pageable
//! buffer alive until the copy runs; the real driver copies it
//! synchronously instead).

use super::*;

/// `CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP | WRITECOMBINED`: the flags the
/// header documents.
const HOST_ALLOC_FLAGS: u32 = 0x1 | 0x2 | 0x4;
const DEVICEMAP: u32 = 0x2;

pub(crate) fn cuMemHostAlloc(
    c: &Call,
    out: CMut<*mut c_void>,
    size: usize,
    flags: c_uint,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let ctx = current_ctx(c, &st)?;
        if out.is_null() {
            return Err(INVALID_VALUE);
        }
        if flags & !HOST_ALLOC_FLAGS != 0 {
            c.diag(
                D::Misuse,
                format!("cuMemHostAlloc flags {flags:#x}: outside the documented PORTABLE | DEVICEMAP | WRITECOMBINED"),
            );
            return Err(INVALID_VALUE);
        }
        if size == 0 {
            c.diag(
                D::Unimplemented,
                "cuMemHostAlloc of 0 bytes: the real driver's answer is unknown; refused".into(),
            );
            return Err(INVALID_VALUE);
        }
        let region = Region::anonymous(size).map_err(|_| OUT_OF_MEMORY)?;
        let base = region.base();
        st.add_allocation(
            base,
            ctx,
            size,
            AllocKind::Host {
                mapped: flags & DEVICEMAP != 0,
                registered: false,
            },
            region,
        );
        put(out, base.cast::<c_void>())
    })();
    done(r)
}

pub(crate) fn cuMemFreeHost(c: &Call, p: CMut<c_void>) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let h = p.addr() as u64;
        match st.allocations.get(&h) {
            Some(a)
                if matches!(
                    a.kind,
                    AllocKind::Host {
                        registered: true,
                        ..
                    }
                ) =>
            {
                c.diag(
                    D::Misuse,
                    format!("cuMemFreeHost({h:#x}): registered host memory is released with cuMemHostUnregister"),
                );
                Err(INVALID_VALUE)
            }
            Some(a) if matches!(a.kind, AllocKind::Host { .. }) => {
                st.allocations.remove(&h);
                st.gone.insert(h, GoneWhy::Destroyed);
                Ok(())
            }
            Some(_) => {
                c.diag(
                    D::Misuse,
                    format!("cuMemFreeHost({h:#x}): device memory is freed with cuMemFree"),
                );
                Err(INVALID_VALUE)
            }
            None => Err(not_live(
                c,
                &st,
                "pinned host pointer",
                h,
                true,
                INVALID_VALUE,
            )),
        }
    })();
    done(r)
}

/// `CU_MEMHOSTREGISTER_PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY`: the
/// flags the header documents.
const HOST_REGISTER_FLAGS: u32 = 0x1 | 0x2 | 0x4 | 0x8;
/// `CU_MEMHOSTREGISTER_IOMEMORY`: for a device's memory mapped into the
/// process; the simulator has none (refused as the H100 refused it for
/// host memory).
const HOST_REGISTER_IOMEMORY: u32 = 0x4;
/// `CU_MEMHOSTREGISTER_READ_ONLY`: documented, not modelled.
const HOST_REGISTER_READ_ONLY: u32 = 0x8;

/// The refusals of `cuMemHostRegister` before the state is touched: NULL,
/// flags, size, alignment.
fn check_register(c: &Call, h: u64, size: usize, flags: c_uint) -> R {
    if h == 0 {
        return Err(INVALID_VALUE);
    }
    if flags & !HOST_REGISTER_FLAGS != 0 {
        c.diag(
            D::Misuse,
            format!("cuMemHostRegister flags {flags:#x}: outside the documented PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY"),
        );
        return Err(INVALID_VALUE);
    }
    if flags & HOST_REGISTER_IOMEMORY != 0 {
        c.diag(
            D::Misuse,
            format!("cuMemHostRegister flags {flags:#x}: IOMEMORY is for a device's memory mapped into the process; this is host memory (the H100 answered INVALID_VALUE for a Vulkan host mapping)"),
        );
        return Err(INVALID_VALUE);
    }
    if flags & HOST_REGISTER_READ_ONLY != 0 {
        c.diag(
            D::Unimplemented,
            format!("cuMemHostRegister flags {flags:#x}: READ_ONLY registrations are not modelled; refused"),
        );
        return Err(NOT_SUPPORTED);
    }
    let page = shm::page_size() as u64;
    if size == 0 || !h.is_multiple_of(page) || !(size as u64).is_multiple_of(page) {
        c.diag(
            D::Unimplemented,
            format!("cuMemHostRegister({h:#x}, {size} bytes): only whole pages are modelled (the real driver's answer for other ranges is unknown); refused"),
        );
        return Err(INVALID_VALUE);
    }
    Ok(())
}

/// `memory`: the caller's `size` bytes at `p` (`None` for NULL), made by
/// the ABI adapter under the entry point's contract.
pub(crate) fn cuMemHostRegister(
    c: &Call,
    p: CMut<c_void>,
    size: usize,
    flags: c_uint,
    memory: Option<Region>,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let ctx = current_ctx(c, &st)?;
        let h = p.addr() as u64;
        check_register(c, h, size, flags)?;
        let end = h.checked_add(size as u64).ok_or(INVALID_VALUE)?;
        let overlap = st
            .allocations
            .range(..end)
            .next_back()
            .filter(|(start, a)| start.saturating_add(a.len as u64) > h)
            .map(|(start, a)| (*start, a.kind));
        match overlap {
            Some((
                start,
                AllocKind::Host {
                    registered: true, ..
                },
            )) => {
                c.diag(
                    D::Misuse,
                    format!("cuMemHostRegister({h:#x}, {size} bytes): overlaps the range registered at {start:#x}"),
                );
                return Err(HOST_MEMORY_ALREADY_REGISTERED);
            }
            Some((start, _)) => {
                c.diag(
                    D::Unimplemented,
                    format!("cuMemHostRegister({h:#x}, {size} bytes): overlaps memory of this simulator at {start:#x} (the real driver's answer is unknown); refused"),
                );
                return Err(INVALID_VALUE);
            }
            None => {}
        }
        let region = memory.ok_or(INVALID_VALUE)?;
        st.add_allocation(
            p.as_raw().cast(),
            ctx,
            size,
            AllocKind::Host {
                mapped: flags & DEVICEMAP != 0,
                registered: true,
            },
            region,
        );
        Ok(())
    })();
    done(r)
}

pub(crate) fn cuMemHostUnregister(c: &Call, p: CMut<c_void>) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let h = p.addr() as u64;
        match st.allocations.get(&h).map(|a| a.kind) {
            Some(AllocKind::Host {
                registered: true, ..
            }) => {
                st.allocations.remove(&h);
                st.gone.insert(h, GoneWhy::Destroyed);
                Ok(())
            }
            Some(_) => {
                c.diag(
                    D::Misuse,
                    format!("cuMemHostUnregister({h:#x}): memory of cuMemHostAlloc / cuMemAlloc, not registered memory"),
                );
                Err(HOST_MEMORY_NOT_REGISTERED)
            }
            None => {
                let was = if st.gone.contains_key(&h) {
                    " (any more)"
                } else {
                    ""
                };
                c.diag(
                    D::UnknownHandle,
                    format!("cuMemHostUnregister({h:#x}): not the start of a range registered with this simulator{was}"),
                );
                Err(HOST_MEMORY_NOT_REGISTERED)
            }
        }
    })();
    done(r)
}

/// The pinned allocation holding host range `[p, p + n)`: its start and
/// whether it is device-mapped.
fn host_alloc(st: &State, p: u64, n: usize) -> Option<(u64, bool)> {
    let (start, a) = st.allocations.range(..=p).next_back()?;
    let AllocKind::Host { mapped, .. } = a.kind else {
        return None;
    };
    let end = start.saturating_add(a.len as u64);
    (p < end && p.saturating_add(n as u64) <= end).then_some((*start, mapped))
}

pub(crate) fn cuMemHostGetDevicePointer(
    c: &Call,
    out: CMut<CUdeviceptr>,
    p: CMut<c_void>,
    flags: c_uint,
) -> CUresult {
    let r = (|| {
        let st = c.state();
        init(&st)?;
        current_ctx(c, &st)?;
        if out.is_null() || flags != 0 {
            return Err(INVALID_VALUE);
        }
        let h = p.addr() as u64;
        match host_alloc(&st, h, 1) {
            Some((_, true)) => put(out, h),
            Some((_, false)) => {
                c.diag(
                    D::Misuse,
                    format!("{h:#x}: pinned memory allocated without CU_MEMHOSTALLOC_DEVICEMAP has no device pointer"),
                );
                Err(INVALID_VALUE)
            }
            None => {
                if st.gone.contains_key(&h) {
                    return Err(not_live(
                        c,
                        &st,
                        "pinned host pointer",
                        h,
                        false,
                        INVALID_VALUE,
                    ));
                }
                c.diag(
                    D::UnknownHandle,
                    format!("{h:#x} is not pinned host memory of this simulator"),
                );
                Err(INVALID_VALUE)
            }
        }
    })();
    done(r)
}

/// Which side of an asynchronous copy is host memory.
#[derive(Clone, Copy)]
enum Side {
    Device,
    PinnedHost,
}

/// Checks one side of an asynchronous copy now (it must be live memory of
/// the simulator), so the call fails like the driver's parameter checks.
fn check_side(c: &Call, st: &State, side: Side, addr: u64, n: usize) -> R {
    match side {
        Side::Device => memory::device_range(c, st, addr, n),
        Side::PinnedHost => match host_alloc(st, addr, n) {
            Some(_) => Ok(()),
            None => {
                c.diag(
                    D::Unimplemented,
                    format!(
                        "{n} bytes at host address {addr:#x}: not inside one pinned allocation \
                         (cuMemHostAlloc) of this simulator; asynchronous copies of pageable \
                         memory are not modelled"
                    ),
                );
                Err(INVALID_VALUE)
            }
        },
    }
}

/// Queues a copy of `n` bytes from `src` to `dst` on stream `s`; both
/// addresses are simulator memory (device ranges or pinned host memory,
/// which the state reads and writes by address alike).
fn async_copy(
    c: &Call,
    (dst_side, dst): (Side, u64),
    (src_side, src): (Side, u64),
    n: usize,
    s: Handle<CUstream>,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let (_, core) = resolve_stream(c, &mut st, s)?;
        if n == 0 {
            return Ok(());
        }
        check_side(c, &st, dst_side, dst, n)?;
        check_side(c, &st, src_side, src, n)?;
        let inst = c.inst.weak();
        let symbol = c.symbol;
        let index = c.index;
        core.enqueue(Box::new(move |sc: &StreamCore| {
            if sc.cancelled() {
                return;
            }
            let Some(inst) = inst.upgrade() else { return };
            let Some(st) = inst.lock_state_for_work(|| sc.cancelled()) else {
                return;
            };
            let host = |side| matches!(side, Side::PinnedHost);
            let ok = st.live_range(src, n, host(src_side))
                && st.live_range(dst, n, host(dst_side))
                && st.copy_between(src, dst, n);
            drop(st);
            if !ok {
                inst.diag(
                    index,
                    symbol,
                    D::UseAfterDestroy,
                    format!(
                        "the queued copy of {n} bytes from {src:#x} to {dst:#x} ran after one side \
                         was freed (the real GPU reads or writes freed memory here); nothing copied"
                    ),
                );
            }
        }));
        Ok(())
    })();
    done(r)
}

pub(crate) fn cuMemcpyHtoDAsync(
    c: &Call,
    dst: CUdeviceptr,
    src: CPtr<c_void>,
    n: usize,
    s: Handle<CUstream>,
) -> CUresult {
    if src.is_null() && n != 0 {
        return INVALID_VALUE;
    }
    let src = src.addr() as u64;
    async_copy(c, (Side::Device, dst), (Side::PinnedHost, src), n, s)
}

pub(crate) fn cuMemcpyDtoHAsync(
    c: &Call,
    dst: CMut<c_void>,
    src: CUdeviceptr,
    n: usize,
    s: Handle<CUstream>,
) -> CUresult {
    if dst.is_null() && n != 0 {
        return INVALID_VALUE;
    }
    let dst = dst.addr() as u64;
    async_copy(c, (Side::PinnedHost, dst), (Side::Device, src), n, s)
}

pub(crate) fn cuMemcpyDtoDAsync(
    c: &Call,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    s: Handle<CUstream>,
) -> CUresult {
    async_copy(c, (Side::Device, dst), (Side::Device, src), n, s)
}
