//! `StreamFrame::is_repeat` on the simulator (issue 24, item 7): an acquire
//! with nothing new presented takes the stream's kept frame again, and the
//! frame says so; new frames, including one presented from a buffer the
//! producer got back, do not. The same sequence runs on a GPU in
//! `crates/testkit/tests/gpu_egl_stream.rs`
//! (`stream_frame_says_when_it_is_a_repeat`).
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::time::Duration;

use tegra_interop_driver::egl::{EglStreamConsumer, EglStreamProducer, ProducerFrame, StreamFrame};
use tegra_interop_driver::{Context, Stream};
use tegra_interop_sim::egl::EglStreamMode;
use tegra_interop_sim::Sim;
use tegra_interop_sys::cuda::CUdeviceptr;

const W: u32 = 64;
const H: u32 = 16;
const LEN: usize = (W * H * 4) as usize;

/// The frame's bytes are all `v`.
fn bytes_are(f: &StreamFrame<'_>, v: u8) -> bool {
    let mut b = vec![0u8; LEN];
    f.frame().unwrap().copy_plane_to_host(0, &mut b).unwrap();
    b.iter().all(|x| *x == v)
}

#[test]
fn an_acquire_of_the_kept_frame_is_a_repeat_and_new_frames_are_not() {
    let sim = Sim::new().unwrap();
    let ctx = Context::new(sim.backend(), 0).unwrap();
    ctx.bind().unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let egl = sim.create_egl_stream(EglStreamMode::Fifo(4)).unwrap();
    let backend = sim.backend();
    let cuda = &backend.table().cuda;
    let fill = |p: CUdeviceptr, v: u8| {
        // SAFETY: `p` is one of the LEN-byte allocations below.
        assert_eq!(unsafe { (cuda.cuMemsetD8.unwrap())(p, v, LEN) }.0, 0);
    };
    let bufs: Vec<CUdeviceptr> = (1..=3u8)
        .map(|v| {
            let mut p = 0;
            // SAFETY: a valid out-pointer; the context is current.
            assert_eq!(unsafe { (cuda.cuMemAlloc.unwrap())(&mut p, LEN) }.0, 0);
            fill(p, v);
            p
        })
        .collect();
    let frames: Vec<ProducerFrame> = bufs
        .iter()
        // SAFETY: each buffer holds one W x H RGBA8 frame of pitch W * 4.
        .map(|p| unsafe { ProducerFrame::rgba_pitch(*p, W, H, W * 4) })
        .collect();
    let ms = Duration::from_millis;
    {
        // SAFETY: the stream lives until both ends disconnected.
        let consumer = unsafe { EglStreamConsumer::connect(&ctx, egl.as_raw(), None) }.unwrap();
        // SAFETY: as above.
        let mut producer = unsafe { EglStreamProducer::connect(&ctx, egl.as_raw(), W, H) }.unwrap();
        let acquire = || consumer.acquire(Some(&stream), Some(ms(5))).unwrap();

        // A new frame, then the same one again with nothing new presented.
        // SAFETY: the buffers stay allocated until the producer left.
        unsafe { producer.present(&frames[0], Some(&stream)) }.unwrap();
        let f = acquire().expect("the first frame");
        assert!(!f.is_repeat() && bytes_are(&f, 1));
        f.release().unwrap();
        let f = acquire().expect("the kept frame again");
        assert!(f.is_repeat(), "{f:?}");
        assert!(bytes_are(&f, 1));
        f.release().unwrap();

        // Two new frames held at once, released newest first: the stream
        // keeps the one acquired last, and that is the repeat.
        for f in &frames[1..] {
            // SAFETY: as above.
            unsafe { producer.present(f, Some(&stream)) }.unwrap();
        }
        let a = acquire().expect("the second frame");
        let b = acquire().expect("the third frame");
        assert!(!a.is_repeat() && bytes_are(&a, 2));
        assert!(!b.is_repeat() && bytes_are(&b, 3));
        b.release().unwrap();
        a.release().unwrap();
        let f = acquire().expect("the kept frame again");
        assert!(f.is_repeat() && bytes_are(&f, 3), "{f:?}");
        f.release().unwrap();

        // The producer gets its other buffers back and presents new content
        // from one of them: a new frame, not a repeat.
        let mut back = Vec::new();
        while let Some(r) = producer.return_frame(Some(&stream)).unwrap() {
            back.push(r.plane_ptr(0).unwrap());
        }
        assert_eq!(back, vec![bufs[0], bufs[1]]);
        fill(bufs[0], 4);
        // SAFETY: as above.
        unsafe { producer.present(&frames[0], Some(&stream)) }.unwrap();
        let f = acquire().expect("a new frame from a returned buffer");
        assert!(!f.is_repeat() && bytes_are(&f, 4), "{f:?}");
        f.release().unwrap();
        let f = acquire().expect("that frame again");
        assert!(f.is_repeat() && bytes_are(&f, 4), "{f:?}");
        f.release().unwrap();
        stream.synchronize().unwrap();
        producer.disconnect().unwrap();
        consumer.disconnect().unwrap();
    }
    drop(egl);
    for p in bufs {
        // SAFETY: allocated above; the producer disconnected.
        assert_eq!(unsafe { (cuda.cuMemFree.unwrap())(p) }.0, 0);
    }
    drop(stream);
    drop(ctx);
    assert!(sim.diagnostics().is_empty(), "{:?}", sim.diagnostics());
    drop(backend);
    assert!(sim.ledger().is_clean(), "{}", sim.ledger());
}
