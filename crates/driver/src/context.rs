//! [`Context`]: where imported objects live.
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[cfg(feature = "cudarc")]
use tegra_interop_core::CuResult;
use tegra_interop_sys::cuda::{CUcontext, CUdevice};

use crate::error::ContextId;
use crate::ffi::{call, Bind};
use crate::owner::{Owned, Release};
use crate::table::CudaApi;
use crate::{Backend, Error};

static NEXT_CONTEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id(device: i32) -> ContextId {
    ContextId {
        id: NEXT_CONTEXT_ID.fetch_add(1, Ordering::Relaxed),
        device,
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
/// A `Context` is a cheap clone of a shared (`Arc`) handle, like cudarc's
/// `Arc<CudaContext>`. Every handle made in it ([`crate::Stream`],
/// [`crate::ExternalMemory`], [`crate::ExternalSemaphore`] and the
/// mappings) holds a clone, so handles carry no lifetime: a program may
/// store a context and its handles in one struct or return them from a
/// function, and the context cannot go before them. The C context is
/// released (retained primary: `cuDevicePrimaryCtxRelease`; created:
/// `cuCtxDestroy`) when the last holder goes.
///
/// [`Context::reset`] and [`Context::destroy`] act on the C context itself,
/// which would crash the driver when a handle of it is destroyed later: they
/// are refused at run time with [`Error::InUse`] (naming how many other
/// holders are alive) unless this is the only holder.
///
/// Each context gets a process-unique [`ContextId`] used in error messages.
///
/// ```
/// use tegra_interop_driver::{Context, Error, Stream};
///
/// let sim = tegra_interop_sim::Sim::new()?;
/// let backend = sim.backend(); // or Backend::real()?
///
/// let ctx = Context::primary(backend, 0)?;
/// let stream = Stream::new(&ctx)?;
/// stream.synchronize()?;
/// // The stream holds the context: destroying it now is refused.
/// assert!(matches!(ctx.clone().destroy(), Err(Error::InUse { holders: 2, .. })));
/// drop(stream);
/// ctx.destroy()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Context {
    inner: Arc<Owned<ContextRes>>,
}

/// The C context and how it is released.
pub(crate) struct ContextRes {
    backend: Arc<Backend>,
    raw: CUcontext,
    device: CUdevice,
    id: ContextId,
    ownership: Ownership,
}

// SAFETY: a `ContextRes` holds C handles (plain pointers to the driver's
// objects) and a context clone; the CUDA driver API lets any thread use a
// handle (calls that act in a context bind it first), so it may move
// between threads.
#[allow(unsafe_code)]
unsafe impl Send for ContextRes {}
// SAFETY: `&ContextRes` only allows calls the driver serialises.
#[allow(unsafe_code)]
unsafe impl Sync for ContextRes {}

impl Release for ContextRes {
    fn release(&mut self) -> Result<(), Error> {
        let api = &self.backend.table().cuda;
        match &self.ownership {
            Ownership::Primary => {
                // Retained once, released once (`Owned`); no holder is left.
                call::cuDevicePrimaryCtxRelease(api, self.device)
            }
            Ownership::Created => {
                // Created by us, destroyed once; no holder is left.
                call::cuCtxDestroy(api, self.raw)
            }
            // cudarc's `Arc` is dropped with this value.
            #[cfg(feature = "cudarc")]
            Ownership::Cudarc(_) => Ok(()),
        }
    }

    fn backend(&self) -> &Backend {
        &self.backend
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("id", &self.inner.id)
            .field("backend", &self.inner.backend.name())
            .field("raw", &self.inner.raw)
            .finish_non_exhaustive()
    }
}

fn device_handle(backend: &Backend, ordinal: i32) -> Result<CUdevice, Error> {
    backend.ensure_init()?;
    let mut device: CUdevice = 0;
    // SAFETY: `device` is a local the driver writes one `CUdevice` to.
    unsafe { call::cuDeviceGet(&backend.table().cuda, &mut device, ordinal) }?;
    Ok(device)
}

impl Context {
    fn wrap(res: ContextRes) -> Context {
        Context {
            inner: Arc::new(Owned::new(res)),
        }
    }

    /// How many other values hold this context (its handles and clones).
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.inner) - 1
    }

    /// `true` when `self` and `other` are clones of one context.
    pub fn same(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The usual context for device `ordinal`: with the real driver and the
    /// `cudarc` feature, a cudarc primary context (`CudaContext::new`);
    /// otherwise the device's primary context retained through the table.
    pub fn new(backend: Arc<Backend>, ordinal: i32) -> Result<Context, Error> {
        #[cfg(feature = "cudarc")]
        if backend.kind() == crate::BackendKind::Real && crate::ffi::cudarc_can_load() {
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
        let mut raw: CUcontext = ptr::null_mut();
        // SAFETY: `raw` is a local the driver writes one `CUcontext` to.
        unsafe { call::cuDevicePrimaryCtxRetain(&backend.table().cuda, &mut raw, device) }?;
        Ok(Context::wrap(ContextRes {
            backend,
            raw,
            device,
            id: next_id(ordinal),
            ownership: Ownership::Primary,
        }))
    }

    /// Creates a new (non-primary) context on device `ordinal` with
    /// `cuCtxCreate(flags)`; dropping it destroys it.
    pub fn create(backend: Arc<Backend>, ordinal: i32, flags: u32) -> Result<Context, Error> {
        let device = device_handle(&backend, ordinal)?;
        let mut raw: CUcontext = ptr::null_mut();
        // SAFETY: `raw` is a local the driver writes one `CUcontext` to.
        unsafe { call::cuCtxCreate(&backend.table().cuda, &mut raw, flags, device) }?;
        Ok(Context::wrap(ContextRes {
            backend,
            raw,
            device,
            id: next_id(ordinal),
            ownership: Ownership::Created,
        }))
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
        Ok(Context::wrap(ContextRes {
            raw: ctx.cu_ctx() as CUcontext,
            device: ctx.cu_device(),
            id: next_id(ordinal),
            ownership: Ownership::Cudarc(ctx),
            backend,
        }))
    }

    /// The cudarc context this wraps, if it came from cudarc.
    #[cfg(feature = "cudarc")]
    pub fn cudarc(&self) -> Option<&Arc<cudarc::driver::CudaContext>> {
        match &self.inner.ownership {
            Ownership::Cudarc(ctx) => Some(ctx),
            _ => None,
        }
    }

    /// The process-unique id used in error messages.
    pub fn id(&self) -> ContextId {
        self.inner.id
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.inner.id.device
    }

    /// The `CUdevice` handle.
    pub fn device(&self) -> CUdevice {
        self.inner.device
    }

    /// The raw `CUcontext` (still owned by this value).
    pub fn as_raw(&self) -> CUcontext {
        self.inner.raw
    }

    /// The backend this context calls through.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.inner.backend
    }

    /// `true` if this is a device's primary context (retained or from cudarc).
    pub fn is_primary(&self) -> bool {
        match &self.inner.ownership {
            Ownership::Primary => true,
            Ownership::Created => false,
            #[cfg(feature = "cudarc")]
            Ownership::Cudarc(ctx) => ctx.is_primary(),
        }
    }

    pub(crate) fn api(&self) -> &CudaApi {
        &self.inner.backend.table().cuda
    }

    /// Makes this context current on the calling thread (`cuCtxSetCurrent`).
    /// Every call of this crate does this itself; it is public for code that
    /// mixes in its own driver calls.
    #[inline]
    pub fn bind(&self) -> Result<(), Error> {
        call::cuCtxSetCurrent(self.api(), self.inner.raw)
    }

    /// Makes this context current on the calling thread unless it already
    /// is: `cuCtxGetCurrent` and a compare, then `cuCtxSetCurrent` only when
    /// another context (or none) is current. On the H200 the query costs
    /// about half of the set (BENCHMARKS.md, H200 per-call section), and the
    /// semaphore calls need the stream's context current, so this is what
    /// their hot path uses.
    /// A table without `cuCtxGetCurrent` binds unconditionally; a failing
    /// query is reported as such.
    #[inline]
    pub(crate) fn make_current(&self) -> Result<(), Error> {
        if self.api().cuCtxGetCurrent.is_some() {
            let mut current: CUcontext = ptr::null_mut();
            // SAFETY: `current` is a local the driver writes one `CUcontext` to.
            unsafe { call::cuCtxGetCurrent(self.api(), &mut current) }?;
            if current == self.inner.raw {
                return Ok(());
            }
        }
        self.bind()
    }

    /// Waits for all work in this context (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> Result<(), Error> {
        call::cuCtxSynchronize(Bind(self))
    }

    /// Resets the device's primary context (`cuDevicePrimaryCtxReset`),
    /// freeing everything in it.
    ///
    /// # Errors
    /// [`Error::InUse`] while another value holds this context (a handle
    /// imported into it, a stream, a clone): destroying that handle after
    /// the reset would crash the real driver. [`Error::Unsupported`] for a
    /// context made with [`Context::create`] or one borrowed from cudarc
    /// (others may hold objects in it).
    pub fn reset(&mut self) -> Result<(), Error> {
        if !matches!(self.inner.ownership, Ownership::Primary) {
            return Err(Error::Unsupported {
                operation: "Context::reset",
                reason: "only a primary context retained with Context::primary can be reset",
            });
        }
        self.refuse_if_held("Context::reset")?;
        // No other value holds this context (checked above, and `&mut self`
        // keeps a clone from being made meanwhile).
        call::cuDevicePrimaryCtxReset(self.api(), self.inner.device)
    }

    fn refuse_if_held(&self, operation: &'static str) -> Result<(), Error> {
        match self.holders() {
            0 => Ok(()),
            holders => Err(Error::InUse {
                operation,
                ctx: self.inner.id,
                holders,
            }),
        }
    }

    /// Releases the context now and reports the driver's answer. A driver
    /// that already shut down (`DEINITIALIZED`) counts as success: the
    /// context went with it.
    ///
    /// # Errors
    /// [`Error::InUse`] while another value holds this context; nothing is
    /// released then (this clone is dropped, and the context is released
    /// when its last holder goes).
    pub fn destroy(self) -> Result<(), Error> {
        let operation = "Context::destroy";
        match Arc::try_unwrap(self.inner) {
            Ok(owned) => owned.destroy(),
            Err(inner) => Err(Error::InUse {
                operation,
                ctx: inner.id,
                holders: Arc::strong_count(&inner) - 1,
            }),
        }
    }
}
