//! What a C structure read from the caller holds beyond plain numbers:
//! the handle union of the memory and semaphore import descriptors, the
//! NvSciSync fence pointer of semaphore signal and wait parameters, the
//! value bytes of an NvSci key/value pair ([`KeyValuePair`]), and the host
//! sides of a 3D copy ([`Side3D`]). All of it is reached through a [`CIn`].
//!
//! Unsafe code is allowed here (as in all of `cmem`): each accessor reads a
//! union member or dereferences a pointer field under the C contract set
//! out in the `cmem` module doc.

#![allow(unsafe_code)]

use core::ffi::{c_int, c_void};

use tegra_interop_sys::cuda::{
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC, CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC,
    CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS, CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS, CUDA_MEMCPY3D,
};
use tegra_interop_sys::nvsci::{
    NvSciBufAttrKeyValuePair, NvSciSyncAttrKeyValuePair, NvSciSyncFence,
};

use super::{CIn, CMut, CPtr, Plain};

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

    /// A host side's base as a pointer: the host pointer itself (keeping
    /// the caller's provenance, which Miri checks), or the device field's
    /// address for a host pointer passed as a unified address (an integer
    /// in the descriptor, so only its exposed provenance is available).
    fn host_ptr(&self, side: Side3D) -> *mut u8 {
        let m = &self.v;
        let (host, dev) = match side {
            Side3D::Src => (m.srcHost.cast_mut(), m.srcDevice),
            Side3D::Dst => (m.dstHost, m.dstDevice),
        };
        if !host.is_null() {
            host.cast()
        } else {
            core::ptr::with_exposed_provenance_mut(dev as usize)
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
        let p = self.host_ptr(Side3D::Src).wrapping_add(off).cast_const();
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
        let p = self.host_ptr(Side3D::Dst).wrapping_add(off);
        // SAFETY: as in `read_host_src`, for the writable destination.
        unsafe { core::ptr::copy(data.as_ptr(), p, data.len()) };
        true
    }
}
