//! Imported external memory and its mappings.
#![allow(unsafe_code)] // calls of pointer-taking entry points, each with its `// SAFETY:` line

use std::os::fd::OwnedFd;
use std::ptr;
use std::sync::Arc;

use tegra_interop_core::{
    BufferMapping, MemoryHandleKind, MemoryImport, MipmappedArrayMapping, ValidationError,
};
use tegra_interop_sys::cuda::{CUarray, CUdeviceptr, CUexternalMemory, CUmipmappedArray};

use crate::ffi::{call, Bind, TryBind};
use crate::owner::{Owned, Release};
use crate::{Backend, Context, Error, ImportError};

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
/// It holds a clone of its context, and each mapping holds the memory
/// (the driver requires mappings to be freed before the memory is used no
/// more), so none of them carries a lifetime: memory and its mappings can be
/// stored side by side in one struct. `cuDestroyExternalMemory` is called
/// when the last of them goes; [`ExternalMemory::destroy`] does it now and
/// reports the result, and is refused with [`Error::InUse`] while a mapping
/// is alive.
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
pub struct ExternalMemory {
    res: Arc<Owned<MemoryRes>>,
}

/// The C import and how it is destroyed.
pub(crate) struct MemoryRes {
    ctx: Context,
    raw: CUexternalMemory,
    kind: MemoryHandleKind,
    size: u64,
}

// SAFETY: a `MemoryRes` holds C handles (plain pointers to the driver's
// objects) and a context clone; the CUDA driver API lets any thread use a
// handle (calls that act in a context bind it first), so it may move
// between threads.
#[allow(unsafe_code)]
unsafe impl Send for MemoryRes {}
// SAFETY: `&MemoryRes` only allows mapping calls, which the driver makes
// thread-safe.
#[allow(unsafe_code)]
unsafe impl Sync for MemoryRes {}

impl Release for MemoryRes {
    fn release(&mut self) -> Result<(), Error> {
        // Imported by us, destroyed once (`Owned`); no mapping is alive
        // (each holds the memory).
        call::cuDestroyExternalMemory(TryBind(&self.ctx), self.raw)
    }

    fn backend(&self) -> &Backend {
        self.ctx.backend()
    }
}

impl std::fmt::Debug for ExternalMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalMemory")
            .field("context", &self.res.ctx.id())
            .field("kind", &self.res.kind)
            .field("size", &self.res.size)
            .finish_non_exhaustive()
    }
}

impl ExternalMemory {
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
        ctx: &Context,
        fd: OwnedFd,
        import: MemoryImport,
    ) -> Result<ExternalMemory, ImportError> {
        crate::import::import_fd(
            fd,
            |_| Ok(import),
            |described| Self::import_desc(ctx, described),
        )
    }

    /// Imports `size` bytes of an opaque fd export (for example Vulkan
    /// `OPAQUE_FD`). See [`import_fd`](Self::import_fd) for fd ownership.
    pub fn opaque_fd(ctx: &Context, fd: OwnedFd, size: u64) -> Result<ExternalMemory, ImportError> {
        crate::import::import_fd(
            fd,
            |raw| MemoryImport::opaque_fd(raw, size),
            |described| Self::import_desc(ctx, described),
        )
    }

    /// Imports `size` bytes of a Linux dma-buf (CUDA 13.0 and later). See
    /// [`import_fd`](Self::import_fd) for fd ownership.
    pub fn dma_buf_fd(
        ctx: &Context,
        fd: OwnedFd,
        size: u64,
    ) -> Result<ExternalMemory, ImportError> {
        crate::import::import_fd(
            fd,
            |raw| MemoryImport::dma_buf_fd(raw, size),
            |described| Self::import_desc(ctx, described),
        )
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
    #[allow(unsafe_code)] // the caller vouches for the raw handle
    pub unsafe fn import_handle(
        ctx: &Context,
        import: &MemoryImport,
    ) -> Result<ExternalMemory, Error> {
        crate::import::refuse_fd_kind(import)?;
        Self::import_desc(ctx, import)
    }

    /// The import itself; for a non-fd kind the crate vouches for the handle
    /// (see `ffi`'s invariants).
    pub(crate) fn import_desc(ctx: &Context, import: &MemoryImport) -> Result<Self, Error> {
        let kind = import.kind();
        check_platform(kind.name(), kind.is_win32())?;
        let mut raw: CUexternalMemory = ptr::null_mut();
        // SAFETY: `raw` is a local the driver writes one handle to; `import.raw()` is a descriptor
        // the core validated (kind and union member match; for fd kinds the fd is open, we hold it;
        // for others the caller vouched for the handle: `import_handle` is `unsafe`).
        unsafe { call::cuImportExternalMemory(Bind(ctx), &mut raw, import.raw()) }?;
        Ok(ExternalMemory {
            res: Arc::new(Owned::new(MemoryRes {
                ctx: ctx.clone(),
                raw,
                kind,
                size: import.size(),
            })),
        })
    }

    /// The context it was imported in.
    pub fn context(&self) -> &Context {
        &self.res.ctx
    }

    /// The handle kind it was imported from.
    pub fn kind(&self) -> MemoryHandleKind {
        self.res.kind
    }

    /// The imported size in bytes.
    pub fn size(&self) -> u64 {
        self.res.size
    }

    /// The raw handle (still owned by this value).
    pub fn as_raw(&self) -> CUexternalMemory {
        self.res.raw
    }

    /// How many mappings (or other holders) of this memory are alive.
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.res) - 1
    }

    /// A second handle to the same import, held by a mapping.
    fn holder(&self) -> ExternalMemory {
        ExternalMemory {
            res: Arc::clone(&self.res),
        }
    }

    /// Maps a byte range as a device pointer
    /// (`cuExternalMemoryGetMappedBuffer`), checked against the import size
    /// before the call.
    pub fn map_buffer(&self, mapping: BufferMapping) -> Result<MappedBuffer, Error> {
        let desc = mapping.lower(self.res.size)?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a local the driver writes one device pointer to; `desc` is a local
        // descriptor the core built (flags and reserved zero, range inside the import).
        unsafe {
            call::cuExternalMemoryGetMappedBuffer(
                Bind(self.context()),
                &mut ptr,
                self.res.raw,
                &desc,
            )
        }?;
        Ok(MappedBuffer {
            res: Owned::new(BufferRes {
                memory: self.holder(),
                ptr,
                offset: mapping.offset,
                size: mapping.size,
            }),
        })
    }

    /// Maps the whole import as one buffer.
    pub fn map_whole(&self) -> Result<MappedBuffer, Error> {
        self.map_buffer(BufferMapping::new(0, self.res.size))
    }

    /// Maps a mipmapped array (`cuExternalMemoryGetMappedMipmappedArray`),
    /// checked before the call (levels, NvSciBuf needs one level, level 0
    /// inside the import).
    pub fn map_mipmapped_array(
        &self,
        mapping: MipmappedArrayMapping,
    ) -> Result<MappedArray, Error> {
        let desc = mapping.lower(self.res.kind, self.res.size)?;
        let mut raw: CUmipmappedArray = ptr::null_mut();
        // SAFETY: `raw` is a local the driver writes one handle to; `desc` is a local descriptor
        // the core built for this import's kind and size.
        unsafe {
            call::cuExternalMemoryGetMappedMipmappedArray(
                Bind(self.context()),
                &mut raw,
                self.res.raw,
                &desc,
            )
        }?;
        Ok(MappedArray {
            res: Owned::new(ArrayRes {
                memory: self.holder(),
                raw,
                levels: mapping.num_levels,
            }),
        })
    }

    /// Destroys the import now and reports the driver's answer
    /// (`DEINITIALIZED` counts as success: the driver is gone already).
    ///
    /// # Errors
    /// [`Error::InUse`] while a mapping of it is alive; nothing is destroyed
    /// then (the import goes when its last mapping does).
    pub fn destroy(self) -> Result<(), Error> {
        let ctx = self.res.ctx.id();
        match Arc::try_unwrap(self.res) {
            Ok(owned) => owned.destroy(),
            Err(res) => Err(Error::InUse {
                operation: "ExternalMemory::destroy",
                ctx,
                holders: Arc::strong_count(&res) - 1,
            }),
        }
    }
}

/// A device pointer into imported memory (`cuExternalMemoryGetMappedBuffer`),
/// freed with `cuMemFree` on drop.
///
/// It holds its memory (and so the context), so it can be stored next to
/// the memory or without it.
pub struct MappedBuffer {
    res: Owned<BufferRes>,
}

/// The mapping and how it is freed.
struct BufferRes {
    memory: ExternalMemory,
    ptr: CUdeviceptr,
    offset: u64,
    size: u64,
}

impl Release for BufferRes {
    fn release(&mut self) -> Result<(), Error> {
        // Freed once (`Owned`), before the memory (held by this value).
        call::cuMemFree(TryBind(self.memory.context()), self.ptr)
    }

    fn backend(&self) -> &Backend {
        self.memory.context().backend()
    }
}

impl std::fmt::Debug for MappedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedBuffer")
            .field("context", &self.ctx().id())
            .field("ptr", &format_args!("{:#x}", self.res.ptr))
            .field("offset", &self.res.offset)
            .field("size", &self.res.size)
            .finish_non_exhaustive()
    }
}

impl MappedBuffer {
    fn ctx(&self) -> &Context {
        self.res.memory.context()
    }

    /// The device address.
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.res.ptr
    }

    /// Length in bytes.
    pub fn size(&self) -> u64 {
        self.res.size
    }

    /// Offset of the mapping in the imported memory.
    pub fn offset(&self) -> u64 {
        self.res.offset
    }

    /// The memory it maps.
    pub fn memory(&self) -> &ExternalMemory {
        &self.res.memory
    }

    fn bounds(&self, offset: u64, len: usize) -> Result<CUdeviceptr, Error> {
        let len = len as u64;
        match offset.checked_add(len) {
            Some(end) if end <= self.res.size => Ok(self.res.ptr + offset),
            _ => Err(Error::OutOfBounds {
                offset,
                len,
                size: self.res.size,
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
        // SAFETY: `src` is a readable slice of `src.len()` bytes, the length passed; `dst..dst+len`
        // lies inside this live mapping (checked above).
        unsafe { call::cuMemcpyHtoD(Bind(self.ctx()), dst, src.as_ptr().cast(), src.len()) }?;
        // The NULL stream is the legacy default stream of the bound context,
        // the stream `cuMemcpyHtoD` used.
        call::cuStreamSynchronize(self.ctx().api(), ptr::null_mut())
    }

    /// Copies from the buffer at byte `offset` into `dst` (`cuMemcpyDtoH`);
    /// returns when the copy is done.
    pub fn copy_to_host(&self, offset: u64, dst: &mut [u8]) -> Result<(), Error> {
        let src = self.bounds(offset, dst.len())?;
        // SAFETY: `dst` is a writable slice of `dst.len()` bytes, the length passed; `src..src+len`
        // lies inside this live mapping (checked above).
        unsafe { call::cuMemcpyDtoH(Bind(self.ctx()), dst.as_mut_ptr().cast(), src, dst.len()) }
    }

    /// Sets every byte of the buffer to `value` (`cuMemsetD8`).
    pub fn fill(&self, value: u8) -> Result<(), Error> {
        let size = self.res.size;
        let len = usize::try_from(size).map_err(|_| Error::OutOfBounds {
            offset: 0,
            len: size,
            size,
        })?;
        // The whole live mapping is written, nothing past it.
        call::cuMemsetD8(Bind(self.ctx()), self.res.ptr, value, len)
    }

    /// Unmaps now (`cuMemFree`) and reports the driver's answer
    /// (`DEINITIALIZED` counts as success).
    pub fn destroy(self) -> Result<(), Error> {
        self.res.destroy()
    }
}

/// A mipmapped CUDA array over imported memory
/// (`cuExternalMemoryGetMappedMipmappedArray`), freed with
/// `cuMipmappedArrayDestroy` on drop.
///
/// It holds its memory (and so the context).
pub struct MappedArray {
    res: Owned<ArrayRes>,
}

/// The array and how it is destroyed.
pub(crate) struct ArrayRes {
    memory: ExternalMemory,
    raw: CUmipmappedArray,
    levels: u32,
}

// SAFETY: a `ArrayRes` holds C handles (plain pointers to the driver's
// objects) and a context clone; the CUDA driver API lets any thread use a
// handle (calls that act in a context bind it first), so it may move
// between threads.
#[allow(unsafe_code)]
unsafe impl Send for ArrayRes {}
// SAFETY: `&ArrayRes` only queries levels, which is thread-safe.
#[allow(unsafe_code)]
unsafe impl Sync for ArrayRes {}

impl Release for ArrayRes {
    fn release(&mut self) -> Result<(), Error> {
        // Destroyed once (`Owned`), before the memory (held by this value).
        call::cuMipmappedArrayDestroy(TryBind(self.memory.context()), self.raw)
    }

    fn backend(&self) -> &Backend {
        self.memory.context().backend()
    }
}

impl std::fmt::Debug for MappedArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedArray")
            .field("context", &self.ctx().id())
            .field("raw", &self.res.raw)
            .field("levels", &self.res.levels)
            .finish_non_exhaustive()
    }
}

impl MappedArray {
    fn ctx(&self) -> &Context {
        self.res.memory.context()
    }

    /// The raw mipmapped array (still owned by this value).
    pub fn as_raw(&self) -> CUmipmappedArray {
        self.res.raw
    }

    /// Number of mip levels.
    pub fn levels(&self) -> u32 {
        self.res.levels
    }

    /// The memory it maps.
    pub fn memory(&self) -> &ExternalMemory {
        &self.res.memory
    }

    /// The array of mip level `level` (`cuMipmappedArrayGetLevel`); the
    /// handle stays owned by this mipmapped array.
    pub fn level(&self, level: u32) -> Result<CUarray, Error> {
        if level >= self.res.levels {
            return Err(Error::Validation(ValidationError::IndexOutOfRange {
                index: level as usize,
                len: self.res.levels as usize,
            }));
        }
        let mut array: CUarray = ptr::null_mut();
        // SAFETY: `array` is a local the driver writes one `CUarray` to; `level` is below the level
        // count (checked above).
        unsafe {
            call::cuMipmappedArrayGetLevel(Bind(self.ctx()), &mut array, self.res.raw, level)
        }?;
        Ok(array)
    }

    /// Destroys the array now (`cuMipmappedArrayDestroy`) and reports the
    /// driver's answer (`DEINITIALIZED` counts as success).
    pub fn destroy(self) -> Result<(), Error> {
        self.res.destroy()
    }
}
