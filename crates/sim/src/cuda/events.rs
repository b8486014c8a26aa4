//! Events: `cuEventCreate`, `cuEventRecord` (completes in stream order),
//! `cuEventQuery`, `cuEventSynchronize`, `cuEventElapsedTime`,
//! `cuEventDestroy`, and `cuStreamWaitEvent` (stream work that waits).

use super::*;

use crate::instance::{EventCore, EventObj};

/// `CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING`: the flags modelled.
/// `CU_EVENT_INTERPROCESS` (4) is refused: IPC events are not simulated.
const EVENT_FLAGS: u32 = 0x1 | 0x2;
const DISABLE_TIMING: u32 = 0x2;
const INTERPROCESS: u32 = 0x4;

fn event<'s>(c: &Call, st: &'s State, e: Handle<CUevent>, destroying: bool) -> R<&'s EventObj> {
    let h = e.addr() as u64;
    if h == 0 {
        return Err(INVALID_HANDLE);
    }
    st.events
        .get(&h)
        .ok_or_else(|| not_live(c, st, "event", h, destroying, INVALID_HANDLE))
}

pub(crate) fn cuEventCreate(c: &Call, out: CMut<CUevent>, flags: c_uint) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let ctx = current_ctx(c, &st)?;
        if out.is_null() {
            return Err(INVALID_VALUE);
        }
        if flags & INTERPROCESS != 0 {
            c.diag(
                D::Unimplemented,
                "CU_EVENT_INTERPROCESS: interprocess events are not simulated; refused".into(),
            );
            return Err(INVALID_VALUE);
        }
        if flags & !EVENT_FLAGS != 0 {
            c.diag(
                D::Misuse,
                format!("cuEventCreate flags {flags:#x}: outside the documented set"),
            );
            return Err(INVALID_VALUE);
        }
        let h = new_handle(Tag::Event);
        st.events.insert(
            h,
            EventObj {
                ctx,
                flags,
                core: Arc::new(EventCore::default()),
            },
        );
        put(
            out,
            core::ptr::without_provenance_mut::<core::ffi::c_void>(h as usize).cast(),
        )
    })();
    done(r)
}

pub(crate) fn cuEventDestroy(c: &Call, e: Handle<CUevent>) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        event(c, &st, e, true)?;
        let h = e.addr() as u64;
        // A record still queued completes into the shared core it holds;
        // the real driver defers the release the same way.
        st.events.remove(&h);
        st.gone.insert(h, GoneWhy::Destroyed);
        Ok(())
    })();
    done(r)
}

pub(crate) fn cuEventRecord(c: &Call, e: Handle<CUevent>, s: Handle<CUstream>) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let (ev_ctx, core) = {
            let ev = event(c, &st, e, false)?;
            (ev.ctx, Arc::clone(&ev.core))
        };
        let (stream_ctx, stream) = resolve_stream(c, &mut st, s)?;
        if ev_ctx != stream_ctx {
            c.diag(
                D::CrossContext,
                format!(
                    "event of context {ev_ctx:#x} recorded on a stream of context {stream_ctx:#x} \
                     (the header requires one context; the real code is unknown)"
                ),
            );
            return Err(INVALID_HANDLE);
        }
        let n = {
            let mut es = core.lock();
            es.recorded += 1;
            es.recorded
        };
        stream.enqueue(Box::new(move |_: &StreamCore| core.complete(n)));
        Ok(())
    })();
    done(r)
}

pub(crate) fn cuEventQuery(c: &Call, e: Handle<CUevent>) -> CUresult {
    let r = (|| {
        let st = c.state();
        init(&st)?;
        let ev = event(c, &st, e, false)?;
        let es = *ev.core.lock();
        if es.completed >= es.recorded {
            Ok(())
        } else {
            Err(NOT_READY)
        }
    })();
    done(r)
}

pub(crate) fn cuEventSynchronize(c: &Call, e: Handle<CUevent>) -> CUresult {
    let r = (|| {
        let core = {
            let st = c.state();
            init(&st)?;
            Arc::clone(&event(c, &st, e, false)?.core)
        };
        let limit = c.inst.config.hang_timeout;
        let deadline = std::time::Instant::now() + limit;
        let mut es = core.lock();
        let want = es.recorded;
        while es.completed < want {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                drop(es);
                c.diag(
                    D::Hang,
                    format!(
                        "cuEventSynchronize: the event's record did not complete within {limit:?} \
                         (the real driver would block forever)"
                    ),
                );
                return Err(TIMEOUT);
            }
            es = match core.changed.wait_timeout(es, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        Ok(())
    })();
    done(r)
}

pub(crate) fn cuEventElapsedTime(
    c: &Call,
    out: CMut<f32>,
    start: Handle<CUevent>,
    end: Handle<CUevent>,
) -> CUresult {
    let r = (|| {
        let st = c.state();
        init(&st)?;
        if out.is_null() {
            return Err(INVALID_VALUE);
        }
        let a = event(c, &st, start, false)?;
        let b = event(c, &st, end, false)?;
        if (a.flags | b.flags) & DISABLE_TIMING != 0 {
            return Err(INVALID_HANDLE);
        }
        // One lock at a time: `start` and `end` may be the same event.
        let sa = *a.core.lock();
        let sb = *b.core.lock();
        if sa.recorded == 0 || sb.recorded == 0 {
            return Err(INVALID_HANDLE);
        }
        if sa.completed < sa.recorded || sb.completed < sb.recorded {
            return Err(NOT_READY);
        }
        let (Some(ta), Some(tb)) = (sa.stamp, sb.stamp) else {
            return Err(NOT_READY);
        };
        let ms = if tb >= ta {
            tb.duration_since(ta).as_secs_f64() * 1000.0
        } else {
            -(ta.duration_since(tb).as_secs_f64() * 1000.0)
        };
        put(out, ms as f32)
    })();
    done(r)
}

pub(crate) fn cuStreamWaitEvent(
    c: &Call,
    s: Handle<CUstream>,
    e: Handle<CUevent>,
    flags: c_uint,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let core = Arc::clone(&event(c, &st, e, false)?.core);
        let (_, stream) = resolve_stream(c, &mut st, s)?;
        if flags != 0 {
            c.diag(
                D::Misuse,
                format!("cuStreamWaitEvent flags {flags:#x}: only 0 is modelled"),
            );
            return Err(INVALID_VALUE);
        }
        // The wait is for the event's last record at the time of this call.
        let want = core.lock().recorded;
        let limit = c.inst.config.hang_timeout;
        let inst = c.inst.weak();
        let (index, symbol) = (c.index, c.symbol);
        stream.enqueue(Box::new(move |sc: &StreamCore| {
            let deadline = std::time::Instant::now() + limit;
            let mut es = core.lock();
            while es.completed < want && !sc.cancelled() {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    drop(es);
                    if let Some(inst) = inst.upgrade() {
                        inst.diag(
                            index,
                            symbol,
                            D::Hang,
                            format!(
                                "a stream waited {limit:?} for an event record that never \
                                 completed; the simulator let the stream go on"
                            ),
                        );
                    }
                    return;
                }
                let step = left.min(std::time::Duration::from_millis(50));
                es = match core.changed.wait_timeout(es, step) {
                    Ok((g, _)) => g,
                    Err(p) => p.into_inner().0,
                };
            }
        }));
        Ok(())
    })();
    done(r)
}
