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
//! The wrappers live in `pointers`, the accessors for pointer and union
//! fields of the C structures (and the key/value pair trait) in `fields`,
//! and what is kept for or handed to C beyond one call's pointers (host
//! callbacks, malloc'ed descriptors, EGL frame plane words) in `handout`.
//! This file holds [`Plain`] and [`FromC`], and re-exports the rest.
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

mod fields;
mod handout;
mod pointers;

pub(crate) use fields::KeyValuePair;
pub(crate) use handout::{egl_plane_words, set_egl_plane_words, HandedOut, HostCallback, HostFn};
pub(crate) use pointers::{CArr, CIn, CMut, CPtr, Handle};

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
    f32,
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
