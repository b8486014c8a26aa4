//! The CUDA side of the discrete-GPU transport: the streams, the per-slot
//! imports and events, the enqueue thread that queues each frame's work and
//! the completion thread that timestamps each frame's end (see the parent
//! module's docs for the design, and "Copy mode: three streams" there for
//! how the copy-based variant overlaps its two copies).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tegra_interop::core::{SignalParams, WaitParams};
use tegra_interop::driver::{
    Context, DeviceBuffer, DeviceMemory, Event, EventFlags, ExternalSemaphore, MappedBuffer,
    PinnedHostBuffer, Stream,
};

use super::{err, CopyWith, Mode, TEARDOWN_WAIT};
use crate::app::baseline::limit::Kernels;
use crate::transport::{FrameGeometry, TransportError};

/// CUDA events of one slot, created once and recorded for every frame.
pub(super) struct SlotEvents {
    /// Before the stream's wait for *ready*.
    pub(super) arrive: Event,
    /// After the stream's wait for *ready*.
    pub(super) start: Event,
    /// Before the kernel (after the copy in, in copy mode).
    pub(super) kernel_start: Event,
    /// After the kernel (in copy mode also what the copy-out stream waits
    /// for).
    pub(super) kernel_end: Event,
    /// After everything of the frame, *free* signal included (in copy mode
    /// also what the slot's next copy in waits for: its device buffer is
    /// read by this frame's copy out until then).
    pub(super) end: Event,
}

impl SlotEvents {
    fn new(ctx: &Context) -> Result<SlotEvents, TransportError> {
        let make =
            || Event::new(ctx, EventFlags::DEFAULT).map_err(|e| err("creating a CUDA event")(&e));
        Ok(SlotEvents {
            arrive: make()?,
            start: make()?,
            kernel_start: make()?,
            kernel_end: make()?,
            end: make()?,
        })
    }

    /// One set of events per slot.
    pub(super) fn per_slot(
        ctx: &Context,
        slots: usize,
    ) -> Result<Arc<Vec<SlotEvents>>, TransportError> {
        (0..slots)
            .map(|_| SlotEvents::new(ctx))
            .collect::<Result<Vec<_>, _>>()
            .map(Arc::new)
    }
}

/// Work for the completion thread: a submitted frame.
pub(super) struct Job {
    pub(super) slot: usize,
    pub(super) frame: u64,
}

/// A frame the completion thread saw finish.
pub(super) struct Done {
    pub(super) slot: usize,
    pub(super) frame: u64,
    pub(super) finished: Instant,
}

/// Waits for one frame's end event; after teardown began, at most
/// [`TEARDOWN_WAIT`].
fn wait_end(event: &Event, job: &Job, stopping: &AtomicBool) -> Result<Done, TransportError> {
    let mut stop_seen: Option<Instant> = None;
    loop {
        match event.is_complete() {
            Ok(true) => {
                return Ok(Done {
                    slot: job.slot,
                    frame: job.frame,
                    finished: Instant::now(),
                })
            }
            Ok(false) => {}
            Err(e) => return Err(err("the consumer stream failed")(&e)),
        }
        if stopping.load(Ordering::Acquire) {
            let since = *stop_seen.get_or_insert_with(Instant::now);
            if since.elapsed() > TEARDOWN_WAIT {
                return Err(TransportError::new(format!(
                    "frame {} in slot {} did not finish within {TEARDOWN_WAIT:?} of teardown",
                    job.frame, job.slot
                )));
            }
        }
        thread::yield_now();
    }
}

/// Waits, in submission order, for each frame's end event and reports when
/// it completed.
pub(super) fn completion_loop(
    events: Arc<Vec<SlotEvents>>,
    jobs: Receiver<Job>,
    done: SyncSender<Result<Done, TransportError>>,
    stopping: Arc<AtomicBool>,
) {
    while let Ok(job) = jobs.recv() {
        let result = match events.get(job.slot) {
            Some(ev) => wait_end(&ev.end, &job, &stopping),
            None => Err(TransportError::new(format!("no slot {}", job.slot))),
        };
        let failed = result.is_err();
        if done.send(result).is_err() || failed {
            return;
        }
    }
}

/// One frame's consumer work, as the producer asked for it
/// ([`crate::transport::FrameTransport::queue_consumer`]).
pub(super) struct Request {
    pub(super) slot: usize,
    pub(super) frame: u64,
    /// The *ready* value to wait for.
    pub(super) ready: u64,
    /// The *free* value to signal.
    pub(super) free: u64,
}

/// The CUDA objects of one ring slot.
pub(super) struct CudaSlot {
    /// The imported *ready* semaphore (waited for on the first stream).
    pub(super) ready: ExternalSemaphore,
    /// The imported *free* semaphore (signalled on the last stream).
    pub(super) free: ExternalSemaphore,
    /// The frame's import, mapped whole (it holds its import, and so the
    /// context).
    pub(super) mapped: MappedBuffer,
    /// Copy mode: the slot's device-local buffer.
    pub(super) device: Option<DeviceBuffer>,
}

/// The streams the consumer's work goes to.
pub(super) struct Streams {
    /// Waits for *ready*, copies in (copy mode) and runs the kernel; in
    /// zero-copy mode everything of a frame.
    pub(super) first: Stream,
    /// Copy mode: waits for the kernel, copies out, signals *free*.
    pub(super) out: Option<Stream>,
}

impl Streams {
    /// One stream in zero-copy mode, two in copy mode.
    pub(super) fn new(ctx: &Context, mode: Mode) -> Result<Streams, TransportError> {
        let make = || Stream::new(ctx).map_err(|e| err("creating a CUDA stream")(&e));
        Ok(Streams {
            first: make()?,
            out: match mode {
                Mode::ZeroCopy => None,
                Mode::DeviceCopy => Some(make()?),
            },
        })
    }

    /// The stream that signals *free* and records the frame's end.
    fn last(&self) -> &Stream {
        self.out.as_ref().unwrap_or(&self.first)
    }

    /// Waits until every queued piece of work finished.
    pub(super) fn synchronize(&self) -> Result<(), TransportError> {
        for s in std::iter::once(&self.first).chain(&self.out) {
            s.synchronize()
                .map_err(|e| err("draining a CUDA stream")(&e))?;
        }
        Ok(())
    }
}

/// The CUDA side of the transport: everything the consumer's work is queued
/// with. It lives on the enqueue thread ([`enqueue_loop`]), so the
/// producer's thread does not spend the ~30-50 us of driver calls per frame
/// (event records, the wait, the launch, the signal) between two frames.
pub(super) struct Enqueuer {
    pub(super) geometry: FrameGeometry,
    pub(super) mode: Mode,
    pub(super) copy_with: CopyWith,
    pub(super) slots: Vec<CudaSlot>,
    /// One mismatch counter per slot, word `slot` of pinned mapped host
    /// memory (shared with the producer's collection, which takes each
    /// count).
    pub(super) counters: Arc<PinnedHostBuffer>,
    pub(super) events: Arc<Vec<SlotEvents>>,
    pub(super) streams: Streams,
    pub(super) kernels: Kernels,
    pub(super) ctx: Context,
}

fn record(e: &Event, on: &Stream) -> Result<(), TransportError> {
    e.record(on).map_err(|x| err("recording a CUDA event")(&x))
}

/// Which way a frame is copied (copy mode).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// From the imported frame into the slot's device buffer.
    In,
    /// From the slot's device buffer back into the imported frame.
    Out,
}

impl Enqueuer {
    /// Queues the consumer's work for the requested frame (see
    /// [`crate::transport::FrameTransport::queue_consumer`]): on the first
    /// stream the wait for *ready*, the copy in (copy mode) and the kernel;
    /// in copy mode the copy out on the second stream, which waits for the
    /// kernel; then the *free* signal and the end event on the last stream.
    pub(super) fn enqueue(&mut self, r: &Request) -> Result<(), TransportError> {
        let events = Arc::clone(&self.events);
        let ev = events
            .get(r.slot)
            .ok_or_else(|| TransportError::new(format!("no slot {}", r.slot)))?;
        let first = &self.streams.first;
        record(&ev.arrive, first)?;
        first
            .wait(&self.slots[r.slot].ready, WaitParams::timeline(r.ready))
            .map_err(|e| err("CUDA wait for the ready fence")(&e))?;
        record(&ev.start, first)?;
        if self.mode == Mode::DeviceCopy {
            // The slot's device buffer is read by its previous frame's copy
            // out (on the other stream) until that frame's end event.
            first
                .wait_event(&ev.end)
                .map_err(|e| err("ordering the copy in after the slot's last copy out")(&e))?;
            self.copy(r.slot, Direction::In)?;
        }
        record(&ev.kernel_start, first)?;
        self.launch(r)?;
        record(&ev.kernel_end, first)?;
        if self.mode == Mode::DeviceCopy {
            self.streams
                .last()
                .wait_event(&ev.kernel_end)
                .map_err(|e| err("ordering the copy out after the kernel")(&e))?;
            self.copy(r.slot, Direction::Out)?;
        }
        self.signal_free(r)?;
        record(&ev.end, self.streams.last())
    }

    /// Queues the check-and-invert kernel of `r`'s frame on the first
    /// stream, over the imported frame (zero-copy) or the slot's device
    /// buffer (copy mode).
    fn launch(&self, r: &Request) -> Result<(), TransportError> {
        let slot = &self.slots[r.slot];
        let (frame, mapped): (&dyn DeviceMemory, bool) = match &slot.device {
            Some(dev) => (dev, false),
            None => (&slot.mapped, true),
        };
        // SAFETY: the kernel touches the frame's first `len` bytes (the
        // mapping or the slot's device buffer) and the slot's counter, all
        // torn down only after the streams are drained; nothing else
        // touches them until the kernel ran (the copy out waits for its end
        // event; the producer writes the frame again only after the free
        // fence, signalled after it, and takes the counter only after the
        // frame's end event).
        unsafe {
            self.kernels.check_and_invert(
                &self.streams.first,
                frame,
                self.geometry,
                r.frame,
                &self.counters,
                r.slot,
                mapped,
            )
        }
    }

    /// Queues one copy of the slot's frame (copy mode): the copy in on the
    /// first stream, the copy out on the second; by the copy engines
    /// (`cuMemcpyDtoDAsync`) or by copy kernels ([`CopyWith`]).
    fn copy(&self, slot: usize, dir: Direction) -> Result<(), TransportError> {
        let len = self.geometry.frame_len() as u64;
        let stream = match dir {
            Direction::In => &self.streams.first,
            Direction::Out => self.streams.last(),
        };
        let s = &self.slots[slot];
        let dev = s
            .device
            .as_ref()
            .ok_or_else(|| TransportError::new("copy mode without a device buffer"))?;
        let (dst, src, what): (&dyn DeviceMemory, &dyn DeviceMemory, _) = match dir {
            Direction::In => (dev, &s.mapped, "copying the frame into device memory"),
            Direction::Out => (&s.mapped, dev, "copying the frame back from device memory"),
        };
        // Both branches: the imported frame and the slot's device buffer
        // outlive the queued copy (torn down only after the streams are
        // drained) and do not overlap; the events order this copy after the
        // slot's previous user of the destination and before its next one,
        // and the producer touches the frame only after *free*, which is
        // signalled after the copy out.
        match self.copy_with {
            CopyWith::Engines => {
                // SAFETY: as said above.
                unsafe { stream.copy_async(dst, 0, src, 0, len) }.map_err(|e| err(what)(&e))
            }
            // SAFETY: as said above.
            CopyWith::Kernels => unsafe {
                self.kernels
                    .copy(stream, dst, src, len, dir == Direction::In)
            },
        }
    }

    /// Signals the slot's *free* fence on the last stream and checks the
    /// value the driver tracked.
    fn signal_free(&mut self, r: &Request) -> Result<(), TransportError> {
        let tracked = self
            .streams
            .last()
            .signal(&mut self.slots[r.slot].free, SignalParams::timeline(r.free))
            .map_err(|e| err("CUDA signal of the free fence")(&e))?;
        if tracked != Some(r.free) {
            return Err(TransportError::new(format!(
                "slot {}: the free fence is tracked at {tracked:?} after signalling {}",
                r.slot, r.free
            )));
        }
        Ok(())
    }
}

/// The enqueue thread: queues each requested frame's work in order, then
/// hands the frame to the completion thread, until its queue closes
/// (teardown); then it gives the CUDA side back for the teardown to drain
/// and release. An error goes to the producer through the completion queue
/// and stops the queueing.
pub(super) fn enqueue_loop(
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

/// Copy mode: one device-local buffer of `len` bytes per slot.
pub(super) fn device_frames(
    ctx: &Context,
    len: usize,
    slots: usize,
) -> Result<Vec<DeviceBuffer>, TransportError> {
    (0..slots)
        .map(|_| {
            DeviceBuffer::new(ctx, len).map_err(|e| err("allocating a device frame buffer")(&e))
        })
        .collect()
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
    /// device memory in copy mode, which may also wait for the slot's last
    /// copy out; about zero in zero-copy mode).
    pub copy_in: Duration,
    /// The kernel.
    pub kernel: Duration,
    /// From the kernel's end to the frame's end (in copy mode the copy back,
    /// on its own stream, which may first finish the previous frame's copy
    /// back; and the *free* signal).
    pub tail: Duration,
}

/// The GPU-side spans of one finished frame, read from its slot's events.
pub(super) struct FrameSpans {
    pub(super) wait: Duration,
    pub(super) after_wait: Duration,
    pub(super) copy_in: Duration,
    pub(super) process: Duration,
    pub(super) tail: Duration,
}

impl FrameSpans {
    /// Reads the spans of the frame whose end event completed.
    pub(super) fn read(ev: &SlotEvents) -> Result<FrameSpans, TransportError> {
        let span = |a: &Event, b: &Event| {
            b.elapsed_since(a)
                .map_err(|e| err("reading CUDA event times")(&e))
        };
        Ok(FrameSpans {
            wait: span(&ev.arrive, &ev.start)?,
            after_wait: span(&ev.start, &ev.end)?,
            copy_in: span(&ev.start, &ev.kernel_start)?,
            process: span(&ev.kernel_start, &ev.kernel_end)?,
            tail: span(&ev.kernel_end, &ev.end)?,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::fd::AsRawFd;

    use tegra_interop::core::MemoryImport;
    use tegra_interop::driver::ExternalMemory;
    use tegra_interop_sim::export::{self, ExportedMemory, ExportedTimelineSemaphore};

    use super::*;
    use crate::app::baseline::limit::tests::sim_with_kernels;
    use crate::camera::TestPattern;

    /// The producer's side of one slot on the simulator: the exported frame
    /// and the two exported timeline semaphores.
    struct Producer {
        frame: ExportedMemory,
        ready: ExportedTimelineSemaphore,
        free: ExportedTimelineSemaphore,
    }

    fn slot(ctx: &Context, len: usize) -> (Producer, CudaSlot) {
        let (fd, frame) = export::memory(len).unwrap();
        let import = MemoryImport::opaque_fd(fd.as_raw_fd(), len as u64).unwrap();
        let mapped = ExternalMemory::import_fd(ctx, fd, import)
            .map_err(|e| e.into_parts().0)
            .unwrap()
            .map_whole()
            .unwrap();
        let sem = || {
            let (fd, s) = export::timeline_semaphore(0).unwrap();
            let imported = ExternalSemaphore::timeline_fd(ctx, fd)
                .map_err(|e| e.into_parts().0)
                .unwrap();
            (s, imported)
        };
        let ((ready, ready_cu), (free, free_cu)) = (sem(), sem());
        let producer = Producer { frame, ready, free };
        let cuda = CudaSlot {
            ready: ready_cu,
            free: free_cu,
            mapped,
            device: None,
        };
        (producer, cuda)
    }

    /// Runs `frames` frames through the enqueuer's streams on the simulator
    /// as the transport does (the work queued before the frame is written,
    /// then *ready* signalled), frame `damaged` with one wrong byte; returns
    /// each frame's mismatch count, checking every frame's read-back.
    fn run(mode: Mode, copy_with: CopyWith, frames: u64, damaged: u64) -> Vec<u64> {
        let sim = sim_with_kernels();
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let g = FrameGeometry {
            stride: 48,
            rows: 5,
        };
        let (len, slots) = (g.frame_len(), 2usize);
        let (producers, mut cuda): (Vec<_>, Vec<_>) = (0..slots).map(|_| slot(&ctx, len)).unzip();
        if mode == Mode::DeviceCopy {
            for (s, b) in cuda
                .iter_mut()
                .zip(device_frames(&ctx, len, slots).unwrap())
            {
                s.device = Some(b);
            }
        }
        let mut e = Enqueuer {
            geometry: g,
            mode,
            copy_with,
            slots: cuda,
            counters: Arc::new(PinnedHostBuffer::new(&ctx, 8 * slots).unwrap()),
            events: SlotEvents::per_slot(&ctx, slots).unwrap(),
            streams: Streams::new(&ctx, mode).unwrap(),
            kernels: Kernels::compile(&ctx).unwrap(),
            ctx: ctx.clone(),
        };
        let wait = Duration::from_secs(10);
        let mut counts = Vec::new();
        let mut take = |e: &Enqueuer, frame: u64, p: &Producer, slot: usize| {
            let want = frame / slots as u64 + 1;
            assert!(
                p.free.wait(want, wait),
                "frame {frame}: free {want} not signalled"
            );
            let n = e
                .counters
                .atomic_u64(slot)
                .unwrap()
                .swap(0, Ordering::AcqRel);
            let back = p.frame.to_vec();
            let mut expect = vec![0u8; len];
            TestPattern::new(frame, g.stride).fill(&mut expect);
            if frame == damaged {
                expect[7] ^= 0x10;
            }
            let inverted: Vec<u8> = expect.iter().map(|b| !b).collect();
            assert_eq!(
                back, inverted,
                "frame {frame} ({mode:?}, {copy_with:?}) read back"
            );
            counts.push(n);
        };
        for frame in 0..frames {
            let slot = (frame % slots as u64) as usize;
            let use_ = frame / slots as u64 + 1;
            let p = &producers[slot];
            if frame >= slots as u64 {
                take(&e, frame - slots as u64, p, slot);
            }
            // Queued before the frame is written: the streams wait for *ready*.
            e.enqueue(&Request {
                slot,
                frame,
                ready: use_,
                free: use_,
            })
            .unwrap();
            let mut bytes = vec![0u8; len];
            TestPattern::new(frame, g.stride).fill(&mut bytes);
            if frame == damaged {
                bytes[7] ^= 0x10;
            }
            p.frame.write(0, &bytes).unwrap();
            p.ready.signal(use_);
        }
        for frame in frames.saturating_sub(slots as u64)..frames {
            let slot = (frame % slots as u64) as usize;
            take(&e, frame, &producers[slot], slot);
        }
        e.streams.synchronize().unwrap();
        for ev in e.events.iter() {
            assert!(ev.end.is_complete().unwrap());
            assert!(FrameSpans::read(ev).is_ok());
        }
        counts
    }

    /// The consumer's work on the simulator in each mode and copy path:
    /// every frame is checked and inverted in place (the copy in, the
    /// kernel and the copy out ordered across the two streams in copy
    /// mode), and the damaged frame, only it, is counted.
    #[test]
    #[cfg_attr(miri, ignore = "runs the simulator's stream threads and NVRTC model")]
    fn every_mode_processes_every_frame_on_the_simulator() {
        for (mode, copy_with) in [
            (Mode::ZeroCopy, CopyWith::Engines),
            (Mode::DeviceCopy, CopyWith::Engines),
            (Mode::DeviceCopy, CopyWith::Kernels),
        ] {
            let counts = run(mode, copy_with, 7, 3);
            let want: Vec<u64> = (0..7).map(|f| u64::from(f == 3)).collect();
            assert_eq!(counts, want, "{mode:?} {copy_with:?}");
        }
    }
}
