//! The CUDA process: drives the ring's state machine ([`Slots`]) over a
//! transport, [`RemoteCamera`], whose producer side is in the camera
//! process. The producer calls become messages: [`FrameTransport::take_slot`]
//! hands the ticket to the camera and waits (at most the peer timeout)
//! until it wrote the frame (the slot's memory it returns has no bytes
//! here: the frame is written in the camera process);
//! [`FrameTransport::signal_ready`] takes the ready fence (received, or
//! built from the deterministic counter); the consumer side is local: a
//! wait for *ready* on the consumer's CUDA stream, the user's work
//! ([`FrameWork`](crate::consumer::FrameWork), chosen as the one-process
//! NvSci mode chooses it: the check-and-invert kernel for the sensor
//! model's frames) launched on that stream over the NvSciBuf buffer mapped
//! into CUDA, the *free* signal, whose fence crosses back where the camera
//! cannot build it.
//!
//! The consumer is the one the in-process NvSci transport runs
//! (`transport::nvsci::nvsci_consumer`): one code path for the real driver and the
//! simulator, which one is the driver's backend. On a Jetson the kernel is
//! compiled by NVRTC and runs on the GPU (built for aarch64, never run on
//! one); on the simulator the same compile, load and launch reach the
//! kernel's registered Rust twin, which counts its launches for the report.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tegra_interop::core::nvsci::GpuId;
use tegra_interop::core::DeterministicCounter;
use tegra_interop::driver::nvsci::{
    BufAttrs, BufModule, BufObj, BufPerm, BufType, Fence, FenceSource, NvSciMemory, NvSciSemaphore,
    Signaler, SyncAttrs, SyncModule, SyncObj, SyncPerm, Timeout, Waiter,
};
use tegra_interop::driver::{BackendKind, Context as CudaContext, MappedBuffer};

use super::error::{Context, Peer, ProcessError};
use super::summary::{Summary, Timings};
use super::wire::{Figures, Link, Msg, TicketMsg};
use super::{Settings, Setup};
use crate::app::backend::nvsci_work;
use crate::app::cli::SourceChoice;
use crate::consumer::twin::{self, Launches};
use crate::consumer::Consumer;
use crate::slots::{Collected, SlotState, Slots, Ticket};
use crate::transport::host::Fault;
use crate::transport::nvsci::{nvsci_consumer, Processing};
use crate::transport::{
    Completion, FrameGeometry, FrameTransport, SlotMemory, TransportError, TransportInfo,
};

/// One slot's objects on the CUDA side (dropped in this order: the
/// semaphores before their objects; its mapping is the consumer's, dropped
/// before these).
struct Slot {
    _mem: NvSciMemory,
    _buf: BufObj,
    waiter: NvSciSemaphore<Waiter>,
    ready: SyncObj,
    signaler: NvSciSemaphore<Signaler>,
    _free: SyncObj,
    ready_counter: Option<DeterministicCounter>,
    /// The ready fence of the frame between `signal_ready` and
    /// `queue_consumer`.
    pending: Option<Fence>,
}

/// The ring's transport in the CUDA process: the producer is the camera
/// process across NvSciIpc, the consumer this process's [`Consumer`] (the
/// user's work on its CUDA stream).
pub struct RemoteCamera {
    // Field order is drop order: the consumer drains its streams (its own
    // drop; it leaks what they use if they cannot be drained) and drops
    // the mappings before the slots' semaphores and memory go.
    consumer: Consumer,
    slots: Vec<Slot>,
    link: Link,
    source: FenceSource,
    geometry: FrameGeometry,
    limit: Duration,
    /// When the last ticket was handed to the camera, and how long it
    /// said its write took: the ring's record of the frame.
    handed: Rc<Cell<(Instant, u64)>>,
    /// The typed error behind the last [`TransportError`] (the ring passes
    /// errors on as text).
    error: Option<ProcessError>,
    _syncs: SyncModule,
    _bufs: BufModule,
    _ctx: CudaContext,
}

/// Runs the CUDA side: set-up, every frame through the ring, the
/// camera's figures.
pub(super) fn run(settings: &Settings, s: &Setup) -> Result<Summary, ProcessError> {
    // On the simulator the kernel is its Rust twin, registered before the
    // consumer compiles it; on the real driver NVRTC compiles the kernel.
    let launches: Option<Launches> = s.sim.as_ref().map(twin::register_counted);
    let mut link = Link::open(s, &s.cuda_ep, Peer::Camera, settings.limit)?;
    let fault = link.offer(&settings.hello())?;
    let settings = &Settings {
        fault,
        ..settings.clone()
    };
    let mut cam = RemoteCamera::set_up(link, s, settings)?;
    let real = s.backend.kind() == BackendKind::Real;
    let note = Processing::CudaKernel.describe(cam.source, real);
    let mut ring = Slots::new(settings.ring).map_err(|e| ProcessError::Ring(e.to_string()))?;
    let mut t = Timings::new()?;
    let (mut mismatches, mut bad_frames) = (0u64, 0u64);
    let mut each = |c: &Completion, col: &Collected| {
        mismatches += c.mismatches;
        bad_frames += u64::from(c.mismatches != 0);
        let latency = c.finished.saturating_duration_since(col.rec.started);
        t.latency.push(latency.as_nanos() as u64);
        t.write.push(col.rec.write_ns);
        t.process.push(c.process.as_nanos() as u64);
        t.queued.push(col.queued.as_nanos() as u64);
    };
    let start = Instant::now();
    for _ in 0..settings.frames {
        one_frame(&mut ring, &mut cam, &mut each).map_err(|e| cam.take_error(e))?;
    }
    while ring.in_flight() > 0 {
        collect(&mut ring, &mut cam, true, &mut each).map_err(|e| cam.take_error(e))?;
    }
    let cuda_us = start.elapsed().as_micros() as u64;
    let source = cam.source;
    let camera = cam.finish()?;
    Ok(Summary {
        frames: settings.frames,
        mismatches,
        bad_frames,
        source,
        real,
        note,
        kernel_launches: launches.map(|l| l.get()),
        cuda_pid: std::process::id(),
        camera,
        cuda_us,
        latency: t.latency.summary(),
        write: t.write.summary(),
        process: t.process.summary(),
        queued: t.queued.summary(),
    })
}

/// Collects one finished frame (waiting for it when `block`); whether one
/// was collected.
fn collect(
    ring: &mut Slots,
    cam: &mut RemoteCamera,
    block: bool,
    each: &mut impl FnMut(&Completion, &Collected),
) -> Result<bool, String> {
    let c = match block {
        true => cam.wait_complete()?,
        false => match cam.try_complete()? {
            Some(c) => c,
            None => return Ok(false),
        },
    };
    each(&c, &ring.complete(&c)?);
    Ok(true)
}

/// One frame through the protocol: collect until its slot is free, hand
/// its ticket to the camera (which writes it), take the ready fence, queue
/// the consumer.
fn one_frame(
    ring: &mut Slots,
    cam: &mut RemoteCamera,
    each: &mut impl FnMut(&Completion, &Collected),
) -> Result<(), String> {
    while collect(ring, cam, false, each)? {}
    while matches!(ring.state(ring.next_slot()), Some(SlotState::InFlight(_))) {
        collect(ring, cam, true, each)?;
    }
    let ticket = ring.acquire()?;
    let memory = cam.take_slot(&ticket)?;
    cam.signal_ready(&ticket, memory)?;
    let (started, write_ns) = cam.handed.get();
    ring.release(&ticket, started, write_ns)?;
    cam.queue_consumer(&ticket)?;
    ring.submit(&ticket)?;
    Ok(())
}

fn buffer_attrs(len: usize, gpu: GpuId) -> Result<BufAttrs, ProcessError> {
    let mut mine = BufAttrs::new();
    mine.types(&[BufType::RawBuffer])
        .and_then(|a| a.raw_size(len as u64))
        .and_then(|a| a.gpus(&[gpu]))
        .and_then(|a| a.required_perm(BufPerm::ReadWrite))
        .ctx("buffer attributes")?;
    Ok(mine)
}

/// What the CUDA process opened before its consumer: the modules, the
/// context, the link, each slot's objects and mapping.
struct Parts {
    ctx: CudaContext,
    bufs: BufModule,
    syncs: SyncModule,
    link: Link,
    source: FenceSource,
    limit: Duration,
}

impl Parts {
    /// One slot's objects and the mapping of its buffer: our buffer and
    /// ready waiter lists go to the camera, which allocates; the camera's
    /// free waiter list comes, we allocate *free* (we signal it).
    fn slot(&mut self, mine: &BufAttrs) -> Result<(Slot, MappedBuffer), ProcessError> {
        let (bufs, syncs, ctx, link) = (&self.bufs, &self.syncs, &self.ctx, &mut self.link);
        let limit = Timeout::After(self.limit);
        let ours = bufs.attr_list(mine).ctx("buffer list")?;
        bufs.send_unreconciled(&[&ours], link.endpoint())
            .map_err(link.ipc_err("to take our buffer list"))?;
        let buf = bufs
            .receive_obj(link.endpoint(), &[&ours], BufPerm::ReadWrite, limit)
            .map_err(link.ipc_err("the buffer"))?;
        let waiter = syncs.cuda_waiter_attrs(ctx).ctx("ready list")?;
        syncs
            .send_unreconciled(&[&waiter], link.endpoint())
            .map_err(link.ipc_err("to take our ready list"))?;
        let ready = syncs
            .receive_obj(link.endpoint(), &[&waiter], SyncPerm::WaitOnly, limit)
            .map_err(link.ipc_err("the ready object"))?;
        let theirs = syncs
            .receive_unreconciled(link.endpoint())
            .map_err(link.ipc_err("its free list"))?;
        let mut ours = syncs.cuda_signaler_attrs(ctx).ctx("free list")?;
        if self.source == FenceSource::Built {
            let mut det = SyncAttrs::new();
            det.require_deterministic_fences(true)
                .ctx("sync attributes")?;
            ours.set(&det).ctx("free list")?;
        }
        let free = syncs
            .reconcile_and_alloc(&[&ours, &theirs])
            .ctx("free reconciliation")?;
        free.send(Some(SyncPerm::WaitOnly), link.endpoint())
            .map_err(link.ipc_err("to take the free object"))?;
        let mem = buf.import_cuda(ctx).ctx("NvSciBuf import")?;
        let map = mem.map_whole().ctx("mapping")?;
        let slot = Slot {
            _mem: mem,
            _buf: buf,
            waiter: ready.import_cuda_waiter(ctx).ctx("ready semaphore")?,
            ready,
            signaler: free.import_cuda_signaler(ctx).ctx("free semaphore")?,
            _free: free,
            ready_counter: None,
            pending: None,
        };
        Ok((slot, map))
    }
}

impl RemoteCamera {
    fn set_up(link: Link, s: &Setup, settings: &Settings) -> Result<RemoteCamera, ProcessError> {
        let geometry = settings.geometry;
        let ctx = CudaContext::create(Arc::clone(&s.backend), 0, 0).ctx("CUDA context")?;
        let uuid = s.backend.device(0).and_then(|d| d.uuid());
        let gpu = GpuId(uuid.ctx("device UUID")?);
        let bufs = BufModule::open(&s.backend).ctx("NvSciBufModuleOpen")?;
        let syncs = SyncModule::open(&s.backend).ctx("NvSciSyncModuleOpen")?;
        let mut parts = Parts {
            source: syncs.fence_source(),
            ctx,
            bufs,
            syncs,
            link,
            limit: settings.limit,
        };
        let mine = buffer_attrs(geometry.frame_len(), gpu)?;
        let (mut slots, mut mappings) = (
            Vec::with_capacity(settings.ring),
            Vec::with_capacity(settings.ring),
        );
        for _ in 0..settings.ring {
            let (slot, map) = parts.slot(&mine)?;
            slots.push(slot);
            mappings.push(map);
        }
        // The two-process mode's camera is the sensor model (other sources
        // are refused on the command line).
        let (work, placement) = nvsci_work(&SourceChoice::Sensor);
        let mut consumer = nvsci_consumer(&parts.ctx, work, placement, geometry, mappings)
            .map_err(|e| ProcessError::Consumer(format!("setting up the frame work: {e}")))?;
        consumer.set_skip_kernel(settings.fault == Fault::SkipProcess);
        Ok(RemoteCamera {
            consumer,
            slots,
            link: parts.link,
            source: parts.source,
            geometry,
            limit: settings.limit,
            handed: Rc::new(Cell::new((Instant::now(), 0))),
            error: None,
            _syncs: parts.syncs,
            _bufs: parts.bufs,
            _ctx: parts.ctx,
        })
    }

    /// Keeps `e` for [`RemoteCamera::take_error`] and gives the ring its
    /// text.
    fn fail(&mut self, e: ProcessError) -> TransportError {
        let t = TransportError::new(&e);
        self.error = Some(e);
        t
    }

    /// The typed error behind the ring's `text`, if this transport failed;
    /// else the ring's own refusal.
    pub fn take_error(&mut self, text: String) -> ProcessError {
        self.error.take().unwrap_or(ProcessError::Ring(text))
    }

    /// Sends the ticket and waits until the camera wrote the frame.
    fn await_written(&mut self, t: &Ticket) -> Result<(), ProcessError> {
        let sent = Instant::now();
        self.link.send(&Msg::Ticket(TicketMsg::of(t)))?;
        let frame = t.frame();
        match self.link.recv(&|| format!("frame {frame} to be written"))? {
            Msg::Written { frame: f, write_ns } if f == frame => {
                self.handed.set((sent, write_ns));
                Ok(())
            }
            other => Err(self
                .link
                .protocol(format!("{other:?} instead of frame {frame} written"))),
        }
    }

    /// The ready fence of the ticket: received (always without
    /// deterministic fences; the first of each slot with them), else built.
    fn ready_fence(&mut self, t: &Ticket) -> Result<Fence, ProcessError> {
        let sl = &mut self.slots[t.slot()];
        match (self.source, sl.ready_counter.as_ref()) {
            (FenceSource::Built, Some(c)) => sl
                .ready
                .fence_for_value(c.value_of_signal(t.ready()))
                .ctx("NvSciSyncFenceUpdateFence"),
            _ => {
                let f = sl
                    .ready
                    .receive_fence(self.link.endpoint())
                    .map_err(self.link.ipc_err("the ready fence"))?;
                if self.source == FenceSource::Built {
                    let c = sl.ready.counter_from_fence(t.ready(), &f);
                    sl.ready_counter = Some(c.ctx("ready counter")?);
                }
                Ok(f)
            }
        }
    }

    /// Queues wait(ready) -> the work -> signal(free) for the ticket, and
    /// sends the free fence where the camera cannot build it.
    fn queue(&mut self, t: &Ticket) -> Result<(), ProcessError> {
        let (slot, frame) = (t.slot(), t.frame());
        let sl = &mut self.slots[slot];
        let fence = sl
            .pending
            .take()
            .ok_or_else(|| ProcessError::Ring(format!("frame {frame} queued before ready")))?;
        // The fence arrived after the camera signalled it: the wait cannot
        // be left pending by a camera that dies now.
        sl.waiter
            .wait(self.consumer.entry_stream(), &fence)
            .ctx("GPU wait")?;
        // The camera touches the bytes only after the free signal queued
        // after the work; the consumer's streams drain before the mappings
        // drop.
        self.consumer
            .queue(slot, frame)
            .map_err(|e| ProcessError::Consumer(format!("frame {frame}'s work: {e}")))?;
        let free_fence = sl
            .signaler
            .signal(self.consumer.exit_stream())
            .ctx("free signal")?;
        if self.source == FenceSource::Received || t.free_signal() == 1 {
            self.link.send(&Msg::Freed { frame })?;
            free_fence
                .send(self.link.endpoint())
                .map_err(self.link.ipc_err("to take the free fence"))?;
        }
        Ok(())
    }

    /// Ends the run: the camera checks its last frames and sends its
    /// figures; the endpoint closes.
    fn finish(mut self) -> Result<Figures, ProcessError> {
        // Every frame was collected (each within the limit): all that is
        // left on the streams are the free signals after them.
        self.consumer
            .drain()
            .map_err(|e| ProcessError::Consumer(e.to_string()))?;
        self.link.send(&Msg::End)?;
        let figures = match self.link.recv(&|| "its figures".into())? {
            Msg::Figures(f) => f,
            other => {
                return Err(self
                    .link
                    .protocol(format!("{other:?} instead of its figures")))
            }
        };
        Ok(figures)
    }
}

impl FrameTransport for RemoteCamera {
    fn info(&self) -> TransportInfo {
        TransportInfo {
            backend: "nvsci-two-process",
            geometry: self.geometry,
            slots: self.slots.len(),
            queues_before_ready: false,
        }
    }

    /// Hands the ticket to the camera process, which writes the frame;
    /// the memory returned has no bytes here (writing it is refused).
    fn take_slot(&mut self, t: &Ticket) -> Result<SlotMemory, TransportError> {
        match self.await_written(t) {
            Ok(()) => Ok(SlotMemory::elsewhere(t, "by the camera process")),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Nothing to take back: the camera process holds the memory (and has
    /// written the frame).
    fn put_back(&mut self, _t: &Ticket, memory: SlotMemory) -> Result<(), TransportError> {
        drop(memory);
        Ok(())
    }

    fn signal_ready(&mut self, t: &Ticket, memory: SlotMemory) -> Result<(), TransportError> {
        drop(memory);
        match self.ready_fence(t) {
            Ok(f) => {
                self.slots[t.slot()].pending = Some(f);
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    fn queue_consumer(&mut self, t: &Ticket) -> Result<(), TransportError> {
        self.queue(t).map_err(|e| self.fail(e))
    }

    fn try_complete(&mut self) -> Result<Option<Completion>, TransportError> {
        match self.consumer.try_complete() {
            Ok(c) => Ok(c.map(|(c, _)| c)),
            Err(e) => Err(self.fail(ProcessError::Consumer(e.to_string()))),
        }
    }

    fn wait_complete(&mut self) -> Result<Completion, TransportError> {
        match self.consumer.wait_complete(self.limit) {
            Ok((c, _)) => Ok(c),
            Err(e) => Err(self.fail(ProcessError::Consumer(e.to_string()))),
        }
    }
}
