//! Mapped buffers as cudarc device memory (feature `cudarc`).
//!
//! [`MappedBuffer::cudarc_slice`] lends a mapped buffer to cudarc as a
//! [`CudaSlice<T>`] bound to one cudarc stream, so kernels launched with
//! cudarc's launch builder take it as an argument:
//!
//! ```ignore
//! let mut frame = mapped.cudarc_slice::<u8>(&stream)?;
//! let n = frame.len() as u32;
//! unsafe { stream.launch_builder(&invert).arg(&mut frame).arg(&n).launch(cfg) }?;
//! ```
//!
//! # Ordering
//! Between cudarc streams the slice behaves like any cudarc allocation: it
//! carries its own read and write events (when the cudarc context tracks
//! events, its default), so a kernel on another stream waits for earlier
//! writes, and a write waits for earlier reads and writes. Ordering against
//! the exporter (Vulkan, NvSci, a camera) is NOT the slice's business: wait
//! on the import's semaphore on the same stream before the launch and signal
//! it after, as for any imported memory. When the slice is dropped, its
//! stream is made to wait for the work queued through it; the memory itself
//! stays mapped and is freed by the [`MappedBuffer`] (destroy the buffer only
//! after that work has finished, as for every mapping).
//!
//! On a context whose event tracking is off
//! (`CudaContext::disable_event_tracking`, for a program that keeps all of
//! one mapping's work on one stream, as the pipeline does) the slice has no
//! events: lending it and launching with it then adds no driver call to the
//! launch itself.
//!
//! # Panics
//! With event tracking on, cudarc's `upgrade_device_ptr` creates the two
//! events and panics (inside cudarc) if the driver refuses one; that is the
//! one panic path of this module, and it is cudarc's. With tracking off no
//! event is created.
//!
//! # Why a slice, and not `DevicePtr` on `MappedBuffer`
//! cudarc's `DevicePtr`/`DevicePtrMut` require `DeviceSlice::stream()` (the
//! cudarc stream the memory belongs to) and promise that the stream given to
//! `device_ptr` waits for earlier writes (and, for `_mut`, reads): cudarc
//! keeps that promise with a read and a write event per allocation. A
//! `MappedBuffer` belongs to a [`crate::Context`] that need not be cudarc's
//! and has no events, so implementing the traits on it could only hand out
//! the address without the ordering. `cudarc_slice` binds the mapping to a
//! cudarc stream and gives it cudarc's own events, so the ordering is
//! cudarc's, unchanged.
//!
//! # Safety
//! `upgrade_device_ptr` makes cudarc believe it owns an allocation: the
//! slice is kept in a `ManuallyDrop` and taken apart with `leak` on drop, so
//! cudarc never frees the mapping; the `&mut MappedBuffer` borrow keeps the
//! mapping alive and unaliased for the slice's lifetime. The launch-argument
//! impls push the slice's own `CudaSlice` the way cudarc does for its own
//! slices.
#![allow(unsafe_code)]

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, LaunchArgs, PushKernelArg};

use crate::memory::MappedBuffer;
use crate::Error;

/// A [`MappedBuffer`] lent to cudarc as `len()` elements of `T` on one
/// stream. Derefs to [`CudaSlice<T>`], so every cudarc API that takes device
/// memory (launch arguments, `memcpy_dtoh`, `DevicePtr`/`DevicePtrMut`)
/// accepts it; the mapping is never freed through it.
#[derive(Debug)]
pub struct CudarcSlice<'a, T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    _buffer: std::marker::PhantomData<&'a mut MappedBuffer>,
}

impl MappedBuffer {
    /// Lends the whole mapping to cudarc as elements of `T`, on `stream`.
    ///
    /// Refused (before anything is created) when `stream` belongs to another
    /// CUDA context than the imported memory, when `T` is zero-sized, when
    /// the mapping's address is not aligned for `T` (a buffer mapped at an odd
    /// offset is only usable as bytes), or when the mapped size is not a
    /// whole number of `T`. The buffer is borrowed mutably for the slice's
    /// lifetime, so no second slice of it can race with the first.
    pub fn cudarc_slice<T: DeviceRepr>(
        &mut self,
        stream: &Arc<CudaStream>,
    ) -> Result<CudarcSlice<'_, T>, Error> {
        let ours = self.memory().context().as_raw() as usize;
        let theirs = stream.context().cu_ctx() as usize;
        if ours != theirs {
            return Err(Error::Unsupported {
                operation: "MappedBuffer::cudarc_slice",
                reason: "the cudarc stream belongs to another CUDA context than the imported \
                         memory; use a stream of the context the memory was imported in",
            });
        }
        let elem = std::mem::size_of::<T>() as u64;
        if elem == 0 {
            return Err(Error::Unsupported {
                operation: "MappedBuffer::cudarc_slice",
                reason: "zero-sized element type",
            });
        }
        let ptr = self.device_ptr();
        if !ptr.is_multiple_of(std::mem::align_of::<T>() as u64) {
            return Err(Error::Unsupported {
                operation: "MappedBuffer::cudarc_slice",
                reason: "the mapping's device address is not aligned for the element type \
                         (mapped at an unaligned offset); lend it as bytes or map at an \
                         aligned offset",
            });
        }
        let size = self.size();
        if !size.is_multiple_of(elem) {
            return Err(Error::Unsupported {
                operation: "MappedBuffer::cudarc_slice",
                reason: "the mapped size is not a whole number of elements",
            });
        }
        let len = usize::try_from(size / elem).map_err(|_| Error::Unsupported {
            operation: "MappedBuffer::cudarc_slice",
            reason: "the mapping is larger than this platform's address space",
        })?;
        // SAFETY: `ptr` is a live mapping of `size` = `len * size_of::<T>()`
        // bytes in the stream's context (checked above); it stays mapped while
        // the mutable borrow of `self` held by the returned value lives; the
        // slice is never freed by cudarc (Drop leaks it back, below). Its bytes
        // are the exporter's: `T: DeviceRepr` is plain data that the device,
        // not the host, interprets.
        let slice = unsafe { stream.upgrade_device_ptr::<T>(ptr, len) };
        Ok(CudarcSlice {
            slice: ManuallyDrop::new(slice),
            _buffer: std::marker::PhantomData,
        })
    }
}

impl<T> Deref for CudarcSlice<'_, T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T> DerefMut for CudarcSlice<'_, T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}

impl<T> Drop for CudarcSlice<'_, T> {
    fn drop(&mut self) {
        // SAFETY: the slice is taken exactly once, here, and not used again.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // `leak` orders the stream after the slice's pending reads and writes
        // and drops its events without freeing the device memory, which
        // belongs to the MappedBuffer.
        let _ = slice.leak();
    }
}

// SAFETY: forwards to cudarc's own implementation for `&CudaSlice<T>`, which
// records the slice's events and pushes its device pointer; the referenced
// slice lives as long as the launch arguments ('b: 'a).
unsafe impl<'a, 'b: 'a, 'c, T> PushKernelArg<&'b CudarcSlice<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b CudarcSlice<'c, T>) -> &mut Self {
        let slice: &'b CudaSlice<T> = &arg.slice;
        self.arg(slice)
    }
}

// SAFETY: as above, for cudarc's `&mut CudaSlice<T>` implementation.
unsafe impl<'a, 'b: 'a, 'c, T> PushKernelArg<&'b mut CudarcSlice<'c, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut CudarcSlice<'c, T>) -> &mut Self {
        let slice: &'b mut CudaSlice<T> = &mut arg.slice;
        self.arg(slice)
    }
}
