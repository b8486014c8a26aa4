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
//! - on the simulator ([`Processing::HostFnOverSimulatedDeviceMemory`]) it
//!   is a stream-ordered host function (`cuLaunchHostFunc`) over the mapped
//!   device pointer, which the simulator backs with host memory;
//! - on the real driver, i.e. a Jetson ([`Processing::CudaKernel`]), it is
//!   the NVRTC kernel of [`crate::consumer`] (the one the discrete-GPU
//!   transport runs), launched on the same stream over the mapped device
//!   pointer: it counts the bytes that differ from the test pattern into
//!   the slot's device counter and inverts the frame in place; the counter
//!   is copied into pinned host memory, and a host function queued after
//!   the copy reports the frame finished (it makes no CUDA call, it only
//!   reads that copy). CUDA events around the kernel give its time.
//!
//! The kernel path compiles and its set-up refuses cleanly where it cannot
//! run (tested on the simulator), but it has never run on a Jetson: nothing
//! here has one. The simulator path runs in CI.
//!
//! CPU caches: the producer calls `NvSciBufObjFlushCpuCacheRange` over the
//! frame after writing it (before signalling *ready*) and again after the
//! *free* fence, before it reads the consumer's output. NvSciBuf documents
//! the flush as doing nothing unless the reconciled buffer needs software
//! cache coherency (`CpuNeedSwCacheCoherency`); the simulator's memory is
//! coherent. Whether, where it is needed, the flush also drops stale lines
//! before the CPU reads what the GPU wrote is not verified here; a stale
//! read would show as failed read-back verification, not as success.

use std::fmt::Display;
use std::ptr::NonNull;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tegra_interop::core::nvsci::GpuId;
use tegra_interop::core::DeterministicCounter;
use tegra_interop::driver::nvsci::{
    BufAttrs, BufModule, BufObj, BufPerm, BufType, CpuWaitContext, Fence, FenceSource, NvSciMemory,
    NvSciSemaphore, Signaler, SyncAttrs, SyncModule, SyncObj, SyncPerm, Timeout, Waiter,
};
use tegra_interop::driver::{Backend, Context, MappedBuffer, Stream};

use cudarc::driver::{sys as cu_sys, CudaEvent, CudaStream};

use crate::consumer::{self, CheckArgs, Counters, DeviceFrame, FrameMemory, Kernel};
use crate::ring::{Peek, Ticket};
use crate::transport::host::Fault;
use crate::transport::{
    process_frame, try_recv_completion, wait_completion, Completion, FrameGeometry, FrameTransport,
    PeekedFrame, TransportError,
};

/// How long a CPU wait or a completion may take before the run is declared
/// stuck (a healthy frame takes microseconds to milliseconds).
const STUCK: Duration = Duration::from_secs(10);

/// How the consumer processes a frame between its wait and its signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Processing {
    /// Simulator only: a host function queued on the consumer's CUDA stream
    /// (`cuLaunchHostFunc`) runs [`process_frame`] over the mapped device
    /// pointer. Sound only where device pointers are host addresses, which
    /// is true of the simulator and of no real GPU.
    HostFnOverSimulatedDeviceMemory,
    /// Real driver only (a Jetson): the NVRTC kernel of [`crate::consumer`]
    /// on the consumer's CUDA stream, over the mapped device pointer. Needs
    /// a context that came from cudarc (`Context::new` on
    /// `Backend::real()`) and NVRTC; built, never run on a Jetson.
    CudaKernel,
}

impl Processing {
    /// One line for the summary: the processing and how fences travel.
    pub fn describe_with(self, source: FenceSource) -> &'static str {
        use FenceSource::{Built, Received};
        match (self, source) {
            (Processing::HostFnOverSimulatedDeviceMemory, Built) => {
                "sim: processing runs as a stream-ordered host function over simulated device memory; deterministic fences built by each waiter (NvSciSyncFenceUpdateFence)"
            }
            (Processing::HostFnOverSimulatedDeviceMemory, Received) => {
                "sim: processing runs as a stream-ordered host function over simulated device memory; fences received from the signaller (this NvSciSync has no FenceUpdateFence)"
            }
            (Processing::CudaKernel, Built) => {
                "jetson: an NVRTC kernel on the consumer's CUDA stream checks and inverts each frame in place in its NvSciBuf buffer (this path is built but has never been run on a Jetson); deterministic fences built by each waiter (NvSciSyncFenceUpdateFence)"
            }
            (Processing::CudaKernel, Received) => {
                "jetson: an NVRTC kernel on the consumer's CUDA stream checks and inverts each frame in place in its NvSciBuf buffer (this path is built but has never been run on a Jetson); fences received from the signaller (this NvSciSync has no FenceUpdateFence)"
            }
        }
    }
}

fn err<E: Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
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
    buf: BufObj,
    ready: SyncObj,
    free: SyncObj,
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
    ) -> Result<Objects, String> {
        let bufs = BufModule::open(backend).map_err(err("NvSciBufModuleOpen"))?;
        let syncs = SyncModule::open(backend).map_err(err("NvSciSyncModuleOpen"))?;
        let device = backend.device(ctx.ordinal()).map_err(err("CUDA device"))?;
        let gpu = GpuId(device.uuid().map_err(err("CUDA device UUID"))?);
        let size = u64::try_from(frame_len).map_err(err("frame size"))?;
        let source = syncs.fence_source();
        let built = source == FenceSource::Built;

        let v = "buffer attributes";
        let raw = || -> Result<BufAttrs, String> {
            let mut a = BufAttrs::new();
            a.types(&[BufType::RawBuffer])
                .and_then(|a| a.raw_size(size))
                .and_then(|a| a.required_perm(BufPerm::ReadWrite))
                .map_err(err(v))?;
            Ok(a)
        };
        // The camera writes through the CPU mapping.
        let mut producer = raw()?;
        producer
            .need_cpu_access(true)
            .and_then(|a| a.raw_align(4096))
            .map_err(err(v))?;
        // CUDA reads and writes it in place on its GPU.
        let mut consumer = raw()?;
        consumer.gpus(&[gpu]).map_err(err(v))?;
        let p = bufs
            .attr_list(&producer)
            .map_err(err("NvSciBuf attribute list"))?;
        let c = bufs
            .attr_list(&consumer)
            .map_err(err("NvSciBuf attribute list"))?;
        let buf_list = bufs
            .reconcile(&[&p, &c])
            .map_err(err("NvSciBuf reconciliation"))?;

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
        .map_err(err("sync attributes"))?;
        // ready: the CPU signals, CUDA waits.
        let ready_signal = syncs
            .attr_list(&cpu_signal)
            .map_err(err("NvSciSync attribute list"))?;
        let ready_wait = syncs
            .cuda_waiter_attrs(ctx)
            .map_err(err("cuDeviceGetNvSciSyncAttributes (wait)"))?;
        let ready_list = syncs
            .reconcile(&[&ready_signal, &ready_wait])
            .map_err(err("NvSciSync reconciliation (ready)"))?;
        // free: CUDA signals, the CPU waits.
        let mut free_signal = syncs
            .cuda_signaler_attrs(ctx)
            .map_err(err("cuDeviceGetNvSciSyncAttributes (signal)"))?;
        free_signal
            .set(&deterministic)
            .map_err(err("NvSciSync attribute list"))?;
        let free_wait = syncs
            .attr_list(&cpu_wait)
            .map_err(err("NvSciSync attribute list"))?;
        let free_list = syncs
            .reconcile(&[&free_signal, &free_wait])
            .map_err(err("NvSciSync reconciliation (free)"))?;

        let mut out = Vec::with_capacity(slots);
        for _ in 0..slots {
            let buf = buf_list.alloc().map_err(err("NvSciBufObjAlloc"))?;
            let have = buf.size().map_err(err("NvSciBuf size"))?;
            if have < size {
                return Err(format!(
                    "NvSciBuf object has {have} bytes, a frame needs {size}"
                ));
            }
            out.push(SlotObjects {
                buf,
                ready: ready_list
                    .alloc()
                    .map_err(err("NvSciSyncObjAlloc (ready)"))?,
                free: free_list.alloc().map_err(err("NvSciSyncObjAlloc (free)"))?,
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
    pub fn import_memories(&self, ctx: &Context) -> Result<Vec<NvSciMemory>, String> {
        self.slots
            .iter()
            .map(|s| {
                s.buf
                    .import_cuda(ctx)
                    .map_err(err("CUDA import of an NvSciBuf object"))
            })
            .collect()
    }
}

/// The consumer's CUDA state for [`Processing::CudaKernel`].
struct KernelPath {
    kernel: Kernel,
    counters: Counters,
    /// Per slot: recorded just before and just after the kernel.
    events: Vec<(CudaEvent, CudaEvent)>,
    /// The consumer's stream (also wrapped in the transport's `Stream`).
    cstream: Arc<CudaStream>,
    grid: u32,
}

impl KernelPath {
    /// Compiles the kernel into `ctx` (which must come from cudarc) and
    /// allocates the per-slot counters and events on a new stream.
    fn new(ctx: &Context, geometry: FrameGeometry, slots: usize) -> Result<KernelPath, String> {
        let cu = ctx.cudarc().cloned().ok_or(
            "the kernel path needs a CUDA context of the real driver made through cudarc (cudarc could not load libcuda, or this is the simulator, which processes frames with a host function)",
        )?;
        consumer::self_check_pattern(geometry.stride, geometry.rows).map_err(|e| e.0)?;
        let kernel = Kernel::compile(&cu).map_err(|e| e.0)?;
        let cstream = cu.new_stream().map_err(err("CUDA stream"))?;
        let counters = Counters::new(&cu, slots).map_err(|e| e.0)?;
        let event = || {
            cu.new_event(Some(cu_sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(err("CUDA event"))
        };
        let events = (0..slots)
            .map(|_| Ok((event()?, event()?)))
            .collect::<Result<Vec<_>, String>>()?;
        // The counters' allocation is stream-ordered: let it land first.
        cstream
            .synchronize()
            .map_err(err("synchronising the CUDA stream"))?;
        Ok(KernelPath {
            kernel,
            counters,
            events,
            cstream,
            grid: consumer::grid_for(geometry.frame_len()),
        })
    }
}

/// The NvSci transport (see the module docs): a value that owns its CUDA
/// context, its NvSci objects and their imports ([`NvSciTransport::open`]).
pub struct NvSciTransport {
    name: &'static str,
    note: &'static str,
    geometry: FrameGeometry,
    processing: Processing,
    fault: Fault,
    /// The producer's CPU address of each slot's buffer.
    cpu: Vec<NonNull<u8>>,
    /// Counts of the ready objects' CPU signals (values only; built fences).
    ready_counters: Vec<Option<DeterministicCounter>>,
    /// Received fences: per slot, the ready fence the producer handed over.
    ready_fences: Vec<Option<Fence>>,
    /// Received fences: per slot, the free fence the consumer handed back.
    free_fences: Vec<Option<Fence>>,
    /// Per slot: how many ready signals the CPU made (the fence's count, so
    /// a consumer is never queued to wait for a signal not yet made).
    ready_signalled: Vec<u64>,
    cpu_wait: CpuWaitContext,
    // Consumer side: dropped after the stream has drained (see Drop).
    mappings: Vec<MappedBuffer>,
    waiters: Vec<NvSciSemaphore<Waiter>>,
    signalers: Vec<NvSciSemaphore<Signaler>>,
    stream: Stream,
    /// [`Processing::CudaKernel`] only.
    kernel: Option<KernelPath>,
    done_tx: Sender<Completion>,
    done_rx: Receiver<Completion>,
    /// Completions queued and not yet collected (so a wait with none
    /// queued fails at once instead of timing out).
    in_flight: usize,
    // Dropped last: the imports (the mappings hold theirs too), the NvSci
    // objects, the consumer's context.
    _memories: Vec<NvSciMemory>,
    objects: Objects,
    _ctx: Context,
}

impl NvSciTransport {
    /// Opens the transport on `backend`: one CUDA context (the consumer) on
    /// device 0, the ring's NvSci objects for `slots` slots, their CUDA
    /// imports, the consumer's stream. `name` is printed as the backend.
    pub fn open(
        backend: &Arc<Backend>,
        name: &'static str,
        processing: Processing,
        geometry: FrameGeometry,
        slots: usize,
        fault: Fault,
    ) -> Result<Self, String> {
        let ctx = Context::new(Arc::clone(backend), 0).map_err(err("CUDA context"))?;
        Self::new(&ctx, name, processing, geometry, slots, fault)
    }

    /// Opens the transport with `ctx` as the consumer's context (the
    /// transport keeps a clone of it; so may the caller, for its own work).
    pub fn new(
        ctx: &Context,
        name: &'static str,
        processing: Processing,
        geometry: FrameGeometry,
        slots: usize,
        fault: Fault,
    ) -> Result<Self, String> {
        let backend = ctx.backend();
        let objects = Objects::allocate(backend, ctx, geometry.frame_len(), slots)?;
        let memories = objects.import_memories(ctx)?;
        let (stream, kernel) = match processing {
            Processing::HostFnOverSimulatedDeviceMemory => {
                (Stream::new(ctx).map_err(err("CUDA stream"))?, None)
            }
            Processing::CudaKernel => {
                if fault != Fault::None {
                    return Err(format!(
                        "fault injection ({fault:?}) is implemented by the simulator's host-function processing only, not by the CUDA kernel"
                    ));
                }
                let path = KernelPath::new(ctx, geometry, slots)?;
                let stream = Stream::from_cudarc(ctx, Arc::clone(&path.cstream))
                    .map_err(err("CUDA stream"))?;
                (stream, Some(path))
            }
        };
        let frame_len = geometry.frame_len() as u64;
        let mut cpu = Vec::with_capacity(slots);
        let mut ready_counters = Vec::with_capacity(slots);
        let mut mappings = Vec::with_capacity(slots);
        let mut waiters = Vec::with_capacity(slots);
        let mut signalers = Vec::with_capacity(slots);
        for (s, mem) in objects.slots.iter().zip(&memories) {
            cpu.push(s.buf.cpu_ptr().map_err(err("NvSciBufObjGetCpuPtr"))?);
            if mem.size() < frame_len {
                return Err(format!(
                    "CUDA import has {} bytes, a frame needs {frame_len}",
                    mem.size()
                ));
            }
            mappings.push(
                mem.map_whole()
                    .map_err(err("CUDA mapping of a frame buffer"))?,
            );
            waiters.push(
                s.ready
                    .import_cuda_waiter(ctx)
                    .map_err(err("CUDA import of the ready object"))?,
            );
            // The free signaller keeps (and learns) its own counter; the
            // ready counter is learned from the first generated fence.
            signalers.push(
                s.free
                    .import_cuda_signaler(ctx)
                    .map_err(err("CUDA import of the free object"))?,
            );
            ready_counters.push(None);
        }
        let cpu_wait = CpuWaitContext::new(&objects.syncs).map_err(err("CPU wait context"))?;
        let (done_tx, done_rx) = mpsc::channel();
        Ok(NvSciTransport {
            name,
            note: processing.describe_with(objects.fence_source()),
            geometry,
            processing,
            fault,
            cpu,
            ready_counters,
            ready_fences: (0..slots).map(|_| None).collect(),
            free_fences: (0..slots).map(|_| None).collect(),
            ready_signalled: vec![0; slots],
            cpu_wait,
            mappings,
            waiters,
            signalers,
            stream,
            kernel,
            done_tx,
            done_rx,
            in_flight: 0,
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

    /// `NvSciBufObjFlushCpuCacheRange` over the slot's frame.
    fn flush_cpu_cache(&self, slot: usize) -> Result<(), TransportError> {
        self.objects.slots[slot]
            .buf
            .flush_cpu_cache_range(0, self.geometry.frame_len() as u64)
            .map_err(|e| TransportError::new(format!("CPU cache flush of slot {slot}: {e}")))
    }

    /// The ready object's fence value of the ticket's ready signal.
    fn ready_value(&self, t: &Ticket) -> Result<u64, TransportError> {
        self.ready_counters
            .get(t.slot())
            .and_then(Option::as_ref)
            .map(|c| c.value_of_signal(t.ready()))
            .ok_or_else(|| TransportError::new("no ready counter: fences are received"))
    }

    fn built(&self) -> bool {
        self.objects.source == FenceSource::Built
    }

    /// Queues the processing of `frame` on the stream.
    fn queue_processing(&self, slot: usize, frame: u64) -> Result<(), TransportError> {
        let tx = self.done_tx.clone();
        match self.processing {
            Processing::HostFnOverSimulatedDeviceMemory => {
                let ptr = self.mappings[slot].device_ptr() as usize;
                let len = self.geometry.frame_len();
                let stride = self.geometry.stride;
                let fault = self.fault;
                self.stream
                    .launch_host_fn(move || {
                        // SAFETY: (1) with this processing the transport
                        // runs on the simulator, whose device pointers are
                        // host addresses of the mapping's memory; the
                        // mapping is `len` bytes or more (checked at set-up)
                        // and outlives this function, because the
                        // transport drains the stream before it unmaps (or
                        // leaks the mappings if it cannot). (2) Nothing else
                        // touches the bytes meanwhile: the producer writes
                        // them only after the slot's free fence, which this
                        // stream signals after this function returns, and
                        // this function runs only after the ready fence.
                        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) };
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
                        // The receiver is gone only when the transport is
                        // being dropped; then nobody needs the result.
                        let _ = tx.send(Completion {
                            slot,
                            frame,
                            mismatches,
                            process,
                            busy: process,
                            finished: Instant::now(),
                        });
                    })
                    .map_err(|e| TransportError::new(format!("cuLaunchHostFunc: {e}")))
            }
            Processing::CudaKernel => self.queue_kernel(slot, frame, tx),
        }
    }

    /// [`Processing::CudaKernel`]: queues the kernel over the slot's
    /// mapping, the read-back of its mismatch counter and a host function
    /// that reports the frame finished. Built; never run on a Jetson.
    fn queue_kernel(
        &self,
        slot: usize,
        frame: u64,
        tx: Sender<Completion>,
    ) -> Result<(), TransportError> {
        let Some(k) = &self.kernel else {
            return Err(TransportError::new(
                "the CUDA kernel path was not set up for this transport",
            ));
        };
        let fail =
            |what: &'static str| move |e: &dyn Display| TransportError::new(format!("{what}: {e}"));
        // The raw launches below use the current context.
        self.stream
            .context()
            .bind()
            .map_err(|e| fail("binding the CUDA context")(&e))?;
        let (before, after) = &k.events[slot];
        before
            .record(&k.cstream)
            .map_err(|e| fail("recording a CUDA event")(&e))?;
        let counter = k.counters.device_ptr(slot)?;
        let bytes = DeviceFrame {
            ptr: self.mappings[slot].device_ptr(),
            len: self.geometry.frame_len(),
            stride: self.geometry.stride,
        };
        // SAFETY: the mapping is at least `len` bytes (checked at set-up)
        // and stays mapped until the stream has drained (see Drop); on this
        // stream the kernel runs after the wait for the slot's ready fence,
        // and the producer writes the slot again only after the free fence
        // that this stream signals after the kernel, so nothing else
        // touches the bytes meanwhile; the counter is as above.
        unsafe {
            k.kernel.check_and_invert_at(
                FrameMemory::System,
                k.grid,
                &k.cstream,
                &CheckArgs::new(bytes, frame, counter),
            )
        }?;
        after
            .record(&k.cstream)
            .map_err(|e| fail("recording a CUDA event")(&e))?;
        // SAFETY: the frame's kernel was queued above on this stream; the
        // counters live until the transport has drained it (or are leaked
        // with it), and the slot's next kernel is queued only after this
        // frame was collected.
        unsafe {
            k.counters
                .send_completion_after(&self.stream, slot, frame, tx)
        }
    }

    /// Accounts for a completion received from the stream; on the kernel
    /// path, fills in the kernel's time from the slot's events.
    fn collected(&mut self, mut c: Completion) -> Result<Completion, TransportError> {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(k) = &self.kernel {
            let (before, after) = &k.events[c.slot];
            let ms = before
                .elapsed_ms(after)
                .map_err(|e| TransportError::new(format!("reading CUDA event times: {e}")))?;
            c.process = Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3);
            // Only the kernel is timed on this path.
            c.busy = c.process;
        }
        Ok(c)
    }

    /// Waits (on the CPU) until `slot`'s *free* fence reached signal `k`
    /// (nothing for 0) and makes the consumer's writes visible to the CPU.
    /// Waiting again for a value already reached returns at once.
    fn wait_slot(&mut self, slot: usize, k: u64) -> Result<(), TransportError> {
        if slot >= self.cpu.len() {
            return Err(TransportError::new(format!("no slot {slot}")));
        }
        if k > 0 {
            let reached = if self.built() {
                let Some(counter) = self.signalers[slot].counter() else {
                    return Err(TransportError::new("free semaphore lost its counter"));
                };
                self.objects.slots[slot]
                    .free
                    .fence_for_value(counter.value_of_signal(k))
                    .map_err(|e| TransportError::new(format!("free fence: {e}")))?
                    .wait(&mut self.cpu_wait, Timeout::After(STUCK))
            } else {
                // The fence of free signal k, handed back at queue_consumer;
                // kept until the slot's next queue_consumer replaces it, so a
                // peek and the slot's next ticket both wait on it.
                self.free_fences[slot]
                    .as_ref()
                    .ok_or_else(|| {
                        TransportError::new(format!(
                            "slot {slot}: the consumer handed back no free fence for signal {k}"
                        ))
                    })?
                    .wait(&mut self.cpu_wait, Timeout::After(STUCK))
            }
            .map_err(|e| TransportError::new(format!("CPU wait on free fence: {e}")))?;
            if !reached {
                return Err(TransportError::new(format!(
                    "slot {slot}: free signal {k} not reached within {STUCK:?}"
                )));
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
    fn backend(&self) -> &'static str {
        self.name
    }

    fn slot_count(&self) -> usize {
        self.cpu.len()
    }

    fn geometry(&self) -> FrameGeometry {
        self.geometry
    }

    fn wait_free(&mut self, t: &Ticket) -> Result<&mut [u8], TransportError> {
        let slot = t.slot();
        self.wait_slot(slot, t.free_wait())?;
        // SAFETY: the buffer is at least `frame_len` bytes (checked at
        // set-up) and lives as long as `self.objects`. The consumer is done
        // with it: its free fence for the slot's previous frame was reached
        // above (or the slot was never used). The slice borrows `self`
        // mutably, so it ends before the next transport call.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(self.cpu[slot].as_ptr(), self.geometry.frame_len())
        })
    }

    fn lend(&mut self, p: &Peek) -> Result<Option<PeekedFrame>, TransportError> {
        let slot = p.slot();
        if slot >= self.cpu.len() {
            return Err(TransportError::new(format!("no slot {slot}")));
        }
        self.wait_slot(slot, p.free_reached())?;
        // SAFETY: the slot's buffer is at least `frame_len` bytes (checked at
        // set-up) and stays mapped at this address as long as
        // `self.objects`; the consumer is done with it (its free fence for
        // the frame reached above), and nothing writes it before the slot's
        // next ticket: the producer after `wait_free` for that ticket, the
        // consumer after that ticket's ready signal.
        Ok(Some(unsafe {
            PeekedFrame::new(self.cpu[slot], self.geometry.frame_len())
        }))
    }

    fn signal_ready(&mut self, t: &Ticket) -> Result<(), TransportError> {
        let slot = t.slot();
        if slot >= self.cpu.len() {
            return Err(TransportError::new(format!("no slot {slot}")));
        }
        // The camera's writes reach memory before the consumer may read them
        // (see the module docs on CPU caches).
        self.flush_cpu_cache(slot)?;
        let ready = &self.objects.slots[slot].ready;
        // The fence of the CPU signal about to be made, from the library.
        let fence = ready
            .generate_fence()
            .map_err(|e| TransportError::new(format!("ready fence: {e}")))?;
        if self.built() && self.ready_counters[slot].is_none() {
            // The first ready signal teaches the counter its initial value.
            let learned = ready
                .counter_from_fence(t.ready(), &fence)
                .map_err(|e| TransportError::new(format!("ready fence counter: {e}")))?;
            self.ready_counters[slot] = Some(learned);
        }
        if self.built() {
            // It must be the value the consumer computes on its own.
            let want = self.ready_value(t)?;
            let got = fence
                .extract()
                .map_err(|e| TransportError::new(format!("ready fence: {e}")))?
                .map(|f| f.value);
            if got != Some(want) {
                return Err(TransportError::new(format!(
                    "slot {slot}: the ready signal of frame {} has fence value {got:?}, the deterministic counter says {want}",
                    t.frame()
                )));
            }
        }
        ready
            .cpu_signal()
            .map_err(|e| TransportError::new(format!("CPU signal: {e}")))?;
        self.ready_signalled[slot] = t.ready();
        if !self.built() {
            // Handed to the consumer (the standard NvSci flow).
            self.ready_fences[slot] = Some(fence);
        }
        Ok(())
    }

    fn queue_consumer(&mut self, t: &Ticket) -> Result<(), TransportError> {
        let (slot, frame) = (t.slot(), t.frame());
        if slot >= self.cpu.len() {
            return Err(TransportError::new(format!("no slot {slot}")));
        }
        // Queueing a wait for a signal that may never come would stall the
        // stream (and everything after it) for good: refused.
        if self.ready_signalled[slot] < t.ready() {
            return Err(TransportError::new(format!(
                "consumer of frame {frame} in slot {slot} queued before its ready signal"
            )));
        }
        // Built: the consumer builds the fence it waits for from the
        // counter, on its own handle of the object: nothing is passed from
        // the producer. Received: the producer's fence of this frame.
        let waiter = &self.waiters[slot];
        let ready = if self.built() {
            waiter
                .object()
                .fence_for_value(self.ready_value(t)?)
                .map_err(|e| TransportError::new(format!("ready fence: {e}")))?
        } else {
            self.ready_fences[slot].take().ok_or_else(|| {
                TransportError::new(format!(
                    "slot {slot}: the producer handed over no ready fence for frame {frame}"
                ))
            })?
        };
        waiter
            .wait(&self.stream, &ready)
            .map_err(|e| TransportError::new(format!("CUDA wait on ready fence: {e}")))?;
        self.queue_processing(slot, frame)?;
        // From here on the frame's completion will arrive.
        self.in_flight += 1;
        let free = self.signalers[slot]
            .signal(&self.stream)
            .map_err(|e| TransportError::new(format!("CUDA signal of free fence: {e}")))?;
        let produced = self.signalers[slot].counter().map(|c| c.current_value());
        if !self.built() {
            // Handed back to the producer, which waits on it before reusing
            // the slot.
            self.free_fences[slot] = Some(free);
            return Ok(());
        }
        let filled = free
            .extract()
            .map_err(|e| TransportError::new(format!("free fence: {e}")))?
            .map(|f| f.value);
        if produced.is_none() || filled != produced {
            return Err(TransportError::new(format!(
                "slot {slot}: the driver's free fence for frame {frame} is {filled:?}, the deterministic counter says {produced:?}"
            )));
        }
        Ok(())
    }

    fn try_complete(&mut self) -> Result<Option<Completion>, TransportError> {
        match try_recv_completion(&self.done_rx)? {
            Some(c) => self.collected(c).map(Some),
            None => Ok(None),
        }
    }

    fn wait_complete(&mut self) -> Result<Completion, TransportError> {
        let c = wait_completion(&self.done_rx, self.in_flight, STUCK)?;
        self.collected(c)
    }
}

impl Drop for NvSciTransport {
    fn drop(&mut self) {
        // Every queued wait has had its signal (`queue_consumer` refuses
        // one before it), so the stream drains. If it cannot be drained, host functions may
        // still touch the mappings: leak them rather than unmap under them.
        // The same holds for the kernel path's counters, events and module.
        if self.stream.synchronize().is_err() {
            std::mem::forget(std::mem::take(&mut self.mappings));
            std::mem::forget(self.kernel.take());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::TestPattern;
    use crate::ring::Ring;
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
    ) -> Result<NvSciTransport, String> {
        NvSciTransport::open(&sim.backend(), "nvsci-sim", processing, G, slots, fault)
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

    /// Wait, write the pattern, signal ready (the ring's first two moves).
    fn write(t: &mut NvSciTransport, ring: &mut Ring) -> Result<Ticket, TransportError> {
        let ticket = ring.acquire().map_err(TransportError)?;
        TestPattern::new(ticket.frame(), G.stride).fill(t.wait_free(&ticket)?);
        t.signal_ready(&ticket)?;
        ring.release(&ticket, Instant::now(), 0)
            .map_err(TransportError)?;
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
            assert_eq!(t.backend(), "nvsci-sim");
            let mut last = None;
            for frame in 0..9u64 {
                ring.make_room(t, |c, _| {
                    assert_eq!(c.mismatches, 0);
                    Ok(())
                })
                .unwrap();
                let ticket = ring.acquire().unwrap();
                let buf = t.wait_free(&ticket).unwrap();
                if frame >= 2 {
                    // The consumer's in-place result of the slot's previous
                    // frame, seen through the producer's CPU pointer.
                    let prev = TestPattern::new(frame - 2, G.stride);
                    assert_eq!(prev.first_mismatch(buf, 0xff), None, "frame {frame}");
                }
                TestPattern::new(frame, G.stride).fill(buf);
                t.signal_ready(&ticket).unwrap();
                ring.release(&ticket, Instant::now(), 0).unwrap();
                t.queue_consumer(&ticket).unwrap();
                ring.submit(&ticket).unwrap();
            }
            ring.drain(t, |c, _| {
                assert_eq!(c.mismatches, 0);
                last = Some(c.frame);
                Ok(())
            })
            .unwrap();
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
    fn a_consumer_queued_before_the_ready_signal_is_refused_not_queued() {
        with(1, Fault::None, |t, ring| {
            let ticket = ring.acquire().unwrap();
            TestPattern::new(0, G.stride).fill(t.wait_free(&ticket).unwrap());
            // Out of order: queued before the ready signal is refused.
            let e = t.queue_consumer(&ticket).unwrap_err();
            assert!(e.0.contains("before its ready signal"), "{e}");
            t.signal_ready(&ticket).unwrap();
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
            let buf = t.wait_free(&next).unwrap();
            assert_eq!(
                TestPattern::new(0, G.stride).first_mismatch(buf, 0xff),
                Some(0)
            );
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
        assert!(e.0.contains("cuLaunchHostFunc"), "{e}");
        drop(t);
        assert!(sim.ledger().is_clean(), "{}", sim.ledger());
        assert!(sim.nvsci_ledger().is_clean(), "{}", sim.nvsci_ledger());
    }

    #[test]
    fn the_kernel_path_refuses_the_simulator_and_leaves_nothing_behind() {
        // The kernel path needs a cudarc context of the real driver; on the
        // simulator it must refuse at set-up, in one line, not launch
        // anything. (Its per-frame path has never run: no Jetson here.)
        for fault in [Fault::None, Fault::Corrupt] {
            let sim = Sim::with_config(SimConfig::tegra()).unwrap();
            let e = NvSciTransport::open(
                &sim.backend(),
                "nvsci-jetson",
                Processing::CudaKernel,
                G,
                2,
                fault,
            )
            .err()
            .unwrap();
            let want = match fault {
                Fault::None => "needs a CUDA context of the real driver made through cudarc",
                _ => "fault injection (Corrupt) is implemented by the simulator's host-function processing only",
            };
            assert!(e.contains(want), "{e}");
            assert!(!e.contains('\n'), "{e}");
            assert!(
                !sim.call_log().contains(&"cuLaunchHostFunc"),
                "{:?}",
                sim.call_log()
            );
            assert!(sim.ledger().is_clean(), "{}", sim.ledger());
            assert!(sim.nvsci_ledger().is_clean(), "{}", sim.nvsci_ledger());
        }
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
        TestPattern::new(0, G.stride).fill(t.wait_free(&ticket).unwrap());
        assert_eq!(flushes(), 1, "after the free fence, before the CPU reads");
        t.signal_ready(&ticket).unwrap();
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
        assert!(e.0.contains("NvSciBufObjFlushCpuCacheRange"), "{e}");
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
        assert!(e.starts_with("NvSciBufModuleOpen"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
