//! The consumer's end of a simulated EGLStream: connect, acquire (with the
//! measured timeout answers and reuse of the kept frame), the acquired
//! frame's description for `GetMappedEglFrame`, release, disconnect.

use super::*;

pub(crate) fn cuEGLStreamConsumerConnect(
    c: &Call,
    conn: CMut<CUeglStreamConnection>,
    stream: Handle<EGLStreamKHR>,
) -> CUresult {
    cuEGLStreamConsumerConnectWithFlags(c, conn, stream, 1)
}

pub(crate) fn cuEGLStreamConsumerConnectWithFlags(
    c: &Call,
    conn: CMut<CUeglStreamConnection>,
    stream: Handle<EGLStreamKHR>,
    flags: c_uint,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        let (ctx, s) = connect_prelude(c, &st, conn, stream)?;
        if flags > 1 {
            return Err(INVALID_VALUE);
        }
        if stream_obj(&st, s)?.phase != Phase::Created {
            return Err(unmeasured(
                c,
                "a second consumer, or one after the stream was used",
            ));
        }
        let h = record_connection(&mut st, s, conn);
        if let Some(obj) = st.egl_streams.streams.get_mut(&s) {
            obj.consumer = Some((h, ctx));
            obj.phase = Phase::Connecting;
        }
        Ok(())
    })();
    done(r)
}

/// The consumer now holds frame `p` of stream `s`: a new resource handle
/// for it, written to `resource`.
fn hand_out(st: &mut State, s: usize, p: Presented, resource: CMut<CUgraphicsResource>) {
    let res = new_handle(Tag::GraphicsResource);
    if let Some(obj) = st.egl_streams.streams.get_mut(&s) {
        obj.hold(res, p);
    }
    st.egl_streams.connections.insert(res, s);
    resource.write(core::ptr::without_provenance_mut::<core::ffi::c_void>(res as usize).cast());
}

pub(crate) fn cuEGLStreamConsumerAcquireFrame(
    c: &Call,
    conn: CMut<CUeglStreamConnection>,
    resource: CMut<CUgraphicsResource>,
    pstream: CMut<CUstream>,
    timeout: c_uint,
) -> CUresult {
    let r = (|| {
        let deadline = (timeout != u32::MAX)
            .then(|| std::time::Instant::now() + Duration::from_micros(u64::from(timeout)));
        loop {
            let mut st = c.state();
            let (_, s) = own_end(c, &st, conn, true)?;
            if resource.is_null() {
                return Err(INVALID_VALUE);
            }
            stream_core(c, &mut st, pstream)?;
            let obj = &stream_obj(&st, s)?;
            if obj.phase == Phase::Connecting {
                return Err(unmeasured(c, "an acquire before a producer connected"));
            }
            if obj.phase == Phase::Disconnected && !obj.waiting.is_empty() {
                return Err(unmeasured(
                    c,
                    "an acquire of a frame presented before the producer left",
                ));
            }
            let took = st.egl_streams.streams.get_mut(&s).and_then(|obj| {
                let p = obj.waiting.pop_front()?;
                obj.acquired_any = true;
                Some(p)
            });
            if let Some(p) = took {
                hand_out(&mut st, s, p, resource);
                return Ok(());
            }
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                // Nothing new: the kept frame again, if not held (reuse),
                // while the producer is connected (measured: after it left,
                // acquires time out).
                let reuse = st
                    .egl_streams
                    .streams
                    .get_mut(&s)
                    .filter(|obj| obj.phase == Phase::Connected)
                    .and_then(|obj| obj.kept.take());
                if let Some(p) = reuse {
                    hand_out(&mut st, s, p, resource);
                    return Ok(());
                }
                let n = st.egl_streams.streams.get_mut(&s).map_or(0, |obj| {
                    obj.timeouts += 1;
                    obj.timeouts
                });
                return Err(if n % 2 == 1 { UNKNOWN } else { LAUNCH_TIMEOUT });
            }
            drop(st);
            std::thread::sleep(Duration::from_micros(100));
        }
    })();
    done(r)
}

/// A held frame of the stream named by `res` (for GetMappedEglFrame):
/// the consumer's frame description.
pub(crate) fn held_frame(st: &State, res: u64) -> Option<CUeglFrame> {
    let s = st.egl_streams.connections.get(&res)?;
    let obj = st.egl_streams.streams.get(s)?;
    let (_, p) = obj.held.iter().find(|(h, _)| *h == res)?;
    let mut f = p.producer.frame();
    // Measured (H100, driver 580.159): a frame presented as
    // YUV420_SEMIPLANAR (NV12) is acquired as YVU420_SEMIPLANAR, same
    // planes and pitch.
    if f.eglColorFormat == CUeglColorFormat::CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR {
        f.eglColorFormat = CUeglColorFormat::CU_EGL_COLOR_FORMAT_YVU420_SEMIPLANAR;
    }
    let words = [
        (p.copy + p.offsets[0]) as usize,
        if f.planeCount > 1 {
            (p.copy + p.offsets[1]) as usize
        } else {
            0
        },
        0,
    ];
    crate::cmem::set_egl_plane_words(&mut f, words);
    Some(f)
}

pub(crate) fn cuEGLStreamConsumerReleaseFrame(
    c: &Call,
    conn: CMut<CUeglStreamConnection>,
    res: Handle<CUgraphicsResource>,
    pstream: CMut<CUstream>,
) -> CUresult {
    let r = (|| {
        let core = {
            let mut st = c.state();
            own_end(c, &st, conn, true)?;
            stream_core(c, &mut st, pstream)?
        };
        // Work queued on the stream that reads the frame comes first.
        wait_cores(c, vec![core], "cuEGLStreamConsumerReleaseFrame")?;
        let mut st = c.state();
        let (_, s) = connection(c, &st, conn)?;
        let r = res.addr() as u64;
        let Some(obj) = st.egl_streams.streams.get_mut(&s) else {
            return Err(INVALID_HANDLE);
        };
        let Some(i) = obj.held.iter().position(|(h, _)| *h == r) else {
            return Err(not_live(
                c,
                &st,
                "acquired EGLStream frame",
                r,
                true,
                INVALID_HANDLE,
            ));
        };
        let (_, p) = obj.held.remove(i);
        // Of the released frames the most recently acquired stays.
        let back = match obj.kept.take() {
            Some(k) if k.acquired > p.acquired => {
                obj.kept = Some(k);
                Some(p)
            }
            old => {
                obj.kept = Some(p);
                old
            }
        };
        let mut freed = Vec::new();
        if let Some(b) = back {
            obj.returned.push_back(b.producer);
            freed.push(b.copy);
        }
        st.egl_streams.connections.remove(&r);
        st.gone.insert(r, GoneWhy::Destroyed);
        for copy in freed {
            free_copy(&mut st, copy);
        }
        Ok(())
    })();
    done(r)
}

pub(crate) fn cuEGLStreamConsumerDisconnect(
    c: &Call,
    conn: CMut<CUeglStreamConnection>,
) -> CUresult {
    disconnect(c, conn, true)
}
