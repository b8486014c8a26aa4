//! Imported external memory and its mappings.

use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr;

use tegra_interop_core::{
    BufferMapping, MemoryHandleKind, MemoryImport, MipmappedArrayMapping, ValidationError,
};
use tegra_interop_sys::cuda::{CUarray, CUdeviceptr, CUexternalMemory, CUmipmappedArray};

use crate::context::drop_result;
use crate::error::check;
use crate::{entry, Context, Error, ImportError};

/// Refuses handle kinds this operating system cannot provide, before the
/// driver sees them.
pub(crate) fn check_platform(kind_name: &'static str, win32: bool) -> Result<(), Error> {
    if win32 && !cfg!(windows) {
        return Err(Error::UnsupportedOnPlatform {
            kind: kind_name,
            available_on: "Windows",
        });
    }
    Ok(())
}

/// Memory imported into a [`Context`] (`cuImportExternalMemory`).
///
/// It borrows its context (so the context outlives it), and its mappings
/// borrow it (so it outlives them). Dropping it calls
/// `cuDestroyExternalMemory`; [`ExternalMemory::destroy`] does the same and
/// reports the result.
///
/// ```
/// use tegra_interop_core::BufferMapping;
/// use tegra_interop_driver::{Context, ExternalMemory};
///
/// let sim = tegra_interop_sim::Sim::new()?;
/// // `fd: OwnedFd` from the exporter (Vulkan, NvSciBuf, here the simulator).
/// let (fd, _exported) = tegra_interop_sim::export::memory(4096)?;
/// let ctx = Context::primary(sim.backend(), 0)?;
/// let memory = match ExternalMemory::opaque_fd(&ctx, fd, 4096) {
///     Ok(memory) => memory,
///     // The fd comes back on failure: retry, or drop it to close it.
///     Err(failed) => return Err(failed.error.into()),
/// };
/// let buffer = memory.map_buffer(BufferMapping::new(0, 4096))?;
/// buffer.copy_from_host(0, b"hello")?;
/// let mut back = [0u8; 5];
/// buffer.copy_to_host(0, &mut back)?;
/// assert_eq!(&back, b"hello");
/// drop(buffer);
/// memory.destroy()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ExternalMemory<'ctx> {
    ctx: &'ctx Context,
    raw: CUexternalMemory,
    kind: MemoryHandleKind,
    size: u64,
    released: bool,
}

// SAFETY: the driver's external-memory handles may be used from any thread;
// every call binds the owning context first.
unsafe impl Send for ExternalMemory<'_> {}
// SAFETY: `&ExternalMemory` only allows mapping calls, which the driver
// makes thread-safe.
unsafe impl Sync for ExternalMemory<'_> {}

impl std::fmt::Debug for ExternalMemory<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalMemory")
            .field("context", &self.ctx.id())
            .field("kind", &self.kind)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl<'ctx> ExternalMemory<'ctx> {
    /// Imports an fd-backed allocation described by `import` (an
    /// `OPAQUE_FD` or `DMABUF_FD` import built with the same fd number as
    /// `fd`).
    ///
    /// The driver is handed a duplicate of `fd`, never `fd` itself (the real
    /// driver closes the fd it is given when an `OPAQUE_FD` import fails). On
    /// success `fd` is consumed (closed; the driver owns the duplicate); on
    /// failure `fd` comes back inside the [`ImportError`], open and the same
    /// open file description. What happened to the duplicate after a failure
    /// is counted in [`crate::error::fd_audit`].
    pub fn import_fd(
        ctx: &'ctx Context,
        fd: OwnedFd,
        import: MemoryImport,
    ) -> Result<ExternalMemory<'ctx>, ImportError> {
        let fd_in_desc = import.kind().is_fd().then(|| import.fd()).flatten();
        crate::error::import_consuming_fd(
            fd,
            fd_in_desc,
            |dup| import.with_fd(dup),
            |described| Self::import_desc(ctx, described),
        )
    }

    /// Imports `size` bytes of an opaque fd export (for example Vulkan
    /// `OPAQUE_FD`). See [`import_fd`](Self::import_fd) for fd ownership.
    pub fn opaque_fd(
        ctx: &'ctx Context,
        fd: OwnedFd,
        size: u64,
    ) -> Result<ExternalMemory<'ctx>, ImportError> {
        match MemoryImport::opaque_fd(fd.as_raw_fd(), size) {
            Ok(import) => Self::import_fd(ctx, fd, import),
            Err(e) => Err(ImportError {
                error: e.into(),
                fd,
            }),
        }
    }

    /// Imports `size` bytes of a Linux dma-buf (CUDA 13.0 and later). See
    /// [`import_fd`](Self::import_fd) for fd ownership.
    pub fn dma_buf_fd(
        ctx: &'ctx Context,
        fd: OwnedFd,
        size: u64,
    ) -> Result<ExternalMemory<'ctx>, ImportError> {
        match MemoryImport::dma_buf_fd(fd.as_raw_fd(), size) {
            Ok(import) => Self::import_fd(ctx, fd, import),
            Err(e) => Err(ImportError {
                error: e.into(),
                fd,
            }),
        }
    }

    /// Imports a handle that is not a file descriptor (an `NvSciBufObj`, or
    /// on Windows a Win32/D3D handle). Win32/D3D kinds are refused on other
    /// systems before the call. fd kinds are refused: use
    /// [`import_fd`](Self::import_fd), which handles fd ownership.
    ///
    /// # Safety
    /// The handle inside `import` must be valid for this kind and stay
    /// valid for the duration of the call (for NvSciBuf: a live
    /// `NvSciBufObj` whose size is `import.size()`).
    pub unsafe fn import_handle(
        ctx: &'ctx Context,
        import: &MemoryImport,
    ) -> Result<ExternalMemory<'ctx>, Error> {
        if import.kind().is_fd() {
            return Err(Error::Validation(ValidationError::HandleKindMismatch));
        }
        Self::import_desc(ctx, import)
    }

    fn import_desc(ctx: &'ctx Context, import: &MemoryImport) -> Result<Self, Error> {
        let kind = import.kind();
        check_platform(kind.name(), kind.is_win32())?;
        let import_fn = entry!(ctx.api(), cuImportExternalMemory);
        ctx.bind()?;
        let mut raw: CUexternalMemory = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the descriptor was validated
        // by the core (reserved fields zero, handle matches the kind); for fd
        // kinds the fd is open (we hold its OwnedFd), for others the caller
        // vouched for the handle.
        check("cuImportExternalMemory", unsafe {
            import_fn(&mut raw, import.raw())
        })?;
        Ok(ExternalMemory {
            ctx,
            raw,
            kind,
            size: import.size(),
            released: false,
        })
    }

    /// The context it was imported in.
    pub fn context(&self) -> &'ctx Context {
        self.ctx
    }

    /// The handle kind it was imported from.
    pub fn kind(&self) -> MemoryHandleKind {
        self.kind
    }

    /// The imported size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The raw handle (still owned by this value).
    pub fn as_raw(&self) -> CUexternalMemory {
        self.raw
    }

    /// Maps a byte range as a device pointer
    /// (`cuExternalMemoryGetMappedBuffer`), checked against the import size
    /// before the call.
    pub fn map_buffer(&self, mapping: BufferMapping) -> Result<MappedBuffer<'_>, Error> {
        let desc = mapping.lower(self.size)?;
        let map_fn = entry!(self.ctx.api(), cuExternalMemoryGetMappedBuffer);
        self.ctx.bind()?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer, `self.raw` is live (we hold
        // it), `desc` was built by the core (flags and reserved zero, range
        // inside the import).
        check("cuExternalMemoryGetMappedBuffer", unsafe {
            map_fn(&mut ptr, self.raw, &desc)
        })?;
        Ok(MappedBuffer {
            memory: self,
            ptr,
            offset: mapping.offset,
            size: mapping.size,
            released: false,
        })
    }

    /// Maps the whole import as one buffer.
    pub fn map_whole(&self) -> Result<MappedBuffer<'_>, Error> {
        self.map_buffer(BufferMapping::new(0, self.size))
    }

    /// Maps a mipmapped array (`cuExternalMemoryGetMappedMipmappedArray`),
    /// checked before the call (levels, NvSciBuf needs one level, level 0
    /// inside the import).
    pub fn map_mipmapped_array(
        &self,
        mapping: MipmappedArrayMapping,
    ) -> Result<MappedArray<'_>, Error> {
        let desc = mapping.lower(self.kind, self.size)?;
        let map_fn = entry!(self.ctx.api(), cuExternalMemoryGetMappedMipmappedArray);
        self.ctx.bind()?;
        let mut raw: CUmipmappedArray = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer, `self.raw` is live, `desc`
        // was built and checked by the core.
        check("cuExternalMemoryGetMappedMipmappedArray", unsafe {
            map_fn(&mut raw, self.raw, &desc)
        })?;
        Ok(MappedArray {
            memory: self,
            raw,
            levels: mapping.num_levels,
            released: false,
        })
    }

    fn release(&mut self) -> Result<(), Error> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        let destroy = entry!(self.ctx.api(), cuDestroyExternalMemory);
        // Best effort: the destroy call's own answer is what counts.
        let _ = self.ctx.bind();
        // SAFETY: `self.raw` was imported by us and is destroyed once
        // (`released`); no mapping is alive (they borrow `self`).
        check("cuDestroyExternalMemory", unsafe { destroy(self.raw) })
    }

    /// Destroys the import now and reports the driver's answer
    /// (`DEINITIALIZED` counts as success: the driver is gone already).
    pub fn destroy(mut self) -> Result<(), Error> {
        match self.release() {
            Err(e) if e.is_driver_shut_down() => Ok(()),
            other => other,
        }
    }
}

impl Drop for ExternalMemory<'_> {
    fn drop(&mut self) {
        let result = self.release();
        drop_result(self.ctx.backend(), result);
    }
}

/// A device pointer into imported memory (`cuExternalMemoryGetMappedBuffer`),
/// freed with `cuMemFree` on drop.
pub struct MappedBuffer<'mem> {
    memory: &'mem ExternalMemory<'mem>,
    ptr: CUdeviceptr,
    offset: u64,
    size: u64,
    released: bool,
}

// SAFETY: a device pointer is a plain address; calls bind the context first.
unsafe impl Send for MappedBuffer<'_> {}
// SAFETY: `&MappedBuffer` allows only driver copies, which are thread-safe.
unsafe impl Sync for MappedBuffer<'_> {}

impl std::fmt::Debug for MappedBuffer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedBuffer")
            .field("context", &self.memory.ctx.id())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("offset", &self.offset)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl<'mem> MappedBuffer<'mem> {
    /// The device address.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Length in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Offset of the mapping in the imported memory.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The memory it maps.
    pub fn memory(&self) -> &'mem ExternalMemory<'mem> {
        self.memory
    }

    fn bounds(&self, offset: u64, len: usize) -> Result<CUdeviceptr, Error> {
        let len = len as u64;
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(self.ptr + offset),
            _ => Err(Error::OutOfBounds {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    /// Copies `src` to the buffer at byte `offset` and returns when the
    /// bytes are in the buffer. It is not ordered with work on non-blocking
    /// streams: synchronise those first.
    ///
    /// `cuMemcpyHtoD` from pageable host memory may return once the source
    /// is staged, before the data has landed (CUDA's documented
    /// synchronisation rules for memcpy); so the copy is followed by
    /// `cuStreamSynchronize` on the legacy default stream the copy was
    /// issued on, which returns when it has landed.
    pub fn copy_from_host(&self, offset: u64, src: &[u8]) -> Result<(), Error> {
        let dst = self.bounds(offset, src.len())?;
        let copy = entry!(self.memory.ctx.api(), cuMemcpyHtoD);
        let sync = entry!(self.memory.ctx.api(), cuStreamSynchronize);
        self.memory.ctx.bind()?;
        // SAFETY: `dst..dst+len` lies inside this live mapping (checked
        // above); `src` is readable for `len` bytes.
        check("cuMemcpyHtoD", unsafe {
            copy(dst, src.as_ptr().cast(), src.len())
        })?;
        // SAFETY: the NULL stream is the legacy default stream of the bound
        // context, the stream `cuMemcpyHtoD` used.
        check("cuStreamSynchronize", unsafe { sync(ptr::null_mut()) })
    }

    /// Copies from the buffer at byte `offset` into `dst` (`cuMemcpyDtoH`);
    /// returns when the copy is done.
    pub fn copy_to_host(&self, offset: u64, dst: &mut [u8]) -> Result<(), Error> {
        let src = self.bounds(offset, dst.len())?;
        let copy = entry!(self.memory.ctx.api(), cuMemcpyDtoH);
        self.memory.ctx.bind()?;
        // SAFETY: `src..src+len` lies inside this live mapping; `dst` is
        // writable for `len` bytes and not aliased (`&mut`).
        check("cuMemcpyDtoH", unsafe {
            copy(dst.as_mut_ptr().cast(), src, dst.len())
        })
    }

    /// Sets every byte of the buffer to `value` (`cuMemsetD8`).
    pub fn fill(&self, value: u8) -> Result<(), Error> {
        let len = usize::try_from(self.size).map_err(|_| Error::OutOfBounds {
            offset: 0,
            len: self.size,
            size: self.size,
        })?;
        let set = entry!(self.memory.ctx.api(), cuMemsetD8);
        self.memory.ctx.bind()?;
        // SAFETY: the whole live mapping is written, nothing past it.
        check("cuMemsetD8", unsafe { set(self.ptr, value, len) })
    }

    fn release(&mut self) -> Result<(), Error> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        let free = entry!(self.memory.ctx.api(), cuMemFree);
        let _ = self.memory.ctx.bind();
        // SAFETY: the pointer came from cuExternalMemoryGetMappedBuffer and
        // is freed once (`released`).
        check("cuMemFree", unsafe { free(self.ptr) })
    }

    /// Unmaps now (`cuMemFree`) and reports the driver's answer
    /// (`DEINITIALIZED` counts as success).
    pub fn destroy(mut self) -> Result<(), Error> {
        match self.release() {
            Err(e) if e.is_driver_shut_down() => Ok(()),
            other => other,
        }
    }
}

impl Drop for MappedBuffer<'_> {
    fn drop(&mut self) {
        let result = self.release();
        drop_result(self.memory.ctx.backend(), result);
    }
}

/// A mipmapped CUDA array over imported memory
/// (`cuExternalMemoryGetMappedMipmappedArray`), freed with
/// `cuMipmappedArrayDestroy` on drop.
pub struct MappedArray<'mem> {
    memory: &'mem ExternalMemory<'mem>,
    raw: CUmipmappedArray,
    levels: u32,
    released: bool,
}

// SAFETY: array handles may be used from any thread; calls bind first.
unsafe impl Send for MappedArray<'_> {}
// SAFETY: `&MappedArray` only queries levels, which is thread-safe.
unsafe impl Sync for MappedArray<'_> {}

impl std::fmt::Debug for MappedArray<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedArray")
            .field("context", &self.memory.ctx.id())
            .field("raw", &self.raw)
            .field("levels", &self.levels)
            .finish_non_exhaustive()
    }
}

impl<'mem> MappedArray<'mem> {
    /// The raw mipmapped array (still owned by this value).
    pub fn as_raw(&self) -> CUmipmappedArray {
        self.raw
    }

    /// Number of mip levels.
    pub fn levels(&self) -> u32 {
        self.levels
    }

    /// The memory it maps.
    pub fn memory(&self) -> &'mem ExternalMemory<'mem> {
        self.memory
    }

    /// The array of mip level `level` (`cuMipmappedArrayGetLevel`); the
    /// handle stays owned by this mipmapped array.
    pub fn level(&self, level: u32) -> Result<CUarray, Error> {
        if level >= self.levels {
            return Err(Error::Validation(ValidationError::IndexOutOfRange {
                index: level as usize,
                len: self.levels as usize,
            }));
        }
        let get = entry!(self.memory.ctx.api(), cuMipmappedArrayGetLevel);
        self.memory.ctx.bind()?;
        let mut array: CUarray = ptr::null_mut();
        // SAFETY: `array` is a valid out-pointer, `self.raw` is live and
        // `level` is below its level count.
        check("cuMipmappedArrayGetLevel", unsafe {
            get(&mut array, self.raw, level)
        })?;
        Ok(array)
    }

    fn release(&mut self) -> Result<(), Error> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        let destroy = entry!(self.memory.ctx.api(), cuMipmappedArrayDestroy);
        let _ = self.memory.ctx.bind();
        // SAFETY: the array came from cuExternalMemoryGetMappedMipmappedArray
        // and is destroyed once (`released`).
        check("cuMipmappedArrayDestroy", unsafe { destroy(self.raw) })
    }

    /// Destroys the array now (`cuMipmappedArrayDestroy`) and reports the
    /// driver's answer (`DEINITIALIZED` counts as success).
    pub fn destroy(mut self) -> Result<(), Error> {
        match self.release() {
            Err(e) if e.is_driver_shut_down() => Ok(()),
            other => other,
        }
    }
}

impl Drop for MappedArray<'_> {
    fn drop(&mut self) {
        let result = self.release();
        drop_result(self.memory.ctx.backend(), result);
    }
}
