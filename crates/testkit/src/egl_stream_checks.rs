//! EGLStream checks that run unchanged on the simulator and on a real GPU:
//! CUDA as consumer and producer of one stream, through the driver's `egl`
//! module, asserting what was measured on the H200 (driver 580.159,
//! 2026-11-24; `tests/gpu_egl_stream.rs` prints the measurements). The EGL
//! side (making streams, asking their state) comes from an [`EglStreams`]
//! implementation: the simulator's stand-in or the testkit's EGL exporter.
//!
//! ```
//! use tegra_interop_driver::Context;
//! use tegra_interop_sim::Sim;
//! use tegra_interop_testkit::egl_stream_checks::{run_all, SimStreams};
//!
//! let sim = Sim::new()?;
//! {
//!     let ctx = Context::new(sim.backend(), 0)?;
//!     run_all(&ctx, &SimStreams(&sim));
//! } // the context is released here
//! assert!(sim.ledger().is_clean(), "{}", sim.ledger());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::Duration;

use tegra_interop_driver::egl::{EglStreamConsumer, EglStreamProducer, ProducerFrame};
use tegra_interop_driver::{Context, Error, Stream};
use tegra_interop_sim::egl::{EglStreamMode, EglStreamState};
use tegra_interop_sys::cuda::{CUdeviceptr, EGLStreamKHR};

/// Frame size of the checks.
const W: u32 = 64;
const H: u32 = 16;
const LEN: usize = (W * H * 4) as usize;

/// An EGL side that makes streams: FIFO of `fifo` frames, or mailbox for 0.
pub trait EglStreams {
    /// One stream.
    type Stream;
    /// Makes a stream.
    fn create(&self, fifo: u32) -> Self::Stream;
    /// Its `EGLStreamKHR`.
    fn raw(&self, s: &Self::Stream) -> EGLStreamKHR;
    /// Its `EGL_STREAM_STATE_KHR`.
    fn state(&self, s: &Self::Stream) -> EglStreamState;
    /// Destroys it.
    fn destroy(&self, s: Self::Stream);
}

/// The simulator's streams.
pub struct SimStreams<'a>(pub &'a tegra_interop_sim::Sim);

impl EglStreams for SimStreams<'_> {
    type Stream = tegra_interop_sim::egl::SimEglStream;
    fn create(&self, fifo: u32) -> Self::Stream {
        let mode = if fifo == 0 {
            EglStreamMode::Mailbox
        } else {
            EglStreamMode::Fifo(fifo)
        };
        self.0.create_egl_stream(mode).expect("a simulated stream")
    }
    fn raw(&self, s: &Self::Stream) -> EGLStreamKHR {
        s.as_raw()
    }
    fn state(&self, s: &Self::Stream) -> EglStreamState {
        s.state()
    }
    fn destroy(&self, s: Self::Stream) {
        drop(s);
    }
}

/// A real EGL display's streams (the testkit's exporter; the GPU machine).
pub struct RealStreams<'a>(pub &'a tegra_interop_platform::egl::EglExporter);

impl EglStreams for RealStreams<'_> {
    type Stream = tegra_interop_platform::egl::EglStream;
    fn create(&self, fifo: u32) -> Self::Stream {
        self.0
            .create_stream(i32::try_from(fifo).expect("a small FIFO"))
            .expect("eglCreateStreamKHR")
    }
    fn raw(&self, s: &Self::Stream) -> EGLStreamKHR {
        s.as_raw()
    }
    fn state(&self, s: &Self::Stream) -> EglStreamState {
        use tegra_interop_platform::egl::stream_state as k;
        match self.0.stream_state(s).expect("eglQueryStreamKHR") {
            k::CREATED => EglStreamState::Created,
            k::CONNECTING => EglStreamState::Connecting,
            k::EMPTY => EglStreamState::Empty,
            k::NEW_FRAME_AVAILABLE => EglStreamState::NewFrameAvailable,
            k::OLD_FRAME_AVAILABLE => EglStreamState::OldFrameAvailable,
            k::DISCONNECTED => EglStreamState::Disconnected,
            other => panic!("EGL_STREAM_STATE_KHR {other:#x} is not a state of the extension"),
        }
    }
    fn destroy(&self, s: Self::Stream) {
        self.0.destroy_stream(s);
    }
}

/// Device buffers of [`FRAME_BYTES`] each, buffer `i` filled with the byte
/// `i + 1`, allocated and freed with raw calls of the context's table
/// (allocation is not the driver's business); freed on drop with their
/// context bound. Shared with the GPU probe (`tests/gpu_egl_stream.rs`).
pub struct DeviceBuffers<'a> {
    ctx: &'a Context,
    ptrs: Vec<CUdeviceptr>,
}

/// Bytes of each [`DeviceBuffers`] buffer: one 64 x 16 RGBA8 frame.
pub const FRAME_BYTES: usize = LEN;

impl<'a> DeviceBuffers<'a> {
    /// `n` buffers in `ctx` (bound here).
    pub fn new(ctx: &'a Context, n: usize) -> DeviceBuffers<'a> {
        ctx.bind().expect("bind");
        let t = &ctx.backend().table().cuda;
        let mut ptrs = Vec::new();
        for i in 0..n {
            let mut p: CUdeviceptr = 0;
            // SAFETY: a valid out-pointer; the context is current.
            let r = unsafe { (t.cuMemAlloc.expect("cuMemAlloc"))(&mut p, LEN) };
            assert_eq!(r.0, 0);
            // SAFETY: the `LEN` bytes just allocated.
            let r = unsafe { (t.cuMemsetD8.expect("cuMemsetD8"))(p, (i + 1) as u8, LEN) };
            assert_eq!(r.0, 0);
            ptrs.push(p);
        }
        DeviceBuffers { ctx, ptrs }
    }

    /// The buffers' device addresses.
    pub fn ptrs(&self) -> &[CUdeviceptr] {
        &self.ptrs
    }

    /// Which buffer `p` is (`None` for another address or none).
    pub fn index_of(&self, p: Option<CUdeviceptr>) -> Option<usize> {
        p.and_then(|p| self.ptrs.iter().position(|q| *q == p))
    }
}

impl Drop for DeviceBuffers<'_> {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        for p in &self.ptrs {
            // SAFETY: allocated above, freed once (after the producer left).
            unsafe {
                (self
                    .ctx
                    .backend()
                    .table()
                    .cuda
                    .cuMemFree
                    .expect("cuMemFree"))(*p)
            };
        }
    }
}

fn is_driver_code(r: &Result<impl Sized, Error>, code: u32) -> bool {
    matches!(r, Err(Error::Driver { code: c, .. }) if c.0 == code)
}

/// The bytes of a frame's first plane all equal this value.
fn bytes_are(f: &tegra_interop_driver::egl::StreamFrame<'_>, v: u8) -> bool {
    let mut b = vec![0u8; LEN];
    f.frame()
        .and_then(|fr| fr.copy_plane_to_host(0, &mut b))
        .expect("copy");
    b.iter().all(|x| *x == v)
}

const UNKNOWN: u32 = tegra_interop_core::CuResult::UNKNOWN.0;

/// A producer connecting before any consumer is refused with UNKNOWN.
pub fn producer_first_is_refused<E: EglStreams>(ctx: &Context, egl: &E) {
    let s = egl.create(4);
    assert_eq!(egl.state(&s), EglStreamState::Created);
    // SAFETY: the stream lives until destroy below.
    let r = unsafe { EglStreamProducer::connect(ctx, egl.raw(&s), W, H) };
    assert!(is_driver_code(&r, UNKNOWN), "measured: UNKNOWN, got {r:?}");
    egl.destroy(s);
}

/// The whole measured sequence on one stream of each mode.
pub fn frames_through_fifo_and_mailbox<E: EglStreams>(ctx: &Context, egl: &E) {
    ctx.bind().expect("bind");
    let stream = Stream::new(ctx).expect("stream");
    for fifo in [4u32, 0] {
        let mode = if fifo == 0 { "mailbox" } else { "FIFO(4)" };
        let s = egl.create(fifo);
        // SAFETY: the stream lives until destroy below, after both ends left.
        let consumer = unsafe { EglStreamConsumer::connect(ctx, egl.raw(&s), None) }.expect(mode);
        assert_eq!(egl.state(&s), EglStreamState::Connecting, "{mode}");
        // SAFETY: as above.
        let mut producer =
            unsafe { EglStreamProducer::connect(ctx, egl.raw(&s), W, H) }.expect(mode);
        assert_eq!(egl.state(&s), EglStreamState::Empty, "{mode}");
        let ms = Duration::from_millis;
        assert!(
            matches!(consumer.acquire(Some(&stream), Some(ms(5))), Ok(None)),
            "{mode}: empty stream times out"
        );
        let r = producer.return_frame(Some(&stream));
        assert!(
            is_driver_code(&r, UNKNOWN),
            "{mode}: return before any present: {r:?}"
        );

        let bufs = DeviceBuffers::new(ctx, 3);
        let frames: Vec<ProducerFrame> = bufs
            .ptrs()
            .iter()
            // SAFETY: each buffer holds FRAME_BYTES, one W x H RGBA8 frame of
            // pitch W * 4.
            .map(|p| unsafe { ProducerFrame::rgba_pitch(*p, W, H, W * 4) })
            .collect();
        for f in &frames[..2] {
            // SAFETY: the buffers stay allocated until after the producer left.
            unsafe { producer.present(f, Some(&stream)) }.expect(mode);
            assert_eq!(egl.state(&s), EglStreamState::NewFrameAvailable, "{mode}");
        }
        stream.synchronize().expect("sync");
        {
            let first = consumer
                .acquire(Some(&stream), Some(ms(100)))
                .expect(mode)
                .expect("a frame");
            let p = first.frame().expect("frame").plane_ptr(0);
            assert!(
                p.is_some() && p != Some(bufs.ptrs()[0]) && p != Some(bufs.ptrs()[1]),
                "{mode}: the consumer sees its own copy"
            );
            // FIFO: the oldest frame; mailbox: the newest.
            assert!(
                bytes_are(&first, if fifo > 0 { 1 } else { 2 }),
                "{mode}: first frame"
            );
            let back = producer.return_frame(Some(&stream)).expect(mode);
            if fifo > 0 {
                assert!(back.is_none(), "{mode}: nothing returned yet");
            } else {
                assert_eq!(
                    back.and_then(|b| b.plane_ptr(0)),
                    Some(bufs.ptrs()[0]),
                    "{mode}: the replaced frame comes back"
                );
            }
            {
                let second = consumer.acquire(Some(&stream), Some(ms(20))).expect(mode);
                if fifo > 0 {
                    let g = second.expect("FIFO: the second frame");
                    assert!(bytes_are(&g, 2), "{mode}: second frame");
                    g.release().expect(mode);
                } else {
                    assert!(
                        second.is_none(),
                        "{mode}: nothing new while the first is held"
                    );
                }
            }
            first.release().expect(mode);
        }
        stream.synchronize().expect("sync");
        assert_eq!(egl.state(&s), EglStreamState::OldFrameAvailable, "{mode}");
        let mut returned = Vec::new();
        while let Some(b) = producer.return_frame(Some(&stream)).expect(mode) {
            returned.push(b.plane_ptr(0));
        }
        let want: Vec<_> = if fifo > 0 {
            vec![Some(bufs.ptrs()[0])]
        } else {
            Vec::new()
        };
        assert_eq!(
            returned, want,
            "{mode}: the last released frame is kept for reuse"
        );
        // Nothing new: an old frame again.
        consumer
            .acquire(Some(&stream), Some(ms(5)))
            .expect(mode)
            .expect("an old frame again")
            .release()
            .expect(mode);
        // SAFETY: as above.
        unsafe { producer.present(&frames[2], Some(&stream)) }.expect(mode);
        stream.synchronize().expect("sync");
        let held = consumer
            .acquire(Some(&stream), Some(ms(100)))
            .expect(mode)
            .expect("the third frame");
        assert!(bytes_are(&held, 3), "{mode}: third frame");
        // The producer may leave while the consumer holds a frame.
        producer.disconnect().expect(mode);
        assert_eq!(egl.state(&s), EglStreamState::Disconnected, "{mode}");
        assert!(
            matches!(consumer.acquire(Some(&stream), Some(ms(5))), Ok(None)),
            "{mode}: nothing after the producer left"
        );
        assert!(bytes_are(&held, 3), "{mode}: the held frame stays usable");
        held.release().expect(mode);
        consumer.disconnect().expect(mode);
        egl.destroy(s);
        stream.synchronize().expect("sync");
        drop(bufs);
    }
    stream.destroy().expect("stream");
    let errors = ctx.backend().take_drop_errors();
    assert!(errors.is_empty(), "{errors:?}");
}

/// A leaked frame makes disconnect a typed refusal that hands the consumer
/// back; the frame is then released by its raw resource and the
/// disconnect goes through.
pub fn leaked_frame_refuses_disconnect<E: EglStreams>(ctx: &Context, egl: &E) {
    ctx.bind().expect("bind");
    let s = egl.create(1);
    // SAFETY: the stream outlives both connections.
    let consumer = unsafe { EglStreamConsumer::connect(ctx, egl.raw(&s), None) }.expect("c");
    // SAFETY: as above.
    let mut producer = unsafe { EglStreamProducer::connect(ctx, egl.raw(&s), W, H) }.expect("p");
    let bufs = DeviceBuffers::new(ctx, 1);
    // SAFETY: the buffer holds FRAME_BYTES, one W x H RGBA8 frame of pitch
    // W * 4.
    let f = unsafe { ProducerFrame::rgba_pitch(bufs.ptrs()[0], W, H, W * 4) };
    // SAFETY: the buffer outlives the producer.
    unsafe { producer.present(&f, None) }.expect("present");
    let frame = consumer
        .acquire(None, Some(Duration::from_millis(100)))
        .expect("acquire")
        .expect("a frame");
    let raw = frame.as_raw();
    std::mem::forget(frame);
    assert_eq!(consumer.frames_out(), 1);
    let refused = consumer.disconnect().expect_err("refused with a frame out");
    assert!(refused.to_string().contains("never released"), "{refused}");
    let consumer = refused
        .consumer
        .expect("the consumer comes back, connected");
    assert_eq!(egl.state(&s), EglStreamState::OldFrameAvailable);
    // SAFETY: `raw` is the leaked frame, not released since.
    unsafe { consumer.release_leaked(raw, None) }.expect("release the leaked frame");
    assert_eq!(consumer.frames_out(), 0);
    // SAFETY: nothing is out any more.
    let again = unsafe { consumer.release_leaked(raw, None) };
    assert!(
        again.is_err(),
        "a second release is refused before the driver"
    );
    producer.disconnect().expect("producer");
    consumer.disconnect().expect("consumer");
    drop(bufs);
    egl.destroy(s);
}

/// A two-plane (NV12: Y, then interleaved UV at half height) frame from a
/// CUDA producer reaches the consumer with both planes' bytes.
pub fn two_plane_frame_from_a_cuda_producer<E: EglStreams>(ctx: &Context, egl: &E) {
    use tegra_interop_driver::egl::EglColorFormat;
    ctx.bind().expect("bind");
    let s = egl.create(2);
    // SAFETY: the stream outlives both connections.
    let consumer = unsafe { EglStreamConsumer::connect(ctx, egl.raw(&s), None) }.expect("c");
    // SAFETY: as above.
    let mut producer = unsafe { EglStreamProducer::connect(ctx, egl.raw(&s), W, H) }.expect("p");
    // Buffers of value 1 (Y) and 2 (UV), each larger than its plane.
    let bufs = DeviceBuffers::new(ctx, 2);
    // SAFETY: each buffer holds FRAME_BYTES (W x H x 4), more than a Y plane
    // of W x H and a UV plane of W x H / 2.
    let f = unsafe { ProducerFrame::nv12_pitch(bufs.ptrs()[0], bufs.ptrs()[1], W, H, W) };
    // SAFETY: the buffers outlive the producer.
    unsafe { producer.present(&f, None) }.expect("present NV12");
    let got = consumer
        .acquire(None, Some(Duration::from_millis(100)))
        .expect("acquire")
        .expect("the NV12 frame");
    {
        let fr = got.frame().expect("frame");
        assert_eq!(fr.plane_count(), 2, "{fr:?}");
        // Measured (H100, driver 580.159): presented as YUV420_SEMIPLANAR,
        // acquired as YVU420_SEMIPLANAR (same two planes and pitch).
        assert_eq!(
            fr.color_format(),
            EglColorFormat::YVU420_SEMIPLANAR,
            "{fr:?}"
        );
        assert_eq!(fr.pitch(), W, "{fr:?}");
        assert_eq!((fr.width(), fr.height()), (W, H), "{fr:?}");
        let (y_len, uv_len) = ((W * H) as usize, (W * H / 2) as usize);
        let (mut y, mut uv) = (vec![0u8; y_len], vec![0u8; uv_len]);
        fr.copy_plane_to_host(0, &mut y).expect("Y plane");
        fr.copy_plane_to_host(1, &mut uv).expect("UV plane");
        assert!(y.iter().all(|b| *b == 1), "Y plane bytes");
        assert!(uv.iter().all(|b| *b == 2), "UV plane bytes");
    }
    got.release().expect("release");
    producer.disconnect().expect("producer");
    consumer.disconnect().expect("consumer");
    drop(bufs);
    egl.destroy(s);
}

/// Every check, on fresh streams.
pub fn run_all<E: EglStreams>(ctx: &Context, egl: &E) {
    producer_first_is_refused(ctx, egl);
    frames_through_fifo_and_mailbox(ctx, egl);
    leaked_frame_refuses_disconnect(ctx, egl);
    two_plane_frame_from_a_cuda_producer(ctx, egl);
}
