//! External semaphores: import, signal/wait batches, destroy; NvSciSync attributes.

use super::*;

pub(super) const SEM_OPAQUE_FD: u32 = 1;
pub(super) const SEM_NVSCISYNC: u32 = 6;
pub(super) const SEM_TIMELINE_FD: u32 = 9;

pub(crate) fn cuImportExternalSemaphore(
    c: &Call,
    out: CMut<CUexternalSemaphore>,
    desc: CPtr<CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC>,
) -> CUresult {
    // Which fd the call was handed, read before anything can fail.
    let handed = match desc.read_in() {
        Some(d) if d.type_.0 == SEM_OPAQUE_FD || d.type_.0 == SEM_TIMELINE_FD => {
            // For fd kinds the union holds the descriptor.
            Handed::at(d.handle_fd())
        }
        _ => None,
    };
    let r = (|| {
        let desc = desc.read_in().ok_or(INVALID_VALUE)?;
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
                // For fd kinds the union holds the descriptor.
                let raw = desc.handle_fd();
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
                let Some(sem) = with_handed(raw, SharedSemaphore::open) else {
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
                let keep = with_handed(raw, |b| TrackedFd::dup(&c.inst.fds, site(c), b))
                    .map_err(|_| OPERATING_SYSTEM)?;
                let source = if kind == SEM_OPAQUE_FD {
                    SemSource::OpaqueFd
                } else {
                    SemSource::TimelineFd
                };
                (Arc::new(sem), Some(keep), source)
            }
            SEM_NVSCISYNC => {
                // For NVSCISYNC the union holds the object pointer.
                let obj = desc.handle_nvscisync();
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
        put(
            out,
            core::ptr::without_provenance_mut::<core::ffi::c_void>(h as usize).cast(),
        )
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
pub(super) enum Op {
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
pub(super) fn batch_semaphores(
    c: &Call,
    st: &State,
    sems: Option<&[CUexternalSemaphore]>,
    ctx: u64,
) -> R<Vec<Resolved>> {
    let Some(sems) = sems else {
        return Err(INVALID_VALUE);
    };
    let mut v = Vec::with_capacity(sems.len());
    for s in sems {
        let h = *s as usize as u64;
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

pub(super) fn enqueue_ops(
    core: &StreamCore,
    ops: Vec<(Arc<SharedSemaphore>, Op, Arc<AtomicUsize>)>,
) {
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

/// What the signal and wait parameter blocks share, so that one function checks a batch of
/// either (`run_batch`).
pub(super) trait BatchParams: Copy {
    /// The only flag the driver accepts, and only for NvSciSync semaphores: skip the NvSciBuf
    /// memory synchronisation.
    const SKIP_MEMSYNC: u32;
    /// The memory synchronisation a batch element on an NvSciSync semaphore performs.
    const MEMSYNC: crate::nvsci::MemsyncOp;
    /// "signal" or "wait", for the permission diagnostic.
    const VERB: &'static str;
    /// The block's flags word.
    fn flags(&self) -> u32;
    /// Whether every reserved word (outer and inner) is zero.
    fn reserved_clear(&self) -> bool;
    /// Whether an NvSciSync object with these permissions allows this direction.
    fn permitted(can_signal: bool, can_wait: bool) -> bool;
}

/// Implements `BatchParams` for one direction's parameter block.
macro_rules! batch_params {
    ($block:ty, $skip:expr, $memsync:ident, $verb:literal, |$s:ident, $w:ident| $permitted:expr) => {
        impl BatchParams for $block {
            const SKIP_MEMSYNC: u32 = $skip;
            const MEMSYNC: crate::nvsci::MemsyncOp = crate::nvsci::MemsyncOp::$memsync;
            const VERB: &'static str = $verb;
            fn flags(&self) -> u32 {
                self.flags
            }
            fn reserved_clear(&self) -> bool {
                self.reserved
                    .iter()
                    .chain(&self.params.reserved)
                    .all(|r| *r == 0)
            }
            fn permitted($s: bool, $w: bool) -> bool {
                $permitted
            }
        }
    };
}

batch_params!(
    CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS,
    CUDA_EXTERNAL_SEMAPHORE_SIGNAL_SKIP_NVSCIBUF_MEMSYNC,
    Signal,
    "signal",
    |can_signal, _can_wait| can_signal
);
batch_params!(
    CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
    CUDA_EXTERNAL_SEMAPHORE_WAIT_SKIP_NVSCIBUF_MEMSYNC,
    Wait,
    "wait",
    |_can_signal, can_wait| can_wait
);

/// A batch element's semaphore kind, after the checks both directions share.
#[derive(Clone, Copy)]
enum Checked {
    /// An opaque-fd (binary) semaphore.
    Binary,
    /// A timeline-fd semaphore.
    Timeline,
    /// An NvSciSync semaphore with the permission the direction needs, of this object.
    NvSciSync(u64),
}

/// A batch element as its direction plans it: semaphore, plan, outstanding-work counter.
type Planned<T> = (Arc<SharedSemaphore>, T, Arc<AtomicUsize>);

/// The frame of `cuSignalExternalSemaphoresAsync` and `cuWaitExternalSemaphoresAsync`: resolves
/// the stream and the semaphores, checks every parameter block (reserved words, flags, the
/// NvSciSync permission) and lets `plan` map each element to its direction's plan, all before
/// anything is recorded, written or enqueued; then records the NvSciBuf memory
/// synchronisations, lets `finish` turn the plans into stream operations (writing what the
/// call hands back) and enqueues them.
///
fn run_batch<'c, P: BatchParams + Plain, T>(
    c: &Call,
    sems: Option<&[CUexternalSemaphore]>,
    params: Option<CArr<'c, P>>,
    n: c_uint,
    stream: Handle<CUstream>,
    mut plan: impl FnMut(u64, &CIn<'c, P>, Checked) -> R<T>,
    finish: impl FnOnce(Vec<Planned<T>>) -> Vec<Planned<Op>>,
) -> CUresult {
    let r = (|| {
        let mut st = c.state();
        init(&st)?;
        let n = n as usize;
        let (ctx, core) = resolve_stream(c, &mut st, stream)?;
        if n == 0 {
            return Ok(());
        }
        let Some(params) = params else {
            return Err(INVALID_VALUE);
        };
        let resolved = batch_semaphores(c, &st, sems, ctx)?;
        // Validate the whole batch before anything is enqueued or written.
        let mut planned = Vec::with_capacity(n);
        let mut memsync = Vec::new();
        for (i, (h, sem, source, outstanding)) in resolved.into_iter().enumerate() {
            let p = params.get(i).ok_or(INVALID_VALUE)?;
            if !p.reserved_clear() {
                return Err(INVALID_VALUE);
            }
            let checked = match source {
                SemSource::OpaqueFd | SemSource::TimelineFd if p.flags() != 0 => {
                    return Err(INVALID_VALUE)
                }
                SemSource::OpaqueFd => Checked::Binary,
                SemSource::TimelineFd => Checked::Timeline,
                SemSource::NvSciSync {
                    object_id,
                    can_signal,
                    can_wait,
                } => {
                    if p.flags() & !P::SKIP_MEMSYNC != 0 {
                        return Err(INVALID_VALUE);
                    }
                    if !P::permitted(can_signal, can_wait) {
                        c.diag(
                            D::Misuse,
                            format!(
                                "semaphore {h:#x}: its NvSciSync object has no {} permission",
                                P::VERB
                            ),
                        );
                        return Err(NOT_SUPPORTED);
                    }
                    memsync.push((object_id, p.flags() != 0));
                    Checked::NvSciSync(object_id)
                }
            };
            planned.push((sem, plan(h, &p, checked)?, outstanding));
        }
        for (object_id, skipped) in memsync {
            crate::nvsci::record_memsync(&mut st, P::MEMSYNC, object_id, skipped);
        }
        enqueue_ops(&core, finish(planned));
        Ok(())
    })();
    done(r)
}

/// A signal's plan: its operation and, for NvSciSync, the caller's fence to write and the object.
type SignalPlan<'c> = (Op, Option<(CMut<'c, NvSciSyncFence>, u64)>);

pub(crate) fn cuSignalExternalSemaphoresAsync<'c>(
    c: &Call,
    sems: Option<&[CUexternalSemaphore]>,
    params: Option<CArr<'c, CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS>>,
    n: c_uint,
    stream: Handle<CUstream>,
) -> CUresult {
    let plan = |_h: u64, p: &CIn<'c, CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS>, checked: Checked| {
        Ok(match checked {
            Checked::Binary => (Op::SignalBinary, None),
            Checked::Timeline => (Op::SignalTimeline(p.params.fence.value), None),
            Checked::NvSciSync(object_id) => {
                let f = p.nvsci_fence();
                if f.is_null() {
                    return Err(INVALID_VALUE);
                }
                (Op::SignalDeterministic, Some((f, object_id)))
            }
        })
    };
    let finish = |planned: Vec<Planned<SignalPlan<'c>>>| {
        let mut ops = Vec::with_capacity(planned.len());
        for (sem, (op, fence_out), outstanding) in planned {
            if let Some((f, object_id)) = fence_out {
                let value = sem.reserve_next();
                // The caller's fence (non-null, checked): the driver overwrites it.
                f.write(fence::encode(SimFence { object_id, value }));
            }
            ops.push((sem, op, outstanding));
        }
        ops
    };
    run_batch(c, sems, params, n, stream, plan, finish)
}

pub(crate) fn cuWaitExternalSemaphoresAsync(
    c: &Call,
    sems: Option<&[CUexternalSemaphore]>,
    params: Option<CArr<CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS>>,
    n: c_uint,
    stream: Handle<CUstream>,
) -> CUresult {
    let plan = |h: u64, p: &CIn<CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS>, checked: Checked| {
        Ok(match checked {
            Checked::Binary => Op::WaitBinary,
            Checked::Timeline => Op::WaitValue(p.params.fence.value),
            Checked::NvSciSync(object_id) => {
                // The caller's fence must be readable (NULL is refused).
                let fence = get(p.nvsci_fence())?;
                match fence::decode(&fence) {
                    FenceContent::Cleared => Op::Nothing,
                    FenceContent::Fence(sf) if sf.object_id == object_id => Op::WaitValue(sf.value),
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
        })
    };
    run_batch(c, sems, params, n, stream, plan, |planned| planned)
}

pub(crate) fn cuDestroyExternalSemaphore(c: &Call, s: Handle<CUexternalSemaphore>) -> CUresult {
    let h = s.addr() as u64;
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

pub(crate) fn cuDeviceGetNvSciSyncAttributes(
    c: &Call,
    list: CMut<c_void>,
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
        let code = crate::nvsci::cuda_fill_sync_attrs(c, list.as_raw(), dev, flags);
        if code == SUCCESS {
            Ok(())
        } else {
            Err(code)
        }
    })();
    done(r)
}
