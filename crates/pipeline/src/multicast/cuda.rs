//! [`CudaFanout`]: a [`FanoutTransport`] whose producer is an
//! [`Exporter`] (the simulator's memfds, or Vulkan on a discrete GPU) and
//! whose consumers each run their own CUDA stream(s) in one context.
//!
//! - **Slots**: one exported frame and one exported *ready* timeline
//!   semaphore per slot, made at [`CudaFanout::open`]. The producer writes
//!   a frame into its slot's staging bytes (the [`SlotMemory`] the ring
//!   lends); [`FanoutTransport::signal_ready`] copies them into the
//!   exported memory through the host mapping and publishes it
//!   ([`Exporter::publish`]: the Vulkan exporter's release batch makes the
//!   host's writes visible to the device, then signals *ready*). That is
//!   one host copy per frame: the exported mapping is not lent out as a
//!   `&mut [u8]` here (that needs a host view under `consumer/`, the one
//!   place of the crate with `unsafe`).
//! - **Consumers**: [`FanoutTransport::attach`] imports, for the new
//!   consumer and at that time (a late attach too), every slot's frame and
//!   *ready* semaphore from fresh descriptors, makes the consumer's own
//!   *release* timeline semaphore per slot (exported, imported into CUDA,
//!   the host side kept for [`FanoutTransport::released`]), and builds a
//!   [`Consumer`] (its own streams, events, device copies) running the
//!   consumer's [`FrameWork`](crate::consumer::FrameWork). Per queued
//!   frame: the entry stream waits for *ready* >= use, the consumer copies
//!   the slot into its own device buffer and runs the work there, and the
//!   exit stream signals the consumer's *release* of the slot to the use.
//!   Nothing is copied back: the slot is shared and only read
//!   ([`Placement::InPlace`] is refused by [`CudaWork::new`];
//!   [`Placement::ReadBack`] is refused here, see below).
//! - **Teardown**: a consumer's streams are drained with a bound
//!   ([`DRAIN_LIMIT`]) before its imports are freed; a consumer whose
//!   streams do not drain (its work waits for something that never comes)
//!   is leaked, imports and all, never freed under the device. Destroying
//!   an imported semaphore that was used waits for the whole context's
//!   work (the driver crate's `ExternalSemaphore` synchronizes the context
//!   first; a stuck stream of another consumer would hold it for ever on a
//!   GPU, 30 s on the simulator, which found this), so while one consumer
//!   seems stuck (a frame queued longer ago than its limit, its stream
//!   busy) a detached consumer is kept, not freed, and at close or drop
//!   either every consumer drained and all are freed, or all are leaked.
//!   Drop never panics; [`FanoutTransport::close`] reports a leak as a
//!   typed timeout.
//!
//! Every descriptor is consumed exactly once: a CUDA import takes it (and
//! closes it on a failed import), and every object made before a failure
//! is dropped on the way out.
//!
//! [`Placement::ReadBack`] is not offered yet: the shared consumer's
//! read-back placement works on acquired EGL frames, and a read-back of an
//! exported slot needs a new copy path in `consumer/`. Verified where: on
//! the simulator (`tests/multicast_sim.rs`, CI). The Vulkan exporter's test
//! (`tests/gpu_multicast.rs`) builds in CI and has not run on a GPU yet.
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use std::time::Duration;
//! use tegra_interop::driver::Context;
//! use tegra_interop_pipeline::camera::TestPattern;
//! use tegra_interop_pipeline::consumer::{twin, CheckInvert, CopyWith, Placement};
//! use tegra_interop_pipeline::multicast::cuda::CudaFanout;
//! use tegra_interop_pipeline::multicast::ring::{MulticastRing, Polled};
//! use tegra_interop_pipeline::multicast::{ConsumerSpec, CudaWork};
//! use tegra_interop_pipeline::transport::export::SimExporter;
//! use tegra_interop_pipeline::transport::FrameGeometry;
//!
//! let sim = tegra_interop_pipeline::sim::Sim::new()?;
//! twin::register(&sim); // the kernels' Rust twins
//! let ctx = Context::new(sim.backend(), 0)?;
//! let g = FrameGeometry { stride: 64, rows: 4 };
//! let mut ring = MulticastRing::new(CudaFanout::open(&ctx, SimExporter, g, 4)?)?;
//! let copy = Placement::DeviceCopy(CopyWith::Engines);
//! for _ in 0..2 {
//!     let work = CudaWork::new(CheckInvert::boxed(), copy)?;
//!     ring.attach(ConsumerSpec::fifo(work, Duration::from_secs(5)))?;
//! }
//! for _ in 0..3 {
//!     let mut lease = ring.acquire()?;
//!     let frame = lease.frame();
//!     TestPattern::new(frame, g.stride).fill(lease.bytes_mut()?);
//!     ring.hand_over(lease)?;
//! }
//! let verified = ring
//!     .drain(Duration::from_secs(5))?
//!     .into_iter()
//!     .filter(|p| matches!(p, Polled::Finished(d) if d.completion.mismatches == 0))
//!     .count();
//! assert_eq!(verified, 6); // three frames, two consumers
//! ring.close()?;
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tegra_interop::core::{SignalParams, WaitParams};
use tegra_interop::driver::{Context, ExternalSemaphore, MappedBuffer, Stream};

use super::produce::ProducerSlot;
use super::{ConsumerSpec, CudaWork, FanoutInfo, FanoutTransport, Queued, WorkKind, MAX_CONSUMERS};
use crate::consumer::{Consumer, ConsumerConfig, FrameMemory, Placement};
use crate::transport::export::{
    import_frame, import_timeline, ExportedFrame, ExportedTimeline, Exporter,
};
use crate::transport::{Completion, DriverResultExt, FrameGeometry, SlotMemory, TransportError};

/// How long a consumer's streams may take to drain at detach, close or
/// drop before the consumer is leaked instead of freed.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// How long [`FanoutTransport::take_slot`] waits for the exporter to hand a
/// slot back to the host (the Vulkan acquire batch; every consumer already
/// released the slot, so this is the batch's own run time).
pub const TAKE_LIMIT: Duration = Duration::from_secs(10);

/// The name [`FanoutInfo::backend`] gives.
pub const BACKEND_NAME: &str = "cuda-fanout";

/// One slot's frame as a host consumer sees it, for the time of one
/// [`HostRead::frame`] call: the exported memory, read through the
/// producer's host mapping once the slot's *ready* fence reached the
/// frame's use.
pub struct HostSlot<'a> {
    memory: &'a dyn ExportedFrame,
    slot: usize,
    len: usize,
}

impl std::fmt::Debug for HostSlot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSlot")
            .field("slot", &self.slot)
            .field("len", &self.len)
            .finish()
    }
}

impl HostSlot<'_> {
    /// The slot's index.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The frame's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the frame has no bytes (never, for an open transport).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the whole frame into `out` (one copy, from the mapping).
    ///
    /// # Errors
    /// `out` of another length than the frame; the exporter's read error.
    pub fn read_into(&self, out: &mut [u8]) -> Result<(), TransportError> {
        if out.len() != self.len {
            return Err(TransportError::misuse(format!(
                "a host read of slot {} needs {} bytes, got a buffer of {}",
                self.slot,
                self.len,
                out.len()
            )));
        }
        self.memory.read(0, out)
    }
}

/// A host consumer of a [`CudaFanout`]: no CUDA stream of its own. For
/// each frame queued to it, the transport waits on the host (up to the
/// consumer's limit) for the slot's *ready* fence, calls
/// [`HostRead::frame`] with the slot's mapping, then signals the
/// consumer's *release* fence of the slot from the host.
///
/// It runs on the thread that hands the frame over (the producer's), so it
/// must not wait for anything slow: copy the bytes out and hand them to a
/// thread of its own (the Zenoh publisher does, through a bounded queue
/// that drops rather than waits).
pub trait HostRead: Send {
    /// A short name for reports and errors.
    fn name(&self) -> &str;
    /// Frame `frame`, readable through `slot`; the problems found in it
    /// (0 for a reader that checks nothing).
    ///
    /// # Errors
    /// The reader failed; the transport reports it as the frame's failure.
    fn frame(&mut self, frame: u64, slot: &HostSlot<'_>) -> Result<u64, TransportError>;
}

/// An attached host consumer: its reader, the host side of its *release*
/// timelines, and the frames it finished.
struct HostConsumer<T> {
    reader: Box<dyn HostRead>,
    release: Vec<T>,
    done: VecDeque<Completion>,
    limit: Duration,
}

/// One attached consumer: its CUDA consumer, its imports, the host side of
/// its release semaphores and its frames in flight.
struct CudaConsumer<T> {
    /// `None` once it was drained and freed, or leaked.
    consumer: Option<Consumer>,
    ready: Vec<ExternalSemaphore>,
    release: Vec<ExternalSemaphore>,
    release_host: Vec<T>,
    /// Frames queued and not collected, with when they were queued.
    in_flight: VecDeque<(Queued, Instant)>,
    done: VecDeque<Completion>,
    limit: Duration,
}

/// Whether `stream` is idle (an error counts as not).
fn idle(stream: &Stream) -> bool {
    stream.is_idle().unwrap_or(false)
}

impl<T> CudaConsumer<T> {
    fn consumer(&self) -> Result<&Consumer, TransportError> {
        self.consumer
            .as_ref()
            .ok_or_else(|| TransportError::misuse("the consumer was already stopped"))
    }

    /// Whether its streams are idle (a stopped consumer's are).
    fn idle(&self) -> bool {
        self.consumer
            .as_ref()
            .is_none_or(|c| idle(c.entry_stream()) && idle(c.exit_stream()))
    }

    /// Waits until its streams are idle, at most until `deadline`.
    fn drained(&self, deadline: Instant) -> bool {
        loop {
            if self.idle() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether its oldest frame in flight was queued longer ago than its
    /// limit: its stream may never drain.
    fn overdue(&self) -> bool {
        self.in_flight
            .front()
            .is_some_and(|(_, at)| at.elapsed() > self.limit)
            && !self.idle()
    }

    /// Frees the consumer and its imports (its streams drained).
    fn free(mut self) {
        drop(self.consumer.take());
        drop(std::mem::take(&mut self.ready));
        drop(std::mem::take(&mut self.release));
    }

    /// Leaks the consumer and its imports: work queued on its streams may
    /// still use them, and destroying them would wait for it.
    fn leak(mut self) {
        std::mem::forget(self.consumer.take());
        std::mem::forget(std::mem::take(&mut self.ready));
        std::mem::forget(std::mem::take(&mut self.release));
    }

    /// Collects the consumer's oldest finished frame, if it finished.
    fn collect(&mut self) -> Result<bool, TransportError> {
        let Some((completion, _)) = self.consumer()?.try_complete()? else {
            return Ok(false);
        };
        self.in_flight.pop_front();
        self.done.push_back(completion);
        Ok(true)
    }

    /// Collects finished frames until `slot` has none in flight, at most
    /// the consumer's limit (its release was seen, so its frame is done).
    fn settle(&mut self, slot: usize, frame: u64) -> Result<(), TransportError> {
        let start = Instant::now();
        while self.in_flight.iter().any(|(q, _)| q.slot == slot) {
            if !self.collect()? {
                if start.elapsed() >= self.limit {
                    return Err(TransportError::timeout(
                        format!("the consumer's last frame in slot {slot} to finish before frame {frame}"),
                        self.limit,
                    ));
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

/// A multicast transport over exported memory and CUDA consumers (see the
/// module docs). Its drop stops the consumers ([`DRAIN_LIMIT`]: freed
/// once every stream drained, else all leaked); then the slots and the
/// exporter go.
pub struct CudaFanout<E: Exporter> {
    consumers: Vec<Option<CudaConsumer<E::Timeline>>>,
    /// Host consumers ([`HostRead`]), by the same consumer places.
    hosts: Vec<Option<HostConsumer<E::Timeline>>>,
    /// Detached consumers not freed yet: another consumer's stream seemed
    /// stuck (destroying their semaphores synchronizes the context).
    detached: Vec<CudaConsumer<E::Timeline>>,
    /// Per consumer place, completions a detached consumer left untaken.
    leftover: Vec<VecDeque<Completion>>,
    slots: Vec<ProducerSlot<E>>,
    geometry: FrameGeometry,
    ctx: Context,
    exporter: E,
}

impl<E: Exporter> std::fmt::Debug for CudaFanout<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaFanout")
            .field("exporter", &self.exporter.name())
            .field("geometry", &self.geometry)
            .field("slots", &self.slots.len())
            .field(
                "consumers",
                &self.consumers.iter().filter(|c| c.is_some()).count(),
            )
            .finish()
    }
}

impl<E: Exporter> CudaFanout<E> {
    /// `slots` slots of frames of `geometry`, exported by `exporter`, for
    /// consumers in `ctx` (a context of the device the exporter's memory is
    /// on; the simulator's where `exporter` is the simulator's).
    ///
    /// # Errors
    /// Refused for a ring size outside `1..=MAX_SLOTS` or empty frames; the
    /// exporter's errors.
    pub fn open(
        ctx: &Context,
        mut exporter: E,
        geometry: FrameGeometry,
        slots: usize,
    ) -> Result<CudaFanout<E>, TransportError> {
        let len = geometry.frame_len();
        if !(1..=crate::slots::MAX_SLOTS).contains(&slots) || len == 0 {
            return Err(TransportError::refused(format!(
                "a multicast ring needs 1..={} slots and non-empty frames (asked: {slots} slots of {len} bytes)",
                crate::slots::MAX_SLOTS
            )));
        }
        let made = ProducerSlot::make(&mut exporter, slots, len)?;
        Ok(CudaFanout {
            consumers: (0..MAX_CONSUMERS).map(|_| None).collect(),
            hosts: (0..MAX_CONSUMERS).map(|_| None).collect(),
            detached: Vec::new(),
            leftover: (0..MAX_CONSUMERS).map(|_| VecDeque::new()).collect(),
            slots: made,
            geometry,
            ctx: ctx.clone(),
            exporter,
        })
    }

    /// The exporter's name.
    pub fn exporter_name(&self) -> &'static str {
        self.exporter.name()
    }

    /// The exporter (for a test's or a tool's own exported objects).
    pub fn exporter_mut(&mut self) -> &mut E {
        &mut self.exporter
    }

    /// Reads `slot`'s exported frame through the producer's host mapping
    /// into `out` (a check that no consumer wrote the shared slot; call it
    /// while no frame of the slot is being published).
    ///
    /// # Errors
    /// A slot the transport does not have, or `out` longer than the frame
    /// memory.
    pub fn read_frame(&self, slot: usize, out: &mut [u8]) -> Result<(), TransportError> {
        self.slots
            .get(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?
            .frame
            .read(0, out)
    }

    /// Consumers attached now.
    pub fn attached(&self) -> usize {
        self.consumers.iter().filter(|c| c.is_some()).count()
            + self.hosts.iter().filter(|c| c.is_some()).count()
    }

    fn host(&mut self, id: usize) -> Option<&mut HostConsumer<E::Timeline>> {
        self.hosts.get_mut(id).and_then(Option::as_mut)
    }

    /// Attaches a host consumer at `id` (a free place).
    fn attach_host(
        &mut self,
        id: usize,
        reader: Box<dyn HostRead>,
        limit: Duration,
    ) -> Result<(), TransportError> {
        let mut release = Vec::with_capacity(self.slots.len());
        for _ in 0..self.slots.len() {
            release.push(self.exporter.export_timeline(0)?);
        }
        if let Some(l) = self.leftover.get_mut(id) {
            l.clear();
        }
        if let Some(place) = self.hosts.get_mut(id) {
            *place = Some(HostConsumer {
                reader,
                release,
                done: VecDeque::with_capacity(self.slots.len()),
                limit,
            });
        }
        Ok(())
    }

    /// Runs frame `q` through host consumer `id` now: waits for the
    /// slot's *ready* fence (bounded), reads, signals *release*.
    fn queue_host(&mut self, id: usize, q: Queued) -> Result<(), TransportError> {
        let len = self.geometry.frame_len();
        let (Some(Some(h)), Some(s)) = (self.hosts.get_mut(id), self.slots.get(q.slot)) else {
            return Err(TransportError::no_slot(q.slot));
        };
        if !s.ready.wait(q.use_, h.limit)? {
            return Err(TransportError::timeout(
                format!(
                    "slot {}'s ready fence to reach {} for frame {}",
                    q.slot, q.use_, q.frame
                ),
                h.limit,
            ));
        }
        let began = Instant::now();
        let view = HostSlot {
            memory: &s.frame,
            slot: q.slot,
            len,
        };
        let mismatches = h.reader.frame(q.frame, &view)?;
        h.release
            .get(q.slot)
            .ok_or_else(|| TransportError::no_slot(q.slot))?
            .signal(q.use_)?;
        let took = began.elapsed();
        h.done.push_back(Completion {
            slot: q.slot,
            frame: q.frame,
            mismatches,
            process: took,
            busy: took,
            finished: Instant::now(),
        });
        Ok(())
    }

    /// Host consumer `id`'s *release* timeline of `slot`, if `id` is one.
    fn host_release(
        &mut self,
        id: usize,
        slot: usize,
    ) -> Option<Result<&E::Timeline, TransportError>> {
        let h = self.host(id)?;
        Some(
            h.release
                .get(slot)
                .ok_or_else(|| TransportError::no_slot(slot)),
        )
    }

    fn consumer(&mut self, id: usize) -> Result<&mut CudaConsumer<E::Timeline>, TransportError> {
        self.consumers
            .get_mut(id)
            .and_then(Option::as_mut)
            .ok_or_else(|| TransportError::misuse(format!("consumer {id} is not attached")))
    }

    /// Every slot's frame and *ready* semaphore imported for a new
    /// consumer, and its own *release* semaphores made and imported.
    fn import_all(&mut self) -> Result<Imports<E::Timeline>, TransportError> {
        let mut out = Imports {
            frames: Vec::with_capacity(self.slots.len()),
            ready: Vec::with_capacity(self.slots.len()),
            release: Vec::with_capacity(self.slots.len()),
            release_host: Vec::with_capacity(self.slots.len()),
        };
        for s in &self.slots {
            out.frames
                .push(import_frame(&self.ctx, s.frame.export_fd()?, &s.frame)?);
            out.ready
                .push(import_timeline(&self.ctx, s.ready.export_fd()?)?);
            let host = self.exporter.export_timeline(0)?;
            out.release
                .push(import_timeline(&self.ctx, host.export_fd()?)?);
            out.release_host.push(host);
        }
        Ok(out)
    }

    /// Stops every consumer, attached or detached: once all their
    /// streams drained (at most [`DRAIN_LIMIT`] in all) they are freed;
    /// else every one is leaked (destroying an imported semaphore waits
    /// for the whole context, so for a stuck stream). How many consumers'
    /// streams did not drain.
    fn stop_all(&mut self) -> usize {
        let mut all: Vec<CudaConsumer<E::Timeline>> = self.detached.drain(..).collect();
        all.extend(self.consumers.iter_mut().filter_map(Option::take));
        // Host consumers have nothing in flight: each frame ended in `queue`.
        self.hosts.iter_mut().for_each(|h| drop(h.take()));
        let deadline = Instant::now() + DRAIN_LIMIT;
        let stuck = all.iter().filter(|c| !c.drained(deadline)).count();
        for c in all {
            if stuck == 0 {
                c.free();
            } else {
                c.leak();
            }
        }
        stuck
    }

    /// Frees the detached consumers once no attached one seems stuck.
    fn free_detached(&mut self) {
        let stuck = self.consumers.iter().flatten().any(CudaConsumer::overdue);
        if !stuck {
            for c in self.detached.drain(..) {
                c.free();
            }
        }
    }
}

impl<E: Exporter> Drop for CudaFanout<E> {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// What a new consumer imported ([`CudaFanout::import_all`]).
struct Imports<T> {
    frames: Vec<MappedBuffer>,
    ready: Vec<ExternalSemaphore>,
    release: Vec<ExternalSemaphore>,
    release_host: Vec<T>,
}

impl<E: Exporter> CudaFanout<E> {
    /// Attaches a CUDA consumer of `work` at `id` (a free place).
    fn attach_device(
        &mut self,
        id: usize,
        work: Box<dyn crate::consumer::FrameWork>,
        placement: Placement,
        limit: Duration,
    ) -> Result<(), TransportError> {
        let Placement::DeviceCopy(_) = placement else {
            return Err(TransportError::refused(format!(
                "a CUDA multicast consumer works on its own device copy of the slot \
                 (Placement::DeviceCopy); {placement:?} is not offered"
            )));
        };
        let imports = self.import_all()?;
        let config = ConsumerConfig {
            geometry: self.geometry,
            slots: self.slots.len(),
            memory: FrameMemory::System,
            placement,
            skip_kernel: false,
        };
        let mut consumer = Consumer::new(&self.ctx, config, imports.frames, work)?;
        consumer.set_read_only();
        if let Some(l) = self.leftover.get_mut(id) {
            l.clear();
        }
        self.consumers[id] = Some(CudaConsumer {
            consumer: Some(consumer),
            ready: imports.ready,
            release: imports.release,
            release_host: imports.release_host,
            in_flight: VecDeque::with_capacity(self.slots.len()),
            done: VecDeque::with_capacity(self.slots.len()),
            limit,
        });
        Ok(())
    }

    /// Detaches CUDA consumer `id`.
    fn detach_device(&mut self, id: usize) -> Result<(), TransportError> {
        let Some(mut c) = self.consumers.get_mut(id).and_then(Option::take) else {
            return Err(TransportError::misuse(format!(
                "consumer {id} is not attached"
            )));
        };
        if !c.drained(Instant::now() + DRAIN_LIMIT) {
            c.leak();
            return Err(TransportError::timeout(
                format!("consumer {id}'s streams to drain at its detach (its imports are leaked)"),
                DRAIN_LIMIT,
            ));
        }
        // Drained: every frame it was queued is done, so this ends.
        let mut left = std::mem::take(&mut c.done);
        while let Ok(Some((completion, _))) = c.consumer().and_then(Consumer::try_complete) {
            left.push_back(completion);
        }
        if let Some(l) = self.leftover.get_mut(id) {
            *l = left;
        }
        self.detached.push(c);
        self.free_detached();
        Ok(())
    }
}

impl<E: Exporter> FanoutTransport for CudaFanout<E> {
    type Work = CudaWork;

    fn info(&self) -> FanoutInfo {
        FanoutInfo {
            backend: BACKEND_NAME,
            geometry: self.geometry,
            slots: self.slots.len(),
        }
    }

    fn attach(&mut self, id: usize, spec: ConsumerSpec<CudaWork>) -> Result<(), TransportError> {
        match (self.consumers.get(id), self.hosts.get(id)) {
            (Some(None), Some(None)) => {}
            (Some(_), Some(_)) => {
                return Err(TransportError::misuse(format!(
                    "consumer {id} is attached already"
                )))
            }
            _ => {
                return Err(TransportError::misuse(format!(
                    "consumer {id} is past the {MAX_CONSUMERS} consumer places"
                )))
            }
        }
        match spec.work.into_kind() {
            WorkKind::Host(reader) => self.attach_host(id, reader, spec.limit),
            WorkKind::Device { work, placement } => {
                self.attach_device(id, work, placement, spec.limit)
            }
        }
    }

    fn detach(&mut self, id: usize) -> Result<(), TransportError> {
        if let Some(h) = self.hosts.get_mut(id).and_then(Option::take) {
            // A host consumer ran each frame to its end inside `queue`.
            if let Some(l) = self.leftover.get_mut(id) {
                *l = h.done;
            }
            return Ok(());
        }
        self.detach_device(id)
    }

    fn take_slot(
        &mut self,
        slot: usize,
        frame: u64,
        _use: u64,
    ) -> Result<SlotMemory, TransportError> {
        let len = self.geometry.frame_len();
        self.slots
            .get_mut(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?
            .take(&mut self.exporter, slot, frame, len, TAKE_LIMIT)
    }

    fn put_back(&mut self, slot: usize, memory: SlotMemory) -> Result<(), TransportError> {
        self.slots
            .get_mut(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?
            .put_back(slot, memory)
    }

    fn signal_ready(
        &mut self,
        slot: usize,
        use_: u64,
        memory: SlotMemory,
    ) -> Result<(), TransportError> {
        self.slots
            .get_mut(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?
            .publish(&mut self.exporter, slot, use_, memory)
    }

    fn queue(&mut self, id: usize, q: Queued) -> Result<(), TransportError> {
        if self.host(id).is_some() {
            return self.queue_host(id, q);
        }
        let c = self.consumer(id)?;
        c.settle(q.slot, q.frame)?;
        let (Some(ready), Some(release)) = (c.ready.get(q.slot), c.release.get_mut(q.slot)) else {
            return Err(TransportError::no_slot(q.slot));
        };
        let consumer = c
            .consumer
            .as_ref()
            .ok_or_else(|| TransportError::misuse("the consumer was already stopped"))?;
        consumer
            .entry_stream()
            .wait(ready, WaitParams::timeline(q.use_))
            .during("CUDA wait for a slot's ready fence")?;
        consumer.queue(q.slot, q.frame)?;
        consumer
            .exit_stream()
            .signal(release, SignalParams::timeline(q.use_))
            .during("CUDA signal of the consumer's release fence")?;
        c.in_flight.push_back((q, Instant::now()));
        Ok(())
    }

    fn released(&mut self, id: usize, slot: usize) -> Result<u64, TransportError> {
        if let Some(release) = self.host_release(id, slot) {
            return release?.value();
        }
        self.consumer(id)?
            .release_host
            .get(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?
            .value()
    }

    fn wait_released(
        &mut self,
        id: usize,
        slot: usize,
        value: u64,
        limit: Duration,
    ) -> Result<bool, TransportError> {
        if let Some(release) = self.host_release(id, slot) {
            return release?.wait(value, limit);
        }
        self.consumer(id)?
            .release_host
            .get(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?
            .wait(value, limit)
    }

    fn try_complete(&mut self, id: usize) -> Result<Option<Completion>, TransportError> {
        if let Some(h) = self.host(id) {
            return Ok(h.done.pop_front());
        }
        if let (Some(None), Some(left)) = (self.consumers.get(id), self.leftover.get_mut(id)) {
            // Detached: what it left untaken, then nothing.
            return Ok(left.pop_front());
        }
        let c = self.consumer(id)?;
        if c.done.is_empty() && !c.in_flight.is_empty() {
            c.collect()?;
        }
        Ok(c.done.pop_front())
    }

    fn close(mut self: Box<Self>) -> Result<(), TransportError> {
        match self.stop_all() {
            0 => Ok(()),
            stuck => Err(TransportError::timeout(
                format!(
                    "{stuck} consumer(s)' streams to drain at close (every consumer's imports are leaked)"
                ),
                DRAIN_LIMIT,
            )),
        }
    }
}
