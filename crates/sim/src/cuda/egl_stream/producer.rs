//! The producer's end of a simulated EGLStream: connect (after the
//! consumer), present (the consumer's copy of the planes), return of
//! released frames, disconnect.

use super::*;

pub(crate) fn cuEGLStreamProducerConnect(
    c: &Call,
    conn: CMut<CUeglStreamConnection>,
    stream: Handle<EGLStreamKHR>,
    width: i32,
    height: i32,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        let (ctx, s) = connect_prelude(c, &st, conn, stream)?;
        match stream_obj(&st, s)?.phase {
            Phase::Connecting => {}
            Phase::Created => {
                c.diag(
                    D::Misuse,
                    "producer connected before the consumer (EGL_KHR_stream: the consumer \
                     connects first; measured on the H200: CUDA_ERROR_UNKNOWN)"
                        .into(),
                );
                return Err(UNKNOWN);
            }
            _ => {
                return Err(unmeasured(
                    c,
                    "a second producer, or one after a disconnect",
                ))
            }
        }
        let (Ok(w), Ok(h)) = (u32::try_from(width), u32::try_from(height)) else {
            return Err(unmeasured(c, "a producer with a negative width or height"));
        };
        if w == 0 || h == 0 {
            return Err(unmeasured(c, "a producer of 0 x 0 frames"));
        }
        let handle = record_connection(&mut st, s, conn);
        if let Some(obj) = st.egl_streams.streams.get_mut(&s) {
            obj.producer = Some((handle, ctx, w, h));
            obj.phase = Phase::Connected;
        }
        Ok(())
    })();
    done(r)
}

pub(crate) fn cuEGLStreamProducerPresentFrame(
    c: &Call,
    conn: CMut<CUeglStreamConnection>,
    frame: CUeglFrame,
    pstream: CMut<CUstream>,
) -> CUresult {
    let r = (|| {
        let core = {
            let mut st = c.state();
            init(&st)?;
            let (h, s) = connection(c, &st, conn)?;
            let obj = &stream_obj(&st, s)?;
            let Some((ph, _, w, hh)) = obj.producer.filter(|p| p.0 == h) else {
                return Err(INVALID_HANDLE);
            };
            let _ = ph;
            if obj.consumer.is_none() || obj.phase == Phase::Disconnected {
                return Err(unmeasured(c, "a present after the consumer disconnected"));
            }
            if frame.width != w || frame.height != hh {
                return Err(unmeasured(
                    c,
                    "a present of another size than the producer connected with",
                ));
            }
            if plane_lens(&frame).is_none() {
                return Err(unmeasured(
                    c,
                    "a present other than a pitch frame of one RGBA-family plane or NV12",
                ));
            }
            stream_core(c, &mut st, pstream)?
        };
        // The present is ordered after the stream's earlier work.
        wait_cores(c, vec![core], "cuEGLStreamProducerPresentFrame")?;
        let mut st = c.state();
        let (_, s) = connection(c, &st, conn)?;
        let lens = plane_lens(&frame).ok_or(UNKNOWN)?;
        let words = crate::cmem::egl_plane_words(&frame);
        let total: usize = lens.iter().sum();
        let mut bytes = vec![0u8; total];
        let mut offsets = [0u64; 3];
        let mut at = 0usize;
        for (i, len) in lens.iter().enumerate() {
            let src = words[i] as u64;
            if !st.device_read(src, &mut bytes[at..at + len]) {
                c.diag(
                    D::Misuse,
                    format!(
                        "present: plane {i} ({src:#x}, {len} bytes) is not live device memory \
                         (the header: a presented frame must stay allocated)"
                    ),
                );
                return Err(INVALID_VALUE);
            }
            offsets[i] = at as u64;
            at += len;
        }
        let consumer_ctx = stream_obj(&st, s)?.consumer.map_or(0, |x| x.1);
        let region = Region::anonymous(total.max(1)).map_err(|_| OUT_OF_MEMORY)?;
        let base = region.base();
        let copy = st.add_allocation(base, consumer_ctx, total.max(1), AllocKind::Mapped, region);
        if !st.device_write(copy, &bytes) {
            return Err(UNKNOWN);
        }
        let mut replaced = None;
        let mut full = false;
        if let Some(obj) = st.egl_streams.streams.get_mut(&s) {
            match obj.mode {
                EglStreamMode::Mailbox => replaced = obj.waiting.pop_front(),
                EglStreamMode::Fifo(n) => full = obj.waiting.len() >= n as usize,
            }
            if !full {
                obj.presented.extend(words.iter().take(lens.len()).copied());
                obj.waiting.push_back(Presented {
                    producer: FrameDesc::of(&frame),
                    copy,
                    offsets,
                    acquired: 0,
                });
                obj.presented_any = true;
            }
            if let Some(old) = &replaced {
                obj.returned.push_back(old.producer);
            }
        }
        if let Some(old) = replaced {
            free_copy(&mut st, old.copy);
        }
        if full {
            free_copy(&mut st, copy);
            return Err(unmeasured(c, "a present to a full FIFO"));
        }
        Ok(())
    })();
    done(r)
}

pub(crate) fn cuEGLStreamProducerReturnFrame(
    c: &Call,
    conn: CMut<CUeglStreamConnection>,
    frame: CMut<CUeglFrame>,
    pstream: CMut<CUstream>,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        let (_, s) = own_end(c, &st, conn, false)?;
        if frame.is_null() {
            return Err(INVALID_VALUE);
        }
        stream_core(c, &mut st, pstream)?;
        let Some(obj) = st.egl_streams.streams.get_mut(&s) else {
            return Err(INVALID_HANDLE);
        };
        match obj.returned.pop_front() {
            Some(f) => {
                frame.write(f.frame());
                Ok(())
            }
            None if obj.presented_any => {
                // Measured: the real call waits about 2 ms before it
                // answers LAUNCH_TIMEOUT; so does this one (state
                // released first), so a client that polls is as slow here.
                drop(st);
                std::thread::sleep(EMPTY_RETURN_WAIT);
                Err(LAUNCH_TIMEOUT)
            }
            None => Err(UNKNOWN),
        }
    })();
    done(r)
}

pub(crate) fn cuEGLStreamProducerDisconnect(
    c: &Call,
    conn: CMut<CUeglStreamConnection>,
) -> CUresult {
    disconnect(c, conn, false)
}
