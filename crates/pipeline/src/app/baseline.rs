//! The plain-CUDA baseline: what a user would write instead of the interop
//! pipeline on a discrete GPU, doing the same work, so that the ratio of the
//! two measures what the interop costs.
//!
//! A ring of `slots` pinned, device-mapped host buffers (`cuMemHostAlloc`
//! with `DEVICEMAP | PORTABLE`), one CUDA stream, one event per slot. One
//! host thread, per frame: waits for the slot's event (the slot's previous
//! frame is done), checks that frame's processed bytes and its mismatch
//! counter, writes the new frame with the camera model's pattern writer
//! (as many threads as the pipeline's camera, started per call:
//! [`TestPattern::fill_on_new_threads`], faster than the pipeline's pools
//! for this one-thing-after-another loop), then queues the pipeline's own check-and-invert kernel
//! ([`Kernel::check_and_invert`]) and records the slot's event. Zero-copy:
//! the kernel works on the host buffer over PCIe. Copy: the stream copies the
//! frame into a device buffer (`cuMemcpyHtoDAsync`), runs the kernel there
//! and copies it back. No Vulkan, no external memory, no semaphores: CUDA's
//! stream order makes the host's writes, done before the copy or kernel is
//! queued, visible to them (host memory allocated by CUDA is coherent with
//! the device for work queued after the writes).
//!
//! Every frame is checked exactly as in the pipeline: the kernel counts the
//! bytes that differ from the pattern, the host reads back the inverted frame.

use std::time::{Duration, Instant};

use cudarc::driver::{
    sys as cu_sys, CudaContext, CudaEvent, CudaSlice, DevicePtr, PinnedHostSlice,
};

use crate::camera::{frame_threads, TestPattern};
use crate::consumer::{self, CheckArgs, Counters, DeviceFrame, FrameMemory, Kernel};
use crate::transport::{FrameGeometry, TransportError};

fn err(what: &'static str) -> impl Fn(&dyn std::fmt::Display) -> TransportError {
    move |e| TransportError::new(format!("{what}: {}", e.to_string().replace('\n', " ")))
}

fn cu(what: &'static str, r: cu_sys::CUresult) -> Result<(), TransportError> {
    if r == cu_sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(TransportError::new(format!("{what}: {r:?}")))
    }
}

/// What one baseline run measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BaselineReport {
    /// Frames run.
    pub frames: u64,
    /// Whether the frames were copied to device memory and back.
    pub copy: bool,
    /// First write to the last frame's completion.
    pub wall: Duration,
    /// Frames that failed a check (consumer count or read-back).
    pub failed: u64,
    /// Mean time per frame of the host's pattern write.
    pub write: Duration,
    /// Mean time per frame of the host's read-back check.
    pub verify: Duration,
}

impl BaselineReport {
    /// Frames per second over the wall time.
    pub fn frames_per_s(&self) -> f64 {
        self.frames as f64 / self.wall.as_secs_f64().max(1e-9)
    }

    /// Wall time per frame in microseconds.
    pub fn frame_time_us(&self) -> f64 {
        self.wall.as_secs_f64() * 1e6 / self.frames.max(1) as f64
    }
}

/// One slot of the ring.
struct Slot {
    /// Owns the pinned buffer `host_ptr` points into.
    _host: PinnedHostSlice<u8>,
    host_ptr: *mut u8,
    device_view: cu_sys::CUdeviceptr,
    /// Copy mode: owns the device buffer at `device_ptr`.
    _device: Option<CudaSlice<u8>>,
    device_ptr: cu_sys::CUdeviceptr,
    done: CudaEvent,
}

/// Runs `frames` frames of `geometry` through a ring of `slots` (see the
/// module docs); `copy` selects the copy-based variant.
pub fn run(
    geometry: FrameGeometry,
    slots: usize,
    frames: u64,
    copy: bool,
) -> Result<BaselineReport, TransportError> {
    let len = geometry.frame_len();
    let ctx = CudaContext::new(0).map_err(|e| err("creating a CUDA context")(&e))?;
    let stream = ctx
        .new_stream()
        .map_err(|e| err("creating a CUDA stream")(&e))?;
    let kern = Kernel::compile(&ctx)?;
    let counters = Counters::new(&ctx, slots)?;
    let mut ring = Vec::with_capacity(slots);
    for _ in 0..slots {
        let flags = cu_sys::CU_MEMHOSTALLOC_DEVICEMAP | cu_sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: the bytes are written (the whole frame) before anything
        // reads them.
        let mut host = unsafe { ctx.alloc_pinned_with_flags::<u8>(len, flags) }
            .map_err(|e| err("allocating pinned mapped host memory")(&e))?;
        let host_ptr = host
            .as_mut_ptr()
            .map_err(|e| err("pinned host memory")(&e))?;
        let mut device_view: cu_sys::CUdeviceptr = 0;
        // SAFETY: `host_ptr` is the start of a live DEVICEMAP allocation;
        // the out-pointer is a local.
        cu("cuMemHostGetDevicePointer", unsafe {
            cu_sys::cuMemHostGetDevicePointer_v2(&mut device_view, host_ptr.cast(), 0)
        })?;
        let device = if copy {
            Some(
                stream
                    .alloc_zeros::<u8>(len)
                    .map_err(|e| err("allocating a device frame")(&e))?,
            )
        } else {
            None
        };
        let device_ptr = device.as_ref().map_or(0, |d| d.device_ptr(&stream).0);
        let done = ctx
            .new_event(Some(cu_sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| err("creating a CUDA event")(&e))?;
        ring.push(Slot {
            _host: host,
            host_ptr,
            device_view,
            _device: device,
            device_ptr,
            done,
        });
    }
    let threads = frame_threads(len);
    let grid = consumer::grid_for(len);
    let s = stream.cu_stream();
    let (mut failed, mut write_ns, mut verify_ns) = (0u64, 0u128, 0u128);
    let mut check = |slot: &Slot, index: usize, frame: u64| -> Result<(), TransportError> {
        slot.done
            .synchronize()
            .map_err(|e| err("waiting for a frame")(&e))?;
        let t = Instant::now();
        // SAFETY: the slot's event completed, so its kernel is done, and
        // the slot's next kernel is queued only after this check.
        let mismatches = unsafe { counters.take(index) }?;
        // SAFETY: `host_ptr` is `len` bytes of a live allocation that no
        // queued work touches now (the event completed).
        let bytes = unsafe { std::slice::from_raw_parts(slot.host_ptr, len) };
        let readback = TestPattern::new(frame, geometry.stride)
            .first_mismatch_on_new_threads(bytes, 0xff, threads);
        if mismatches != 0 || readback.is_some() {
            failed += 1;
        }
        verify_ns += t.elapsed().as_nanos();
        Ok(())
    };
    let start = Instant::now();
    for frame in 0..frames {
        let index = (frame % slots as u64) as usize;
        let slot = &ring[index];
        if frame >= slots as u64 {
            check(slot, index, frame - slots as u64)?;
        }
        let t = Instant::now();
        // SAFETY: as in `check`: the slot's previous frame is done (or it
        // was never used) and nothing is queued on it.
        let bytes = unsafe { std::slice::from_raw_parts_mut(slot.host_ptr, len) };
        TestPattern::new(frame, geometry.stride).fill_on_new_threads(bytes, threads);
        write_ns += t.elapsed().as_nanos();
        let (memory, ptr) = if copy {
            // SAFETY: both ranges are `len` bytes of live allocations kept
            // until the stream is drained below.
            cu("cuMemcpyHtoDAsync", unsafe {
                cu_sys::cuMemcpyHtoDAsync_v2(slot.device_ptr, slot.host_ptr.cast(), len, s)
            })?;
            (FrameMemory::Device, slot.device_ptr)
        } else {
            (FrameMemory::System, slot.device_view)
        };
        let work = DeviceFrame {
            ptr,
            len,
            stride: geometry.stride,
        };
        let counter = counters.device_ptr(index)?;
        // SAFETY: `len` bytes at `ptr` and the counter stay allocated until
        // the stream is drained; the host touches the slot again only after
        // the slot's event, recorded after this work, completed.
        unsafe {
            kern.check_and_invert_at(memory, grid, &stream, &CheckArgs::new(work, frame, counter))
        }?;
        if copy {
            // SAFETY: as for the copy in.
            cu("cuMemcpyDtoHAsync", unsafe {
                cu_sys::cuMemcpyDtoHAsync_v2(slot.host_ptr.cast(), slot.device_ptr, len, s)
            })?;
        }
        slot.done
            .record(&stream)
            .map_err(|e| err("recording a CUDA event")(&e))?;
    }
    let first_pending = frames.saturating_sub(slots as u64);
    let mut last_done = start;
    for frame in first_pending..frames {
        let index = (frame % slots as u64) as usize;
        check(&ring[index], index, frame)?;
        last_done = Instant::now();
    }
    let wall = last_done.saturating_duration_since(start);
    stream
        .synchronize()
        .map_err(|e| err("draining the CUDA stream")(&e))?;
    let n = u128::from(frames.max(1));
    Ok(BaselineReport {
        frames,
        copy,
        wall,
        failed,
        write: Duration::from_nanos((write_ns / n) as u64),
        verify: Duration::from_nanos((verify_ns / n) as u64),
    })
}
