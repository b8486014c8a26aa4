//! EGLStreams through the simulator's C entry points: the rules the
//! driver's wrappers never let through (NULL and foreign handles, the
//! producer-first refusal, timeouts, unmeasured cases refused), each with
//! the code measured on the H200 or stated by cudaEGL.h.
#![allow(clippy::unwrap_used, clippy::field_reassign_with_default)]
mod common;
use common::*;
use tegra_interop_sim::egl::{EglStreamMode, EglStreamState};

const LAUNCH_TIMEOUT: u32 = 702;
const W: u32 = 16;
const H: u32 = 4;

fn frame(ptr: CUdeviceptr) -> CUeglFrame {
    let mut f = CUeglFrame {
        width: W,
        height: H,
        depth: 1,
        pitch: W * 4,
        planeCount: 1,
        numChannels: 4,
        frameType: CUeglFrameType::CU_EGL_FRAME_TYPE_PITCH,
        eglColorFormat: CUeglColorFormat::CU_EGL_COLOR_FORMAT_ABGR,
        cuFormat: CUarray_format::CU_AD_FORMAT_UNSIGNED_INT8,
        ..CUeglFrame::default()
    };
    // SAFETY: writing the first plane pointer of the union.
    unsafe { f.frame.pPitch[0] = ptr as usize as *mut std::ffi::c_void };
    f
}

struct Pair {
    consumer: CUeglStreamConnection,
    producer: CUeglStreamConnection,
}

fn connect(c: &Cu, s: EGLStreamKHR) -> Pair {
    let mut consumer: CUeglStreamConnection = std::ptr::null_mut();
    assert_eq!(
        cu!(c.t, cuEGLStreamConsumerConnect(&mut consumer, s)),
        SUCCESS
    );
    let mut producer: CUeglStreamConnection = std::ptr::null_mut();
    assert_eq!(
        cu!(
            c.t,
            cuEGLStreamProducerConnect(&mut producer, s, W as i32, H as i32)
        ),
        SUCCESS
    );
    Pair { consumer, producer }
}

fn alloc(c: &Cu) -> CUdeviceptr {
    let mut p = 0;
    assert_eq!(cu!(c.t, cuMemAlloc(&mut p, (W * H * 4) as usize)), SUCCESS);
    p
}

#[test]
fn null_and_foreign_handles_are_invalid_handle() {
    let c = Cu::new();
    let ctx = c.ctx();
    let s = c.sim.create_egl_stream(EglStreamMode::Fifo(2)).unwrap();
    assert_eq!(
        cu!(
            c.t,
            cuEGLStreamConsumerConnect(std::ptr::null_mut(), s.as_raw())
        ),
        INVALID_HANDLE
    );
    let mut conn: CUeglStreamConnection = std::ptr::null_mut();
    let foreign = 0x1234usize as EGLStreamKHR;
    assert_eq!(
        cu!(c.t, cuEGLStreamConsumerConnect(&mut conn, foreign)),
        INVALID_HANDLE
    );
    assert_eq!(
        cu!(c.t, cuEGLStreamConsumerDisconnect(std::ptr::null_mut())),
        INVALID_HANDLE
    );
    let mut bogus = 0x55usize as CUeglStreamConnection;
    assert_eq!(
        cu!(c.t, cuEGLStreamProducerDisconnect(&mut bogus)),
        INVALID_HANDLE
    );
    assert_eq!(
        cu!(
            c.t,
            cuEGLStreamConsumerConnectWithFlags(&mut conn, s.as_raw(), 7)
        ),
        INVALID_VALUE
    );
    assert_eq!(s.state(), EglStreamState::Created);
    drop(s);
    assert_eq!(cu!(c.t, cuCtxDestroy(ctx)), SUCCESS);
    assert!(c.sim.ledger().is_clean(), "{}", c.sim.ledger());
}

#[test]
fn no_context_is_invalid_context() {
    let c = Cu::new();
    assert_eq!(cu!(c.t, cuInit(0)), SUCCESS);
    let s = c.sim.create_egl_stream(EglStreamMode::Mailbox).unwrap();
    let mut conn: CUeglStreamConnection = std::ptr::null_mut();
    assert_eq!(
        cu!(c.t, cuEGLStreamConsumerConnect(&mut conn, s.as_raw())),
        INVALID_CONTEXT
    );
}

#[test]
fn producer_before_consumer_is_unknown() {
    let c = Cu::new();
    c.ctx();
    let s = c.sim.create_egl_stream(EglStreamMode::Fifo(2)).unwrap();
    let mut p: CUeglStreamConnection = std::ptr::null_mut();
    assert_eq!(
        cu!(c.t, cuEGLStreamProducerConnect(&mut p, s.as_raw(), 16, 4)),
        UNKNOWN
    );
    assert!(c.has_diag(DiagnosticKind::Misuse));
    assert_eq!(s.state(), EglStreamState::Created);
}

#[test]
fn timeouts_answer_unknown_or_launch_timeout_after_the_wait() {
    let c = Cu::new();
    c.ctx();
    let s = c.sim.create_egl_stream(EglStreamMode::Fifo(2)).unwrap();
    let mut pair = connect(&c, s.as_raw());
    let mut codes = Vec::new();
    for _ in 0..2 {
        let mut res: CUgraphicsResource = std::ptr::null_mut();
        let mut stream: CUstream = std::ptr::null_mut();
        let t = std::time::Instant::now();
        let r = cu!(
            c.t,
            cuEGLStreamConsumerAcquireFrame(&mut pair.consumer, &mut res, &mut stream, 3000)
        );
        assert!(
            t.elapsed() >= std::time::Duration::from_millis(3),
            "waited the timeout"
        );
        codes.push(r);
    }
    codes.sort_unstable();
    assert_eq!(
        codes,
        [LAUNCH_TIMEOUT, UNKNOWN],
        "both measured answers occur"
    );
    // Return before anything was presented: UNKNOWN; after: LAUNCH_TIMEOUT.
    let mut back = CUeglFrame::default();
    let mut stream: CUstream = std::ptr::null_mut();
    assert_eq!(
        cu!(
            c.t,
            cuEGLStreamProducerReturnFrame(&mut pair.producer, &mut back, &mut stream)
        ),
        UNKNOWN
    );
    let buf = alloc(&c);
    let mut f = frame(buf);
    assert_eq!(
        cu!(
            c.t,
            cuEGLStreamProducerPresentFrame(&mut pair.producer, f, &mut stream)
        ),
        SUCCESS
    );
    assert_eq!(
        cu!(
            c.t,
            cuEGLStreamProducerReturnFrame(&mut pair.producer, &mut f, &mut stream)
        ),
        LAUNCH_TIMEOUT
    );
    assert_eq!(
        cu!(c.t, cuEGLStreamProducerDisconnect(&mut pair.producer)),
        SUCCESS
    );
    assert_eq!(
        cu!(c.t, cuEGLStreamConsumerDisconnect(&mut pair.consumer)),
        SUCCESS
    );
    assert_eq!(cu!(c.t, cuMemFree(buf)), SUCCESS);
}

#[test]
fn presented_memory_stays_until_the_producer_left() {
    let c = Cu::new();
    let ctx = c.ctx();
    let s = c.sim.create_egl_stream(EglStreamMode::Fifo(1)).unwrap();
    let mut pair = connect(&c, s.as_raw());
    let buf = alloc(&c);
    let mut stream: CUstream = std::ptr::null_mut();
    assert_eq!(
        cu!(
            c.t,
            cuEGLStreamProducerPresentFrame(&mut pair.producer, frame(buf), &mut stream)
        ),
        SUCCESS
    );
    assert_eq!(s.state(), EglStreamState::NewFrameAvailable);
    // The header: a presented frame's memory is not freed before the
    // producer disconnects. Refused, the memory kept.
    assert_eq!(cu!(c.t, cuMemFree(buf)), INVALID_VALUE);
    assert!(c.has_diag(DiagnosticKind::Misuse));
    // A second present into the full FIFO of one: not measured, refused.
    let other = alloc(&c);
    assert_eq!(
        cu!(
            c.t,
            cuEGLStreamProducerPresentFrame(&mut pair.producer, frame(other), &mut stream)
        ),
        UNKNOWN
    );
    assert!(c.has_diag(DiagnosticKind::Unimplemented));
    // A consumer leaving while it holds a frame: not measured, refused.
    let mut res: CUgraphicsResource = std::ptr::null_mut();
    assert_eq!(
        cu!(
            c.t,
            cuEGLStreamConsumerAcquireFrame(&mut pair.consumer, &mut res, &mut stream, 0)
        ),
        SUCCESS
    );
    assert_eq!(
        cu!(c.t, cuEGLStreamConsumerDisconnect(&mut pair.consumer)),
        UNKNOWN
    );
    assert_eq!(
        cu!(
            c.t,
            cuEGLStreamConsumerReleaseFrame(&mut pair.consumer, res, &mut stream)
        ),
        SUCCESS
    );
    // Released twice: the resource is gone.
    assert_eq!(
        cu!(
            c.t,
            cuEGLStreamConsumerReleaseFrame(&mut pair.consumer, res, &mut stream)
        ),
        INVALID_HANDLE
    );
    assert_eq!(
        cu!(c.t, cuEGLStreamProducerDisconnect(&mut pair.producer)),
        SUCCESS
    );
    assert_eq!(s.state(), EglStreamState::Disconnected);
    assert_eq!(cu!(c.t, cuMemFree(buf)), SUCCESS);
    assert_eq!(cu!(c.t, cuMemFree(other)), SUCCESS);
    assert_eq!(
        cu!(c.t, cuEGLStreamConsumerDisconnect(&mut pair.consumer)),
        SUCCESS
    );
    assert!(pair.consumer.is_null(), "the connection is cleared");
    drop(s);
    assert_eq!(cu!(c.t, cuCtxDestroy(ctx)), SUCCESS);
    assert!(c.sim.ledger().is_clean(), "{}", c.sim.ledger());
}
