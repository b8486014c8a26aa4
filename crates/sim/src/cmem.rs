//! The C caller's memory: the one place where the simulator dereferences a
//! pointer a C caller handed in (out-pointers, in-descriptors, arrays,
//! key/value pairs, names, the host bytes of a copy), and where it hands
//! malloc'ed descriptors out to C.
//!
//! The generated trampolines (`crate::trampolines`) turn every C argument
//! into its body type with [`FromC`]: integers and enums stay as they are,
//! a `*mut T` becomes a [`CMut`], a `*const T` a [`CPtr`], a host callback a
//! [`HostFn`]. The wrappers are made only there, by an `unsafe fn`, under
//! the entry point's C contract; the bodies use their safe methods:
//! `is_null`, `write`/`read` of single elements (`false`/`None` for NULL),
//! `addr` for pointers that are handles and never dereferenced. Pointers
//! whose extent is another argument (an array and its count, a buffer and
//! its size) are paired into slices in `crate::abi`, with the unsafe
//! [`CPtr::slice`] / [`CMut::slice_mut`] defined here.
//!
//! Values read from the caller's memory that themselves hold pointers the C
//! contract covers (a key/value pair's value, a semaphore parameter block's
//! fence, a 3D copy's host sides) are read as [`CIn`]; only a `CIn` gives
//! access to what such a field points at.
//!
//! # Safety
//! The unsafe code here relies on one contract: the C caller of an entry
//! point keeps the entry point's documented C contract for the duration of
//! the call (each pointer argument is NULL where the entry point allows it,
//! or valid for the accesses the contract describes, including the pointer
//! fields of the structures it points at, and nobody else writes what the
//! call reads or reads what it writes meanwhile). The trampolines promise
//! that contract when they make a wrapper ([`FromC::into_body`]); the wrappers
//! are `!Send` and carry the lifetime of the call they were made for.
//! [`Plain`] marks the C data types whose values may be read or written
//! through a wrapper (opaque handle targets are not among them, so a handle
//! can never be dereferenced).

#![allow(unsafe_code)]

use core::ffi::{c_char, c_int, c_void, CStr};
use core::marker::PhantomData;
use std::collections::HashMap;

use tegra_interop_sys::cuda::{
    CUdevice_attribute, CUeglFrame, CUhostFn, CUmemRangeHandleType, CUresult, CUuuid,
    CUDA_EXTERNAL_MEMORY_BUFFER_DESC, CUDA_EXTERNAL_MEMORY_HANDLE_DESC,
    CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC, CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC,
    CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS, CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS, CUDA_MEMCPY3D,
};
use tegra_interop_sys::nvsci::{
    NvSciBufAttrKeyValuePair, NvSciBufAttrValAccessPerm, NvSciBufObjIpcExportDescriptor,
    NvSciIpcEndpointInfo, NvSciSyncAccessPerm, NvSciSyncAttrKeyValuePair, NvSciSyncFence,
    NvSciSyncFenceIpcExportDescriptor, NvSciSyncObjIpcExportDescriptor,
};

/// C data that may be read or written through a caller pointer.
///
/// # Safety
/// Every bit pattern a C caller can hand in under the entry points' C
/// contracts is a valid value, and the type is not an opaque handle target.
pub(crate) unsafe trait Plain: Copy {}

macro_rules! plain {
    ($($t:ty),* $(,)?) => { $(
        // SAFETY: plain C data (integers, C structs of integers and pointers).
        unsafe impl Plain for $t {}
    )* };
}

plain!(
    u8,
    i8,
    u32,
    i32,
    u64,
    i64,
    usize,
    bool,
    CUuuid,
    CUeglFrame,
    CUDA_MEMCPY3D,
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC,
    CUDA_EXTERNAL_MEMORY_BUFFER_DESC,
    CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC,
    CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC,
    CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS,
    CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS,
    NvSciSyncFence,
    NvSciBufAttrKeyValuePair,
    NvSciSyncAttrKeyValuePair,
    NvSciIpcEndpointInfo,
    NvSciBufObjIpcExportDescriptor,
    NvSciSyncObjIpcExportDescriptor,
    NvSciSyncFenceIpcExportDescriptor,
);
// SAFETY: a pointer stored as a value (an out-pointer to a handle); any bit
// pattern is a valid raw pointer.
unsafe impl<T> Plain for *mut T {}
// SAFETY: as for `*mut T`.
unsafe impl<T> Plain for *const T {}

/// A C argument as the body gets it.
pub(crate) trait FromC {
    /// The body's type for this argument, for a call of lifetime `'c`.
    type Body<'c>;
    /// Wraps the argument.
    ///
    /// # Safety
    /// `self` comes from the C caller of an entry point that keeps its C
    /// contract for `'c` (the duration of the call).
    unsafe fn into_body<'c>(self) -> Self::Body<'c>;
}

macro_rules! by_value {
    ($($t:ty),* $(,)?) => { $(
        impl FromC for $t {
            type Body<'c> = $t;
            unsafe fn into_body<'c>(self) -> Self::Body<'c> {
                self
            }
        }
    )* };
}

by_value!(
    CUeglFrame,
    u8,
    i32,
    u32,
    u64,
    i64,
    usize,
    bool,
    CUresult,
    CUdevice_attribute,
    CUmemRangeHandleType,
    NvSciBufAttrValAccessPerm,
    NvSciSyncAccessPerm,
);

impl<T> FromC for *mut T {
    type Body<'c> = CMut<'c, T>;
    unsafe fn into_body<'c>(self) -> CMut<'c, T> {
        // SAFETY: forwarded contract.
        unsafe { CMut::new(self) }
    }
}

impl<T> FromC for *const T {
    type Body<'c> = CPtr<'c, T>;
    unsafe fn into_body<'c>(self) -> CPtr<'c, T> {
        // SAFETY: forwarded contract.
        unsafe { CPtr::new(self) }
    }
}

impl FromC for CUhostFn {
    type Body<'c> = HostFn;
    unsafe fn into_body<'c>(self) -> Self::Body<'c> {
        HostFn(self)
    }
}

/// What a pointer type points at (for [`Handle`]).
pub(crate) trait Pointee {
    type T;
}
impl<T> Pointee for *mut T {
    type T = T;
}

/// A handle argument (a C pointer type that is never dereferenced): the
/// body takes its value with [`CMut::addr`].
pub(crate) type Handle<'c, P> = CMut<'c, <P as Pointee>::T>;

/// A `*mut T` of the C caller, for one call.
pub(crate) struct CMut<'c, T> {
    raw: *mut T,
    _call: PhantomData<(&'c (), *mut T)>,
}

impl<T> Clone for CMut<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for CMut<'_, T> {}

impl<'c, T> CMut<'c, T> {
    /// # Safety
    /// `raw` is NULL or valid for what the entry point's C contract says of
    /// it, for `'c`.
    pub(crate) unsafe fn new(raw: *mut T) -> Self {
        CMut {
            raw,
            _call: PhantomData,
        }
    }

    /// A Rust reference as a caller pointer (for a body calling another).
    pub(crate) fn from_mut(r: &'c mut T) -> Self {
        CMut {
            raw: r,
            _call: PhantomData,
        }
    }

    pub(crate) fn is_null(self) -> bool {
        self.raw.is_null()
    }

    /// The address (for pointers that are handles, never dereferenced).
    pub(crate) fn addr(self) -> usize {
        self.raw as usize
    }

    /// The raw pointer (a value only: nothing is dereferenced through it).
    pub(crate) fn as_raw(self) -> *mut T {
        self.raw
    }

    /// The same pointer, read-only.
    pub(crate) fn as_const(self) -> CPtr<'c, T> {
        CPtr {
            raw: self.raw,
            _call: PhantomData,
        }
    }

    /// The same pointer as a `U`.
    ///
    /// # Safety
    /// The entry point's C contract makes the pointer valid for a `U`.
    pub(crate) unsafe fn cast<U>(self) -> CMut<'c, U> {
        CMut {
            raw: self.raw.cast(),
            _call: PhantomData,
        }
    }

    /// The `n` elements at the pointer; `None` for NULL (an empty slice for
    /// `n == 0`, whatever the pointer).
    ///
    /// # Safety
    /// By the entry point's C contract the pointer (when not NULL) points at
    /// `n` writable `T`s that nothing else accesses during the call.
    pub(crate) unsafe fn slice_mut(self, n: usize) -> Option<&'c mut [T]>
    where
        T: Plain,
    {
        if self.raw.is_null() {
            return None;
        }
        if n == 0 {
            return Some(&mut []);
        }
        // SAFETY: non-null, `n` elements by the caller's contract.
        Some(unsafe { core::slice::from_raw_parts_mut(self.raw, n) })
    }
}

impl<'c, T: Plain> CMut<'c, T> {
    /// Reads the value of an in/out pointer (e.g. the connection handle a
    /// `CUeglStreamConnection*` carries in); `None` for NULL.
    pub(crate) fn read(self) -> Option<T> {
        if self.raw.is_null() {
            return None;
        }
        // SAFETY: non-null, and valid for reads of `T` by the contract
        // promised in `new` (in/out pointers are readable and writable).
        Some(unsafe { self.raw.read_unaligned() })
    }

    /// Writes `v`; `false` (nothing written) for NULL.
    pub(crate) fn write(self, v: T) -> bool {
        if self.raw.is_null() {
            return false;
        }
        // SAFETY: non-null, and valid for a write of `T` by the contract
        // promised in `new`.
        unsafe { self.raw.write_unaligned(v) };
        true
    }
}

/// A `*const T` of the C caller, for one call.
pub(crate) struct CPtr<'c, T> {
    raw: *const T,
    _call: PhantomData<(&'c (), *const T)>,
}

impl<T> Clone for CPtr<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for CPtr<'_, T> {}

impl<'c, T> CPtr<'c, T> {
    /// # Safety
    /// `raw` is NULL or valid for what the entry point's C contract says of
    /// it, for `'c`.
    pub(crate) unsafe fn new(raw: *const T) -> Self {
        CPtr {
            raw,
            _call: PhantomData,
        }
    }

    pub(crate) fn is_null(self) -> bool {
        self.raw.is_null()
    }

    /// The address (for pointers that are handles, never dereferenced).
    pub(crate) fn addr(self) -> usize {
        self.raw as usize
    }

    /// The `n` elements at the pointer; `None` for NULL (an empty slice for
    /// `n == 0`, whatever the pointer).
    ///
    /// # Safety
    /// By the entry point's C contract the pointer (when not NULL) points at
    /// `n` readable `T`s that nobody writes during the call.
    pub(crate) unsafe fn slice(self, n: usize) -> Option<&'c [T]>
    where
        T: Plain,
    {
        if self.raw.is_null() {
            return None;
        }
        if n == 0 {
            return Some(&[]);
        }
        // SAFETY: non-null, `n` elements by the caller's contract.
        Some(unsafe { core::slice::from_raw_parts(self.raw, n) })
    }

    /// The same pointer as a `U`.
    ///
    /// # Safety
    /// The entry point's C contract makes the pointer valid for a `U`.
    pub(crate) unsafe fn cast<U>(self) -> CPtr<'c, U> {
        CPtr {
            raw: self.raw.cast(),
            _call: PhantomData,
        }
    }
}

impl<'c, T: Plain> CPtr<'c, T> {
    /// Reads the value; `None` for NULL.
    pub(crate) fn read(self) -> Option<T> {
        if self.raw.is_null() {
            return None;
        }
        // SAFETY: non-null, and valid for a read of `T` by the contract
        // promised in `new`.
        Some(unsafe { self.raw.read_unaligned() })
    }

    /// Reads the value as one whose pointer fields the contract covers too.
    pub(crate) fn read_in(self) -> Option<CIn<'c, T>> {
        self.read().map(|v| CIn {
            v,
            _call: PhantomData,
        })
    }
}

impl<'c> CPtr<'c, c_char> {
    /// The NUL-terminated string at the pointer; `None` for NULL.
    pub(crate) fn c_str(self) -> Option<&'c CStr> {
        if self.raw.is_null() {
            return None;
        }
        // SAFETY: the C contract of the entry points taking a string
        // argument: a NUL-terminated string that lives for the call.
        Some(unsafe { CStr::from_ptr(self.raw) })
    }
}

/// A value read from the C caller's memory, whose pointer fields the entry
/// point's C contract covers as well (see the module doc).
#[derive(Clone, Copy)]
pub(crate) struct CIn<'c, T> {
    v: T,
    _call: PhantomData<CPtr<'c, T>>,
}

impl<T> core::ops::Deref for CIn<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.v
    }
}

/// A caller array (from `crate::abi`) whose elements hold pointers the
/// contract covers: only its elements, read as [`CIn`], reach them.
#[derive(Clone, Copy)]
pub(crate) struct CArr<'c, T> {
    s: &'c [T],
}

impl<'c, T: Plain> CArr<'c, T> {
    /// # Safety
    /// `s` is a caller array of the current call, read under the entry
    /// point's C contract (which covers its elements' pointer fields).
    pub(crate) unsafe fn new(s: &'c [T]) -> Self {
        CArr { s }
    }

    pub(crate) fn len(&self) -> usize {
        self.s.len()
    }

    /// Element `i`.
    pub(crate) fn get(&self, i: usize) -> Option<CIn<'c, T>> {
        self.s.get(i).map(|v| CIn {
            v: *v,
            _call: PhantomData,
        })
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = CIn<'c, T>> + 'c {
        self.s.iter().map(|v| CIn {
            v: *v,
            _call: PhantomData,
        })
    }
}

// ------------------------------------------------------------ pointer fields

impl<'c> CIn<'c, CUDA_EXTERNAL_MEMORY_HANDLE_DESC> {
    /// The union read as the fd (meaningful for the fd handle types).
    pub(crate) fn handle_fd(&self) -> c_int {
        // SAFETY: the union lies in caller memory that was read whole; every
        // bit pattern is a valid `c_int`.
        unsafe { self.v.handle.fd }
    }

    /// The union read as the NvSciBuf object (meaningful for NVSCIBUF).
    pub(crate) fn handle_nvscibuf(&self) -> usize {
        // SAFETY: as in `handle_fd`; any bit pattern is a valid raw pointer.
        unsafe { self.v.handle.nvSciBufObject as usize }
    }
}

impl<'c> CIn<'c, CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC> {
    /// The union read as the fd (meaningful for the fd handle types).
    pub(crate) fn handle_fd(&self) -> c_int {
        // SAFETY: as for the memory descriptor.
        unsafe { self.v.handle.fd }
    }

    /// The union read as the NvSciSync object (meaningful for NVSCISYNC).
    pub(crate) fn handle_nvscisync(&self) -> usize {
        // SAFETY: as for the memory descriptor.
        unsafe { self.v.handle.nvSciSyncObj as usize }
    }
}

impl<'c> CIn<'c, CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS> {
    /// The NvSciSync fence the signal writes (the C contract of
    /// `cuSignalExternalSemaphoresAsync`: NULL or a writable fence).
    pub(crate) fn nvsci_fence(&self) -> CMut<'c, NvSciSyncFence> {
        // SAFETY: reading a pointer member of a plain union (any bits are a
        // valid pointer); the contract covers what it points at.
        let p = unsafe { self.v.params.nvSciSync.fence };
        // SAFETY: the field's C contract, see above.
        unsafe { CMut::new(p.cast()) }
    }
}

impl<'c> CIn<'c, CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS> {
    /// The NvSciSync fence the wait reads (the C contract of
    /// `cuWaitExternalSemaphoresAsync`: NULL or a readable fence).
    pub(crate) fn nvsci_fence(&self) -> CPtr<'c, NvSciSyncFence> {
        // SAFETY: as for the signal parameters.
        let p = unsafe { self.v.params.nvSciSync.fence };
        // SAFETY: the field's C contract, see above.
        unsafe { CPtr::new(p.cast_const().cast()) }
    }
}

/// The C key/value pair of either NvSci half (`NvSciBufAttrKeyValuePair`,
/// `NvSciSyncAttrKeyValuePair`): the same record with a different key type.
///
/// # Safety
/// `value` returns the record's own value pointer and length fields.
pub(crate) unsafe trait KeyValuePair: Plain {
    /// The key's C value.
    fn key(&self) -> u32;
    /// The value pointer and length.
    fn value(&self) -> (*const c_void, usize);
    /// Sets the value pointer and length (read back by GetAttrs).
    fn set_value(&mut self, value: *const c_void, len: usize);
}

// SAFETY: `value` returns the record's fields.
unsafe impl KeyValuePair for NvSciBufAttrKeyValuePair {
    fn key(&self) -> u32 {
        self.key.0
    }
    fn value(&self) -> (*const c_void, usize) {
        (self.value, self.len)
    }
    fn set_value(&mut self, value: *const c_void, len: usize) {
        self.value = value;
        self.len = len;
    }
}

// SAFETY: `value` returns the record's fields.
unsafe impl KeyValuePair for NvSciSyncAttrKeyValuePair {
    fn key(&self) -> u32 {
        self.attrKey.0
    }
    fn value(&self) -> (*const c_void, usize) {
        (self.value, self.len)
    }
    fn set_value(&mut self, value: *const c_void, len: usize) {
        self.value = value;
        self.len = len;
    }
}

impl<'c, P: KeyValuePair> CIn<'c, P> {
    /// The value's bytes; `None` for a NULL value or a length of 0.
    pub(crate) fn value_bytes(&self) -> Option<&'c [u8]> {
        let (value, len) = self.v.value();
        if value.is_null() || len == 0 {
            return None;
        }
        // SAFETY: the C contract of SetAttrs: each pair's value points at
        // `len` readable bytes for the call.
        Some(unsafe { core::slice::from_raw_parts(value.cast::<u8>(), len) })
    }
}

/// Which side of a 3D copy.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side3D {
    Src,
    Dst,
}

impl<'c> CIn<'c, CUDA_MEMCPY3D> {
    /// A host side's base address: the host pointer, or the device field
    /// for a host pointer passed as a unified address.
    pub(crate) fn host_base(&self, side: Side3D) -> usize {
        let m = &self.v;
        let (host, dev) = match side {
            Side3D::Src => (m.srcHost as usize, m.srcDevice as usize),
            Side3D::Dst => (m.dstHost as usize, m.dstDevice as usize),
        };
        if host != 0 {
            host
        } else {
            dev
        }
    }

    /// The byte range `[first, end)` (from the host base) the copy touches
    /// on a host side, by the descriptor's own fields.
    fn host_span(&self, side: Side3D) -> Option<(usize, usize)> {
        let m = &self.v;
        let (w, h, d) = (m.WidthInBytes, m.Height.max(1), m.Depth.max(1));
        let (x, y, z, pitch, height) = match side {
            Side3D::Src => (m.srcXInBytes, m.srcY, m.srcZ, m.srcPitch, m.srcHeight),
            Side3D::Dst => (m.dstXInBytes, m.dstY, m.dstZ, m.dstPitch, m.dstHeight),
        };
        let pitch = if pitch == 0 { w } else { pitch };
        let height = if height == 0 { h } else { height };
        let slice = pitch.checked_mul(height)?;
        let first = z
            .checked_mul(slice)?
            .checked_add(y.checked_mul(pitch)?)?
            .checked_add(x)?;
        let last = z
            .checked_add(d - 1)?
            .checked_mul(slice)?
            .checked_add(y.checked_add(h - 1)?.checked_mul(pitch)?)?
            .checked_add(x)?
            .checked_add(w)?;
        Some((first, last))
    }

    fn host_row_ok(&self, side: Side3D, off: usize, n: usize) -> bool {
        let base = self.host_base(side);
        base != 0
            && self
                .host_span(side)
                .zip(off.checked_add(n))
                .is_some_and(|((first, end), e)| first <= off && e <= end)
    }

    /// Copies `out.len()` bytes at `off` (from the base) of the host source
    /// into `out`; `false` when that range is not inside what the
    /// descriptor describes.
    pub(crate) fn read_host_src(&self, off: usize, out: &mut [u8]) -> bool {
        if !self.host_row_ok(Side3D::Src, off, out.len()) {
            return false;
        }
        let p = (self.host_base(Side3D::Src) + off) as *const u8;
        // SAFETY: the C contract of cuMemcpy3D: the host source described by
        // the descriptor (base, pitch, height, offsets, extent) is readable;
        // the range was checked to lie inside it. `out` is our own buffer.
        unsafe { core::ptr::copy(p, out.as_mut_ptr(), out.len()) };
        true
    }

    /// Copies `data` to `off` (from the base) of the host destination;
    /// `false` when that range is not inside what the descriptor describes.
    pub(crate) fn write_host_dst(&self, off: usize, data: &[u8]) -> bool {
        if !self.host_row_ok(Side3D::Dst, off, data.len()) {
            return false;
        }
        let p = (self.host_base(Side3D::Dst) + off) as *mut u8;
        // SAFETY: as in `read_host_src`, for the writable destination.
        unsafe { core::ptr::copy(data.as_ptr(), p, data.len()) };
        true
    }
}

// ------------------------------------------------------------ host callbacks

/// A `CUhostFn` argument, not callable by itself (see [`HostCallback`]).
pub(crate) struct HostFn(pub(crate) CUhostFn);

/// A host function with its user pointer, as `cuLaunchHostFunc` queues it:
/// the C contract says it may be called once, from another thread.
pub(crate) struct HostCallback {
    f: unsafe extern "C" fn(*mut c_void),
    user: usize,
}

impl HostCallback {
    /// # Safety
    /// `f` may be called once with `user`, from any thread, at a later time
    /// (the C contract of `cuLaunchHostFunc`).
    pub(crate) unsafe fn new(f: unsafe extern "C" fn(*mut c_void), user: usize) -> Self {
        HostCallback { f, user }
    }

    /// Calls the function.
    pub(crate) fn call(self) {
        // SAFETY: promised in `new`.
        unsafe { (self.f)(self.user as *mut c_void) }
    }
}

// ------------------------------------------------------- descriptors for C

/// The blocks of C heap memory the simulator handed to callers and that
/// they have not freed yet (attribute-list descriptors, freed with the
/// library's `AttrListFreeDesc`), by address, each with a tag (which library
/// handed it out).
///
/// A block belongs to the caller from the moment it is handed out until the
/// caller gives it back: dropping the registry frees nothing (a block the
/// caller never frees stays allocated, as with the real library).
pub(crate) struct HandedOut<K> {
    live: HashMap<usize, K>,
}

impl<K> Default for HandedOut<K> {
    fn default() -> Self {
        HandedOut {
            live: HashMap::new(),
        }
    }
}

impl<K: Copy + PartialEq> HandedOut<K> {
    /// A malloc'ed copy of `bytes` (at least one byte), recorded under
    /// `tag`; its address, or `None` when malloc fails.
    pub(crate) fn copy_of(&mut self, bytes: &[u8], tag: K) -> Option<usize> {
        // SAFETY: plain allocation of at least one byte.
        let p = unsafe { libc::malloc(bytes.len().max(1)) }.cast::<u8>();
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` has room for `bytes.len()` bytes; the regions are distinct.
        unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
        self.live.insert(p as usize, tag);
        Some(p as usize)
    }

    /// Frees the block at `addr` if it was handed out under `tag` and not
    /// freed since; `false` (nothing freed) otherwise.
    pub(crate) fn free(&mut self, addr: usize, tag: K) -> bool {
        if self.live.get(&addr) != Some(&tag) {
            return false;
        }
        self.live.remove(&addr);
        // SAFETY: `addr` came from malloc in `copy_of` and was recorded
        // there; it is removed from the record here, so freed once.
        unsafe { libc::free(addr as *mut c_void) };
        true
    }

    /// How many blocks are out.
    pub(crate) fn len(&self) -> usize {
        self.live.len()
    }
}

/// The three plane words of an EGL frame: device pointers of a pitch frame
/// or `CUarray`s of an array frame (which one, `frameType` says).
pub(crate) fn egl_plane_words(f: &CUeglFrame) -> [usize; 3] {
    // SAFETY: both members of the union are three pointer-sized values, so
    // reading either as pointers reads initialised bytes (the frame was
    // written whole by a caller or by the simulator).
    let p = unsafe { f.frame.pPitch };
    [p[0] as usize, p[1] as usize, p[2] as usize]
}

/// Writes the three plane words of an EGL frame.
pub(crate) fn set_egl_plane_words(f: &mut CUeglFrame, words: [usize; 3]) {
    f.frame.pPitch = words.map(|w| w as *mut core::ffi::c_void);
}
