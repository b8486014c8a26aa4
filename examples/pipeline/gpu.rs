//! `vulkan-cuda`: the discrete-GPU transport. Vulkan is the producer's API,
//! CUDA the consumer's; the frames and the fences are Vulkan objects that
//! CUDA imports once.
//!
//! - **Frames**: one Vulkan allocation per ring slot, host-visible (host-cached
//!   system memory where the device offers it), mapped once. The camera (the
//!   CPU) writes each frame through that mapping. Each allocation is exported
//!   as an opaque fd and imported into CUDA once
//!   ([`ExternalMemory`] + [`MappedBuffer`], with the size Vulkan allocated).
//! - **Fences**: per slot two Vulkan timeline semaphores, imported into CUDA.
//!   *ready*: after the camera wrote the frame, the producer submits a
//!   recorded Vulkan queue batch ([`VulkanExporter::release_host_writes`])
//!   that makes the host's writes visible to the device (the host-to-device
//!   memory-domain operation of a queue submission, a host-write barrier,
//!   the buffer released to the external owner) and then signals *ready*; the
//!   values it signals go through a core [`TimelineTracker`], and the CUDA
//!   stream waits for exactly the tracked value. *free*: the CUDA stream
//!   signals it after processing ([`Stream::signal`], whose driver-side
//!   tracking returns the value); before the host touches the slot again the
//!   producer submits the second recorded batch
//!   ([`VulkanExporter::acquire_for_host`]), which waits for *free* on the
//!   queue, takes the buffer back and makes the device's writes visible to
//!   the host, and host-waits for that batch. The memory types used are
//!   host-coherent, so the mapped range needs no explicit flush or
//!   invalidate.
//! - **Consumer**: one CUDA stream; per frame it waits for *ready*, runs a
//!   kernel compiled at run time with NVRTC (through cudarc) that counts the
//!   bytes that differ from [`TestPattern`] with an atomic and inverts every
//!   byte in place (exactly [`crate::transport::process_frame`]), copies the
//!   slot's mismatch counter into pinned host memory, signals *free* and
//!   records an event. A completion thread waits for those events in order
//!   and timestamps them, so a frame's finish time does not depend on when
//!   the pipeline's loop next looks.
//! - **Copy-based variant** ([`Mode::DeviceCopy`], the pipeline's `--copy`):
//!   the same, except that the stream copies the frame into a device-local
//!   CUDA buffer (a host-to-device transfer over PCIe), processes it there and
//!   copies it back before signalling *free*. The kernel time is
//!   [`Completion::process`]; the copies count as interop overhead. The
//!   copies are copy kernels that use loads that refetch system memory and
//!   write-through stores (see [`KERNEL_SOURCE`]).
//!
//! Everything is allocated when the transport is opened (fixed capacity): the
//! steady state allocates nothing, on the host or on the GPU.
//!
//! # Why the handover goes through the Vulkan queue
//!
//! The first design signalled *ready* from the host (`vkSignalSemaphore`)
//! and host-waited *free*. On the H200 (driver 580.159.04, CUDA 13.0) that
//! verified the first use of every slot only: from the second use on, the
//! consumer read the slot's previous contents (its own output) instead of the
//! frame the CPU had just written. Vulkan makes host writes visible to the
//! device only through a queue submission; a host-side signal performs no
//! such operation, and the GPU kept stale cached lines of the system-memory
//! allocation. With the queue batches the pipeline verifies every frame, in
//! both modes; the old behaviour is kept as a diagnosis control
//! ([`Handover::HostOnly`], `TEGRA_INTEROP_GPU_HANDOVER=host-only`) and still
//! fails the same way. BENCHMARKS.md ("the discrete-GPU pipeline") has the
//! runs and figures.
//!
//! [`TestPattern`]: tegra_interop::camera::TestPattern

use std::ffi::c_void;
use std::fmt::Display;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use cudarc::driver::{
    result as cu_result, sys as cu_sys, CudaContext, CudaEvent, CudaFunction, CudaModule,
    CudaSlice, CudaStream, DevicePtr, PinnedHostSlice,
};
use tegra_interop::core::{MemoryImport, SignalParams, TimelineTracker, WaitParams};
use tegra_interop::driver::{
    Backend, Context, ExternalMemory, ExternalSemaphore, MappedBuffer, Stream,
};
use tegra_interop::vulkan::{
    HostHandover, MemoryLocation, SemaphoreOp, VulkanExporter, VulkanMemory, VulkanSemaphore,
};

use crate::ring::FenceSchedule;
use crate::transport::{Completion, FrameGeometry, FrameTransport, TransportError};

/// Name printed as `backend: ...`.
pub const BACKEND_NAME: &str = "vulkan-cuda";

/// How long the producer waits for a slot to be freed before giving up.
const FREE_WAIT: Duration = Duration::from_secs(10);

/// How long the completion thread keeps waiting for a frame once the
/// transport is being torn down.
const TEARDOWN_WAIT: Duration = Duration::from_secs(10);

/// Threads per block of the kernel (a multiple of the warp size).
const BLOCK: u32 = 256;

/// Bytes each kernel thread handles per step (one 16-byte vector).
const BYTES_PER_THREAD: usize = 16;

/// Where the consumer processes the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The kernel works on the imported Vulkan memory in place (zero-copy).
    ZeroCopy,
    /// The frame is copied into a device-local CUDA buffer, processed there
    /// and copied back (the copy-based variant, for comparison).
    DeviceCopy,
}

impl Mode {
    /// [`Mode::DeviceCopy`] for the pipeline's `--copy`, else zero-copy.
    pub fn from_copy_flag(copy: bool) -> Mode {
        if copy {
            Mode::DeviceCopy
        } else {
            Mode::ZeroCopy
        }
    }
}

/// How the producer hands a frame to CUDA and takes the slot back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover {
    /// Through Vulkan queue batches ([`VulkanExporter::release_host_writes`],
    /// [`VulkanExporter::acquire_for_host`]): the release makes the host's
    /// writes visible to the device before it signals *ready*, the acquire
    /// waits for *free* on the queue and makes the device's writes visible to
    /// the host. The default, and the only correct one.
    Queue,
    /// Host-side semaphore operations only (`vkSignalSemaphore` for *ready*,
    /// `vkWaitSemaphores` for *free*): the first design, which read stale
    /// frames on the H200. Kept as a diagnosis control, selected with
    /// `TEGRA_INTEROP_GPU_HANDOVER=host-only`; it is expected to fail
    /// verification.
    HostOnly,
}

impl Handover {
    /// The environment variable that selects the diagnosis control.
    pub const ENV: &'static str = "TEGRA_INTEROP_GPU_HANDOVER";

    /// [`Handover::Queue`] unless [`Handover::ENV`] says `host-only`
    /// (`queue` is accepted too; anything else is an error).
    pub fn from_env() -> Result<Handover, TransportError> {
        match std::env::var(Self::ENV) {
            Err(std::env::VarError::NotPresent) => Ok(Handover::Queue),
            Ok(v) => Self::parse(&v),
            Err(e) => Err(TransportError::new(format!("{}: {e}", Self::ENV))),
        }
    }

    /// `queue` or `host-only`.
    pub fn parse(value: &str) -> Result<Handover, TransportError> {
        match value {
            "queue" => Ok(Handover::Queue),
            "host-only" => Ok(Handover::HostOnly),
            v => Err(TransportError::new(format!(
                "{}={v:?}: expected `queue` or `host-only`",
                Self::ENV
            ))),
        }
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
/// The `_sysmem` variant and the two copy kernels touch the imported
/// host-visible Vulkan memory with `ld.global.cv` loads (cached system-memory
/// lines are treated as stale and fetched again) and `st.global.wt` stores
/// (written through to system memory). They were tried while frames were
/// still handed over with host-side semaphore operations only, and did not
/// stop the consumer from reading stale bytes (see the module docs and
/// BENCHMARKS.md); the fix is the queue handover ([`Handover::Queue`]). They
/// are kept because they cost nothing measurable here and do not rely on
/// cached system-memory lines.
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
fn self_check_pattern(stride: usize, rows: usize) -> Result<(), TransportError> {
    use tegra_interop::camera::TestPattern;
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

fn err(what: &'static str) -> impl Fn(&dyn Display) -> TransportError {
    move |e| TransportError::new(format!("{what}: {}", e.to_string().replace('\n', " ")))
}

fn cu_call(call: &'static str, r: cu_sys::CUresult) -> Result<(), TransportError> {
    r.result()
        .map_err(|e| TransportError::new(format!("{call} failed: {e}")))
}

/// The NVRTC-compiled consumer kernels.
pub struct Kernel {
    _module: Arc<CudaModule>,
    /// `check_and_invert` (device memory).
    device: CudaFunction,
    /// `check_and_invert_sysmem` (imported host memory).
    sysmem: CudaFunction,
    /// `copy_from_sysmem`.
    copy_in: CudaFunction,
    /// `copy_to_sysmem`.
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
}

/// Launches `function` on `stream` over `grid` blocks of [`BLOCK`] threads.
///
/// # Safety
/// `params` must match the kernel's parameter list (one pointer to a value
/// of each parameter's type), and every device address among them must stay
/// valid until the kernel has run.
unsafe fn launch(
    function: &CudaFunction,
    grid: u32,
    stream: cu_sys::CUstream,
    params: &mut [*mut c_void],
    what: &'static str,
) -> Result<(), TransportError> {
    // SAFETY: the caller's contract; the driver copies the parameter values
    // during the call.
    unsafe {
        cu_result::launch_kernel(
            function.cu_function(),
            (grid, 1, 1),
            (BLOCK, 1, 1),
            0,
            stream,
            params,
        )
    }
    .map_err(|e| err(what)(&e))
}

/// Queues a copy kernel: `len` bytes from `src` to `dst`.
///
/// # Safety
/// `src` and `dst` must be device addresses of at least `len` bytes each,
/// valid until the copy has run, not overlapping.
unsafe fn launch_copy(
    function: &CudaFunction,
    grid: u32,
    stream: cu_sys::CUstream,
    dst: cu_sys::CUdeviceptr,
    src: cu_sys::CUdeviceptr,
    len: usize,
    what: &'static str,
) -> Result<(), TransportError> {
    let (mut dst, mut src, mut len) = (dst, src, len as u64);
    let mut params: [*mut c_void; 3] = [
        (&mut dst as *mut u64).cast(),
        (&mut src as *mut u64).cast(),
        (&mut len as *mut u64).cast(),
    ];
    // SAFETY: `(unsigned char*, const unsigned char*, u64)` is the copy
    // kernels' parameter list; the addresses are the caller's to keep valid.
    unsafe { launch(function, grid, stream, &mut params, what) }
}

/// Whether cudarc can load NVRTC (it panics on first use when it cannot).
fn nvrtc_present() -> Result<(), TransportError> {
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

/// Whether the discrete-GPU transport can run here: the reason either way,
/// in one line.
pub fn probe() -> Result<String, String> {
    let backend =
        Backend::real().map_err(|e| format!("no CUDA driver ({e})").replace('\n', " "))?;
    let device = backend
        .device(0)
        .map_err(|e| format!("no CUDA device ({e})"))?;
    let name = device.name().unwrap_or_else(|_| "device 0".into());
    if device
        .is_integrated()
        .map_err(|e| format!("cannot tell whether {name} is integrated ({e})"))?
    {
        return Err(format!(
            "device 0 ({name}) is an integrated GPU: use the jetson backend"
        ));
    }
    if !device
        .supports_timeline_semaphore_interop()
        .map_err(|e| format!("cannot query timeline-semaphore interop ({e})"))?
    {
        return Err(format!(
            "device 0 ({name}) does not support timeline-semaphore interop"
        ));
    }
    let uuid = device
        .uuid()
        .map_err(|e| format!("cannot read the CUDA device UUID ({e})"))?;
    let vk = VulkanExporter::new(uuid).map_err(|e| format!("Vulkan: {e}"))?;
    nvrtc_present().map_err(|e| e.0)?;
    Ok(format!(
        "device 0 ({name}) is a discrete GPU with timeline-semaphore interop, Vulkan device {} has its UUID, NVRTC found",
        vk.device_info().name
    ))
}

/// CUDA events of one slot, created once and recorded for every frame.
struct SlotEvents {
    /// After the stream's wait for *ready*.
    start: CudaEvent,
    /// Before the kernel (after the copy in, in copy mode).
    kernel_start: CudaEvent,
    /// After the kernel.
    kernel_end: CudaEvent,
    /// After everything of the frame, *free* signal included.
    end: CudaEvent,
}

impl SlotEvents {
    fn new(ctx: &Arc<CudaContext>) -> Result<SlotEvents, TransportError> {
        let make = || {
            ctx.new_event(Some(cu_sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| err("creating a CUDA event")(&e))
        };
        Ok(SlotEvents {
            start: make()?,
            kernel_start: make()?,
            kernel_end: make()?,
            end: make()?,
        })
    }
}

/// Work for the completion thread: a submitted frame.
struct Job {
    slot: usize,
    frame: u64,
}

/// A frame the completion thread saw finish.
struct Done {
    slot: usize,
    frame: u64,
    finished: Instant,
}

/// Waits, in submission order, for each frame's end event and reports when
/// it completed.
fn completion_loop(
    ctx: Arc<CudaContext>,
    events: Arc<Vec<SlotEvents>>,
    jobs: Receiver<Job>,
    done: SyncSender<Result<Done, TransportError>>,
    stopping: Arc<AtomicBool>,
) {
    if let Err(e) = ctx.bind_to_thread() {
        let _ = done.send(Err(err("binding the CUDA context")(&e)));
        return;
    }
    while let Ok(Job { slot, frame }) = jobs.recv() {
        let event = &events[slot].end;
        let mut stop_seen: Option<Instant> = None;
        let result = loop {
            match event.try_is_complete() {
                Ok(true) => {
                    break Ok(Done {
                        slot,
                        frame,
                        finished: Instant::now(),
                    })
                }
                Ok(false) => {}
                Err(e) => break Err(err("the consumer stream failed")(&e)),
            }
            if stopping.load(Ordering::Acquire) {
                let since = *stop_seen.get_or_insert_with(Instant::now);
                if since.elapsed() > TEARDOWN_WAIT {
                    break Err(TransportError::new(format!(
                        "frame {frame} in slot {slot} did not finish within {TEARDOWN_WAIT:?} of teardown"
                    )));
                }
            }
            thread::yield_now();
        };
        let failed = result.is_err();
        if done.send(result).is_err() || failed {
            return;
        }
    }
}

/// Mean GPU-side times per frame, from the CUDA events.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuTimes {
    /// Frames measured.
    pub frames: u64,
    /// From the end of the *ready* wait to the kernel's start (the copy into
    /// device memory in copy mode; about zero in zero-copy mode).
    pub copy_in: Duration,
    /// The kernel.
    pub kernel: Duration,
    /// From the kernel's end to the frame's end (the copy back in copy mode,
    /// the counter read-back and the *free* signal).
    pub tail: Duration,
}

/// The discrete-GPU transport (see the module docs). Made by
/// [`with_transport`].
pub struct GpuTransport<'a> {
    geometry: FrameGeometry,
    schedule: FenceSchedule,
    mode: Mode,
    location: MemoryLocation,
    ctx: &'a Context,
    kernel: &'a Kernel,
    grid: u32,
    // CUDA side; dropped first (after `Drop::drop` drained the stream).
    free_cu: Vec<ExternalSemaphore<'a>>,
    ready_cu: Vec<ExternalSemaphore<'a>>,
    mapped: Vec<MappedBuffer<'a>>,
    /// Copy mode: one device-local buffer per slot (and their addresses).
    _device_frames: Vec<CudaSlice<u8>>,
    device_ptrs: Vec<cu_sys::CUdeviceptr>,
    /// One mismatch counter per slot, on the device.
    _counters: CudaSlice<u64>,
    counters_ptr: cu_sys::CUdeviceptr,
    /// Their copies, in pinned host memory.
    _counters_host: PinnedHostSlice<u64>,
    counters_host_ptr: NonNull<u64>,
    events: Arc<Vec<SlotEvents>>,
    stream: Stream<'a>,
    cstream: Arc<CudaStream>,
    // Vulkan side.
    vk: &'a VulkanExporter,
    handover: Handover,
    /// Per slot: the recorded host <-> CUDA handover batches of its frame.
    handovers: Vec<HostHandover>,
    frames: &'a mut [VulkanMemory],
    ready_vk: Vec<VulkanSemaphore>,
    free_vk: Vec<VulkanSemaphore>,
    /// Values signalled on each slot's *ready* semaphore.
    ready_track: Vec<TimelineTracker>,
    /// The *ready* value each slot's last submitted consumer waits for.
    ready_awaited: Vec<u64>,
    /// Per slot: the frame acquired by the producer, not yet released.
    acquired: Vec<Option<u64>>,
    /// Per slot: when its current frame was signalled ready.
    released_at: Vec<Option<Instant>>,
    /// Per slot: the frame submitted to the consumer, not yet collected.
    in_flight: Vec<Option<u64>>,
    prev_finished: Option<Instant>,
    times: GpuTimes,
    jobs: Option<SyncSender<Job>>,
    done: Receiver<Result<Done, TransportError>>,
    stopping: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
}

/// Allocates one exportable host-visible Vulkan allocation per slot:
/// host-cached memory where the device has it, else plain host-visible.
fn allocate_frames(
    vk: &VulkanExporter,
    len: usize,
    slots: usize,
) -> Result<(Vec<VulkanMemory>, MemoryLocation), TransportError> {
    let len = len as u64;
    let location = match vk.allocate_memory(len, MemoryLocation::HostCached) {
        Ok(first) => {
            let mut frames = Vec::with_capacity(slots);
            frames.push(first);
            for _ in 1..slots {
                frames.push(
                    vk.allocate_memory(len, MemoryLocation::HostCached)
                        .map_err(|e| err("allocating a frame buffer in Vulkan")(&e))?,
                );
            }
            return Ok((frames, MemoryLocation::HostCached));
        }
        Err(tegra_interop::vulkan::Error::NoMemoryType { .. }) => MemoryLocation::HostVisible,
        Err(e) => return Err(err("allocating a frame buffer in Vulkan")(&e)),
    };
    let frames = (0..slots)
        .map(|_| vk.allocate_memory(len, location))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err("allocating a frame buffer in Vulkan")(&e))?;
    Ok((frames, location))
}

/// Exports `memory` and imports it into CUDA once, with the size Vulkan
/// allocated (dedicated where Vulkan made a dedicated allocation).
fn import_frame<'c>(
    ctx: &'c Context,
    memory: &VulkanMemory,
) -> Result<ExternalMemory<'c>, TransportError> {
    let fd = memory
        .export_fd()
        .map_err(|e| err("exporting a frame buffer from Vulkan")(&e))?;
    let mut import = MemoryImport::opaque_fd(fd.as_raw_fd(), memory.size())
        .map_err(|e| err("describing the frame import")(&e))?;
    if memory.dedicated() {
        import = import.dedicated();
    }
    ExternalMemory::import_fd(ctx, fd, import)
        .map_err(|e| err("importing a frame buffer into CUDA")(&e.into_parts().0))
}

/// What the pipeline prints about how frames are processed.
fn note(mode: Mode, location: MemoryLocation, handover: Handover) -> &'static str {
    if handover == Handover::HostOnly {
        return "DIAGNOSIS CONTROL (TEGRA_INTEROP_GPU_HANDOVER=host-only): ready is signalled and free waited for on the host only, with no Vulkan queue batch; expected to fail verification";
    }
    match (mode, location) {
        (Mode::ZeroCopy, MemoryLocation::HostCached) => {
            "zero-copy: frames live in host-cached Vulkan memory imported into CUDA; an NVRTC kernel checks and inverts them in place (over PCIe)"
        }
        (Mode::ZeroCopy, _) => {
            "zero-copy: frames live in host-visible (uncached) Vulkan memory imported into CUDA; an NVRTC kernel checks and inverts them in place (over PCIe)"
        }
        (Mode::DeviceCopy, MemoryLocation::HostCached) => {
            "copy-based: frames live in host-cached Vulkan memory; a CUDA copy kernel moves each into device memory, an NVRTC kernel checks and inverts it there, a copy kernel moves it back"
        }
        (Mode::DeviceCopy, _) => {
            "copy-based: frames live in host-visible (uncached) Vulkan memory; a CUDA copy kernel moves each into device memory, an NVRTC kernel checks and inverts it there, a copy kernel moves it back"
        }
    }
}

/// Opens the discrete-GPU transport for `geometry` and `schedule` and runs
/// `f` over it, with a one-line note on how frames are processed. Everything
/// (CUDA context, Vulkan device, ring, kernel) is made before `f` runs and
/// released, in order, after it returns; a consumer still waiting for a
/// frame that was never released is let through first, so teardown does not
/// hang.
pub fn with_transport<R>(
    geometry: FrameGeometry,
    schedule: FenceSchedule,
    mode: Mode,
    f: impl FnOnce(&mut GpuTransport<'_>, &'static str) -> R,
) -> Result<R, TransportError> {
    let len = geometry.frame_len();
    if len == 0 || geometry.stride == 0 {
        return Err(TransportError::new("frames of zero bytes cannot be shared"));
    }
    self_check_pattern(geometry.stride, geometry.rows)?;
    let backend = Backend::real().map_err(|e| err("CUDA driver")(&e))?;
    let uuid = backend
        .device(0)
        .and_then(|d| d.uuid())
        .map_err(|e| err("CUDA device 0")(&e))?;
    let vk = VulkanExporter::new(uuid).map_err(|e| err("Vulkan")(&e))?;
    let ctx = Context::new(Arc::clone(&backend), 0).map_err(|e| err("CUDA context")(&e))?;
    let cu = ctx
        .cudarc()
        .cloned()
        .ok_or_else(|| TransportError::new("the CUDA context did not come from cudarc"))?;
    let kernel = Kernel::compile(&cu)?;
    let (mut frames, location) = allocate_frames(&vk, len, schedule.slots())?;
    let imports = frames
        .iter()
        .map(|m| import_frame(&ctx, m))
        .collect::<Result<Vec<_>, _>>()?;
    let mut transport = GpuTransport::new(
        &ctx,
        &cu,
        &vk,
        Handover::from_env()?,
        &kernel,
        &mut frames,
        &imports,
        geometry,
        schedule,
        mode,
        location,
    )?;
    let line = note(mode, location, transport.handover);
    let result = f(&mut transport, line);
    transport.shut_down()?;
    drop(transport);
    let errors = backend.take_drop_errors();
    if let Some(e) = errors.first() {
        return Err(err("releasing the CUDA objects")(e));
    }
    Ok(result)
}

impl<'a> GpuTransport<'a> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        ctx: &'a Context,
        cu: &Arc<CudaContext>,
        vk: &'a VulkanExporter,
        handover: Handover,
        kernel: &'a Kernel,
        frames: &'a mut [VulkanMemory],
        imports: &'a [ExternalMemory<'a>],
        geometry: FrameGeometry,
        schedule: FenceSchedule,
        mode: Mode,
        location: MemoryLocation,
    ) -> Result<GpuTransport<'a>, TransportError> {
        let slots = schedule.slots();
        let len = geometry.frame_len();
        let mapped = imports
            .iter()
            .map(|m| m.map_whole())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| err("mapping a frame buffer in CUDA")(&e))?;
        let cstream = cu
            .new_stream()
            .map_err(|e| err("creating the CUDA stream")(&e))?;
        let stream = Stream::from_cudarc(ctx, Arc::clone(&cstream))
            .map_err(|e| err("wrapping the CUDA stream")(&e))?;

        let mut ready_vk = Vec::with_capacity(slots);
        let mut free_vk = Vec::with_capacity(slots);
        let mut ready_cu = Vec::with_capacity(slots);
        let mut free_cu = Vec::with_capacity(slots);
        for _ in 0..slots {
            let (fd, sem) = vk
                .export_timeline_semaphore(0)
                .map_err(|e| err("exporting a ready semaphore from Vulkan")(&e))?;
            ready_vk.push(sem);
            ready_cu.push(
                ExternalSemaphore::timeline_fd(ctx, fd)
                    .map_err(|e| err("importing a ready semaphore")(&e.into_parts().0))?,
            );
            let (fd, sem) = vk
                .export_timeline_semaphore(0)
                .map_err(|e| err("exporting a free semaphore from Vulkan")(&e))?;
            free_vk.push(sem);
            free_cu.push(
                ExternalSemaphore::timeline_fd(ctx, fd)
                    .map_err(|e| err("importing a free semaphore")(&e.into_parts().0))?,
            );
        }

        let (device_frames, device_ptrs) = match mode {
            Mode::ZeroCopy => (Vec::new(), Vec::new()),
            Mode::DeviceCopy => {
                let mut bufs = Vec::with_capacity(slots);
                let mut ptrs = Vec::with_capacity(slots);
                for _ in 0..slots {
                    let b = cstream
                        .alloc_zeros::<u8>(len)
                        .map_err(|e| err("allocating a device frame buffer")(&e))?;
                    ptrs.push(b.device_ptr(&cstream).0);
                    bufs.push(b);
                }
                (bufs, ptrs)
            }
        };
        let counters = cstream
            .alloc_zeros::<u64>(slots)
            .map_err(|e| err("allocating the mismatch counters")(&e))?;
        let counters_ptr = counters.device_ptr(&cstream).0;
        // SAFETY: pinned host memory for `slots` u64 values; it is only read
        // after the stream copied a counter into it (see `collect`).
        let mut counters_host = unsafe { cu.alloc_pinned::<u64>(slots) }
            .map_err(|e| err("allocating pinned host memory")(&e))?;
        let counters_host_ptr = counters_host
            .as_mut_ptr()
            .ok()
            .and_then(NonNull::new)
            .ok_or_else(|| TransportError::new("pinned host memory has no address"))?;
        let events = Arc::new(
            (0..slots)
                .map(|_| SlotEvents::new(cu))
                .collect::<Result<Vec<_>, _>>()?,
        );
        // Every allocation above is stream-ordered: let it land before use.
        cstream
            .synchronize()
            .map_err(|e| err("synchronising the CUDA stream")(&e))?;

        let handovers = frames
            .iter()
            .map(|m| vk.host_handover(m))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| err("recording the frame handover batches")(&e))?;

        let (jobs_tx, jobs_rx) = mpsc::sync_channel::<Job>(slots);
        let (done_tx, done_rx) = mpsc::sync_channel(slots);
        let stopping = Arc::new(AtomicBool::new(false));
        let worker = {
            let (cu, events, stopping) =
                (Arc::clone(cu), Arc::clone(&events), Arc::clone(&stopping));
            thread::Builder::new()
                .name("gpu-completions".into())
                .spawn(move || completion_loop(cu, events, jobs_rx, done_tx, stopping))
                .map_err(|e| err("starting the completion thread")(&e))?
        };
        let vectors = len.div_ceil(BYTES_PER_THREAD);
        let grid =
            u32::try_from(vectors.div_ceil(BLOCK as usize).clamp(1, 1 << 20)).unwrap_or(1 << 20);
        Ok(GpuTransport {
            geometry,
            schedule,
            mode,
            location,
            ctx,
            kernel,
            grid,
            free_cu,
            ready_cu,
            mapped,
            _device_frames: device_frames,
            device_ptrs,
            _counters: counters,
            counters_ptr,
            _counters_host: counters_host,
            counters_host_ptr,
            events,
            stream,
            cstream,
            vk,
            handover,
            handovers,
            frames,
            ready_vk,
            free_vk,
            ready_track: vec![TimelineTracker::new(0); slots],
            ready_awaited: vec![0; slots],
            acquired: vec![None; slots],
            released_at: vec![None; slots],
            in_flight: vec![None; slots],
            prev_finished: None,
            times: GpuTimes::default(),
            jobs: Some(jobs_tx),
            done: done_rx,
            stopping,
            worker: Some(worker),
        })
    }

    /// Processing mode.
    #[allow(dead_code)] // for tests/gpu_pipeline.rs; the pipeline prints the note instead
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Where the frame buffers live (host-cached or plain host-visible).
    #[allow(dead_code)] // for tests/gpu_pipeline.rs
    pub fn memory_location(&self) -> MemoryLocation {
        self.location
    }

    /// Mean GPU-side times of the frames collected so far.
    #[allow(dead_code)] // for tests/gpu_pipeline.rs
    pub fn gpu_times(&self) -> GpuTimes {
        let n = self.times.frames.max(1) as u32;
        GpuTimes {
            frames: self.times.frames,
            copy_in: self.times.copy_in / n,
            kernel: self.times.kernel / n,
            tail: self.times.tail / n,
        }
    }

    fn check_slot(&self, slot: usize, frame: u64) -> Result<(), TransportError> {
        if slot != self.schedule.slot(frame) {
            return Err(TransportError::new(format!(
                "frame {frame} belongs in slot {}, not {slot}",
                self.schedule.slot(frame)
            )));
        }
        Ok(())
    }

    /// Queues the consumer's work for `frame` (see [`FrameTransport::consumer_submit`]).
    fn enqueue(&mut self, slot: usize, frame: u64) -> Result<(), TransportError> {
        let want = self.schedule.ready_value(frame);
        self.stream
            .wait(&self.ready_cu[slot], WaitParams::timeline(want))
            .map_err(|e| err("CUDA wait for the ready fence")(&e))?;
        self.ready_awaited[slot] = want;
        let ev = &self.events[slot];
        let record = |e: &CudaEvent| {
            e.record(&self.cstream)
                .map_err(|x| err("recording a CUDA event")(&x))
        };
        record(&ev.start)?;
        let s = self.cstream.cu_stream();
        let len = self.geometry.frame_len();
        let frame_ptr = self.mapped[slot].device_ptr();
        let work_ptr = match self.mode {
            Mode::ZeroCopy => frame_ptr,
            Mode::DeviceCopy => {
                let dev = self.device_ptrs[slot];
                // SAFETY: both ranges are `len` bytes of live allocations
                // (the mapping of the slot's import, the slot's device
                // buffer) that outlive the queued copy (torn down only after
                // the stream is drained); they do not overlap.
                unsafe {
                    launch_copy(
                        &self.kernel.copy_in,
                        self.grid,
                        s,
                        dev,
                        frame_ptr,
                        len,
                        "copying the frame into device memory",
                    )
                }?;
                dev
            }
        };
        record(&ev.kernel_start)?;
        let counter = self.counters_ptr + (slot * std::mem::size_of::<u64>()) as u64;
        // SAFETY: the slot's 8-byte counter inside the live counter buffer.
        unsafe { cu_result::memset_d8_async(counter, 0, std::mem::size_of::<u64>(), s) }
            .map_err(|e| err("clearing the mismatch counter")(&e))?;
        let mut arg_buf = work_ptr;
        let mut arg_len = len as u64;
        let mut arg_stride = self.geometry.stride as u64;
        let mut arg_seed = pattern_seed(frame);
        let mut arg_counter = counter;
        let mut params: [*mut c_void; 5] = [
            (&mut arg_buf as *mut u64).cast(),
            (&mut arg_len as *mut u64).cast(),
            (&mut arg_stride as *mut u64).cast(),
            (&mut arg_seed as *mut u32).cast(),
            (&mut arg_counter as *mut u64).cast(),
        ];
        let function = match self.mode {
            Mode::ZeroCopy => &self.kernel.sysmem,
            Mode::DeviceCopy => &self.kernel.device,
        };
        // SAFETY: the parameters match the kernels' signature
        // `(unsigned char*, u64, u64, u32, u64*)` and point at locals that
        // live across the call; the kernel touches `len` bytes at `work_ptr`
        // (a live mapping or device buffer of at least that size) and the
        // slot's counter.
        unsafe {
            launch(
                function,
                self.grid,
                s,
                &mut params,
                "launching the consumer kernel",
            )
        }?;
        record(&ev.kernel_end)?;
        if self.mode == Mode::DeviceCopy {
            // SAFETY: as for the copy in, in the other direction.
            unsafe {
                launch_copy(
                    &self.kernel.copy_out,
                    self.grid,
                    s,
                    frame_ptr,
                    work_ptr,
                    len,
                    "copying the frame back from device memory",
                )
            }?;
        }
        // SAFETY: the destination is the slot's u64 in pinned host memory
        // owned by `self`; the host reads it only after this frame's end
        // event completed (in `collect`), and the next copy into it is
        // queued only after that.
        cu_call("cuMemcpyDtoHAsync", unsafe {
            cu_sys::cuMemcpyDtoHAsync_v2(
                self.counters_host_ptr.as_ptr().add(slot).cast(),
                counter,
                std::mem::size_of::<u64>(),
                s,
            )
        })?;
        let expect = self.schedule.free_signal_value(frame);
        let tracked = self
            .stream
            .signal(&mut self.free_cu[slot], SignalParams::timeline(expect))
            .map_err(|e| err("CUDA signal of the free fence")(&e))?;
        if tracked != Some(expect) {
            return Err(TransportError::new(format!(
                "slot {slot}: the free fence is tracked at {tracked:?} after signalling {expect}"
            )));
        }
        record(&ev.end)?;
        Ok(())
    }

    /// Turns a finished frame into its completion.
    fn collect(&mut self, d: Done) -> Result<Completion, TransportError> {
        if self.in_flight[d.slot] != Some(d.frame) {
            return Err(TransportError::new(format!(
                "completion of frame {} in slot {} that was not in flight",
                d.frame, d.slot
            )));
        }
        self.in_flight[d.slot] = None;
        let ev = &self.events[d.slot];
        let span = |a: &CudaEvent, b: &CudaEvent| {
            a.elapsed_ms(b)
                .map(|ms| Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
                .map_err(|e| err("reading CUDA event times")(&e))
        };
        let copy_in = span(&ev.start, &ev.kernel_start)?;
        let process = span(&ev.kernel_start, &ev.kernel_end)?;
        let tail = span(&ev.kernel_end, &ev.end)?;
        self.times.frames += 1;
        self.times.copy_in += copy_in;
        self.times.kernel += process;
        self.times.tail += tail;
        // SAFETY: the frame's end event completed, so the copy of its
        // counter into this pinned u64 (queued before the event) is done,
        // and no other copy into it is queued until the slot's next frame.
        let mismatches = unsafe { self.counters_host_ptr.as_ptr().add(d.slot).read_volatile() };
        let queued = match (self.prev_finished, self.released_at[d.slot]) {
            (Some(prev), Some(ready)) => prev.saturating_duration_since(ready),
            _ => Duration::ZERO,
        };
        self.prev_finished = Some(d.finished);
        Ok(Completion {
            slot: d.slot,
            frame: d.frame,
            mismatches,
            process,
            queued,
            finished: d.finished,
        })
    }

    /// Lets every consumer still waiting for a frame that was never released
    /// through (it then processes whatever the slot holds), waits for the
    /// stream and stops the completion thread. Idempotent.
    fn shut_down(&mut self) -> Result<(), TransportError> {
        let mut first: Option<TransportError> = None;
        for slot in 0..self.ready_vk.len() {
            let last = self.ready_track[slot].last();
            if self.ready_awaited[slot] > last {
                if let Err(e) = self.ready_vk[slot].signal(self.ready_awaited[slot]) {
                    first.get_or_insert(err("releasing a waiting consumer")(&e));
                } else {
                    self.ready_track[slot] = TimelineTracker::new(self.ready_awaited[slot]);
                }
            }
        }
        if first.is_none() {
            if let Err(e) = self.stream.synchronize() {
                first.get_or_insert(err("draining the CUDA stream")(&e));
            }
        }
        self.stopping.store(true, Ordering::Release);
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            if w.join().is_err() {
                first.get_or_insert(TransportError::new("the completion thread panicked"));
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for GpuTransport<'_> {
    fn drop(&mut self) {
        // Errors were reported by `with_transport` where it could; a drop
        // after a failed run only needs the stream drained and the thread
        // stopped.
        let _ = self.shut_down();
    }
}

impl FrameTransport for GpuTransport<'_> {
    fn backend(&self) -> &'static str {
        BACKEND_NAME
    }

    fn slot_count(&self) -> usize {
        self.schedule.slots()
    }

    fn geometry(&self) -> FrameGeometry {
        self.geometry
    }

    fn producer_acquire(&mut self, slot: usize, frame: u64) -> Result<&mut [u8], TransportError> {
        self.check_slot(slot, frame)?;
        let want = self.schedule.free_wait_value(frame);
        if self.acquired[slot] != Some(frame) {
            // Only a frame already submitted can free the slot to `want`.
            let promised = self.free_cu[slot].last_timeline_value().unwrap_or(0);
            if promised < want {
                return Err(TransportError::new(format!(
                    "slot {slot}: frame {frame} waits for its free fence to reach {want}, but the consumer was only asked to signal up to {promised}"
                )));
            }
            let reached = match self.handover {
                Handover::Queue => self.vk.acquire_for_host(
                    &self.handovers[slot],
                    &self.frames[slot],
                    &[SemaphoreOp::timeline(&self.free_vk[slot], want)],
                    FREE_WAIT,
                ),
                Handover::HostOnly => self.free_vk[slot].wait(want, FREE_WAIT),
            }
            .map_err(|e| err("waiting for the free fence")(&e))?;
            if !reached {
                return Err(TransportError::new(format!(
                    "slot {slot}: the consumer did not free it (value {want}) within {FREE_WAIT:?}"
                )));
            }
            let value = self.free_vk[slot]
                .value()
                .map_err(|e| err("reading the free fence")(&e))?;
            if value != want {
                return Err(TransportError::new(format!(
                    "slot {slot} free fence is {value}, producer of frame {frame} waits for {want}"
                )));
            }
            self.acquired[slot] = Some(frame);
        }
        let len = self.geometry.frame_len();
        // SAFETY: the slot's free fence reached the value the consumer
        // signals after its last access to this memory (kernel, copies);
        // the consumer's next access waits for this slot's ready fence,
        // which only `producer_release` signals, and that takes `&mut self`,
        // so it cannot run while the returned slice is alive.
        let bytes = unsafe { self.frames[slot].host_bytes_mut() }
            .map_err(|e| err("mapping the frame buffer")(&e))?;
        bytes
            .get_mut(..len)
            .ok_or_else(|| TransportError::new("the Vulkan allocation is smaller than a frame"))
    }

    fn producer_release(&mut self, slot: usize, frame: u64) -> Result<(), TransportError> {
        self.check_slot(slot, frame)?;
        if self.acquired[slot] != Some(frame) {
            return Err(TransportError::new(format!(
                "release of frame {frame} in slot {slot}, which was not acquired"
            )));
        }
        let value = self.schedule.ready_value(frame);
        let tracker = &mut self.ready_track[slot];
        let reservation = tracker.reserve(value).map_err(|e| err("ready fence")(&e))?;
        let signalled = match self.handover {
            Handover::Queue => self.vk.release_host_writes(
                &self.handovers[slot],
                &self.frames[slot],
                &[],
                &[SemaphoreOp::timeline(
                    &self.ready_vk[slot],
                    reservation.value(),
                )],
            ),
            Handover::HostOnly => self.ready_vk[slot].signal(reservation.value()),
        };
        match signalled {
            Ok(()) => {
                tracker
                    .commit(reservation)
                    .map_err(|e| err("ready fence")(&e))?;
            }
            Err(e) => {
                let _ = tracker.abort(reservation);
                return Err(err("Vulkan signal of the ready fence")(&e));
            }
        }
        self.acquired[slot] = None;
        self.released_at[slot] = Some(Instant::now());
        Ok(())
    }

    fn consumer_submit(&mut self, slot: usize, frame: u64) -> Result<(), TransportError> {
        self.check_slot(slot, frame)?;
        if let Some(f) = self.in_flight[slot] {
            return Err(TransportError::new(format!(
                "slot {slot} still has frame {f} in flight; collect it before submitting frame {frame}"
            )));
        }
        let want = self.schedule.ready_value(frame);
        let last = self.ready_track[slot].last();
        // Released (last == want) or about to be (wait before signal).
        if last != want && last + 1 != want {
            return Err(TransportError::new(format!(
                "slot {slot} ready fence is at {last}; the consumer of frame {frame} would wait for {want}"
            )));
        }
        if last + 1 == want {
            self.released_at[slot] = None;
        }
        self.ctx
            .bind()
            .map_err(|e| err("binding the CUDA context")(&e))?;
        self.enqueue(slot, frame)?;
        self.in_flight[slot] = Some(frame);
        self.jobs
            .as_ref()
            .ok_or_else(|| TransportError::new("the transport is shut down"))?
            .send(Job { slot, frame })
            .map_err(|_| TransportError::new("the completion thread stopped"))
    }

    fn try_complete(&mut self) -> Result<Option<Completion>, TransportError> {
        match self.done.try_recv() {
            Ok(d) => self.collect(d?).map(Some),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => {
                Err(TransportError::new("the completion thread stopped"))
            }
        }
    }

    fn wait_complete(&mut self) -> Result<Completion, TransportError> {
        if self.in_flight.iter().all(Option::is_none) {
            return Err(TransportError::new("no frame is in flight"));
        }
        let d = self
            .done
            .recv()
            .map_err(|_| TransportError::new("the completion thread stopped"))??;
        self.collect(d)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tegra_interop::camera::TestPattern;

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
    fn handover_values_parse() {
        assert_eq!(Handover::parse("queue").unwrap(), Handover::Queue);
        assert_eq!(Handover::parse("host-only").unwrap(), Handover::HostOnly);
        let e = Handover::parse("host").unwrap_err().0;
        assert!(e.contains(Handover::ENV) && e.contains("host-only"), "{e}");
    }

    #[test]
    fn copy_flag_selects_the_mode() {
        assert_eq!(Mode::from_copy_flag(false), Mode::ZeroCopy);
        assert_eq!(Mode::from_copy_flag(true), Mode::DeviceCopy);
    }

    #[test]
    fn probe_answers_in_one_line() {
        let line = match probe() {
            Ok(why) | Err(why) => why,
        };
        assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
    }
}
