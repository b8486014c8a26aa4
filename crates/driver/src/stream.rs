//! [`Stream`]: where work is queued, and everything queued on it: semaphore
//! signals and waits (single and batched) and host functions.

use std::ffi::c_void;
use std::panic::AssertUnwindSafe;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(feature = "cudarc")]
use std::sync::Arc;

use tegra_interop_core::{CuResult, SignalParams, StreamId, ValidationError, WaitParams};
#[cfg(feature = "cudarc")]
use tegra_interop_sys::cuda::CUcontext;
use tegra_interop_sys::cuda::{
    CUexternalSemaphore, CUstream, CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS,
    CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
};

use crate::error::check;
use crate::nvsci::{CanSignal, CanWait, Fence, NvSciSemaphore};
use crate::owner::{Owned, Release};
use crate::semaphore::Reservation;
use crate::{entry, Backend, Context, Error, ExternalSemaphore, SemaphoreSignal, SemaphoreWait};

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
struct StreamRes {
    ctx: Context,
    raw: CUstream,
    kind: StreamKind,
}

// SAFETY: a CUstream may be used from any thread; calls bind the owning
// context first.
unsafe impl Send for StreamRes {}
// SAFETY: the driver serialises concurrent submissions to one stream.
unsafe impl Sync for StreamRes {}

impl Release for StreamRes {
    fn release(&mut self) -> Result<(), Error> {
        match self.kind {
            StreamKind::Owned => {
                let destroy = entry!(self.ctx.api(), cuStreamDestroy);
                // Best effort: the destroy call's own answer is what counts.
                let _ = self.ctx.bind();
                // SAFETY: we created this stream and destroy it once (`Owned`).
                check("cuStreamDestroy", unsafe { destroy(self.raw) })
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
        let create = entry!(ctx.api(), cuStreamCreate);
        ctx.bind()?;
        let mut raw: CUstream = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current.
        check("cuStreamCreate", unsafe {
            create(&mut raw, CU_STREAM_NON_BLOCKING)
        })?;
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
        let sync = entry!(self.context().api(), cuStreamSynchronize);
        self.context().bind()?;
        // SAFETY: `self.res.raw` is a live stream of the current context.
        check("cuStreamSynchronize", unsafe { sync(self.res.raw) })
    }

    /// `true` when all queued work is done (`cuStreamQuery`; `NOT_READY`
    /// means `false`).
    pub fn is_idle(&self) -> Result<bool, Error> {
        let query = entry!(self.context().api(), cuStreamQuery);
        self.context().bind()?;
        // SAFETY: `self.res.raw` is a live stream of the current context.
        let code = CuResult::from(unsafe { query(self.res.raw) });
        match code {
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

/// The raw handle of a semaphore taking part in a call, refused when NULL (as
/// the core's batches refuse it).
#[inline]
fn live_handle(semaphore: &ExternalSemaphore) -> Result<CUexternalSemaphore, Error> {
    if semaphore.as_raw().is_null() {
        return Err(Error::Validation(ValidationError::NullHandle));
    }
    Ok(semaphore.as_raw())
}

/// The `unsigned int` entry count of a batch of `N`.
#[inline]
fn batch_count<const N: usize>() -> Result<u32, Error> {
    u32::try_from(N).map_err(|_| {
        Error::Validation(ValidationError::CapacityExceeded {
            capacity: u32::MAX as usize,
        })
    })
}

/// Aborts the reservations made so far (after a refusal or a failed call).
/// Returns the first inconsistency found, after handling every entry.
fn abort_all(
    signals: &mut [SemaphoreSignal<'_>],
    reservations: &mut [Reservation],
) -> Result<(), ValidationError> {
    let mut first_error = Ok(());
    for (signal, reservation) in signals.iter_mut().zip(reservations.iter_mut()) {
        let reservation = std::mem::replace(reservation, Reservation::None);
        if let Err(e) = signal.semaphore.abort(reservation) {
            first_error = first_error.and(Err(e));
        }
    }
    first_error
}

impl Stream {
    #[inline]
    fn same_context(&self, semaphore: &ExternalSemaphore) -> Result<(), Error> {
        if semaphore.context().as_raw() != self.context().as_raw() {
            return Err(self.wrong_context(semaphore));
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn wrong_context(&self, semaphore: &ExternalSemaphore) -> Error {
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
        let [value] = self.signal_batch([SemaphoreSignal::new(semaphore, params)?])?;
        Ok(value)
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
        self.wait_batch([SemaphoreWait::new(semaphore, params)?])
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

    /// Queues `N` signals with one driver call
    /// (`cuSignalExternalSemaphoresAsync`). Everything is checked before the
    /// call (contexts, parameters, tracked values); if the call fails, no
    /// tracked value advances. Returns, per signal, the tracked value
    /// (timeline value or deterministic fence value).
    #[inline]
    pub fn signal_batch<const N: usize>(
        &self,
        mut signals: [SemaphoreSignal<'_>; N],
    ) -> Result<[Option<u64>; N], Error> {
        let count = batch_count::<N>()?;
        // The two arrays of the call, built on the stack: per entry the
        // context, then the checks of the core's `SignalBatch::push` (NULL
        // handle, `SignalParams::check_for` against the kind), then the
        // parameters written in place (what the core's `lower_for` builds).
        let mut handles: [CUexternalSemaphore; N] = [ptr::null_mut(); N];
        let mut params = [CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default(); N];
        for ((signal, handle), raw) in signals.iter().zip(&mut handles).zip(&mut params) {
            self.same_context(signal.semaphore)?;
            *handle = live_handle(signal.semaphore)?;
            signal.params.lower_into(signal.semaphore.kind(), raw)?;
        }
        let signal_fn = entry!(self.context().api(), cuSignalExternalSemaphoresAsync);

        let mut reservations = [const { Reservation::None }; N];
        for i in 0..N {
            let signal = &mut signals[i];
            match signal.semaphore.reserve(&signal.params, self.stream_id()) {
                Ok(r) => reservations[i] = r,
                Err(e) => {
                    // Undo the reservations made so far; the error to report is `e`.
                    let _ = abort_all(&mut signals[..i], &mut reservations[..i]);
                    return Err(e.into());
                }
            }
        }

        let called = self.context().make_current().and_then(|()| {
            // SAFETY: `handles` and `params` are two arrays of `count` entries;
            // every handle is a live semaphore of this stream's context
            // (borrowed for the duration of the call, context checked above);
            // every parameter block was checked by the core against its
            // semaphore's kind and lowered from a zeroed block; NvSciSync
            // fence pointers come from borrows that outlive this call.
            check("cuSignalExternalSemaphoresAsync", unsafe {
                signal_fn(handles.as_ptr(), params.as_ptr(), count, self.as_raw())
            })
        });
        if let Err(e) = called {
            let _ = abort_all(&mut signals, &mut reservations);
            return Err(e);
        }
        let mut values = [None; N];
        let mut first_error = Ok(());
        for ((signal, reservation), value) in
            signals.iter_mut().zip(reservations).zip(values.iter_mut())
        {
            // We hold the semaphore exclusively: no atomic operation needed.
            signal.semaphore.mark_used_exclusive();
            match signal.semaphore.commit(reservation) {
                Ok(v) => *value = v,
                Err(e) => first_error = first_error.and(Err(e)),
            }
        }
        first_error?;
        Ok(values)
    }

    /// Queues `N` waits with one driver call (`cuWaitExternalSemaphoresAsync`),
    /// everything checked before the call.
    #[inline]
    pub fn wait_batch<const N: usize>(&self, waits: [SemaphoreWait<'_>; N]) -> Result<(), Error> {
        let count = batch_count::<N>()?;
        // As for signals: the same per-entry checks, arrays on the stack.
        let mut handles: [CUexternalSemaphore; N] = [ptr::null_mut(); N];
        let mut params = [CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default(); N];
        for ((wait, handle), raw) in waits.iter().zip(&mut handles).zip(&mut params) {
            self.same_context(wait.semaphore)?;
            *handle = live_handle(wait.semaphore)?;
            wait.params.lower_into(wait.semaphore.kind(), raw)?;
        }
        let wait_fn = entry!(self.context().api(), cuWaitExternalSemaphoresAsync);
        self.context().make_current()?;
        // SAFETY: as for signals: two arrays of `count` entries, live
        // semaphores of this stream's context, parameter blocks checked by
        // the core and lowered from zeroed blocks, NvSciSync fence pointers
        // from borrows that outlive the call.
        check("cuWaitExternalSemaphoresAsync", unsafe {
            wait_fn(handles.as_ptr(), params.as_ptr(), count, self.as_raw())
        })?;
        for wait in &waits {
            // Written once: later waits only read the flag (no shared cache
            // line written per call).
            wait.semaphore.mark_used();
        }
        Ok(())
    }
}

/// What the driver calls: the boxed closure, moved out exactly once.
type HostFn = Box<dyn FnOnce() + Send + 'static>;

/// The C entry point the driver calls with the leaked `Box<HostFn>`.
unsafe extern "C" fn run_host_fn(user: *mut c_void) {
    // SAFETY: `user` is the `Box<HostFn>` leaked by `launch_host_fn`, and
    // the driver calls a host function exactly once.
    let f = unsafe { Box::from_raw(user.cast::<HostFn>()) };
    // Unwinding into the driver's thread is not allowed: a panicking
    // closure is stopped here (its panic message is printed by the hook).
    let _ = std::panic::catch_unwind(AssertUnwindSafe(f));
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
        let ctx = self.context();
        ctx.bind()?;
        let launch = entry!(ctx.api(), cuLaunchHostFunc);
        let boxed: Box<HostFn> = Box::new(Box::new(f));
        let user = Box::into_raw(boxed);
        // SAFETY: the stream is live in the current context; `run_host_fn`
        // matches the `CUhostFn` signature and takes ownership of `user`,
        // which stays valid until it is called.
        let result = check("cuLaunchHostFunc", unsafe {
            launch(self.as_raw(), Some(run_host_fn), user.cast())
        });
        if result.is_err() {
            // SAFETY: the launch failed, so the driver will never call
            // `run_host_fn`: the box is still ours, reclaimed once.
            drop(unsafe { Box::from_raw(user) });
        }
        result
    }
}
