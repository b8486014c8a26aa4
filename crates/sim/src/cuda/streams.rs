//! Streams and host functions.

use super::*;

pub(super) fn start_worker(c: &Call, ctx: u64) -> R<Worker> {
    Worker::start(format!("tisim{}-stream-{ctx:x}", c.inst.id)).map_err(|e| {
        c.diag(D::Internal, format!("cannot start a stream thread: {e}"));
        OUT_OF_MEMORY
    })
}

/// Resolves a stream argument (NULL and the legacy/per-thread pseudo
/// handles mean the current context's NULL stream).
pub(super) fn resolve_stream(
    c: &Call,
    st: &mut State,
    s: Handle<CUstream>,
) -> R<(u64, Arc<StreamCore>)> {
    resolve_stream_addr(c, st, s.addr() as u64)
}

/// [`resolve_stream`] for a stream handle read out of caller memory.
pub(super) fn resolve_stream_addr(c: &Call, st: &mut State, h: u64) -> R<(u64, Arc<StreamCore>)> {
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

pub(crate) fn cuStreamCreate(c: &Call, out: CMut<CUstream>, flags: c_uint) -> CUresult {
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
        put(
            out,
            core::ptr::without_provenance_mut::<core::ffi::c_void>(h as usize).cast(),
        )
    })();
    done(r)
}

pub(crate) fn cuStreamDestroy(c: &Call, s: Handle<CUstream>) -> CUresult {
    let h = s.addr() as u64;
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

pub(crate) fn cuStreamSynchronize(c: &Call, s: Handle<CUstream>) -> CUresult {
    let r = (|| {
        let cores = {
            let mut st = c.state();
            init(&st)?;
            let (ctx, core) = resolve_stream(c, &mut st, s)?;
            if (s.addr()) <= 2 {
                blocking_cores(&st, ctx)
            } else {
                vec![core]
            }
        };
        wait_cores(c, cores, "cuStreamSynchronize")
    })();
    done(r)
}

pub(crate) fn cuStreamQuery(c: &Call, s: Handle<CUstream>) -> CUresult {
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

pub(crate) fn cuStreamGetCtx(c: &Call, s: Handle<CUstream>, out: CMut<CUcontext>) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let (ctx, _) = resolve_stream(c, &mut st, s)?;
        put(
            out,
            core::ptr::without_provenance_mut::<core::ffi::c_void>(ctx as usize).cast(),
        )
    })();
    done(r)
}

/// `cuLaunchHostFunc`: queues a call of `f(user)` on the stream's worker,
/// after the work queued before it and before the work queued after it
/// (as the real driver runs host functions in stream order on a driver
/// thread). Work dropped by a stream teardown never calls `f`.
pub(crate) fn cuLaunchHostFunc(c: &Call, s: Handle<CUstream>, f: Option<HostCallback>) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let (_, core) = resolve_stream(c, &mut st, s)?;
        let Some(f) = f else {
            return Err(INVALID_VALUE);
        };
        // The user pointer travels to the worker thread inside `f`: what it
        // points at is the caller's business, as with the real driver.
        core.enqueue(Box::new(move |sc: &StreamCore| {
            if !sc.cancelled() {
                f.call();
            }
        }));
        Ok(())
    })();
    done(r)
}
