//! The consumer's CUDA kernel, shared by the transports whose consumer runs
//! on a real CUDA device:
//!
//! - the discrete-GPU transport (`gpu.rs`, feature `vulkan`), over imported
//!   Vulkan memory (zero-copy) or a device-local copy of each frame;
//! - the NvSci transport on a Jetson (`nvsci.rs`,
//!   `Processing::CudaKernel`), over the imported NvSciBuf buffers.
//!
//! What is here: [`KERNEL_SOURCE`] (CUDA C, compiled when a transport opens
//! with NVRTC through cudarc), [`Kernel`] (the compiled module and its entry
//! points, with the launches), [`Counters`] (one mismatch counter per ring
//! slot in device-mapped pinned host memory), and the host-side
//! mirror of the kernel's test-pattern arithmetic ([`pattern_seed`],
//! [`kernel_pattern_byte`], [`self_check_pattern`]). The kernel does exactly
//! what `crate::transport::process_frame` does on the host: count the bytes
//! that differ from the frame's `TestPattern` and invert every byte in place.
//!
//! What was verified where: the kernels and the discrete-GPU transport's
//! launch sequence, launched through cudarc's launch builder as below, ran
//! on an H100 (sessions 6 and 7, the counters in mapped host memory since 7;
//! every frame verified, BENCHMARKS.md), as did the EGL transport's and the
//! plain-CUDA baseline's launches. The Jetson path compiles against it and
//! has never run on a Jetson (none is reachable from this project).
//! The host-side pattern arithmetic is unit-tested everywhere.

use std::fmt::Display;
use std::ptr::NonNull;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    sys as cu_sys, CudaContext, CudaFunction, CudaModule, CudaStream, LaunchArgs, LaunchConfig,
    PinnedHostSlice, PushKernelArg,
};

use crate::transport::{Completion, TransportError};
use tegra_interop::driver::Stream;

/// Threads per block of the kernels (a multiple of the warp size).
pub const BLOCK: u32 = 256;

/// Bytes each kernel thread handles per step (one 16-byte vector).
pub const BYTES_PER_THREAD: usize = 16;

/// The alignment the kernels' 16-byte vector accesses need at the start of
/// a frame (checked before every launch: a misaligned frame is an error,
/// not a faulting kernel).
pub const FRAME_ALIGN: u64 = 16;

fn check_aligned(ptr: cu_sys::CUdeviceptr, what: &'static str) -> Result<(), TransportError> {
    if ptr.is_multiple_of(FRAME_ALIGN) {
        Ok(())
    } else {
        Err(TransportError::new(format!(
            "{what}: device address {ptr:#x} is not {FRAME_ALIGN}-byte aligned, which the kernel's vector accesses need"
        )))
    }
}

/// The CUDA C source the consumer compiles with NVRTC when the transport
/// opens.
///
/// `check_and_invert*` do what `process_frame` does on the host: byte `i` of
/// the frame is at `row = i / stride`, `col = i % stride`; it is compared
/// with the test pattern of the frame (the seed bytes `s0`, `s1`, `s2` are the
/// low three bytes of `seed`, see [`pattern_seed`]), counted when different,
/// and inverted. Each thread handles 16 bytes at a time, a warp adds up its
/// counts with shuffles and one lane adds them to the frame's counter with an
/// atomic.
///
/// The `_sysmem` variant and the two copy kernels touch the frame with
/// `ld.global.cv` loads (cached system-memory lines are treated as stale and
/// fetched again) and `st.global.wt` stores (written through to system
/// memory). On the discrete GPU they were tried while frames were still
/// handed over with host-side semaphore operations only, and did not stop
/// the consumer from reading stale bytes (see `gpu.rs`'s module docs and
/// BENCHMARKS.md); the fix there was the queue handover. They are kept
/// because they cost nothing measurable on the H200 and do not rely on
/// cached system-memory lines, which is also why the Jetson path, whose
/// frames are NvSciBuf buffers in the DRAM the CPU shares, uses the
/// `_sysmem` variant (not measured on a Jetson).
pub const KERNEL_SOURCE: &str = r#"
typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u32 col_term(u64 col, u32 seed) {
    return (((u32)col & 0xffu) ^ (seed & 0xffu)) + 7u * (u32)(col >> 8);
}

__device__ __forceinline__ u32 row_term(u64 row, u32 seed) {
    return 3u * (((u32)row & 0xffu) ^ ((seed >> 8) & 0xffu))
         + 5u * (u32)(row >> 8) + ((seed >> 16) & 0xffu);
}

template <bool SYS> __device__ __forceinline__ uint4 load16(const uint4 *p) {
    if (SYS) { return __ldcv(p); } else { return *p; }
}
template <bool SYS> __device__ __forceinline__ void store16(uint4 *p, uint4 v) {
    if (SYS) { __stwt(p, v); } else { *p = v; }
}
template <bool SYS> __device__ __forceinline__ unsigned char load1(const unsigned char *p) {
    if (SYS) { return __ldcv(p); } else { return *p; }
}
template <bool SYS> __device__ __forceinline__ void store1(unsigned char *p, unsigned char v) {
    if (SYS) { __stwt(p, v); } else { *p = v; }
}

template <bool SYS>
__device__ __forceinline__ void check_and_invert_body(unsigned char *buf, u64 len, u64 stride,
                                                      u32 seed, u64 *mismatches) {
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 threads = (u64)gridDim.x * blockDim.x;
    const u64 vectors = len / 16;
    u32 count = 0;
    uint4 *v = (uint4 *)buf;
    for (u64 i = tid; i < vectors; i += threads) {
        uint4 w = load16<SYS>(v + i);
        u32 words[4] = {w.x, w.y, w.z, w.w};
        u64 off = i * 16;
        u64 row = off / stride;
        u64 col = off - row * stride;
        u32 rt = row_term(row, seed);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            u32 word = words[k];
            u32 out = 0;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                u32 have = (word >> (8 * b)) & 0xffu;
                u32 want = (col_term(col, seed) + rt) & 0xffu;
                count += (have != want);
                out |= ((~have) & 0xffu) << (8 * b);
                col++;
                if (col == stride) {
                    col = 0;
                    row++;
                    rt = row_term(row, seed);
                }
            }
            words[k] = out;
        }
        store16<SYS>(v + i, make_uint4(words[0], words[1], words[2], words[3]));
    }
    const u64 tail = len - vectors * 16;
    if (tid < tail) {
        u64 off = vectors * 16 + tid;
        u64 row = off / stride;
        u64 col = off - row * stride;
        u32 have = load1<SYS>(buf + off);
        u32 want = (col_term(col, seed) + row_term(row, seed)) & 0xffu;
        count += (have != want);
        store1<SYS>(buf + off, (unsigned char)(~have));
    }
    for (int o = 16; o > 0; o >>= 1) {
        count += __shfl_down_sync(0xffffffffu, count, o);
    }
    if ((threadIdx.x & 31u) == 0 && count != 0) {
        atomicAdd(mismatches, (u64)count);
    }
}

/* The frame in device memory (copy-based variant). */
extern "C" __global__ void check_and_invert(unsigned char *buf, u64 len, u64 stride,
                                            u32 seed, u64 *mismatches) {
    check_and_invert_body<false>(buf, len, stride, seed, mismatches);
}

/* The frame in imported host memory (zero-copy variant). */
extern "C" __global__ void check_and_invert_sysmem(unsigned char *buf, u64 len, u64 stride,
                                                   u32 seed, u64 *mismatches) {
    check_and_invert_body<true>(buf, len, stride, seed, mismatches);
}

/* Copies `len` bytes; SRC_SYS / DST_SYS say which side is imported host memory. */
template <bool SRC_SYS, bool DST_SYS>
__device__ __forceinline__ void copy_body(unsigned char *dst, const unsigned char *src, u64 len) {
    const u64 tid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 threads = (u64)gridDim.x * blockDim.x;
    const u64 vectors = len / 16;
    for (u64 i = tid; i < vectors; i += threads) {
        store16<DST_SYS>((uint4 *)dst + i, load16<SRC_SYS>((const uint4 *)src + i));
    }
    const u64 tail = len - vectors * 16;
    if (tid < tail) {
        u64 off = vectors * 16 + tid;
        store1<DST_SYS>(dst + off, load1<SRC_SYS>(src + off));
    }
}

extern "C" __global__ void copy_from_sysmem(unsigned char *dst, const unsigned char *src, u64 len) {
    copy_body<true, false>(dst, src, len);
}

extern "C" __global__ void copy_to_sysmem(unsigned char *dst, const unsigned char *src, u64 len) {
    copy_body<false, true>(dst, src, len);
}
"#;

/// The splitmix64 finaliser that `TestPattern` uses to turn a frame index
/// into its seed (the formula is documented on `TestPattern`).
const fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The kernel's `seed` argument for `frame`: the pattern's seed bytes `s0`,
/// `s1`, `s2` in its low three bytes.
pub fn pattern_seed(frame: u64) -> u32 {
    (splitmix64(frame) & 0x00ff_ffff) as u32
}

/// The byte the kernel expects at (`row`, `col`) for `seed`: the same
/// arithmetic as [`KERNEL_SOURCE`], on the host (checked against
/// `TestPattern` in the tests and once per open).
pub fn kernel_pattern_byte(seed: u32, row: u64, col: u64) -> u8 {
    let col_term =
        ((col as u32 & 0xff) ^ (seed & 0xff)).wrapping_add(7u32.wrapping_mul((col >> 8) as u32));
    let row_term = 3u32
        .wrapping_mul((row as u32 & 0xff) ^ ((seed >> 8) & 0xff))
        .wrapping_add(5u32.wrapping_mul((row >> 8) as u32))
        .wrapping_add((seed >> 16) & 0xff);
    (col_term.wrapping_add(row_term) & 0xff) as u8
}

/// Checks the kernel's pattern arithmetic against `TestPattern` for a few
/// frames and positions; a mismatch means the kernel would report every
/// frame as corrupt.
pub fn self_check_pattern(stride: usize, rows: usize) -> Result<(), TransportError> {
    use crate::camera::TestPattern;
    for frame in [0u64, 1, 2, 255, 1 << 20, u64::MAX] {
        let p = TestPattern::new(frame, stride);
        let seed = pattern_seed(frame);
        for (row, col) in [
            (0, 0),
            (0, stride.saturating_sub(1)),
            (rows / 2, stride / 2),
            (rows.saturating_sub(1), stride.saturating_sub(1)),
            (300, 700),
        ] {
            if kernel_pattern_byte(seed, row as u64, col as u64) != p.byte(row, col) {
                return Err(TransportError::new(format!(
                    "the kernel's test-pattern arithmetic disagrees with TestPattern at frame {frame}, row {row}, column {col}"
                )));
            }
        }
    }
    Ok(())
}

/// Blocks of [`BLOCK`] threads for a frame of `len` bytes: one
/// [`BYTES_PER_THREAD`]-byte vector per thread, at least 1 and at most
/// 2^20 blocks (the kernels loop over the rest).
pub fn grid_for(len: usize) -> u32 {
    let vectors = len.div_ceil(BYTES_PER_THREAD);
    u32::try_from(vectors.div_ceil(BLOCK as usize).clamp(1, 1 << 20)).unwrap_or(1 << 20)
}

fn err(what: &'static str) -> impl Fn(&dyn Display) -> TransportError {
    move |e| TransportError::new(format!("{what}: {}", e.to_string().replace('\n', " ")))
}

fn cu_call(call: &'static str, r: cu_sys::CUresult) -> Result<(), TransportError> {
    r.result()
        .map_err(|e| TransportError::new(format!("{call} failed: {e}")))
}

/// Whether cudarc can load NVRTC (it panics on first use when it cannot).
pub fn nvrtc_present() -> Result<(), TransportError> {
    // SAFETY: `is_culib_present` only tries to open the NVRTC library under
    // its usual names; opening it runs no code of ours.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(TransportError::new(
            "NVRTC (libnvrtc.so) was not found: install the CUDA toolkit's NVRTC or add its lib64 folder to LD_LIBRARY_PATH",
        ))
    }
}

/// Where the frame a check-and-invert kernel works on lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameMemory {
    /// Device-local memory (the discrete GPU's copy-based variant):
    /// `check_and_invert`, plain loads and stores.
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))] // used by gpu.rs only
    Device,
    /// Memory the CPU also maps (imported Vulkan host memory, NvSciBuf
    /// buffers on a Jetson): `check_and_invert_sysmem`, loads that fetch
    /// again and write-through stores.
    System,
}

/// Which copy kernel (the discrete GPU's copy-based variant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "vulkan"), allow(dead_code))] // used by gpu.rs only
pub enum CopyKernel {
    /// `copy_from_sysmem`: from memory the CPU maps into device memory.
    FromSystem,
    /// `copy_to_sysmem`: from device memory back into memory the CPU maps.
    ToSystem,
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
        nvrtc_present()?;
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::TestPattern;

    #[test]
    fn kernel_pattern_matches_test_pattern() {
        for stride in [1usize, 3, 64, 300, 7680] {
            for frame in [0u64, 1, 7, 1000, u64::MAX - 1] {
                let p = TestPattern::new(frame, stride);
                let seed = pattern_seed(frame);
                for row in [0usize, 1, 255, 256, 1079, 4095] {
                    for col in (0..stride).step_by(stride.div_ceil(97)) {
                        assert_eq!(
                            kernel_pattern_byte(seed, row as u64, col as u64),
                            p.byte(row, col),
                            "frame {frame} stride {stride} row {row} col {col}"
                        );
                    }
                }
            }
        }
        self_check_pattern(7680, 1080).unwrap();
    }

    #[test]
    fn grid_covers_the_frame_within_limits() {
        assert_eq!(grid_for(0), 1);
        assert_eq!(grid_for(1), 1);
        assert_eq!(grid_for(BLOCK as usize * BYTES_PER_THREAD), 1);
        assert_eq!(grid_for(BLOCK as usize * BYTES_PER_THREAD + 1), 2);
        // 1920x1080 RGBA8: 518400 vectors of 16 bytes, 2025 blocks.
        assert_eq!(grid_for(1920 * 1080 * 4), 2025);
        assert_eq!(grid_for(usize::MAX), 1 << 20);
    }

    #[test]
    fn the_source_has_every_entry_point_the_module_loads() {
        for name in [
            "check_and_invert",
            "check_and_invert_sysmem",
            "copy_from_sysmem",
            "copy_to_sysmem",
        ] {
            assert!(
                KERNEL_SOURCE.contains(&format!("extern \"C\" __global__ void {name}(")),
                "{name}"
            );
        }
    }
}
