//! The one place the driver calls C: every entry point of the function
//! table and what must be true around those calls, split by topic. Each
//! file carries its own safety story:
//!
//! - [`wrappers`]: one crate-private function per entry point, generated
//!   from sys's lists (`call::`, `code::`, `require::`), and the call
//!   targets ([`Bind`], [`Init`], [`TryBind`], [`Current`]);
//! - [`batch`]: the C arrays of a semaphore batch call ([`Lowered`]);
//! - [`host_fn`]: `cuLaunchHostFunc` with a Rust closure (the trampoline);
//! - [`nvsci`]: reading attribute values and export descriptors the NvSci
//!   libraries point us to;
//! - [`egl`]: the plane words of an EGL frame (a C union).
//!
//! The descriptor-level operating-system calls (duplicates, ownership,
//! polling) are the crate's `fd` module, and each type's `Send`/`Sync`
//! claim stands next to the type.
//!
//! # The invariants every call relies on
//!
//! 1. **The table.** Each entry has the signature of its `PFN_` type and
//!    behaves as the C function documents: the loader
//!    ([`crate::table::Resolve`]) resolves it from the library its list
//!    names; a table from [`crate::Backend::from_table`] comes with the
//!    caller's promise of exactly this (its `# Safety` list).
//! 2. **Handles.** Every C handle passed (context, stream, memory, mapping,
//!    semaphore, NvSci module, list, object, fence, endpoint) is owned by a
//!    value of this crate that is alive for the call, and was created by the
//!    same table; release calls are made once, by [`crate::owner::Owned`]
//!    (or the NvSci owners), after which the handle is never passed again.
//!    Handles are values to the wrappers: entries taking only handles and
//!    integers are safe functions, and this invariant is the crate's.
//! 3. **Pointers.** Entries that take a raw pointer (marked `unsafe fn` in
//!    the generated lists) have `unsafe fn` wrappers: each call site says,
//!    in its `// SAFETY:` line, what makes its pointers valid there
//!    (out-pointers to locals, slices with their length passed next to
//!    them, descriptors from the core's validated builders, fences borrowed
//!    for the call).
//! 4. **Context.** Calls that act in a context are made through [`Bind`] or
//!    [`Current`] with the context that owns their handles (checked before
//!    the call where the user could mix them: [`crate::Error::WrongContext`]).
//!
//! Anything a caller of the public API must promise instead (a raw handle
//! imported from elsewhere, skipped memory synchronisation) stays an
//! `unsafe fn` of the public API with its own `# Safety` section.

pub(crate) mod batch;
pub(crate) mod egl;
pub(crate) mod host_fn;
pub(crate) mod nvsci;
pub(crate) mod wrappers;

pub(crate) use batch::Lowered;
pub(crate) use egl::{egl_plane_words, set_egl_plane_words};
pub(crate) use host_fn::launch_host_fn;
pub(crate) use nvsci::{get_buf_attr, get_sync_attr, take_desc};
pub(crate) use wrappers::{call, code, require, Bind, Current, Init, Target, TryBind};

// ------------------------------------------------------------- cudarc probe

#[cfg(feature = "cudarc")]
#[allow(unsafe_code)] // one call into cudarc's loader
/// Whether cudarc can load the driver library (it panics when it cannot).
#[cfg(feature = "cudarc")]
pub(crate) fn cudarc_can_load() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library by
    // its usual names (libcuda.so.1 among them, already loaded by
    // `Backend::real`); it has no other effect.
    unsafe { cudarc::driver::sys::is_culib_present() }
}
