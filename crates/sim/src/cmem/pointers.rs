//! The per-call wrappers of the C caller's pointers: [`CMut`] for a
//! `*mut T`, [`CPtr`] for a `*const T`, [`CIn`] for a value read from the
//! caller whose own pointer fields the contract covers, [`CArr`] for an
//! array of such values, and the [`Handle`] alias for pointers that are
//! only ever handle values.
//!
//! Unsafe code is allowed here (as in all of `cmem`): the constructors are
//! `unsafe fn`s, and the reads, writes, strings and slices dereference the
//! caller's pointers under the contract set out in the `cmem` module doc.
//! The value field of [`CIn`] is `pub(super)` so that `cmem::fields` can
//! read the structures it holds; outside `cmem` it is private, as before.

#![allow(unsafe_code)]

use core::ffi::{c_char, CStr};
use core::marker::PhantomData;

use super::Plain;

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
/// point's C contract covers as well (see the `cmem` module doc).
#[derive(Clone, Copy)]
pub(crate) struct CIn<'c, T> {
    pub(super) v: T,
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
