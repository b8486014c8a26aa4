//! The NvSci transport: a ring of NvSciBuf frame buffers shared by a CPU
//! producer (the camera) and a CUDA consumer, with two NvSciSync objects per
//! slot carrying deterministic fences.
//!
//! Set-up, once per run (no frame buffer and no NvSci or CUDA object is
//! allocated per frame; per frame only the host function's closure and its
//! completion message are):
//! - every slot gets one NvSciBuf raw buffer, reconciled from the CPU
//!   producer's needs (CPU access, read-write) and the CUDA consumer's
//!   (its GPU, read-write); the consumer imports each buffer as CUDA
//!   memory, with the size read from the object, and maps it whole;
//! - a *ready* object per slot: the CPU signals it (`NvSciSyncObjSignal`),
//!   the consumer imports it as a waiter semaphore;
//! - a *free* object per slot: the consumer imports it as a signaler
//!   semaphore, the producer waits on it from the CPU.
//!
//! How each side gets the fence it waits for depends on what the loaded
//! NvSciSync offers ([`SyncModule::fence_source`], named in the summary and
//! the JSON `note`):
//!
//! - *built* (NvSciSync 2.3, 2.5+: `FenceUpdateFence` exists): both objects
//!   are reconciled with `RequireDeterministicFences`, so the fence of the
//!   k-th signal is known in advance (`initial + k`, from the core's
//!   `DeterministicCounter`): the consumer builds the ready fence it waits
//!   for with `fence_for_value` instead of receiving it, and so does the
//!   producer for the free fence. The counters' initial values are learned,
//!   never assumed: the free semaphore learns from its first CUDA signal's
//!   fence, the ready counter from the first generated CPU fence; every
//!   later signal checks the driver's own fence value against the counter
//!   (the CPU's generated fence, the CUDA signal's filled-in fence);
//! - *received* (NvSciSync 2.0 and the 2.4 flavour, without
//!   `FenceUpdateFence`): the standard NvSci hand-over: the producer passes
//!   the fence of each ready signal (`NvSciSyncObjGenerateFence`) to the
//!   consumer, and the consumer passes the fence its CUDA signal filled in
//!   back to the producer.
//!
//! Per frame the consumer queues on its CUDA stream: wait(ready fence) ->
//! process the frame in place -> signal(free). The processing step depends
//! on [`Processing`]:
//!
//! - [`Processing::CudaKernel`]: the pipeline's [`Consumer`] (the one the
//!   EGL and discrete-GPU transports use): the NVRTC kernel of
//!   [`crate::consumer`], launched on the consumer's stream over the mapped
//!   buffer, counts the bytes that differ from the test pattern into the
//!   slot's counter in mapped pinned host memory and inverts the frame in
//!   place; the frame's completion comes from its CUDA events, which also
//!   give the kernel's time. On a Jetson, and on the simulator, where the
//!   kernel runs as its Rust twin (the same compile, load, launch, events
//!   and counters: CI runs this path);
//! - [`Processing::HostFnOverSimulatedDeviceMemory`] (simulator only): a
//!   stream-ordered host function (`cuLaunchHostFunc`) over the mapped
//!   device pointer, which the simulator backs with host memory.
//!
//! The kernel path has never run on a Jetson: nothing here has one.
//!
//! CPU caches: the producer calls `NvSciBufObjFlushCpuCacheRange` over the
//! frame after writing it (before signalling *ready*) and again after the
//! *free* fence, before it reads the consumer's output. NvSciBuf documents
//! the flush as doing nothing unless the reconciled buffer needs software
//! cache coherency (`CpuNeedSwCacheCoherency`); the simulator's memory is
//! coherent. Whether, where it is needed, the flush also drops stale lines
//! before the CPU reads what the GPU wrote is not verified here; a stale
//! read would show as failed read-back verification, not as success.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tegra_interop::core::nvsci::GpuId;
use tegra_interop::core::DeterministicCounter;
use tegra_interop::driver::nvsci::{
    BufAttrList, BufAttrs, BufModule, BufPerm, BufType, CpuWaitContext, Fence, FenceSource,
    NvSciMemory, NvSciSemaphore, Signaler, SyncAttrList, SyncAttrs, SyncModule, SyncObj, SyncPerm,
    Timeout, Waiter,
};
use tegra_interop::driver::{Backend, BackendKind, Context, MappedBuffer, Stream};

use crate::consumer::shared::{CpuFrame, Lendable};
use crate::consumer::{CheckInvert, Consumer, ConsumerConfig, FrameMemory, FrameWork, Placement};
use crate::transport::host::Fault;
use crate::transport::{
    process_frame, try_recv_completion, wait_completion, Completion, DriverResultExt,
    FrameGeometry, FrameTransport, PeekedFrame, SlotMemory, Ticket, TransportError, TransportInfo,
};

/// How long a CPU wait or a completion may take before the run is declared
/// stuck (a healthy frame takes microseconds to milliseconds).
const STUCK: Duration = Duration::from_secs(10);

/// How the consumer processes a frame between its wait and its signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Processing {
    /// Simulator only: a host function queued on the consumer's CUDA stream
    /// (`cuLaunchHostFunc`) runs [`process_frame`] over the frame through
    /// the buffer's CPU mapping (on the simulator the bytes the device sees;
    /// on a Jetson this would skip the GPU, so it is not offered there).
    HostFnOverSimulatedDeviceMemory,
    /// The pipeline's [`Consumer`]: the NVRTC kernel of
    /// [`crate::consumer`] on the consumer's CUDA stream, over the mapped
    /// buffer, its mismatch counter in mapped pinned memory, completions
    /// from its events. On a Jetson (built, never run on one) and on the
    /// simulator, where the kernel runs as its Rust twin (register the
    /// twins first: `crate::consumer::twin::register`).
    CudaKernel,
}

impl Processing {
    /// One line for the summary: the processing and how fences travel
    /// (the kernel path as on a Jetson).
    pub fn describe_with(self, source: FenceSource) -> &'static str {
        self.describe(source, true)
    }

    /// As [`Processing::describe_with`], for the real driver (`real`) or the
    /// simulator.
    pub fn describe(self, source: FenceSource, real: bool) -> &'static str {
        use FenceSource::{Built, Received};
        match (self, real, source) {
            (Processing::HostFnOverSimulatedDeviceMemory, _, Built) => {
                "sim: processing runs as a stream-ordered host function over simulated device memory; deterministic fences built by each waiter (NvSciSyncFenceUpdateFence)"
            }
            (Processing::HostFnOverSimulatedDeviceMemory, _, Received) => {
                "sim: processing runs as a stream-ordered host function over simulated device memory; fences received from the signaller (this NvSciSync has no FenceUpdateFence)"
            }
            (Processing::CudaKernel, false, Built) => {
                "sim: the consumer's NVRTC kernel path (compile, load, launch, events, counters) with the kernel run as its Rust twin; deterministic fences built by each waiter (NvSciSyncFenceUpdateFence)"
            }
            (Processing::CudaKernel, false, Received) => {
                "sim: the consumer's NVRTC kernel path (compile, load, launch, events, counters) with the kernel run as its Rust twin; fences received from the signaller (this NvSciSync has no FenceUpdateFence)"
            }
            (Processing::CudaKernel, true, Built) => {
                "jetson: an NVRTC kernel on the consumer's CUDA stream checks and inverts each frame in place in its NvSciBuf buffer (this path is built but has never been run on a Jetson); deterministic fences built by each waiter (NvSciSyncFenceUpdateFence)"
            }
            (Processing::CudaKernel, true, Received) => {
                "jetson: an NVRTC kernel on the consumer's CUDA stream checks and inverts each frame in place in its NvSciBuf buffer (this path is built but has never been run on a Jetson); fences received from the signaller (this NvSciSync has no FenceUpdateFence)"
            }
        }
    }
}

/// The NvSci objects of the ring, allocated once (the producer's side).
pub struct Objects {
    syncs: SyncModule,
    source: FenceSource,
    slots: Vec<SlotObjects>,
    // Kept open for the objects' lifetime (they also hold it).
    _bufs: BufModule,
}

struct SlotObjects {
    /// The frame buffer, with the producer's CPU view of it (lent frames
    /// share it); `None` while it is out for writing ([`SlotMemory`]).
    frame: Option<Lendable<CpuFrame>>,
    ready: SyncObj,
    free: SyncObj,
}

impl SlotObjects {
    /// The slot's frame, unless it is out for writing.
    fn frame(&self, slot: usize) -> Result<&Lendable<CpuFrame>, TransportError> {
        self.frame.as_ref().ok_or_else(|| out_for_writing(slot))
    }

    /// The same, for the producer's writes.
    fn frame_mut(&mut self, slot: usize) -> Result<&mut Lendable<CpuFrame>, TransportError> {
        self.frame.as_mut().ok_or_else(|| out_for_writing(slot))
    }
}

/// Why a slot's frame is missing: it is out for writing.
fn out_for_writing(slot: usize) -> TransportError {
    TransportError::misuse(format!(
        "slot {slot}'s frame is out for writing (its lease was not given back)"
    ))
}

/// The frame buffers' reconciled attribute list: the camera writes through
/// the CPU mapping, CUDA reads and writes in place on its GPU.
fn buffer_list(bufs: &BufModule, gpu: GpuId, size: u64) -> Result<BufAttrList, TransportError> {
    let v = "buffer attributes";
    let raw = || -> Result<BufAttrs, TransportError> {
        let mut a = BufAttrs::new();
        a.types(&[BufType::RawBuffer])
            .and_then(|a| a.raw_size(size))
            .and_then(|a| a.required_perm(BufPerm::ReadWrite))
            .during(v)?;
        Ok(a)
    };
    let mut producer = raw()?;
    producer
        .need_cpu_access(true)
        .and_then(|a| a.raw_align(4096))
        .during(v)?;
    let mut consumer = raw()?;
    consumer.gpus(&[gpu]).during(v)?;
    let p = bufs
        .attr_list(&producer)
        .during("NvSciBuf attribute list")?;
    let c = bufs
        .attr_list(&consumer)
        .during("NvSciBuf attribute list")?;
    bufs.reconcile(&[&p, &c]).during("NvSciBuf reconciliation")
}

/// The reconciled lists of the *ready* objects (the CPU signals, CUDA
/// waits) and the *free* objects (CUDA signals, the CPU waits), with
/// deterministic fences where waiters build them (`built`).
fn sync_lists(
    syncs: &SyncModule,
    ctx: &Context,
    built: bool,
) -> Result<(SyncAttrList, SyncAttrList), TransportError> {
    let mut cpu_signal = SyncAttrs::new();
    let mut cpu_wait = SyncAttrs::new();
    let mut deterministic = SyncAttrs::new();
    (|| {
        cpu_signal
            .need_cpu_access(true)?
            .required_perm(SyncPerm::SignalOnly)?;
        if built {
            cpu_signal.require_deterministic_fences(true)?;
            deterministic.require_deterministic_fences(true)?;
        }
        cpu_wait
            .need_cpu_access(true)?
            .required_perm(SyncPerm::WaitOnly)?;
        Ok::<(), tegra_interop::driver::Error>(())
    })()
    .during("sync attributes")?;
    let ready_signal = syncs
        .attr_list(&cpu_signal)
        .during("NvSciSync attribute list")?;
    let ready_wait = syncs
        .cuda_waiter_attrs(ctx)
        .during("cuDeviceGetNvSciSyncAttributes (wait)")?;
    let ready = syncs
        .reconcile(&[&ready_signal, &ready_wait])
        .during("NvSciSync reconciliation (ready)")?;
    let mut free_signal = syncs
        .cuda_signaler_attrs(ctx)
        .during("cuDeviceGetNvSciSyncAttributes (signal)")?;
    free_signal
        .set(&deterministic)
        .during("NvSciSync attribute list")?;
    let free_wait = syncs
        .attr_list(&cpu_wait)
        .during("NvSciSync attribute list")?;
    let free = syncs
        .reconcile(&[&free_signal, &free_wait])
        .during("NvSciSync reconciliation (free)")?;
    Ok((ready, free))
}

impl Objects {
    /// Reconciles the producer's and the consumer's needs (consumer = CUDA
    /// in `ctx`) and allocates `slots` buffers of at least `frame_len` bytes
    /// and two sync objects per slot.
    pub fn allocate(
        backend: &Arc<Backend>,
        ctx: &Context,
        frame_len: usize,
        slots: usize,
    ) -> Result<Objects, TransportError> {
        let bufs = BufModule::open(backend).during("NvSciBufModuleOpen")?;
        let syncs = SyncModule::open(backend).during("NvSciSyncModuleOpen")?;
        let device = backend.device(ctx.ordinal()).during("CUDA device")?;
        let gpu = GpuId(device.uuid().during("CUDA device UUID")?);
        let size = u64::try_from(frame_len)
            .map_err(|_| TransportError::refused(format!("a frame of {frame_len} bytes")))?;
        let source = syncs.fence_source();
        let buf_list = buffer_list(&bufs, gpu, size)?;
        let (ready_list, free_list) = sync_lists(&syncs, ctx, source == FenceSource::Built)?;
        let mut out = Vec::with_capacity(slots);
        for _ in 0..slots {
            let buf = buf_list.alloc().during("NvSciBufObjAlloc")?;
            out.push(SlotObjects {
                frame: Some(Lendable::new(CpuFrame::new(buf, frame_len)?)),
                ready: ready_list.alloc().during("NvSciSyncObjAlloc (ready)")?,
                free: free_list.alloc().during("NvSciSyncObjAlloc (free)")?,
            });
        }
        Ok(Objects {
            syncs,
            source,
            slots: out,
            _bufs: bufs,
        })
    }

    /// How waiters get their fences with the loaded NvSciSync.
    pub fn fence_source(&self) -> FenceSource {
        self.source
    }

    /// The consumer's CUDA imports of the frame buffers, one per slot.
    pub fn import_memories(&self, ctx: &Context) -> Result<Vec<NvSciMemory>, TransportError> {
        self.slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.frame(i)?
                    .get()
                    .buf()
                    .import_cuda(ctx)
                    .during("CUDA import of an NvSciBuf object")
            })
            .collect()
    }
}

/// The consumer side of the transport: where the frames are processed.
enum Processor {
    /// [`Processing::HostFnOverSimulatedDeviceMemory`]: the transport's own
    /// stream, the mappings, and the channel the host functions report on.
    HostFn {
        stream: Stream,
        mappings: Vec<MappedBuffer>,
        done_tx: Sender<Completion>,
        done_rx: Receiver<Completion>,
        /// Completions queued and not yet collected.
        in_flight: usize,
    },
    /// [`Processing::CudaKernel`]: the pipeline's [`Consumer`], which owns
    /// the mappings.
    Kernel(Box<Consumer>),
}

impl Processor {
    /// The stream the consumer's waits and signals go on.
    fn stream(&self) -> &Stream {
        match self {
            Processor::HostFn { stream, .. } => stream,
            Processor::Kernel(c) => c.entry_stream(),
        }
    }

    /// The stream the *free* signal goes on (after the copy back, in copy
    /// placement).
    fn exit_stream(&self) -> &Stream {
        match self {
            Processor::HostFn { stream, .. } => stream,
            Processor::Kernel(c) => c.exit_stream(),
        }
    }
}

/// The NvSci transport (see the module docs): a value that owns its CUDA
/// context, its NvSci objects and their imports ([`NvSciTransport::open`]).
pub struct NvSciTransport {
    name: &'static str,
    note: &'static str,
    geometry: FrameGeometry,
    fault: Fault,
    cpu_wait: CpuWaitContext,
    // Consumer side: dropped after the streams have drained (see Drop).
    slots: Vec<Slot>,
    processor: Processor,
    // Dropped last: the imports (the mappings hold theirs too), the NvSci
    // objects, the consumer's context.
    _memories: Vec<NvSciMemory>,
    objects: Objects,
    _ctx: Context,
}

/// One slot's consumer-side semaphores and the fence bookkeeping of both
/// sides.
struct Slot {
    /// The ready object, imported as the consumer's waiter.
    waiter: NvSciSemaphore<Waiter>,
    /// The free object, imported as the consumer's signaller (it keeps, and
    /// learns, its own counter).
    signaler: NvSciSemaphore<Signaler>,
    /// Counts of the ready object's CPU signals (built fences; learned from
    /// the first generated fence).
    ready_counter: Option<DeterministicCounter>,
    /// Received fences: the ready fence the producer handed over.
    ready_fence: Option<Fence>,
    /// Received fences: the free fence the consumer handed back.
    free_fence: Option<Fence>,
    /// How many ready signals the CPU made (so a consumer is never queued
    /// to wait for a signal not yet made).
    ready_signalled: u64,
}

/// Per slot: the consumer's mapping of the buffer, and its [`Slot`].
fn import_slots(
    ctx: &Context,
    objects: &Objects,
    memories: &[NvSciMemory],
    geometry: FrameGeometry,
) -> Result<(Vec<MappedBuffer>, Vec<Slot>), TransportError> {
    let frame_len = geometry.frame_len() as u64;
    let n = objects.slots.len();
    let (mut mappings, mut slots) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for (s, mem) in objects.slots.iter().zip(memories) {
        if mem.size() < frame_len {
            return Err(TransportError::refused(format!(
                "CUDA import has {} bytes, a frame needs {frame_len}",
                mem.size()
            )));
        }
        mappings.push(mem.map_whole().during("CUDA mapping of a frame buffer")?);
        slots.push(Slot {
            waiter: s
                .ready
                .import_cuda_waiter(ctx)
                .during("CUDA import of the ready object")?,
            signaler: s
                .free
                .import_cuda_signaler(ctx)
                .during("CUDA import of the free object")?,
            ready_counter: None,
            ready_fence: None,
            free_fence: None,
            ready_signalled: 0,
        });
    }
    Ok((mappings, slots))
}

/// [`Placement::ReadBack`] is the EGLStream's: refused over NvSciBuf.
fn refuse_read_back(placement: Placement) -> Result<(), TransportError> {
    if placement == Placement::ReadBack {
        return Err(TransportError::refused(
            "the NvSci transport's consumer works on its own buffers: InPlace or DeviceCopy",
        ));
    }
    Ok(())
}

/// The kernel path's consumer over the CUDA mappings of NvSciBuf buffers
/// (memory the CPU maps too), one per slot, running `work` in
/// `placement`: what [`NvSciTransport::with_work`] runs in one process and
/// the CUDA process of `--processes 2` runs over the buffers the camera
/// process allocated. The caller queues the wait for *ready* on
/// [`Consumer::entry_stream`] before [`Consumer::queue`], and the *free*
/// signal on [`Consumer::exit_stream`] after it.
pub(crate) fn nvsci_consumer(
    ctx: &Context,
    work: Box<dyn FrameWork>,
    placement: Placement,
    geometry: FrameGeometry,
    mappings: Vec<MappedBuffer>,
) -> Result<Consumer, TransportError> {
    refuse_read_back(placement)?;
    let config = ConsumerConfig {
        geometry,
        slots: mappings.len(),
        memory: FrameMemory::System,
        placement,
        skip_kernel: false,
    };
    Consumer::new(ctx, config, mappings, work)
}

impl NvSciTransport {
    #[cfg(feature = "sim")]
    /// Opens the transport on a new simulated Tegra (`SimConfig::tegra()`)
    /// with the kernel path ([`Processing::CudaKernel`]): the same consumer
    /// code as on a Jetson, the kernels run as their Rust twins (registered
    /// here). Gives the simulator too, for its ledgers after the run.
    pub fn open_sim(
        name: &'static str,
        geometry: FrameGeometry,
        slots: usize,
    ) -> Result<(NvSciTransport, tegra_interop_sim::Sim), TransportError> {
        let sim = tegra_interop_sim::Sim::with_config(tegra_interop_sim::SimConfig::tegra())
            .map_err(|e| TransportError::refused(format!("cannot start the simulator: {e}")))?;
        crate::consumer::twin::register(&sim);
        let t = Self::open(
            &sim.backend(),
            name,
            Processing::CudaKernel,
            geometry,
            slots,
        )?;
        Ok((t, sim))
    }

    /// Opens the transport on `backend`: one CUDA context (the consumer) on
    /// device 0, the ring's NvSci objects for `slots` slots, their CUDA
    /// imports, the consumer's stream. `name` is printed as the backend.
    pub fn open(
        backend: &Arc<Backend>,
        name: &'static str,
        processing: Processing,
        geometry: FrameGeometry,
        slots: usize,
    ) -> Result<Self, TransportError> {
        let ctx = Context::new(Arc::clone(backend), 0).during("CUDA context")?;
        Self::new(&ctx, name, processing, geometry, slots)
    }

    /// Opens the transport with `ctx` as the consumer's context (the
    /// transport keeps a clone of it; so may the caller, for its own work).
    /// [`Processing::CudaKernel`] runs the check-and-invert kernel
    /// ([`CheckInvert`]); [`NvSciTransport::with_work`] runs the caller's.
    pub fn new(
        ctx: &Context,
        name: &'static str,
        processing: Processing,
        geometry: FrameGeometry,
        slots: usize,
    ) -> Result<Self, TransportError> {
        let work = (processing == Processing::CudaKernel).then(CheckInvert::boxed);
        let placed = work.map(|w| (w, Placement::InPlace));
        Self::build(ctx, name, processing, placed, geometry, slots)
    }

    /// Opens the transport with `ctx` as the consumer's context, the
    /// consumer running `work` on every frame: on the NvSciBuf buffer
    /// itself ([`Placement::InPlace`], zero-copy) or on a device-local copy
    /// of it, copied back after the work ([`Placement::DeviceCopy`]).
    /// [`Placement::ReadBack`] is the EGLStream's, refused here.
    pub fn with_work(
        ctx: &Context,
        name: &'static str,
        work: Box<dyn FrameWork>,
        placement: Placement,
        geometry: FrameGeometry,
        slots: usize,
    ) -> Result<Self, TransportError> {
        refuse_read_back(placement)?;
        let processing = Processing::CudaKernel;
        let placed = Some((work, placement));
        Self::build(ctx, name, processing, placed, geometry, slots)
    }

    /// The transport with `fault` injected, for testing the checks that
    /// must catch it (the `pipeline` program's `--fault`): a frame damaged
    /// between the write and the ready signal ([`Fault::Corrupt`]), or the
    /// consumer's work left out while the frame is still reported done
    /// ([`Fault::SkipProcess`]). [`Fault::None`] leaves it as it is. Not for
    /// production rings.
    pub fn with_fault(mut self, fault: Fault) -> Self {
        if let Processor::Kernel(consumer) = &mut self.processor {
            consumer.set_skip_kernel(fault == Fault::SkipProcess);
        }
        self.fault = fault;
        self
    }

    fn build(
        ctx: &Context,
        name: &'static str,
        processing: Processing,
        work: Option<(Box<dyn FrameWork>, Placement)>,
        geometry: FrameGeometry,
        slots: usize,
    ) -> Result<Self, TransportError> {
        let objects = Objects::allocate(ctx.backend(), ctx, geometry.frame_len(), slots)?;
        let memories = objects.import_memories(ctx)?;
        let (mappings, slot_state) = import_slots(ctx, &objects, &memories, geometry)?;
        let processor = match (processing, work) {
            (Processing::HostFnOverSimulatedDeviceMemory, _) | (_, None) => {
                let (done_tx, done_rx) = mpsc::channel();
                Processor::HostFn {
                    stream: Stream::new(ctx).during("CUDA stream")?,
                    mappings,
                    done_tx,
                    done_rx,
                    in_flight: 0,
                }
            }
            (Processing::CudaKernel, Some((work, placement))) => Processor::Kernel(Box::new(
                nvsci_consumer(ctx, work, placement, geometry, mappings)?,
            )),
        };
        let cpu_wait = CpuWaitContext::new(&objects.syncs).during("CPU wait context")?;
        Ok(NvSciTransport {
            name,
            note: processing.describe(
                objects.fence_source(),
                ctx.backend().kind() == BackendKind::Real,
            ),
            geometry,
            fault: Fault::None,
            cpu_wait,
            slots: slot_state,
            processor,
            _memories: memories,
            objects,
            _ctx: ctx.clone(),
        })
    }

    /// One line for the summary: how frames are processed and how fences
    /// travel with the loaded NvSciSync.
    pub fn note(&self) -> &'static str {
        self.note
    }

    /// Damages the last byte of `slot`'s frame (the kernel path's
    /// [`Fault::Corrupt`]), between the camera's write and the ready signal.
    fn corrupt_last_byte(&mut self, slot: usize) -> Result<(), TransportError> {
        let s = self
            .objects
            .slots
            .get_mut(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?;
        if let Some(b) = s.frame_mut(slot)?.get_mut(slot)?.bytes_mut().last_mut() {
            *b ^= 0x5a;
        }
        Ok(())
    }

    /// `NvSciBufObjFlushCpuCacheRange` over the slot's frame.
    fn flush_cpu_cache(&self, slot: usize) -> Result<(), TransportError> {
        self.objects.slots[slot]
            .frame(slot)?
            .get()
            .buf()
            .flush_cpu_cache_range(0, self.geometry.frame_len() as u64)
            .during(format!("CPU cache flush of slot {slot}"))
    }

    /// The ready object's fence value of the ticket's ready signal.
    fn ready_value(&self, t: &Ticket) -> Result<u64, TransportError> {
        self.slots
            .get(t.slot())
            .and_then(|s| s.ready_counter.as_ref())
            .map(|c| c.value_of_signal(t.ready()))
            .ok_or_else(|| TransportError::misuse("no ready counter: fences are received"))
    }

    fn built(&self) -> bool {
        self.objects.source == FenceSource::Built
    }

    /// Queues the processing of `frame` on the stream.
    fn queue_processing(&mut self, slot: usize, frame: u64) -> Result<(), TransportError> {
        let (stride, fault) = (self.geometry.stride, self.fault);
        let (stream, tx, in_flight) = match &mut self.processor {
            Processor::Kernel(consumer) => return consumer.queue(slot, frame),
            Processor::HostFn {
                stream,
                done_tx,
                in_flight,
                ..
            } => (stream, done_tx.clone(), in_flight),
        };
        let cpu = &self
            .objects
            .slots
            .get(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?
            .frame(slot)?;
        cpu.queue_host_processing(slot, stream, move |bytes| {
            if fault == Fault::Corrupt {
                if let Some(b) = bytes.last_mut() {
                    *b ^= 0x5a;
                }
            }
            let start = Instant::now();
            let mismatches = match fault {
                Fault::SkipProcess => 0,
                _ => process_frame(frame, stride, bytes),
            };
            let process = start.elapsed();
            // The receiver is gone only when the transport is being
            // dropped; then nobody needs the result.
            let _ = tx.send(Completion {
                slot,
                frame,
                mismatches,
                process,
                busy: process,
                finished: Instant::now(),
            });
        })?;
        *in_flight += 1;
        Ok(())
    }

    /// Waits (on the CPU) until `slot`'s *free* fence reached signal `k`
    /// (nothing for 0) and makes the consumer's writes visible to the CPU.
    /// Waiting again for a value already reached returns at once.
    fn wait_slot(&mut self, slot: usize, k: u64) -> Result<(), TransportError> {
        if slot >= self.objects.slots.len() {
            return Err(TransportError::no_slot(slot));
        }
        if k > 0 {
            let reached = if self.built() {
                let Some(counter) = self.slots[slot].signaler.counter() else {
                    return Err(TransportError::misuse("free semaphore lost its counter"));
                };
                self.objects.slots[slot]
                    .free
                    .fence_for_value(counter.value_of_signal(k))
                    .during("free fence")?
                    .wait(&mut self.cpu_wait, Timeout::After(STUCK))
            } else {
                // The fence of free signal k, handed back at queue_consumer;
                // kept until the slot's next queue_consumer replaces it, so a
                // peek and the slot's next ticket both wait on it.
                self.slots[slot]
                    .free_fence
                    .as_ref()
                    .ok_or_else(|| {
                        TransportError::misuse(format!(
                            "slot {slot}: the consumer handed back no free fence for signal {k}"
                        ))
                    })?
                    .wait(&mut self.cpu_wait, Timeout::After(STUCK))
            }
            .during("CPU wait on free fence")?;
            if !reached {
                return Err(TransportError::timeout(
                    format!("slot {slot}'s free signal {k}"),
                    STUCK,
                ));
            }
        }
        // Before the CPU reads what the consumer wrote (see the module docs
        // on CPU caches). The producer's own lines were written back at its
        // ready signal and it has not written the slot since, so this cannot
        // overwrite the consumer's output.
        self.flush_cpu_cache(slot)?;
        Ok(())
    }
}

impl FrameTransport for NvSciTransport {
    fn info(&self) -> TransportInfo {
        TransportInfo {
            backend: self.name,
            geometry: self.geometry,
            slots: self.objects.slots.len(),
            queues_before_ready: false,
        }
    }

    fn lend(
        &mut self,
        slot: usize,
        frame: u64,
        free_reached: u64,
    ) -> Result<Option<PeekedFrame>, TransportError> {
        if slot >= self.objects.slots.len() {
            return Err(TransportError::no_slot(slot));
        }
        // A later frame of the slot was signalled ready: the consumer may
        // be writing the slot, which no longer holds the frame.
        if self.slots[slot].ready_signalled > free_reached {
            return Err(TransportError::misuse(format!(
                "lend of frame {frame} in slot {slot}, which has moved on to a later frame"
            )));
        }
        // The consumer is done with it once its free fence for the frame
        // is reached; the slot's next take, ready signal and processing
        // wait for the lent frame to be dropped.
        self.wait_slot(slot, free_reached)?;
        Ok(Some(
            self.objects.slots[slot]
                .frame(slot)?
                .lend(self.geometry.frame_len())?,
        ))
    }

    fn take_slot(&mut self, t: &Ticket) -> Result<SlotMemory, TransportError> {
        let slot = t.slot();
        if slot >= self.objects.slots.len() {
            return Err(TransportError::no_slot(slot));
        }
        // The consumer is done with the slot once its free fence for the
        // slot's previous frame is reached (or the slot was never used);
        // lent frames of it are given back before it leaves the transport.
        self.wait_slot(slot, t.free_wait())?;
        self.objects.slots[slot].frame(slot)?.wait_returned(slot)?;
        let frame = self.objects.slots[slot]
            .frame
            .take()
            .ok_or_else(|| out_for_writing(slot))?;
        Ok(SlotMemory::new(t, self.geometry.frame_len(), frame))
    }

    fn put_back(&mut self, t: &Ticket, memory: SlotMemory) -> Result<(), TransportError> {
        let slot = t.slot();
        let frame: Lendable<CpuFrame> = memory.into_memory(t)?;
        let held = &mut self
            .objects
            .slots
            .get_mut(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?
            .frame;
        if held.is_some() {
            return Err(TransportError::misuse(format!(
                "slot {slot}'s frame given back while the transport holds it"
            )));
        }
        *held = Some(frame);
        Ok(())
    }

    fn signal_ready(&mut self, t: &Ticket, memory: SlotMemory) -> Result<(), TransportError> {
        self.put_back(t, memory)?;
        let slot = t.slot();
        if slot >= self.objects.slots.len() {
            return Err(TransportError::no_slot(slot));
        }
        if self.fault == Fault::Corrupt && matches!(self.processor, Processor::Kernel(_)) {
            // The kernel path's fault: one byte damaged after the camera
            // wrote the frame (the host-function path damages it in the
            // consumer).
            self.corrupt_last_byte(slot)?;
        }
        // The device writes the slot once it is signalled ready: not while
        // a lent frame of it is read.
        self.objects.slots[slot].frame(slot)?.wait_returned(slot)?;
        // The camera's writes reach memory before the consumer may read them
        // (see the module docs on CPU caches).
        self.flush_cpu_cache(slot)?;
        let ready = &self.objects.slots[slot].ready;
        // The fence of the CPU signal about to be made, from the library.
        let fence = ready.generate_fence().during("ready fence")?;
        if self.built() && self.slots[slot].ready_counter.is_none() {
            // The first ready signal teaches the counter its initial value.
            let learned = ready
                .counter_from_fence(t.ready(), &fence)
                .during("ready fence counter")?;
            self.slots[slot].ready_counter = Some(learned);
        }
        if self.built() {
            // It must be the value the consumer computes on its own.
            let want = self.ready_value(t)?;
            let got = fence.extract().during("ready fence")?.map(|f| f.value);
            if got != Some(want) {
                return Err(TransportError::frame_check(
                    slot,
                    t.frame(),
                    format!("the ready signal has fence value {got:?}, the deterministic counter says {want}"),
                ));
            }
        }
        ready.cpu_signal().during("CPU signal")?;
        self.slots[slot].ready_signalled = t.ready();
        if !self.built() {
            // Handed to the consumer (the standard NvSci flow).
            self.slots[slot].ready_fence = Some(fence);
        }
        Ok(())
    }

    fn queue_consumer(&mut self, t: &Ticket) -> Result<(), TransportError> {
        let (slot, frame) = (t.slot(), t.frame());
        if slot >= self.objects.slots.len() {
            return Err(TransportError::no_slot(slot));
        }
        // Queueing a wait for a signal that may never come would stall the
        // stream (and everything after it) for good: refused.
        if self.slots[slot].ready_signalled < t.ready() {
            return Err(TransportError::misuse(format!(
                "consumer of frame {frame} in slot {slot} queued before its ready signal"
            )));
        }
        // Built: the consumer builds the fence it waits for from the
        // counter, on its own handle of the object: nothing is passed from
        // the producer. Received: the producer's fence of this frame.
        let ready = if self.built() {
            self.slots[slot]
                .waiter
                .object()
                .fence_for_value(self.ready_value(t)?)
                .during("ready fence")?
        } else {
            self.slots[slot].ready_fence.take().ok_or_else(|| {
                TransportError::misuse(format!(
                    "slot {slot}: the producer handed over no ready fence for frame {frame}"
                ))
            })?
        };
        self.slots[slot]
            .waiter
            .wait(self.processor.stream(), &ready)
            .during("CUDA wait on ready fence")?;
        // From here on the frame's completion will arrive.
        self.queue_processing(slot, frame)?;
        let free = self.slots[slot]
            .signaler
            .signal(self.processor.exit_stream())
            .during("CUDA signal of free fence")?;
        let produced = self.slots[slot]
            .signaler
            .counter()
            .map(|c| c.current_value());
        if !self.built() {
            // Handed back to the producer, which waits on it before reusing
            // the slot.
            self.slots[slot].free_fence = Some(free);
            return Ok(());
        }
        let filled = free.extract().during("free fence")?.map(|f| f.value);
        if produced.is_none() || filled != produced {
            return Err(TransportError::frame_check(
                slot,
                frame,
                format!("the driver's free fence is {filled:?}, the deterministic counter says {produced:?}"),
            ));
        }
        Ok(())
    }

    fn try_complete(&mut self) -> Result<Option<Completion>, TransportError> {
        match &mut self.processor {
            Processor::Kernel(c) => Ok(c.try_complete()?.map(|(c, _)| c)),
            Processor::HostFn {
                done_rx, in_flight, ..
            } => {
                let c = try_recv_completion(done_rx)?;
                if c.is_some() {
                    *in_flight = in_flight.saturating_sub(1);
                }
                Ok(c)
            }
        }
    }

    fn wait_complete(&mut self) -> Result<Completion, TransportError> {
        match &mut self.processor {
            Processor::Kernel(c) => c.wait_complete(STUCK).map(|(c, _)| c),
            Processor::HostFn {
                done_rx, in_flight, ..
            } => {
                let c = wait_completion(done_rx, *in_flight, STUCK)?;
                *in_flight = in_flight.saturating_sub(1);
                Ok(c)
            }
        }
    }
}

impl Drop for NvSciTransport {
    fn drop(&mut self) {
        // Every queued wait has had its signal (`queue_consumer` refuses
        // one before it), so the streams drain, before the semaphores and
        // the imports are released (the fields drop after this). If they
        // cannot be drained, host functions may still touch the frames:
        // leak those rather than free them under the stream. (The kernel
        // path's `Consumer` leaks what its streams use when it drops
        // undrained.)
        match &mut self.processor {
            Processor::HostFn {
                stream, mappings, ..
            } => {
                if stream.synchronize().is_err() {
                    std::mem::forget(std::mem::take(mappings));
                    std::mem::forget(std::mem::take(&mut self.objects.slots));
                }
            }
            Processor::Kernel(consumer) => {
                // An error here is the driver's; the consumer's own drop
                // handles what it owns.
                let _ = consumer.drain();
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::TestPattern;
    use crate::slots::Slots as Ring;
    use tegra_interop_sim::{Sim, SimConfig};

    const G: FrameGeometry = FrameGeometry {
        stride: 64,
        rows: 8,
    };

    fn open_on(
        sim: &Sim,
        processing: Processing,
        slots: usize,
        fault: Fault,
    ) -> Result<NvSciTransport, TransportError> {
        crate::consumer::twin::register(sim);
        NvSciTransport::open(&sim.backend(), "nvsci-sim", processing, G, slots)
            .map(|t| t.with_fault(fault))
    }

    /// Runs `f` over a transport and a ring on a fresh simulator, then
    /// checks that nothing was left behind and nothing was flagged.
    fn with<R>(
        slots: usize,
        fault: Fault,
        f: impl FnOnce(&mut NvSciTransport, &mut Ring) -> R,
    ) -> R {
        let sim = Sim::with_config(SimConfig::tegra()).unwrap();
        let mut t = open_on(
            &sim,
            Processing::HostFnOverSimulatedDeviceMemory,
            slots,
            fault,
        )
        .unwrap();
        let r = f(&mut t, &mut Ring::new(slots).unwrap());
        drop(t);
        assert!(sim.ledger().is_clean(), "CUDA ledger: {}", sim.ledger());
        assert!(
            sim.nvsci_ledger().is_clean(),
            "NvSci ledger: {}",
            sim.nvsci_ledger()
        );
        assert!(sim.diagnostics().is_empty(), "{:#?}", sim.diagnostics());
        r
    }

    /// Collects whatever finished, then until the next slot is not in
    /// flight (what the ring does before an acquire).
    fn make_room(t: &mut NvSciTransport, ring: &mut Ring, mut each: impl FnMut(&Completion)) {
        while let Some(c) = t.try_complete().unwrap() {
            ring.complete(&c).unwrap();
            each(&c);
        }
        while matches!(
            ring.state(ring.next_slot()),
            Some(crate::slots::SlotState::InFlight(_))
        ) {
            let c = t.wait_complete().unwrap();
            ring.complete(&c).unwrap();
            each(&c);
        }
    }

    /// Collects every frame in flight.
    fn drain(t: &mut NvSciTransport, ring: &mut Ring, mut each: impl FnMut(&Completion)) {
        while ring.in_flight() > 0 {
            let c = t.wait_complete().unwrap();
            ring.complete(&c).unwrap();
            each(&c);
        }
    }

    /// Wait, write the pattern, signal ready (the ring's first two moves).
    fn write(t: &mut NvSciTransport, ring: &mut Ring) -> Result<Ticket, TransportError> {
        let ticket = ring.acquire().map_err(TransportError::new)?;
        let mut m = t.take_slot(&ticket)?;
        TestPattern::new(ticket.frame(), G.stride).fill(m.bytes_mut()?);
        t.signal_ready(&ticket, m)?;
        ring.release(&ticket, Instant::now(), 0)
            .map_err(TransportError::new)?;
        Ok(ticket)
    }

    /// One whole frame: write, then queue the consumer.
    fn produce(t: &mut NvSciTransport, ring: &mut Ring) -> Ticket {
        let ticket = write(t, ring).unwrap();
        t.queue_consumer(&ticket).unwrap();
        ring.submit(&ticket).unwrap();
        ticket
    }

    #[test]
    fn frames_round_trip_in_place_and_leave_nothing_behind() {
        with(2, Fault::None, |t, ring| {
            assert_eq!(t.info().backend, "nvsci-sim");
            let mut last = None;
            for frame in 0..9u64 {
                make_room(t, ring, |c| assert_eq!(c.mismatches, 0));
                let ticket = ring.acquire().unwrap();
                let mut m = t.take_slot(&ticket).unwrap();
                let buf = m.bytes_mut().unwrap();
                if frame >= 2 {
                    // The consumer's in-place result of the slot's previous
                    // frame, seen through the producer's CPU pointer.
                    let prev = TestPattern::new(frame - 2, G.stride);
                    assert_eq!(prev.first_mismatch(buf, 0xff), None, "frame {frame}");
                }
                TestPattern::new(frame, G.stride).fill(buf);
                t.signal_ready(&ticket, m).unwrap();
                ring.release(&ticket, Instant::now(), 0).unwrap();
                t.queue_consumer(&ticket).unwrap();
                ring.submit(&ticket).unwrap();
            }
            drain(t, ring, |c| {
                assert_eq!(c.mismatches, 0);
                last = Some(c.frame);
            });
            assert_eq!(last, Some(8));
            assert!(t.wait_complete().is_err(), "nothing else in flight");
        });
    }

    #[test]
    fn the_ring_runs_at_every_nvsci_release_with_built_or_received_fences() {
        use tegra_interop_sim::NvSciRelease;
        for release in NvSciRelease::ALL {
            let mut cfg = SimConfig::tegra();
            cfg.nvsci_release = release;
            let sim = Sim::with_config(cfg).unwrap();
            let mut t = open_on(
                &sim,
                Processing::HostFnOverSimulatedDeviceMemory,
                2,
                Fault::None,
            )
            .unwrap();
            let mut ring = Ring::new(2).unwrap();
            for frame in 0..6u64 {
                let ticket = produce(&mut t, &mut ring);
                assert_eq!(ticket.slot(), (frame % 2) as usize);
                let c = t.wait_complete().unwrap();
                assert_eq!((c.frame, c.mismatches), (frame, 0), "{release}");
                ring.complete(&c).unwrap();
            }
            let note = t.note();
            drop(t);
            let received = matches!(release, NvSciRelease::V5_2_6 | NvSciRelease::JetsonSync2_4);
            assert_eq!(
                note.contains("received from the signaller"),
                received,
                "{release}: {note}"
            );
            assert_eq!(
                note.contains("built by each waiter"),
                !received,
                "{release}"
            );
            assert!(sim.ledger().is_clean(), "{release}: {}", sim.ledger());
            assert!(
                sim.nvsci_ledger().is_clean(),
                "{release}: {}",
                sim.nvsci_ledger()
            );
            assert!(
                sim.diagnostics().is_empty(),
                "{release}: {:#?}",
                sim.diagnostics()
            );
        }
    }

    #[test]
    fn a_nonzero_initial_fence_value_is_learned_not_assumed() {
        // Slot 0's ready object (the first one allocated) starts at 5: the
        // ring learns it from the first fence and runs two frames through
        // the slot (the second uses the built fences of both objects).
        let sim = Sim::with_config(SimConfig::tegra()).unwrap();
        sim.nvsci_set_next_sync_initial(5);
        let mut t = open_on(
            &sim,
            Processing::HostFnOverSimulatedDeviceMemory,
            1,
            Fault::None,
        )
        .unwrap();
        let mut ring = Ring::new(1).unwrap();
        for _ in 0..2 {
            produce(&mut t, &mut ring);
            let c = t.wait_complete().unwrap();
            assert_eq!(c.mismatches, 0);
            ring.complete(&c).unwrap();
        }
    }

    #[test]
    fn a_lent_frame_is_waited_for_before_its_slot_is_rewritten_and_a_stale_one_refused() {
        with(2, Fault::None, |t, ring| {
            produce(t, ring);
            drain(t, ring, |_| {});
            let (slot, free) = ring.lendable(0).unwrap();
            // Lent straight from the transport: no ring holds the slot
            // back, the transport must.
            let lent = t.lend(slot, 0, free).unwrap().unwrap();
            let dropped = std::sync::atomic::AtomicBool::new(false);
            let next = std::thread::scope(|scope| {
                let reader = scope.spawn(|| {
                    for _ in 0..10 {
                        let processed = TestPattern::new(0, G.stride);
                        assert_eq!(processed.first_mismatch(lent.bytes(), 0xff), None);
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    dropped.store(true, std::sync::atomic::Ordering::SeqCst);
                    drop(lent);
                });
                produce(t, ring); // frame 1, slot 1
                let next = ring.acquire().unwrap(); // frame 2, slot 0
                let mut m = t.take_slot(&next).unwrap();
                assert!(
                    dropped.load(std::sync::atomic::Ordering::SeqCst),
                    "slot 0 handed out for writing while its frame was lent"
                );
                TestPattern::new(2, G.stride).fill(m.bytes_mut().unwrap());
                reader.join().unwrap();
                t.signal_ready(&next, m).unwrap();
                ring.release(&next, Instant::now(), 0).unwrap();
                next
            });
            // Slot 0 moved on to frame 2: lending frame 0 is refused.
            let e = t.lend(slot, 0, free).unwrap_err();
            assert!(e.to_string().contains("moved on"), "{e}");
            t.queue_consumer(&next).unwrap();
            ring.submit(&next).unwrap();
            drain(t, ring, |c| assert_eq!(c.mismatches, 0));
        });
    }

    #[test]
    fn a_consumer_queued_before_the_ready_signal_is_refused_not_queued() {
        with(1, Fault::None, |t, ring| {
            let ticket = ring.acquire().unwrap();
            let mut m = t.take_slot(&ticket).unwrap();
            TestPattern::new(0, G.stride).fill(m.bytes_mut().unwrap());
            // Out of order: queued before the ready signal is refused.
            let e = t.queue_consumer(&ticket).unwrap_err();
            assert!(matches!(e, TransportError::Misuse { .. }), "{e:?}");
            assert!(e.to_string().contains("before its ready signal"), "{e}");
            t.signal_ready(&ticket, m).unwrap();
            ring.release(&ticket, Instant::now(), 0).unwrap();
            t.queue_consumer(&ticket).unwrap();
            ring.submit(&ticket).unwrap();
            let c = t.wait_complete().unwrap();
            assert_eq!((c.slot, c.frame, c.mismatches), (0, 0, 0));
            ring.complete(&c).unwrap();
            assert!(t.wait_complete().is_err(), "nothing else in flight");
        });
    }

    #[test]
    fn faults_reach_the_consumer() {
        with(1, Fault::Corrupt, |t, ring| {
            produce(t, ring);
            assert_eq!(t.wait_complete().unwrap().mismatches, 1);
        });
        with(1, Fault::SkipProcess, |t, ring| {
            produce(t, ring);
            let c = t.wait_complete().unwrap();
            assert_eq!(c.mismatches, 0);
            ring.complete(&c).unwrap();
            // Not inverted: the producer sees the raw pattern again.
            let next = ring.acquire().unwrap();
            let mut m = t.take_slot(&next).unwrap();
            assert_eq!(
                TestPattern::new(0, G.stride).first_mismatch(m.bytes_mut().unwrap(), 0xff),
                Some(0)
            );
            t.put_back(&next, m).unwrap();
        });
    }

    #[test]
    fn a_failing_driver_call_is_an_error_not_a_panic() {
        let sim = Sim::with_config(SimConfig::tegra()).unwrap();
        sim.fail_symbol("cuLaunchHostFunc", 0, 1);
        let mut t = open_on(
            &sim,
            Processing::HostFnOverSimulatedDeviceMemory,
            1,
            Fault::None,
        )
        .unwrap();
        let ticket = write(&mut t, &mut Ring::new(1).unwrap()).unwrap();
        let e = t.queue_consumer(&ticket).unwrap_err();
        assert!(e.to_string().contains("cuLaunchHostFunc"), "{e}");
        assert!(e.driver_error().is_some(), "{e:?}");
        assert!(std::error::Error::source(&e).is_some(), "{e:?}");
        drop(t);
        assert!(sim.ledger().is_clean(), "{}", sim.ledger());
        assert!(sim.nvsci_ledger().is_clean(), "{}", sim.nvsci_ledger());
    }

    /// Runs `frames` frames through the kernel path on a fresh simulator
    /// (every release's fence flavour is covered by the host-function
    /// test above; this is the tegra default) and returns the completions.
    fn kernel_run(slots: usize, frames: u64, fault: Fault) -> Vec<Completion> {
        let (mut t, sim) = NvSciTransport::open_sim("nvsci-sim", G, slots)
            .map(|(t, s)| (t.with_fault(fault), s))
            .unwrap();
        assert!(t
            .note()
            .starts_with("sim: the consumer's NVRTC kernel path"));
        let mut ring = Ring::new(slots).unwrap();
        let mut done = Vec::new();
        for frame in 0..frames {
            make_room(&mut t, &mut ring, |c| done.push(*c));
            let ticket = ring.acquire().unwrap();
            let mut m = t.take_slot(&ticket).unwrap();
            let buf = m.bytes_mut().unwrap();
            if frame >= slots as u64 && fault == Fault::None {
                // The kernel's in-place result, through the CPU pointer.
                let prev = TestPattern::new(frame - slots as u64, G.stride);
                assert_eq!(prev.first_mismatch(buf, 0xff), None, "frame {frame}");
            }
            TestPattern::new(frame, G.stride).fill(buf);
            t.signal_ready(&ticket, m).unwrap();
            ring.release(&ticket, Instant::now(), 0).unwrap();
            t.queue_consumer(&ticket).unwrap();
            ring.submit(&ticket).unwrap();
        }
        drain(&mut t, &mut ring, |c| done.push(*c));
        drop(t);
        let log = sim.call_log();
        for call in ["nvrtcCompileProgram", "cuModuleLoadData", "cuEventQuery"] {
            assert!(log.contains(&call), "{call} not called: {log:?}");
        }
        // The kernel runs unless the fault skips it.
        assert_eq!(
            log.contains(&"cuLaunchKernel"),
            fault != Fault::SkipProcess,
            "{log:?}"
        );
        assert!(!log.contains(&"cuLaunchHostFunc"), "{log:?}");
        assert!(sim.ledger().is_clean(), "CUDA ledger: {}", sim.ledger());
        assert!(sim.nvsci_ledger().is_clean(), "{}", sim.nvsci_ledger());
        assert!(sim.diagnostics().is_empty(), "{:#?}", sim.diagnostics());
        done
    }

    #[test]
    fn the_kernel_path_runs_on_the_simulator_and_verifies_every_frame() {
        let done = kernel_run(3, 10, Fault::None);
        let frames: Vec<u64> = done.iter().map(|c| c.frame).collect();
        assert_eq!(frames, (0..10).collect::<Vec<_>>());
        assert!(done.iter().all(|c| c.mismatches == 0), "{done:?}");
        assert!(done.iter().all(|c| c.slot == (c.frame % 3) as usize));
    }

    #[test]
    fn the_kernel_path_counts_a_corrupted_byte_in_every_frame() {
        // One byte damaged after the camera wrote each frame: the kernel's
        // counter (read from mapped pinned memory) reports it, per frame,
        // and sets back to zero for the slot's next frame.
        let done = kernel_run(2, 6, Fault::Corrupt);
        assert_eq!(done.len(), 6);
        assert!(done.iter().all(|c| c.mismatches == 1), "{done:?}");
        // Skipping the kernel: nothing counted, and the frame not inverted
        // (the producer's read-back check would catch it).
        let done = kernel_run(1, 2, Fault::SkipProcess);
        assert!(done.iter().all(|c| c.mismatches == 0), "{done:?}");
    }

    #[test]
    fn the_kernel_path_without_its_twins_is_refused_in_one_line() {
        // The simulator's NVRTC compiles only kernels it can run.
        let sim = Sim::with_config(SimConfig::tegra()).unwrap();
        let e = NvSciTransport::open(&sim.backend(), "nvsci-sim", Processing::CudaKernel, G, 2)
            .err()
            .unwrap();
        assert!(e.driver_error().is_some(), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("NVRTC compiling the consumer kernel"),
            "{text}"
        );
        assert!(!text.contains('\n'), "{text}");
        assert!(
            !sim.call_log().contains(&"cuLaunchKernel"),
            "{:?}",
            sim.call_log()
        );
        assert!(sim.ledger().is_clean(), "{}", sim.ledger());
        assert!(sim.nvsci_ledger().is_clean(), "{}", sim.nvsci_ledger());
        for source in [FenceSource::Built, FenceSource::Received] {
            assert!(Processing::CudaKernel
                .describe_with(source)
                .contains("never been run on a Jetson"));
        }
    }

    #[test]
    fn the_producer_flushes_cpu_caches_around_each_frame() {
        let sim = Sim::with_config(SimConfig::tegra()).unwrap();
        let flushes = || {
            sim.call_log()
                .iter()
                .filter(|c| **c == "NvSciBufObjFlushCpuCacheRange")
                .count()
        };
        let mut t = open_on(
            &sim,
            Processing::HostFnOverSimulatedDeviceMemory,
            1,
            Fault::None,
        )
        .unwrap();
        let mut ring = Ring::new(1).unwrap();
        assert_eq!(flushes(), 0);
        let ticket = ring.acquire().unwrap();
        let mut m = t.take_slot(&ticket).unwrap();
        TestPattern::new(0, G.stride).fill(m.bytes_mut().unwrap());
        assert_eq!(flushes(), 1, "after the free fence, before the CPU reads");
        t.signal_ready(&ticket, m).unwrap();
        assert_eq!(flushes(), 2, "after the CPU wrote, before the ready signal");
        t.queue_consumer(&ticket).unwrap();
        assert_eq!(t.wait_complete().unwrap().mismatches, 0);
        drop(t);
        // A failing flush stops the frame with the call's name.
        let sim = Sim::with_config(SimConfig::tegra()).unwrap();
        sim.fail_symbol("NvSciBufObjFlushCpuCacheRange", 1, 0x100);
        let mut t = open_on(
            &sim,
            Processing::HostFnOverSimulatedDeviceMemory,
            1,
            Fault::None,
        )
        .unwrap();
        let e = write(&mut t, &mut Ring::new(1).unwrap()).unwrap_err();
        assert!(
            e.to_string().contains("NvSciBufObjFlushCpuCacheRange"),
            "{e}"
        );
        drop(t);
        assert!(sim.ledger().is_clean(), "{}", sim.ledger());
    }

    #[test]
    fn set_up_failures_are_one_line_errors() {
        // Without NvSci (a discrete GPU), the module cannot open.
        let sim = Sim::new().unwrap();
        let e = open_on(
            &sim,
            Processing::HostFnOverSimulatedDeviceMemory,
            2,
            Fault::None,
        )
        .err()
        .unwrap();
        assert!(e.driver_error().is_some(), "{e:?}");
        let e = e.to_string();
        assert!(e.starts_with("NvSciBufModuleOpen"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
