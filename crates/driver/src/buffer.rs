//! Memory the driver allocates: [`DeviceBuffer`] (`cuMemAlloc`) and
//! [`PinnedHostBuffer`] (`cuMemHostAlloc`, mapped into the device); the
//! caller's host memory page-locked in place, [`RegisteredHostMemory`]
//! (`cuMemHostRegister`); the [`DeviceMemory`] view every
//! device-addressable buffer of this crate gives (these three and
//! [`crate::MappedBuffer`]), which stream copies and kernel launches take;
//! and the [`PageLockedMemory`] view of the two kinds of page-locked host
//! memory, which the host-to-device and device-to-host stream copies take.
//!
//! # What is safe, and why
//!
//! GPU work runs asynchronously: a stream copy or a kernel launch returns
//! before the device touches the memory, and the device pointer it was
//! given is a number the type system cannot follow. So the calls that hand
//! memory to queued GPU work are `unsafe` ([`Stream::copy_async`],
//! [`DeviceBuffer::copy_from_pinned_async`],
//! [`DeviceBuffer::copy_to_pinned_async`],
//! [`crate::Launch::launch`]): their caller promises that the memory
//! outlives the work and that nothing on the host reads or writes the bytes
//! the work writes (or writes the bytes it reads) until the work completed,
//! as seen through [`crate::Event::synchronize`] /
//! [`crate::Event::is_complete`] of an event recorded after it, or
//! [`Stream::synchronize`].
//!
//! Given that promise, the host views of a pinned buffer are safe:
//! [`PinnedHostBuffer::as_slice`] / [`PinnedHostBuffer::as_mut_slice`]
//! borrow the buffer exclusively (`&mut self`, both), so within one process
//! Rust's borrow rules order host accesses (no atomic view, no queue call
//! that takes `&PinnedHostBuffer`, exists while a byte view does), and the
//! unsafe queue calls order the device's. For values the device updates
//! while the host watches (a counter a kernel adds to with `atomicAdd`),
//! [`PinnedHostBuffer::atomic_u64`] gives an `AtomicU64` view (`&self`:
//! shareable between threads, and used at any time, since every access
//! through it is atomic).
//!
//! Error paths need the same care: when a step fails after work was
//! queued, synchronise the stream (and if that fails, the context) before
//! the buffers the work uses are dropped; the simulator reports a queued
//! copy or kernel that meets freed memory as a use after free. (The
//! consumer scenario in `crates/driver/tests/consumer_sim.rs` shows the
//! pattern, with a failure injected at every call.)
//!
//! The synchronous copies ([`DeviceBuffer::copy_from_host`],
//! [`DeviceBuffer::copy_to_host`]) wait for the legacy default stream and
//! return when the bytes have landed; like [`crate::MappedBuffer`]'s they
//! are not ordered with non-blocking streams (synchronise those first).
#![allow(unsafe_code)] // calls of pointer-taking entry points and the pinned views, each with its `// SAFETY:` line

use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::sync::atomic::AtomicU64;

use tegra_interop_sys::cuda::CUdeviceptr;

use crate::ffi::{call, Bind, Current, TryBind};
use crate::owner::{Owned, Release};
use crate::{Backend, Context, Error, MappedBuffer, Stream};

/// `CU_MEMHOSTALLOC_PORTABLE`: the pinned memory counts as pinned for every
/// context, not only the allocating one.
pub const CU_MEMHOSTALLOC_PORTABLE: u32 = 0x01;
/// `CU_MEMHOSTALLOC_DEVICEMAP`: the pinned memory is mapped into the
/// device's address space (`cuMemHostGetDevicePointer`).
pub const CU_MEMHOSTALLOC_DEVICEMAP: u32 = 0x02;

use tegra_interop_sys::cuda::{
    CU_MEMHOSTREGISTER_DEVICEMAP, CU_MEMHOSTREGISTER_IOMEMORY, CU_MEMHOSTREGISTER_PORTABLE,
};

mod sealed {
    pub trait Sealed {}
}

/// A device-addressable range of one of this crate's buffers: its device
/// address and length, valid while the value is alive. Sealed: only the
/// crate's own buffer types implement it, so the range is always real.
pub trait DeviceMemory: sealed::Sealed {
    /// The device address of the first byte.
    fn device_ptr(&self) -> CUdeviceptr;
    /// Length in bytes.
    fn byte_len(&self) -> u64;
    /// The context the memory was made in.
    fn context(&self) -> &Context;

    /// The device address of `[offset, offset + len)` after a bounds check.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when the range reaches past the end.
    fn device_range(&self, offset: u64, len: u64) -> Result<CUdeviceptr, Error> {
        let size = self.byte_len();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(self.device_ptr() + offset),
            _ => Err(Error::OutOfBounds { offset, len, size }),
        }
    }
}

impl sealed::Sealed for MappedBuffer {}
impl DeviceMemory for MappedBuffer {
    fn device_ptr(&self) -> CUdeviceptr {
        MappedBuffer::device_ptr(self)
    }
    fn byte_len(&self) -> u64 {
        self.size()
    }
    fn context(&self) -> &Context {
        self.memory().context()
    }
}

/// Page-locked host memory the copy engines read and write directly
/// ([`PinnedHostBuffer`], [`RegisteredHostMemory`]): what
/// [`DeviceBuffer::copy_from_pinned_async`] and
/// [`DeviceBuffer::copy_to_pinned_async`] take. Sealed.
pub trait PageLockedMemory: sealed::Sealed {
    /// The host address of `[offset, offset + len)` after a bounds check
    /// (an address only: reading or writing through it is the caller's
    /// `unsafe` business).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when the range reaches past the end.
    fn host_range(&self, offset: usize, len: usize) -> Result<*mut u8, Error>;
}

/// `[offset, offset + len)` of the `size` bytes at `base`, bounds-checked.
fn host_range_of(
    base: NonNull<u8>,
    size: usize,
    offset: usize,
    len: usize,
) -> Result<*mut u8, Error> {
    match offset.checked_add(len) {
        // `offset <= end <= size`: inside (or one past) the memory; the
        // address is computed without a dereference.
        Some(end) if end <= size => Ok(base.as_ptr().wrapping_add(offset)),
        _ => Err(Error::OutOfBounds {
            offset: offset as u64,
            len: len as u64,
            size: size as u64,
        }),
    }
}

fn usize_len(len: u64) -> Result<usize, Error> {
    usize::try_from(len).map_err(|_| Error::OutOfBounds {
        offset: 0,
        len,
        size: usize::MAX as u64,
    })
}

// ------------------------------------------------------------ DeviceBuffer

/// Device memory allocated with `cuMemAlloc`, freed with `cuMemFree` when
/// dropped (or [`DeviceBuffer::destroy`]). Holds its context.
pub struct DeviceBuffer {
    res: Owned<AllocRes>,
}

struct AllocRes {
    ctx: Context,
    ptr: CUdeviceptr,
    len: usize,
}

// `AllocRes` holds a context clone and integers (a device address), all
// `Send + Sync`; so `DeviceBuffer` is `Send + Sync` without an unsafe impl:
// the driver API lets any thread use device memory, and `&DeviceBuffer`
// allows only calls the driver serialises.

impl Release for AllocRes {
    fn release(&mut self) -> Result<(), Error> {
        // Allocated by us, freed once (`Owned`).
        call::cuMemFree(TryBind(&self.ctx), self.ptr)
    }
    fn backend(&self) -> &Backend {
        self.ctx.backend()
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("context", &self.res.ctx.id())
            .field("ptr", &format_args!("{:#x}", self.res.ptr))
            .field("len", &self.res.len)
            .finish()
    }
}

impl sealed::Sealed for DeviceBuffer {}
impl DeviceMemory for DeviceBuffer {
    fn device_ptr(&self) -> CUdeviceptr {
        self.res.ptr
    }
    fn byte_len(&self) -> u64 {
        self.res.len as u64
    }
    fn context(&self) -> &Context {
        &self.res.ctx
    }
}

impl DeviceBuffer {
    /// Allocates `len` bytes of device memory in `ctx` (`cuMemAlloc`).
    ///
    /// # Errors
    /// [`Error::Unsupported`] for `len == 0` (refused before the call: the
    /// driver answers `INVALID_VALUE`); [`Error::Driver`] from `cuMemAlloc`
    /// (e.g. `OUT_OF_MEMORY`).
    pub fn new(ctx: &Context, len: usize) -> Result<DeviceBuffer, Error> {
        if len == 0 {
            return Err(Error::Unsupported {
                operation: "DeviceBuffer::new",
                reason: "a device allocation needs at least one byte",
            });
        }
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a local the driver writes one device address to.
        unsafe { call::cuMemAlloc(Bind(ctx), &mut ptr, len) }?;
        Ok(DeviceBuffer {
            res: Owned::new(AllocRes {
                ctx: ctx.clone(),
                ptr,
                len,
            }),
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.res.len
    }

    /// Always `false` (a buffer has at least one byte); for clippy's
    /// `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.res.len == 0
    }

    /// The device address (valid while `self` is alive).
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.res.ptr
    }

    /// The context it was allocated in.
    pub fn context(&self) -> &Context {
        &self.res.ctx
    }

    /// Copies `src` into the buffer at byte `offset` (`cuMemcpyHtoD`) and
    /// returns when the bytes have landed (the legacy default stream is
    /// synchronised after the copy, as in [`MappedBuffer::copy_from_host`]).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] before the call; [`Error::Driver`].
    pub fn copy_from_host(&self, offset: usize, src: &[u8]) -> Result<(), Error> {
        let dst = self.device_range(offset as u64, src.len() as u64)?;
        // SAFETY: `src` is readable for `src.len()` bytes, the length passed;
        // the device range lies in this live allocation (checked above).
        unsafe { call::cuMemcpyHtoD(Bind(&self.res.ctx), dst, src.as_ptr().cast(), src.len()) }?;
        call::cuStreamSynchronize(self.res.ctx.api(), ptr::null_mut())
    }

    /// Copies from the buffer at byte `offset` into `dst` (`cuMemcpyDtoH`);
    /// returns when the copy is done.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] before the call; [`Error::Driver`].
    pub fn copy_to_host(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        let src = self.device_range(offset as u64, dst.len() as u64)?;
        // SAFETY: `dst` is writable for `dst.len()` bytes, the length passed;
        // the device range lies in this live allocation (checked above).
        unsafe { call::cuMemcpyDtoH(Bind(&self.res.ctx), dst.as_mut_ptr().cast(), src, dst.len()) }
    }

    /// Sets every byte to `value` (`cuMemsetD8`, legacy default stream).
    pub fn fill(&self, value: u8) -> Result<(), Error> {
        // The whole live allocation is written, nothing past it.
        call::cuMemsetD8(Bind(&self.res.ctx), self.res.ptr, value, self.res.len)
    }

    /// Queues on `stream` a copy of `len` bytes from `src` at `src_offset`
    /// into this buffer at `offset` (`cuMemcpyHtoDAsync` from the
    /// page-locked host address, a [`PinnedHostBuffer`] or a
    /// [`RegisteredHostMemory`]: the copy engines read host memory
    /// directly).
    ///
    /// # Safety
    /// Until the copy completed on `stream` (an event recorded after it
    /// completed, or the stream synchronised): `src` and `self` stay alive,
    /// nothing writes `src`'s source bytes (host views included), and
    /// nothing reads or writes this buffer's destination bytes.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] before the call; [`Error::Driver`].
    pub unsafe fn copy_from_pinned_async(
        &self,
        offset: usize,
        src: &dyn PageLockedMemory,
        src_offset: usize,
        len: usize,
        stream: &Stream,
    ) -> Result<(), Error> {
        let dst = self.device_range(offset as u64, len as u64)?;
        let host = src.host_range(src_offset, len)?;
        // SAFETY: `host` is `len` readable bytes of a live pinned allocation
        // (checked); the caller keeps it unchanged and alive until the copy
        // completes (this function's contract); `dst` lies in this buffer.
        unsafe {
            call::cuMemcpyHtoDAsync(
                Current(stream.context()),
                dst,
                host.cast_const().cast(),
                len,
                stream.as_raw(),
            )
        }
    }

    /// Queues on `stream` a copy of `len` bytes of this buffer at `offset`
    /// into `dst` at `dst_offset` (`cuMemcpyDtoHAsync` to the page-locked
    /// host address).
    ///
    /// # Safety
    /// Until the copy completed on `stream`: `dst` and `self` stay alive,
    /// nothing reads or writes `dst`'s destination bytes (host views
    /// included), and nothing writes this buffer's source bytes.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] before the call; [`Error::Driver`].
    pub unsafe fn copy_to_pinned_async(
        &self,
        offset: usize,
        dst: &dyn PageLockedMemory,
        dst_offset: usize,
        len: usize,
        stream: &Stream,
    ) -> Result<(), Error> {
        let src = self.device_range(offset as u64, len as u64)?;
        let host = dst.host_range(dst_offset, len)?;
        // SAFETY: `host` is `len` writable bytes of a live pinned allocation
        // (checked); the caller keeps it untouched and alive until the copy
        // completes (this function's contract); `src` lies in this buffer.
        unsafe {
            call::cuMemcpyDtoHAsync(
                Current(stream.context()),
                host.cast(),
                src,
                len,
                stream.as_raw(),
            )
        }
    }

    /// Frees now (`cuMemFree`) and reports the driver's answer
    /// (`DEINITIALIZED` counts as success).
    pub fn destroy(self) -> Result<(), Error> {
        self.res.destroy()
    }
}

// -------------------------------------------------------- PinnedHostBuffer

/// Page-locked host memory mapped into the device (`cuMemHostAlloc` with
/// `DEVICEMAP | PORTABLE`), freed with `cuMemFreeHost` when dropped.
///
/// The host reads and writes it through [`as_slice`](Self::as_slice) /
/// [`as_mut_slice`](Self::as_mut_slice) (or [`atomic_u64`](Self::atomic_u64)
/// for values the device changes meanwhile); kernels reach it through its
/// device address (zero-copy over the bus), copies through either. See the
/// [module documentation](self) for why the views are safe.
pub struct PinnedHostBuffer {
    res: Owned<HostRes>,
}

struct HostRes {
    ctx: Context,
    host: NonNull<u8>,
    device: CUdeviceptr,
    len: usize,
}

// SAFETY: `HostRes` owns a pinned allocation (a plain pointer to memory no
// other value owns) and a context clone; the memory may be used from any
// thread, and the driver serialises the free. `Sync`: `&PinnedHostBuffer`
// gives atomic views only (byte views need `&mut`), which may be used from
// several threads at once (module docs).
unsafe impl Send for HostRes {}
// SAFETY: see above.
unsafe impl Sync for HostRes {}

impl Release for HostRes {
    fn release(&mut self) -> Result<(), Error> {
        // SAFETY: `host` is the start of the allocation `cuMemHostAlloc` made,
        // freed once (`Owned`); no view outlives `self` (they borrow it).
        unsafe { call::cuMemFreeHost(TryBind(&self.ctx), self.host.as_ptr().cast()) }
    }
    fn backend(&self) -> &Backend {
        self.ctx.backend()
    }
}

impl std::fmt::Debug for PinnedHostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedHostBuffer")
            .field("context", &self.res.ctx.id())
            .field("host", &self.res.host)
            .field("device", &format_args!("{:#x}", self.res.device))
            .field("len", &self.res.len)
            .finish()
    }
}

impl sealed::Sealed for PinnedHostBuffer {}
impl DeviceMemory for PinnedHostBuffer {
    fn device_ptr(&self) -> CUdeviceptr {
        self.res.device
    }
    fn byte_len(&self) -> u64 {
        self.res.len as u64
    }
    fn context(&self) -> &Context {
        &self.res.ctx
    }
}

impl PinnedHostBuffer {
    /// Allocates `len` bytes of pinned host memory mapped into the device
    /// (`cuMemHostAlloc(DEVICEMAP | PORTABLE)`, then
    /// `cuMemHostGetDevicePointer`), zero-filled.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for `len == 0` (refused before the call);
    /// [`Error::Driver`] from either call (the allocation is freed if the
    /// second fails).
    pub fn new(ctx: &Context, len: usize) -> Result<PinnedHostBuffer, Error> {
        if len == 0 {
            return Err(Error::Unsupported {
                operation: "PinnedHostBuffer::new",
                reason: "a pinned allocation needs at least one byte",
            });
        }
        let mut host: *mut c_void = ptr::null_mut();
        // SAFETY: `host` is a local the driver writes one pointer to.
        unsafe {
            call::cuMemHostAlloc(
                Bind(ctx),
                &mut host,
                len,
                CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE,
            )
        }?;
        let Some(host) = NonNull::new(host.cast::<u8>()) else {
            return Err(Error::Driver {
                call: "cuMemHostAlloc",
                code: tegra_interop_core::CuResult::UNKNOWN,
            });
        };
        let mut buffer = PinnedHostBuffer {
            res: Owned::new(HostRes {
                ctx: ctx.clone(),
                host,
                device: 0,
                len,
            }),
        };
        let mut device: CUdeviceptr = 0;
        // SAFETY: `device` is a local the driver writes one address to;
        // `host` is the start of the live allocation just made.
        // On failure `buffer` is dropped, which frees the allocation.
        unsafe {
            call::cuMemHostGetDevicePointer(Bind(ctx), &mut device, host.as_ptr().cast(), 0)
        }?;
        buffer.res.get_mut().device = device;
        buffer.as_mut_slice().fill(0);
        Ok(buffer)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.res.len
    }

    /// Always `false` (a buffer has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.res.len == 0
    }

    /// The device address of the first byte (for kernels and copies).
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.res.device
    }

    /// The host address of the first byte (valid while `self` is alive).
    /// Reading or writing through it is the caller's `unsafe` business; the
    /// views below are the safe way.
    pub fn host_ptr(&self) -> *mut u8 {
        self.res.host.as_ptr()
    }

    /// The context it was allocated in.
    pub fn context(&self) -> &Context {
        &self.res.ctx
    }

    fn host_range(&self, offset: usize, len: usize) -> Result<*mut u8, Error> {
        host_range_of(self.res.host, self.res.len, offset, len)
    }

    /// The bytes, read by the host. Sound under the module's rule: no GPU
    /// work queued through the `unsafe` queue calls writes them until it
    /// completed (their callers promised it). Takes `&mut self` so that no
    /// atomic view ([`atomic_u64`](Self::atomic_u64), which needs only
    /// `&self`) can write while the bytes are read; the `&[u8]` it gives is
    /// `Sync` (split it between threads to read in parallel).
    pub fn as_slice(&mut self) -> &[u8] {
        // SAFETY: the allocation holds `len` initialised bytes (zero-filled
        // at creation) for as long as `self` lives; `&mut self` excludes
        // host writers (atomic views) for the borrow; device writes are
        // excluded by the queue calls' contracts (module docs).
        unsafe { std::slice::from_raw_parts(self.res.host.as_ptr(), self.res.len) }
    }

    /// The bytes, written by the host: an exclusive borrow, so no other
    /// host view exists meanwhile; GPU work is excluded as for
    /// [`as_slice`](Self::as_slice).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`, and `&mut self` excludes every other
        // host view for the borrow.
        unsafe { std::slice::from_raw_parts_mut(self.res.host.as_ptr(), self.res.len) }
    }

    /// The `index`-th 8-byte word as an atomic, for values the device
    /// updates while the host reads them (a kernel's `atomicAdd` on a
    /// counter); usable at any time.
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] when the word is past the end.
    pub fn atomic_u64(&self, index: usize) -> Result<&AtomicU64, Error> {
        let offset = index.saturating_mul(8);
        let p = self.host_range(offset, 8)?;
        // SAFETY: `p` is 8-aligned (the allocation is page-aligned, `offset`
        // a multiple of 8) and 8 bytes inside the live allocation, which
        // outlives the borrow; all concurrent accesses the module allows to
        // this word are atomic (the device's atomics, other atomic views).
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }

    /// Frees now (`cuMemFreeHost`) and reports the driver's answer.
    pub fn destroy(self) -> Result<(), Error> {
        self.res.destroy()
    }
}

impl PageLockedMemory for PinnedHostBuffer {
    fn host_range(&self, offset: usize, len: usize) -> Result<*mut u8, Error> {
        PinnedHostBuffer::host_range(self, offset, len)
    }
}

// ---------------------------------------------------- RegisteredHostMemory

/// What [`RegisteredHostMemory::register`] page-locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostRegistration {
    /// Ordinary memory of the process (`PORTABLE | DEVICEMAP`).
    Memory,
    /// Memory of a device mapped into the process, such as a PCIe BAR or
    /// another driver's mapping (`PORTABLE | DEVICEMAP | IOMEMORY`).
    IoMemory,
}

impl HostRegistration {
    /// The `CU_MEMHOSTREGISTER_*` flags passed.
    pub fn flags(self) -> u32 {
        let base = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP;
        match self {
            HostRegistration::Memory => base,
            HostRegistration::IoMemory => base | CU_MEMHOSTREGISTER_IOMEMORY,
        }
    }
}

/// Host memory the caller owns, page-locked in place and mapped into the
/// device (`cuMemHostRegister_v2` with the flags of a
/// [`HostRegistration`], then `cuMemHostGetDevicePointer`), and
/// unregistered (`cuMemHostUnregister`) when dropped or
/// [`destroy`](Self::destroy)ed. The memory itself is never freed here.
///
/// The copy engines then read and write it as they do a
/// [`PinnedHostBuffer`] ([`DeviceBuffer::copy_from_pinned_async`],
/// [`DeviceBuffer::copy_to_pinned_async`], [`Stream::copy_async`] through
/// its device address); whether a given mapping can be registered is the
/// driver's answer (another driver's mapping may be refused). There are
/// no host views: the owner of the memory reads and writes it, ordered
/// against queued GPU work by the queue calls' contracts.
pub struct RegisteredHostMemory {
    res: Owned<RegisteredRes>,
}

struct RegisteredRes {
    ctx: Context,
    host: NonNull<u8>,
    device: CUdeviceptr,
    len: usize,
}

// SAFETY: `RegisteredRes` holds an address (never dereferenced here) and a
// context clone; the driver lets any thread use or unregister page-locked
// memory, and serialises the unregistration.
unsafe impl Send for RegisteredRes {}
// SAFETY: see above; `&RegisteredHostMemory` gives out addresses only.
unsafe impl Sync for RegisteredRes {}

impl Release for RegisteredRes {
    fn release(&mut self) -> Result<(), Error> {
        // SAFETY: `host` is the start of the range this value registered,
        // unregistered once (`Owned`); the memory is still mapped (the
        // registration's contract).
        unsafe { call::cuMemHostUnregister(TryBind(&self.ctx), self.host.as_ptr().cast()) }
    }
    fn backend(&self) -> &Backend {
        self.ctx.backend()
    }
}

impl std::fmt::Debug for RegisteredHostMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredHostMemory")
            .field("context", &self.res.ctx.id())
            .field("host", &self.res.host)
            .field("device", &format_args!("{:#x}", self.res.device))
            .field("len", &self.res.len)
            .finish()
    }
}

impl sealed::Sealed for RegisteredHostMemory {}
impl DeviceMemory for RegisteredHostMemory {
    fn device_ptr(&self) -> CUdeviceptr {
        self.res.device
    }
    fn byte_len(&self) -> u64 {
        self.res.len as u64
    }
    fn context(&self) -> &Context {
        &self.res.ctx
    }
}

impl PageLockedMemory for RegisteredHostMemory {
    fn host_range(&self, offset: usize, len: usize) -> Result<*mut u8, Error> {
        host_range_of(self.res.host, self.res.len, offset, len)
    }
}

/// The host's page size (`sysconf(_SC_PAGESIZE)`; 4096 where the system
/// does not say): the unit the driver page-locks in, for a
/// [`RegisteredHostMemory`] made of whole pages.
pub fn host_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

impl RegisteredHostMemory {
    /// Page-locks the `len` bytes at `host` and maps them into the device
    /// (`cuMemHostRegister_v2(host, len, kind.flags())`, then
    /// `cuMemHostGetDevicePointer`).
    ///
    /// # Safety
    /// - `host..host + len` is memory of this process, mapped readable and
    ///   writable, and stays so (not unmapped, freed or remapped) until this
    ///   value is gone and every GPU work queued on it completed;
    /// - GPU work queued on it reads and writes those bytes behind Rust's
    ///   back: while such work runs, nothing may hold a Rust reference to
    ///   the bytes it writes (or a `&mut` to the bytes it reads); the queue
    ///   calls' contracts say until when.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for `len == 0` (refused before the call);
    /// [`Error::Driver`] from either call (the registration is undone if
    /// the second fails), keeping the raw code: e.g.
    /// `HOST_MEMORY_ALREADY_REGISTERED` for a range that overlaps one
    /// registered already, or the driver's refusal of a mapping it cannot
    /// page-lock.
    pub unsafe fn register(
        ctx: &Context,
        host: NonNull<u8>,
        len: usize,
        kind: HostRegistration,
    ) -> Result<RegisteredHostMemory, Error> {
        if len == 0 {
            return Err(Error::Unsupported {
                operation: "RegisteredHostMemory::register",
                reason: "a registration needs at least one byte",
            });
        }
        // SAFETY: the caller vouches for `len` mapped bytes at `host` that
        // outlive the registration (this function's contract).
        unsafe { call::cuMemHostRegister(Bind(ctx), host.as_ptr().cast(), len, kind.flags()) }?;
        let mut memory = RegisteredHostMemory {
            res: Owned::new(RegisteredRes {
                ctx: ctx.clone(),
                host,
                device: 0,
                len,
            }),
        };
        let mut device: CUdeviceptr = 0;
        // SAFETY: `device` is a local the driver writes one address to;
        // `host` is the start of the range just registered. On failure
        // `memory` is dropped, which unregisters it.
        unsafe {
            call::cuMemHostGetDevicePointer(Bind(ctx), &mut device, host.as_ptr().cast(), 0)
        }?;
        memory.res.get_mut().device = device;
        Ok(memory)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.res.len
    }

    /// Always `false` (a registration has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.res.len == 0
    }

    /// The device address of the first byte (for kernels and copies).
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.res.device
    }

    /// The host address of the first byte (the caller's memory).
    pub fn host_ptr(&self) -> *mut u8 {
        self.res.host.as_ptr()
    }

    /// The context it was registered in.
    pub fn context(&self) -> &Context {
        &self.res.ctx
    }

    /// Unregisters now (`cuMemHostUnregister`) and reports the driver's
    /// answer. The memory stays the caller's, mapped as before.
    pub fn destroy(self) -> Result<(), Error> {
        self.res.destroy()
    }
}

// ---------------------------------------------------------- stream copies

impl Stream {
    /// Queues a copy of `len` bytes from `src` at `src_offset` to `dst` at
    /// `dst_offset` (`cuMemcpyDtoDAsync` between device addresses: device
    /// buffers, mapped imports, pinned host memory through its device
    /// address; the copy engines carry it).
    ///
    /// # Safety
    /// Until the copy completed on this stream: both stay alive, nothing
    /// writes the source bytes, and nothing reads or writes the destination
    /// bytes (host views of pinned memory included).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] before the call; [`Error::Driver`].
    pub unsafe fn copy_async(
        &self,
        dst: &dyn DeviceMemory,
        dst_offset: u64,
        src: &dyn DeviceMemory,
        src_offset: u64,
        len: u64,
    ) -> Result<(), Error> {
        let d = dst.device_range(dst_offset, len)?;
        let s = src.device_range(src_offset, len)?;
        let n = usize_len(len)?;
        // Both ranges lie in live buffers (checked); the caller keeps them
        // alive and untouched until the copy completes.
        call::cuMemcpyDtoDAsync(Current(self.context()), d, s, n, self.as_raw())
    }
}
