//! The EGLStream transport (`--backend egl`): the camera's frames reach the
//! CUDA consumer through an `EGLStreamKHR`, the JetPack camera path (on a
//! Jetson, Argus is the producer; here a CUDA producer stands in for it).
//!
//! Per frame `f` in slot `s`:
//! 1. the camera writes the slot's host buffer;
//! 2. `signal_ready`: the producer copies it into a device buffer of its
//!    pool (`cuMemcpyHtoD`: synchronous; an asynchronous copy on the
//!    producer's stream gained nothing, because the present waits for the
//!    stream's earlier work: measured on an H100, the present then took
//!    ~0.5 ms instead of ~15 us) and presents that buffer
//!    (`cuEGLStreamProducerPresentFrame`, FIFO mode: no frame is dropped);
//! 3. `queue_consumer`: the consumer acquires the frame
//!    (`cuEGLStreamConsumerAcquireFrame`), processes it in place on its
//!    stream, reads it back into the slot's host buffer, releases it
//!    (`cuEGLStreamConsumerReleaseFrame`, ordered after that work); the
//!    frame is finished when the consumer's event after the read-back is;
//! 4. the producer takes its buffers back with
//!    `cuEGLStreamProducerReturnFrame` before it presents into them again.
//!
//! What the stream does that the code relies on, as measured on the H200
//! (driver 580.159, `crates/testkit/tests/gpu_egl_stream.rs`): the
//! consumer gets its own copy of the frame (so this path copies on a
//! discrete GPU: it is not zero-copy here); of the released frames the most
//! recently acquired stays in the stream for reuse, so the producer's pool
//! has one buffer more than the ring has slots; the consumer connects
//! first. The consumer's copy has the producer's pitch (checked per frame:
//! a frame of another pitch is an error, not a silent re-layout).
//!
//! Processing is the pipeline's [`Consumer`] ([`Placement::ReadBack`]): the
//! NVRTC kernel of [`crate::consumer`] over the acquired frame, then a copy
//! kernel into the slot's pinned host buffer (the buffer the camera writes
//! and the producer checks), times and completion from CUDA events. The
//! same code on a GPU and on the simulator, where the kernels run as their
//! Rust twins.
use std::time::{Duration, Instant};

use tegra_interop::driver::egl::EglStreamConsumer;
use tegra_interop::driver::{BackendKind, Context, DeviceBuffer, Stream};

use crate::consumer::egl::EglStreamEnds;
pub use crate::consumer::egl::OwnedEglStream;
use crate::consumer::shared::{HostFrame, Lendable};
use crate::consumer::{CheckInvert, Consumer, ConsumerConfig, FrameMemory, FrameWork, Placement};
use crate::transport::{
    Completion, DriverResultExt, FrameGeometry, FrameTransport, PeekedFrame, SlotMemory, Ticket,
    TransportError, TransportInfo,
};

/// How long an acquire, a buffer's return or a completion may take before
/// the run is declared stuck.
const STUCK: Duration = Duration::from_secs(10);

/// The most device buffers the producer's pool may have.
pub const MAX_POOL: usize = 64;

/// The producer's buffers for a ring of `slots`: `pool` where given (it
/// must be in `slots + 1 ..= MAX_POOL`; a larger pool is for measuring how
/// waiting for the driver to return presented buffers limits the frame
/// rate), else `slots + 1`, the least that works (the stream keeps the most
/// recently released frame for reuse: measured).
pub fn pool_size(slots: usize, pool: Option<usize>) -> Result<usize, TransportError> {
    match pool {
        None => Ok(slots + 1),
        Some(n) if (slots + 1..=MAX_POOL).contains(&n) => Ok(n),
        Some(n) => Err(TransportError::refused(format!(
            "a pool of {n} device buffers for a ring of {slots}: it takes {}..={MAX_POOL}",
            slots + 1
        ))),
    }
}

/// Per-frame figures of the EGLStream handover, for the report.
#[derive(Default)]
struct Figures {
    frames: u32,
    upload: Duration,
    present: Duration,
    acquire: Duration,
    returns_waited: Duration,
}

/// The EGLStream transport (see the module docs).
pub struct EglTransport {
    name: &'static str,
    note: &'static str,
    geometry: FrameGeometry,
    /// Indices of the producer's buffers it may present into now.
    free: Vec<usize>,
    /// Frames presented and not yet handed to the consumer, per slot.
    presented: Vec<bool>,
    /// Whether anything was presented (returns are asked for only then).
    presented_any: bool,
    figures: Figures,
    // Torn down in this order by `shut_down` (see Drop).
    pstream: Stream,
    /// The consumer's CUDA work ([`Placement::ReadBack`]: the kernel over each
    /// acquired frame, then a copy into the slot's pinned host buffer, which
    /// it owns); `None` once shut down.
    consumer_work: Option<Box<Consumer>>,
    /// The stream's two ends, the producer's buffers and the stream
    /// (`None` once shut down).
    ends: Option<EglStreamEnds>,
    /// The producer's and consumer's context (held until the end).
    _ctx: Context,
}

impl EglTransport {
    /// Opens the transport on `stream`, an `EGLStreamKHR` in FIFO mode of
    /// at least `slots` frames (the transport keeps it and destroys it
    /// after both ends disconnected), with `ctx` as the producer's and
    /// consumer's context and `pool` device buffers for the producer
    /// ([`pool_size`]; `None`: the least that works).
    ///
    /// The consumer's work is the pipeline's [`Consumer`] (the NVRTC
    /// kernel over each acquired frame, then its read-back), on a GPU and on
    /// the simulator (register the kernels' twins first:
    /// `crate::consumer::twin::register`).
    pub fn open(
        ctx: &Context,
        stream: OwnedEglStream,
        name: &'static str,
        geometry: FrameGeometry,
        slots: usize,
        pool: Option<usize>,
    ) -> Result<EglTransport, TransportError> {
        Self::open_with_work(
            ctx,
            stream,
            name,
            geometry,
            slots,
            pool,
            CheckInvert::boxed(),
        )
    }

    /// [`EglTransport::open`] running `work` on each acquired frame
    /// ([`Placement::ReadBack`]) instead of the check-and-invert kernel.
    /// The read-back after it is the consumer's copy kernel: on the
    /// simulator register `crate::consumer::twin::register` too.
    pub fn open_with_work(
        ctx: &Context,
        stream: OwnedEglStream,
        name: &'static str,
        geometry: FrameGeometry,
        slots: usize,
        pool: Option<usize>,
        work: Box<dyn FrameWork>,
    ) -> Result<EglTransport, TransportError> {
        let len = geometry.frame_len();
        if len == 0 || slots == 0 {
            return Err(TransportError::refused(
                "an EGLStream ring needs frames and slots",
            ));
        }
        let config = ConsumerConfig {
            geometry,
            slots,
            memory: FrameMemory::Device,
            placement: Placement::ReadBack,
            skip_kernel: false,
        };
        let consumer_work = Consumer::new(ctx, config, Vec::new(), work)?;
        let pool = (0..pool_size(slots, pool)?)
            .map(|_| DeviceBuffer::new(ctx, len).during("allocating a frame buffer (cuMemAlloc)"))
            .collect::<Result<Vec<_>, _>>()?;
        let mut t = EglTransport {
            name,
            note: match ctx.backend().kind() {
                BackendKind::Real => {
                    "EGLStream (FIFO): a CUDA producer presents device copies of the camera's frames; the consumer's acquired copy (the driver copies: measured) is processed by the NVRTC kernel and read back"
                }
                _ => {
                    "EGLStream (FIFO): a CUDA producer presents device copies of the camera's frames; the consumer's acquired copy is processed by the consumer's kernel path, the kernel run as its Rust twin (simulator), and read back"
                }
            },
            geometry,
            free: (0..pool.len()).collect(),
            presented: vec![false; slots],
            presented_any: false,
            figures: Figures::default(),
            pstream: Stream::new(ctx).during("CUDA stream")?,
            consumer_work: Some(Box::new(consumer_work)),
            ends: None,
            _ctx: ctx.clone(),
        };
        // From here on a failure tears down what exists (Drop). The
        // consumer connects first (measured: a producer first gets
        // CUDA_ERROR_UNKNOWN).
        t.ends = Some(EglStreamEnds::connect(ctx, stream, geometry, pool)?);
        Ok(t)
    }

    /// One line for the summary: how frames travel and are processed.
    pub fn note(&self) -> &'static str {
        self.note
    }

    fn consumer_work(&self) -> Result<&Consumer, TransportError> {
        self.consumer_work
            .as_deref()
            .ok_or_else(|| TransportError::misuse("the transport was shut down"))
    }

    fn consumer_work_mut(&mut self) -> Result<&mut Consumer, TransportError> {
        self.consumer_work
            .as_deref_mut()
            .ok_or_else(|| TransportError::misuse("the transport was shut down"))
    }

    /// Takes a buffer back from the stream when none is free, waiting
    /// for one. Asked only then, one frame per call: a
    /// `cuEGLStreamProducerReturnFrame` with nothing to return blocks for
    /// about 2 ms before it answers LAUNCH_TIMEOUT (measured on an H100,
    /// driver 580.159: draining the returns after every frame cost 2.15 ms
    /// per frame whatever the pool's size), so the producer never asks
    /// while it has a free buffer.
    fn take_returns(&mut self) -> Result<(), TransportError> {
        if !self.free.is_empty() {
            return Ok(());
        }
        if !self.presented_any {
            // Measured: a return before any present answers UNKNOWN.
            return Err(TransportError::misuse(
                "no frame buffer and nothing presented",
            ));
        }
        let began = Instant::now();
        let Some(ends) = self.ends.as_mut() else {
            return Err(TransportError::misuse("the transport was shut down"));
        };
        let mut back = None;
        while back.is_none() {
            back = ends.return_frame(&self.pstream)?;
            if back.is_none() && began.elapsed() > STUCK {
                return Err(TransportError::timeout(
                    "a frame buffer to come back from the EGLStream",
                    STUCK,
                ));
            }
        }
        self.free.extend(back);
        self.figures.returns_waited += began.elapsed();
        Ok(())
    }

    /// Drains the consumer, disconnects both ends, frees the pool, drops
    /// the stream; the first error. Safe to call twice.
    fn shut_down(&mut self) -> Result<(), TransportError> {
        let mut first: Option<TransportError> = None;
        let mut note = |r: Result<(), TransportError>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        // Drains its streams (or, when dropped, leaks what they use).
        if let Some(c) = self.consumer_work.take() {
            note(c.drain());
        }
        note(self.pstream.synchronize().during("draining the producer"));
        // Both ends disconnect, then the pool is freed and the stream
        // destroyed (each only once it is safe; leaked otherwise).
        if let Some(mut ends) = self.ends.take() {
            note(ends.shut_down());
        }
        self.free.clear();
        first.map_or(Ok(()), Err)
    }
}

impl Drop for EglTransport {
    fn drop(&mut self) {
        // `close` reports teardown errors; a transport dropped without it
        // tears down the same way (the driver's handles record their own
        // failed releases with the backend).
        let _ = self.shut_down();
    }
}

impl FrameTransport for EglTransport {
    fn info(&self) -> TransportInfo {
        TransportInfo {
            backend: self.name,
            geometry: self.geometry,
            slots: self.presented.len(),
            queues_before_ready: false,
        }
    }

    fn take_slot(&mut self, t: &Ticket) -> Result<SlotMemory, TransportError> {
        // The ring hands out a slot only after its previous frame was
        // collected, whose completion came after the read-back into this
        // buffer (the consumer also refuses a slot in flight).
        let host = self.consumer_work_mut()?.take_host_frame(t.slot())?;
        Ok(SlotMemory::new(t, self.geometry.frame_len(), host))
    }

    fn put_back(&mut self, t: &Ticket, memory: SlotMemory) -> Result<(), TransportError> {
        let host: Lendable<HostFrame> = memory.into_memory(t)?;
        self.consumer_work_mut()?.put_host_frame(t.slot(), host)
    }

    fn lend(
        &mut self,
        slot: usize,
        _frame: u64,
        _free_reached: u64,
    ) -> Result<Option<PeekedFrame>, TransportError> {
        // The frame was collected, so its read-back is done.
        self.consumer_work_mut()?.lend_host_frame(slot).map(Some)
    }

    fn signal_ready(&mut self, t: &Ticket, memory: SlotMemory) -> Result<(), TransportError> {
        self.put_back(t, memory)?;
        let slot = t.slot();
        self.take_returns()?;
        let Some(index) = self.free.pop() else {
            return Err(TransportError::misuse("no free frame buffer"));
        };
        let began = Instant::now();
        // Synchronous (see the module docs): the slot's bytes, which the
        // camera finished writing, into a pool buffer the stream gave back
        // (or never had).
        let Some(work) = self.consumer_work.as_deref_mut() else {
            return Err(TransportError::misuse("the transport was shut down"));
        };
        let Some(ends) = self.ends.as_mut() else {
            return Err(TransportError::misuse("the transport was shut down"));
        };
        let uploaded = work
            .host_frame(slot)
            .and_then(|src| ends.upload(index, src));
        if let Err(e) = uploaded {
            self.free.push(index);
            return Err(e);
        }
        let uploaded = Instant::now();
        if let Err(e) = ends.present(index, &self.pstream) {
            self.free.push(index);
            return Err(e);
        }
        self.figures.upload += uploaded - began;
        self.figures.present += uploaded.elapsed();
        self.presented[slot] = true;
        self.presented_any = true;
        Ok(())
    }

    fn queue_consumer(&mut self, t: &Ticket) -> Result<(), TransportError> {
        let (slot, frame) = (t.slot(), t.frame());
        if !self.presented.get(slot).copied().unwrap_or(false) {
            return Err(TransportError::misuse(format!(
                "consumer of frame {frame} in slot {slot} queued before the frame was presented"
            )));
        }
        let Some(ends) = self.ends.as_ref() else {
            return Err(TransportError::misuse("the transport was shut down"));
        };
        let Some(work) = self.consumer_work.as_deref() else {
            return Err(TransportError::misuse("the transport was shut down"));
        };
        consume(
            ends.consumer()?,
            work,
            (&mut self.figures, &mut self.presented[slot]),
            (slot, frame),
        )
    }

    fn try_complete(&mut self) -> Result<Option<Completion>, TransportError> {
        Ok(self.consumer_work()?.try_complete()?.map(|(c, _)| c))
    }

    fn wait_complete(&mut self) -> Result<Completion, TransportError> {
        self.consumer_work()?.wait_complete(STUCK).map(|(c, _)| c)
    }

    fn details(&self) -> Option<String> {
        let f = &self.figures;
        let n = f.frames.max(1);
        let us = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(n);
        Some(format!(
            "EGLStream per frame: upload (cuMemcpyHtoD) {:.0} us, present {:.0} us, acquire {:.0} us, waiting for returned buffers {:.0} us",
            us(f.upload),
            us(f.present),
            us(f.acquire),
            us(f.returns_waited)
        ))
    }

    fn close(mut self: Box<Self>) -> Result<(), TransportError> {
        self.shut_down()
    }
}

/// Acquires the slot's frame on the consumer's stream, queues its
/// processing, then its release (ordered after that work).
fn consume(
    consumer: &EglStreamConsumer,
    work: &Consumer,
    (figures, presented): (&mut Figures, &mut bool),
    (slot, frame): (usize, u64),
) -> Result<(), TransportError> {
    let began = Instant::now();
    let got = consumer
        .acquire(Some(work.entry_stream()), Some(STUCK))
        .during("cuEGLStreamConsumerAcquireFrame")?
        .ok_or_else(|| {
            TransportError::timeout(format!("presented frame {frame} to be acquired"), STUCK)
        })?;
    figures.acquire += began.elapsed();
    figures.frames += 1;
    *presented = false;
    // The consumer's work first (it checks the frame's layout: a frame
    // of another pitch is an error, not a silent re-layout), then the
    // release ordered after it on the same stream (the frame was
    // acquired on the consumer's entry stream), then nothing else
    // touches the frame.
    let queued = work.queue_acquired(slot, frame, &got);
    let released = got.release().during("cuEGLStreamConsumerReleaseFrame");
    queued?;
    released
}

#[cfg(feature = "sim")]
/// Opens the transport on the simulator: a simulated FIFO stream of
/// `slots` frames, processed by the pipeline's [`Consumer`], whose kernels
/// run as their Rust twins (registered with the simulator made here).
/// Gives the simulator too, for its ledger after the run. `pool`: the
/// producer's buffers ([`pool_size`]).
pub fn open_sim(
    geometry: FrameGeometry,
    slots: usize,
    pool: Option<usize>,
) -> Result<(EglTransport, tegra_interop_sim::Sim), TransportError> {
    use tegra_interop_sim::egl::EglStreamMode;
    let sim = tegra_interop_sim::Sim::new()
        .map_err(|e| TransportError::refused(format!("cannot start the simulator: {e}")))?;
    crate::consumer::twin::register(&sim);
    let ctx = Context::new(sim.backend(), 0).during("CUDA context")?;
    let fifo = u32::try_from(slots)
        .map_err(|_| TransportError::refused(format!("a ring of {slots} slots")))?;
    let stream = sim
        .create_egl_stream(EglStreamMode::Fifo(fifo))
        .ok_or_else(|| TransportError::refused("the simulator refused an EGLStream"))?;
    let stream = OwnedEglStream::simulated(stream);
    let t = EglTransport::open(&ctx, stream, "egl-sim", geometry, slots, pool)?;
    Ok((t, sim))
}

/// Opens the transport on the real driver with a real EGL display (the
/// device platform, headless) and a FIFO stream of `slots` frames,
/// processing by the NVRTC kernel. Gives the driver's backend too, for its
/// deferred release errors. `pool`: the producer's buffers ([`pool_size`]).
#[cfg(feature = "vulkan")]
pub fn open_real(
    geometry: FrameGeometry,
    slots: usize,
    pool: Option<usize>,
) -> Result<(EglTransport, std::sync::Arc<tegra_interop::driver::Backend>), TransportError> {
    let backend = tegra_interop::driver::Backend::real().during("CUDA driver")?;
    let ctx = Context::new(std::sync::Arc::clone(&backend), 0).during("CUDA context")?;
    let exporter = tegra_interop_platform::egl::EglExporter::new()
        .map_err(|e| TransportError::refused(e.to_string()))?;
    let fifo = i32::try_from(slots)
        .map_err(|_| TransportError::refused(format!("a ring of {slots} slots")))?;
    let stream = exporter
        .create_stream(fifo)
        .map_err(|e| TransportError::refused(e.to_string()))?;
    // The stream keeps its display (the exporter's) alive.
    let stream = OwnedEglStream::display(stream);
    let t = EglTransport::open(&ctx, stream, "egl-gpu", geometry, slots, pool)?;
    Ok((t, backend))
}

/// Without `--features vulkan` the test kit's EGL exporter is not built.
#[cfg(not(feature = "vulkan"))]
pub fn open_real(
    _geometry: FrameGeometry,
    _slots: usize,
    _pool: Option<usize>,
) -> Result<(EglTransport, std::sync::Arc<tegra_interop::driver::Backend>), TransportError> {
    Err(TransportError::refused(
        "this program was built without `--features vulkan`, which brings the EGL display code",
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::camera::TestPattern;
    use crate::ring::Ring;

    const G: FrameGeometry = FrameGeometry {
        stride: 64,
        rows: 8,
    };

    /// Every frame through the simulated EGLStream, checked on both sides
    /// (the consumer's mismatch count; the producer's read-back of the
    /// inverted frame when the slot comes round), for rings of 1 to 4
    /// slots; nothing left behind.
    /// Every frame through the simulated EGLStream, processed by the
    /// consumer's kernel path (its twins), checked on both sides, for rings
    /// of 1 to 4 slots; nothing left behind.
    #[test]
    fn frames_cross_the_stream_verified_and_nothing_is_left() {
        for slots in 1..=4usize {
            let log = run_verified(slots);
            for call in ["nvrtcCompileProgram", "cuLaunchKernel", "cuEventQuery"] {
                assert!(log.contains(&call), "{call} not called: {log:?}");
            }
            assert!(!log.contains(&"cuLaunchHostFunc"), "{log:?}");
        }
    }

    /// Every frame through the simulated EGLStream, checked on both sides;
    /// the simulator's call log.
    fn run_verified(slots: usize) -> Vec<&'static str> {
        let (t, sim) = open_sim(G, slots, None).unwrap();
        let mut ring = Ring::new(t).unwrap();
        let mut collected = Vec::new();
        let frames = 3 * slots as u64 + 2;
        let mut check = |ring: &mut Ring, done: crate::ring::Finished| {
            assert_eq!(done.completion.mismatches, 0, "frame {}", done.frame());
            let read = ring.read(&done).unwrap().unwrap();
            let want = TestPattern::new(done.frame(), G.stride);
            assert_eq!(want.first_mismatch(read.bytes(), 0xff), None);
            collected.push(done.frame());
        };
        for _ in 0..frames {
            ring.make_room().unwrap();
            while let Some(done) = ring.collect().unwrap() {
                check(&mut ring, done);
            }
            let mut lease = ring.acquire().unwrap();
            let frame = lease.frame();
            TestPattern::new(frame, G.stride).fill(lease.bytes_mut().unwrap());
            ring.hand_over(lease).unwrap();
        }
        while ring.pending() > 0 {
            let done = ring.wait_collect().unwrap();
            check(&mut ring, done);
        }
        assert_eq!(collected, (0..frames).collect::<Vec<_>>());
        assert!(ring.details().unwrap().starts_with("EGLStream per frame"));
        ring.close().unwrap();
        assert!(sim.ledger().is_clean(), "{}", sim.ledger());
        assert!(sim.diagnostics().is_empty(), "{:?}", sim.diagnostics());
        sim.call_log()
    }

    #[test]
    fn a_consumer_before_the_present_is_refused() {
        let (mut t, sim) = open_sim(G, 2, None).unwrap();
        let mut slots = crate::slots::Slots::new(2).unwrap();
        let ticket = slots.acquire().unwrap();
        let memory = t.take_slot(&ticket).unwrap();
        let e = t.queue_consumer(&ticket).unwrap_err();
        assert!(matches!(e, TransportError::Misuse { .. }), "{e:?}");
        assert!(
            e.to_string().contains("before the frame was presented"),
            "{e}"
        );
        t.put_back(&ticket, memory).unwrap();
        drop(t);
        assert!(sim.ledger().is_clean(), "{}", sim.ledger());
    }

    #[test]
    fn odd_strides_are_refused_before_anything_is_made() {
        let g = FrameGeometry { stride: 6, rows: 2 };
        let e = open_sim(g, 2, None).err().unwrap();
        assert!(matches!(e, TransportError::Refused { .. }), "{e:?}");
        assert!(e.to_string().contains("multiple of 4"), "{e}");
    }

    #[test]
    fn the_pool_is_a_setting_with_a_checked_range() {
        assert_eq!(pool_size(3, None).unwrap(), 4);
        assert_eq!(pool_size(3, Some(4)).unwrap(), 4);
        assert_eq!(pool_size(3, Some(MAX_POOL)).unwrap(), MAX_POOL);
        for bad in [0, 3, MAX_POOL + 1, 100_000] {
            let e = pool_size(3, Some(bad)).unwrap_err();
            assert!(matches!(e, TransportError::Refused { .. }), "{e:?}");
            assert!(e.to_string().contains("4..=64"), "{e}");
        }
        assert!(open_sim(G, 3, Some(3)).is_err());
        let (t, sim) = open_sim(G, 2, Some(6)).unwrap();
        drop(t);
        assert!(sim.ledger().is_clean(), "{}", sim.ledger());
    }
}
