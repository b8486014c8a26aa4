//! What the simulator keeps for C or gives to it beyond one call's
//! pointers: host functions queued by `cuLaunchHostFunc` ([`HostFn`],
//! [`HostCallback`]), malloc'ed descriptors that the caller frees later
//! ([`HandedOut`]), and the plane words of an EGL frame's union.
//!
//! Unsafe code is allowed here (as in all of `cmem`): calling the caller's
//! host function, `malloc`/`free` of the handed-out blocks, and reading the
//! EGL frame union.

#![allow(unsafe_code)]

use core::ffi::c_void;
use std::collections::HashMap;

use tegra_interop_sys::cuda::{CUeglFrame, CUhostFn};

// ------------------------------------------------------------ host callbacks

/// A `CUhostFn` argument, not callable by itself (see [`HostCallback`]).
pub(crate) struct HostFn(pub(crate) CUhostFn);

/// A host function with its user pointer, as `cuLaunchHostFunc` queues it:
/// the C contract says it may be called once, from another thread.
/// The user pointer is kept as a pointer (not an address), so it keeps the
/// caller's provenance all the way to the call (Miri checks this).
pub(crate) struct HostCallback {
    f: unsafe extern "C" fn(*mut c_void),
    user: *mut c_void,
}

// SAFETY: the C contract of `cuLaunchHostFunc` (promised to `new`) lets the
// function be called with `user` from another thread; the simulator never
// reads through `user` itself.
unsafe impl Send for HostCallback {}

impl HostCallback {
    /// # Safety
    /// `f` may be called once with `user`, from any thread, at a later time
    /// (the C contract of `cuLaunchHostFunc`).
    pub(crate) unsafe fn new(f: unsafe extern "C" fn(*mut c_void), user: *mut c_void) -> Self {
        HostCallback { f, user }
    }

    /// Calls the function.
    pub(crate) fn call(self) {
        // SAFETY: promised in `new`.
        unsafe { (self.f)(self.user) }
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
