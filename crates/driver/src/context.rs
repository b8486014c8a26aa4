//! [`Context`] and [`Stream`]: where imported objects live and where work is queued.

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tegra_interop_core::{CuResult, StreamId};
use tegra_interop_sys::cuda::{CUcontext, CUdevice, CUstream};

use crate::error::{check, ContextId};
use crate::table::CudaApi;
use crate::{entry, Backend, Error};

/// `CU_STREAM_NON_BLOCKING`: the stream does not synchronise with the legacy
/// default stream.
const CU_STREAM_NON_BLOCKING: u32 = 1;

static NEXT_CONTEXT_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

fn next_stream_id() -> StreamId {
    StreamId(NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed))
}

fn next_id(device: i32) -> ContextId {
    ContextId {
        id: NEXT_CONTEXT_ID.fetch_add(1, Ordering::Relaxed),
        device,
    }
}

/// Logs a release failure from `Drop` on the backend, unless the driver has
/// already shut down (then the object went with it).
pub(crate) fn drop_result(backend: &Backend, result: Result<(), Error>) {
    if let Err(e) = result {
        if !e.is_driver_shut_down() {
            backend.record_drop_error(e);
        }
    }
}

enum Ownership {
    /// Retained with `cuDevicePrimaryCtxRetain`; released on drop.
    Primary,
    /// Made with `cuCtxCreate`; destroyed on drop.
    Created,
    /// Owned by cudarc; we keep it alive.
    #[cfg(feature = "cudarc")]
    Cudarc(Arc<cudarc::driver::CudaContext>),
}

/// A CUDA context: the owner of every object imported into it.
///
/// Handles ([`crate::ExternalMemory`], [`crate::ExternalSemaphore`],
/// [`Stream`]) borrow their context, so a context cannot be reset
/// ([`Context::reset`] takes `&mut self`) or destroyed
/// ([`Context::destroy`] takes `self`) while any of them lives: the driver
/// would crash destroying them afterwards.
///
/// Each context gets a process-unique [`ContextId`] used in error messages.
///
/// ```
/// use tegra_interop_driver::{Context, Stream};
///
/// let sim = tegra_interop_sim::Sim::new()?;
/// let backend = sim.backend(); // or Backend::real()?
///
/// let ctx = Context::primary(backend, 0)?;
/// let stream = Stream::new(&ctx)?;
/// stream.synchronize()?;
/// drop(stream);
/// ctx.destroy()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Context {
    backend: Arc<Backend>,
    raw: CUcontext,
    device: CUdevice,
    id: ContextId,
    ownership: Ownership,
    released: bool,
}

// SAFETY: a CUDA context handle may be used from any thread (the driver API
// is thread-safe); every call made through a `Context` first makes it current
// on the calling thread. The backend is `Send + Sync` (plain fn pointers and
// loaded libraries).
unsafe impl Send for Context {}
// SAFETY: see `Send`; `&Context` only allows calls that the driver serialises.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("id", &self.id)
            .field("backend", &self.backend.name())
            .field("raw", &self.raw)
            .finish_non_exhaustive()
    }
}

/// Whether cudarc can load the driver library (it panics when it cannot).
#[cfg(feature = "cudarc")]
fn cudarc_can_load() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library by
    // its usual names (libcuda.so.1 among them, already loaded by
    // `Backend::real`); it has no other effect.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn device_handle(backend: &Backend, ordinal: i32) -> Result<CUdevice, Error> {
    backend.ensure_init()?;
    let get = entry!(backend.table().cuda, cuDeviceGet);
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a valid out-pointer for the duration of the call.
    check("cuDeviceGet", unsafe { get(&mut device, ordinal) })?;
    Ok(device)
}

impl Context {
    /// The usual context for device `ordinal`: with the real driver and the
    /// `cudarc` feature, a cudarc primary context (`CudaContext::new`);
    /// otherwise the device's primary context retained through the table.
    pub fn new(backend: Arc<Backend>, ordinal: i32) -> Result<Context, Error> {
        #[cfg(feature = "cudarc")]
        if backend.kind() == crate::BackendKind::Real && cudarc_can_load() {
            let index = usize::try_from(ordinal).map_err(|_| Error::Driver {
                call: "cuDeviceGet",
                code: CuResult::INVALID_DEVICE,
            })?;
            let ctx = cudarc::driver::CudaContext::new(index).map_err(|e| Error::Driver {
                call: "cudarc::driver::CudaContext::new",
                code: CuResult(e.0 as u32),
            })?;
            return Context::from_cudarc(backend, ctx);
        }
        Context::primary(backend, ordinal)
    }

    /// Retains the primary context of device `ordinal` through the table
    /// (`cuDevicePrimaryCtxRetain`); dropping it releases it.
    pub fn primary(backend: Arc<Backend>, ordinal: i32) -> Result<Context, Error> {
        let device = device_handle(&backend, ordinal)?;
        let retain = entry!(backend.table().cuda, cuDevicePrimaryCtxRetain);
        let mut raw: CUcontext = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `device` came from cuDeviceGet.
        check("cuDevicePrimaryCtxRetain", unsafe {
            retain(&mut raw, device)
        })?;
        Ok(Context {
            backend,
            raw,
            device,
            id: next_id(ordinal),
            ownership: Ownership::Primary,
            released: false,
        })
    }

    /// Creates a new (non-primary) context on device `ordinal` with
    /// `cuCtxCreate(flags)`; dropping it destroys it.
    pub fn create(backend: Arc<Backend>, ordinal: i32, flags: u32) -> Result<Context, Error> {
        let device = device_handle(&backend, ordinal)?;
        let create = entry!(backend.table().cuda, cuCtxCreate);
        let mut raw: CUcontext = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `device` came from cuDeviceGet.
        check("cuCtxCreate", unsafe { create(&mut raw, flags, device) })?;
        Ok(Context {
            backend,
            raw,
            device,
            id: next_id(ordinal),
            ownership: Ownership::Created,
            released: false,
        })
    }

    /// Wraps a cudarc context (which stays owned by cudarc; this keeps an
    /// `Arc` to it). `backend` must be the real driver
    /// ([`Backend::real`]): a cudarc context means nothing to a simulator.
    #[cfg(feature = "cudarc")]
    pub fn from_cudarc(
        backend: Arc<Backend>,
        ctx: Arc<cudarc::driver::CudaContext>,
    ) -> Result<Context, Error> {
        if backend.kind() != crate::BackendKind::Real {
            return Err(Error::Unsupported {
                operation: "Context::from_cudarc",
                reason:
                    "a cudarc context belongs to the real CUDA driver, and this backend is not it",
            });
        }
        let ordinal = i32::try_from(ctx.ordinal()).unwrap_or(i32::MAX);
        Ok(Context {
            raw: ctx.cu_ctx() as CUcontext,
            device: ctx.cu_device(),
            id: next_id(ordinal),
            ownership: Ownership::Cudarc(ctx),
            backend,
            released: false,
        })
    }

    /// The cudarc context this wraps, if it came from cudarc.
    #[cfg(feature = "cudarc")]
    pub fn cudarc(&self) -> Option<&Arc<cudarc::driver::CudaContext>> {
        match &self.ownership {
            Ownership::Cudarc(ctx) => Some(ctx),
            _ => None,
        }
    }

    /// The process-unique id used in error messages.
    pub fn id(&self) -> ContextId {
        self.id
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.id.device
    }

    /// The `CUdevice` handle.
    pub fn device(&self) -> CUdevice {
        self.device
    }

    /// The raw `CUcontext` (still owned by this value).
    pub fn as_raw(&self) -> CUcontext {
        self.raw
    }

    /// The backend this context calls through.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    /// `true` if this is a device's primary context (retained or from cudarc).
    pub fn is_primary(&self) -> bool {
        match &self.ownership {
            Ownership::Primary => true,
            Ownership::Created => false,
            #[cfg(feature = "cudarc")]
            Ownership::Cudarc(ctx) => ctx.is_primary(),
        }
    }

    pub(crate) fn api(&self) -> &CudaApi {
        &self.backend.table().cuda
    }

    /// Makes this context current on the calling thread (`cuCtxSetCurrent`).
    /// Every call of this crate does this itself; it is public for code that
    /// mixes in its own driver calls.
    #[inline]
    pub fn bind(&self) -> Result<(), Error> {
        let set = entry!(self.api(), cuCtxSetCurrent);
        // SAFETY: `self.raw` is a live context (we hold it until release).
        check("cuCtxSetCurrent", unsafe { set(self.raw) })
    }

    /// Makes this context current on the calling thread unless it already
    /// is: `cuCtxGetCurrent` and a compare, then `cuCtxSetCurrent` only when
    /// another context (or none) is current. On the H200 the query costs
    /// about half of the set (BENCHMARKS.md), and the semaphore calls need
    /// the stream's context current, so this is what their hot path uses.
    /// A table without `cuCtxGetCurrent` binds unconditionally; a failing
    /// query is reported as such.
    #[inline]
    pub(crate) fn make_current(&self) -> Result<(), Error> {
        if let Some(get) = self.api().cuCtxGetCurrent {
            let mut current: CUcontext = ptr::null_mut();
            // SAFETY: `current` is a valid out-pointer for the duration of
            // the call.
            check("cuCtxGetCurrent", unsafe { get(&mut current) })?;
            if current == self.raw {
                return Ok(());
            }
        }
        self.bind()
    }

    /// Waits for all work in this context (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> Result<(), Error> {
        self.bind()?;
        let sync = entry!(self.api(), cuCtxSynchronize);
        // SAFETY: no arguments; the context is current.
        check("cuCtxSynchronize", unsafe { sync() })
    }

    /// Resets the device's primary context (`cuDevicePrimaryCtxReset`),
    /// freeing everything in it. Takes `&mut self`, so no handle imported
    /// into this context can still be alive (destroying one after a reset
    /// crashes the real driver).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a context made with [`Context::create`] or
    /// one borrowed from cudarc (others may hold objects in it).
    pub fn reset(&mut self) -> Result<(), Error> {
        if !matches!(self.ownership, Ownership::Primary) {
            return Err(Error::Unsupported {
                operation: "Context::reset",
                reason: "only a primary context retained with Context::primary can be reset",
            });
        }
        let reset = entry!(self.api(), cuDevicePrimaryCtxReset);
        // SAFETY: `self.device` is the device whose primary context we hold;
        // `&mut self` guarantees no handle of ours refers to its objects.
        check("cuDevicePrimaryCtxReset", unsafe { reset(self.device) })
    }

    fn release(&mut self) -> Result<(), Error> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        match std::mem::replace(&mut self.ownership, Ownership::Primary) {
            Ownership::Primary => {
                let release = entry!(self.api(), cuDevicePrimaryCtxRelease);
                // SAFETY: we retained this device's primary context once and
                // release it once (`released` guards against a second time).
                check("cuDevicePrimaryCtxRelease", unsafe { release(self.device) })
            }
            Ownership::Created => {
                let destroy = entry!(self.api(), cuCtxDestroy);
                // SAFETY: we created this context and destroy it once.
                check("cuCtxDestroy", unsafe { destroy(self.raw) })
            }
            #[cfg(feature = "cudarc")]
            Ownership::Cudarc(ctx) => {
                drop(ctx);
                Ok(())
            }
        }
    }

    /// Releases the context now and reports the driver's answer. A driver
    /// that already shut down (`DEINITIALIZED`) counts as success: the
    /// context went with it.
    pub fn destroy(mut self) -> Result<(), Error> {
        match self.release() {
            Err(e) if e.is_driver_shut_down() => Ok(()),
            other => other,
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let result = self.release();
        drop_result(&self.backend, result);
    }
}

enum StreamKind {
    Owned,
    Default,
    #[cfg(feature = "cudarc")]
    Cudarc(Arc<cudarc::driver::CudaStream>),
}

/// A CUDA stream of a [`Context`]: signals and waits are queued on it.
///
/// Borrows its context, so the context outlives it.
pub struct Stream<'ctx> {
    ctx: &'ctx Context,
    id: StreamId,
    raw: CUstream,
    kind: StreamKind,
    released: bool,
}

// SAFETY: a CUstream may be used from any thread; calls bind the owning
// context first. `&Context` is Send because Context is Sync.
unsafe impl Send for Stream<'_> {}
// SAFETY: the driver serialises concurrent submissions to one stream.
unsafe impl Sync for Stream<'_> {}

impl std::fmt::Debug for Stream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("context", &self.ctx.id())
            .field("id", &self.id)
            .field("raw", &self.raw)
            .finish_non_exhaustive()
    }
}

impl<'ctx> Stream<'ctx> {
    /// A new non-blocking stream. For a cudarc context, cudarc makes it
    /// (`CudaContext::new_stream`); otherwise `cuStreamCreate`.
    pub fn new(ctx: &'ctx Context) -> Result<Stream<'ctx>, Error> {
        #[cfg(feature = "cudarc")]
        if let Some(c) = ctx.cudarc() {
            let stream = c.new_stream().map_err(|e| Error::Driver {
                call: "cudarc::driver::CudaContext::new_stream",
                code: CuResult(e.0 as u32),
            })?;
            return Stream::from_cudarc(ctx, stream);
        }
        ctx.bind()?;
        let create = entry!(ctx.api(), cuStreamCreate);
        let mut raw: CUstream = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the context is current.
        check("cuStreamCreate", unsafe {
            create(&mut raw, CU_STREAM_NON_BLOCKING)
        })?;
        Ok(Stream {
            ctx,
            id: next_stream_id(),
            raw,
            kind: StreamKind::Owned,
            released: false,
        })
    }

    /// The context's legacy default stream (the NULL stream). Never destroyed.
    pub fn default_stream(ctx: &'ctx Context) -> Stream<'ctx> {
        Stream {
            ctx,
            id: next_stream_id(),
            raw: ptr::null_mut(),
            kind: StreamKind::Default,
            released: false,
        }
    }

    /// Wraps a cudarc stream of `ctx`'s context (cudarc keeps owning it).
    ///
    /// # Errors
    /// [`Error::ForeignStream`] if the stream belongs to another CUDA context.
    #[cfg(feature = "cudarc")]
    pub fn from_cudarc(
        ctx: &'ctx Context,
        stream: Arc<cudarc::driver::CudaStream>,
    ) -> Result<Stream<'ctx>, Error> {
        let stream_ctx = stream.context().cu_ctx() as CUcontext;
        if stream_ctx != ctx.as_raw() {
            return Err(Error::ForeignStream { ctx: ctx.id() });
        }
        Ok(Stream {
            ctx,
            id: next_stream_id(),
            raw: stream.cu_stream() as CUstream,
            kind: StreamKind::Cudarc(stream),
            released: false,
        })
    }

    /// The context this stream belongs to.
    pub fn context(&self) -> &'ctx Context {
        self.ctx
    }

    /// A process-unique id of this stream wrapper, as the core's fence
    /// counters know it (two wrappers of one driver stream get two ids).
    pub fn stream_id(&self) -> StreamId {
        self.id
    }

    /// The raw `CUstream` (still owned by this value).
    pub fn as_raw(&self) -> CUstream {
        self.raw
    }

    /// Blocks until all queued work is done (`cuStreamSynchronize`).
    pub fn synchronize(&self) -> Result<(), Error> {
        self.ctx.bind()?;
        let sync = entry!(self.ctx.api(), cuStreamSynchronize);
        // SAFETY: `self.raw` is a live stream of the current context.
        check("cuStreamSynchronize", unsafe { sync(self.raw) })
    }

    /// `true` when all queued work is done (`cuStreamQuery`; `NOT_READY`
    /// means `false`).
    pub fn is_idle(&self) -> Result<bool, Error> {
        self.ctx.bind()?;
        let query = entry!(self.ctx.api(), cuStreamQuery);
        // SAFETY: `self.raw` is a live stream of the current context.
        let code = CuResult::from(unsafe { query(self.raw) });
        match code {
            CuResult::SUCCESS => Ok(true),
            CuResult::NOT_READY => Ok(false),
            code => Err(Error::Driver {
                call: "cuStreamQuery",
                code,
            }),
        }
    }

    fn release(&mut self) -> Result<(), Error> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        match std::mem::replace(&mut self.kind, StreamKind::Default) {
            StreamKind::Owned => {
                // Best effort: the destroy call's own answer is what counts.
                let _ = self.ctx.bind();
                let destroy = entry!(self.ctx.api(), cuStreamDestroy);
                // SAFETY: we created this stream and destroy it once.
                check("cuStreamDestroy", unsafe { destroy(self.raw) })
            }
            StreamKind::Default => Ok(()),
            #[cfg(feature = "cudarc")]
            StreamKind::Cudarc(stream) => {
                drop(stream);
                Ok(())
            }
        }
    }

    /// Destroys the stream now (queued work still completes) and reports the
    /// driver's answer; `DEINITIALIZED` counts as success.
    pub fn destroy(mut self) -> Result<(), Error> {
        match self.release() {
            Err(e) if e.is_driver_shut_down() => Ok(()),
            other => other,
        }
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        let result = self.release();
        drop_result(self.ctx.backend(), result);
    }
}
