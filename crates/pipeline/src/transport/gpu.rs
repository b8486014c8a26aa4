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
//!   the host. That batch ([`VulkanExporter::acquire_for_host_ahead`]) is
//!   submitted ahead, once the next frame's release is queued, and also
//!   signals a host-only semaphore; the producer host-waits only for that
//!   semaphore when it comes back to the slot, or when the pipeline borrows
//!   the slot to check its frame on the checker thread
//!   ([`FrameTransport::lend`]; `reclaim_ahead` cites the rule
//!   that makes this enough). A ring of one acquires inline. The memory types used are
//!   host-coherent, so the mapped range needs no explicit flush or
//!   invalidate.
//! - **Consumer**: one CUDA stream; its work for a frame is queued before
//!   the camera writes the frame ([`FrameTransport::queues_before_ready`]:
//!   the stream waits for *ready* on the device, so the kernel starts as soon
//!   as the release batch signals, not after the host has queued ~10 calls),
//!   by an enqueue thread that owns the stream and the imports
//!   ([`FrameTransport::queue_consumer`] only hands it the ticket's slot and
//!   values, so those ~30-50 us of driver calls run beside the camera);
//!   per frame it waits for *ready*, runs a
//!   kernel compiled at run time with NVRTC (through cudarc; the [`crate::consumer`]
//!   module, shared with the NvSci transport's Jetson path) that counts the
//!   bytes that differ from [`TestPattern`] with an atomic and inverts every
//!   byte in place (exactly [`crate::transport::process_frame`]; launched
//!   with cudarc's launch builder, the slot's mapping lent as a cudarc
//!   slice: see "Launches" below; the kernel adds any mismatches to the
//!   slot's counter in mapped host memory), signals *free* and records an
//!   event. A completion thread waits for those events in order
//!   and timestamps them, so a frame's finish time does not depend on when
//!   the pipeline's loop next looks.
//! - **Copy-based variant** ([`Mode::DeviceCopy`], the pipeline's `--copy`):
//!   the same, except that the stream copies the frame into a device-local
//!   CUDA buffer (a host-to-device transfer over PCIe), processes it there and
//!   copies it back before signalling *free*. The kernel time is
//!   [`Completion::process`]; the copies count as interop overhead. The
//!   copies are copy kernels that use loads that refetch system memory and
//!   write-through stores (see [`consumer::KERNEL_SOURCE`]).
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
//! # What a handover costs here
//!
//! Measured with raw calls (gpu_bench's handover-latency table, BENCHMARKS.md
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
//! family with compute. Measured on an H100 (gpu_bench, BENCHMARKS.md
//! "Session 6"): after a submission to the first family (graphics + compute)
//! or to the compute-only family, the next CUDA work ran ~300-314 us later,
//! the two contexts taking turns on the graphics/compute engine; after a
//! submission to the transfer-only family, 12-16 us later. The pipeline's
//! "host ready submission -> stream past the wait" fell from ~340 us to
//! ~22 us and its zero-copy rate rose from ~1370 to ~1560 frames/s.
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
//! Every kernel goes through cudarc's launch builder. Each frame lends the
//! slot's mapping to cudarc ([`MappedBuffer::cudarc_slice`]) and passes it
//! as the kernel's argument (`launch_builder(f).arg(&mut mapped)`); the
//! copy-based variant passes the slot's device buffer too. Event tracking is
//! off on the transport's cudarc context: all its work is on one stream and
//! the imported semaphores order that stream against Vulkan, so cudarc's
//! per-slice events could only order the stream after itself. With them on,
//! the launch path measured 73-80 us per frame against 60-64 us for a raw
//! `cuLaunchKernel` (BENCHMARKS.md, "cudarc's launch builder on the
//! imported memory"): two events made, waited for, recorded and destroyed
//! per frame.
//!
//! [`TestPattern`]: crate::camera::TestPattern

use std::fmt::Display;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::platform::vulkan::{
    Error as VkError, HostHandover, MemoryLocation, QueueChoice, SemaphoreKind, SemaphoreOp,
    VulkanExporter, VulkanMemory, VulkanSemaphore,
};
use cudarc::driver::{sys as cu_sys, CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr};
use tegra_interop::core::{MemoryImport, SignalParams, TimelineTracker, WaitParams};
use tegra_interop::driver::{
    Backend, Context, ExternalMemory, ExternalSemaphore, MappedBuffer, Stream,
};

use crate::ring::{Peek, Ticket};
use crate::transport::{Completion, FrameGeometry, FrameTransport, PeekedFrame, TransportError};

use crate::consumer::{self, CheckArgs, CopyKernel, Counters, DeviceFrame, FrameMemory, Kernel};

/// `0` queues the consumer after the ready signal instead of before the
/// write (for comparison; see [`FrameTransport::queues_before_ready`]).
pub const EARLY_ENV: &str = "TEGRA_INTEROP_GPU_EARLY";

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
    /// about 320 us on the H200, whoever signals; see BENCHMARKS.md.)
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
    consumer::nvrtc_present().map_err(|e| e.0)?;
    Ok(format!(
        "device 0 ({name}) is a discrete GPU with timeline-semaphore interop, Vulkan device {} has its UUID, NVRTC found",
        vk.device_info().name
    ))
}

/// The producer's Vulkan device, its queue on a transfer-only family (the
/// copy engines) where the device has one, else on the first family with
/// compute; [`QueueChoice::ENV`] overrides the choice (see "Which queue" in
/// the module docs).
fn open_exporter(uuid: [u8; 16]) -> Result<VulkanExporter, TransportError> {
    let chosen = QueueChoice::from_env_if_set().map_err(|e| err("Vulkan")(&e))?;
    let first = chosen.unwrap_or(QueueChoice::TransferOnly);
    match VulkanExporter::with_queue(uuid, first) {
        Err(VkError::NoQueueFamily { .. }) if chosen.is_none() => {
            VulkanExporter::with_queue(uuid, QueueChoice::FirstCompute)
        }
        other => other,
    }
    .map_err(|e| err("Vulkan")(&e))
}

/// CUDA events of one slot, created once and recorded for every frame.
struct SlotEvents {
    /// Before the stream's wait for *ready*.
    arrive: CudaEvent,
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
            arrive: make()?,
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

/// One frame's consumer work, as the producer asked for it
/// ([`FrameTransport::queue_consumer`]).
struct Request {
    slot: usize,
    frame: u64,
    /// The *ready* value to wait for.
    ready: u64,
    /// The *free* value to signal.
    free: u64,
}

/// The CUDA side of the transport: everything the consumer's work is queued
/// with. It lives on the enqueue thread ([`enqueue_loop`]), so the
/// producer's thread does not spend the ~30-50 us of driver calls per frame
/// (event records, the wait, the launch, the signal) between two frames.
struct Enqueuer {
    geometry: FrameGeometry,
    mode: Mode,
    grid: u32,
    free_cu: Vec<ExternalSemaphore>,
    ready_cu: Vec<ExternalSemaphore>,
    /// Each holds its import (and so the context).
    mapped: Vec<MappedBuffer>,
    /// Copy mode: one device-local buffer per slot.
    device_frames: Vec<CudaSlice<u8>>,
    /// One mismatch counter per slot (shared with the producer's
    /// collection, which takes each count).
    counters: Arc<Counters>,
    events: Arc<Vec<SlotEvents>>,
    stream: Stream,
    cstream: Arc<CudaStream>,
    kernel: Kernel,
    ctx: Context,
}

impl Enqueuer {
    /// Queues the consumer's work for the requested frame (see
    /// [`FrameTransport::queue_consumer`]).
    fn enqueue(&mut self, r: &Request) -> Result<(), TransportError> {
        let (slot, frame, want) = (r.slot, r.frame, r.ready);
        let ev = &self.events[slot];
        let record = |e: &CudaEvent| {
            e.record(&self.cstream)
                .map_err(|x| err("recording a CUDA event")(&x))
        };
        record(&ev.arrive)?;
        self.stream
            .wait(&self.ready_cu[slot], WaitParams::timeline(want))
            .map_err(|e| err("CUDA wait for the ready fence")(&e))?;
        record(&ev.start)?;
        let len = self.geometry.frame_len();
        let len64 = len as u64;
        let frame_ptr = self.mapped[slot].device_ptr();
        // The slot's mapping lent to cudarc for this frame's launches (no
        // events: tracking is off on this transport's context, see `open`).
        let mut mapped = self.mapped[slot]
            .cudarc_slice::<u8>(&self.cstream)
            .map_err(|e| err("lending the frame to cudarc")(&e))?;
        if self.mode == Mode::DeviceCopy {
            let dev = &mut self.device_frames[slot];
            let dev_ptr = dev.device_ptr(&self.cstream).0;
            // SAFETY: both ranges are `len` bytes of live allocations (the
            // mapping of the slot's import, the slot's device buffer) that
            // outlive the queued copy (torn down only after the stream is
            // drained); they do not overlap.
            unsafe {
                self.kernel.copy(
                    CopyKernel::FromSystem,
                    self.grid,
                    &self.cstream,
                    (dev, dev_ptr),
                    (&mapped, frame_ptr),
                    &len64,
                    "copying the frame into device memory",
                )
            }?;
        }
        record(&ev.kernel_start)?;
        let counter = self.counters.device_ptr(slot)?;
        let work_ptr = match self.mode {
            Mode::ZeroCopy => frame_ptr,
            Mode::DeviceCopy => self.device_frames[slot].device_ptr(&self.cstream).0,
        };
        let args = CheckArgs::new(
            DeviceFrame {
                ptr: work_ptr,
                len,
                stride: self.geometry.stride,
            },
            frame,
            counter,
        );
        // Both launches: the kernel touches `len` bytes of the frame (the
        // mapping lent as `mapped`, at `frame_ptr`, or the slot's device
        // buffer, at `work_ptr`) and the slot's counter, all torn down only
        // after the stream is drained; on this stream nothing else touches
        // them until the kernel ran, and the producer writes the frame again
        // only after the free fence, which is signalled after it.
        match self.mode {
            // SAFETY: as said above, for the mapping.
            Mode::ZeroCopy => unsafe {
                self.kernel.check_and_invert(
                    FrameMemory::System,
                    self.grid,
                    &self.cstream,
                    &mut mapped,
                    &args,
                )
            }?,
            // SAFETY: as said above, for the slot's device buffer.
            Mode::DeviceCopy => unsafe {
                self.kernel.check_and_invert(
                    FrameMemory::Device,
                    self.grid,
                    &self.cstream,
                    &mut self.device_frames[slot],
                    &args,
                )
            }?,
        }
        record(&ev.kernel_end)?;
        if self.mode == Mode::DeviceCopy {
            // SAFETY: as for the copy in, in the other direction.
            unsafe {
                self.kernel.copy(
                    CopyKernel::ToSystem,
                    self.grid,
                    &self.cstream,
                    (&mut mapped, frame_ptr),
                    (&self.device_frames[slot], work_ptr),
                    &len64,
                    "copying the frame back from device memory",
                )
            }?;
        }
        drop(mapped);
        let expect = r.free;
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
}

/// The enqueue thread: queues each requested frame's work in order, then
/// hands the frame to the completion thread, until its queue closes
/// (teardown); then it gives the CUDA side back for the teardown to drain
/// and release. An error goes to the producer through the completion queue
/// and stops the queueing.
fn enqueue_loop(
    mut e: Enqueuer,
    requests: Receiver<Request>,
    jobs: SyncSender<Job>,
    done: SyncSender<Result<Done, TransportError>>,
    host_ns: Arc<AtomicU64>,
) -> Enqueuer {
    if let Err(x) = e.ctx.bind() {
        // Never blocks (a full queue already holds what the producer will
        // see); the queues close when this thread ends.
        let _ = done.try_send(Err(err("binding the CUDA context")(&x)));
        return e;
    }
    for r in requests {
        let entered = Instant::now();
        let queued = e.enqueue(&r);
        host_ns.fetch_add(entered.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let sent = match queued {
            Ok(()) => jobs
                .send(Job {
                    slot: r.slot,
                    frame: r.frame,
                })
                .map_err(|_| TransportError::new("the completion thread stopped")),
            Err(x) => Err(x),
        };
        if let Err(x) = sent {
            // Never blocks: at teardown nobody reads the queue, and a full
            // queue already holds an error or the frames before this one;
            // either way the producer's next wait ends (with this error, or
            // with "stopped" once this thread and the completion thread end).
            let _ = done.try_send(Err(x));
            break;
        }
    }
    e
}

/// Mean GPU-side times per frame, from the CUDA events.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuTimes {
    /// Frames measured.
    pub frames: u64,
    /// The stream blocked in the *ready* wait: from the stream reaching it
    /// to the wait being satisfied (zero when the frame was ready first).
    pub wait: Duration,
    /// Over the frames whose stream blocked in the wait (it was idle when
    /// the frame was signalled, so no queueing): from the producer's ready
    /// submission returning on the host to the stream passing the wait,
    /// estimated as the frame's finish (seen by the completion thread) minus
    /// the GPU time after the wait. Includes the completion thread's
    /// detection delay.
    pub ready_to_gpu: Duration,
    /// Frames in `ready_to_gpu`.
    pub blocked_frames: u64,
    /// Host time in the ready submission (`signal_ready`).
    pub host_ready: Duration,
    /// Host time queueing the consumer's CUDA work, on the enqueue thread
    /// (off the producer's path).
    pub host_enqueue: Duration,
    /// Host time submitting the acquire ahead (`reclaim_ahead`).
    pub host_reclaim: Duration,
    /// From the end of the *ready* wait to the kernel's start (the copy into
    /// device memory in copy mode; about zero in zero-copy mode).
    pub copy_in: Duration,
    /// The kernel.
    pub kernel: Duration,
    /// From the kernel's end to the frame's end (the copy back in copy mode
    /// and the *free* signal).
    pub tail: Duration,
}

/// The discrete-GPU transport (see the module docs): a value that owns its
/// CUDA context, Vulkan device, ring and kernel ([`GpuTransport::open`]).
/// Fields drop in order: the CUDA side (after `Drop::drop` drained the
/// stream and stopped the completion thread), then the Vulkan side.
pub struct GpuTransport {
    geometry: FrameGeometry,
    mode: Mode,
    location: MemoryLocation,
    note: &'static str,
    // CUDA side: the enqueue thread owns the stream and the imports.
    /// Requests for the enqueue thread (`None` once shut down).
    requests: Option<SyncSender<Request>>,
    enqueuer: Option<JoinHandle<Enqueuer>>,
    /// Nanoseconds the enqueue thread spent queueing.
    host_enqueue_ns: Arc<AtomicU64>,
    counters: Arc<Counters>,
    events: Arc<Vec<SlotEvents>>,
    ctx: Context,
    // Vulkan side.
    handover: Handover,
    /// Whether the consumer is queued before the frame is written
    /// ([`EARLY_ENV`]; on by default).
    early: bool,
    /// Per slot: the recorded host <-> CUDA handover batches of its frame.
    handovers: Vec<HostHandover>,
    frames: Vec<VulkanMemory>,
    ready_vk: Vec<VulkanSemaphore>,
    free_vk: Vec<VulkanSemaphore>,
    /// Per slot, host-only: signalled by a batch submitted right after the
    /// slot's pre-submitted acquire batch (see [`GpuTransport::reclaim_ahead`]).
    reclaimed_vk: Vec<VulkanSemaphore>,
    /// Per slot: the *free* value the pre-submitted acquire waits for (0:
    /// none pending) and the `reclaimed_vk` value that says it completed.
    reclaim_pending: Vec<(u64, u64)>,
    /// The last queued frame's slot and *free* value, whose acquire is
    /// submitted once the next frame's release is in the queue.
    deferred: Option<(usize, u64)>,
    vk: VulkanExporter,
    /// Values signalled on each slot's *ready* semaphore.
    ready_track: Vec<TimelineTracker>,
    /// The *ready* value each slot's last queued consumer waits for (so a
    /// teardown can let a consumer queued before its signal through).
    ready_awaited: Vec<u64>,
    /// Frames queued and not yet collected (a wait with none fails at once).
    pending: usize,
    times: GpuTimes,
    /// Per slot: when the last ready submission returned on the host.
    signalled_at: Vec<Option<Instant>>,
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

impl GpuTransport {
    /// Opens the discrete-GPU transport for `geometry` and `slots` slots:
    /// CUDA context, Vulkan device, frames, semaphores, their imports, the
    /// kernel and the completion thread, all made here (fixed capacity).
    /// [`FrameTransport::close`] tears it down in order and reports errors;
    /// a consumer still waiting for a frame that was never signalled ready is
    /// let through first, so teardown does not hang.
    pub fn open(
        geometry: FrameGeometry,
        slots: usize,
        mode: Mode,
    ) -> Result<GpuTransport, TransportError> {
        let len = geometry.frame_len();
        if len == 0 || geometry.stride == 0 {
            return Err(TransportError::new("frames of zero bytes cannot be shared"));
        }
        consumer::self_check_pattern(geometry.stride, geometry.rows)?;
        let backend = Backend::real().map_err(|e| err("CUDA driver")(&e))?;
        let uuid = backend
            .device(0)
            .and_then(|d| d.uuid())
            .map_err(|e| err("CUDA device 0")(&e))?;
        let vk = open_exporter(uuid)?;
        let ctx = Context::new(Arc::clone(&backend), 0).map_err(|e| err("CUDA context")(&e))?;
        let cu = ctx
            .cudarc()
            .cloned()
            .ok_or_else(|| TransportError::new("the CUDA context did not come from cudarc"))?;
        // SAFETY: every cudarc slice of this context (the counters, the
        // copy-mode device buffers, the mappings lent per frame) is used on
        // one stream, `cstream`, in the order the work is queued, and the
        // stream is ordered against the Vulkan side by the imported
        // semaphores: cudarc's per-slice events would only order a stream
        // after itself. (Measured with them on: two events created,
        // waited for, recorded and destroyed per frame cost 73-80 us of the
        // handover stage against 60-64 us without; BENCHMARKS.md.)
        unsafe { cu.disable_event_tracking() };
        let kernel = Kernel::compile(&cu)?;
        let (frames, location) = allocate_frames(&vk, len, slots)?;
        let handover = Handover::from_env()?;
        let early = match std::env::var(EARLY_ENV).as_deref() {
            Err(_) | Ok("1") => true,
            Ok("0") => false,
            Ok(v) => {
                return Err(TransportError::new(format!(
                    "{EARLY_ENV}={v:?}: expected 0 or 1"
                )))
            }
        };
        let mapped = frames
            .iter()
            .map(|m| {
                import_frame(&ctx, m)?
                    .map_whole()
                    .map_err(|e| err("mapping a frame buffer in CUDA")(&e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let cstream = cu
            .new_stream()
            .map_err(|e| err("creating the CUDA stream")(&e))?;
        let stream = Stream::from_cudarc(&ctx, Arc::clone(&cstream))
            .map_err(|e| err("wrapping the CUDA stream")(&e))?;

        let mut ready_vk = Vec::with_capacity(slots);
        let mut free_vk = Vec::with_capacity(slots);
        let mut ready_cu = Vec::with_capacity(slots);
        let mut free_cu = Vec::with_capacity(slots);
        let mut reclaimed_vk = Vec::with_capacity(slots);
        for _ in 0..slots {
            reclaimed_vk.push(
                vk.create_semaphore(SemaphoreKind::Timeline, 0)
                    .map_err(|e| err("creating a Vulkan semaphore")(&e))?,
            );
            let (fd, sem) = vk
                .export_timeline_semaphore(0)
                .map_err(|e| err("exporting a ready semaphore from Vulkan")(&e))?;
            ready_vk.push(sem);
            ready_cu.push(
                ExternalSemaphore::timeline_fd(&ctx, fd)
                    .map_err(|e| err("importing a ready semaphore")(&e.into_parts().0))?,
            );
            let (fd, sem) = vk
                .export_timeline_semaphore(0)
                .map_err(|e| err("exporting a free semaphore from Vulkan")(&e))?;
            free_vk.push(sem);
            free_cu.push(
                ExternalSemaphore::timeline_fd(&ctx, fd)
                    .map_err(|e| err("importing a free semaphore")(&e.into_parts().0))?,
            );
        }

        let device_frames = match mode {
            Mode::ZeroCopy => Vec::new(),
            Mode::DeviceCopy => (0..slots)
                .map(|_| {
                    cstream
                        .alloc_zeros::<u8>(len)
                        .map_err(|e| err("allocating a device frame buffer")(&e))
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        let counters = Counters::new(&cu, slots)?;
        let events = Arc::new(
            (0..slots)
                .map(|_| SlotEvents::new(&cu))
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
                (Arc::clone(&cu), Arc::clone(&events), Arc::clone(&stopping));
            let done_tx = done_tx.clone();
            thread::Builder::new()
                .name("gpu-completions".into())
                .spawn(move || completion_loop(cu, events, jobs_rx, done_tx, stopping))
                .map_err(|e| err("starting the completion thread")(&e))?
        };
        let counters = Arc::new(counters);
        let host_enqueue_ns = Arc::new(AtomicU64::new(0));
        let enqueue = Enqueuer {
            geometry,
            mode,
            grid: consumer::grid_for(len),
            free_cu,
            ready_cu,
            mapped,
            device_frames,
            counters: Arc::clone(&counters),
            events: Arc::clone(&events),
            stream,
            cstream,
            kernel,
            ctx: ctx.clone(),
        };
        // At most one request per slot is outstanding (the ring).
        let (requests, requests_rx) = mpsc::sync_channel::<Request>(slots);
        let enqueuer = {
            let host_ns = Arc::clone(&host_enqueue_ns);
            thread::Builder::new()
                .name("gpu-enqueue".into())
                .spawn(move || enqueue_loop(enqueue, requests_rx, jobs_tx, done_tx, host_ns))
                .map_err(|e| err("starting the enqueue thread")(&e))?
        };
        Ok(GpuTransport {
            geometry,
            mode,
            location,
            note: note(mode, location, handover),
            requests: Some(requests),
            enqueuer: Some(enqueuer),
            host_enqueue_ns,
            counters,
            events,
            ctx,
            handover,
            early,
            handovers,
            frames,
            ready_vk,
            free_vk,
            reclaimed_vk,
            reclaim_pending: vec![(0, 0); slots],
            deferred: None,
            vk,
            ready_track: vec![TimelineTracker::new(0); slots],
            ready_awaited: vec![0; slots],
            pending: 0,
            times: GpuTimes::default(),
            signalled_at: vec![None; slots],
            done: done_rx,
            stopping,
            worker: Some(worker),
        })
    }

    /// One line on how frames are processed (the pipeline prints it).
    pub fn note(&self) -> &'static str {
        self.note
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
            wait: self.times.wait / n,
            ready_to_gpu: self.times.ready_to_gpu / self.times.blocked_frames.max(1) as u32,
            blocked_frames: self.times.blocked_frames,
            host_ready: self.times.host_ready / n,
            host_enqueue: Duration::from_nanos(self.host_enqueue_ns.load(Ordering::Relaxed)) / n,
            host_reclaim: self.times.host_reclaim / n,
            copy_in: self.times.copy_in / n,
            kernel: self.times.kernel / n,
            tail: self.times.tail / n,
        }
    }

    fn check_slot(&self, t: &Ticket) -> Result<usize, TransportError> {
        match t.slot() {
            s if s < self.frames.len() => Ok(s),
            s => Err(TransportError::new(format!("no slot {s}"))),
        }
    }

    /// Submits the batch that takes the slot back for the host once the consumer signals
    /// *free* ([`VulkanExporter::acquire_for_host_ahead`], not waited for
    /// here), which also signals the slot's host-only `reclaimed_vk`
    /// semaphore. [`FrameTransport::wait_free`] then only host-waits for that
    /// semaphore: the queue round trip of the acquire overlaps the frames in
    /// between instead of sitting on the producer's path. Called for a frame
    /// once the next frame's release batch was submitted: the acquire waits
    /// on the queue for *free*, and a release queued behind it would hold the
    /// next frame's *ready* until then, leaving the GPU idle in between.
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
        let value = self.reclaim_pending[slot].1 + 1;
        self.vk
            .acquire_for_host_ahead(
                &self.handovers[slot],
                &self.frames[slot],
                &[SemaphoreOp::timeline(&self.free_vk[slot], free)],
                &[SemaphoreOp::timeline(&self.reclaimed_vk[slot], value)],
            )
            .map_err(|e| err("submitting the slot's acquire for the host")(&e))?;
        self.reclaim_pending[slot] = (free, value);
        Ok(())
    }

    /// Turns a finished frame into its completion.
    fn collect(&mut self, d: Done) -> Result<Completion, TransportError> {
        self.pending = self.pending.saturating_sub(1);
        self.ctx
            .bind()
            .map_err(|e| err("binding the CUDA context")(&e))?;
        let ev = &self.events[d.slot];
        let span = |a: &CudaEvent, b: &CudaEvent| {
            a.elapsed_ms(b)
                .map(|ms| Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
                .map_err(|e| err("reading CUDA event times")(&e))
        };
        let wait = span(&ev.arrive, &ev.start)?;
        let after_wait = span(&ev.start, &ev.end)?;
        let blocked = wait > Duration::ZERO;
        let ready_to_gpu = match self.signalled_at[d.slot] {
            Some(at) if blocked => d
                .finished
                .checked_sub(after_wait)
                .map_or(Duration::ZERO, |passed| {
                    passed.saturating_duration_since(at)
                }),
            _ => Duration::ZERO,
        };
        let copy_in = span(&ev.start, &ev.kernel_start)?;
        let process = span(&ev.kernel_start, &ev.kernel_end)?;
        let tail = span(&ev.kernel_end, &ev.end)?;
        self.times.frames += 1;
        self.times.wait += wait;
        self.times.ready_to_gpu += ready_to_gpu;
        self.times.blocked_frames += u64::from(blocked);
        self.times.copy_in += copy_in;
        self.times.kernel += process;
        self.times.tail += tail;
        // SAFETY: the frame's end event completed, so its kernel (queued
        // before the event) is done, and the slot's next kernel is queued
        // only after this frame is collected (the ring).
        let mismatches = unsafe { self.counters.take(d.slot) }?;
        Ok(Completion {
            slot: d.slot,
            frame: d.frame,
            mismatches,
            process,
            busy: after_wait,
            finished: d.finished,
        })
    }

    /// Lets every consumer still waiting for a frame that was never released
    /// through (it then processes whatever the slot holds), stops the
    /// enqueue thread, waits for the stream, releases the CUDA side and
    /// stops the completion thread. Idempotent.
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
        // Requests still queued are queued on the stream now, their waits
        // already satisfied.
        self.requests = None;
        let cuda_side = match self.enqueuer.take().map(JoinHandle::join) {
            Some(Ok(e)) => Some(e),
            Some(Err(_)) => {
                first.get_or_insert(TransportError::new("the enqueue thread panicked"));
                None
            }
            None => None,
        };
        if let (None, Some(e)) = (&first, &cuda_side) {
            if let Err(x) = e.stream.synchronize() {
                first.get_or_insert(err("draining the CUDA stream")(&x));
            }
        }
        // The imports go before the Vulkan objects they import (the fields).
        drop(cuda_side);
        self.stopping.store(true, Ordering::Release);
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

    /// Waits until `slot`'s *free* fence reached `want` and the device's
    /// writes to the slot are visible to the host (see the module docs).
    fn wait_slot(&mut self, slot: usize, want: u64) -> Result<(), TransportError> {
        let (pending_free, reclaimed) = self.reclaim_pending[slot];
        if self.deferred.is_some_and(|(s, _)| s == slot) {
            // Not submitted ahead (a ring of one): acquired below, inline.
            self.deferred = None;
        }
        let reached = match self.handover {
            Handover::Queue if want != 0 && pending_free == want => {
                // Submitted by `reclaim_ahead` after the slot's last frame.
                self.reclaimed_vk[slot].wait(reclaimed, FREE_WAIT)
            }
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
        Ok(())
    }
}

impl Drop for GpuTransport {
    fn drop(&mut self) {
        // Errors were reported by `close` where it was called; a drop
        // after a failed run only needs the stream drained and the thread
        // stopped.
        let _ = self.shut_down();
    }
}

impl FrameTransport for GpuTransport {
    fn backend(&self) -> &'static str {
        BACKEND_NAME
    }

    fn slot_count(&self) -> usize {
        self.frames.len()
    }

    fn details(&self) -> Option<String> {
        let t = self.gpu_times();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let (family, flags) = self.vk.queue_family();
        Some(format!(
            "Vulkan queue family {family} ({flags:?}); host per frame (us, mean): ready submission {:.1}, CUDA enqueue {:.1}, acquire-ahead submission {:.1}; GPU per frame (us, mean of {} frames): blocked in the ready wait {:.1}, copy in {:.1}, kernel {:.1}, tail {:.1}; host ready submission -> stream past the wait {:.1} (over the {} frames the stream waited for)",
            us(t.host_ready),
            us(t.host_enqueue),
            us(t.host_reclaim),
            t.frames,
            us(t.wait),
            us(t.copy_in),
            us(t.kernel),
            us(t.tail),
            us(t.ready_to_gpu),
            t.blocked_frames
        ))
    }

    fn geometry(&self) -> FrameGeometry {
        self.geometry
    }

    fn wait_free(&mut self, t: &Ticket) -> Result<&mut [u8], TransportError> {
        let slot = self.check_slot(t)?;
        self.wait_slot(slot, t.free_wait())?;
        let len = self.geometry.frame_len();
        // SAFETY: the slot's free fence reached the value the consumer
        // signals after its last access to this memory (kernel, copies);
        // the consumer's next access waits for this slot's ready fence,
        // which only `signal_ready` signals, and that takes `&mut self`,
        // so it cannot run while the returned slice is alive.
        let bytes = unsafe { self.frames[slot].host_bytes_mut() }
            .map_err(|e| err("mapping the frame buffer")(&e))?;
        bytes
            .get_mut(..len)
            .ok_or_else(|| TransportError::new("the Vulkan allocation is smaller than a frame"))
    }

    fn lend(&mut self, p: &Peek) -> Result<Option<PeekedFrame>, TransportError> {
        let other = p.slot();
        if other >= self.frames.len() {
            return Ok(None);
        }
        let want = p.free_reached();
        let (pending_free, reclaimed) = self.reclaim_pending[other];
        let reached = match self.handover {
            // Only where the slot's acquire for the host was submitted ahead
            // for exactly this value: an inline acquire here would be
            // followed by the ahead one, taking the buffer back twice.
            Handover::Queue if pending_free == want => {
                self.reclaimed_vk[other].wait(reclaimed, FREE_WAIT)
            }
            Handover::Queue => return Ok(None),
            Handover::HostOnly => self.free_vk[other].wait(want, FREE_WAIT),
        }
        .map_err(|e| err("waiting for the free fence")(&e))?;
        if !reached {
            return Err(TransportError::new(format!(
                "slot {other}: the consumer did not free it (value {want}) within {FREE_WAIT:?}"
            )));
        }
        let len = self.geometry.frame_len();
        // SAFETY: the free fence reached the value the consumer signals
        // after its last access (and the acquire batch made its writes
        // visible to the host); its next access waits for the slot's next
        // ready signal. The slice lives only for this statement.
        let read = unsafe { self.frames[other].host_bytes_mut() }
            .map_err(|e| err("mapping the frame buffer")(&e))?
            .get_mut(..len)
            .ok_or_else(|| TransportError::new("the Vulkan allocation is smaller than a frame"))?;
        // SAFETY: the slot's mapping is made once at allocation and stays at
        // this address until the transport is dropped; its next write (by
        // the producer, after `wait_free` for the slot's next ticket) and
        // its next device access (after that ticket's ready signal) both
        // come after the slot's next ticket, and no call of this transport
        // for another ticket touches it (the acquire batches submitted ahead
        // are for the slots written since).
        Ok(Some(unsafe {
            PeekedFrame::new(NonNull::from(read).cast(), len)
        }))
    }

    fn signal_ready(&mut self, t: &Ticket) -> Result<(), TransportError> {
        let entered = Instant::now();
        let slot = self.check_slot(t)?;
        let tracker = &mut self.ready_track[slot];
        let reservation = tracker
            .reserve(t.ready())
            .map_err(|e| err("ready fence")(&e))?;
        let vk_signal = err("Vulkan signal of the ready fence");
        let signalled = match self.handover {
            Handover::Queue => self
                .vk
                .release_host_writes(
                    &self.handovers[slot],
                    &self.frames[slot],
                    &[],
                    &[SemaphoreOp::timeline(
                        &self.ready_vk[slot],
                        reservation.value(),
                    )],
                )
                .map_err(|e| vk_signal(&e)),
            Handover::HostOnly => self.ready_vk[slot]
                .signal(reservation.value())
                .map_err(|e| vk_signal(&e)),
        };
        let now = Instant::now();
        self.signalled_at[slot] = Some(now);
        self.times.host_ready += now - entered;
        match signalled {
            Ok(()) => tracker
                .commit(reservation)
                .map(|_| ())
                .map_err(|e| err("ready fence")(&e))?,
            Err(e) => {
                let _ = tracker.abort(reservation);
                return Err(e);
            }
        }
        // The previous frame's acquire goes into the queue behind this
        // frame's release (see `reclaim_ahead`); this frame's waits for the
        // next release. Its consumer is queued by now, whichever order the
        // ring uses.
        if self.handover == Handover::Queue {
            if let Some((prev, free)) = self.deferred.take() {
                let start = Instant::now();
                self.reclaim_ahead(prev, free)?;
                self.times.host_reclaim += start.elapsed();
            }
            self.deferred = Some((slot, t.free_signal()));
        }
        Ok(())
    }

    fn queues_before_ready(&self) -> bool {
        // The stream waits for *ready* on the device, and `shut_down` lets
        // a consumer whose frame was never signalled through.
        self.early
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
        self.requests
            .as_ref()
            .ok_or_else(|| TransportError::new("the transport is shut down"))?
            .send(request)
            .map_err(|_| TransportError::new("the enqueue thread stopped"))?;
        self.ready_awaited[slot] = t.ready();
        self.pending += 1;
        Ok(())
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
        if self.pending == 0 {
            return Err(TransportError::new("no frame is in flight"));
        }
        let d = self
            .done
            .recv()
            .map_err(|_| TransportError::new("the completion thread stopped"))??;
        self.collect(d)
    }

    fn close(mut self: Box<Self>) -> Result<(), TransportError> {
        let backend = Arc::clone(self.ctx.backend());
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
