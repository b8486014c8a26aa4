//! The CUDA entry points, as functions of one simulator.
//!
//! Each function here gets the [`Call`] being served (simulator, call index,
//! symbol) plus the C arguments, and returns the `CUresult`. The `slots`
//! module wraps them into `extern "C"` functions bound to a slot. Codes follow
//! the measurements in `cuda-facts.md`; where the real driver would crash,
//! the simulator returns an error and records a diagnostic instead (the
//! choices are listed in the crate README).

use core::ffi::{c_char, c_int, c_uint, c_void};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tegra_interop_sys::cuda::*;
use tegra_interop_sys::nvsci::NvSciSyncFence;

use crate::codes::{self, *};
use crate::fds::{checked_close, file_id, FileId, Site, TrackedFd};
use crate::fence::{self, FenceContent, SimFence};
use crate::instance::*;
use crate::shm::{self, FdInfo, Region, SemaphoreKind, SharedSemaphore, WaitEnd};
use crate::stream::{StreamCore, Worker};
use crate::DiagnosticKind as D;

type R<T = ()> = Result<T, CUresult>;

fn done(r: R) -> CUresult {
    match r {
        Ok(()) => SUCCESS,
        Err(e) => e,
    }
}

/// Writes `v` to a caller out-pointer, refusing NULL.
///
/// # Safety
/// `p` must be NULL or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T) -> R {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Reads a caller in-pointer, refusing NULL.
///
/// # Safety
/// `p` must be NULL or valid for a read of `T`.
unsafe fn get<T: Copy>(p: *const T) -> R<T> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for reads by the caller's contract.
    Ok(unsafe { p.read() })
}

fn init(st: &State) -> R {
    if st.initialized {
        Ok(())
    } else {
        Err(NOT_INITIALIZED)
    }
}

fn device(c: &Call, dev: CUdevice) -> R<usize> {
    usize::try_from(dev)
        .ok()
        .filter(|d| *d < c.inst.config.devices)
        .ok_or(INVALID_DEVICE)
}

/// The current context of this thread, which must be live.
fn current_ctx(c: &Call, st: &State) -> R<u64> {
    let cur = c.inst.current();
    if cur == 0 {
        return Err(INVALID_CONTEXT);
    }
    if st.contexts.contains_key(&cur) {
        return Ok(cur);
    }
    if st.gone.contains_key(&cur) {
        c.diag(
            D::UseAfterContextLoss,
            format!("the current context {cur:#x} was destroyed; call cuCtxSetCurrent with a live context"),
        );
        return Err(CONTEXT_IS_DESTROYED);
    }
    // An inactive primary context (never retained, or released to zero).
    Err(INVALID_CONTEXT)
}

/// Reports a handle that is not live and returns the code to give back.
fn not_live(
    c: &Call,
    st: &State,
    what: &str,
    h: u64,
    destroying: bool,
    code: CUresult,
) -> CUresult {
    match st.gone.get(&h) {
        Some(GoneWhy::Destroyed) if destroying => {
            c.diag(
                D::DoubleDestroy,
                format!("{what} {h:#x} destroyed twice (the real driver crashes here)"),
            );
            code
        }
        Some(GoneWhy::Destroyed) => {
            c.diag(
                D::UseAfterDestroy,
                format!("{what} {h:#x} used after it was destroyed"),
            );
            code
        }
        Some(why) => {
            let crash = if destroying {
                " (the real driver crashes here)"
            } else {
                ""
            };
            c.diag(
                D::UseAfterContextLoss,
                format!("{what} {h:#x} used, but {}{crash}", why.describe()),
            );
            if destroying {
                CONTEXT_IS_DESTROYED
            } else {
                code
            }
        }
        None => {
            c.diag(
                D::UnknownHandle,
                format!("{what} handle {h:#x} is unknown to this simulator (foreign, corrupt or never created)"),
            );
            code
        }
    }
}

// ---------------------------------------------------------------- init/device

pub(crate) unsafe fn cu_init(c: &Call, flags: c_uint) -> CUresult {
    if flags != 0 {
        return INVALID_VALUE;
    }
    if c.inst.config.devices == 0 {
        return NO_DEVICE;
    }
    c.state().initialized = true;
    SUCCESS
}

pub(crate) unsafe fn cu_driver_get_version(c: &Call, v: *mut c_int) -> CUresult {
    // SAFETY: forwarded caller pointer.
    done(unsafe { put(v, c.inst.config.driver_version) })
}

pub(crate) unsafe fn cu_device_get_count(c: &Call, n: *mut c_int) -> CUresult {
    let r = (|| {
        init(&c.state())?;
        let n_dev = c_int::try_from(c.inst.config.devices).unwrap_or(c_int::MAX);
        // SAFETY: forwarded caller pointer.
        unsafe { put(n, n_dev) }
    })();
    done(r)
}

pub(crate) unsafe fn cu_device_get(c: &Call, out: *mut CUdevice, ordinal: c_int) -> CUresult {
    let r = (|| {
        init(&c.state())?;
        device(c, ordinal)?;
        // SAFETY: forwarded caller pointer.
        unsafe { put(out, ordinal) }
    })();
    done(r)
}

fn device_name(c: &Call, d: usize) -> String {
    if c.inst.config.integrated {
        format!("tegra-interop-sim integrated GPU {d}")
    } else {
        format!("tegra-interop-sim discrete GPU {d}")
    }
}

pub(crate) unsafe fn cu_device_get_name(
    c: &Call,
    name: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    let r = (|| {
        init(&c.state())?;
        let d = device(c, dev)?;
        let cap = usize::try_from(len)
            .ok()
            .filter(|l| *l > 0)
            .ok_or(INVALID_VALUE)?;
        if name.is_null() {
            return Err(INVALID_VALUE);
        }
        let s = device_name(c, d);
        let n = s.len().min(cap - 1);
        // SAFETY: the caller provides `len` writable bytes at `name`; we
        // write `n + 1 <= len` of them.
        unsafe {
            core::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), name, n);
            name.add(n).write(0);
        }
        Ok(())
    })();
    done(r)
}

/// A stable fake UUID per device ordinal.
pub(crate) fn device_uuid(d: usize) -> [u8; 16] {
    let mut b = *b"TISIM-GPU-UUID\0\0";
    b[14] = (d >> 8) as u8;
    b[15] = d as u8;
    b
}

pub(crate) unsafe fn cu_device_get_uuid(c: &Call, out: *mut CUuuid, dev: CUdevice) -> CUresult {
    let r = (|| {
        init(&c.state())?;
        let d = device(c, dev)?;
        let bytes = device_uuid(d).map(|b| b as c_char);
        // SAFETY: forwarded caller pointer.
        unsafe { put(out, CUuuid { bytes }) }
    })();
    done(r)
}

pub(crate) unsafe fn cu_device_get_attribute(
    c: &Call,
    out: *mut c_int,
    attr: CUdevice_attribute,
    dev: CUdevice,
) -> CUresult {
    let r = (|| {
        init(&c.state())?;
        device(c, dev)?;
        let cfg = &c.inst.config;
        let v = match attr.0 {
            0 => return Err(INVALID_VALUE),
            1 => 1024, // max threads per block
            10 => 32,  // warp size
            16 => {
                if cfg.integrated {
                    16
                } else {
                    132
                }
            } // multiprocessors
            18 => cfg.integrated as c_int, // INTEGRATED
            19 => 1,   // can map host memory
            41 => 1,   // unified addressing
            75 => {
                if cfg.integrated {
                    8
                } else {
                    9
                }
            } // compute capability major
            76 => {
                if cfg.integrated {
                    7
                } else {
                    0
                }
            } // compute capability minor
            103 => 1,  // POSIX fd handles supported
            104 | 105 => 0, // Win32 handles
            114 => cfg.timeline_supported as c_int, // TIMELINE_SEMAPHORE_INTEROP_SUPPORTED
            124 => cfg.dmabuf_supported as c_int, // DMA_BUF_SUPPORTED
            a if a < CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX.0 => 0,
            _ => return Err(INVALID_VALUE),
        };
        // SAFETY: forwarded caller pointer.
        unsafe { put(out, v) }
    })();
    done(r)
}

// ---------------------------------------------------------------- contexts

pub(crate) unsafe fn cu_device_primary_ctx_retain(
    c: &Call,
    out: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let d = device(c, dev)?;
        if out.is_null() {
            return Err(INVALID_VALUE);
        }
        let p = &mut st.primaries[d];
        p.refcount += 1;
        let h = p.handle;
        st.contexts.entry(h).or_insert(Ctx {
            device: dev,
            primary: true,
        });
        st.gone.remove(&h);
        // SAFETY: checked non-null above; caller pointer.
        unsafe { put(out, h as usize as CUcontext) }
    })();
    done(r)
}

pub(crate) unsafe fn cu_device_primary_ctx_release(c: &Call, dev: CUdevice) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let d = device(c, dev)?;
        let p = &mut st.primaries[d];
        if p.refcount == 0 {
            c.diag(
                D::Misuse,
                format!("primary context of device {d} released more often than retained"),
            );
            return Err(INVALID_CONTEXT);
        }
        p.refcount -= 1;
        if p.refcount == 0 {
            let h = p.handle;
            st.drop_context_objects(h, GoneWhy::ContextReleased);
            st.contexts.remove(&h);
        }
        Ok(())
    })();
    done(r)
}

pub(crate) unsafe fn cu_device_primary_ctx_reset(c: &Call, dev: CUdevice) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let d = device(c, dev)?;
        let h = st.primaries[d].handle;
        // The real driver accepts this with live imported objects (measured)
        // and frees them; destroying them afterwards crashes it.
        st.drop_context_objects(h, GoneWhy::ContextReset);
        Ok(())
    })();
    done(r)
}

pub(crate) unsafe fn cu_ctx_create(
    c: &Call,
    out: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        device(c, dev)?;
        if out.is_null() || flags & !0x3f != 0 {
            return Err(INVALID_VALUE);
        }
        let h = new_handle(Tag::Context);
        st.contexts.insert(
            h,
            Ctx {
                device: dev,
                primary: false,
            },
        );
        c.inst.set_current(h);
        // SAFETY: checked non-null; caller pointer.
        unsafe { put(out, h as usize as CUcontext) }
    })();
    done(r)
}

pub(crate) unsafe fn cu_ctx_destroy(c: &Call, ctx: CUcontext) -> CUresult {
    let h = ctx as usize as u64;
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        if h == 0 {
            return Err(INVALID_VALUE);
        }
        match st.contexts.get(&h) {
            Some(x) if x.primary => {
                c.diag(
                    D::Misuse,
                    format!("cuCtxDestroy on primary context {h:#x}; release it instead"),
                );
                Err(INVALID_CONTEXT)
            }
            Some(_) => {
                st.drop_context_objects(h, GoneWhy::ContextDestroyed);
                st.contexts.remove(&h);
                st.gone.insert(h, GoneWhy::Destroyed);
                if c.inst.current() == h {
                    c.inst.set_current(0);
                }
                Ok(())
            }
            None if st.primaries.iter().any(|p| p.handle == h) => {
                c.diag(
                    D::Misuse,
                    format!("cuCtxDestroy on inactive primary context {h:#x}"),
                );
                Err(INVALID_CONTEXT)
            }
            None => Err(not_live(c, &st, "context", h, true, INVALID_CONTEXT)),
        }
    })();
    done(r)
}

pub(crate) unsafe fn cu_ctx_set_current(c: &Call, ctx: CUcontext) -> CUresult {
    let h = ctx as usize as u64;
    let r = (|| {
        let st = c.state();
        init(&st)?;
        if h != 0 && !st.contexts.contains_key(&h) && !st.primaries.iter().any(|p| p.handle == h) {
            return Err(not_live(c, &st, "context", h, false, INVALID_CONTEXT));
        }
        c.inst.set_current(h);
        Ok(())
    })();
    done(r)
}

pub(crate) unsafe fn cu_ctx_get_current(c: &Call, out: *mut CUcontext) -> CUresult {
    let r = (|| {
        init(&c.state())?;
        // SAFETY: forwarded caller pointer.
        unsafe { put(out, c.inst.current() as usize as CUcontext) }
    })();
    done(r)
}

pub(crate) unsafe fn cu_ctx_get_device(c: &Call, out: *mut CUdevice) -> CUresult {
    let r = (|| {
        let st = c.state();
        init(&st)?;
        let h = current_ctx(c, &st)?;
        let d = st
            .contexts
            .get(&h)
            .map(|x| x.device)
            .ok_or(INVALID_CONTEXT)?;
        // SAFETY: forwarded caller pointer.
        unsafe { put(out, d) }
    })();
    done(r)
}

fn wait_cores(c: &Call, cores: Vec<Arc<StreamCore>>, what: &str) -> R {
    for core in cores {
        if !core.wait_idle(c.inst.config.hang_timeout) {
            c.diag(
                D::Hang,
                format!(
                    "{what} still had work after {:?} (a wait that is never signalled?); the real driver would block forever",
                    c.inst.config.hang_timeout
                ),
            );
            return Err(TIMEOUT);
        }
    }
    Ok(())
}

/// Streams of `ctx` that the legacy NULL stream synchronises with.
fn blocking_cores(st: &State, ctx: u64) -> Vec<Arc<StreamCore>> {
    let mut v: Vec<Arc<StreamCore>> = st
        .streams
        .values()
        .filter(|s| s.ctx == ctx && s.blocking)
        .map(|s| Arc::clone(&s.worker.core))
        .collect();
    if let Some(w) = st.null_streams.get(&ctx) {
        v.push(Arc::clone(&w.core));
    }
    v
}

pub(crate) unsafe fn cu_ctx_synchronize(c: &Call) -> CUresult {
    let r = (|| {
        let cores = {
            let st = c.state();
            init(&st)?;
            let ctx = current_ctx(c, &st)?;
            let mut v: Vec<Arc<StreamCore>> = st
                .streams
                .values()
                .filter(|s| s.ctx == ctx)
                .map(|s| Arc::clone(&s.worker.core))
                .collect();
            if let Some(w) = st.null_streams.get(&ctx) {
                v.push(Arc::clone(&w.core));
            }
            // Work queued on streams destroyed since is still this context's work.
            v.extend(
                st.retired
                    .iter()
                    .filter(|(owner, _)| *owner == ctx)
                    .map(|(_, w)| Arc::clone(&w.core)),
            );
            v
        };
        wait_cores(c, cores, "cuCtxSynchronize")
    })();
    done(r)
}

// ---------------------------------------------------------------- streams

fn start_worker(c: &Call, ctx: u64) -> R<Worker> {
    Worker::start(format!("tisim{}-stream-{ctx:x}", c.inst.id)).map_err(|e| {
        c.diag(D::Internal, format!("cannot start a stream thread: {e}"));
        OUT_OF_MEMORY
    })
}

/// Resolves a stream argument (NULL and the legacy/per-thread pseudo
/// handles mean the current context's NULL stream).
fn resolve_stream(c: &Call, st: &mut State, s: CUstream) -> R<(u64, Arc<StreamCore>)> {
    let h = s as usize as u64;
    if h <= 2 {
        let ctx = current_ctx(c, st)?;
        if let std::collections::hash_map::Entry::Vacant(e) = st.null_streams.entry(ctx) {
            e.insert(start_worker(c, ctx)?);
        }
        let core = st
            .null_streams
            .get(&ctx)
            .map(|w| Arc::clone(&w.core))
            .ok_or(INVALID_HANDLE)?;
        return Ok((ctx, core));
    }
    match st.streams.get(&h) {
        Some(x) => Ok((x.ctx, Arc::clone(&x.worker.core))),
        None => Err(not_live(c, st, "stream", h, false, INVALID_HANDLE)),
    }
}

pub(crate) unsafe fn cu_stream_create(c: &Call, out: *mut CUstream, flags: c_uint) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let ctx = current_ctx(c, &st)?;
        if out.is_null() || flags & !1 != 0 {
            return Err(INVALID_VALUE);
        }
        st.reap();
        let worker = start_worker(c, ctx)?;
        let h = new_handle(Tag::Stream);
        st.streams.insert(
            h,
            StreamObj {
                ctx,
                blocking: flags & 1 == 0,
                worker,
            },
        );
        // SAFETY: checked non-null; caller pointer.
        unsafe { put(out, h as usize as CUstream) }
    })();
    done(r)
}

pub(crate) unsafe fn cu_stream_destroy(c: &Call, s: CUstream) -> CUresult {
    let h = s as usize as u64;
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        match st.streams.remove(&h) {
            Some(obj) => {
                // Like the real driver: returns at once, queued work still runs.
                obj.worker.core.close();
                st.retired.push((obj.ctx, obj.worker));
                st.gone.insert(h, GoneWhy::Destroyed);
                st.reap();
                Ok(())
            }
            None => Err(not_live(c, &st, "stream", h, true, INVALID_HANDLE)),
        }
    })();
    done(r)
}

pub(crate) unsafe fn cu_stream_synchronize(c: &Call, s: CUstream) -> CUresult {
    let r = (|| {
        let cores = {
            let mut st = c.state();
            init(&st)?;
            let (ctx, core) = resolve_stream(c, &mut st, s)?;
            if (s as usize) <= 2 {
                blocking_cores(&st, ctx)
            } else {
                vec![core]
            }
        };
        wait_cores(c, cores, "cuStreamSynchronize")
    })();
    done(r)
}

pub(crate) unsafe fn cu_stream_query(c: &Call, s: CUstream) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let (_, core) = resolve_stream(c, &mut st, s)?;
        if core.pending() == 0 {
            Ok(())
        } else {
            Err(NOT_READY)
        }
    })();
    done(r)
}

pub(crate) unsafe fn cu_stream_get_ctx(c: &Call, s: CUstream, out: *mut CUcontext) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let (ctx, _) = resolve_stream(c, &mut st, s)?;
        // SAFETY: forwarded caller pointer.
        unsafe { put(out, ctx as usize as CUcontext) }
    })();
    done(r)
}

/// `cuLaunchHostFunc`: queues a call of `f(user)` on the stream's worker,
/// after the work queued before it and before the work queued after it
/// (as the real driver runs host functions in stream order on a driver
/// thread). Work dropped by a stream teardown never calls `f`.
pub(crate) unsafe fn cu_launch_host_func(
    c: &Call,
    s: CUstream,
    f: CUhostFn,
    user: *mut c_void,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let (_, core) = resolve_stream(c, &mut st, s)?;
        let Some(f) = f else {
            return Err(INVALID_VALUE);
        };
        // The pointer travels to the worker thread as a number: what it
        // points at is the caller's business, as with the real driver.
        let user = user as usize;
        core.enqueue(Box::new(move |sc: &StreamCore| {
            if !sc.cancelled() {
                // SAFETY: the caller of cuLaunchHostFunc owes that `f` may be
                // called once with `user` from another thread.
                unsafe { f(user as *mut c_void) };
            }
        }));
        Ok(())
    })();
    done(r)
}

// ---------------------------------------------------------------- memory

/// Finds the live range holding `[p, p + n)`; reports freed ones.
fn device_range(c: &Call, st: &State, p: CUdeviceptr, n: usize) -> R<()> {
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
fn legacy_sync(c: &Call) -> R {
    let cores = {
        let st = c.state();
        init(&st)?;
        let ctx = current_ctx(c, &st)?;
        blocking_cores(&st, ctx)
    };
    wait_cores(c, cores, "a synchronous copy")
}

pub(crate) unsafe fn cu_mem_alloc(c: &Call, out: *mut CUdeviceptr, size: usize) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let ctx = current_ctx(c, &st)?;
        if out.is_null() || size == 0 {
            return Err(INVALID_VALUE);
        }
        let region = Region::anonymous(size).map_err(|_| OUT_OF_MEMORY)?;
        let p = region.base() as usize as u64;
        st.gone.remove(&p);
        st.allocations.insert(
            p,
            AllocObj {
                ctx,
                len: size,
                kind: AllocKind::Alloc,
                _region: region,
            },
        );
        // SAFETY: checked non-null; caller pointer.
        unsafe { put(out, p) }
    })();
    done(r)
}

pub(crate) unsafe fn cu_mem_free(c: &Call, p: CUdeviceptr) -> CUresult {
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

pub(crate) unsafe fn cu_memcpy_htod(
    c: &Call,
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    let r = (|| {
        legacy_sync(c)?;
        if n == 0 {
            return Ok(());
        }
        if src.is_null() {
            return Err(INVALID_VALUE);
        }
        let st = c.state();
        device_range(c, &st, dst, n)?;
        // SAFETY: the destination range lies in a live mapping (checked, and
        // kept alive by the held lock); the source is the caller's `n` bytes.
        unsafe { core::ptr::copy(src.cast::<u8>(), dst as usize as *mut u8, n) };
        Ok(())
    })();
    done(r)
}

pub(crate) unsafe fn cu_memcpy_dtoh(
    c: &Call,
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
) -> CUresult {
    let r = (|| {
        legacy_sync(c)?;
        if n == 0 {
            return Ok(());
        }
        if dst.is_null() {
            return Err(INVALID_VALUE);
        }
        let st = c.state();
        device_range(c, &st, src, n)?;
        // SAFETY: the source range lies in a live mapping (checked, kept
        // alive by the held lock); the destination is the caller's buffer.
        unsafe { core::ptr::copy(src as usize as *const u8, dst.cast::<u8>(), n) };
        Ok(())
    })();
    done(r)
}

pub(crate) unsafe fn cu_memset_d8(c: &Call, dst: CUdeviceptr, v: u8, n: usize) -> CUresult {
    let r = (|| {
        legacy_sync(c)?;
        if n == 0 {
            return Ok(());
        }
        let st = c.state();
        device_range(c, &st, dst, n)?;
        // SAFETY: the range lies in a live mapping (checked, lock held).
        unsafe { core::ptr::write_bytes(dst as usize as *mut u8, v, n) };
        Ok(())
    })();
    done(r)
}

/// One side of a cuMemcpy3D.
struct Side {
    base: usize,
    pitch: usize,
    height: usize,
}

/// Byte offsets of the first and one-past-the-last byte a 3D copy touches.
fn span(
    (x, y, z): (usize, usize, usize),
    (pitch, height): (usize, usize),
    (w, h, d): (usize, usize, usize),
) -> Option<(usize, usize)> {
    let slice = pitch.checked_mul(height)?;
    let first = z
        .checked_mul(slice)?
        .checked_add(y.checked_mul(pitch)?)?
        .checked_add(x)?;
    let last_row = (z + d - 1)
        .checked_mul(slice)?
        .checked_add((y + h - 1).checked_mul(pitch)?)?
        .checked_add(x)?;
    Some((first, last_row.checked_add(w)?))
}

#[allow(clippy::too_many_arguments)]
fn resolve_side(
    c: &Call,
    st: &State,
    kind: CUmemorytype,
    host: usize,
    dev: CUdeviceptr,
    array: CUarray,
    pitch: usize,
    height: usize,
    (x, y, z): (usize, usize, usize),
    (w, h, d): (usize, usize, usize),
) -> R<Side> {
    let kind = match kind.0 {
        4 if st
            .allocations
            .range(..=dev)
            .next_back()
            .is_some_and(|(s, a)| dev < s + a.len as u64) =>
        {
            2
        }
        4 => 1,
        k => k,
    };
    match kind {
        1 => {
            if host == 0 && dev == 0 {
                return Err(INVALID_VALUE);
            }
            let base = if host != 0 { host } else { dev as usize };
            Ok(Side {
                base,
                pitch: if pitch == 0 { w } else { pitch },
                height: if height == 0 { h } else { height },
            })
        }
        2 => {
            let pitch = if pitch == 0 { w } else { pitch };
            let height = if height == 0 { h } else { height };
            if pitch < w || (d > 1 && height < h) {
                return Err(INVALID_VALUE);
            }
            let (first, end) = span((x, y, z), (pitch, height), (w, h, d)).ok_or(INVALID_VALUE)?;
            device_range(
                c,
                st,
                dev.checked_add(first as u64).ok_or(INVALID_VALUE)?,
                end - first,
            )?;
            Ok(Side {
                base: dev as usize,
                pitch,
                height,
            })
        }
        3 => {
            let ah = array as usize as u64;
            let a = match st.arrays.get(&ah) {
                Some(a) => *a,
                None => return Err(not_live(c, st, "CUDA array", ah, false, INVALID_HANDLE)),
            };
            let fits = x.checked_add(w).is_some_and(|e| e <= a.row_bytes)
                && y.checked_add(h).is_some_and(|e| e <= a.height)
                && z.checked_add(d).is_some_and(|e| e <= a.depth);
            if !fits {
                return Err(INVALID_VALUE);
            }
            Ok(Side {
                base: a.ptr,
                pitch: a.row_bytes,
                height: a.height,
            })
        }
        _ => Err(INVALID_VALUE),
    }
}

pub(crate) unsafe fn cu_memcpy_3d(c: &Call, p: *const CUDA_MEMCPY3D) -> CUresult {
    let r = (|| {
        // SAFETY: forwarded caller pointer.
        let m = unsafe { get(p) }?;
        legacy_sync(c)?;
        if m.srcLOD != 0 || m.dstLOD != 0 || !m.reserved0.is_null() || !m.reserved1.is_null() {
            return Err(INVALID_VALUE);
        }
        let (w, h, d) = (m.WidthInBytes, m.Height.max(1), m.Depth.max(1));
        if w == 0 {
            return Ok(());
        }
        let st = c.state();
        let src = resolve_side(
            c,
            &st,
            m.srcMemoryType,
            m.srcHost as usize,
            m.srcDevice,
            m.srcArray,
            m.srcPitch,
            m.srcHeight,
            (m.srcXInBytes, m.srcY, m.srcZ),
            (w, h, d),
        )?;
        let dst = resolve_side(
            c,
            &st,
            m.dstMemoryType,
            m.dstHost as usize,
            m.dstDevice,
            m.dstArray,
            m.dstPitch,
            m.dstHeight,
            (m.dstXInBytes, m.dstY, m.dstZ),
            (w, h, d),
        )?;
        for zz in 0..d {
            for yy in 0..h {
                let so = (m.srcZ + zz) * src.pitch * src.height
                    + (m.srcY + yy) * src.pitch
                    + m.srcXInBytes;
                let dof = (m.dstZ + zz) * dst.pitch * dst.height
                    + (m.dstY + yy) * dst.pitch
                    + m.dstXInBytes;
                // SAFETY: device and array sides were bounds-checked against
                // live mappings (kept alive by the held lock); host sides are
                // the caller's memory described by its own pitch/height.
                unsafe {
                    core::ptr::copy((src.base + so) as *const u8, (dst.base + dof) as *mut u8, w)
                };
            }
        }
        Ok(())
    })();
    done(r)
}

// ---------------------------------------------------------------- external memory

const MEM_OPAQUE_FD: u32 = 1;
const MEM_NVSCIBUF: u32 = 8;
const MEM_DMABUF_FD: u32 = 9;

/// The descriptor an fd import was handed: its number and the file it
/// referred to when the call began.
#[derive(Clone, Copy)]
struct Handed {
    fd: c_int,
    id: FileId,
}

impl Handed {
    fn at(fd: c_int) -> Option<Handed> {
        file_id(fd).map(|id| Handed { fd, id })
    }
}

fn site(c: &Call) -> Site {
    Site {
        call_index: c.index,
        symbol: c.symbol,
    }
}

/// Closes the descriptor an import was handed, as the real driver does
/// (after a successful import; after a failed `OPAQUE_FD` memory import),
/// checked: a number that is no longer open or now names another file is
/// reported and left alone.
fn close_handed(c: &Call, h: Handed) {
    let (_, diag) = checked_close(&c.inst.fds, site(c), h.fd, h.id, false);
    if let Some(d) = diag {
        c.diag(d.kind, d.message);
    }
}

/// How far a failed `OPAQUE_FD` memory import got; the measured fd effect
/// depends on it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Failed while checking the call (no current context, a bad parameter):
    /// the H200 left the fd open (probe `fd_import_probe.c`, 2026-11-23).
    Parameters,
    /// The parameters were valid and the import itself failed: the H200
    /// closed the fd (UNKNOWN for /dev/null, memfds, files, pipes, sockets).
    Import,
}

/// The stage an injected failure models, decided by its code the way the
/// measurement splits real failures (a choice derived from the probe):
/// INVALID_VALUE and INVALID_CONTEXT were only ever parameter failures (fd
/// kept); NOT_INITIALIZED / DEINITIALIZED happen before any parameter is
/// looked at (fd kept); every other code stands for a failure of the import
/// itself (fd closed).
fn injected_stage(code: CUresult) -> Stage {
    if [
        INVALID_VALUE,
        INVALID_CONTEXT,
        NOT_INITIALIZED,
        DEINITIALIZED,
    ]
    .contains(&code)
    {
        Stage::Parameters
    } else {
        Stage::Import
    }
}

pub(crate) unsafe fn cu_import_external_memory(
    c: &Call,
    out: *mut CUexternalMemory,
    desc: *const CUDA_EXTERNAL_MEMORY_HANDLE_DESC,
) -> CUresult {
    // Which fd the call was handed, read before anything can fail.
    // SAFETY: forwarded caller pointer (NULL is allowed and checked).
    let (kind, handed) = match unsafe { get(desc) } {
        Ok(d) if d.type_.0 == MEM_OPAQUE_FD || d.type_.0 == MEM_DMABUF_FD => {
            // SAFETY: for fd kinds the union holds the descriptor.
            (d.type_.0, Handed::at(unsafe { d.handle.fd }))
        }
        Ok(d) => (d.type_.0, None),
        Err(_) => (0, None),
    };
    let mut stage = Stage::Parameters;
    let r = match c.inst.take_injected(c.index) {
        Some(code) => {
            stage = injected_stage(code);
            Err(code)
        }
        // SAFETY: forwarded caller pointers.
        None => unsafe { import_memory(c, out, desc, handed, &mut stage) },
    };
    if let Some(h) = handed {
        // Success: the driver owns the fd and closes it (measured).
        // Failure of an OPAQUE_FD import: the H200 closed the fd only when
        // the parameters were valid and the import itself failed; parameter
        // errors (INVALID_VALUE) and INVALID_CONTEXT left it open (measured,
        // probe of 2026-11-23). DMABUF_FD failures (NOT_SUPPORTED,
        // INVALID_VALUE, measured) leave it open.
        if r.is_ok() || (kind == MEM_OPAQUE_FD && stage == Stage::Import) {
            close_handed(c, h);
        }
    }
    done(r)
}

/// # Safety
/// Caller pointers as for `cuImportExternalMemory`.
unsafe fn import_memory(
    c: &Call,
    out: *mut CUexternalMemory,
    desc: *const CUDA_EXTERNAL_MEMORY_HANDLE_DESC,
    handed: Option<Handed>,
    stage: &mut Stage,
) -> R {
    {
        // SAFETY: forwarded caller pointer.
        let desc = unsafe { get(desc) }?;
        let mut st = c.state();
        init(&st)?;
        // Measured: no current context -> INVALID_CONTEXT, checked before
        // the fd is looked at (the fd stays open).
        let ctx = current_ctx(c, &st)?;
        if out.is_null() {
            return Err(INVALID_VALUE);
        }
        let kind = desc.type_.0;
        // Measured for OPAQUE_FD and DMABUF_FD: size 0, an unknown flag bit,
        // a non-zero reserved word -> INVALID_VALUE, before the kind is
        // served (DMABUF_FD answers NOT_SUPPORTED only for valid parameters).
        if desc.size == 0
            || desc.flags & !CUDA_EXTERNAL_MEMORY_DEDICATED != 0
            || desc.reserved.iter().any(|r| *r != 0)
        {
            return Err(INVALID_VALUE);
        }
        let (fd, file_len, nvscibuf) = match kind {
            MEM_OPAQUE_FD | MEM_DMABUF_FD => {
                // Measured on the H200: every DMABUF_FD import with valid
                // parameters answered NOT_SUPPORTED and left the fd open.
                // Accepting it is an opt-in, unmeasured choice
                // (`SimConfig::dmabuf_import`).
                if kind == MEM_DMABUF_FD && !c.inst.config.dmabuf_import {
                    return Err(NOT_SUPPORTED);
                }
                // The parameters are valid: from here on a failed OPAQUE_FD
                // import closes the fd (measured).
                *stage = Stage::Import;
                // SAFETY: for fd kinds the union holds the descriptor.
                let raw = unsafe { desc.handle.fd };
                let len = match shm::inspect_fd(raw) {
                    // The real driver answers fd = -1 or a closed number
                    // with UNKNOWN (measured).
                    FdInfo::Bad => return Err(UNKNOWN),
                    FdInfo::NotAFile => {
                        c.diag(
                            D::Misuse,
                            format!(
                                "fd {raw} is not exported GPU memory (not even a regular file)"
                            ),
                        );
                        // Measured for OPAQUE_FD: /dev/null, a pipe, a socket
                        // -> UNKNOWN (and the fd closed). DMABUF_FD (opt-in
                        // only): INVALID_VALUE, chosen.
                        return Err(if kind == MEM_OPAQUE_FD {
                            UNKNOWN
                        } else {
                            INVALID_VALUE
                        });
                    }
                    FdInfo::File(len) => len,
                };
                if handed.map(|h| h.fd) != Some(raw) {
                    // The number was closed or swapped between reading the
                    // descriptor and now (another thread): refuse.
                    return Err(UNKNOWN);
                }
                // SAFETY: `raw` was just checked to be an open descriptor; it
                // is only borrowed for the duplication.
                let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) };
                if kind == MEM_OPAQUE_FD
                    && !shm::is_exported_memfd(borrowed, shm::EXPORTED_MEMORY_NAME)
                {
                    // Measured: a memfd or a regular file that is not a GPU
                    // allocation -> UNKNOWN, fd closed. Only memory made by
                    // `export::memory` stands for a GPU allocation here.
                    c.diag(
                        D::Misuse,
                        format!(
                            "fd {raw} is a file but not memory exported by the simulator's exporter \
                             (export::memory); the real driver answers UNKNOWN and closes the fd"
                        ),
                    );
                    return Err(UNKNOWN);
                }
                let keep =
                    TrackedFd::dup(&c.inst.fds, site(c), borrowed).map_err(|_| OPERATING_SYSTEM)?;
                (keep, len, false)
            }
            MEM_NVSCIBUF => {
                // SAFETY: for NVSCIBUF the union holds the object pointer.
                let obj = unsafe { desc.handle.nvSciBufObject } as usize;
                if obj == 0 {
                    return Err(INVALID_VALUE);
                }
                let Some(e) = st.buf_objects.get(&obj) else {
                    if !c.inst.config.nvsci {
                        return Err(NOT_SUPPORTED);
                    }
                    c.diag(
                        D::UnknownHandle,
                        format!("{obj:#x} is not an NvSciBuf object of this simulator"),
                    );
                    return Err(INVALID_VALUE);
                };
                let keep = TrackedFd::dup(&c.inst.fds, site(c), e.fd.as_fd())
                    .map_err(|_| OPERATING_SYSTEM)?;
                (keep, e.size, true)
            }
            2..=7 => {
                // Measured for OPAQUE_WIN32 (2): NOT_SUPPORTED, the fd in the
                // union untouched; the KMT and D3D kinds answer the same
                // (chosen alike, unmeasured).
                c.diag(D::Misuse, format!("memory handle type {kind} is a Windows handle type; not available on Linux"));
                return Err(NOT_SUPPORTED);
            }
            // Measured: type 0 and an unknown type (42) -> INVALID_VALUE.
            _ => return Err(INVALID_VALUE),
        };
        if desc.size > file_len {
            c.diag(
                D::ImportSizeMismatch,
                format!(
                    "import declares {} bytes but the exporter's allocation has {file_len}; the real driver accepts \
                     this; bytes past {file_len} are private zero pages here (not shared)",
                    desc.size
                ),
            );
        }
        let h = new_handle(Tag::Memory);
        st.memories.insert(
            h,
            MemObj {
                ctx,
                fd,
                file_len,
                size: desc.size,
                nvscibuf,
            },
        );
        // SAFETY: checked non-null; caller pointer.
        unsafe { put(out, h as usize as CUexternalMemory) }
    }
}

pub(crate) unsafe fn cu_external_memory_get_mapped_buffer(
    c: &Call,
    out: *mut CUdeviceptr,
    ext: CUexternalMemory,
    desc: *const CUDA_EXTERNAL_MEMORY_BUFFER_DESC,
) -> CUresult {
    let h = ext as usize as u64;
    let r = (|| {
        // SAFETY: forwarded caller pointer.
        let desc = unsafe { get(desc) }?;
        let mut st = c.state();
        init(&st)?;
        current_ctx(c, &st)?;
        if out.is_null() {
            return Err(INVALID_VALUE);
        }
        let Some(mem) = st.memories.get(&h) else {
            return Err(not_live(c, &st, "external memory", h, false, INVALID_VALUE));
        };
        if desc.flags != 0 || desc.size == 0 || desc.reserved.iter().any(|r| *r != 0) {
            return Err(INVALID_VALUE);
        }
        let end = desc.offset.checked_add(desc.size).ok_or(INVALID_VALUE)?;
        if end > mem.size {
            return Err(INVALID_VALUE);
        }
        if end > mem.file_len {
            c.diag(
                D::ImportSizeMismatch,
                format!(
                    "mapping {}..{end} reaches past the exporter's {} bytes; that tail is private zero memory",
                    desc.offset, mem.file_len
                ),
            );
        }
        let len = usize::try_from(desc.size).map_err(|_| INVALID_VALUE)?;
        let (region, ptr) = Region::map_file(mem.fd.as_fd(), mem.file_len, desc.offset, len)
            .map_err(|_| OUT_OF_MEMORY)?;
        let ctx = mem.ctx;
        let p = ptr as usize as u64;
        st.gone.remove(&p);
        st.allocations.insert(
            p,
            AllocObj {
                ctx,
                len,
                kind: AllocKind::Mapped,
                _region: region,
            },
        );
        // SAFETY: checked non-null; caller pointer.
        unsafe { put(out, p) }
    })();
    done(r)
}

fn element_size(format: u32) -> Option<usize> {
    match format {
        1 | 8 => Some(1),
        2 | 9 | 16 => Some(2),
        3 | 10 | 32 => Some(4),
        _ => None,
    }
}

pub(crate) unsafe fn cu_external_memory_get_mapped_mipmapped_array(
    c: &Call,
    out: *mut CUmipmappedArray,
    ext: CUexternalMemory,
    desc: *const CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC,
) -> CUresult {
    let h = ext as usize as u64;
    let r = (|| {
        // SAFETY: forwarded caller pointer.
        let desc = unsafe { get(desc) }?;
        let mut st = c.state();
        init(&st)?;
        current_ctx(c, &st)?;
        if out.is_null() {
            return Err(INVALID_VALUE);
        }
        let Some(mem) = st.memories.get(&h) else {
            return Err(not_live(c, &st, "external memory", h, false, INVALID_VALUE));
        };
        let a = desc.arrayDesc;
        if desc.reserved.iter().any(|r| *r != 0) || a.Width == 0 || desc.numLevels == 0 {
            return Err(INVALID_VALUE);
        }
        if mem.nvscibuf && desc.numLevels != 1 {
            return Err(INVALID_VALUE);
        }
        let Some(elem) = element_size(a.Format.0) else {
            c.diag(
                D::Unimplemented,
                format!("array format {} is not simulated", a.Format.0),
            );
            return Err(INVALID_VALUE);
        };
        if !matches!(a.NumChannels, 1 | 2 | 4) {
            return Err(INVALID_VALUE);
        }
        let layered = a.Flags & CUDA_ARRAY3D_LAYERED != 0;
        let (w0, h0, d0) = (a.Width, a.Height.max(1), a.Depth.max(1));
        let biggest = if layered {
            w0.max(h0)
        } else {
            w0.max(h0).max(d0)
        };
        let max_levels = usize::BITS - biggest.leading_zeros();
        if desc.numLevels > max_levels {
            return Err(INVALID_VALUE);
        }
        // Levels are packed one after the other, rows tightly (a linear
        // layout; a real GPU uses an opaque tiled one).
        let mut levels = Vec::new();
        let mut total = 0usize;
        for l in 0..desc.numLevels {
            let w = (w0 >> l).max(1);
            let hh = (h0 >> l).max(1);
            let d = if layered { d0 } else { (d0 >> l).max(1) };
            let row = w
                .checked_mul(elem * a.NumChannels as usize)
                .ok_or(INVALID_VALUE)?;
            let bytes = row
                .checked_mul(hh)
                .and_then(|x| x.checked_mul(d))
                .ok_or(INVALID_VALUE)?;
            levels.push((total, row, hh, d));
            total = total.checked_add(bytes).ok_or(INVALID_VALUE)?;
        }
        let end = desc.offset.checked_add(total as u64).ok_or(INVALID_VALUE)?;
        if end > mem.size {
            return Err(INVALID_VALUE);
        }
        if end > mem.file_len {
            c.diag(
                D::ImportSizeMismatch,
                format!("mipmapped array reaches past the exporter's {} bytes; that tail is private zero memory", mem.file_len),
            );
        }
        let (region, base) = Region::map_file(mem.fd.as_fd(), mem.file_len, desc.offset, total)
            .map_err(|_| OUT_OF_MEMORY)?;
        let ctx = mem.ctx;
        let mh = new_handle(Tag::Mipmap);
        let mut handles = Vec::new();
        for (off, row, hh, d) in levels {
            let ah = new_handle(Tag::Array);
            st.arrays.insert(
                ah,
                ArrayObj {
                    ptr: base as usize + off,
                    row_bytes: row,
                    height: hh,
                    depth: d,
                },
            );
            handles.push(ah);
        }
        st.mipmaps.insert(
            mh,
            MipObj {
                ctx,
                levels: handles,
                _region: region,
            },
        );
        // SAFETY: checked non-null; caller pointer.
        unsafe { put(out, mh as usize as CUmipmappedArray) }
    })();
    done(r)
}

pub(crate) unsafe fn cu_mipmapped_array_get_level(
    c: &Call,
    out: *mut CUarray,
    mip: CUmipmappedArray,
    level: c_uint,
) -> CUresult {
    let h = mip as usize as u64;
    let r = (|| {
        let st = c.state();
        init(&st)?;
        let Some(m) = st.mipmaps.get(&h) else {
            return Err(not_live(
                c,
                &st,
                "mipmapped array",
                h,
                false,
                INVALID_HANDLE,
            ));
        };
        let a = *m.levels.get(level as usize).ok_or(INVALID_VALUE)?;
        // SAFETY: forwarded caller pointer.
        unsafe { put(out, a as usize as CUarray) }
    })();
    done(r)
}

pub(crate) unsafe fn cu_mipmapped_array_destroy(c: &Call, mip: CUmipmappedArray) -> CUresult {
    let h = mip as usize as u64;
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        match st.mipmaps.remove(&h) {
            Some(m) => {
                for l in m.levels {
                    st.arrays.remove(&l);
                    st.gone.insert(l, GoneWhy::Destroyed);
                }
                st.gone.insert(h, GoneWhy::Destroyed);
                Ok(())
            }
            None => Err(not_live(c, &st, "mipmapped array", h, true, INVALID_HANDLE)),
        }
    })();
    done(r)
}

pub(crate) unsafe fn cu_destroy_external_memory(c: &Call, ext: CUexternalMemory) -> CUresult {
    let h = ext as usize as u64;
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        if h == 0 {
            return Err(INVALID_VALUE);
        }
        match st.memories.remove(&h) {
            // Mappings made from it stay valid (freed by their own calls).
            Some(m) => {
                drop(m);
                st.gone.insert(h, GoneWhy::Destroyed);
                Ok(())
            }
            None => Err(not_live(c, &st, "external memory", h, true, INVALID_VALUE)),
        }
    })();
    done(r)
}

// ---------------------------------------------------------------- external semaphores

const SEM_OPAQUE_FD: u32 = 1;
const SEM_NVSCISYNC: u32 = 6;
const SEM_TIMELINE_FD: u32 = 9;

pub(crate) unsafe fn cu_import_external_semaphore(
    c: &Call,
    out: *mut CUexternalSemaphore,
    desc: *const CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC,
) -> CUresult {
    // Which fd the call was handed, read before anything can fail.
    // SAFETY: forwarded caller pointer (NULL is allowed and checked).
    let handed = match unsafe { get(desc) } {
        Ok(d) if d.type_.0 == SEM_OPAQUE_FD || d.type_.0 == SEM_TIMELINE_FD => {
            // SAFETY: for fd kinds the union holds the descriptor.
            Handed::at(unsafe { d.handle.fd })
        }
        _ => None,
    };
    let r = (|| {
        // SAFETY: forwarded caller pointer.
        let desc = unsafe { get(desc) }?;
        let mut st = c.state();
        init(&st)?;
        let ctx = current_ctx(c, &st)?;
        if out.is_null() || desc.flags != 0 || desc.reserved.iter().any(|r| *r != 0) {
            return Err(INVALID_VALUE);
        }
        let kind = desc.type_.0;
        let (sem, fd, source) = match kind {
            SEM_OPAQUE_FD | SEM_TIMELINE_FD => {
                if kind == SEM_TIMELINE_FD && !c.inst.config.timeline_supported {
                    return Err(NOT_SUPPORTED);
                }
                // SAFETY: for fd kinds the union holds the descriptor.
                let raw = unsafe { desc.handle.fd };
                match shm::inspect_fd(raw) {
                    FdInfo::Bad => return Err(UNKNOWN),
                    FdInfo::NotAFile => {
                        c.diag(
                            D::Misuse,
                            format!("fd {raw} is not a semaphore exported by the simulator"),
                        );
                        // Measured (/dev/null): UNKNOWN, fd left open.
                        return Err(UNKNOWN);
                    }
                    FdInfo::File(_) => {}
                }
                // SAFETY: `raw` is an open descriptor (checked); only borrowed.
                let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) };
                let Some(sem) = SharedSemaphore::open(borrowed) else {
                    c.diag(
                        D::Misuse,
                        format!("fd {raw} is not a semaphore exported by the simulator"),
                    );
                    // Measured (a memfd): UNKNOWN, fd left open.
                    return Err(UNKNOWN);
                };
                let want = if kind == SEM_OPAQUE_FD {
                    SemaphoreKind::Binary
                } else {
                    SemaphoreKind::Timeline
                };
                if sem.kind() != want {
                    c.diag(
                        D::Misuse,
                        format!("fd {raw} holds a {:?} semaphore but was imported as handle type {kind}", sem.kind()),
                    );
                    return Err(INVALID_VALUE);
                }
                if handed.map(|h| h.fd) != Some(raw) {
                    // Closed or swapped by another thread meanwhile: refuse.
                    return Err(UNKNOWN);
                }
                let keep =
                    TrackedFd::dup(&c.inst.fds, site(c), borrowed).map_err(|_| OPERATING_SYSTEM)?;
                let source = if kind == SEM_OPAQUE_FD {
                    SemSource::OpaqueFd
                } else {
                    SemSource::TimelineFd
                };
                (Arc::new(sem), Some(keep), source)
            }
            SEM_NVSCISYNC => {
                // SAFETY: for NVSCISYNC the union holds the object pointer.
                let obj = unsafe { desc.handle.nvSciSyncObj } as usize;
                if obj == 0 {
                    return Err(INVALID_VALUE);
                }
                let Some(e) = st.sync_objects.get(&obj) else {
                    if !c.inst.config.nvsci {
                        return Err(NOT_SUPPORTED);
                    }
                    c.diag(
                        D::UnknownHandle,
                        format!("{obj:#x} is not an NvSciSync object of this simulator"),
                    );
                    return Err(INVALID_VALUE);
                };
                let source = SemSource::NvSciSync {
                    object_id: e.id,
                    can_signal: e.can_signal,
                    can_wait: e.can_wait,
                };
                (Arc::clone(&e.sem), None, source)
            }
            2..=5 | 7 | 8 | 10 => {
                // Chosen like the measured OPAQUE_WIN32 memory import:
                // NOT_SUPPORTED, the fd in the union untouched.
                c.diag(D::Misuse, format!("semaphore handle type {kind} is a Windows handle type; not available on Linux"));
                return Err(NOT_SUPPORTED);
            }
            // Measured: type 0 and an unknown type (42) -> INVALID_VALUE.
            _ => return Err(INVALID_VALUE),
        };
        let h = new_handle(Tag::Semaphore);
        st.semaphores.insert(
            h,
            SemObj {
                ctx,
                sem,
                _fd: fd,
                source,
                outstanding: Arc::new(AtomicUsize::new(0)),
            },
        );
        // SAFETY: checked non-null; caller pointer.
        unsafe { put(out, h as usize as CUexternalSemaphore) }
    })();
    // Success: the driver owns the fd and closes it (measured). Failure:
    // the H200 left the fd open on every failed semaphore import it was
    // measured with (UNKNOWN for /dev/null, a memfd, a regular file, a pipe,
    // a socket; INVALID_VALUE for bad flags, reserved words or kinds;
    // INVALID_CONTEXT), so the fd stays the caller's; injected failures too.
    if let (Ok(()), Some(h)) = (r, handed) {
        close_handed(c, h);
    }
    done(r)
}

/// What one element of a signal or wait batch does on the stream.
enum Op {
    SignalBinary,
    SignalTimeline(u64),
    SignalDeterministic,
    WaitBinary,
    WaitValue(u64),
    Nothing,
}

/// A batch element: handle, shared state, kind, outstanding-work counter.
type Resolved = (u64, Arc<SharedSemaphore>, SemSource, Arc<AtomicUsize>);

/// Resolves the semaphores of a batch against the stream's context.
///
/// # Safety
/// `sems` must be NULL or point at `n` handles.
unsafe fn batch_semaphores(
    c: &Call,
    st: &State,
    sems: *const CUexternalSemaphore,
    n: usize,
    ctx: u64,
) -> R<Vec<Resolved>> {
    if sems.is_null() {
        return Err(INVALID_VALUE);
    }
    let mut v = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: the caller passes `n` handles at `sems`.
        let h = unsafe { sems.add(i).read() } as usize as u64;
        let Some(s) = st.semaphores.get(&h) else {
            return Err(not_live(
                c,
                st,
                "external semaphore",
                h,
                false,
                INVALID_VALUE,
            ));
        };
        if s.ctx != ctx {
            // Measured: the real driver says INVALID_VALUE and nothing else.
            c.diag(
                D::CrossContext,
                format!(
                    "semaphore {h:#x} belongs to context {:#x} but the stream to context {ctx:#x}",
                    s.ctx
                ),
            );
            return Err(INVALID_VALUE);
        }
        v.push((h, Arc::clone(&s.sem), s.source, Arc::clone(&s.outstanding)));
    }
    Ok(v)
}

fn enqueue_ops(core: &StreamCore, ops: Vec<(Arc<SharedSemaphore>, Op, Arc<AtomicUsize>)>) {
    for (_, _, out) in &ops {
        out.fetch_add(1, Ordering::AcqRel);
    }
    core.enqueue(Box::new(move |sc: &StreamCore| {
        for (sem, op, outstanding) in ops {
            match op {
                Op::SignalBinary => sem.signal_binary(),
                Op::SignalTimeline(v) => sem.store(v),
                Op::SignalDeterministic => {
                    sem.increment();
                }
                Op::WaitBinary => {
                    let _ = sem.wait(1, None, &|| sc.cancelled());
                }
                Op::WaitValue(v) => {
                    let _: WaitEnd = sem.wait(v, None, &|| sc.cancelled());
                }
                Op::Nothing => {}
            }
            outstanding.fetch_sub(1, Ordering::AcqRel);
        }
    }));
}

pub(crate) unsafe fn cu_signal_external_semaphores_async(
    c: &Call,
    sems: *const CUexternalSemaphore,
    params: *const CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS,
    n: c_uint,
    stream: CUstream,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let n = n as usize;
        let (ctx, core) = resolve_stream(c, &mut st, stream)?;
        if n == 0 {
            return Ok(());
        }
        if params.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: forwarded caller pointer with `n` elements.
        let resolved = unsafe { batch_semaphores(c, &st, sems, n, ctx) }?;
        // Validate the whole batch before anything is enqueued or written.
        let mut plan = Vec::with_capacity(n);
        let mut memsync = Vec::new();
        for (i, (h, sem, source, outstanding)) in resolved.into_iter().enumerate() {
            // SAFETY: the caller passes `n` parameter blocks at `params`.
            let p = unsafe { params.add(i).read() };
            if p.reserved.iter().any(|r| *r != 0) || p.params.reserved.iter().any(|r| *r != 0) {
                return Err(INVALID_VALUE);
            }
            let op = match source {
                SemSource::OpaqueFd | SemSource::TimelineFd if p.flags != 0 => {
                    return Err(INVALID_VALUE)
                }
                SemSource::OpaqueFd => (Op::SignalBinary, None),
                SemSource::TimelineFd => (Op::SignalTimeline(p.params.fence.value), None),
                SemSource::NvSciSync {
                    object_id,
                    can_signal,
                    ..
                } => {
                    if p.flags & !CUDA_EXTERNAL_SEMAPHORE_SIGNAL_SKIP_NVSCIBUF_MEMSYNC != 0 {
                        return Err(INVALID_VALUE);
                    }
                    if !can_signal {
                        c.diag(
                            D::Misuse,
                            format!(
                                "semaphore {h:#x}: its NvSciSync object has no signal permission"
                            ),
                        );
                        return Err(NOT_SUPPORTED);
                    }
                    // SAFETY: reading the pointer member of a plain union.
                    let f = unsafe { p.params.nvSciSync.fence }.cast::<NvSciSyncFence>();
                    if f.is_null() {
                        return Err(INVALID_VALUE);
                    }
                    memsync.push((object_id, p.flags != 0));
                    (Op::SignalDeterministic, Some((f, object_id)))
                }
            };
            plan.push((sem, op, outstanding));
        }
        for (object_id, skipped) in memsync {
            crate::nvsci::record_memsync(
                &mut st,
                crate::nvsci::MemsyncOp::Signal,
                object_id,
                skipped,
            );
        }
        let mut ops = Vec::with_capacity(n);
        for (sem, (op, fence_out), outstanding) in plan {
            if let Some((f, object_id)) = fence_out {
                let value = sem.reserve_next();
                // SAFETY: the caller's fence pointer (non-null, checked) must
                // point at a writable NvSciSyncFence; the driver overwrites it.
                unsafe { f.write(fence::encode(SimFence { object_id, value })) };
            }
            ops.push((sem, op, outstanding));
        }
        enqueue_ops(&core, ops);
        Ok(())
    })();
    done(r)
}

pub(crate) unsafe fn cu_wait_external_semaphores_async(
    c: &Call,
    sems: *const CUexternalSemaphore,
    params: *const CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
    n: c_uint,
    stream: CUstream,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let n = n as usize;
        let (ctx, core) = resolve_stream(c, &mut st, stream)?;
        if n == 0 {
            return Ok(());
        }
        if params.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: forwarded caller pointer with `n` elements.
        let resolved = unsafe { batch_semaphores(c, &st, sems, n, ctx) }?;
        let mut ops = Vec::with_capacity(n);
        let mut memsync = Vec::new();
        for (i, (h, sem, source, outstanding)) in resolved.into_iter().enumerate() {
            // SAFETY: the caller passes `n` parameter blocks at `params`.
            let p = unsafe { params.add(i).read() };
            if p.reserved.iter().any(|r| *r != 0) || p.params.reserved.iter().any(|r| *r != 0) {
                return Err(INVALID_VALUE);
            }
            let op = match source {
                SemSource::OpaqueFd | SemSource::TimelineFd if p.flags != 0 => {
                    return Err(INVALID_VALUE)
                }
                SemSource::OpaqueFd => Op::WaitBinary,
                SemSource::TimelineFd => Op::WaitValue(p.params.fence.value),
                SemSource::NvSciSync {
                    object_id,
                    can_wait,
                    ..
                } => {
                    if p.flags & !CUDA_EXTERNAL_SEMAPHORE_WAIT_SKIP_NVSCIBUF_MEMSYNC != 0 {
                        return Err(INVALID_VALUE);
                    }
                    if !can_wait {
                        c.diag(
                            D::Misuse,
                            format!(
                                "semaphore {h:#x}: its NvSciSync object has no wait permission"
                            ),
                        );
                        return Err(NOT_SUPPORTED);
                    }
                    // SAFETY: reading the pointer member of a plain union.
                    let f = unsafe { p.params.nvSciSync.fence }
                        .cast::<NvSciSyncFence>()
                        .cast_const();
                    // SAFETY: the caller's fence pointer must point at a
                    // readable NvSciSyncFence (NULL is refused).
                    let fence = unsafe { get(f) }?;
                    memsync.push((object_id, p.flags != 0));
                    match fence::decode(&fence) {
                        FenceContent::Cleared => Op::Nothing,
                        FenceContent::Fence(sf) if sf.object_id == object_id => {
                            Op::WaitValue(sf.value)
                        }
                        FenceContent::Fence(sf) => {
                            c.diag(
                                D::Misuse,
                                format!("fence of sync object {} waited on through semaphore {h:#x} of object {object_id}", sf.object_id),
                            );
                            return Err(INVALID_VALUE);
                        }
                        FenceContent::Garbage => {
                            c.diag(
                                D::Misuse,
                                "NvSciSyncFence holds bytes the simulator did not write".into(),
                            );
                            return Err(INVALID_VALUE);
                        }
                    }
                }
            };
            ops.push((sem, op, outstanding));
        }
        for (object_id, skipped) in memsync {
            crate::nvsci::record_memsync(
                &mut st,
                crate::nvsci::MemsyncOp::Wait,
                object_id,
                skipped,
            );
        }
        enqueue_ops(&core, ops);
        Ok(())
    })();
    done(r)
}

pub(crate) unsafe fn cu_destroy_external_semaphore(c: &Call, s: CUexternalSemaphore) -> CUresult {
    let h = s as usize as u64;
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        if h == 0 {
            return Err(INVALID_VALUE);
        }
        match st.semaphores.remove(&h) {
            Some(obj) => {
                let n = obj.outstanding.load(Ordering::Acquire);
                if n > 0 {
                    c.diag(
                        D::OutstandingWork,
                        format!("semaphore {h:#x} destroyed with {n} signal/wait operation(s) still queued on a stream"),
                    );
                }
                st.gone.insert(h, GoneWhy::Destroyed);
                Ok(())
            }
            None => Err(not_live(
                c,
                &st,
                "external semaphore",
                h,
                true,
                INVALID_VALUE,
            )),
        }
    })();
    done(r)
}

pub(crate) unsafe fn cu_device_get_nvsci_sync_attributes(
    c: &Call,
    list: *mut c_void,
    dev: CUdevice,
    flags: c_int,
) -> CUresult {
    let r = (|| {
        init(&c.state())?;
        device(c, dev)?;
        if !c.inst.config.nvsci {
            // Measured on a discrete GPU without NvSci.
            return Err(if list.is_null() {
                INVALID_HANDLE
            } else {
                NOT_SUPPORTED
            });
        }
        if list.is_null() || !(1..=3).contains(&flags) {
            return Err(INVALID_VALUE);
        }
        let code = crate::nvsci::cuda_fill_sync_attrs(c, list, dev, flags);
        if code == SUCCESS {
            Ok(())
        } else {
            Err(code)
        }
    })();
    done(r)
}

// ---------------------------------------------------------------- errors

pub(crate) unsafe fn cu_get_error_name(code: CUresult, out: *mut *const c_char) -> CUresult {
    let n = codes::name(code.0);
    // SAFETY: forwarded caller pointer.
    let r = unsafe { put(out, n.map_or(core::ptr::null(), |s| s.as_ptr())) };
    match (r, n) {
        (Err(e), _) => e,
        (Ok(()), None) => INVALID_VALUE,
        (Ok(()), Some(_)) => SUCCESS,
    }
}

pub(crate) unsafe fn cu_get_error_string(code: CUresult, out: *mut *const c_char) -> CUresult {
    let n = codes::description(code.0);
    // SAFETY: forwarded caller pointer.
    let r = unsafe { put(out, n.map_or(core::ptr::null(), |s| s.as_ptr())) };
    match (r, n) {
        (Err(e), _) => e,
        (Ok(()), None) => INVALID_VALUE,
        (Ok(()), Some(_)) => SUCCESS,
    }
}

/// How long stream synchronisation waits before it reports a hang.
pub(crate) const DEFAULT_HANG_TIMEOUT: Duration = Duration::from_secs(30);
