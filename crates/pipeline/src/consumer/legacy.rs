//! The cudarc-based kernel launcher that `transport/gpu.rs` and
//! `app/baseline.rs` still use, kept only until they are ported onto
//! [`super::Consumer`] (helper "limits" of issue 24 does that); then this
//! file goes, and with it the pipeline's last cudarc and cudarc-sys calls.
//! New code uses [`super::Consumer`].
#![allow(missing_docs)]

use std::fmt::Display;
use std::ptr::NonNull;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    sys as cu_sys, CudaContext, CudaFunction, CudaModule, CudaStream, LaunchArgs, LaunchConfig,
    PinnedHostSlice, PushKernelArg,
};

use super::kernel::{pattern_seed, CopyKernel, FrameMemory, BLOCK, KERNEL_SOURCE};
use crate::transport::{Completion, TransportError};
use tegra_interop::driver::Stream;

fn check_aligned(ptr: cu_sys::CUdeviceptr, what: &'static str) -> Result<(), TransportError> {
    super::kernel::check_aligned(ptr, what)
}

fn err(what: &'static str) -> impl Fn(&dyn Display) -> TransportError {
    move |e| TransportError::new(format!("{what}: {}", e.to_string().replace('\n', " ")))
}

fn cu_call(call: &'static str, r: cu_sys::CUresult) -> Result<(), TransportError> {
    r.result()
        .map_err(|e| TransportError::new(format!("{call} failed: {e}")))
}

/// A frame as the kernels see it: `len` bytes at device address `ptr`,
/// lines of `stride` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceFrame {
    /// Device address of the first byte.
    pub ptr: cu_sys::CUdeviceptr,
    /// Bytes in the frame.
    pub len: usize,
    /// Bytes per line.
    pub stride: usize,
}

/// The NVRTC-compiled consumer kernels, loaded into one CUDA context.
pub struct Kernel {
    _module: Arc<CudaModule>,
    /// `check_and_invert` (device memory).
    device: CudaFunction,
    /// `check_and_invert_sysmem` (memory the CPU maps).
    sysmem: CudaFunction,
    /// `copy_from_sysmem`.
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))] // used by gpu.rs only
    copy_in: CudaFunction,
    /// `copy_to_sysmem`.
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))] // used by gpu.rs only
    copy_out: CudaFunction,
}

impl Kernel {
    /// Compiles [`KERNEL_SOURCE`] with NVRTC and loads it into `ctx`.
    pub fn compile(ctx: &Arc<CudaContext>) -> Result<Kernel, TransportError> {
        let ptx = cudarc::nvrtc::compile_ptx(KERNEL_SOURCE).map_err(|e| {
            TransportError::new(format!(
                "NVRTC could not compile the consumer kernel: {}",
                format!("{e:?}").replace('\n', " ")
            ))
        })?;
        let module = ctx
            .load_module(ptx)
            .map_err(|e| err("loading the consumer kernel")(&e))?;
        let get = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| err("finding a consumer kernel")(&e))
        };
        Ok(Kernel {
            device: get("check_and_invert")?,
            sysmem: get("check_and_invert_sysmem")?,
            copy_in: get("copy_from_sysmem")?,
            copy_out: get("copy_to_sysmem")?,
            _module: module,
        })
    }

    /// Queues the check-and-invert kernel for frame number `args`'s frame
    /// on `stream`, through cudarc's launch builder: it adds the number of
    /// bytes that differ from the frame's test pattern to the `u64` at the
    /// counter and inverts every byte in place. `frame` is the kernel's first
    /// argument: a cudarc slice (a mapping lent with
    /// `MappedBuffer::cudarc_slice`, a device buffer) or `&args.ptr` (see
    /// [`Kernel::check_and_invert_at`]).
    ///
    /// # Safety
    /// `stream` must be a live stream of the context the kernel was loaded
    /// into; `frame` must be the device memory at `args.ptr`, at least
    /// `args.len` bytes, and the counter the device address of a `u64`, both
    /// valid until the kernel has run and not accessed by anything else
    /// meanwhile. (Alignment is checked here.)
    pub unsafe fn check_and_invert<'a, F>(
        &'a self,
        memory: FrameMemory,
        grid: u32,
        stream: &'a CudaStream,
        frame: F,
        args: &'a CheckArgs,
    ) -> Result<(), TransportError>
    where
        LaunchArgs<'a>: PushKernelArg<F>,
    {
        check_aligned(args.ptr, "launching the consumer kernel")?;
        let mut launch = stream.launch_builder(self.check_and_invert_function(memory));
        launch.arg(frame);
        args.push_scalars(&mut launch);
        // SAFETY: the arguments match the kernels' parameter list
        // `(unsigned char*, u64, u64, u32, u64*)`; the memory behind them is
        // the caller's to keep valid (see the contract above).
        unsafe { launch.launch(config(grid)) }
            .map(drop)
            .map_err(|e| err("launching the consumer kernel")(&e))
    }

    /// [`Kernel::check_and_invert`] on the frame at the raw device address
    /// `args.ptr` (memory that is not a cudarc slice: an EGL frame, a
    /// pinned host buffer's device view).
    ///
    /// # Safety
    /// As for [`Kernel::check_and_invert`].
    pub unsafe fn check_and_invert_at(
        &self,
        memory: FrameMemory,
        grid: u32,
        stream: &CudaStream,
        args: &CheckArgs,
    ) -> Result<(), TransportError> {
        // SAFETY: the caller's contract; `&args.ptr` is the frame's address.
        unsafe { self.check_and_invert(memory, grid, stream, &args.ptr, args) }
    }

    /// The check-and-invert kernel for `memory`.
    fn check_and_invert_function(&self, memory: FrameMemory) -> &CudaFunction {
        match memory {
            FrameMemory::System => &self.sysmem,
            FrameMemory::Device => &self.device,
        }
    }

    /// Queues a copy kernel through cudarc's launch builder: `len` bytes
    /// from `src` (device address `src_ptr`) to `dst` (device address
    /// `dst_ptr`); `what` names the step in an error.
    ///
    /// # Safety
    /// As for [`Kernel::check_and_invert`]; `dst` and `src` must be the
    /// device memory at `dst_ptr` and `src_ptr`, at least `len` bytes each,
    /// valid until the copy has run, not overlapping.
    #[allow(clippy::too_many_arguments)]
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))] // used by gpu.rs only
    pub unsafe fn copy<'a, D, S>(
        &'a self,
        which: CopyKernel,
        grid: u32,
        stream: &'a CudaStream,
        (dst, dst_ptr): (D, cu_sys::CUdeviceptr),
        (src, src_ptr): (S, cu_sys::CUdeviceptr),
        len: &'a u64,
        what: &'static str,
    ) -> Result<(), TransportError>
    where
        LaunchArgs<'a>: PushKernelArg<D> + PushKernelArg<S>,
    {
        check_aligned(dst_ptr, what)?;
        check_aligned(src_ptr, what)?;
        let function = match which {
            CopyKernel::FromSystem => &self.copy_in,
            CopyKernel::ToSystem => &self.copy_out,
        };
        let mut launch = stream.launch_builder(function);
        launch.arg(dst);
        launch.arg(src);
        push_len(&mut launch, len);
        // SAFETY: `(unsigned char*, const unsigned char*, u64)` is the copy
        // kernels' parameter list; the memory is the caller's to keep valid.
        unsafe { launch.launch(config(grid)) }
            .map(drop)
            .map_err(|e| err(what)(&e))
    }
}

/// The scalar arguments of one check-and-invert launch, kept by the caller
/// until the launch call returns (the launch builder borrows them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckArgs {
    /// The frame's device address (checked for alignment; the first
    /// argument of a launch at a raw address).
    pub ptr: cu_sys::CUdeviceptr,
    len: u64,
    stride: u64,
    seed: u32,
    counter: cu_sys::CUdeviceptr,
}

impl CheckArgs {
    /// The arguments for frame number `index` in `frame`, counting its
    /// mismatches into the `u64` at device address `counter`.
    pub fn new(frame: DeviceFrame, index: u64, counter: cu_sys::CUdeviceptr) -> CheckArgs {
        CheckArgs {
            ptr: frame.ptr,
            len: frame.len as u64,
            stride: frame.stride as u64,
            seed: pattern_seed(index),
            counter,
        }
    }
}

impl CheckArgs {
    /// Pushes the arguments after the frame (outside the generic launch, so
    /// that its bound on the frame's type does not decide these pushes).
    fn push_scalars<'a>(&'a self, launch: &mut LaunchArgs<'a>) {
        launch
            .arg(&self.len)
            .arg(&self.stride)
            .arg(&self.seed)
            .arg(&self.counter);
    }
}

/// Pushes a copy's length (outside the generic launch, as above).
#[cfg_attr(not(feature = "vulkan"), allow(dead_code))] // used by gpu.rs only
fn push_len<'a>(launch: &mut LaunchArgs<'a>, len: &'a u64) {
    launch.arg(len);
}

/// [`BLOCK`] threads per block over `grid` blocks, no shared memory.
fn config(grid: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One mismatch counter per ring slot: a `u64` in pinned host memory mapped
/// into the device (`cuMemHostAlloc` with `DEVICEMAP`), which the kernel
/// adds to (only when it finds a mismatch, so normally never) and the host
/// reads once the frame is done, then sets back to zero for the slot's next
/// frame. No copy and no clearing is queued per frame (measured: the
/// device-memory counter's clear and copy back were two more CUDA calls per
/// frame on the producer's path and a copy-engine hop after the kernel).
/// Allocated once, when the transport opens.
pub struct Counters {
    _host: PinnedHostSlice<u64>,
    host_ptr: NonNull<u64>,
    device_ptr: cu_sys::CUdeviceptr,
    slots: usize,
}

// SAFETY: `host_ptr` points into the pinned allocation the struct owns
// (`_host`) and lives as long as it; the safe methods only compute
// addresses, and every read or write of a counter goes through an `unsafe`
// method whose contract orders it against the device and other threads.
unsafe impl Send for Counters {}
// SAFETY: as for `Send`: `&Counters` gives only addresses without `unsafe`.
unsafe impl Sync for Counters {}

impl Counters {
    /// Allocates `slots` zeroed counters in device-mapped pinned host memory
    /// of `cu`'s context.
    pub fn new(cu: &Arc<CudaContext>, slots: usize) -> Result<Counters, TransportError> {
        let flags = cu_sys::CU_MEMHOSTALLOC_DEVICEMAP | cu_sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: pinned host memory for `slots` u64 values, zeroed below
        // before any use.
        let mut host = unsafe { cu.alloc_pinned_with_flags::<u64>(slots, flags) }
            .map_err(|e| err("allocating the mismatch counters")(&e))?;
        let host_ptr = host
            .as_mut_ptr()
            .ok()
            .and_then(NonNull::new)
            .ok_or_else(|| TransportError::new("pinned host memory has no address"))?;
        for slot in 0..slots {
            // SAFETY: `slot` is within the `slots` values of the live
            // allocation, which nothing else uses yet.
            unsafe { host_ptr.as_ptr().add(slot).write_volatile(0) };
        }
        let mut device_ptr: cu_sys::CUdeviceptr = 0;
        cu.bind_to_thread()
            .map_err(|e| err("binding the CUDA context")(&e))?;
        // SAFETY: `host_ptr` is the start of a live allocation made with
        // `DEVICEMAP`; the driver writes the device address into
        // `device_ptr`.
        cu_call("cuMemHostGetDevicePointer", unsafe {
            cu_sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, host_ptr.as_ptr().cast(), 0)
        })?;
        Ok(Counters {
            _host: host,
            host_ptr,
            device_ptr,
            slots,
        })
    }

    fn check(&self, slot: usize) -> Result<(), TransportError> {
        if slot < self.slots {
            Ok(())
        } else {
            Err(TransportError::new(format!(
                "mismatch counter {slot} of {} requested",
                self.slots
            )))
        }
    }

    /// The device address of `slot`'s counter (for the kernel).
    pub fn device_ptr(&self, slot: usize) -> Result<cu_sys::CUdeviceptr, TransportError> {
        self.check(slot)?;
        Ok(self.device_ptr + (slot * std::mem::size_of::<u64>()) as u64)
    }

    /// The host address of `slot`'s counter, for a stream-ordered host
    /// function that takes it (an address, so that the function can be sent
    /// to the driver's thread).
    fn host_address(&self, slot: usize) -> Result<usize, TransportError> {
        self.check(slot)?;
        // SAFETY: `slot` is within the `slots` values of the allocation.
        Ok(unsafe { self.host_ptr.as_ptr().add(slot) } as usize)
    }

    /// Queues on `stream` a host function that takes `slot`'s counter
    /// ([`Counters::take`]) and sends frame `frame`'s [`Completion`] on `tx`
    /// (with `process` and `busy` zero: the caller fills them from its CUDA
    /// events when it collects the frame, since reading events is a CUDA
    /// call, which a host function must not make).
    ///
    /// # Safety
    /// The frame's kernel must be queued on `stream` before this; the slot's
    /// next kernel only after the frame was collected; and the counters must
    /// outlive the stream's queued work (the transport drains the stream
    /// before it drops them).
    pub unsafe fn send_completion_after(
        &self,
        stream: &Stream,
        slot: usize,
        frame: u64,
        tx: Sender<Completion>,
    ) -> Result<(), TransportError> {
        let host = self.host_address(slot)?;
        stream
            .launch_host_fn(move || {
                let counter = host as *mut u64;
                // SAFETY: the caller's contract: `host` is the slot's u64 in
                // pinned host memory that outlives this function; the kernel
                // that adds to it ran before this function on the same
                // stream (so its writes are visible here), and the slot's
                // next kernel is queued only after this frame is collected.
                // Reading and writing memory are not CUDA calls.
                let mismatches = unsafe { counter.read_volatile() };
                // SAFETY: as above.
                unsafe { counter.write_volatile(0) };
                let _ = tx.send(Completion {
                    slot,
                    frame,
                    mismatches,
                    process: Duration::ZERO,
                    busy: Duration::ZERO,
                    finished: Instant::now(),
                });
            })
            .map_err(|e| err("cuLaunchHostFunc")(&e))
    }

    /// Takes `slot`'s count: reads it and sets it back to zero for the
    /// slot's next frame.
    ///
    /// # Safety
    /// The kernel of the frame wanted must have completed (its stream passed
    /// a later event the host saw complete), and the slot's next kernel may
    /// be queued only after this returns.
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))] // gpu.rs and the baseline
    pub unsafe fn take(&self, slot: usize) -> Result<u64, TransportError> {
        self.check(slot)?;
        // SAFETY: the slot's u64 in the live pinned allocation; the caller's
        // contract orders the device's writes before these accesses and the
        // next kernel's after them.
        unsafe {
            let counter = self.host_ptr.as_ptr().add(slot);
            let mismatches = counter.read_volatile();
            counter.write_volatile(0);
            Ok(mismatches)
        }
    }
}
