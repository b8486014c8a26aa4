//! The CUDA process of the fd two-process mode: receives the slots' memory
//! and timeline semaphores as fds (checked before any import), imports
//! them into CUDA and drives the ring: per frame the ticket goes to the
//! camera, which writes the frame; the consumer's stream waits for
//! *ready*, runs the user's work ([`CheckInvert`]) and signals *free*.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Instant;

use tegra_interop::core::{MemoryImport, SignalParams, WaitParams};
use tegra_interop::driver::{Backend, Context, ExternalMemory, ExternalSemaphore, MappedBuffer};

use super::error::{Peer, ProcessError};
use super::fd::fd_err;
use super::fd_camera::hello_of;
use super::summary::Timings;
use super::Settings;
use crate::app::cli::BackendChoice;
use crate::app::stats::Summary as Stat;
use crate::consumer::{CheckInvert, Consumer, ConsumerConfig, FrameMemory, Placement};
use crate::slots::{Collected, SlotState, Slots};
use crate::transport::fdpass::{check_memory_fd, Channel, FdMsg, SemRole};
use crate::transport::host::Fault;
use crate::transport::{Completion, TransportError};

/// The most a memory fd whose size `fstat` cannot tell (a driver's opaque
/// handle) may declare: the frame rounded up to this (an exporter's
/// allocation granularity; Vulkan's is at most 2 MiB for these buffers).
const OPAQUE_GRANULE: u64 = 2 << 20;

/// Both sides' figures of an fd two-process run.
#[derive(Debug)]
pub(crate) struct FdSummary {
    pub(super) backend: &'static str,
    pub(super) exporter: &'static str,
    pub(super) note: Option<&'static str>,
    pub(super) frames: u64,
    pub(super) collected: u64,
    pub(super) mismatches: u64,
    pub(super) bad_frames: u64,
    pub(super) cuda_pid: u32,
    pub(super) cuda_us: u64,
    pub(super) camera_pid: u64,
    pub(super) camera_verified: u64,
    pub(super) camera_failed: u64,
    pub(super) camera_write_us: u64,
    pub(super) camera_us: u64,
    pub(super) latency: Option<Stat>,
    pub(super) write: Option<Stat>,
    pub(super) process: Option<Stat>,
    pub(super) queued: Option<Stat>,
}

fn transport_err(e: TransportError) -> ProcessError {
    ProcessError::Consumer(e.to_string())
}

fn driver(what: &'static str) -> impl FnOnce(tegra_interop::driver::Error) -> ProcessError {
    move |source| ProcessError::Driver { what, source }
}

/// This process's CUDA: the simulator (with the consumer kernels' twins)
/// for `sim-fd`, the real driver for `gpu`.
struct Cuda {
    backend: Arc<Backend>,
    _sim: Option<tegra_interop_sim::Sim>,
}

fn cuda(settings: &Settings) -> Result<Cuda, ProcessError> {
    if settings.backend == BackendChoice::SimFd {
        let sim = tegra_interop_sim::Sim::new()
            .map_err(|e| ProcessError::Options(format!("the simulator: {e}")))?;
        crate::consumer::twin::register(&sim);
        return Ok(Cuda {
            backend: sim.backend(),
            _sim: Some(sim),
        });
    }
    let backend = Backend::real().map_err(driver("the CUDA driver"))?;
    Ok(Cuda {
        backend,
        _sim: None,
    })
}

/// One slot's imports (the semaphores; the frame's mapping went to the
/// consumer).
struct SlotSems {
    ready: ExternalSemaphore,
    free: ExternalSemaphore,
}

/// The CUDA side's objects; field order is drop order: the consumer
/// (streams drained) before the semaphores its streams used, the context
/// and the simulator last.
struct Side {
    consumer: Consumer,
    sems: Vec<SlotSems>,
    ch: Channel,
    _ctx: Context,
    _cuda: Cuda,
}

/// Runs the CUDA side over `ch`: set-up, every frame through the ring, the
/// camera's figures.
pub(super) fn run(settings: &Settings, mut ch: Channel) -> Result<FdSummary, ProcessError> {
    let c = cuda(settings)?;
    let ctx = Context::new(Arc::clone(&c.backend), 0).map_err(driver("a CUDA context"))?;
    ch.send_msg(&FdMsg::Hello(hello_of(settings)), &[])
        .map_err(fd_err(Peer::Camera))?;
    let (frames, sems) = receive_slots(&mut ch, &ctx, settings)?;
    let config = ConsumerConfig {
        geometry: settings.geometry,
        slots: settings.ring,
        memory: FrameMemory::System,
        placement: Placement::InPlace,
        skip_kernel: settings.fault == Fault::SkipProcess,
    };
    let consumer =
        Consumer::new(&ctx, config, frames, CheckInvert::boxed()).map_err(transport_err)?;
    let mut side = Side {
        consumer,
        sems,
        ch,
        _ctx: ctx,
        _cuda: c,
    };
    side.frames(settings)
}

/// Receives and imports every slot's fds, in slot order, then `set-up`.
fn receive_slots(
    ch: &mut Channel,
    ctx: &Context,
    settings: &Settings,
) -> Result<(Vec<MappedBuffer>, Vec<SlotSems>), ProcessError> {
    let (mut frames, mut sems) = (Vec::new(), Vec::new());
    for slot in 0..settings.ring as u64 {
        let (msg, fd) = next_fd(ch, &|| format!("slot {slot}'s memory"))?;
        let FdMsg::Memory {
            slot: s,
            size,
            dedicated,
        } = msg
        else {
            return Err(protocol(format!("{msg:?} instead of slot {slot}'s memory")));
        };
        if s != slot {
            return Err(protocol(format!(
                "slot {s}'s memory instead of slot {slot}'s"
            )));
        }
        frames.push(import_memory(ctx, fd, size, dedicated, settings)?);
        let mut pair = Vec::with_capacity(2);
        for role in [SemRole::Ready, SemRole::Free] {
            let (msg, fd) = next_fd(ch, &|| format!("slot {slot}'s {role:?} semaphore"))?;
            if msg != (FdMsg::Semaphore { slot, role }) {
                return Err(protocol(format!(
                    "{msg:?} instead of slot {slot}'s {role:?} semaphore"
                )));
            }
            let sem = ExternalSemaphore::timeline_fd(ctx, fd)
                .map_err(|e| driver("importing a timeline semaphore")(e.into_parts().0))?;
            pair.push(sem);
        }
        let free = pair.pop();
        let ready = pair.pop();
        if let (Some(ready), Some(free)) = (ready, free) {
            sems.push(SlotSems { ready, free });
        }
    }
    match ch.recv_msg(&|| "the end of the set-up".into()) {
        Ok((FdMsg::SetUp, _)) => Ok((frames, sems)),
        Ok((other, _)) => Err(protocol(format!(
            "{other:?} instead of the end of the set-up"
        ))),
        Err(e) => Err(fd_err(Peer::Camera)(e)),
    }
}

fn protocol(detail: String) -> ProcessError {
    ProcessError::Protocol {
        peer: Peer::Camera,
        detail,
    }
}

/// The next message, which must carry one fd.
fn next_fd(ch: &mut Channel, what: &dyn Fn() -> String) -> Result<(FdMsg, OwnedFd), ProcessError> {
    let (msg, mut fds) = ch.recv_msg(what).map_err(fd_err(Peer::Camera))?;
    match fds.pop() {
        Some(fd) => Ok((msg, fd)),
        None => Err(protocol(format!(
            "{msg:?} without an fd, waiting for {}",
            what()
        ))),
    }
}

/// Checks a memory fd's declared size (against the frame and `fstat`),
/// then imports and maps it.
fn import_memory(
    ctx: &Context,
    fd: OwnedFd,
    size: u64,
    dedicated: bool,
    settings: &Settings,
) -> Result<MappedBuffer, ProcessError> {
    let len = settings.geometry.frame_len() as u64;
    let most = len.div_ceil(OPAQUE_GRANULE).max(1) * OPAQUE_GRANULE;
    check_memory_fd(std::os::fd::AsFd::as_fd(&fd), size, len, most)
        .map_err(fd_err(Peer::Camera))?;
    let mut import = MemoryImport::opaque_fd(fd.as_raw_fd(), size)
        .map_err(|e| protocol(format!("a memory import of {size} bytes: {e}")))?;
    if dedicated {
        import = import.dedicated();
    }
    ExternalMemory::import_fd(ctx, fd, import)
        .map_err(|e| driver("importing a slot's memory")(e.into_parts().0))?
        .map_whole()
        .map_err(driver("mapping a slot's memory"))
}

impl Side {
    /// Every frame through the ring, then the camera's figures.
    fn frames(&mut self, settings: &Settings) -> Result<FdSummary, ProcessError> {
        let mut ring = Slots::new(settings.ring).map_err(|e| ProcessError::Ring(e.to_string()))?;
        let mut t = Timings::new()?;
        let mut s = self.summary(settings);
        let mut each = |c: &Completion, col: &Collected| {
            s.collected += 1;
            s.mismatches += c.mismatches;
            s.bad_frames += u64::from(c.mismatches != 0);
            let latency = c.finished.saturating_duration_since(col.rec.started);
            t.latency.push(latency.as_nanos() as u64);
            t.write.push(col.rec.write_ns);
            t.process.push(c.process.as_nanos() as u64);
            t.queued.push(col.queued.as_nanos() as u64);
        };
        let start = Instant::now();
        for _ in 0..settings.frames {
            self.one_frame(&mut ring, settings, &mut each)?;
        }
        while ring.in_flight() > 0 {
            self.collect(&mut ring, settings, true, &mut each)?;
        }
        s.cuda_us = start.elapsed().as_micros() as u64;
        (s.latency, s.write) = (t.latency.summary(), t.write.summary());
        (s.process, s.queued) = (t.process.summary(), t.queued.summary());
        self.finish(s)
    }

    fn summary(&self, settings: &Settings) -> FdSummary {
        let sim = settings.backend == BackendChoice::SimFd;
        FdSummary {
            backend: if sim { "fd-sim" } else { "fd-vulkan-cuda" },
            exporter: if sim { "sim-memfd" } else { "vulkan" },
            note: sim.then_some(
                "sim: the consumer's kernel runs as its Rust twin over simulated device memory",
            ),
            frames: settings.frames,
            collected: 0,
            mismatches: 0,
            bad_frames: 0,
            cuda_pid: std::process::id(),
            cuda_us: 0,
            camera_pid: 0,
            camera_verified: 0,
            camera_failed: 0,
            camera_write_us: 0,
            camera_us: 0,
            latency: None,
            write: None,
            process: None,
            queued: None,
        }
    }

    /// Collects one finished frame (waiting at most the limit when
    /// `block`); whether one was collected.
    fn collect(
        &mut self,
        ring: &mut Slots,
        settings: &Settings,
        block: bool,
        each: &mut impl FnMut(&Completion, &Collected),
    ) -> Result<bool, ProcessError> {
        let c = match block {
            true => self.consumer.wait_complete(settings.limit),
            false => match self.consumer.try_complete() {
                Ok(Some(c)) => Ok(c),
                Ok(None) => return Ok(false),
                Err(e) => Err(e),
            },
        };
        let (c, _times) = c.map_err(transport_err)?;
        let col = ring
            .complete(&c)
            .map_err(|e| ProcessError::Ring(e.to_string()))?;
        each(&c, &col);
        Ok(true)
    }

    /// One frame: collect until its slot is free, hand its ticket to the
    /// camera (which writes it), queue wait(ready) -> work -> signal(free).
    fn one_frame(
        &mut self,
        ring: &mut Slots,
        settings: &Settings,
        each: &mut impl FnMut(&Completion, &Collected),
    ) -> Result<(), ProcessError> {
        while self.collect(ring, settings, false, each)? {}
        while matches!(ring.state(ring.next_slot()), Some(SlotState::InFlight(_))) {
            self.collect(ring, settings, true, each)?;
        }
        let ring_err = |e: crate::slots::RingError| ProcessError::Ring(e.to_string());
        let t = ring.acquire().map_err(ring_err)?;
        let (frame, slot) = (t.frame(), t.slot());
        let sent = Instant::now();
        let ticket = FdMsg::Ticket {
            frame,
            slot: slot as u64,
            free_wait: t.free_wait(),
            ready: t.ready(),
            previous: t.previous_frame(),
        };
        self.ch
            .send_msg(&ticket, &[])
            .map_err(fd_err(Peer::Camera))?;
        let write_ns = match self.ch.recv_msg(&|| format!("frame {frame} to be written")) {
            Ok((FdMsg::Written { frame: f, write_ns }, _)) if f == frame => write_ns,
            Ok((other, _)) => {
                return Err(protocol(format!(
                    "{other:?} instead of frame {frame} written"
                )))
            }
            Err(e) => return Err(fd_err(Peer::Camera)(e)),
        };
        ring.release(&t, sent, write_ns).map_err(ring_err)?;
        let sl = self
            .sems
            .get_mut(slot)
            .ok_or_else(|| ProcessError::Ring(format!("no semaphores for slot {slot}")))?;
        // The camera published *ready* before it answered: on the simulator
        // the wait is already satisfied; on a GPU its batch was submitted.
        self.consumer
            .entry_stream()
            .wait(&sl.ready, WaitParams::timeline(t.ready()))
            .map_err(driver("queueing the wait for ready"))?;
        self.consumer.queue(slot, frame).map_err(transport_err)?;
        self.consumer
            .exit_stream()
            .signal(&mut sl.free, SignalParams::timeline(t.free_signal()))
            .map_err(driver("queueing the free signal"))?;
        ring.submit(&t).map_err(ring_err)?;
        Ok(())
    }

    /// Every frame processed: the camera checks its last frames and sends
    /// its figures.
    fn finish(&mut self, mut s: FdSummary) -> Result<FdSummary, ProcessError> {
        self.ch
            .send_msg(&FdMsg::End, &[])
            .map_err(fd_err(Peer::Camera))?;
        match self.ch.recv_msg(&|| "its figures".into()) {
            Ok((
                FdMsg::Figures {
                    pid,
                    verified,
                    failed,
                    write_us_per_frame,
                    elapsed_us,
                },
                _,
            )) => {
                s.camera_pid = pid;
                s.camera_verified = verified;
                s.camera_failed = failed;
                s.camera_write_us = write_us_per_frame;
                s.camera_us = elapsed_us;
                Ok(s)
            }
            Ok((other, _)) => Err(protocol(format!("{other:?} instead of its figures"))),
            Err(e) => Err(fd_err(Peer::Camera)(e)),
        }
    }
}
