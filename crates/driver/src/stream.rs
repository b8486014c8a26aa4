//! [`Stream`]: where work is queued, and everything queued on it: semaphore
//! signals and waits (single and batched) and host functions.
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(feature = "cudarc")]
use std::sync::Arc;

use tegra_interop_core::{
    CuResult, PushError, SignalBatch, SignalParams, StreamId, ValidationError, WaitParams,
};
use tegra_interop_sys::cuda::{
    CUcontext, CUexternalSemaphore, CUstream, CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS,
    CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
};

use crate::ffi::{call, code, Bind, Current, Lowered, TryBind};
use crate::nvsci::{CanSignal, CanWait, Fence, NvSciSemaphore};
use crate::owner::{Owned, Release};
use crate::semaphore::refuse_raw_nvscisync;
use crate::{Backend, Context, Error, ExternalSemaphore, SemaphoreSignal, SemaphoreWait, Tracking};

/// `CU_STREAM_NON_BLOCKING`: the stream does not synchronise with the legacy
/// default stream.
const CU_STREAM_NON_BLOCKING: u32 = 1;

static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

fn next_stream_id() -> StreamId {
    StreamId(NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed))
}

enum StreamKind {
    Owned,
    Default,
    #[cfg(feature = "cudarc")]
    Cudarc(Arc<cudarc::driver::CudaStream>),
}

/// A CUDA stream of a [`Context`]: signals, waits and host functions are
/// queued on it.
///
/// It holds a clone of its context (no lifetime), so the context lives at
/// least as long. Dropping it destroys a stream it created
/// (`cuStreamDestroy`; queued work still completes).
pub struct Stream {
    id: StreamId,
    res: Owned<StreamRes>,
}

/// The C stream and how it is released.
pub(crate) struct StreamRes {
    ctx: Context,
    raw: CUstream,
    kind: StreamKind,
}

// SAFETY: a `StreamRes` holds C handles (plain pointers to the driver's
// objects) and a context clone; the CUDA driver API lets any thread use a
// handle (calls that act in a context bind it first), so it may move
// between threads.
#[allow(unsafe_code)]
unsafe impl Send for StreamRes {}
// SAFETY: the driver serialises concurrent submissions to one stream;
// `&StreamRes` allows nothing else.
#[allow(unsafe_code)]
unsafe impl Sync for StreamRes {}

impl Release for StreamRes {
    fn release(&mut self) -> Result<(), Error> {
        match self.kind {
            StreamKind::Owned => {
                // Created by us, destroyed once (`Owned`).
                call::cuStreamDestroy(TryBind(&self.ctx), self.raw)
            }
            StreamKind::Default => Ok(()),
            // cudarc's `Arc` is dropped with this value.
            #[cfg(feature = "cudarc")]
            StreamKind::Cudarc(_) => Ok(()),
        }
    }

    fn backend(&self) -> &Backend {
        self.ctx.backend()
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("context", &self.res.ctx.id())
            .field("id", &self.id)
            .field("raw", &self.res.raw)
            .finish_non_exhaustive()
    }
}

impl Stream {
    fn wrap(ctx: &Context, raw: CUstream, kind: StreamKind) -> Stream {
        Stream {
            id: next_stream_id(),
            res: Owned::new(StreamRes {
                ctx: ctx.clone(),
                raw,
                kind,
            }),
        }
    }

    /// A new non-blocking stream. For a cudarc context, cudarc makes it
    /// (`CudaContext::new_stream`); otherwise `cuStreamCreate`.
    pub fn new(ctx: &Context) -> Result<Stream, Error> {
        #[cfg(feature = "cudarc")]
        if let Some(c) = ctx.cudarc() {
            let stream = c.new_stream().map_err(|e| Error::Driver {
                call: "cudarc::driver::CudaContext::new_stream",
                code: CuResult(e.0 as u32),
            })?;
            return Stream::from_cudarc(ctx, stream);
        }
        let mut raw: CUstream = ptr::null_mut();
        // SAFETY: `raw` is a local the driver writes one stream handle to.
        unsafe { call::cuStreamCreate(Bind(ctx), &mut raw, CU_STREAM_NON_BLOCKING) }?;
        Ok(Stream::wrap(ctx, raw, StreamKind::Owned))
    }

    /// The context's legacy default stream (the NULL stream). Never destroyed.
    pub fn default_stream(ctx: &Context) -> Stream {
        Stream::wrap(ctx, ptr::null_mut(), StreamKind::Default)
    }

    /// Wraps a cudarc stream of `ctx`'s context (cudarc keeps owning it;
    /// this holds an `Arc` to it).
    ///
    /// # Errors
    /// [`Error::ForeignStream`] if the stream belongs to another CUDA context.
    #[cfg(feature = "cudarc")]
    pub fn from_cudarc(
        ctx: &Context,
        stream: Arc<cudarc::driver::CudaStream>,
    ) -> Result<Stream, Error> {
        let stream_ctx = stream.context().cu_ctx() as CUcontext;
        if stream_ctx != ctx.as_raw() {
            return Err(Error::ForeignStream { ctx: ctx.id() });
        }
        let raw = stream.cu_stream() as CUstream;
        Ok(Stream::wrap(ctx, raw, StreamKind::Cudarc(stream)))
    }

    /// The cudarc stream this wraps, if it came from cudarc.
    #[cfg(feature = "cudarc")]
    pub fn cudarc(&self) -> Option<&Arc<cudarc::driver::CudaStream>> {
        match &self.res.kind {
            StreamKind::Cudarc(stream) => Some(stream),
            _ => None,
        }
    }

    /// The context this stream belongs to.
    pub fn context(&self) -> &Context {
        &self.res.ctx
    }

    /// A process-unique id of this stream wrapper, as the core's fence
    /// counters know it (two wrappers of one driver stream get two ids).
    pub fn stream_id(&self) -> StreamId {
        self.id
    }

    /// The raw `CUstream` (still owned by this value).
    pub fn as_raw(&self) -> CUstream {
        self.res.raw
    }

    /// Blocks until all queued work is done (`cuStreamSynchronize`).
    pub fn synchronize(&self) -> Result<(), Error> {
        call::cuStreamSynchronize(Bind(self.context()), self.res.raw)
    }

    /// `true` when all queued work is done (`cuStreamQuery`; `NOT_READY`
    /// means `false`).
    pub fn is_idle(&self) -> Result<bool, Error> {
        match CuResult::from(code::cuStreamQuery(Bind(self.context()), self.res.raw)?) {
            CuResult::SUCCESS => Ok(true),
            CuResult::NOT_READY => Ok(false),
            code => Err(Error::Driver {
                call: "cuStreamQuery",
                code,
            }),
        }
    }

    /// Destroys the stream now (queued work still completes) and reports the
    /// driver's answer; `DEINITIALIZED` counts as success.
    pub fn destroy(self) -> Result<(), Error> {
        self.res.destroy()
    }
}

/// The most entries one [`Stream::signal_batch`] or [`Stream::wait_batch`]
/// takes: the two C arrays of the call are built on the stack (no heap
/// allocation per call), sized for this many. A longer batch is refused
/// before anything happens with
/// [`ValidationError::CapacityExceeded`]; split it into several calls
/// (they are ordered on the stream like one call).
///
/// Why refuse instead of splitting it here: a batch is all or nothing for
/// the tracked values (a failed call advances none of them), which one
/// driver call keeps and several calls could not.
pub const MAX_BATCH: usize = 64;

/// Refuses a batch longer than [`MAX_BATCH`] before anything happens.
#[inline]
fn check_len(len: usize) -> Result<(), Error> {
    if len > MAX_BATCH {
        return Err(over_capacity());
    }
    Ok(())
}

/// An entry pushed on one of the core's batches; a refusal becomes the
/// driver's error (the entry itself is dropped: it only borrows).
#[inline]
fn pushed<T>(result: Result<usize, PushError<T>>) -> Result<(), Error> {
    match result {
        Ok(_) => Ok(()),
        Err(PushError::Invalid(_, e)) => Err(Error::Validation(e)),
        Err(PushError::Full(_)) => Err(over_capacity()),
    }
}

#[cold]
#[inline(never)]
fn over_capacity() -> Error {
    Error::Validation(ValidationError::CapacityExceeded {
        capacity: MAX_BATCH,
    })
}

impl Stream {
    /// The raw handle of a semaphore taking part in a call of this stream
    /// (whose context is `ctx`, read once per batch): refused when of
    /// another context ([`Error::WrongContext`]) or NULL (as the core's
    /// batches refuse it).
    #[inline]
    pub(crate) fn handle_for(
        &self,
        ctx: CUcontext,
        semaphore: &ExternalSemaphore,
    ) -> Result<CUexternalSemaphore, Error> {
        if semaphore.context_raw() != ctx {
            return Err(self.wrong_context(semaphore));
        }
        if semaphore.as_raw().is_null() {
            return Err(Error::Validation(ValidationError::NullHandle));
        }
        Ok(semaphore.as_raw())
    }

    #[cold]
    #[inline(never)]
    pub(crate) fn wrong_context(&self, semaphore: &ExternalSemaphore) -> Error {
        Error::WrongContext {
            semaphore_ctx: semaphore.context().id(),
            stream_ctx: self.context().id(),
        }
    }

    /// Queues a binary, timeline or fence signal. Returns the value now
    /// tracked for a timeline (`None` for other kinds).
    ///
    /// Refused before the call: a semaphore of another context
    /// ([`Error::WrongContext`]), parameters that do not fit the kind, a
    /// timeline value that does not exceed the last one. A failed enqueue
    /// does not advance the tracked value.
    #[inline]
    pub fn signal(
        &self,
        semaphore: &mut ExternalSemaphore,
        params: SignalParams,
    ) -> Result<Option<u64>, Error> {
        let mut one = [SemaphoreSignal::new(semaphore, params)?];
        self.signal_batch(&mut one)?;
        let [signal] = one;
        Ok(signal.tracked())
    }

    /// Queues a signal of an NvSciSync semaphore and returns the fence the
    /// driver wrote for it (see [`NvSciSemaphore::signal`], which learns the
    /// deterministic counter kept inside the semaphore).
    #[inline]
    pub fn signal_nvscisync<R: CanSignal>(
        &self,
        semaphore: &mut NvSciSemaphore<R>,
    ) -> Result<Fence, Error> {
        semaphore.signal(self)
    }

    /// Queues a wait (binary, timeline or fence).
    #[inline]
    pub fn wait(&self, semaphore: &ExternalSemaphore, params: WaitParams) -> Result<(), Error> {
        self.wait_batch(&[SemaphoreWait::new(semaphore, params)?])
    }

    /// Queues a wait for an NvSciSync fence (see [`NvSciSemaphore::wait`]).
    #[inline]
    pub fn wait_nvscisync<R: CanWait>(
        &self,
        semaphore: &NvSciSemaphore<R>,
        fence: &Fence,
    ) -> Result<(), Error> {
        semaphore.wait(self, fence)
    }

    /// Queues every signal of `signals` (an array, a `Vec`, any slice of up
    /// to [`MAX_BATCH`] entries) with one driver call
    /// (`cuSignalExternalSemaphoresAsync`). Everything is checked before the
    /// call (contexts, parameters, tracked values); if anything is refused
    /// or the call fails, no tracked value advances. Afterwards each entry's
    /// [`SemaphoreSignal::tracked`] is the value now tracked for it
    /// (timeline value or deterministic fence value).
    ///
    /// No heap allocation: the C arrays are built on the stack.
    ///
    /// ```
    /// use tegra_interop_driver::{Context, ExternalSemaphore, SemaphoreSignal, Stream};
    /// use tegra_interop_sim::{export, Sim};
    ///
    /// let sim = Sim::new()?;
    /// let ctx = Context::new(sim.backend(), 0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let mut semaphores = Vec::new();
    /// for _ in 0..3 {
    ///     let (fd, _exported) = export::timeline_semaphore(0)?;
    ///     semaphores.push(ExternalSemaphore::timeline_fd(&ctx, fd)?);
    /// }
    /// let mut batch: Vec<_> =
    ///     semaphores.iter_mut().map(|s| SemaphoreSignal::timeline(s, 5)).collect();
    /// stream.signal_batch(&mut batch)?;
    /// assert!(batch.iter().all(|s| s.tracked() == Some(5)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn signal_batch(&self, signals: &mut [SemaphoreSignal<'_>]) -> Result<(), Error> {
        self.enqueue_signals(signals.iter().map(|s| (&*s.semaphore, &s.params)))?;
        for signal in signals.iter_mut() {
            signal.tracked = self.record(signal.semaphore, &signal.params);
        }
        Ok(())
    }

    /// Queues one signal per semaphore of `semaphores` (a slice of a `Vec`
    /// of semaphores, for example), with the parameters of the same index
    /// in `params`, as one [`signal_batch`](Self::signal_batch): the same
    /// checks, one driver call, no heap allocation. Afterwards each
    /// semaphore's tracked value is its
    /// [`last_timeline_value`](ExternalSemaphore::last_timeline_value).
    ///
    /// # Errors
    /// As [`signal_batch`](Self::signal_batch); [`Error::Unsupported`] when
    /// the two slices differ in length or a parameter block is NvSciSync
    /// (its fence must be borrowed: use [`SemaphoreSignal::nvscisync`]).
    ///
    /// ```
    /// use tegra_interop_core::SignalParams;
    /// use tegra_interop_driver::{Context, ExternalSemaphore, Stream};
    /// use tegra_interop_sim::{export, Sim};
    ///
    /// let sim = Sim::new()?;
    /// let ctx = Context::new(sim.backend(), 0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let mut semaphores = Vec::new();
    /// for _ in 0..3 {
    ///     let (fd, _exported) = export::timeline_semaphore(0)?;
    ///     semaphores.push(ExternalSemaphore::timeline_fd(&ctx, fd)?);
    /// }
    /// let params = [SignalParams::timeline(1); 3];
    /// stream.signal_each(&mut semaphores, &params)?;
    /// assert!(semaphores.iter().all(|s| s.last_timeline_value() == Some(1)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn signal_each(
        &self,
        semaphores: &mut [ExternalSemaphore],
        params: &[SignalParams],
    ) -> Result<(), Error> {
        pairwise("Stream::signal_each", semaphores.len(), params.len())?;
        for p in params {
            refuse_raw_nvscisync("Stream::signal_each", p.payload())?;
        }
        self.enqueue_signals(semaphores.iter().zip(params))?;
        for (semaphore, params) in semaphores.iter_mut().zip(params) {
            self.record(semaphore, params);
        }
        Ok(())
    }

    /// The checks and the call of a batch of signals. One read-only pass:
    /// per entry the context, then the checks of the core's
    /// `SignalBatch::push` (NULL handle, `SignalParams::check_for` against
    /// the kind), the parameters written in place (what the core's
    /// `lower_for` builds), then the tracking check (timeline value above
    /// the floor, stream order, deterministic count). Nothing is written to
    /// any semaphore before the call, so a refusal or a failed call leaves
    /// every tracked value as it was; the callers hold each semaphore
    /// exclusively (`&mut`) until they [`record`](Self::record) it.
    #[inline]
    fn enqueue_signals<'e>(
        &self,
        entries: impl ExactSizeIterator<Item = (&'e ExternalSemaphore, &'e SignalParams)>,
    ) -> Result<(), Error> {
        check_len(entries.len())?;
        let mut arrays = Lowered::<CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS, MAX_BATCH>::new();
        let ctx = self.context().as_raw();
        for (semaphore, params) in entries {
            let handle = self.handle_for(ctx, semaphore)?;
            let kind = semaphore.kind();
            arrays.push(handle, |raw| params.lower_into(kind, raw))?;
            semaphore.check_signal(params, self.id)?;
        }
        // Every handle is a live semaphore of this stream's context
        // (borrowed for the call); NvSciSync fence pointers come from
        // borrows that outlive the call.
        let (handles, params, count) = arrays.as_call();
        // SAFETY: `as_call` hands the two arrays with the count of entries written; every handle is
        // a live semaphore of this stream's context (borrowed for the call) and NvSciSync fence
        // pointers come from borrows that outlive the call.
        unsafe {
            call::cuSignalExternalSemaphoresAsync(
                Current(self.context()),
                handles,
                params,
                count,
                self.as_raw(),
            )
        }
    }

    /// After the call succeeded: the semaphore's tracked value advances.
    #[inline]
    fn record(&self, semaphore: &mut ExternalSemaphore, params: &SignalParams) -> Option<u64> {
        // We hold the semaphore exclusively: no atomic operation needed.
        semaphore.mark_used_exclusive();
        semaphore.record_signal(params, self.id)
    }

    /// Queues every wait of `waits` (up to [`MAX_BATCH`]) with one driver
    /// call (`cuWaitExternalSemaphoresAsync`), everything checked before the
    /// call; no heap allocation.
    pub fn wait_batch(&self, waits: &[SemaphoreWait<'_>]) -> Result<(), Error> {
        self.enqueue_waits(waits.iter().map(|w| (w.semaphore, &w.params)))
    }

    /// Queues one wait per semaphore of `semaphores`, with the parameters of
    /// the same index in `params`, as one [`wait_batch`](Self::wait_batch).
    ///
    /// # Errors
    /// As [`wait_batch`](Self::wait_batch); [`Error::Unsupported`] when the
    /// two slices differ in length or a parameter block is NvSciSync (use
    /// [`SemaphoreWait::nvscisync`]).
    pub fn wait_each(
        &self,
        semaphores: &[ExternalSemaphore],
        params: &[WaitParams],
    ) -> Result<(), Error> {
        pairwise("Stream::wait_each", semaphores.len(), params.len())?;
        for p in params {
            refuse_raw_nvscisync("Stream::wait_each", p.payload())?;
        }
        self.enqueue_waits(semaphores.iter().zip(params))
    }

    /// The checks and the call of a batch of waits (the same per-entry
    /// checks as signals, arrays on the stack).
    #[inline]
    fn enqueue_waits<'e>(
        &self,
        entries: impl ExactSizeIterator<Item = (&'e ExternalSemaphore, &'e WaitParams)> + Clone,
    ) -> Result<(), Error> {
        check_len(entries.len())?;
        let mut arrays = Lowered::<CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS, MAX_BATCH>::new();
        let ctx = self.context().as_raw();
        for (semaphore, params) in entries.clone() {
            let handle = self.handle_for(ctx, semaphore)?;
            let kind = semaphore.kind();
            arrays.push(handle, |raw| params.lower_into(kind, raw))?;
        }
        // As for signals: live semaphores of this stream's context,
        // parameter blocks checked by the core, NvSciSync fence pointers
        // from borrows that outlive the call.
        let (handles, params, count) = arrays.as_call();
        // SAFETY: `as_call` hands the two arrays with the count of entries written; live semaphores
        // of this stream's context, parameter blocks checked by the core, NvSciSync fence pointers
        // from borrows that outlive the call.
        unsafe {
            call::cuWaitExternalSemaphoresAsync(
                Current(self.context()),
                handles,
                params,
                count,
                self.as_raw(),
            )
        }?;
        for (semaphore, _) in entries {
            // Written once: later waits only read the flag (no shared cache
            // line written per call).
            semaphore.mark_used();
        }
        Ok(())
    }
}

/// Refuses two slices of different lengths for the pairwise batches.
/// A fixed set of timeline semaphores that one context's streams signal
/// together, again and again: each frame's *free* fences of a ring, say.
///
/// [`Stream::signal_batch`] checks every entry on every call. A set holds
/// each of its semaphores exclusively (`&mut`) for as long as it exists, so
/// what cannot change meanwhile is checked once, in [`TimelineSignals::new`]:
/// each semaphore belongs to the stream's context, has a live handle, is of a
/// kind that takes a fence value and keeps a timeline tracker. Every
/// [`signal`](Self::signal) still checks what can change: the stream's
/// context against the set's, and per semaphore the value against the
/// tracked floor, a pending reservation and the last signalling stream (see
/// [`ExternalSemaphore::order_streams`]); a refusal queues nothing and
/// records nothing. The C arrays (handles, zeroed parameter blocks) are
/// built once; a call writes only the values. No allocation after `new`.
///
/// ```
/// use tegra_interop_driver::{stream::TimelineSignals, Context, ExternalSemaphore, Stream};
/// use tegra_interop_sim::{export, Sim};
///
/// let sim = Sim::new()?;
/// let ctx = Context::new(sim.backend(), 0)?;
/// let stream = Stream::new(&ctx)?;
/// let mut semaphores = Vec::new();
/// for _ in 0..3 {
///     let (fd, _exported) = export::timeline_semaphore(0)?;
///     semaphores.push(ExternalSemaphore::timeline_fd(&ctx, fd)?);
/// }
/// let mut set = TimelineSignals::new(&stream, semaphores.iter_mut())?;
/// for frame in 1..=10u64 {
///     set.signal(&stream, &[frame; 3])?;
/// }
/// // A value that does not exceed the floor is refused, for the whole set.
/// assert!(set.signal(&stream, &[11, 10, 11]).is_err());
/// drop(set);
/// assert!(semaphores.iter().all(|s| s.last_timeline_value() == Some(10)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TimelineSignals<'s> {
    ctx: CUcontext,
    semaphores: Vec<&'s mut ExternalSemaphore>,
    /// The C arrays, lowered once by the core; each signal updates the
    /// fence values in place.
    batch: Box<SignalBatch<MAX_BATCH>>,
}

impl<'s> TimelineSignals<'s> {
    /// Makes the set of `semaphores` (1 to [`MAX_BATCH`]) for streams of
    /// `stream`'s context.
    ///
    /// # Errors
    /// [`Error::WrongContext`] for a semaphore of another context; a
    /// [`ValidationError`] for a NULL handle, for a kind without a fence
    /// value (`FenceValueNotSupported`) or for more than [`MAX_BATCH`]
    /// semaphores; [`Error::Unsupported`] for an empty set or a semaphore
    /// without a timeline tracker.
    pub fn new(
        stream: &Stream,
        semaphores: impl IntoIterator<Item = &'s mut ExternalSemaphore>,
    ) -> Result<TimelineSignals<'s>, Error> {
        let ctx = stream.context().as_raw();
        let semaphores: Vec<&'s mut ExternalSemaphore> = semaphores.into_iter().collect();
        check_len(semaphores.len())?;
        let unsupported = |reason| Error::Unsupported {
            operation: "TimelineSignals::new",
            reason,
        };
        if semaphores.is_empty() {
            return Err(unsupported("a set needs at least one semaphore"));
        }
        let mut batch = Box::new(SignalBatch::<MAX_BATCH>::new());
        for semaphore in &semaphores {
            let handle = stream.handle_for(ctx, semaphore)?;
            pushed(batch.push(handle, semaphore.kind(), SignalParams::timeline(1)))?;
            if semaphore.last_timeline_value().is_none() {
                return Err(unsupported(
                    "every semaphore of a set must keep a timeline tracker",
                ));
            }
        }
        Ok(TimelineSignals {
            ctx,
            semaphores,
            batch,
        })
    }

    /// Semaphores in the set.
    pub fn len(&self) -> usize {
        self.semaphores.len()
    }

    /// Whether the set is empty (never: `new` refuses an empty set).
    pub fn is_empty(&self) -> bool {
        self.semaphores.is_empty()
    }

    /// Queues on `stream`, with one driver call, a signal of each semaphore
    /// of the set to the value of the same index in `values`; afterwards
    /// each semaphore's tracked value is its value.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when `values` has another length than the set;
    /// [`Error::WrongContext`] for a stream of another context; the
    /// tracker's [`ValidationError`] for a value that does not exceed a
    /// semaphore's floor, a pending reservation or a stream not ordered
    /// after the last signalling one; the driver's error. Nothing is queued
    /// or recorded on any error before the call, nothing recorded after a
    /// failed call.
    pub fn signal(&mut self, stream: &Stream, values: &[u64]) -> Result<(), Error> {
        pairwise(
            "TimelineSignals::signal",
            self.semaphores.len(),
            values.len(),
        )?;
        if stream.context().as_raw() != self.ctx {
            return Err(match self.semaphores.first() {
                Some(s) => stream.wrong_context(s),
                None => Error::Unsupported {
                    operation: "TimelineSignals::signal",
                    reason: "the set is empty",
                },
            });
        }
        for (semaphore, &value) in self.semaphores.iter().zip(values) {
            match semaphore.tracking() {
                Tracking::Timeline(t) => t.check_on(stream.id, value)?,
                _ => {
                    return Err(Error::Unsupported {
                        operation: "TimelineSignals::signal",
                        reason: "every semaphore of a set must keep a timeline tracker",
                    })
                }
            }
        }
        self.batch.set_fence_values(values)?;
        // SAFETY: every handle is a live semaphore of this stream's context,
        // held (`&mut`) by the set; the parameter blocks are the core's
        // validated lowering, with this call's fence values; both arrays hold
        // `count()` entries and live for the call.
        unsafe {
            call::cuSignalExternalSemaphoresAsync(
                Current(stream.context()),
                self.batch.handles().as_ptr(),
                self.batch.params().as_ptr(),
                self.batch.count(),
                stream.as_raw(),
            )
        }?;
        for (semaphore, &value) in self.semaphores.iter_mut().zip(values) {
            semaphore.mark_used_exclusive();
            if let Some(t) = semaphore.timeline_mut() {
                t.record_on(stream.id, value);
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for TimelineSignals<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimelineSignals")
            .field("len", &self.semaphores.len())
            .finish_non_exhaustive()
    }
}

fn pairwise(operation: &'static str, semaphores: usize, params: usize) -> Result<(), Error> {
    if semaphores != params {
        return Err(Error::Unsupported {
            operation,
            reason: "one parameter block per semaphore: the slices differ in length",
        });
    }
    Ok(())
}

impl Stream {
    /// Queues `f` on this stream (`cuLaunchHostFunc`): the driver calls it
    /// on one of its threads after all work queued before it, and holds
    /// back work queued after it until `f` returns.
    ///
    /// `f` must not call the CUDA API (the driver may refuse with
    /// `NOT_PERMITTED` or deadlock) and must not wait for work that is not
    /// queued before it on this stream. A panic in `f` is caught and
    /// dropped. If the stream's work is thrown away before `f` runs (for
    /// example a simulator torn down with work pending), `f` is leaked, not
    /// dropped.
    ///
    /// # Errors
    /// [`Error::NotSupported`] when the driver lacks `cuLaunchHostFunc`;
    /// [`Error::Driver`] when the call fails (then `f` is dropped unrun).
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use tegra_interop_driver::{Context, Stream};
    /// use tegra_interop_sim::Sim;
    ///
    /// let sim = Sim::new()?;
    /// let ctx = Context::new(sim.backend(), 0)?;
    /// let stream = Stream::new(&ctx)?;
    /// let (tx, rx) = mpsc::channel();
    /// stream.launch_host_fn(move || tx.send(42).unwrap())?;
    /// stream.synchronize()?;
    /// assert_eq!(rx.try_recv()?, 42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn launch_host_fn<F>(&self, f: F) -> Result<(), Error>
    where
        F: FnOnce() + Send + 'static,
    {
        crate::ffi::launch_host_fn(self.context(), self.as_raw(), Box::new(f))
    }
}
