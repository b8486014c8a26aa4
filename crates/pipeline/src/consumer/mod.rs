//! The pipeline's one CUDA consumer, shared by the transports whose
//! consumer runs CUDA work: the NvSci transport (a Jetson, or the
//! simulator), the EGLStream transport and the discrete-GPU transport.
//!
//! What the consumer does with a frame is a [`FrameWork`] ([`work`]): the
//! user's CUDA work, given a typed device view of the frame
//! ([`DeviceFrame`]) and the stream the ring's fences are ordered on. The
//! project's check-and-invert kernel is one implementation
//! ([`CheckInvert`], with its mismatch counters: what the `pipeline`
//! program and the tests verify with), [`Invert`] another; the examples
//! `user_ptx`, `user_chain` and `user_cudarc` are users' own.
//!
//! A [`Consumer`] owns everything of the consumer side but the fences: the
//! work (made ready in [`Consumer::new`] with [`FrameWork::prepare`]),
//! per-slot CUDA events, the slot's frame (a mapped import) or, per
//! [`Placement`], its device-local copy or its pinned host buffer, the copy
//! kernels where the placement uses them, and the streams. Per frame the
//! transport queues its wait for *ready* on [`Consumer::entry_stream`],
//! calls [`Consumer::queue`] (or `Consumer::queue_acquired` for an EGL
//! frame), which queues the copy in, the work ([`FrameWork::queue`]) and
//! the copy back, and queues its *free* signal on [`Consumer::exit_stream`];
//! the frame's [`Completion`] comes from [`Consumer::try_complete`] /
//! [`Consumer::wait_complete`], in queueing order, with what
//! [`FrameWork::finished`] found and the GPU times of its events.
//!
//! Everything goes through the driver's seam (`tegra_interop::driver`:
//! `Nvrtc`, `Module`, `Function::launch`,
//! `Event`, `PinnedHostBuffer`, `DeviceBuffer`, `Stream::copy_async`), so the
//! same code runs on a GPU and on the simulator, where the kernels are their
//! Rust twins (`twin::register`). On a GPU the kernels, launches and
//! events of this design ran on an H100 and the H200 before they moved onto
//! the seam (BENCHMARKS-history.md, sessions 6 to 9, through cudarc); the seam's
//! version is verified on the simulator here and must be run on the GPU
//! machine again. The Jetson path (NvSci on Tegra) has never run on a
//! Jetson.
//!
//! This is the one module of the pipeline with `unsafe` code, each block
//! with its `// SAFETY:` line: the kernel launches and the queued copies
//! (see [`Consumer`] for the rules that make them sound, [`work`] for the
//! contract a [`FrameWork`]'s own launches rest on, [`builtin`] for the
//! project's two, and [`bench`](mod@bench) for the plain-CUDA baseline's), the host views of shared frames and lent
//! frames ([`shared`]) and the EGLStream's CUDA ends ([`egl`]). Each keeps
//! the driver's promise inside a safe API.
#![allow(unsafe_code)] // the pipeline's one module with unsafe code (see the module docs)

pub mod bench;
pub mod builtin;
pub mod egl;
pub mod kernel;
pub mod shared;
#[cfg(feature = "sim")]
pub mod twin;
pub mod work;

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tegra_interop::driver::egl::StreamFrame;
use tegra_interop::driver::{
    Backend, Context, DeviceBuffer, DeviceMemory, DevicePtr, Event, EventFlags, MappedBuffer,
    Nvrtc, PinnedHostBuffer, Stream,
};

use shared::{HostFrame, Lendable};

use crate::error::{DriverError, DriverResultExt, TransportError};
use crate::frame::{Completion, FrameGeometry, FrameLayout};
use shared::PeekedFrame;

pub use builtin::{CheckInvert, Invert};
pub use kernel::{
    grid_for, kernel_pattern_byte, pattern_seed, self_check_pattern, CopyKernel, FrameMemory,
    Kernels, BLOCK, BYTES_PER_THREAD, FRAME_ALIGN, KERNEL_SOURCE,
};

/// Whether `backend` has NVRTC, which the consumer compiles its kernel
/// with (the driver's own loader: the table's optional NVRTC part).
pub fn nvrtc_present_in(backend: &Arc<Backend>) -> Result<(), TransportError> {
    Nvrtc::new(backend).map(drop).map_err(|e| {
        TransportError::driver(
            "NVRTC (libnvrtc.so) was not found: install the CUDA toolkit's NVRTC or add its lib64 folder to LD_LIBRARY_PATH",
            e,
        )
    })
}

/// Whether the real driver's backend has NVRTC ([`nvrtc_present_in`] on
/// `Backend::real()`).
pub fn nvrtc_present() -> Result<(), TransportError> {
    let backend = Backend::real().during("loading the CUDA driver")?;
    nvrtc_present_in(&backend)
}

/// How a copy between a frame and its device-local copy is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyWith {
    /// The copy engines (`cuMemcpyDtoDAsync`): the copy in and an earlier
    /// frame's copy back run at once, on two streams.
    Engines,
    /// The copy kernels of [`KERNEL_SOURCE`] (loads that fetch system
    /// memory again, write-through stores), on the same two streams.
    Kernels,
}

pub use work::{DeviceFrame, FnWork, FrameWork, Placement, WorkError};

/// How a [`Consumer`] is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// Layout of every frame.
    pub geometry: FrameGeometry,
    /// Slots of the ring.
    pub slots: usize,
    /// Where the slots' own frames live ([`DeviceFrame::memory`] in
    /// [`Placement::InPlace`]; device copies and EGL frames are always
    /// [`FrameMemory::Device`]).
    pub memory: FrameMemory,
    /// Where the work sees each frame.
    pub placement: Placement,
    /// Report every frame done without queueing the work (fault
    /// injection: the producer's read-back must catch it).
    pub skip_kernel: bool,
}

/// GPU times of one collected frame, from its events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameTimes {
    /// From [`Consumer::arrive`] to the start of the frame's work: the
    /// transport's wait for *ready* (`None` when `arrive` was not called).
    pub wait: Option<Duration>,
    /// From the start to the work (the copy in, in copy placement).
    pub copy_in: Duration,
    /// The work ([`FrameWork::queue`]'s work on the stream).
    pub kernel: Duration,
    /// From the work to the frame's end (the copy back or read-back).
    pub copy_out: Duration,
}

/// One slot's consumer state: its events, memory and frame in flight.
struct Slot {
    /// The slot's frame ([`Placement::InPlace`], [`Placement::DeviceCopy`]).
    frame: Option<MappedBuffer>,
    /// Its device-local copy ([`Placement::DeviceCopy`]).
    device: Option<DeviceBuffer>,
    /// The same frame's host memory page-locked in place
    /// ([`Consumer::copy_through_registered`]): where copy mode's copies
    /// read and write it instead of through `frame`.
    registered: Option<shared::RegisteredFrame>,
    /// Its host copy ([`Placement::ReadBack`]).
    host: Option<Lendable<HostFrame>>,
    arrive: Event,
    start: Event,
    kernel_start: Event,
    kernel_end: Event,
    done: Event,
}

/// Where a slot is on the consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    /// Nothing queued; `arrived`: its arrival event was recorded for the
    /// next frame.
    Idle { arrived: bool },
    /// Being queued (by one thread; nobody else may touch the slot).
    Queueing { arrived: bool },
    /// Queued and not collected.
    InFlight { frame: u64, arrived: bool },
    /// Queueing failed part-way: the slot's work and events are unknown,
    /// so the slot is never used again.
    Broken,
}

/// The consumer's bookkeeping, shared by the threads that queue and
/// collect (behind a mutex, held only to read or move a slot's state).
#[derive(Debug)]
struct Progress {
    /// Frames in flight, oldest first: their slots.
    in_flight: VecDeque<usize>,
    /// Per slot.
    states: Vec<SlotState>,
}

impl Slot {
    fn new(ctx: &Context) -> Result<Slot, TransportError> {
        let event = || Event::new(ctx, EventFlags::DEFAULT).during("creating a CUDA event");
        Ok(Slot {
            frame: None,
            device: None,
            registered: None,
            host: None,
            arrive: event()?,
            start: event()?,
            kernel_start: event()?,
            kernel_end: event()?,
            done: event()?,
        })
    }

    fn times(&self, arrived: bool) -> Result<FrameTimes, TransportError> {
        let since = |later: &Event, earlier: &Event| {
            later
                .elapsed_since(earlier)
                .during("reading CUDA event times")
        };
        Ok(FrameTimes {
            wait: match arrived {
                true => Some(since(&self.start, &self.arrive)?),
                false => None,
            },
            copy_in: since(&self.kernel_start, &self.start)?,
            kernel: since(&self.kernel_end, &self.kernel_start)?,
            copy_out: since(&self.done, &self.kernel_end)?,
        })
    }
}

/// What queued work may use: freed only after the streams drained.
struct Resources {
    slots: Vec<Slot>,
    /// The copy kernels, compiled where the placement uses them
    /// ([`CopyWith::Kernels`], [`Placement::ReadBack`]).
    copies: Option<Kernels>,
    /// The user's work (its memory too may be used by queued work).
    work: Mutex<Box<dyn FrameWork>>,
}

/// The consumer (see the module docs).
///
/// # Why its safe methods are sound
///
/// The work ([`FrameWork`]) and the copies are queued on its own streams
/// over memory it owns (the slots' frames, device buffers, host buffers;
/// the work owns its own, and is dropped with the rest) or that
/// a borrowed guard keeps alive until work queued after it (an acquired
/// EGL frame, released on the same stream after the work). A slot's memory
/// is touched by the host only through [`Consumer::host_frame`] /
/// [`Consumer::host_frame_mut`], which refuse a slot whose frame is in
/// flight, and a slot is queued again only after its frame was collected
/// (its `done` event completed). Before anything is freed the streams are
/// drained (`Drop`), or, where they cannot be, the memory is leaked. What
/// the consumer cannot see is the producer writing a frame through its
/// own mapping (the NvSciBuf CPU pointer, the Vulkan mapping): the
/// transport's fences order that, as the ring's protocol says
/// ([`crate::ring`]): the producer writes a slot only after its *free*
/// fence, which the transport signals on the exit stream after the
/// consumer's work.
pub struct Consumer {
    config: ConsumerConfig,
    /// Every frame's layout, as the work sees it.
    layout: FrameLayout,
    grid: u32,
    progress: Mutex<Progress>,
    /// Dropped by `Drop::drop` once the streams drained, else leaked.
    res: ManuallyDrop<Resources>,
    exit: Option<Stream>,
    /// Copy placement copies nothing back: the slot is only read (a
    /// multicast slot that other consumers read too).
    read_only: bool,
    entry: Stream,
    ctx: Context,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("config", &self.config)
            .field("layout", &self.layout)
            .field("progress", &self.progress)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// Makes the consumer in `ctx` running `work` on every frame: makes
    /// the streams, each slot's events and memory, compiles the copy
    /// kernels where the placement uses them, and has the work prepare
    /// ([`FrameWork::prepare`]). `frames` are the slots' frames, one per
    /// slot, for [`Placement::InPlace`] and [`Placement::DeviceCopy`] (each
    /// at least a frame long, 16-byte aligned); none for
    /// [`Placement::ReadBack`]. The project's own work is
    /// [`CheckInvert`].
    pub fn new(
        ctx: &Context,
        config: ConsumerConfig,
        frames: Vec<MappedBuffer>,
        mut work: Box<dyn FrameWork>,
    ) -> Result<Consumer, TransportError> {
        let g = config.geometry;
        let len = g.frame_len();
        if len == 0 || config.slots == 0 {
            return Err(TransportError::refused(
                "the consumer needs frames and slots",
            ));
        }
        let want = match config.placement {
            Placement::ReadBack => 0,
            _ => config.slots,
        };
        if frames.len() != want {
            return Err(TransportError::refused(format!(
                "the consumer was given {} frame(s) for {} slot(s) of {:?} placement",
                frames.len(),
                config.slots,
                config.placement
            )));
        }
        let layout = layout_for(g, work.as_ref())?;
        let copies = match config.placement {
            Placement::DeviceCopy(CopyWith::Kernels) | Placement::ReadBack => {
                Some(Kernels::compile(ctx)?)
            }
            _ => None,
        };
        let entry = Stream::new(ctx).during("creating the consumer's stream")?;
        let exit = match config.placement {
            Placement::DeviceCopy(_) => {
                Some(Stream::new(ctx).during("creating the copy-back stream")?)
            }
            _ => None,
        };
        let slots = Self::make_slots(ctx, &config, frames)?;
        work.prepare(ctx, layout, config.slots, config.placement)
            .map_err(|e| from_work(e, &*work, None))?;
        Ok(Consumer {
            config,
            layout,
            grid: grid_for(len),
            progress: Mutex::new(Progress {
                in_flight: VecDeque::with_capacity(config.slots),
                states: vec![SlotState::Idle { arrived: false }; config.slots],
            }),
            res: ManuallyDrop::new(Resources {
                slots,
                copies,
                work: Mutex::new(work),
            }),
            exit,
            read_only: false,
            entry,
            ctx: ctx.clone(),
        })
    }

    /// Each slot's events and memory.
    fn make_slots(
        ctx: &Context,
        config: &ConsumerConfig,
        frames: Vec<MappedBuffer>,
    ) -> Result<Vec<Slot>, TransportError> {
        let len = config.geometry.frame_len();
        let mut frames = frames.into_iter();
        let mut slots = Vec::with_capacity(config.slots);
        for index in 0..config.slots {
            let mut slot = Slot::new(ctx)?;
            match config.placement {
                Placement::ReadBack => {
                    slot.host = Some(Lendable::new(HostFrame::new(
                        PinnedHostBuffer::new(ctx, len).during("allocating a host frame buffer")?,
                    )));
                }
                Placement::InPlace | Placement::DeviceCopy(_) => {
                    let frame = frames
                        .next()
                        .ok_or_else(|| TransportError::no_slot(index))?;
                    if frame.size() < len as u64 {
                        return Err(TransportError::refused(format!(
                            "slot {index}'s frame has {} bytes, a frame needs {len}",
                            frame.size()
                        )));
                    }
                    kernel::check_aligned(frame.device_ptr(), "a slot's frame")?;
                    slot.frame = Some(frame);
                }
            }
            if let Placement::DeviceCopy(_) = config.placement {
                slot.device =
                    Some(DeviceBuffer::new(ctx, len).during("allocating a device frame buffer")?);
            }
            slots.push(slot);
        }
        Ok(slots)
    }

    /// How it was made.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// Makes copy placement read the slot only: the work's copy is not
    /// copied back (a multicast consumer, whose slot others read too).
    pub(crate) fn set_read_only(&mut self) {
        self.read_only = true;
    }

    /// Reports every frame done without running the work from now on
    /// (`true`), or runs it again (`false`): fault injection for testing the
    /// checks that must catch a consumer that did nothing
    /// ([`ConsumerConfig::skip_kernel`]).
    pub fn set_skip_kernel(&mut self, skip: bool) {
        self.config.skip_kernel = skip;
    }

    /// The context it works in.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The stream the frame's work starts on: queue the wait for *ready*
    /// here before [`Consumer::queue`].
    pub fn entry_stream(&self) -> &Stream {
        &self.entry
    }

    /// The stream the frame's work ends on: queue the *free* signal here
    /// after [`Consumer::queue`] (the entry stream except in copy mode).
    pub fn exit_stream(&self) -> &Stream {
        self.exit.as_ref().unwrap_or(&self.entry)
    }

    /// Frames queued and not collected.
    pub fn in_flight(&self) -> usize {
        self.progress().map_or(0, |p| p.in_flight.len())
    }

    fn progress(&self) -> Result<MutexGuard<'_, Progress>, TransportError> {
        self.progress
            .lock()
            .map_err(|_| TransportError::misuse("a thread panicked while using the consumer"))
    }

    /// Moves `slot` from idle to `to(arrived)`, or says why it is not idle.
    fn take_idle(
        &self,
        slot: usize,
        to: impl FnOnce(bool) -> SlotState,
    ) -> Result<(), TransportError> {
        let mut p = self.progress()?;
        let state = p
            .states
            .get_mut(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?;
        match *state {
            SlotState::Idle { arrived } => {
                *state = to(arrived);
                Ok(())
            }
            other => Err(TransportError::misuse(format!(
                "slot {slot} is not idle on the consumer ({other:?})"
            ))),
        }
    }

    /// Ends the queueing of `slot`: in flight with `frame`, or broken.
    fn end_queueing(&self, slot: usize, frame: u64, ok: bool) -> Result<(), TransportError> {
        let mut p = self.progress()?;
        let state = p
            .states
            .get_mut(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?;
        *state = match (*state, ok) {
            (SlotState::Queueing { arrived }, true) => SlotState::InFlight { frame, arrived },
            _ => SlotState::Broken,
        };
        if ok {
            p.in_flight.push_back(slot);
        }
        Ok(())
    }

    /// Runs `work` for `slot` as its queueing (the slot must be idle), then
    /// marks the frame in flight, or the slot broken if `work` failed.
    fn queueing(
        &self,
        slot: usize,
        frame: u64,
        work: impl FnOnce(&Slot) -> Result<(), TransportError>,
    ) -> Result<(), TransportError> {
        self.take_idle(slot, |arrived| SlotState::Queueing { arrived })?;
        let r = work(&self.res.slots[slot]);
        self.end_queueing(slot, frame, r.is_ok())?;
        r
    }

    /// Records the slot's arrival event on the entry stream (optional, for
    /// [`FrameTimes::wait`]): call it before queueing the wait for *ready*.
    pub fn arrive(&self, slot: usize) -> Result<(), TransportError> {
        self.take_idle(slot, |_| SlotState::Queueing { arrived: true })?;
        let r = self.res.slots[slot]
            .arrive
            .record(&self.entry)
            .during("recording a CUDA event");
        let mut p = self.progress()?;
        p.states[slot] = match r {
            Ok(()) => SlotState::Idle { arrived: true },
            Err(_) => SlotState::Broken,
        };
        r
    }

    /// Queues frame `frame`'s work over `slot`'s own frame
    /// ([`Placement::InPlace`], [`Placement::DeviceCopy`]): the work
    /// ([`FrameWork::queue`]) on the slot's frame or its device copy, with
    /// the copies around it in copy placement.
    pub fn queue(&self, slot: usize, frame: u64) -> Result<(), TransportError> {
        self.queueing(slot, frame, |s| self.queue_own(s, slot, frame))
    }

    fn queue_own(&self, s: &Slot, slot: usize, frame: u64) -> Result<(), TransportError> {
        let Some(mapped) = s.frame.as_ref() else {
            return Err(TransportError::misuse(
                "this consumer has no frames of its own: it takes acquired EGL frames",
            ));
        };
        s.start
            .record(&self.entry)
            .during("recording a CUDA event")?;
        match (self.config.placement, s.device.as_ref()) {
            (Placement::DeviceCopy(with), Some(device)) => {
                self.copy_frame(with, CopyKernel::FromSystem, &self.entry, device, s, mapped)?;
                s.kernel_start
                    .record(&self.entry)
                    .during("recording a CUDA event")?;
                self.run_work(slot, frame, FrameMemory::Device, DevicePtr::of(device))?;
                s.kernel_end
                    .record(&self.entry)
                    .during("recording a CUDA event")?;
                let exit = self.exit_stream();
                exit.wait_event(&s.kernel_end)
                    .during("ordering the copy back after the kernel")?;
                if !self.read_only {
                    self.copy_frame(with, CopyKernel::ToSystem, exit, device, s, mapped)?;
                }
                s.done.record(exit).during("recording a CUDA event")?;
            }
            _ => {
                s.kernel_start
                    .record(&self.entry)
                    .during("recording a CUDA event")?;
                self.run_work(slot, frame, self.config.memory, DevicePtr::of(mapped))?;
                s.kernel_end
                    .record(&self.entry)
                    .during("recording a CUDA event")?;
                s.done
                    .record(&self.entry)
                    .during("recording a CUDA event")?;
            }
        }
        Ok(())
    }

    /// Queues frame `frame`'s work over `acquired`, an EGL frame acquired
    /// on [`Consumer::entry_stream`] ([`Placement::ReadBack`]): the work on
    /// it in place, then a copy of it into the slot's host buffer. Release the
    /// frame after this (its release is ordered after the work on the same
    /// stream). Crate-private: the frame must have been acquired on the
    /// entry stream, which the guard does not tell.
    pub(crate) fn queue_acquired(
        &self,
        slot: usize,
        frame: u64,
        acquired: &StreamFrame<'_>,
    ) -> Result<(), TransportError> {
        self.queueing(slot, frame, |s| {
            self.queue_over_acquired(s, slot, frame, acquired)
        })
    }

    fn queue_over_acquired(
        &self,
        s: &Slot,
        slot: usize,
        frame: u64,
        acquired: &StreamFrame<'_>,
    ) -> Result<(), TransportError> {
        let Some(host) = s.host.as_ref() else {
            return Err(TransportError::misuse(
                "this consumer was not made for acquired frames (Placement::ReadBack)",
            ));
        };
        // The read-back below writes the host frame: not while a lent frame
        // of it is read. None is lent again before the frame is collected
        // (`lend_host_frame` refuses a slot in flight).
        host.wait_returned(slot)?;
        let host = host.get().pinned();
        let g = self.config.geometry;
        let ptr = {
            let f = acquired.frame().during("reading the acquired frame")?;
            let fits = f.pitch() as usize == g.stride
                && f.height() as usize == g.rows
                && f.plane_count() == 1;
            match (fits, f.plane_ptr(0)) {
                (true, Some(p)) => p,
                _ => {
                    return Err(TransportError::frame_check(slot, frame, format!(
                        "arrived as {}x{} pitch {} with {} plane(s); the ring's frames are {} bytes x {} lines in one pitch plane",
                        f.width(), f.height(), f.pitch(), f.plane_count(), g.stride, g.rows
                    )))
                }
            }
        };
        kernel::check_aligned(ptr, "the acquired frame")?;
        // SAFETY: the acquired frame's plane 0 is `frame_len` bytes at `ptr`
        // (its pitch and height checked above) and stays mapped while the
        // guard lives and, for work queued on the stream it was acquired on
        // (the entry stream, this function's crate-private contract),
        // until its release, which the caller queues after this work.
        let plane = unsafe { DevicePtr::from_raw(ptr) };
        s.start
            .record(&self.entry)
            .during("recording a CUDA event")?;
        s.kernel_start
            .record(&self.entry)
            .during("recording a CUDA event")?;
        self.run_work(slot, frame, FrameMemory::Device, plane)?;
        s.kernel_end
            .record(&self.entry)
            .during("recording a CUDA event")?;
        self.copy_kernel(
            CopyKernel::ToSystem,
            &self.entry,
            DevicePtr::of(host),
            plane,
        )?;
        s.done.record(&self.entry).during("recording a CUDA event")
    }

    /// Queues the work ([`FrameWork::queue`]) over `target`, the frame
    /// `frame` of `slot`, on the entry stream (nothing with `skip_kernel`).
    /// `target` is a frame the consumer owns (the slot's frame or its
    /// device copy) or an acquired frame alive until after this work: the
    /// [`DeviceFrame`] contract holds for work on the entry stream.
    fn run_work(
        &self,
        slot: usize,
        frame: u64,
        memory: FrameMemory,
        target: DevicePtr<'_>,
    ) -> Result<(), TransportError> {
        if self.config.skip_kernel {
            return Ok(());
        }
        let view = DeviceFrame::new(target, self.layout, frame, slot, memory);
        let mut work = self.work()?;
        work.queue(&view, &self.entry)
            .map_err(|e| from_work(e, &**work, Some((slot, frame))))
    }

    /// The work, locked (one caller at a time: queueing or collecting).
    fn work(&self) -> Result<MutexGuard<'_, Box<dyn FrameWork>>, TransportError> {
        self.res
            .work
            .lock()
            .map_err(|_| TransportError::misuse("a thread panicked inside the frame work"))
    }

    /// Copies slot `s`'s frame into its device copy `device`
    /// ([`CopyKernel::FromSystem`]) or back ([`CopyKernel::ToSystem`]) on
    /// `stream`. The host side is the slot's page-locked registration where
    /// it has one ([`Consumer::copy_through_registered`]: the copy engines
    /// read and write it as host memory, `cuMemcpyHtoDAsync` /
    /// `cuMemcpyDtoHAsync`; copy kernels through its device address), else
    /// the imported `mapped` frame.
    fn copy_frame(
        &self,
        with: CopyWith,
        which: CopyKernel,
        stream: &Stream,
        device: &DeviceBuffer,
        s: &Slot,
        mapped: &MappedBuffer,
    ) -> Result<(), TransportError> {
        let len = self.config.geometry.frame_len();
        match (with, s.registered.as_ref().map(|r| r.memory()), which) {
            (CopyWith::Engines, Some(host), CopyKernel::FromSystem) => {
                // SAFETY: both are memory the consumer owns (the
                // registration's host memory outlives it:
                // `copy_through_registered`), at least `len` bytes (checked
                // there; the driver checks the ranges again), alive until
                // the streams are drained (`Drop`); the slot has no other
                // work in flight and the host does not touch them until the
                // frame is collected (see `Consumer`).
                unsafe { device.copy_from_pinned_async(0, host, 0, len, stream) }
                    .during("copying a frame in (cuMemcpyHtoDAsync)")
            }
            (CopyWith::Engines, Some(host), CopyKernel::ToSystem) => {
                // SAFETY: as above.
                unsafe { device.copy_to_pinned_async(0, host, 0, len, stream) }
                    .during("copying a frame back (cuMemcpyDtoHAsync)")
            }
            (_, host, _) => {
                let frame: &dyn DeviceMemory = match host {
                    Some(registered) => registered,
                    None => mapped,
                };
                match which {
                    CopyKernel::FromSystem => self.copy(with, which, stream, device, frame),
                    CopyKernel::ToSystem => self.copy(with, which, stream, frame, device),
                }
            }
        }
    }

    /// Copies a frame between `dst` and `src` (the slot's frame and its
    /// device copy) on `stream`, with the copy engines or a copy kernel.
    fn copy(
        &self,
        with: CopyWith,
        which: CopyKernel,
        stream: &Stream,
        dst: &dyn tegra_interop::driver::DeviceMemory,
        src: &dyn tegra_interop::driver::DeviceMemory,
    ) -> Result<(), TransportError> {
        let len = self.config.geometry.frame_len() as u64;
        match with {
            // SAFETY: both are buffers the consumer owns, at least `len`
            // bytes (checked at `new`; the driver checks the ranges again),
            // alive until the streams are drained (`Drop`); the slot has no
            // other work in flight and the host does not touch them until
            // the frame is collected (see `Consumer`).
            CopyWith::Engines => unsafe { stream.copy_async(dst, 0, src, 0, len) }
                .during("copying a frame (cuMemcpyDtoDAsync)"),
            CopyWith::Kernels => {
                self.copy_kernel(which, stream, DevicePtr::of(dst), DevicePtr::of(src))
            }
        }
    }

    /// Launches a copy kernel of a whole frame from `src` to `dst`.
    fn copy_kernel(
        &self,
        which: CopyKernel,
        stream: &Stream,
        dst: DevicePtr<'_>,
        src: DevicePtr<'_>,
    ) -> Result<(), TransportError> {
        let Some(kernels) = self.res.copies.as_ref() else {
            return Err(TransportError::misuse(
                "the copy kernels were not compiled for this placement",
            ));
        };
        let launch = kernels
            .copy(which)
            .launch(self.grid, BLOCK)
            .arg(dst)
            .arg(src)
            .arg(self.config.geometry.frame_len() as u64);
        // SAFETY: `(unsigned char *, const unsigned char *, u64)` is the copy
        // kernels' parameter list; both ranges are `frame_len` bytes that
        // stay valid until the work completed and that nothing else touches
        // meanwhile (as for `check`).
        unsafe { launch.launch(stream) }.during("launching a copy kernel")
    }

    /// The oldest frame in flight, if its work has finished.
    pub fn try_complete(&self) -> Result<Option<(Completion, FrameTimes)>, TransportError> {
        let Some(slot) = self.progress()?.in_flight.front().copied() else {
            return Ok(None);
        };
        if self.res.slots[slot]
            .done
            .is_complete()
            .during("querying a CUDA event")?
        {
            self.collect(slot)
        } else {
            Ok(None)
        }
    }

    /// Waits at most `limit` for the oldest frame in flight.
    pub fn wait_complete(
        &self,
        limit: Duration,
    ) -> Result<(Completion, FrameTimes), TransportError> {
        let (slot, state) = {
            let p = self.progress()?;
            let Some(slot) = p.in_flight.front().copied() else {
                return Err(TransportError::misuse("no frame is in flight"));
            };
            (slot, p.states[slot])
        };
        let frame = match state {
            SlotState::InFlight { frame, .. } => frame,
            _ => u64::MAX,
        };
        match self.res.slots[slot].done.synchronize(limit) {
            Ok(()) => self.collect(slot)?.ok_or_else(|| {
                TransportError::misuse("another thread collected the frame waited for")
            }),
            Err(DriverError::Timeout { limit, .. }) => Err(TransportError::timeout(
                format!("frame {frame} in slot {slot} to finish on the consumer's stream"),
                limit,
            )),
            Err(e) => Err(TransportError::driver(
                "waiting for the consumer's stream",
                e,
            )),
        }
    }

    /// Takes the result of the frame in `slot` (whose `done` event
    /// completed) if it is still the oldest in flight.
    fn collect(&self, slot: usize) -> Result<Option<(Completion, FrameTimes)>, TransportError> {
        let mut p = self.progress()?;
        if p.in_flight.front() != Some(&slot) {
            return Ok(None);
        }
        let SlotState::InFlight { frame, arrived } = p.states[slot] else {
            return Err(TransportError::misuse(format!(
                "slot {slot} had no frame in flight"
            )));
        };
        p.in_flight.pop_front();
        p.states[slot] = SlotState::Idle { arrived: false };
        drop(p);
        // The work completed before `done` (same stream, or the copy
        // back's stream waited for the work's event).
        let mismatches = {
            let mut work = self.work()?;
            work.finished(slot, frame)
                .map_err(|e| from_work(e, &**work, Some((slot, frame))))?
        };
        let times = self.res.slots[slot].times(arrived)?;
        Ok(Some((
            Completion {
                slot,
                frame,
                mismatches,
                process: times.kernel,
                busy: times.copy_in + times.kernel + times.copy_out,
                finished: Instant::now(),
            },
            times,
        )))
    }

    /// Makes copy mode ([`Placement::DeviceCopy`]) copy each slot's frame in and
    /// out through `registered[slot]`, the same frame's host memory
    /// page-locked in place (`cuMemHostRegister`), instead of through the
    /// imported mapping (measured faster on the copy engines where the
    /// driver registers the memory; see the GPU transport's module docs).
    /// Call it before any frame is queued. The consumer keeps the
    /// registrations until its streams are drained (its drop).
    ///
    /// # Errors
    /// Refused for other work, with frames queued, or with registrations
    /// of the wrong number, shorter than a frame or misaligned.
    // Only the discrete-GPU transport (feature `vulkan`) registers frames.
    #[cfg_attr(not(feature = "vulkan"), allow(dead_code))]
    pub(crate) fn copy_through_registered(
        &mut self,
        registered: Vec<shared::RegisteredFrame>,
    ) -> Result<(), TransportError> {
        if !matches!(self.config.placement, Placement::DeviceCopy(_)) {
            return Err(TransportError::refused(
                "registered frames are the copies' host side: copy mode only",
            ));
        }
        if self.in_flight() != 0 {
            return Err(TransportError::misuse(
                "the copies' host side is chosen before any frame is queued",
            ));
        }
        if registered.len() != self.config.slots {
            return Err(TransportError::refused(format!(
                "{} registered frame(s) for {} slot(s)",
                registered.len(),
                self.config.slots
            )));
        }
        let len = self.config.geometry.frame_len();
        for (index, r) in registered.iter().map(|r| r.memory()).enumerate() {
            if r.len() < len {
                return Err(TransportError::refused(format!(
                    "slot {index}'s registered frame has {} bytes, a frame needs {len}",
                    r.len()
                )));
            }
            kernel::check_aligned(r.device_ptr(), "a slot's registered frame")?;
        }
        for (slot, r) in self.res.slots.iter_mut().zip(registered) {
            slot.registered = Some(r);
        }
        Ok(())
    }

    /// The slot's own frame ([`Placement::InPlace`],
    /// [`Placement::DeviceCopy`]): the mapping the work sees (in place) or
    /// that is copied, for the host's synchronous copies
    /// (`MappedBuffer::copy_from_host` / `copy_to_host`) while the slot is
    /// idle.
    pub fn frame(&self, slot: usize) -> Result<&MappedBuffer, TransportError> {
        self.res
            .slots
            .get(slot)
            .ok_or_else(|| TransportError::no_slot(slot))?
            .frame
            .as_ref()
            .ok_or_else(|| TransportError::misuse("this consumer has no frames of its own"))
    }

    /// Whether `slot` exists and is idle (nothing queued).
    fn check_idle(&mut self, slot: usize) -> Result<(), TransportError> {
        let p = self
            .progress
            .get_mut()
            .map_err(|_| TransportError::misuse("a thread panicked while using the consumer"))?;
        match p.states.get(slot) {
            Some(SlotState::Idle { .. }) => Ok(()),
            Some(other) => Err(TransportError::misuse(format!(
                "slot {slot} is not idle on the consumer ({other:?})"
            ))),
            None => Err(TransportError::no_slot(slot)),
        }
    }

    /// The slot's host frame ([`Placement::ReadBack`]): the last collected
    /// frame's bytes, read back. Refused while the slot has a frame in
    /// flight (`&mut self`: no thread queues meanwhile).
    pub fn host_frame(&mut self, slot: usize) -> Result<&[u8], TransportError> {
        self.check_idle(slot)?;
        match &self.res.slots[slot].host {
            Some(h) => Ok(h.get().bytes()),
            None => Err(TransportError::misuse("this consumer has no host frames")),
        }
    }

    /// The slot's host frame, to write (the camera's next frame, for a
    /// producer that copies it onwards). Refused while in flight.
    pub fn host_frame_mut(&mut self, slot: usize) -> Result<&mut [u8], TransportError> {
        self.check_idle(slot)?;
        match &mut self.res.slots[slot].host {
            Some(h) => Ok(h.get_mut(slot)?.bytes_mut()),
            None => Err(TransportError::misuse("this consumer has no host frames")),
        }
    }

    /// Moves the slot's host frame ([`Placement::ReadBack`]) out, for a write
    /// lease (written on any thread) until [`Consumer::put_host_frame`];
    /// refused while in flight or out already. Lent frames of it are given
    /// back first.
    pub(crate) fn take_host_frame(
        &mut self,
        slot: usize,
    ) -> Result<Lendable<HostFrame>, TransportError> {
        self.check_idle(slot)?;
        let host = self.res.slots[slot].host.take().ok_or_else(|| {
            TransportError::misuse(format!(
                "slot {slot}'s host frame is out for writing (or this consumer has none)"
            ))
        })?;
        if let Err(e) = host.wait_returned(slot) {
            self.res.slots[slot].host = Some(host);
            return Err(e);
        }
        Ok(host)
    }

    /// Takes the slot's host frame back from a write lease.
    pub(crate) fn put_host_frame(
        &mut self,
        slot: usize,
        host: Lendable<HostFrame>,
    ) -> Result<(), TransportError> {
        self.check_idle(slot)?;
        let held = &mut self.res.slots[slot].host;
        if held.is_some() {
            return Err(TransportError::misuse(format!(
                "slot {slot}'s host frame given back while the consumer holds it"
            )));
        }
        *held = Some(host);
        Ok(())
    }

    /// Lends the slot's host frame ([`Placement::ReadBack`]) until the slot's
    /// next ticket: the collected frame's read-back, for the producer's
    /// check on another thread. Refused while in flight.
    pub fn lend_host_frame(&mut self, slot: usize) -> Result<PeekedFrame, TransportError> {
        self.check_idle(slot)?;
        // The lent frame shares the slot's host frame: the read-back of the
        // slot's next frame (`queue_acquired`) and the host's writes
        // (`host_frame_mut`) wait for it to be dropped.
        match &self.res.slots[slot].host {
            Some(h) => h.lend(self.config.geometry.frame_len()),
            None => Err(TransportError::misuse("this consumer has no host frames")),
        }
    }

    /// Waits for everything queued on the consumer's streams (frames not
    /// collected stay in flight).
    pub fn drain(&self) -> Result<(), TransportError> {
        self.entry
            .synchronize()
            .during("draining the consumer's stream")?;
        if let Some(exit) = &self.exit {
            exit.synchronize()
                .during("draining the consumer's copy-back stream")?;
        }
        Ok(())
    }
}

/// The layout `work` sees of frames of `g`: lines of `g.stride` bytes
/// holding whole pixels of the work's format.
fn layout_for(g: FrameGeometry, work: &dyn FrameWork) -> Result<FrameLayout, TransportError> {
    let format = work.pixel_format();
    let bpp = format.bytes_per_pixel();
    let refused = |why: String| {
        TransportError::refused(format!(
            "frame work `{}` reads {format} pixels: {why}",
            work.name()
        ))
    };
    if !g.stride.is_multiple_of(bpp) {
        return Err(refused(format!(
            "a line of {} bytes is not whole pixels",
            g.stride
        )));
    }
    let width = u32::try_from(g.stride / bpp).map_err(|_| refused("lines too wide".into()))?;
    let height = u32::try_from(g.rows).map_err(|_| refused("too many lines".into()))?;
    FrameLayout::with_pitch(width, height, g.stride, format).map_err(|e| refused(e.to_string()))
}

/// A [`WorkError`] of `work` as a [`TransportError`] of the same kind,
/// naming the work (and the frame, where one was being handled).
fn from_work(e: WorkError, work: &dyn FrameWork, at: Option<(usize, u64)>) -> TransportError {
    let name = work.name();
    match (e, at) {
        (WorkError::Driver { doing, source }, _) => {
            TransportError::driver(format!("frame work `{name}`: {doing}"), source)
        }
        (WorkError::Refused(why), _) => {
            TransportError::refused(format!("frame work `{name}`: {why}"))
        }
        (other, Some((slot, frame))) => {
            TransportError::frame_check(slot, frame, format!("frame work `{name}`: {other}"))
        }
        (other, None) => TransportError::new(format!("frame work `{name}`: {other}")),
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        // Queued work may still use the slots' memory and the counters: if
        // the streams cannot be drained, leak them rather than free them
        // under the device.
        if self.drain().is_ok() {
            // SAFETY: dropped once, here, and never used again (this is
            // the consumer's drop).
            unsafe { ManuallyDrop::drop(&mut self.res) };
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::TestPattern;
    use crate::transport::nvsci::Objects;
    use tegra_interop_sim::{Sim, SimConfig};

    const G: FrameGeometry = FrameGeometry {
        stride: 64,
        rows: 8,
    };

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn the_consumer_can_be_shared_between_threads() {
        assert_send_sync::<Consumer>();
    }

    /// A consumer over `slots` NvSciBuf frames imported into CUDA on a
    /// simulated Tegra (with the twins registered).
    fn consumer(sim: &Sim, slots: usize, work: Placement, skip_kernel: bool) -> Consumer {
        twin::register(sim);
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let objects = Objects::allocate(&sim.backend(), &ctx, G.frame_len(), slots).unwrap();
        let frames = objects
            .import_memories(&ctx)
            .unwrap()
            .iter()
            .map(|m| m.map_whole().unwrap())
            .collect();
        let config = ConsumerConfig {
            geometry: G,
            slots,
            memory: FrameMemory::System,
            placement: work,
            skip_kernel,
        };
        Consumer::new(&ctx, config, frames, CheckInvert::boxed()).unwrap()
    }

    /// Runs 7 frames through a 2-slot consumer with `work`, frame 3 with
    /// one damaged byte; checks each result read back from the slot's
    /// frame and returns the completions.
    fn run(sim: &Sim, work: Placement) -> Vec<(Completion, FrameTimes)> {
        let c = consumer(sim, 2, work, false);
        let mut done = Vec::new();
        let check = |c: &Consumer, done: &mut Vec<_>, slot: usize| {
            let (got, times): (Completion, FrameTimes) =
                c.wait_complete(Duration::from_secs(10)).unwrap();
            assert_eq!(got.slot, slot);
            let mut out = vec![0u8; G.frame_len()];
            c.frame(slot).unwrap().copy_to_host(0, &mut out).unwrap();
            let want = TestPattern::new(got.frame, G.stride);
            let bad = want.first_mismatch(&out, 0xff);
            assert_eq!(
                bad,
                (got.frame == 3).then_some(G.frame_len() - 1),
                "{got:?}"
            );
            done.push((got, times));
        };
        for frame in 0..7u64 {
            let slot = (frame % 2) as usize;
            if frame >= 2 {
                check(&c, &mut done, slot);
            }
            let mut bytes = vec![0u8; G.frame_len()];
            TestPattern::new(frame, G.stride).fill(&mut bytes);
            if frame == 3 {
                bytes[G.frame_len() - 1] ^= 0x5a;
            }
            c.frame(slot).unwrap().copy_from_host(0, &bytes).unwrap();
            c.arrive(slot).unwrap();
            c.queue(slot, frame).unwrap();
        }
        check(&c, &mut done, 1);
        check(&c, &mut done, 0);
        assert_eq!(c.in_flight(), 0);
        drop(c);
        assert!(sim.ledger().is_clean(), "{}", sim.ledger());
        assert!(sim.diagnostics().is_empty(), "{:#?}", sim.diagnostics());
        done
    }

    fn counted(log: &[&str], call: &str) -> usize {
        log.iter().filter(|c| **c == call).count()
    }

    #[test]
    fn every_mode_checks_inverts_and_counts_on_the_simulator() {
        for work in [
            Placement::InPlace,
            Placement::DeviceCopy(CopyWith::Engines),
            Placement::DeviceCopy(CopyWith::Kernels),
        ] {
            let sim = Sim::with_config(SimConfig::tegra()).unwrap();
            let done = run(&sim, work);
            let frames: Vec<u64> = done.iter().map(|(c, _)| c.frame).collect();
            assert_eq!(frames, (0..7).collect::<Vec<_>>(), "{work:?}");
            for (c, t) in &done {
                assert_eq!(c.mismatches, u64::from(c.frame == 3), "{work:?} {c:?}");
                assert!(t.wait.is_some(), "{work:?}");
            }
            let log = sim.call_log();
            let (launches, copies) = (
                counted(&log, "cuLaunchKernel"),
                counted(&log, "cuMemcpyDtoDAsync"),
            );
            match work {
                Placement::InPlace => assert_eq!((launches, copies), (7, 0)),
                Placement::DeviceCopy(CopyWith::Engines) => {
                    assert_eq!((launches, copies), (7, 14));
                    assert_eq!(counted(&log, "cuStreamWaitEvent"), 7);
                }
                _ => assert_eq!((launches, copies), (21, 0), "{work:?}"),
            }
        }
    }

    /// A consumer like `consumer`'s, running `work`.
    fn consumer_with(sim: &Sim, placement: Placement, work: Box<dyn FrameWork>) -> Consumer {
        twin::register(sim);
        Invert::register_twin(sim);
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let objects = Objects::allocate(&sim.backend(), &ctx, G.frame_len(), 2).unwrap();
        let frames = objects
            .import_memories(&ctx)
            .unwrap()
            .iter()
            .map(|m| m.map_whole().unwrap())
            .collect();
        let config = ConsumerConfig {
            geometry: G,
            slots: 2,
            memory: FrameMemory::System,
            placement,
            skip_kernel: false,
        };
        Consumer::new(&ctx, config, frames, work).unwrap()
    }

    /// User work in both placements: `Invert` changes the slot's frame
    /// (in place, or through the device copy and its copy back), and a
    /// closure sees the view the contract promises (the slot's frame or
    /// a device-local copy of it, the layout, number and slot).
    #[test]
    fn user_work_runs_on_every_frame_in_both_placements() {
        let placements = [
            Placement::InPlace,
            Placement::DeviceCopy(CopyWith::Engines),
            Placement::DeviceCopy(CopyWith::Kernels),
        ];
        for placement in placements {
            let sim = Sim::with_config(SimConfig::tegra()).unwrap();
            let c = consumer_with(&sim, placement, Box::new(Invert::new()));
            for frame in 0..5u64 {
                let slot = (frame % 2) as usize;
                let bytes: Vec<u8> = (0..G.frame_len())
                    .map(|i| (i as u64 + frame) as u8)
                    .collect();
                c.frame(slot).unwrap().copy_from_host(0, &bytes).unwrap();
                c.queue(slot, frame).unwrap();
                let (done, _) = c.wait_complete(Duration::from_secs(10)).unwrap();
                assert_eq!((done.slot, done.frame, done.mismatches), (slot, frame, 0));
                let mut out = vec![0u8; G.frame_len()];
                c.frame(slot).unwrap().copy_to_host(0, &mut out).unwrap();
                let want: Vec<u8> = bytes.iter().map(|b| !b).collect();
                assert_eq!(out, want, "{placement:?} frame {frame}");
            }
            drop(c);
            assert!(sim.ledger().is_clean(), "{}", sim.ledger());

            let seen = Arc::new(Mutex::new(Vec::new()));
            let log = Arc::clone(&seen);
            let work = FnWork::new("look", move |f: &DeviceFrame<'_>, _: &Stream| {
                let l = f.layout();
                log.lock()
                    .unwrap()
                    .push((f.ptr().addr(), f.number(), f.slot(), f.memory(), l));
                Ok(())
            });
            let c = consumer_with(&sim, placement, Box::new(work));
            c.queue(1, 7).unwrap();
            c.wait_complete(Duration::from_secs(10)).unwrap();
            let (addr, number, slot, memory, layout) = seen.lock().unwrap()[0];
            assert_eq!((number, slot), (7, 1));
            assert_eq!(
                (layout.pitch(), layout.height() as usize),
                (G.stride, G.rows)
            );
            assert_eq!(layout.format(), crate::frame::PixelFormat::Gray8);
            let own = c.frame(1).unwrap().device_ptr();
            match placement {
                Placement::InPlace => assert_eq!((addr, memory), (own, FrameMemory::System)),
                _ => {
                    assert_ne!(addr, own, "copy placement shows the device copy");
                    assert_eq!(memory, FrameMemory::Device);
                }
            }
        }
    }

    /// A work error names the work and the frame; a work that refuses the
    /// layout stops the consumer before any frame.
    #[test]
    fn work_errors_name_the_work_and_the_frame() {
        let sim = Sim::with_config(SimConfig::tegra()).unwrap();
        let failing = FnWork::new("failing", |_: &DeviceFrame<'_>, _: &Stream| {
            Err(WorkError::failed("out of paint"))
        });
        let c = consumer_with(&sim, Placement::InPlace, Box::new(failing));
        let e = c.queue(0, 4).unwrap_err();
        assert!(
            matches!(
                e,
                TransportError::FrameCheck {
                    slot: 0,
                    frame: 4,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("frame work `failing`: out of paint"),
            "{e}"
        );

        struct Rgba;
        impl FrameWork for Rgba {
            fn name(&self) -> &str {
                "rgba"
            }
            fn pixel_format(&self) -> crate::frame::PixelFormat {
                crate::frame::PixelFormat::Rgba8
            }
            fn prepare(
                &mut self,
                _: &Context,
                layout: FrameLayout,
                _: usize,
                _: Placement,
            ) -> Result<(), WorkError> {
                Err(WorkError::refused(format!("not {layout}")))
            }
            fn queue(&mut self, _: &DeviceFrame<'_>, _: &Stream) -> Result<(), WorkError> {
                Ok(())
            }
        }
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let config = ConsumerConfig {
            geometry: G,
            slots: 1,
            memory: FrameMemory::Device,
            placement: Placement::ReadBack,
            skip_kernel: false,
        };
        let e = Consumer::new(&ctx, config, Vec::new(), Box::new(Rgba)).unwrap_err();
        assert!(matches!(e, TransportError::Refused { .. }), "{e:?}");
        assert!(e.to_string().contains("not 16x8 RGBA (pitch 64)"), "{e}");
        let odd = ConsumerConfig {
            geometry: FrameGeometry {
                stride: 66,
                rows: 8,
            },
            ..config
        };
        let e = Consumer::new(&ctx, odd, Vec::new(), Box::new(Rgba)).unwrap_err();
        assert!(
            e.to_string().contains("66 bytes is not whole pixels"),
            "{e}"
        );
    }

    #[test]
    fn a_slot_in_flight_is_refused_and_nothing_is_collected_twice() {
        let sim = Sim::with_config(SimConfig::tegra()).unwrap();
        let c = consumer(&sim, 2, Placement::InPlace, false);
        let e = c.wait_complete(Duration::from_millis(10)).unwrap_err();
        assert!(matches!(e, TransportError::Misuse { .. }), "{e:?}");
        c.queue(0, 0).unwrap();
        let e = c.queue(0, 2).unwrap_err();
        assert!(matches!(e, TransportError::Misuse { .. }), "{e:?}");
        assert!(e.to_string().contains("slot 0 is not idle"), "{e}");
        assert!(matches!(c.queue(5, 0), Err(TransportError::Misuse { .. })));
        let (done, _) = c.wait_complete(Duration::from_secs(10)).unwrap();
        assert_eq!((done.slot, done.frame), (0, 0));
        assert!(c.try_complete().unwrap().is_none());
        // The slot is idle again.
        c.queue(0, 2).unwrap();
        assert_eq!(c.wait_complete(Duration::from_secs(10)).unwrap().0.frame, 2);
    }

    #[test]
    fn skipping_the_kernel_counts_nothing_and_leaves_the_frame() {
        let sim = Sim::with_config(SimConfig::tegra()).unwrap();
        let c = consumer(&sim, 1, Placement::InPlace, true);
        let mut bytes = vec![0u8; G.frame_len()];
        TestPattern::new(0, G.stride).fill(&mut bytes);
        c.frame(0).unwrap().copy_from_host(0, &bytes).unwrap();
        c.queue(0, 0).unwrap();
        let (done, _) = c.wait_complete(Duration::from_secs(10)).unwrap();
        assert_eq!(done.mismatches, 0);
        let mut out = vec![0u8; G.frame_len()];
        c.frame(0).unwrap().copy_to_host(0, &mut out).unwrap();
        assert_eq!(out, bytes, "not inverted");
        assert!(!sim.call_log().contains(&"cuLaunchKernel"));
    }

    use tegra_interop::driver::RegisteredHostMemory;

    /// Page-aligned host memory of the test, freed on drop.
    struct HostPages(std::ptr::NonNull<u8>, std::alloc::Layout);

    impl HostPages {
        fn new(len: usize) -> HostPages {
            let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
            // SAFETY: a non-zero size.
            let p = unsafe { std::alloc::alloc_zeroed(layout) };
            HostPages(std::ptr::NonNull::new(p).unwrap(), layout)
        }

        /// A copy of the first `n` bytes (read while no copy of the slot
        /// runs: after its frame was collected).
        fn read(&self, n: usize) -> Vec<u8> {
            // SAFETY: `n` <= the allocation's length; nothing writes it now.
            unsafe { std::slice::from_raw_parts(self.0.as_ptr(), n) }.to_vec()
        }

        fn write(&self, data: &[u8]) {
            // SAFETY: `data` fits (the callers' frames are shorter than a
            // page); nothing reads it now (no frame of the slot queued).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.0.as_ptr(), data.len()) };
        }
    }

    impl Drop for HostPages {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with this layout; unregistered
            // before (the consumer that held the registration dropped first).
            unsafe { std::alloc::dealloc(self.0.as_ptr(), self.1) };
        }
    }

    /// With registrations given, copy mode reads and writes the frames
    /// through them (here separate host memory, so the path shows: the
    /// imports stay untouched), and refuses them where they do not fit.
    #[test]
    fn copy_mode_copies_through_registered_memory_when_given() {
        let sim = Sim::with_config(SimConfig::tegra()).unwrap();
        let pages = [HostPages::new(4096), HostPages::new(4096)];
        let spare = HostPages::new(4096);
        let mut c = consumer(&sim, 2, Placement::DeviceCopy(CopyWith::Engines), false);
        let register = |p: &HostPages| {
            // SAFETY: `pages` and `spare` outlive the consumer (declared
            // before it) and the refused registration; the
            // host touches them only while no copy of their slot runs.
            unsafe {
                RegisteredHostMemory::register(
                    c.context(),
                    p.0,
                    4096,
                    tegra_interop::driver::HostRegistration::Memory,
                )
            }
            .map(shared::RegisteredFrame::new)
            .unwrap()
        };
        let regs: Vec<_> = pages.iter().map(register).collect();
        let one = vec![register(&spare)];
        let e = c.copy_through_registered(one).unwrap_err();
        assert!(matches!(e, TransportError::Refused { .. }), "{e:?}");
        c.copy_through_registered(regs).unwrap();
        let n = G.frame_len();
        let check = |c: &Consumer, slot: usize| {
            let (got, _) = c.wait_complete(Duration::from_secs(10)).unwrap();
            assert_eq!(got.slot, slot);
            let want = TestPattern::new(got.frame, G.stride);
            let bad = want.first_mismatch(&pages[slot].read(n), 0xff);
            assert_eq!(
                bad, None,
                "frame {} read back from the registered memory",
                got.frame
            );
        };
        for frame in 0..5u64 {
            let slot = (frame % 2) as usize;
            if frame >= 2 {
                check(&c, slot);
            }
            let mut bytes = vec![0u8; n];
            TestPattern::new(frame, G.stride).fill(&mut bytes);
            pages[slot].write(&bytes);
            c.arrive(slot).unwrap();
            c.queue(slot, frame).unwrap();
        }
        check(&c, 1);
        check(&c, 0);
        for slot in 0..2 {
            let mut out = vec![1u8; n];
            c.frame(slot).unwrap().copy_to_host(0, &mut out).unwrap();
            assert!(
                out.iter().all(|b| *b == 0),
                "slot {slot}'s import was written"
            );
        }
        let log = sim.call_log();
        let copies = [
            "cuMemcpyHtoDAsync",
            "cuMemcpyDtoHAsync",
            "cuMemcpyDtoDAsync",
        ];
        let counts = copies.map(|call| counted(&log, call));
        assert_eq!(counts, [5, 5, 0], "host copies of the registered memory");
        drop(c);
        assert_eq!(sim.ledger().live_host_allocations, 0, "{}", sim.ledger());
        // Zero-copy work has no copies to route.
        let sim = Sim::with_config(SimConfig::tegra()).unwrap();
        let mut c = consumer(&sim, 1, Placement::InPlace, false);
        let e = c.copy_through_registered(Vec::new()).unwrap_err();
        assert!(matches!(e, TransportError::Refused { .. }), "{e:?}");
    }

    #[test]
    fn a_wrong_frame_count_or_size_is_refused_before_anything_is_made() {
        let sim = Sim::with_config(SimConfig::tegra()).unwrap();
        twin::register(&sim);
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let config = ConsumerConfig {
            geometry: G,
            slots: 2,
            memory: FrameMemory::System,
            placement: Placement::InPlace,
            skip_kernel: false,
        };
        let e = Consumer::new(&ctx, config, Vec::new(), CheckInvert::boxed()).unwrap_err();
        assert!(matches!(e, TransportError::Refused { .. }), "{e:?}");
        assert!(!sim.call_log().contains(&"nvrtcCompileProgram"));
        let zero = ConsumerConfig { slots: 0, ..config };
        assert!(matches!(
            Consumer::new(&ctx, zero, Vec::new(), CheckInvert::boxed()),
            Err(TransportError::Refused { .. })
        ));
    }
}
