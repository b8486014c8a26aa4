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
//!   signals it after processing ([`Stream::signal`](tegra_interop::driver::Stream::signal), whose driver-side
//!   tracking returns the value); before the host touches the slot again the
//!   producer submits the second recorded batch
//!   ([`VulkanExporter::acquire_for_host`]), which waits for *free* on the
//!   queue, takes the buffer back and makes the device's writes visible to
//!   the host. That batch ([`VulkanExporter::acquire_for_host_ahead`]) is
//!   submitted ahead, once the next frame's release is queued, and also
//!   signals a host-only semaphore; the producer host-waits only for that
//!   semaphore when it comes back to the slot, or when the pipeline borrows
//!   the slot to check its frame on the checker thread
//!   ([`FrameTransport::lend`]; `reclaim_ahead` cites the rule
//!   that makes this enough). A ring of one acquires inline. The memory types used are
//!   host-coherent, so the mapped range needs no explicit flush or
//!   invalidate.
//! - **Consumer**: one CUDA stream (two in copy mode); its work for a frame is queued before
//!   the camera writes the frame ([`TransportInfo::queues_before_ready`]:
//!   the stream waits for *ready* on the device, so the kernel starts as soon
//!   as the release batch signals, not after the host has queued ~10 calls),
//!   by an enqueue thread that owns the stream and the imports
//!   ([`FrameTransport::queue_consumer`] only hands it the ticket's slot and
//!   values, so those ~30-50 us of driver calls run beside the camera);
//!   per frame it waits for *ready*, runs a
//!   kernel compiled at run time with NVRTC (the [`crate::consumer`]
//!   module's source, shared with the NvSci transport's Jetson path) that
//!   counts the bytes that differ from [`TestPattern`] with an atomic and
//!   inverts every byte in place (exactly [`crate::transport::process_frame`];
//!   see "Launches" below; the kernel adds any mismatches to the slot's
//!   counter in mapped host memory) and signals *free*. A completion
//!   thread collects the frames from the consumer in order as their events
//!   complete and timestamps them, so a frame's finish time does not depend
//!   on when the pipeline's loop next looks.
//! - **Copy-based variant** ([`Mode::DeviceCopy`], the pipeline's `--copy`):
//!   the same, except that the frame is copied into a device-local CUDA
//!   buffer (a host-to-device transfer over PCIe), processed there and
//!   copied back before *free* is signalled, on two streams (see "Copy
//!   mode: two streams" below), from and to the frame's host mapping
//!   page-locked for CUDA in place (see "Copy mode: where the copies
//!   read" below). The kernel time is [`Completion::process`]; the copies
//!   count as interop overhead.
//!
//! # Copy mode: two streams
//!
//! A frame's copy in and the previous frame's copy out use the PCIe link in
//! opposite directions, and the copy engines carry both at once (measured
//! on an H100, issue 24: a pinned copy of a 1920x1080 RGBA8 frame takes
//! 168 / 170 us each way with both directions at once, against the 192 us
//! in + 12 us kernel + 163 us out per frame of the earlier one-stream
//! design, which ran them one after the other). So the first stream waits
//! for *ready*, copies the frame in (`cuMemcpyDtoDAsync` from the imported
//! frame to the slot's device buffer) and runs the kernel; the second stream
//! waits for the kernel's end event, copies the frame back, records the
//! frame's end and signals *free* (the shared [`Consumer`]'s
//! `Placement::DeviceCopy`). A slot's next frame is queued only after the
//! slot's last frame was collected (its end event completed: the ring), so
//! its copy in cannot overtake the last copy out of the same device buffer;
//! *ready* and *free* order both streams against the producer as before. [`CopyWith::Kernels`] keeps the earlier copy kernels
//! (on the same two streams) for comparison.
//!
//! Measured on an H100 (driver 580.159.04, 1920x1080 RGBA8, 3000 frames,
//! limits2 runs of 2026-11-27): from the imported host-cached Vulkan memory
//! the copy in and the copy back each take 238-252 us per frame while the
//! other runs (alone, a copy kernel's copy in took 182 us), against 163 /
//! 170 us for copies from pinned CUDA host memory both at once; copy kernels
//! instead of the engines on the two streams measured the same (2164-2764
//! frames/s against 2222-2908), as did rings of 6 and 8 (2850, 2873) and
//! queueing after the ready signal.
//!
//! Where the frame time goes at a ring of four (H100, same driver, 2000
//! frames, the pipeline's stage and transport lines, 2026-11-27, two runs
//! each): copy mode runs at 2773-2821 frames/s (today's binary 2694-2776
//! in the same call), frame time ~355 us = camera 226-234, handover 19-20,
//! waiting to collect the frame to check 47-66, waiting for its acquire
//! batch 30-38 and waiting for the checker 6-28 us. The producer thread waits
//! for the GPU: the frame it lends to the checker before frame `f` is
//! `f - 3`, and that frame's chain is camera and handover (~245 us), the
//! release batch until the CUDA stream passes its wait (186-215 us: in copy
//! mode every Vulkan batch shares the copy engines with CUDA's copies),
//! copy in 240 + kernel 12 + copy back 241 us, the acquire batch (~35 us):
//! ~960 us over three frames, ~320 us a frame. The entry stream blocks
//! ~100 us per frame in the ready wait. At a ring of eight the copies are
//! the bound instead: 316 / 324 us each way with both at once (2949
//! frames/s, six frame threads, the acquire two frames behind). So copy mode is bound by the copies from
//! the imported Vulkan memory (240-324 us each way against 163-170 us from
//! pinned CUDA memory) and by the Vulkan batches' latency behind them, not
//! by the producer's own work; zero-copy, measured alongside, holds its
//! rate (2869-3124 frames/s against today's 2869-3149).
//!
//! # Copy mode: where the copies read
//!
//! The copies first went through the frame's import
//! (`cuMemcpyDtoDAsync` from the mapped external memory), which the
//! figures above show slower than copies of pinned CUDA memory. The copy
//! probe (`crates/testkit/examples/copy_probe.rs`, two runs on an H100,
//! driver 580.159.04, 2026-11-27; 1920x1080 RGBA8, 200 copies per figure,
//! medians) measured, with one copy in and one copy out at once on two
//! streams: pinned `cuMemHostAlloc` memory 171-172 us (the slower of the
//! two; bound ~5800-5850 frames/s); the same host-cached Vulkan memory
//! through its import 171 / 385 us in the two runs (its copy in alone took
//! 12-13 us: reads of an unchanged import were served from the GPU's
//! cache, so the import's figures depend on what the host wrote since);
//! that memory's host mapping page-locked with `cuMemHostRegister` and
//! copied as host memory (`cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync`)
//! 171.6 / 167.6 us in the two runs with flags PORTABLE | DEVICEMAP (171.1
//! / 171.9 with flags 0): 0.97-1.00 of pinned. (The IOMEMORY flag is refused there,
//! INVALID_VALUE; copies through the registration's device address
//! measured the same in one run and 1.46 of pinned in the other.) So copy
//! mode registers each slot's whole mapping once at open
//! ([`CopyFrom::Registered`], the default; the consumer's
//! `copy_through_registered`) and copies from and to it as host memory;
//! [`CopyFrom::Import`] (`TEGRA_INTEROP_GPU_COPY_FROM=import`) keeps the
//! earlier path for comparison. Nothing else changes: the Vulkan batches
//! still make the host's writes visible before *ready* and the device's
//! writes visible to the host after *free*, and the registration lives in
//! the consumer, which is dropped (its streams drained) before the Vulkan
//! memory.
//!
//! # When the slot is taken back
//!
//! A frame's acquire batch waits on the Vulkan queue for the frame's
//! *free*, and a Vulkan queue runs its batches in order: every release
//! batch submitted after it waits too, and with it the *ready* of those
//! frames. So the acquire goes into the queue behind the release of
//! [`GpuOptions::reclaim_after`] later frames (default one): early enough
//! that the batch has run by the time the producer needs the slot, late
//! enough that the release behind it is rarely held. Two measured slower
//! in copy mode (H100, 2026-11-27: 1366-1446 frames/s against 2582-2717 at
//! one; the producer waited 295 us a frame for the acquire, which then ran
//! only one frame ahead of its use, behind CUDA's copies on the copy
//! engines). Where the producer needs a slot whose acquire's turn has not
//! come (a ring shorter than the distance, the last frames), the acquire
//! is submitted then and waited for. The report's transport line shows the
//! host's wait for the slots and how many acquires were submitted at need;
//! `TEGRA_INTEROP_GPU_RECLAIM_AFTER` sets the distance, for comparison.
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
//! fails the same way. BENCHMARKS-history.md ("The discrete-GPU pipeline, verified") has the
//! runs and figures.
//!
//! # What a handover costs here
//!
//! Measured with raw calls (gpu_bench's handover-latency table, BENCHMARKS-history.md
//! "Session 4" on the H200 and "Session 6" on an H100): a CUDA stream
//! passes its wait about 300-314 us after a Vulkan submission to the
//! graphics + compute family (or the compute-only one), and no sooner when
//! the host signals after waiting for the Vulkan batch, or when the CUDA
//! work is queued only after the batch completed: the first CUDA work after
//! any Vulkan work on that engine pays it, a switch between the two
//! contexts. After a submission to a transfer-only family it is 12-16 us,
//! hence the queue choice below; a host signal with no Vulkan work ahead
//! reaches the stream in about 7-13 us. Every frame needs a Vulkan batch
//! (above); the report's transport line shows ours ("host ready submission
//! -> stream past the wait").
//!
//! # Which queue
//!
//! The handover batches go to a queue of a transfer-only family where the
//! device has one (on NVIDIA, family 1: the copy engines), else to the first
//! family with compute. Measured on an H100 (gpu_bench, BENCHMARKS-history.md
//! "Session 6"): after a submission to the first family (graphics + compute)
//! or to the compute-only family, the next CUDA work ran ~300-314 us later,
//! the two contexts taking turns on the graphics/compute engine; after a
//! submission to the transfer-only family, 12-16 us later. The pipeline's
//! "host ready submission -> stream past the wait" fell from ~340 us to
//! ~22 us and its zero-copy rate rose from ~1370 to ~1560 frames/s.
//! In copy mode, where the copy engines carry the frames, the other
//! families are worse still (H100, 2026-11-27, ring of four): 615-619
//! frames/s with the compute-only or the first family against 2773-2821
//! with the transfer-only one, the stream passing its wait ~2 ms after the
//! ready submission.
//!
//! The batches stay correct on such a queue by the Vulkan rules the other
//! families follow: a queue submission makes the host's earlier writes
//! available to the device whatever the queue ("Host Write Ordering
//! Guarantees" in the specification's synchronisation chapter); the
//! batches' barriers use only the HOST and ALL_COMMANDS stages and the
//! ownership transfers to and from `VK_QUEUE_FAMILY_EXTERNAL` name the
//! queue's own family, all of which a transfer-only queue supports; the
//! timeline semaphore operations do not depend on the family.
//! `TEGRA_INTEROP_VK_QUEUE=first-compute` (or `compute-only`) selects the
//! other families for comparison.
//!
//! # Launches
//!
//! The consumer's CUDA work is the pipeline's shared [`Consumer`]
//! (`Placement::InPlace` for zero-copy, `Placement::DeviceCopy` for copy mode), on
//! the driver's function table (the seam): its streams, events, device
//! buffers, pinned counters and the NVRTC-compiled kernels are the
//! driver's owned handles, one `cuLaunchKernel` per kernel with no
//! per-launch events (with cudarc's builder and its per-slice events the
//! launch path measured 73-80 us per frame against 60-64 us for a raw
//! `cuLaunchKernel`; BENCHMARKS-history.md, "cudarc's launch builder on the
//! imported memory"). This module adds the fences: the entry stream waits
//! for *ready*, the exit stream signals *free*.
//!
//! [`TestPattern`]: crate::camera::TestPattern
use std::collections::VecDeque;
use std::fmt::Display;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::platform::vulkan::{
    Error as VkError, HostHandover, MemoryLocation, QueueChoice, SemaphoreKind, SemaphoreOp,
    VulkanExporter, VulkanMemory, VulkanSemaphore,
};
use tegra_interop::core::{MemoryImport, TimelineTracker};
use tegra_interop::driver::{Backend, Context, ExternalMemory, ExternalSemaphore, MappedBuffer};

use crate::transport::{
    Completion, DriverResultExt, FrameGeometry, FrameTransport, PeekedFrame, SlotMemory, Ticket,
    TransportError, TransportInfo,
};

use crate::consumer::shared::{Lendable, RegisteredFrame, VulkanFrame};
use crate::consumer::{
    self, CheckInvert, Consumer, ConsumerConfig, FrameMemory, FrameWork, Placement,
};

mod cuda;

pub use cuda::GpuTimes;
use cuda::{CudaSlot, Done, Enqueuer, Job, Request};

/// The largest [`GpuOptions::reclaim_after`] (a ring's most slots).
pub const MAX_RECLAIM_AFTER: usize = crate::slots::MAX_SLOTS;

/// Name printed as `backend: ...`.
pub const BACKEND_NAME: &str = "vulkan-cuda";

/// How long the producer waits for a slot to be freed before giving up.
const FREE_WAIT: Duration = Duration::from_secs(10);

/// How long the completion thread keeps waiting for a frame once the
/// transport is being torn down.
const TEARDOWN_WAIT: Duration = Duration::from_secs(10);

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

/// What moves the frame in and out of device memory in copy mode (the
/// shared consumer's choice): the copy engines (default; the copy in of one
/// frame and the copy back of the one before run at once, on two streams)
/// or copy kernels (the previous design, on the same two streams).
pub use crate::consumer::CopyWith;

/// Where copy mode's copy engines read and write the frames (with
/// [`CopyWith::Engines`]; copy kernels always go through the import).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyFrom {
    /// The frame's Vulkan host mapping, page-locked for CUDA in place
    /// (`cuMemHostRegister`, the driver's
    /// [`RegisteredHostMemory`](tegra_interop::driver::RegisteredHostMemory)),
    /// copied as host memory (`cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync`).
    /// The default: the copy probe measured these copies at the speed of
    /// pinned CUDA memory (see "Copy mode: where the copies read" in the
    /// module docs).
    Registered,
    /// The frame's import into CUDA (`cuMemcpyDtoDAsync` from the mapped
    /// external memory): the earlier design, kept for comparison.
    Import,
}

/// How the producer hands a frame to CUDA and takes the slot back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover {
    /// Through Vulkan queue batches ([`VulkanExporter::release_host_writes`],
    /// [`VulkanExporter::acquire_for_host`]): the release makes the host's
    /// writes visible to the device before it signals *ready* on the queue,
    /// the acquire waits for *free* on the queue and makes the device's
    /// writes visible to the host. The default, and the only correct one
    /// here. (Measured and dropped, 2026-11-24: letting the host wait for
    /// the release batch and then signal *ready* itself, correct by the same
    /// rules, was slower: any Vulkan queue work delays the CUDA stream by
    /// about 320 us on the H200, whoever signals; see BENCHMARKS-history.md, "Session 4".)
    Queue,
    /// Host-side semaphore operations only (`vkSignalSemaphore` for *ready*,
    /// `vkWaitSemaphores` for *free*): the first design, which read stale
    /// frames on the H200. Kept as a diagnosis control, selected with
    /// `TEGRA_INTEROP_GPU_HANDOVER=host-only`; it is expected to fail
    /// verification.
    HostOnly,
}

/// How the discrete-GPU transport works: what the program passes to
/// [`GpuTransport::open_with`]. [`GpuOptions::new`] gives the defaults (the
/// fastest correct choices measured); the other values are for comparison
/// and diagnosis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuOptions {
    /// Zero-copy or copy-based.
    pub mode: Mode,
    /// Copy mode: copy engines (default) or copy kernels.
    pub copy_with: CopyWith,
    /// Copy mode with the copy engines: the registered host mapping
    /// (default) or the import.
    pub copy_from: CopyFrom,
    /// The handover (default [`Handover::Queue`]).
    pub handover: Handover,
    /// Whether the consumer is queued before the frame is written (default
    /// on; see [`TransportInfo::queues_before_ready`]).
    pub early: bool,
    /// The Vulkan queue family of the handover batches; `None` (default): a
    /// transfer-only family where the device has one, else the first with
    /// compute (see "Which queue" in the module docs).
    pub queue: Option<QueueChoice>,
    /// How many later frames' release batches go into the Vulkan queue
    /// before a frame's acquire for the host (default 1, the fastest
    /// measured in both modes; see "When the slot is taken back" in the
    /// module docs), at most [`MAX_RECLAIM_AFTER`].
    pub reclaim_after: usize,
}

impl GpuOptions {
    /// The defaults for `mode`.
    pub fn new(mode: Mode) -> GpuOptions {
        GpuOptions {
            mode,
            copy_with: CopyWith::Engines,
            copy_from: CopyFrom::Registered,
            handover: Handover::Queue,
            early: true,
            queue: None,
            reclaim_after: 1,
        }
    }

    /// Whether these options page-lock the frames' host mappings for the
    /// copies ([`CopyFrom::Registered`] in copy mode with the copy engines).
    pub fn registers_frames(&self) -> bool {
        self.mode == Mode::DeviceCopy
            && self.copy_with == CopyWith::Engines
            && self.copy_from == CopyFrom::Registered
    }
}

fn err(what: &'static str) -> impl Fn(&dyn Display) -> TransportError {
    move |e| TransportError::new(format!("{what}: {}", e.to_string().replace('\n', " ")))
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
    consumer::nvrtc_present_in(&backend).map_err(String::from)?;
    Ok(format!(
        "device 0 ({name}) is a discrete GPU with timeline-semaphore interop, Vulkan device {} has its UUID, NVRTC found",
        vk.device_info().name
    ))
}

/// The producer's Vulkan device, its queue on `chosen`, or by default on a
/// transfer-only family (the copy engines) where the device has one, else
/// on the first family with compute (see "Which queue" in the module docs).
pub(crate) fn open_exporter(
    uuid: [u8; 16],
    chosen: Option<QueueChoice>,
) -> Result<VulkanExporter, TransportError> {
    let first = chosen.unwrap_or(QueueChoice::TransferOnly);
    match VulkanExporter::with_queue(uuid, first) {
        Err(VkError::NoQueueFamily { .. }) if chosen.is_none() => {
            VulkanExporter::with_queue(uuid, QueueChoice::FirstCompute)
        }
        other => other,
    }
    .map_err(|e| err("Vulkan")(&e))
}

/// The producer's state of one ring slot: its Vulkan frame and fences and
/// what the producer tracks about them.
struct Slot {
    /// The recorded host <-> CUDA handover batches of the slot's frame.
    handover: HostHandover,
    /// The frame (lent frames share it); `None` while it is out for
    /// writing ([`SlotMemory`]).
    frame: Option<Lendable<VulkanFrame>>,
    ready_vk: VulkanSemaphore,
    free_vk: VulkanSemaphore,
    /// Host-only: signalled by a batch submitted right after the slot's
    /// pre-submitted acquire batch (see [`GpuTransport::reclaim_ahead`]).
    reclaimed_vk: VulkanSemaphore,
    /// The *free* value the pre-submitted acquire waits for (0: none
    /// pending) and the `reclaimed_vk` value that says it completed.
    reclaim_pending: (u64, u64),
    /// Values signalled on the *ready* semaphore.
    ready_track: TimelineTracker,
    /// The *ready* value the slot's last queued consumer waits for (so a
    /// teardown can let a consumer queued before its signal through).
    ready_awaited: u64,
    /// When the last ready submission returned on the host.
    signalled_at: Option<Instant>,
}

/// The CUDA side as the producer's thread holds it: the enqueue and
/// completion threads and what it shares with them.
struct CudaSide {
    /// Requests for the enqueue thread (`None` once shut down).
    requests: Option<SyncSender<Request>>,
    enqueuer: Option<JoinHandle<Enqueuer>>,
    /// Nanoseconds the enqueue thread spent queueing.
    host_enqueue_ns: Arc<AtomicU64>,
    /// The shared consumer (its streams drained at teardown; it owns the
    /// frames' imports, so it drops before the Vulkan side).
    consumer: Arc<Consumer>,
    ctx: Context,
    done: Receiver<Result<Done, TransportError>>,
    stopping: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
}

/// The discrete-GPU transport (see the module docs): a value that owns its
/// CUDA context, Vulkan device, ring and kernel ([`GpuTransport::open_with`]).
/// Fields drop in order: the CUDA side (after `Drop::drop` drained the
/// streams and stopped the threads), then the Vulkan side.
pub struct GpuTransport {
    geometry: FrameGeometry,
    options: GpuOptions,
    location: MemoryLocation,
    note: &'static str,
    cuda: CudaSide,
    slots: Vec<Slot>,
    /// Released frames whose acquire for the host is not submitted yet,
    /// oldest first: slot and *free* value. Each is submitted once
    /// [`GpuOptions::reclaim_after`] later releases are in the queue, or
    /// when the producer needs the slot first (see "When the slot is taken
    /// back" in the module docs). At most one per slot.
    owed: VecDeque<(usize, u64)>,
    /// Frames queued and not yet collected (a wait with none fails at once).
    pending: usize,
    times: GpuTimes,
    vk: VulkanExporter,
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
        Err(VkError::NoMemoryType { .. }) => MemoryLocation::HostVisible,
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
fn import_frame(ctx: &Context, memory: &VulkanMemory) -> Result<ExternalMemory, TransportError> {
    let fd = memory
        .export_fd()
        .map_err(|e| err("exporting a frame buffer from Vulkan")(&e))?;
    let mut import = MemoryImport::opaque_fd(fd.as_raw_fd(), memory.size())
        .map_err(|e| err("describing the frame import")(&e))?;
    if memory.dedicated() {
        import = import.dedicated();
    }
    ExternalMemory::import_fd(ctx, fd, import)
        .map_err(|e| e.into_parts().0)
        .during("importing a frame buffer into CUDA")
}

/// Exports a timeline semaphore from Vulkan and imports it into CUDA;
/// `what` names it in an error.
fn shared_semaphore(
    vk: &VulkanExporter,
    ctx: &Context,
    what: &'static str,
) -> Result<(VulkanSemaphore, ExternalSemaphore), TransportError> {
    let (fd, sem) = vk.export_timeline_semaphore(0).map_err(|e| err(what)(&e))?;
    let imported =
        ExternalSemaphore::timeline_fd(ctx, fd).map_err(|e| err(what)(&e.into_parts().0))?;
    Ok((sem, imported))
}

/// Why a slot's frame is missing: it is out for writing.
fn out_for_writing(slot: usize) -> TransportError {
    TransportError::misuse(format!(
        "slot {slot}'s frame is out for writing (its lease was not given back)"
    ))
}

/// The slot's frame, unless it is out for writing.
fn present(
    frame: Option<&mut Lendable<VulkanFrame>>,
    slot: usize,
) -> Result<&mut Lendable<VulkanFrame>, TransportError> {
    frame.ok_or_else(|| out_for_writing(slot))
}

/// Page-locks each slot's frame for CUDA in place, for copy mode's copies
/// ([`CopyFrom::Registered`]; see "Copy mode: where the copies read" in
/// the module docs). Each registration holds its frame's allocation.
fn register_frames(ctx: &Context, slots: &[Slot]) -> Result<Vec<RegisteredFrame>, TransportError> {
    slots
        .iter()
        .enumerate()
        .map(|(i, slot)| {
            slot.frame
                .as_ref()
                .ok_or_else(|| out_for_writing(i))?
                .register_for_copies(ctx)
        })
        .collect()
}

/// The producer's and the consumer's halves of one slot over `frame`:
/// its fences made in Vulkan and imported into CUDA, the frame imported
/// and mapped, the handover batches recorded.
fn make_slot(
    vk: &VulkanExporter,
    ctx: &Context,
    frame: VulkanMemory,
) -> Result<(Slot, CudaSlot, MappedBuffer), TransportError> {
    let reclaimed_vk = vk
        .create_semaphore(SemaphoreKind::Timeline, 0)
        .map_err(|e| err("creating a Vulkan semaphore")(&e))?;
    let (ready_vk, ready) = shared_semaphore(vk, ctx, "sharing a ready semaphore")?;
    let (free_vk, free) = shared_semaphore(vk, ctx, "sharing a free semaphore")?;
    let mapped = import_frame(ctx, &frame)?
        .map_whole()
        .during("mapping a frame buffer in CUDA")?;
    let handover = vk
        .host_handover(&frame)
        .map_err(|e| err("recording the frame handover batches")(&e))?;
    let frame = VulkanFrame::new(frame).map_err(|e| err("mapping the frame buffer")(&e))?;
    let slot = Slot {
        handover,
        frame: Some(Lendable::new(frame)),
        ready_vk,
        free_vk,
        reclaimed_vk,
        reclaim_pending: (0, 0),
        ready_track: TimelineTracker::new(0),
        ready_awaited: 0,
        signalled_at: None,
    };
    Ok((slot, CudaSlot { ready, free }, mapped))
}

/// What the pipeline prints about how frames are processed.
fn note(options: &GpuOptions, location: MemoryLocation) -> &'static str {
    if options.handover == Handover::HostOnly {
        return "DIAGNOSIS CONTROL (TEGRA_INTEROP_GPU_HANDOVER=host-only): ready is signalled and free waited for on the host only, with no Vulkan queue batch; expected to fail verification";
    }
    let cached = location == MemoryLocation::HostCached;
    if options.registers_frames() {
        return if cached {
            "copy-based: frames live in host-cached Vulkan memory, page-locked for CUDA in place (cuMemHostRegister); the copy engines move each into device memory and back as host memory (the copy in of one frame beside the copy out of the one before, on two streams), an NVRTC kernel checks and inverts it there"
        } else {
            "copy-based: frames live in host-visible (uncached) Vulkan memory, page-locked for CUDA in place (cuMemHostRegister); the copy engines move each into device memory and back as host memory (the copy in of one frame beside the copy out of the one before, on two streams), an NVRTC kernel checks and inverts it there"
        };
    }
    match (options.mode, cached, options.copy_with) {
        (Mode::ZeroCopy, true, _) => {
            "zero-copy: frames live in host-cached Vulkan memory imported into CUDA; an NVRTC kernel checks and inverts them in place (over PCIe)"
        }
        (Mode::ZeroCopy, false, _) => {
            "zero-copy: frames live in host-visible (uncached) Vulkan memory imported into CUDA; an NVRTC kernel checks and inverts them in place (over PCIe)"
        }
        (Mode::DeviceCopy, true, CopyWith::Engines) => {
            "copy-based: frames live in host-cached Vulkan memory; the copy engines move each into device memory and back (the copy in of one frame beside the copy out of the one before, on two streams), an NVRTC kernel checks and inverts it there"
        }
        (Mode::DeviceCopy, false, CopyWith::Engines) => {
            "copy-based: frames live in host-visible (uncached) Vulkan memory; the copy engines move each into device memory and back (the copy in of one frame beside the copy out of the one before, on two streams), an NVRTC kernel checks and inverts it there"
        }
        (Mode::DeviceCopy, true, CopyWith::Kernels) => {
            "copy-based: frames live in host-cached Vulkan memory; copy kernels move each into device memory and back (on two streams), an NVRTC kernel checks and inverts it there"
        }
        (Mode::DeviceCopy, false, CopyWith::Kernels) => {
            "copy-based: frames live in host-visible (uncached) Vulkan memory; copy kernels move each into device memory and back (on two streams), an NVRTC kernel checks and inverts it there"
        }
    }
}

/// The CUDA device the transport opens: context 0 and the device's UUID
/// (to find the same device in Vulkan).
struct CudaDevice {
    ctx: Context,
    uuid: [u8; 16],
}

impl CudaDevice {
    fn open() -> Result<CudaDevice, TransportError> {
        let backend = Backend::real().during("loading the CUDA driver")?;
        let uuid = backend
            .device(0)
            .and_then(|d| d.uuid())
            .during("reading CUDA device 0's UUID")?;
        let ctx = Context::new(Arc::clone(&backend), 0).during("creating a CUDA context")?;
        Ok(CudaDevice { ctx, uuid })
    }
}

impl CudaSide {
    /// Starts the completion thread and the enqueue thread (which takes
    /// `enqueue`).
    fn start(enqueue: Enqueuer, slots: usize) -> Result<CudaSide, TransportError> {
        let (jobs_tx, jobs_rx) = mpsc::sync_channel::<Job>(slots);
        let (done_tx, done_rx) = mpsc::sync_channel(slots);
        let stopping = Arc::new(AtomicBool::new(false));
        let (consumer, ctx) = (Arc::clone(&enqueue.consumer), enqueue.ctx.clone());
        let worker = {
            let (consumer, stopping) = (Arc::clone(&consumer), Arc::clone(&stopping));
            let done_tx = done_tx.clone();
            thread::Builder::new()
                .name("gpu-completions".into())
                .spawn(move || cuda::completion_loop(consumer, jobs_rx, done_tx, stopping))
                .map_err(|e| err("starting the completion thread")(&e))?
        };
        let host_enqueue_ns = Arc::new(AtomicU64::new(0));
        // At most one request per slot is outstanding (the ring).
        let (requests, requests_rx) = mpsc::sync_channel::<Request>(slots);
        let enqueuer = {
            let host_ns = Arc::clone(&host_enqueue_ns);
            let spawned = thread::Builder::new()
                .name("gpu-enqueue".into())
                .spawn(move || cuda::enqueue_loop(enqueue, requests_rx, jobs_tx, done_tx, host_ns));
            match spawned {
                Ok(h) => h,
                Err(e) => {
                    // The completion thread ends once its job queue closes
                    // (the closure that held its sender was dropped).
                    let _ = worker.join();
                    return Err(err("starting the enqueue thread")(&e));
                }
            }
        };
        Ok(CudaSide {
            requests: Some(requests),
            enqueuer: Some(enqueuer),
            host_enqueue_ns,
            consumer,
            ctx,
            done: done_rx,
            stopping,
            worker: Some(worker),
        })
    }
}

impl GpuTransport {
    /// [`GpuTransport::open_with`] with [`GpuOptions::new`]`(mode)`.
    pub fn open(
        geometry: FrameGeometry,
        slots: usize,
        mode: Mode,
    ) -> Result<GpuTransport, TransportError> {
        Self::open_with(geometry, slots, GpuOptions::new(mode))
    }

    /// Opens the discrete-GPU transport for `geometry` and `slots` slots:
    /// CUDA context, Vulkan device, frames, semaphores, their imports, the
    /// kernel, the streams and the threads, all made here (fixed capacity).
    /// [`FrameTransport::close`] tears it down in order and reports errors;
    /// a consumer still waiting for a frame that was never signalled ready is
    /// let through first, so teardown does not hang.
    pub fn open_with(
        geometry: FrameGeometry,
        slots: usize,
        options: GpuOptions,
    ) -> Result<GpuTransport, TransportError> {
        Self::open_with_work(geometry, slots, options, CheckInvert::boxed())
    }

    /// [`GpuTransport::open_with`] with the consumer running `work` on
    /// every frame instead of the check-and-invert kernel: on the Vulkan
    /// frame itself in [`Mode::ZeroCopy`], on the slot's device copy in
    /// [`Mode::DeviceCopy`] (copied back into the frame afterwards).
    pub fn open_with_work(
        geometry: FrameGeometry,
        slots: usize,
        options: GpuOptions,
        work: Box<dyn FrameWork>,
    ) -> Result<GpuTransport, TransportError> {
        let len = geometry.frame_len();
        if len == 0 || geometry.stride == 0 {
            return Err(TransportError::refused(
                "frames of zero bytes cannot be shared",
            ));
        }
        if slots == 0 {
            return Err(TransportError::refused("a ring needs at least one slot"));
        }
        consumer::self_check_pattern(geometry.stride, geometry.rows)?;
        let dev = CudaDevice::open()?;
        let vk = open_exporter(dev.uuid, options.queue)?;
        let (frames, location) = allocate_frames(&vk, len, slots)?;
        let (mut slots_vk, mut fences, mut mapped) = (Vec::new(), Vec::new(), Vec::new());
        for frame in frames {
            let (s, f, m) = make_slot(&vk, &dev.ctx, frame)?;
            slots_vk.push(s);
            fences.push(f);
            mapped.push(m);
        }
        let config = ConsumerConfig {
            geometry,
            slots,
            memory: FrameMemory::System,
            placement: match options.mode {
                Mode::ZeroCopy => Placement::InPlace,
                Mode::DeviceCopy => Placement::DeviceCopy(options.copy_with),
            },
            skip_kernel: false,
        };
        let mut consumer = Consumer::new(&dev.ctx, config, mapped, work)?;
        if options.registers_frames() {
            consumer.copy_through_registered(register_frames(&dev.ctx, &slots_vk)?)?;
        }
        let enqueue = Enqueuer {
            consumer: Arc::new(consumer),
            slots: fences,
            ctx: dev.ctx.clone(),
        };
        let cuda = CudaSide::start(enqueue, slots)?;
        Ok(GpuTransport {
            geometry,
            options,
            location,
            note: note(&options, location),
            cuda,
            slots: slots_vk,
            owed: VecDeque::with_capacity(slots),
            pending: 0,
            times: GpuTimes::default(),
            vk,
        })
    }

    /// One line on how frames are processed (the pipeline prints it).
    pub fn note(&self) -> &'static str {
        self.note
    }

    /// Processing mode.
    pub fn mode(&self) -> Mode {
        self.options.mode
    }

    /// The options the transport was opened with.
    pub fn options(&self) -> GpuOptions {
        self.options
    }

    /// Where the frame buffers live (host-cached or plain host-visible).
    pub fn memory_location(&self) -> MemoryLocation {
        self.location
    }

    /// Mean GPU-side times of the frames collected so far.
    pub fn gpu_times(&self) -> GpuTimes {
        let n = self.times.frames.max(1) as u32;
        let enqueue_ns = self.cuda.host_enqueue_ns.load(Ordering::Relaxed);
        GpuTimes {
            frames: self.times.frames,
            wait: self.times.wait / n,
            ready_to_gpu: self.times.ready_to_gpu / self.times.blocked_frames.max(1) as u32,
            blocked_frames: self.times.blocked_frames,
            host_ready: self.times.host_ready / n,
            host_enqueue: Duration::from_nanos(enqueue_ns) / n,
            host_reclaim: self.times.host_reclaim / n,
            host_free_wait: self.times.host_free_wait / n,
            reclaims_at_need: self.times.reclaims_at_need,
            copy_in: self.times.copy_in / n,
            kernel: self.times.kernel / n,
            tail: self.times.tail / n,
        }
    }

    fn check_slot(&self, t: &Ticket) -> Result<usize, TransportError> {
        match t.slot() {
            s if s < self.slots.len() => Ok(s),
            s => Err(TransportError::no_slot(s)),
        }
    }

    /// Submits the batch that takes the slot back for the host once the consumer signals
    /// *free* ([`VulkanExporter::acquire_for_host_ahead`], not waited for
    /// here), which also signals the slot's host-only `reclaimed_vk`
    /// semaphore. [`FrameTransport::take_slot`] then only host-waits for that
    /// semaphore: the queue round trip of the acquire overlaps the frames in
    /// between instead of sitting on the producer's path. Called for a frame
    /// once [`GpuOptions::reclaim_after`] later frames' release batches
    /// were submitted, or when the producer needs the slot first: the
    /// acquire waits on the queue for *free*, and a release queued behind it
    /// holds its frame's *ready* until then, leaving the GPU idle in between
    /// (see "When the slot is taken back" in the module docs).
    ///
    /// Why waiting for `reclaimed_vk` is enough (Vulkan specification,
    /// "Semaphore Signaling"): the first synchronisation scope of a
    /// semaphore signal operation of a queue submission includes every
    /// command that comes earlier in submission order on that queue, and
    /// its memory dependency covers them; the acquire batch is earlier in
    /// submission order and holds the device-to-host barrier (destination
    /// the host's reads). A host wait that observes the signalled value
    /// therefore comes after the acquire batch completed, with the device's
    /// writes visible to the host: the same guarantee as the exporter's own
    /// host wait on its progress semaphore inside `acquire_for_host`.
    fn reclaim_ahead(&mut self, slot: usize, free: u64) -> Result<(), TransportError> {
        // One batch: it waits for *free*, takes the buffer back, makes the
        // device's writes visible to the host and signals `reclaimed_vk`.
        let s = &mut self.slots[slot];
        let value = s.reclaim_pending.1 + 1;
        self.vk
            .acquire_for_host_ahead(
                &s.handover,
                present(s.frame.as_mut(), slot)?.memory(),
                &[SemaphoreOp::timeline(&s.free_vk, free)],
                &[SemaphoreOp::timeline(&s.reclaimed_vk, value)],
            )
            .map_err(|e| err("submitting the slot's acquire for the host")(&e))?;
        s.reclaim_pending = (free, value);
        Ok(())
    }

    /// Turns a finished frame into its completion.
    fn collect(&mut self, d: Done) -> Result<Completion, TransportError> {
        self.pending = self.pending.saturating_sub(1);
        let (c, t) = (d.completion, d.times);
        let wait = t.wait.unwrap_or(Duration::ZERO);
        let blocked = wait > Duration::ZERO;
        let ready_to_gpu = match self.slots.get(c.slot).and_then(|s| s.signalled_at) {
            Some(at) if blocked => c
                .finished
                .checked_sub(c.busy)
                .map_or(Duration::ZERO, |passed| {
                    passed.saturating_duration_since(at)
                }),
            _ => Duration::ZERO,
        };
        self.times.frames += 1;
        self.times.wait += wait;
        self.times.ready_to_gpu += ready_to_gpu;
        self.times.blocked_frames += u64::from(blocked);
        self.times.copy_in += t.copy_in;
        self.times.kernel += t.kernel;
        self.times.tail += t.copy_out;
        Ok(c)
    }

    /// Signals *ready* up to the value each slot's last queued consumer
    /// waits for, where the producer never did (so a consumer queued before
    /// its frame was released gets through and teardown does not hang).
    fn release_waiting_consumers(&mut self) -> Option<TransportError> {
        let mut first = None;
        for s in &mut self.slots {
            if s.ready_awaited > s.ready_track.last() {
                match s.ready_vk.signal(s.ready_awaited) {
                    Ok(()) => s.ready_track = TimelineTracker::new(s.ready_awaited),
                    Err(e) => {
                        first.get_or_insert(err("releasing a waiting consumer")(&e));
                    }
                }
            }
        }
        first
    }

    /// Lets every consumer still waiting for a frame that was never released
    /// through (it then processes whatever the slot holds), stops the
    /// enqueue thread, waits for the streams, releases the CUDA side and
    /// stops the completion thread. Idempotent.
    fn shut_down(&mut self) -> Result<(), TransportError> {
        let mut first = self.release_waiting_consumers();
        // Requests still queued are queued on the streams now, their waits
        // already satisfied.
        self.cuda.requests = None;
        let cuda_side = match self.cuda.enqueuer.take().map(JoinHandle::join) {
            Some(Ok(e)) => Some(e),
            Some(Err(_)) => {
                first.get_or_insert(TransportError::misuse("the enqueue thread panicked"));
                None
            }
            None => None,
        };
        if first.is_none() {
            if let Err(x) = self.cuda.consumer.drain() {
                first.get_or_insert(x);
            }
        }
        // The fences' imports go here; the frames' imports (the consumer's)
        // go with the transport's `cuda` field, before the Vulkan objects
        // they import (the fields' order).
        drop(cuda_side);
        self.cuda.stopping.store(true, Ordering::Release);
        if let Some(w) = self.cuda.worker.take() {
            if w.join().is_err() {
                first.get_or_insert(TransportError::misuse("the completion thread panicked"));
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Host-waits until `slot`'s *free* fence reached `want`, with the
    /// device's writes visible to the host: through the acquire submitted
    /// ahead for exactly that value (submitted first where it is still
    /// owed), else (`inline`, the slot's first use) through an acquire
    /// submitted and waited for here; `Ok(false)` when neither applies.
    /// Its time counts as the host's wait for the slots.
    fn reach_free(&mut self, slot: usize, want: u64, inline: bool) -> Result<bool, TransportError> {
        let entered = Instant::now();
        let reached = self.reach_free_now(slot, want, inline);
        self.times.host_free_wait += entered.elapsed();
        reached
    }

    /// [`GpuTransport::reach_free`], untimed.
    fn reach_free_now(
        &mut self,
        slot: usize,
        want: u64,
        inline: bool,
    ) -> Result<bool, TransportError> {
        if self.options.handover == Handover::Queue && want != 0 {
            // Still owed: the producer needs the slot before the acquire's
            // turn came; submitted now, then waited for like the others.
            if let Some(at) = self.owed.iter().position(|&o| o == (slot, want)) {
                self.owed.remove(at);
                self.times.reclaims_at_need += 1;
                self.reclaim_ahead(slot, want)?;
            }
        }
        let s = &mut self.slots[slot];
        let (pending_free, reclaimed) = s.reclaim_pending;
        let reached = match self.options.handover {
            Handover::Queue if want != 0 && pending_free == want => {
                // Submitted by `reclaim_ahead` after the slot's last frame.
                s.reclaimed_vk.wait(reclaimed, FREE_WAIT)
            }
            Handover::Queue if !inline => return Ok(false),
            Handover::Queue => self.vk.acquire_for_host(
                &s.handover,
                present(s.frame.as_mut(), slot)?.memory(),
                &[SemaphoreOp::timeline(&s.free_vk, want)],
                FREE_WAIT,
            ),
            Handover::HostOnly => s.free_vk.wait(want, FREE_WAIT),
        }
        .map_err(|e| err("waiting for the free fence")(&e))?;
        if !reached {
            return Err(TransportError::timeout(
                format!("the consumer to free slot {slot} (free fence value {want})"),
                FREE_WAIT,
            ));
        }
        Ok(true)
    }

    /// Waits until `slot`'s *free* fence reached `want` and the device's
    /// writes to the slot are visible to the host (see the module docs).
    fn wait_slot(&mut self, slot: usize, want: u64) -> Result<(), TransportError> {
        self.reach_free(slot, want, true).map(drop)
    }

    /// Submits `slot`'s release batch (or, as the diagnosis control, a host
    /// signal) that signals *ready* at `value`.
    fn submit_ready(&mut self, slot: usize, value: u64) -> Result<(), TransportError> {
        let s = &mut self.slots[slot];
        let vk_signal = err("Vulkan signal of the ready fence");
        match self.options.handover {
            Handover::Queue => self
                .vk
                .release_host_writes(
                    &s.handover,
                    present(s.frame.as_mut(), slot)?.memory(),
                    &[],
                    &[SemaphoreOp::timeline(&s.ready_vk, value)],
                )
                .map_err(|e| vk_signal(&e)),
            Handover::HostOnly => s.ready_vk.signal(value).map_err(|e| vk_signal(&e)),
        }
    }
}

impl Drop for GpuTransport {
    fn drop(&mut self) {
        // Errors were reported by `close` where it was called; a drop
        // after a failed run only needs the streams drained and the threads
        // stopped.
        let _ = self.shut_down();
    }
}

impl FrameTransport for GpuTransport {
    fn info(&self) -> TransportInfo {
        TransportInfo {
            backend: BACKEND_NAME,
            geometry: self.geometry,
            slots: self.slots.len(),
            // The stream waits for *ready* on the device, and `shut_down`
            // lets a consumer whose frame was never signalled through.
            queues_before_ready: self.options.early,
        }
    }

    fn details(&self) -> Option<String> {
        let t = self.gpu_times();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let (family, flags) = self.vk.queue_family();
        Some(format!(
            "Vulkan queue family {family} ({flags:?}); host per frame (us, mean): ready submission {:.1}, CUDA enqueue {:.1}, acquire-ahead submission {:.1}, waiting for slots to be taken back {:.1} (acquire submitted {} frame(s) after its frame, {} at need); GPU per frame (us, mean of {} frames): blocked in the ready wait {:.1}, copy in {:.1}, kernel {:.1}, tail {:.1}; host ready submission -> stream past the wait {:.1} (over the {} frames the stream waited for)",
            us(t.host_ready),
            us(t.host_enqueue),
            us(t.host_reclaim),
            us(t.host_free_wait),
            self.options.reclaim_after,
            t.reclaims_at_need,
            t.frames,
            us(t.wait),
            us(t.copy_in),
            us(t.kernel),
            us(t.tail),
            us(t.ready_to_gpu),
            t.blocked_frames
        ))
    }

    fn lend(
        &mut self,
        other: usize,
        frame: u64,
        free_reached: u64,
    ) -> Result<Option<PeekedFrame>, TransportError> {
        if other >= self.slots.len() {
            return Ok(None);
        }
        // A later frame of the slot was signalled ready: the device may be
        // writing the slot, which no longer holds the frame.
        if self.slots[other].ready_track.last() > free_reached {
            return Err(TransportError::misuse(format!(
                "lend of frame {frame} in slot {other}, which has moved on to a later frame"
            )));
        }
        // Only through the slot's acquire for exactly this value (submitted
        // ahead, or now where it is still owed): an inline acquire here would
        // be followed by the ahead one, taking the buffer back twice.
        if !self.reach_free(other, free_reached, false)? {
            return Ok(None);
        }
        // The free fence reached the value the consumer signals after its
        // last access (and the acquire batch made its writes visible to the
        // host). The lent frame shares the slot's memory (kept alive while
        // it lives); the slot's next host write (`take_slot`) and its next
        // device access (after `signal_ready`) wait for it to be dropped.
        Ok(Some(
            present(self.slots[other].frame.as_mut(), other)?.lend(self.geometry.frame_len())?,
        ))
    }

    fn take_slot(&mut self, t: &Ticket) -> Result<SlotMemory, TransportError> {
        let slot = self.check_slot(t)?;
        self.wait_slot(slot, t.free_wait())?;
        // The free fence reached the value the consumer signals after its
        // last access (kernel, copies), with the device's writes visible to
        // the host; the device's next access waits for this slot's ready
        // signal, which takes the memory back first. Lent frames are given
        // back first.
        let frame = present(self.slots[slot].frame.as_mut(), slot)?;
        frame.wait_returned(slot)?;
        let frame = self.slots[slot]
            .frame
            .take()
            .ok_or_else(|| out_for_writing(slot))?;
        Ok(SlotMemory::new(t, self.geometry.frame_len(), frame))
    }

    fn put_back(&mut self, t: &Ticket, memory: SlotMemory) -> Result<(), TransportError> {
        let slot = self.check_slot(t)?;
        let frame: Lendable<VulkanFrame> = memory.into_memory(t)?;
        let held = &mut self.slots[slot].frame;
        if held.is_some() {
            return Err(TransportError::misuse(format!(
                "slot {slot}'s frame given back while the transport holds it"
            )));
        }
        *held = Some(frame);
        Ok(())
    }

    fn signal_ready(&mut self, t: &Ticket, memory: SlotMemory) -> Result<(), TransportError> {
        let entered = Instant::now();
        self.put_back(t, memory)?;
        let slot = self.check_slot(t)?;
        // The device reads and writes the slot once it is signalled ready:
        // not while a lent frame of it is read.
        present(self.slots[slot].frame.as_mut(), slot)?.wait_returned(slot)?;
        let reservation = self.slots[slot]
            .ready_track
            .reserve(t.ready())
            .map_err(|e| err("ready fence")(&e))?;
        let signalled = self.submit_ready(slot, reservation.value());
        let now = Instant::now();
        let s = &mut self.slots[slot];
        s.signalled_at = Some(now);
        self.times.host_ready += now - entered;
        match signalled {
            Ok(()) => s
                .ready_track
                .commit(reservation)
                .map(|_| ())
                .map_err(|e| err("ready fence")(&e))?,
            Err(e) => {
                let _ = s.ready_track.abort(reservation);
                return Err(e);
            }
        }
        // This frame's acquire waits for `reclaim_after` later
        // releases; the acquire whose turn came goes into the queue behind
        // this frame's release (see "When the slot is taken back"). Its
        // consumer is queued by now, whichever order the ring uses.
        if self.options.handover == Handover::Queue {
            self.owed.push_back((slot, t.free_signal()));
            while self.owed.len() > self.options.reclaim_after {
                let Some((prev, free)) = self.owed.pop_front() else {
                    break;
                };
                let start = Instant::now();
                self.reclaim_ahead(prev, free)?;
                self.times.host_reclaim += start.elapsed();
            }
        }
        Ok(())
    }

    fn queue_consumer(&mut self, t: &Ticket) -> Result<(), TransportError> {
        // A consumer may be queued before its ready signal (wait before
        // signal): the stream waits on the GPU until the producer signals.
        // The work is queued by the enqueue thread, in request order; an
        // error there comes back through `wait_complete`.
        let slot = self.check_slot(t)?;
        let request = Request {
            slot,
            frame: t.frame(),
            ready: t.ready(),
            free: t.free_signal(),
        };
        self.cuda
            .requests
            .as_ref()
            .ok_or_else(|| TransportError::misuse("the transport is shut down"))?
            .send(request)
            .map_err(|_| TransportError::misuse("the enqueue thread stopped"))?;
        self.slots[slot].ready_awaited = t.ready();
        self.pending += 1;
        Ok(())
    }

    fn try_complete(&mut self) -> Result<Option<Completion>, TransportError> {
        match self.cuda.done.try_recv() {
            Ok(d) => self.collect(d?).map(Some),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => {
                Err(TransportError::misuse("the completion thread stopped"))
            }
        }
    }

    fn wait_complete(&mut self) -> Result<Completion, TransportError> {
        if self.pending == 0 {
            return Err(TransportError::misuse("no frame is in flight"));
        }
        let d = self
            .cuda
            .done
            .recv()
            .map_err(|_| TransportError::misuse("the completion thread stopped"))??;
        self.collect(d)
    }

    fn close(mut self: Box<Self>) -> Result<(), TransportError> {
        let backend = Arc::clone(self.cuda.ctx.backend());
        self.shut_down()?;
        drop(self);
        match backend.take_drop_errors().first() {
            Some(e) => Err(err("releasing the CUDA objects")(e)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn copy_flag_selects_the_mode() {
        assert_eq!(Mode::from_copy_flag(false), Mode::ZeroCopy);
        assert_eq!(Mode::from_copy_flag(true), Mode::DeviceCopy);
    }

    #[test]
    fn options_default_to_the_measured_choices() {
        let o = GpuOptions::new(Mode::DeviceCopy);
        assert_eq!(o.mode, Mode::DeviceCopy);
        assert_eq!(o.copy_with, CopyWith::Engines);
        assert_eq!(o.copy_from, CopyFrom::Registered);
        assert!(o.registers_frames());
        assert!(!GpuOptions::new(Mode::ZeroCopy).registers_frames());
        assert_eq!(o.handover, Handover::Queue);
        assert!(o.early);
        assert_eq!(o.queue, None);
        assert_eq!(o.reclaim_after, 1);
        assert_eq!(GpuOptions::new(Mode::ZeroCopy).reclaim_after, 1);
    }

    #[test]
    fn the_diagnosis_control_says_so_and_copy_kernels_register_nothing() {
        let h = GpuOptions {
            handover: Handover::HostOnly,
            ..GpuOptions::new(Mode::ZeroCopy)
        };
        assert!(note(&h, MemoryLocation::HostCached).starts_with("DIAGNOSIS CONTROL"));
        let d = GpuOptions::new(Mode::DeviceCopy);
        let import = GpuOptions {
            copy_from: CopyFrom::Import,
            ..d
        };
        assert!(!import.registers_frames());
        let kernels = GpuOptions {
            copy_with: CopyWith::Kernels,
            ..d
        };
        assert!(
            !kernels.registers_frames(),
            "copy kernels go through the import"
        );
    }

    #[test]
    fn every_option_combination_has_a_one_line_note() {
        for mode in [Mode::ZeroCopy, Mode::DeviceCopy] {
            for copy_with in [CopyWith::Engines, CopyWith::Kernels] {
                for location in [MemoryLocation::HostCached, MemoryLocation::HostVisible] {
                    let o = GpuOptions {
                        copy_with,
                        ..GpuOptions::new(mode)
                    };
                    for copy_from in [CopyFrom::Registered, CopyFrom::Import] {
                        let o = GpuOptions { copy_from, ..o };
                        let n = note(&o, location);
                        assert!(!n.contains('\n'));
                        assert_eq!(n.starts_with("copy-based"), mode == Mode::DeviceCopy);
                        if mode == Mode::DeviceCopy {
                            assert_eq!(n.contains("copy engines"), copy_with == CopyWith::Engines);
                        }
                        assert_eq!(n.contains("cuMemHostRegister"), o.registers_frames());
                    }
                }
            }
        }
    }

    #[test]
    fn probe_answers_in_one_line() {
        let line = match probe() {
            Ok(why) | Err(why) => why,
        };
        assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
    }
}
