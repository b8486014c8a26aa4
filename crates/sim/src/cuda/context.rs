//! Contexts: primary and own, current context, synchronisation.

use super::*;

pub(crate) fn cuDevicePrimaryCtxRetain(c: &Call, out: CMut<CUcontext>, dev: CUdevice) -> CUresult {
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
        put(
            out,
            core::ptr::without_provenance_mut::<core::ffi::c_void>(h as usize).cast(),
        )
    })();
    done(r)
}

pub(crate) fn cuDevicePrimaryCtxRelease(c: &Call, dev: CUdevice) -> CUresult {
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

pub(crate) fn cuDevicePrimaryCtxReset(c: &Call, dev: CUdevice) -> CUresult {
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

pub(crate) fn cuCtxCreate(
    c: &Call,
    out: CMut<CUcontext>,
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
        put(
            out,
            core::ptr::without_provenance_mut::<core::ffi::c_void>(h as usize).cast(),
        )
    })();
    done(r)
}

pub(crate) fn cuCtxDestroy(c: &Call, ctx: Handle<CUcontext>) -> CUresult {
    let h = ctx.addr() as u64;
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

pub(crate) fn cuCtxSetCurrent(c: &Call, ctx: Handle<CUcontext>) -> CUresult {
    let h = ctx.addr() as u64;
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

pub(crate) fn cuCtxGetCurrent(c: &Call, out: CMut<CUcontext>) -> CUresult {
    let r = (|| {
        init(&c.state())?;
        put(
            out,
            core::ptr::without_provenance_mut::<core::ffi::c_void>(c.inst.current() as usize)
                .cast(),
        )
    })();
    done(r)
}

pub(crate) fn cuCtxGetDevice(c: &Call, out: CMut<CUdevice>) -> CUresult {
    let r = (|| {
        let st = c.state();
        init(&st)?;
        let h = current_ctx(c, &st)?;
        let d = st
            .contexts
            .get(&h)
            .map(|x| x.device)
            .ok_or(INVALID_CONTEXT)?;
        put(out, d)
    })();
    done(r)
}

pub(super) fn wait_cores(c: &Call, cores: Vec<Arc<StreamCore>>, what: &str) -> R {
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
pub(super) fn blocking_cores(st: &State, ctx: u64) -> Vec<Arc<StreamCore>> {
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

pub(crate) fn cuCtxSynchronize(c: &Call) -> CUresult {
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
