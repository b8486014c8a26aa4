//! The CUDA side of the discrete-GPU transport: the pipeline's shared
//! [`Consumer`] (kernel, counters, events, streams; two streams in copy
//! mode, see "Copy mode: two streams" in the parent module's docs), the
//! fences imported from Vulkan, the enqueue thread that queues each frame's
//! work and the completion thread that collects each frame.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tegra_interop::core::{SignalParams, WaitParams};
use tegra_interop::driver::{Context, ExternalSemaphore};

use super::TEARDOWN_WAIT;
use crate::consumer::{Consumer, FrameTimes};
use crate::transport::{Completion, DriverResultExt, TransportError};

/// Work for the completion thread: a submitted frame.
pub(super) struct Job {
    pub(super) slot: usize,
    pub(super) frame: u64,
}

/// A frame the completion thread collected.
pub(super) struct Done {
    pub(super) completion: Completion,
    pub(super) times: FrameTimes,
}

/// Collects one frame from the consumer (the oldest in flight, `job`'s);
/// after teardown began, waits at most [`TEARDOWN_WAIT`].
fn collect_one(
    consumer: &Consumer,
    job: &Job,
    stopping: &AtomicBool,
) -> Result<Done, TransportError> {
    let mut stop_seen: Option<Instant> = None;
    loop {
        if let Some((completion, times)) = consumer.try_complete()? {
            if (completion.slot, completion.frame) != (job.slot, job.frame) {
                return Err(TransportError::misuse(format!(
                    "the consumer finished frame {} in slot {} where frame {} in slot {} was next",
                    completion.frame, completion.slot, job.frame, job.slot
                )));
            }
            return Ok(Done { completion, times });
        }
        if stopping.load(Ordering::Acquire) {
            let since = *stop_seen.get_or_insert_with(Instant::now);
            if since.elapsed() > TEARDOWN_WAIT {
                return Err(TransportError::timeout(
                    format!(
                        "frame {} in slot {} to finish during teardown",
                        job.frame, job.slot
                    ),
                    TEARDOWN_WAIT,
                ));
            }
        }
        thread::yield_now();
    }
}

/// Collects, in submission order, each frame the enqueue thread queued,
/// timestamped when it was seen finished.
pub(super) fn completion_loop(
    consumer: Arc<Consumer>,
    jobs: Receiver<Job>,
    done: SyncSender<Result<Done, TransportError>>,
    stopping: Arc<AtomicBool>,
) {
    while let Ok(job) = jobs.recv() {
        let result = collect_one(&consumer, &job, &stopping);
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

/// The fences of one ring slot, imported into CUDA.
pub(super) struct CudaSlot {
    /// *ready*: waited for on the consumer's entry stream.
    pub(super) ready: ExternalSemaphore,
    /// *free*: signalled on the consumer's exit stream.
    pub(super) free: ExternalSemaphore,
}

/// The CUDA side of the transport as the enqueue thread holds it
/// ([`enqueue_loop`]), so the producer's thread does not spend the ~30-50
/// us of driver calls per frame (event records, the wait, the launches,
/// the signal) between two frames.
pub(super) struct Enqueuer {
    pub(super) consumer: Arc<Consumer>,
    pub(super) slots: Vec<CudaSlot>,
    pub(super) ctx: Context,
}

impl Enqueuer {
    /// Queues the consumer's work for the requested frame: its arrival
    /// event and the wait for *ready* on the entry stream, the frame's work
    /// ([`Consumer::queue`]), the *free* signal on the exit stream.
    pub(super) fn enqueue(&mut self, r: &Request) -> Result<(), TransportError> {
        let c = &self.consumer;
        let slot = self
            .slots
            .get_mut(r.slot)
            .ok_or_else(|| TransportError::no_slot(r.slot))?;
        c.arrive(r.slot)?;
        c.entry_stream()
            .wait(&slot.ready, WaitParams::timeline(r.ready))
            .during("CUDA wait for the ready fence")?;
        c.queue(r.slot, r.frame)?;
        let tracked = c
            .exit_stream()
            .signal(&mut slot.free, SignalParams::timeline(r.free))
            .during("CUDA signal of the free fence")?;
        if tracked != Some(r.free) {
            return Err(TransportError::misuse(format!(
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
                .map_err(|_| TransportError::misuse("the completion thread stopped")),
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

/// Mean GPU-side times per frame, from the consumer's events.
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
    /// Host time submitting the acquire ahead (`reclaim_ahead`) once its
    /// turn came.
    pub host_reclaim: Duration,
    /// Host time waiting for a slot to be taken back (its acquire batch to
    /// complete, submitted first where it was still owed): the producer's
    /// `take_slot` and the read-back check's `lend` together.
    pub host_free_wait: Duration,
    /// Acquires submitted only when the producer needed the slot (their
    /// turn had not come; counted over the run, not averaged).
    pub reclaims_at_need: u64,
    /// From the end of the *ready* wait to the kernel's start (the copy into
    /// device memory in copy mode; about zero in zero-copy mode).
    pub copy_in: Duration,
    /// The kernel.
    pub kernel: Duration,
    /// From the kernel's end to the frame's end (in copy mode the copy
    /// back, on its own stream, which may first finish the previous frame's
    /// copy back).
    pub tail: Duration,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::fd::AsRawFd;

    use tegra_interop::core::MemoryImport;
    use tegra_interop::driver::{ExternalMemory, MappedBuffer};
    use tegra_interop_sim::export::{self, ExportedMemory, ExportedTimelineSemaphore};

    use super::*;
    use crate::camera::TestPattern;
    use crate::consumer::{twin, CheckInvert, ConsumerConfig, CopyWith, FrameMemory, Placement};
    use crate::transport::FrameGeometry;

    /// The producer's side of one slot on the simulator: the exported frame
    /// and the two exported timeline semaphores.
    struct Producer {
        frame: ExportedMemory,
        ready: ExportedTimelineSemaphore,
        free: ExportedTimelineSemaphore,
    }

    fn slot(ctx: &Context, len: usize) -> (Producer, CudaSlot, MappedBuffer) {
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
        let cuda = CudaSlot {
            ready: ready_cu,
            free: free_cu,
        };
        (Producer { frame, ready, free }, cuda, mapped)
    }

    /// Checks that `p`'s frame holds frame `frame` inverted (`damaged`: with
    /// the one wrong byte the producer wrote).
    fn read_back(p: &Producer, frame: u64, stride: usize, damaged: bool, what: &str) {
        let back = p.frame.to_vec();
        let mut expect = vec![0u8; back.len()];
        TestPattern::new(frame, stride).fill(&mut expect);
        if damaged {
            expect[7] ^= 0x10;
        }
        let off = back.iter().zip(&expect).position(|(a, b)| *a != !*b);
        assert_eq!(off, None, "frame {frame} ({what}): read back wrong at");
    }

    /// Runs `frames` frames through the enqueuer on the simulator as the
    /// transport does (the work queued before the frame is written, then
    /// *ready* signalled), frame `damaged` with one wrong byte; returns each
    /// frame's mismatch count, checking every frame's read-back.
    fn run(work: Placement, frames: u64, damaged: u64) -> Vec<u64> {
        let sim = tegra_interop_sim::Sim::new().unwrap();
        twin::register(&sim);
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let g = FrameGeometry {
            stride: 48,
            rows: 5,
        };
        let (len, slots) = (g.frame_len(), 2u64);
        let (mut producers, mut fences, mut mapped) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..slots {
            let (p, f, m) = slot(&ctx, len);
            producers.push(p);
            fences.push(f);
            mapped.push(m);
        }
        let config = ConsumerConfig {
            geometry: g,
            slots: slots as usize,
            memory: FrameMemory::System,
            placement: work,
            skip_kernel: false,
        };
        let consumer = Arc::new(Consumer::new(&ctx, config, mapped, CheckInvert::boxed()).unwrap());
        let mut e = Enqueuer {
            consumer: Arc::clone(&consumer),
            slots: fences,
            ctx: ctx.clone(),
        };
        let (wait, stopping) = (Duration::from_secs(10), AtomicBool::new(false));
        let mut counts = Vec::new();
        let what = format!("{work:?}");
        for frame in 0..frames + slots {
            let slot = (frame % slots) as usize;
            let use_ = frame / slots + 1;
            let p = &producers[slot];
            if frame >= slots {
                let prev = frame - slots;
                assert!(
                    p.free.wait(use_ - 1, wait),
                    "frame {prev}: free not signalled"
                );
                let done = collect_one(&consumer, &Job { slot, frame: prev }, &stopping).unwrap();
                read_back(p, prev, g.stride, prev == damaged, &what);
                counts.push(done.completion.mismatches);
            }
            if frame >= frames {
                continue;
            }
            // Queued before the frame is written: the streams wait for *ready*.
            let r = Request {
                slot,
                frame,
                ready: use_,
                free: use_,
            };
            e.enqueue(&r).unwrap();
            let mut bytes = vec![0u8; len];
            TestPattern::new(frame, g.stride).fill(&mut bytes);
            if frame == damaged {
                bytes[7] ^= 0x10;
            }
            p.frame.write(0, &bytes).unwrap();
            p.ready.signal(use_);
        }
        consumer.drain().unwrap();
        counts
    }

    /// The consumer's work on the simulator in each mode and copy path:
    /// every frame is checked and inverted in place (the copy in, the
    /// kernel and the copy out ordered across the two streams in copy
    /// mode), and the damaged frame, only it, is counted.
    #[test]
    #[cfg_attr(miri, ignore = "runs the simulator's stream threads and NVRTC model")]
    fn every_mode_processes_every_frame_on_the_simulator() {
        for work in [
            Placement::InPlace,
            Placement::DeviceCopy(CopyWith::Engines),
            Placement::DeviceCopy(CopyWith::Kernels),
        ] {
            let counts = run(work, 7, 3);
            let want: Vec<u64> = (0..7).map(|f| u64::from(f == 3)).collect();
            assert_eq!(counts, want, "{work:?}");
        }
    }
}
