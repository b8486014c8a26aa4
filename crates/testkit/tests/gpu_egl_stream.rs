//! EGLStreams on a real GPU (the GPU machine): CUDA as consumer and producer
//! of one `EGLStreamKHR` made by the testkit's EGL exporter, through the
//! driver's `egl` module. The test asserts the data path (frames arrive
//! zero-copy, in order in FIFO mode, come back to the producer) and prints
//! every other behaviour as a `MEASURED:` line: the simulator's EGLStream
//! model is written from those lines (crates/sim/README.md).
//! Ignored by default; needs libEGL with EGL_KHR_stream and an NVIDIA EGL
//! vendor.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::time::{Duration, Instant};

use tegra_interop_driver::egl::{EglStreamConsumer, EglStreamProducer, ProducerFrame};
use tegra_interop_driver::{Backend, Context, Error, Stream};
use tegra_interop_platform::egl::{stream_state, EglExporter};
use tegra_interop_sys::cuda::{CUeglStreamConnection, CUresult};
use tegra_interop_testkit::egl_stream_checks::{DeviceBuffers, FRAME_BYTES as LEN};

const W: u32 = 64;
const H: u32 = 16;

fn state_name(s: i32) -> &'static str {
    match s {
        stream_state::CREATED => "CREATED",
        stream_state::CONNECTING => "CONNECTING",
        stream_state::EMPTY => "EMPTY",
        stream_state::NEW_FRAME_AVAILABLE => "NEW_FRAME_AVAILABLE",
        stream_state::OLD_FRAME_AVAILABLE => "OLD_FRAME_AVAILABLE",
        stream_state::DISCONNECTED => "DISCONNECTED",
        _ => "?",
    }
}

fn code(r: &Result<impl Sized, Error>) -> String {
    match r {
        Ok(_) => "CUDA_SUCCESS".into(),
        Err(Error::Driver { code, .. }) => code.to_string(),
        Err(e) => e.to_string(),
    }
}

fn raw_code(r: CUresult) -> String {
    tegra_interop_core::CuResult(r.0).to_string()
}

fn producer_ctx_is(p: &EglStreamProducer, ctx: &Context) -> bool {
    p.context().as_raw() == ctx.as_raw()
}

#[test]
#[ignore = "needs a GPU with EGL (the GPU machine)"]
fn cuda_to_cuda_through_an_egl_stream() {
    let backend = Backend::real().unwrap();
    let ctx = Context::new(backend.clone(), 0).unwrap();
    // The producer in a context of its own (a producer in the consumer's
    // context is probed below).
    let pctx = Context::create(backend.clone(), 0, 0).unwrap();
    let pstream = Stream::new(&pctx).unwrap();
    ctx.bind().unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let egl = EglExporter::new().unwrap();
    let t = &backend.table().cuda;

    for fifo in [4, 0] {
        let mode = if fifo == 0 { "mailbox" } else { "FIFO(4)" };
        println!("--- {mode}");
        let s = egl.create_stream(fifo).unwrap();
        let state = |what: &str| {
            let v = egl.stream_state(&s).unwrap();
            println!("MEASURED: {mode}: state {what}: {}", state_name(v));
            v
        };
        assert_eq!(state("after create"), stream_state::CREATED);

        // The producer before any consumer (EGL_KHR_stream: the consumer
        // connects first), on a stream of its own.
        let probe = egl.create_stream(fifo).unwrap();
        let mut early: CUeglStreamConnection = std::ptr::null_mut();
        // SAFETY: a live stream and an out-pointer.
        let r = unsafe {
            (t.cuEGLStreamProducerConnect.unwrap())(&mut early, probe.as_raw(), W as i32, H as i32)
        };
        println!(
            "MEASURED: {mode}: producer connect before the consumer: {}",
            raw_code(r)
        );
        if r.0 == 0 {
            // SAFETY: the connection just made.
            let r = unsafe { (t.cuEGLStreamProducerDisconnect.unwrap())(&mut early) };
            println!("MEASURED: {mode}: ... its disconnect: {}", raw_code(r));
        }
        egl.destroy_stream(probe);

        // SAFETY: the stream lives until destroy_stream below.
        let consumer = unsafe { EglStreamConsumer::connect(&ctx, s.as_raw(), None) };
        println!("MEASURED: {mode}: consumer connect: {}", code(&consumer));
        let consumer = consumer.unwrap();
        state("after consumer connect");
        // A producer in the consumer's context, then in its own.
        // SAFETY: as above.
        let same = unsafe { EglStreamProducer::connect(&ctx, s.as_raw(), W, H) };
        println!(
            "MEASURED: {mode}: producer connect in the consumer's context: {}",
            code(&same)
        );
        let mut producer = match same {
            Ok(p) => p,
            Err(_) => {
                pctx.bind().unwrap();
                // SAFETY: as above.
                let own = unsafe { EglStreamProducer::connect(&pctx, s.as_raw(), W, H) };
                println!(
                    "MEASURED: {mode}: producer connect in its own context: {}",
                    code(&own)
                );
                own.unwrap()
            }
        };
        let pstream = if producer_ctx_is(&producer, &ctx) {
            &stream
        } else {
            &pstream
        };
        let pctx_used = if producer_ctx_is(&producer, &ctx) {
            &ctx
        } else {
            &pctx
        };
        assert_eq!(state("after producer connect"), stream_state::EMPTY);

        // Acquire on an empty stream.
        let t0 = Instant::now();
        let empty = consumer.acquire(Some(&stream), Some(Duration::from_millis(5)));
        println!(
            "MEASURED: {mode}: acquire with a 5 ms timeout on an empty stream: {} after {:?}",
            match &empty {
                Ok(None) => "timed out (CUDA_ERROR_LAUNCH_TIMEOUT)".to_string(),
                other => code(other),
            },
            t0.elapsed()
        );
        assert!(
            matches!(empty, Ok(None)),
            "a timeout (LAUNCH_TIMEOUT, or UNKNOWN after the timeout) is no frame"
        );
        drop(empty);
        let r = producer.return_frame(Some(pstream));
        println!(
            "MEASURED: {mode}: return_frame before any present: {}",
            match &r {
                Ok(None) => "none (CUDA_ERROR_LAUNCH_TIMEOUT)".to_string(),
                other => code(other),
            }
        );

        pctx_used.bind().unwrap();
        let bufs = DeviceBuffers::new(pctx_used, 3);
        let frames: Vec<ProducerFrame> = bufs
            .ptrs()
            .iter()
            // SAFETY: each buffer holds FRAME_BYTES, one W x H RGBA8 frame of
            // pitch W * 4.
            .map(|p| unsafe { ProducerFrame::rgba_pitch(*p, W, H, W * 4) })
            .collect();
        // Two presents before any acquire.
        for (i, f) in frames.iter().take(2).enumerate() {
            // SAFETY: the buffers live until after both ends disconnected.
            let r = unsafe { producer.present(f, Some(pstream)) };
            println!("MEASURED: {mode}: present {i}: {}", code(&r));
            r.unwrap();
            state(&format!("after present {i}"));
        }
        pstream.synchronize().unwrap();
        ctx.bind().unwrap();
        let first = consumer
            .acquire(Some(&stream), Some(Duration::from_millis(100)))
            .unwrap()
            .expect("a frame after two presents");
        let f = first.frame().unwrap();
        let which = bufs.index_of(f.plane_ptr(0));
        let mut first_bytes = vec![0u8; LEN];
        f.copy_plane_to_host(0, &mut first_bytes).unwrap();
        println!(
            "MEASURED: {mode}: first acquire after two presents: producer buffer {which:?} (the same pointer: {}), frame {f:?}, bytes all {}: {}",
            which.is_some(),
            first_bytes[0],
            first_bytes.iter().all(|b| *b == first_bytes[0])
        );
        if fifo > 0 {
            assert!(
                first_bytes.iter().all(|b| *b == 1),
                "FIFO: the oldest frame first"
            );
        }
        let r = producer.return_frame(Some(pstream));
        println!(
            "MEASURED: {mode}: return_frame while the consumer holds frame {which:?}: {}",
            match &r {
                Ok(Some(back)) => format!("buffer {:?}", bufs.index_of(back.plane_ptr(0))),
                Ok(None) => "none (CUDA_ERROR_LAUNCH_TIMEOUT)".into(),
                Err(e) => e.to_string(),
            }
        );
        {
            // A second acquire while the first is held.
            let second = consumer.acquire(Some(&stream), Some(Duration::from_millis(20)));
            println!(
                "MEASURED: {mode}: second acquire while the first is held: {}",
                match &second {
                    Ok(Some(g)) => format!(
                        "buffer {:?}",
                        bufs.index_of(g.frame().unwrap().plane_ptr(0))
                    ),
                    Ok(None) => "timed out".into(),
                    Err(e) => e.to_string(),
                }
            );
            match second {
                Ok(Some(g)) => {
                    println!(
                        "MEASURED: {mode}: release of the second: {}",
                        code(&g.release())
                    )
                }
                other => drop(other),
            }
        }
        println!(
            "MEASURED: {mode}: release of the first: {}",
            code(&first.release())
        );
        stream.synchronize().unwrap();
        state("after the releases");
        let mut returned = Vec::new();
        for _ in 0..4 {
            match producer.return_frame(Some(pstream)) {
                Ok(Some(back)) => returned.push(bufs.index_of(back.plane_ptr(0))),
                Ok(None) => break,
                Err(e) => {
                    println!("MEASURED: {mode}: return_frame: {e}");
                    break;
                }
            }
        }
        println!(
            "MEASURED: {mode}: frames returned to the producer after the releases: {returned:?}"
        );
        {
            // Acquire again with nothing new presented (the header: an old frame
            // may be acquired again while EGL_SUPPORT_REUSE_NV is true).
            let again = consumer.acquire(Some(&stream), Some(Duration::from_millis(5)));
            println!(
                "MEASURED: {mode}: acquire with nothing new: {}",
                match &again {
                    Ok(Some(g)) => format!(
                        "buffer {:?} (an old frame again)",
                        bufs.index_of(g.frame().unwrap().plane_ptr(0))
                    ),
                    Ok(None) => "timed out".into(),
                    Err(e) => e.to_string(),
                }
            );
            match again {
                Ok(Some(g)) => g.release().unwrap(),
                other => drop(other),
            }
        }

        // The third buffer: present, acquire, data, then the producer leaves
        // while the consumer holds it.
        // SAFETY: as above.
        unsafe { producer.present(&frames[2], Some(pstream)) }.unwrap();
        pstream.synchronize().unwrap();
        ctx.bind().unwrap();
        let held = consumer
            .acquire(Some(&stream), Some(Duration::from_millis(100)))
            .unwrap()
            .expect("the third frame");
        let hf = held.frame().unwrap();
        let mut back = vec![0u8; LEN];
        hf.copy_plane_to_host(0, &mut back).unwrap();
        let idx = bufs.index_of(hf.plane_ptr(0));
        println!(
            "MEASURED: {mode}: third acquire: buffer {idx:?}, bytes all {}",
            back[0]
        );
        if fifo > 0 {
            assert!(back.iter().all(|b| *b == 3), "the third buffer's bytes");
        }
        println!(
            "MEASURED: {mode}: producer disconnect while the consumer holds a frame: {}",
            code(&producer.disconnect())
        );
        state("after the producer disconnected");
        let after = consumer.acquire(Some(&stream), Some(Duration::from_millis(5)));
        println!(
            "MEASURED: {mode}: acquire after the producer left: {}",
            match &after {
                Ok(Some(_)) => "a frame".into(),
                Ok(None) => "timed out".into(),
                Err(e) => e.to_string(),
            }
        );
        drop(after);
        println!(
            "MEASURED: {mode}: release after the producer left: {}",
            code(&held.release())
        );
        println!(
            "MEASURED: {mode}: consumer disconnect: {}",
            code(&consumer.disconnect().map_err(Error::from))
        );
        state("after both disconnected");
        egl.destroy_stream(s);
        stream.synchronize().unwrap();
        pctx_used.bind().unwrap();
        drop(bufs);
        ctx.bind().unwrap();
    }
    let errors = backend.take_drop_errors();
    println!("drop errors: {errors:?}");
}

/// The shared checks (the same functions the simulator runs in
/// `egl_sim_checks.rs`) against the real driver and a real EGL display.
#[test]
#[ignore = "needs a GPU with EGL (the GPU machine)"]
fn shared_checks_on_a_real_gpu() {
    use tegra_interop_testkit::egl_stream_checks::{self as checks, RealStreams};
    let backend = Backend::real().unwrap();
    let ctx = Context::new(backend.clone(), 0).unwrap();
    let egl = EglExporter::new().unwrap();
    checks::run_all(&ctx, &RealStreams(&egl));
    let errors = backend.take_drop_errors();
    assert!(errors.is_empty(), "{errors:?}");
}

/// `StreamFrame::is_repeat` on a real GPU (issue 24, item 7): the same
/// sequence as the simulator's `crates/driver/tests/egl_repeat_sim.rs`. An
/// acquire with nothing new presented takes the stream's kept frame again
/// (EGL_SUPPORT_REUSE_NV): the frame must say it is a repeat; new frames,
/// one of them presented from a buffer the producer got back, must not.
/// Prints what identifies a repeat on this driver as `MEASURED:` lines (the
/// consumer's plane pointer, the graphics resource).
#[test]
#[ignore = "needs a GPU with EGL (the GPU machine)"]
fn stream_frame_says_when_it_is_a_repeat() {
    let backend = Backend::real().unwrap();
    let ctx = Context::new(backend.clone(), 0).unwrap();
    ctx.bind().unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let egl = EglExporter::new().unwrap();
    let t = &backend.table().cuda;
    let s = egl.create_stream(4).unwrap();
    let bufs = DeviceBuffers::new(&ctx, 3);
    let frames: Vec<ProducerFrame> = bufs
        .ptrs()
        .iter()
        // SAFETY: each buffer holds FRAME_BYTES, one W x H RGBA8 frame of
        // pitch W * 4.
        .map(|p| unsafe { ProducerFrame::rgba_pitch(*p, W, H, W * 4) })
        .collect();
    let bytes_of = |f: &tegra_interop_driver::egl::StreamFrame<'_>| {
        let mut b = vec![0u8; LEN];
        f.frame().unwrap().copy_plane_to_host(0, &mut b).unwrap();
        assert!(b.iter().all(|x| *x == b[0]), "one value per frame");
        b[0]
    };
    let ms = Duration::from_millis;
    {
        // SAFETY: the stream lives until destroy_stream below.
        let consumer = unsafe { EglStreamConsumer::connect(&ctx, s.as_raw(), None) }.unwrap();
        // SAFETY: as above.
        let mut producer = unsafe { EglStreamProducer::connect(&ctx, s.as_raw(), W, H) }.unwrap();
        let acquire = || consumer.acquire(Some(&stream), Some(ms(20))).unwrap();
        let seen = |what: &str, f: &tegra_interop_driver::egl::StreamFrame<'_>| {
            println!(
                "MEASURED: repeat: {what}: bytes {}, plane {:#x?}, resource {:?}, is_repeat {}",
                bytes_of(f),
                f.frame().unwrap().plane_ptr(0),
                f.as_raw(),
                f.is_repeat()
            );
        };

        // SAFETY: the buffers live until after both ends disconnected.
        unsafe { producer.present(&frames[0], Some(&stream)) }.unwrap();
        stream.synchronize().unwrap();
        let f = acquire().expect("the first frame");
        seen("first frame", &f);
        assert!(!f.is_repeat() && bytes_of(&f) == 1);
        f.release().unwrap();
        let f = acquire().expect("the kept frame again (reuse)");
        seen("acquire with nothing new", &f);
        assert!(f.is_repeat() && bytes_of(&f) == 1);
        f.release().unwrap();

        for f in &frames[1..] {
            // SAFETY: as above.
            unsafe { producer.present(f, Some(&stream)) }.unwrap();
        }
        stream.synchronize().unwrap();
        let a = acquire().expect("the second frame");
        let b = acquire().expect("the third frame");
        seen("second frame", &a);
        seen("third frame, the second held", &b);
        assert!(!a.is_repeat() && bytes_of(&a) == 2);
        assert!(!b.is_repeat() && bytes_of(&b) == 3);
        b.release().unwrap();
        a.release().unwrap();
        let f = acquire().expect("the kept frame again");
        seen("acquire with nothing new after releasing newest first", &f);
        assert!(f.is_repeat() && bytes_of(&f) == 3);
        f.release().unwrap();
        stream.synchronize().unwrap();

        let mut back = Vec::new();
        while let Some(r) = producer.return_frame(Some(&stream)).unwrap() {
            back.push(bufs.index_of(r.plane_ptr(0)));
        }
        println!("MEASURED: repeat: buffers back to the producer: {back:?}");
        assert!(back.contains(&Some(0)), "{back:?}");
        // SAFETY: buffer 0 is back with the producer; FRAME_BYTES long.
        let r = unsafe { (t.cuMemsetD8.unwrap())(bufs.ptrs()[0], 4, LEN) };
        assert_eq!(r.0, 0);
        // SAFETY: as above.
        unsafe { producer.present(&frames[0], Some(&stream)) }.unwrap();
        stream.synchronize().unwrap();
        let f = acquire().expect("a new frame from a returned buffer");
        seen("new content from a returned buffer", &f);
        assert!(!f.is_repeat() && bytes_of(&f) == 4);
        f.release().unwrap();
        let f = acquire().expect("that frame again");
        seen("acquire with nothing new", &f);
        assert!(f.is_repeat() && bytes_of(&f) == 4);
        f.release().unwrap();
        stream.synchronize().unwrap();
        producer.disconnect().unwrap();
        consumer.disconnect().unwrap();
    }
    egl.destroy_stream(s);
    drop(bufs);
    let errors = backend.take_drop_errors();
    assert!(errors.is_empty(), "{errors:?}");
}
