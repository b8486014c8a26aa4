//! Imported external semaphores, and what a [`Stream`] signal or wait is
//! made of ([`SemaphoreSignal`], [`SemaphoreWait`]; the calls are in
//! [`crate::stream`]).
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::marker::PhantomData;
use std::os::fd::OwnedFd;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::owner::{Owned, Release};

use tegra_interop_core::semaphore::Payload;
use tegra_interop_core::{
    DeterministicCounter, SemaphoreHandleKind, SemaphoreImport, SignalParams, StreamId,
    TimelineTracker, ValidationError, WaitParams,
};
use tegra_interop_sys::cuda::{CUcontext, CUexternalSemaphore};
use tegra_interop_sys::nvsci::NvSciSyncFence;

use crate::ffi::{call, Bind};
use crate::memory::check_platform;
use crate::{Backend, Context, Error, ImportError, Stream};

/// What the driver keeps track of for a semaphore, so values never go
/// backwards or skip.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Tracking {
    /// Nothing to track (binary semaphores, NvSciSync without a counter).
    None,
    /// Timeline semaphores: each signalled value must exceed the last one.
    Timeline(TimelineTracker),
    /// NvSciSync with deterministic fences: each signal is +1, from one
    /// stream at a time unless ordered.
    Deterministic(DeterministicCounter),
}

/// A semaphore imported into a [`Context`] (`cuImportExternalSemaphore`).
///
/// It holds a clone of its context (no lifetime: store it where you like).
/// Signals take `&mut` (they advance the tracked
/// value), waits take `&`. A semaphore can only be used on streams of its
/// own context: anything else is refused before the call with
/// [`Error::WrongContext`].
///
/// **Timeline values never go backwards through this API.** A signal must
/// exceed the tracked floor, and a signal on a stream other than the one
/// that signalled last is refused (`StreamNotOrdered`) unless you stated,
/// with [`order_streams`](Self::order_streams), that the new stream's work
/// runs after the old one's: signals on two unordered streams can complete
/// in either order (5 queued behind a wait on one stream, 6 on another: the
/// counter can end at 5). What this crate cannot see: signals made by the
/// exporter, by another process, or through another import of the same
/// semaphore (each import has its own tracker). Report those with
/// [`observe_timeline`](Self::observe_timeline), and keep one import per
/// semaphore and context.
///
/// Dropping it (or [`destroy`](Self::destroy)) first waits for the context's
/// queued work if the semaphore was ever used, since a semaphore must have no
/// signal or wait outstanding when destroyed; a wait that never completes
/// therefore blocks the drop.
///
/// ```
/// use tegra_interop_core::{SignalParams, ValidationError, WaitParams};
/// use tegra_interop_driver::{Context, Error, ExternalSemaphore, Stream};
///
/// let sim = tegra_interop_sim::Sim::new()?;
/// let (fd, exported) = tegra_interop_sim::export::timeline_semaphore(0)?;
/// let ctx = Context::primary(sim.backend(), 0)?;
/// let stream = Stream::new(&ctx)?;
/// let mut timeline = ExternalSemaphore::timeline_fd(&ctx, fd)?;
///
/// exported.signal(1)?; // the producer's side (a host signal must move it forward)
/// stream.wait(&timeline, WaitParams::timeline(1))?;
/// assert_eq!(stream.signal(&mut timeline, SignalParams::timeline(2))?, Some(2));
/// // Going backwards is refused before the driver sees it.
/// assert!(matches!(
///     stream.signal(&mut timeline, SignalParams::timeline(1)),
///     Err(Error::Validation(ValidationError::FenceNotIncreasing { last: 2, .. }))
/// ));
/// stream.synchronize()?;
/// assert_eq!(exported.value(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ExternalSemaphore {
    res: Owned<SemaphoreRes>,
    tracking: Tracking,
}

/// The C semaphore and how it is destroyed.
pub(crate) struct SemaphoreRes {
    ctx: Context,
    /// `ctx`'s raw handle, kept beside `raw` so that a batch's per-entry
    /// context check reads the semaphore only (no load through the
    /// context's `Arc`; measured on the host bench's hot path).
    ctx_raw: CUcontext,
    raw: CUexternalSemaphore,
    kind: SemaphoreHandleKind,
    /// Set once a signal or wait was queued: destroying then waits for the
    /// context's work first.
    used: AtomicBool,
}

// SAFETY: a `SemaphoreRes` holds C handles (plain pointers to the driver's
// objects) and a context clone; the CUDA driver API lets any thread use a
// handle (calls that act in a context bind it first), so it may move
// between threads.
#[allow(unsafe_code)]
unsafe impl Send for SemaphoreRes {}
// SAFETY: `&SemaphoreRes` only enqueues waits (thread-safe in the driver)
// and sets the atomic `used` flag.
#[allow(unsafe_code)]
unsafe impl Sync for SemaphoreRes {}

impl Release for SemaphoreRes {
    fn release(&mut self) -> Result<(), Error> {
        // A semaphore must have no signal/wait outstanding when destroyed:
        // it is only ever used on streams of its own context, so waiting for
        // the context covers them all.
        let synced = if *self.used.get_mut() {
            self.ctx.synchronize()
        } else {
            let _ = self.ctx.bind();
            Ok(())
        };
        // Imported by us, destroyed once (`Owned`); its queued work is
        // finished (synchronised above).
        let destroyed = call::cuDestroyExternalSemaphore(self.ctx.api(), self.raw);
        destroyed.and(synced)
    }

    fn backend(&self) -> &Backend {
        self.ctx.backend()
    }
}

impl std::fmt::Debug for ExternalSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalSemaphore")
            .field("context", &self.res.ctx.id())
            .field("kind", &self.res.kind)
            .field("tracking", &self.tracking)
            .finish_non_exhaustive()
    }
}

impl ExternalSemaphore {
    /// Imports an fd semaphore described by `import` (an `OPAQUE_FD` binary
    /// or `TIMELINE_SEMAPHORE_FD` import built with the same fd number as
    /// `fd`). A timeline semaphore is tracked from value 0; use
    /// [`with_timeline_initial`](Self::with_timeline_initial) if the
    /// exporter created it at another value.
    ///
    /// The driver is handed a duplicate of `fd`, never `fd` itself. On
    /// success `fd` is consumed (closed; the driver owns the duplicate); on
    /// failure `fd` comes back inside the [`ImportError`], open and the same
    /// open file description (see [`crate::error::fd_audit`]).
    pub fn import_fd(
        ctx: &Context,
        fd: OwnedFd,
        import: SemaphoreImport,
    ) -> Result<ExternalSemaphore, ImportError> {
        crate::import::import_fd(
            fd,
            |_| Ok(import),
            |described| Self::import_desc(ctx, described),
        )
    }

    /// Imports a binary semaphore exported as an opaque fd (Vulkan
    /// `OPAQUE_FD`). See [`import_fd`](Self::import_fd) for fd ownership.
    pub fn binary_fd(ctx: &Context, fd: OwnedFd) -> Result<ExternalSemaphore, ImportError> {
        crate::import::import_fd(fd, SemaphoreImport::opaque_fd, |described| {
            Self::import_desc(ctx, described)
        })
    }

    /// Imports a timeline semaphore exported as an fd, tracked from 0. See
    /// [`import_fd`](Self::import_fd) for fd ownership.
    pub fn timeline_fd(ctx: &Context, fd: OwnedFd) -> Result<ExternalSemaphore, ImportError> {
        crate::import::import_fd(fd, SemaphoreImport::timeline_fd, |described| {
            Self::import_desc(ctx, described)
        })
    }

    /// Imports a semaphore that is not a file descriptor: an `NvSciSyncObj`
    /// (or, on Windows, a Win32/D3D handle). Win32/D3D kinds are refused on
    /// other systems before the call; fd kinds are refused (use
    /// [`import_fd`](Self::import_fd)).
    ///
    /// # Safety
    /// The handle inside `import` must be valid for its kind for the duration
    /// of the call (for NvSciSync: a live `NvSciSyncObj` whose attribute
    /// list carries the CUDA signal and/or wait attributes).
    #[allow(unsafe_code)] // the caller vouches for the raw handle
    pub unsafe fn import_handle(
        ctx: &Context,
        import: &SemaphoreImport,
    ) -> Result<ExternalSemaphore, Error> {
        crate::import::refuse_fd_kind(import)?;
        Self::import_desc(ctx, import)
    }

    /// The import itself; for a non-fd kind the crate vouches for the handle
    /// (see `ffi`'s invariants).
    pub(crate) fn import_desc(ctx: &Context, import: &SemaphoreImport) -> Result<Self, Error> {
        let kind = import.kind();
        check_platform(kind.name(), kind.is_win32())?;
        let mut raw: CUexternalSemaphore = ptr::null_mut();
        // SAFETY: `raw` is a local the driver writes one handle to; `import.raw()` is a descriptor
        // the core validated (for fd kinds the fd is open, we hold it; for others the caller
        // vouched for the handle: `import_handle` is `unsafe`).
        unsafe { call::cuImportExternalSemaphore(Bind(ctx), &mut raw, import.raw()) }?;
        let tracking = if kind.has_fence_value() {
            Tracking::Timeline(TimelineTracker::new(0))
        } else {
            Tracking::None
        };
        Ok(ExternalSemaphore {
            res: Owned::new(SemaphoreRes {
                ctx: ctx.clone(),
                ctx_raw: ctx.as_raw(),
                raw,
                kind,
                used: AtomicBool::new(false),
            }),
            tracking,
        })
    }

    /// Sets the value a timeline semaphore had when it was exported (Vulkan's
    /// initial value), so the first signal must exceed it.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a semaphore that is not a timeline, or one
    /// that was already signalled through this handle.
    pub fn with_timeline_initial(mut self, initial: u64) -> Result<Self, Error> {
        match &self.tracking {
            Tracking::Timeline(t)
                if t.last() == 0 && t.pending().is_none() && t.last_stream().is_none() =>
            {
                self.tracking = Tracking::Timeline(TimelineTracker::new(initial));
                Ok(self)
            }
            Tracking::Timeline(_) => Err(Error::Unsupported {
                operation: "ExternalSemaphore::with_timeline_initial",
                reason: "the timeline was already signalled through this handle",
            }),
            _ => Err(Error::Unsupported {
                operation: "ExternalSemaphore::with_timeline_initial",
                reason: "the semaphore is not a timeline semaphore",
            }),
        }
    }

    /// Tracks the signals of an NvSciSync semaphore imported from a raw
    /// handle with deterministic fences: every signal returns the fence value
    /// it will produce, and signals from a second stream are refused unless
    /// ordered (see [`DeterministicCounter`]). The counter's initial value is
    /// yours to learn ([`DeterministicCounter::learn`] from a fence read
    /// back); [`crate::nvsci::SyncObj`]'s imports do all of this themselves.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a semaphore that is not NvSciSync.
    pub fn with_deterministic_counter(
        mut self,
        counter: DeterministicCounter,
    ) -> Result<Self, Error> {
        if !self.res.kind.is_nvscisync() {
            return Err(Error::Unsupported {
                operation: "ExternalSemaphore::with_deterministic_counter",
                reason: "deterministic fences exist only for NvSciSync semaphores",
            });
        }
        self.tracking = Tracking::Deterministic(counter);
        Ok(self)
    }

    /// The context it was imported in.
    pub fn context(&self) -> &Context {
        &self.res.ctx
    }

    /// The raw handle of the semaphore's context.
    #[inline]
    pub(crate) fn context_raw(&self) -> CUcontext {
        self.res.ctx_raw
    }

    /// The handle kind.
    pub fn kind(&self) -> SemaphoreHandleKind {
        self.res.kind
    }

    /// The raw handle (still owned by this value).
    pub fn as_raw(&self) -> CUexternalSemaphore {
        self.res.raw
    }

    /// Notes that a wait was queued (written once; later waits only read
    /// the flag, so no shared cache line is written per call).
    #[inline]
    pub(crate) fn mark_used(&self) {
        if !self.res.used.load(Ordering::Relaxed) {
            self.res.used.store(true, Ordering::Release);
        }
    }

    /// Notes that a signal was queued (held exclusively: no atomic
    /// operation needed).
    #[inline]
    pub(crate) fn mark_used_exclusive(&mut self) {
        *self.res.get_mut().used.get_mut() = true;
    }

    /// The deterministic counter, for learning its initial value.
    pub(crate) fn deterministic_mut(&mut self) -> Option<&mut DeterministicCounter> {
        match &mut self.tracking {
            Tracking::Deterministic(c) => Some(c),
            _ => None,
        }
    }

    /// What is tracked for this semaphore.
    pub fn tracking(&self) -> &Tracking {
        &self.tracking
    }

    /// For a timeline: the floor, i.e. the last value signalled through this
    /// handle or reported with [`observe_timeline`](Self::observe_timeline).
    pub fn last_timeline_value(&self) -> Option<u64> {
        match &self.tracking {
            Tracking::Timeline(t) => Some(t.last()),
            _ => None,
        }
    }

    /// For a timeline: reports a value signalled outside this handle (by the
    /// exporter, through another import of the same semaphore, by another
    /// process). The tracked floor rises to `value` if it is higher, so a
    /// later signal through this handle must exceed it. Returns the floor.
    ///
    /// The crate cannot see such signals by itself: a second import of the
    /// same semaphore has its own tracker, and the exporter's signals never
    /// pass through this crate. Report a value once it is reached (for
    /// example after a wait for it on the signalling stream), not merely
    /// submitted.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a semaphore that is not a timeline.
    pub fn observe_timeline(&mut self, value: u64) -> Result<u64, Error> {
        match &mut self.tracking {
            Tracking::Timeline(t) => Ok(t.observe(value)?),
            _ => Err(Error::Unsupported {
                operation: "ExternalSemaphore::observe_timeline",
                reason: "the semaphore is not a timeline semaphore",
            }),
        }
    }

    /// States that every signal `later` enqueues runs after all signals
    /// `earlier` enqueued before it (for example `later` waits on an event
    /// recorded on `earlier` after its signals). Afterwards this semaphore may
    /// be signalled on `later` after a signal on `earlier`; without it such a
    /// signal is refused with `StreamNotOrdered`, for timelines (a smaller
    /// value could complete last and move the counter back) and for
    /// deterministic NvSciSync fences (waiters would unblock at the wrong
    /// signal). The statement is yours; the crate cannot check it.
    ///
    /// # Errors
    /// [`ValidationError::CapacityExceeded`] past
    /// [`MAX_STREAM_ORDERINGS`](tegra_interop_core::fence::MAX_STREAM_ORDERINGS)
    /// orderings; [`Error::Unsupported`] for a semaphore without tracking
    /// (binary, NvSciSync without a counter), where order is not checked.
    pub fn order_streams(&mut self, later: &Stream, earlier: &Stream) -> Result<(), Error> {
        let (later, earlier) = (later.stream_id(), earlier.stream_id());
        match &mut self.tracking {
            Tracking::Timeline(t) => Ok(t.order_after(later, earlier)?),
            Tracking::Deterministic(c) => Ok(c.order_after(later, earlier)?),
            Tracking::None => Err(Error::Unsupported {
                operation: "ExternalSemaphore::order_streams",
                reason: "the semaphore's signals are not tracked (binary, or NvSciSync without a counter)",
            }),
        }
    }

    /// Turns the multi-stream check off for this semaphore's tracking
    /// (the replacement of editing the tracker directly: the tracker itself
    /// cannot be replaced).
    ///
    /// # Safety
    /// Sound only if every stream that signals this semaphore is ordered
    /// after the stream that signalled before it. Otherwise a timeline can
    /// move backwards on the device, and a deterministic fence's waiter can
    /// unblock on another signal than the one it was built for.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a semaphore without tracking.
    #[allow(unsafe_code)] // the caller states the streams' order
    pub unsafe fn assume_streams_ordered(&mut self) -> Result<(), Error> {
        match &mut self.tracking {
            // SAFETY: the caller's contract is the tracker's.
            Tracking::Timeline(t) => unsafe { t.assume_streams_ordered() },
            // SAFETY: the caller's contract is the counter's.
            Tracking::Deterministic(c) => unsafe { c.assume_streams_ordered() },
            Tracking::None => {
                return Err(Error::Unsupported {
                    operation: "ExternalSemaphore::assume_streams_ordered",
                    reason: "the semaphore's signals are not tracked (binary, or NvSciSync without a counter)",
                })
            }
        }
        Ok(())
    }

    /// Checks what this signal will produce against the tracking state (a
    /// timeline value above the floor, a deterministic fence, both from a
    /// stream allowed to signal next), writing nothing; untracked
    /// semaphores pass. The batch holds the semaphore exclusively (`&mut`)
    /// until [`record_signal`](Self::record_signal) after the call.
    #[inline]
    pub(crate) fn check_signal(
        &self,
        params: &SignalParams,
        stream: StreamId,
    ) -> Result<(), ValidationError> {
        match (&self.tracking, params.payload()) {
            (Tracking::Timeline(t), Payload::Fence(value)) => t.check_on(stream, value),
            (Tracking::Deterministic(c), _) => c.check_next(stream).map(drop),
            _ => Ok(()),
        }
    }

    /// The timeline tracker, for [`crate::stream::TimelineSignals`] (which
    /// admits only tracked timelines).
    #[inline]
    pub(crate) fn timeline_mut(&mut self) -> Option<&mut TimelineTracker> {
        match &mut self.tracking {
            Tracking::Timeline(t) => Some(t),
            _ => None,
        }
    }

    /// The enqueue of a signal checked with
    /// [`check_signal`](Self::check_signal) succeeded: the tracked value
    /// advances. Returns it (`None` for untracked semaphores).
    #[inline]
    pub(crate) fn record_signal(&mut self, params: &SignalParams, stream: StreamId) -> Option<u64> {
        match (&mut self.tracking, params.payload()) {
            (Tracking::Timeline(t), Payload::Fence(value)) => Some(t.record_on(stream, value)),
            (Tracking::Deterministic(c), _) => Some(c.record_next(stream)),
            _ => None,
        }
    }

    /// Destroys the semaphore now (after waiting for its queued work) and
    /// reports the driver's answer (`DEINITIALIZED` counts as success).
    pub fn destroy(self) -> Result<(), Error> {
        self.res.destroy()
    }
}

pub(crate) fn refuse_raw_nvscisync(operation: &'static str, payload: Payload) -> Result<(), Error> {
    if matches!(payload, Payload::NvSciSync(_)) {
        return Err(Error::Unsupported {
            operation,
            reason: "NvSciSync parameters carry a fence pointer: build them with the \
                     `nvscisync` constructors, which borrow the fence",
        });
    }
    Ok(())
}

/// One signal of a batch: a semaphore and what to signal.
///
/// NvSciSync signals borrow the `NvSciSyncFence` the driver writes, so it
/// cannot dangle.
#[derive(Debug)]
pub struct SemaphoreSignal<'a> {
    pub(crate) semaphore: &'a mut ExternalSemaphore,
    pub(crate) params: SignalParams,
    /// The value tracked after the batch succeeded.
    pub(crate) tracked: Option<u64>,
    _fence: PhantomData<&'a mut NvSciSyncFence>,
}

impl<'a> SemaphoreSignal<'a> {
    fn make(semaphore: &'a mut ExternalSemaphore, params: SignalParams) -> Self {
        SemaphoreSignal {
            semaphore,
            params,
            tracked: None,
            _fence: PhantomData,
        }
    }

    /// A binary, timeline or fence signal. NvSciSync parameters are refused
    /// here (use [`nvscisync`](Self::nvscisync)); the parameters are checked
    /// against the semaphore kind when the batch is submitted.
    pub fn new(semaphore: &'a mut ExternalSemaphore, params: SignalParams) -> Result<Self, Error> {
        refuse_raw_nvscisync("SemaphoreSignal::new", params.payload())?;
        Ok(SemaphoreSignal::make(semaphore, params))
    }

    /// Signal a binary semaphore.
    pub fn binary(semaphore: &'a mut ExternalSemaphore) -> Self {
        SemaphoreSignal::make(semaphore, SignalParams::binary())
    }

    /// Set a timeline semaphore to `value` (must exceed the last one).
    pub fn timeline(semaphore: &'a mut ExternalSemaphore, value: u64) -> Self {
        SemaphoreSignal::make(semaphore, SignalParams::timeline(value))
    }

    /// Signal an NvSciSync semaphore; the driver writes the resulting fence
    /// into `fence` when the signal is enqueued.
    pub fn nvscisync(semaphore: &'a mut ExternalSemaphore, fence: &'a mut NvSciSyncFence) -> Self {
        SemaphoreSignal::make(semaphore, SignalParams::nvscisync(fence))
    }

    /// Like [`nvscisync`](Self::nvscisync), without the NvSciBuf memory
    /// synchronisation (`SIGNAL_SKIP_NVSCIBUF_MEMSYNC`).
    ///
    /// # Safety
    /// The same contract as
    /// [`SignalParams::skip_nvscibuf_memsync`]: nothing ordered before this
    /// signal may write NvSciBuf memory that a waiter reads without the
    /// driver's flush. Otherwise waiters read stale data.
    #[allow(unsafe_code)] // the caller takes on the memsync contract
    pub unsafe fn nvscisync_skip_memsync(
        semaphore: &'a mut ExternalSemaphore,
        fence: &'a mut NvSciSyncFence,
    ) -> Self {
        // SAFETY: the caller accepted the memsync contract above, which is
        // the contract of the core's unsafe opt-in.
        let params = unsafe { SignalParams::nvscisync(fence).skip_nvscibuf_memsync() };
        SemaphoreSignal::make(semaphore, params)
    }

    /// The parameters.
    pub fn params(&self) -> &SignalParams {
        &self.params
    }

    /// After a successful [`Stream::signal_batch`]: the value now tracked
    /// for this semaphore (the timeline value, or the deterministic
    /// NvSciSync fence value); `None` for untracked kinds and before the
    /// batch ran.
    pub fn tracked(&self) -> Option<u64> {
        self.tracked
    }
}

/// One wait of a batch: a semaphore and what to wait for.
#[derive(Debug, Clone, Copy)]
pub struct SemaphoreWait<'a> {
    pub(crate) semaphore: &'a ExternalSemaphore,
    pub(crate) params: WaitParams,
    _fence: PhantomData<&'a NvSciSyncFence>,
}

impl<'a> SemaphoreWait<'a> {
    /// A binary, timeline or fence wait. NvSciSync parameters are refused
    /// here (use [`nvscisync`](Self::nvscisync)).
    pub fn new(semaphore: &'a ExternalSemaphore, params: WaitParams) -> Result<Self, Error> {
        refuse_raw_nvscisync("SemaphoreWait::new", params.payload())?;
        Ok(SemaphoreWait {
            semaphore,
            params,
            _fence: PhantomData,
        })
    }

    /// Wait on a binary semaphore.
    pub fn binary(semaphore: &'a ExternalSemaphore) -> Self {
        SemaphoreWait {
            semaphore,
            params: WaitParams::binary(),
            _fence: PhantomData,
        }
    }

    /// Wait until a timeline semaphore reaches `value`.
    pub fn timeline(semaphore: &'a ExternalSemaphore, value: u64) -> Self {
        SemaphoreWait {
            semaphore,
            params: WaitParams::timeline(value),
            _fence: PhantomData,
        }
    }

    /// Wait on an NvSciSync fence (read when the wait is enqueued). The safe
    /// way is [`NvSciSemaphore::wait`](crate::nvsci::NvSciSemaphore::wait)
    /// with the driver's [`Fence`](crate::nvsci::Fence).
    ///
    /// # Safety
    /// `fence` is a raw C fence whose words the NvSci library interprets
    /// (they refer to its sync objects): it must be cleared (all zero) or a
    /// fence NvSciSync produced (a signal, `NvSciSyncObjGenerateFence`, a
    /// dup or an import) in this process for the object `semaphore` was
    /// imported from, still holding its reference, and not modified since.
    #[allow(unsafe_code)] // the caller vouches for the raw fence
    pub unsafe fn nvscisync(semaphore: &'a ExternalSemaphore, fence: &'a NvSciSyncFence) -> Self {
        SemaphoreWait {
            semaphore,
            params: WaitParams::nvscisync(fence),
            _fence: PhantomData,
        }
    }

    /// Like [`nvscisync`](Self::nvscisync), without the NvSciBuf memory
    /// synchronisation (`WAIT_SKIP_NVSCIBUF_MEMSYNC`).
    ///
    /// # Safety
    /// The fence contract of [`nvscisync`](Self::nvscisync), and the same
    /// contract as [`WaitParams::skip_nvscibuf_memsync`]: work after
    /// this wait must not read NvSciBuf memory written by the signaller
    /// through a path that needs the driver's invalidation.
    #[allow(unsafe_code)] // the caller takes on the memsync contract
    pub unsafe fn nvscisync_skip_memsync(
        semaphore: &'a ExternalSemaphore,
        fence: &'a NvSciSyncFence,
    ) -> Self {
        // SAFETY: the caller accepted the memsync contract above, which is
        // the contract of the core's unsafe opt-in.
        let params = unsafe { WaitParams::nvscisync(fence).skip_nvscibuf_memsync() };
        SemaphoreWait {
            semaphore,
            params,
            _fence: PhantomData,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &WaitParams {
        &self.params
    }
}
