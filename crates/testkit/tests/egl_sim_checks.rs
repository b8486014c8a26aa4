//! The EGLStream and EGL image checks on the simulator (the same functions
//! run on the GPU machine from `gpu_egl_stream.rs` and `gpu_egl.rs`), with
//! the ledger clean after each.

use tegra_interop_driver::Context;
use tegra_interop_sim::Sim;
use tegra_interop_testkit::egl_stream_checks::{self as checks, SimStreams};

fn on_sim(check: fn(&Context, &SimStreams<'_>)) {
    // Quiet: some checks provoke refusals on purpose (a producer before the
    // consumer); they assert on the answers.
    let sim = Sim::with_config(tegra_interop_sim::SimConfig::default().with_diagnostic_echo(false))
        .expect("sim");
    {
        let ctx = Context::new(sim.backend(), 0).expect("context");
        check(&ctx, &SimStreams(&sim));
        let errors = ctx.backend().take_drop_errors();
        assert!(errors.is_empty(), "{errors:?}");
    }
    assert!(sim.ledger().is_clean(), "{}", sim.ledger());
}

#[test]
fn producer_first_is_refused() {
    on_sim(|c, e| checks::producer_first_is_refused(c, e));
}

#[test]
fn frames_through_fifo_and_mailbox() {
    on_sim(|c, e| checks::frames_through_fifo_and_mailbox(c, e));
}

#[test]
fn leaked_frame_refuses_disconnect() {
    on_sim(|c, e| checks::leaked_frame_refuses_disconnect(c, e));
}

#[test]
fn two_plane_frame_from_a_cuda_producer() {
    on_sim(|c, e| checks::two_plane_frame_from_a_cuda_producer(c, e));
}

/// A consumer dropped with a leaked frame stays connected (the driver is
/// not asked to disconnect with a frame held: unmeasured); the drop
/// records the refusal and the ledger shows the connection.
#[test]
fn dropped_consumer_with_leaked_frame_is_reported() {
    use std::time::Duration;
    use tegra_interop_driver::egl::{EglStreamConsumer, EglStreamProducer, ProducerFrame};
    use tegra_interop_sim::egl::EglStreamMode;

    let sim = Sim::new().expect("sim");
    let ctx = Context::new(sim.backend(), 0).expect("context");
    ctx.bind().expect("bind");
    let s = sim
        .create_egl_stream(EglStreamMode::Fifo(2))
        .expect("stream");
    // SAFETY: the stream outlives both connections (it is leaked below).
    let consumer = unsafe { EglStreamConsumer::connect(&ctx, s.as_raw(), None) }.expect("c");
    // SAFETY: as above.
    let mut producer = unsafe { EglStreamProducer::connect(&ctx, s.as_raw(), 8, 8) }.expect("p");
    let t = &ctx.backend().table().cuda;
    let mut p = 0;
    // SAFETY: a valid out-pointer; the context is current.
    let r = unsafe { (t.cuMemAlloc.expect("cuMemAlloc"))(&mut p, 256) };
    assert_eq!(r.0, 0);
    // SAFETY: 256 bytes are one 8 x 8 RGBA8 frame of pitch 32.
    let frame = unsafe { ProducerFrame::rgba_pitch(p, 8, 8, 32) };
    // SAFETY: the memory stays allocated (leaked with the stream).
    unsafe { producer.present(&frame, None) }.expect("present");
    let f = consumer
        .acquire(None, Some(Duration::from_millis(50)))
        .expect("acquire")
        .expect("frame");
    std::mem::forget(f);
    drop(consumer);
    let errors = ctx.backend().take_drop_errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].to_string().contains("never released"),
        "{}",
        errors[0]
    );
    let ledger = sim.ledger();
    assert_eq!(ledger.live_egl_connections, 2, "{ledger}");
    assert_eq!(
        ledger.live_graphics_resources, 1,
        "the leaked frame: {ledger}"
    );
    std::mem::forget(producer);
    std::mem::forget(s);
}

/// The EGL image checks on the simulator (the same functions run on the
/// GPU machine from `gpu_egl.rs`).
#[test]
fn egl_image_checks_on_the_simulator() {
    use tegra_interop_testkit::egl_image_checks::{run_all, SimImages};
    let sim = Sim::new().expect("sim");
    {
        let ctx = Context::new(sim.backend(), 0).expect("context");
        run_all(&ctx, &mut SimImages(&sim));
        let errors = ctx.backend().take_drop_errors();
        assert!(errors.is_empty(), "{errors:?}");
    }
    assert!(sim.ledger().is_clean(), "{}", sim.ledger());
    assert!(sim.diagnostics().is_empty(), "{:?}", sim.diagnostics());
}
