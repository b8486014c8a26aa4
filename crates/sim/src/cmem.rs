//! The one place where an entry-point body reads or writes memory through a
//! pointer or device address a C caller handed in (out-pointers,
//! in-descriptors, arrays, key/value pairs, names, the bytes of a copy or a
//! memset; the simulator's own shared memory is `shm`/`export`). Every entry-point body goes through these helpers
//! instead of dereferencing a raw pointer itself.
//!
//! # Safety
//! Each function is `unsafe` with one contract: the pointer it gets is NULL
//! (where the function checks for NULL) or valid for the access described,
//! which is what the C caller of the entry point owes by the entry point's
//! C contract. The bodies pass pointers straight from the trampolines.

use core::ffi::{c_char, CStr};

/// Writes `v` through `p`; `false` (nothing written) when `p` is NULL.
///
/// # Safety
/// `p` is NULL or valid for a write of `T`.
pub(crate) unsafe fn write<T>(p: *mut T, v: T) -> bool {
    if p.is_null() {
        return false;
    }
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { p.write(v) };
    true
}

/// Reads through `p`; `None` when `p` is NULL.
///
/// # Safety
/// `p` is NULL or valid for a read of `T`.
pub(crate) unsafe fn read<T: Copy>(p: *const T) -> Option<T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null, and valid for reads by the caller's contract.
    Some(unsafe { p.read() })
}

/// Reads element `i` of the caller's array `p`.
///
/// # Safety
/// `p` points at an array of more than `i` readable `T`s.
pub(crate) unsafe fn read_at<T: Copy>(p: *const T, i: usize) -> T {
    // SAFETY: in bounds by the caller's contract.
    unsafe { p.add(i).read() }
}

/// Writes element `i` of the caller's array `p`.
///
/// # Safety
/// `p` points at an array of more than `i` writable `T`s.
pub(crate) unsafe fn write_at<T>(p: *mut T, i: usize, v: T) {
    // SAFETY: in bounds by the caller's contract.
    unsafe { p.add(i).write(v) }
}

/// The `len` bytes at `p`, borrowed for the call.
///
/// # Safety
/// `p` is valid for reads of `len` bytes that nobody writes during the call.
pub(crate) unsafe fn bytes<'a>(p: *const u8, len: usize) -> &'a [u8] {
    // SAFETY: by the caller's contract.
    unsafe { std::slice::from_raw_parts(p, len) }
}

/// Copies `src` to `dst`.
///
/// # Safety
/// `dst` is valid for writes of `src.len()` bytes and does not overlap `src`.
pub(crate) unsafe fn copy_to(dst: *mut u8, src: &[u8]) {
    // SAFETY: by the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
}

/// Copies `n` bytes from `src` to `dst` (the ranges may overlap).
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `n` bytes.
pub(crate) unsafe fn copy(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: by the caller's contract.
    unsafe { std::ptr::copy(src, dst, n) }
}

/// Sets `n` bytes at `dst` to `v`.
///
/// # Safety
/// `dst` is valid for writes of `n` bytes.
pub(crate) unsafe fn fill(dst: *mut u8, v: u8, n: usize) {
    // SAFETY: by the caller's contract.
    unsafe { std::ptr::write_bytes(dst, v, n) }
}

/// The NUL-terminated string at `p`.
///
/// # Safety
/// `p` is non-null and points at a NUL-terminated string that lives for the call.
pub(crate) unsafe fn c_str<'a>(p: *const c_char) -> &'a CStr {
    // SAFETY: by the caller's contract.
    unsafe { CStr::from_ptr(p) }
}
