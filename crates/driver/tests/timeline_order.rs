//! Timeline values cannot go backwards on the device through this API: the
//! second-stream rule (as for deterministic NvSciSync counters), stated
//! orderings, values reported with `observe_timeline`, and what the crate
//! cannot see (another import of the same semaphore). Over the simulator,
//! which moves a timeline back exactly as the measured driver does.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::os::fd::OwnedFd;
use std::time::Duration;

use tegra_interop_core::{SignalParams, ValidationError, WaitParams};
use tegra_interop_driver::{Context, Error, ExternalSemaphore, SemaphoreSignal, Stream};
use tegra_interop_sim::export::{self, ExportedTimelineSemaphore};
use tegra_interop_sim::Sim;

const TIMEOUT: Duration = Duration::from_secs(5);

fn dup(fd: &OwnedFd) -> OwnedFd {
    fd.try_clone().unwrap()
}

/// Runs `body` with a simulator and a primary context on it. Once the body's
/// objects and then the context are gone, nothing may be left over or
/// diagnosed.
fn on_sim(body: impl FnOnce(&Sim, &Context)) {
    let sim = Sim::new().unwrap();
    {
        let ctx = Context::primary(sim.backend(), 0).unwrap();
        body(&sim, &ctx);
    }
    assert!(sim.ledger().is_clean(), "leaked: {}", sim.ledger());
    assert!(sim.diagnostics().is_empty(), "{:#?}", sim.diagnostics());
}

fn two_streams(ctx: &Context) -> (Stream, Stream) {
    (Stream::new(ctx).unwrap(), Stream::new(ctx).unwrap())
}

/// A timeline exported at 0, imported into `ctx`, and its exporter's end.
fn timeline(ctx: &Context) -> (ExternalSemaphore, ExportedTimelineSemaphore) {
    let (fd, exported) = export::timeline_semaphore(0).unwrap();
    (ExternalSemaphore::timeline_fd(ctx, fd).unwrap(), exported)
}

/// Two streams and the timeline under test, with stream `a` already queued
/// behind a wait for 1 on a gate that only the test opens (`gate.signal(1)`).
/// Fields drop in the order the tests' locals used to.
struct Gated {
    timeline: ExternalSemaphore,
    exported: ExportedTimelineSemaphore,
    _gate_sem: ExternalSemaphore,
    gate: ExportedTimelineSemaphore,
    b: Stream,
    a: Stream,
}

fn gated(ctx: &Context) -> Gated {
    let (a, b) = two_streams(ctx);
    let (gate_sem, gate) = timeline(ctx);
    let (timeline, exported) = timeline(ctx);
    a.wait(&gate_sem, WaitParams::timeline(1)).unwrap();
    Gated {
        timeline,
        exported,
        _gate_sem: gate_sem,
        gate,
        b,
        a,
    }
}

/// The scenario: 5 on stream A queued behind a wait, 6 on stream B.
/// The second signal is refused before the driver sees it.
#[test]
fn a_second_stream_without_an_ordering_is_refused_before_the_call() {
    on_sim(|sim, ctx| {
        let mut g = gated(ctx);
        assert_eq!(
            g.a.signal(&mut g.timeline, SignalParams::timeline(5))
                .unwrap(),
            Some(5)
        );
        let calls = sim.calls();
        let err =
            g.b.signal(&mut g.timeline, SignalParams::timeline(6))
                .unwrap_err();
        assert_eq!(
            err,
            Error::Validation(ValidationError::StreamNotOrdered {
                stream: g.b.stream_id(),
                last: g.a.stream_id(),
            })
        );
        assert!(err.to_string().contains("order_after"), "{err}");
        assert_eq!(sim.calls(), calls, "the driver was called");
        assert_eq!(g.timeline.last_timeline_value(), Some(5));
        // The same stream goes on signalling.
        assert_eq!(
            g.a.signal(&mut g.timeline, SignalParams::timeline(6))
                .unwrap(),
            Some(6)
        );
        g.gate.signal(1).unwrap();
        g.a.synchronize().unwrap();
        assert_eq!(g.exported.value(), 6);
        // Waits are not restricted: any stream may wait.
        g.b.wait(&g.timeline, WaitParams::timeline(6)).unwrap();
        g.b.synchronize().unwrap();
    });
}

/// With the check turned off, the simulator shows why it exists: the device
/// counter ends at 5 although 6 was signalled "after" it.
#[test]
fn without_the_rule_the_counter_goes_back_on_the_device() {
    on_sim(|_, ctx| {
        let mut g = gated(ctx);
        // SAFETY: deliberately broken contract, to observe the hazard on
        // the simulator (the device counter, not memory, is at stake).
        unsafe { g.timeline.assume_streams_ordered() }.unwrap();
        g.a.signal(&mut g.timeline, SignalParams::timeline(5))
            .unwrap();
        g.b.signal(&mut g.timeline, SignalParams::timeline(6))
            .unwrap();
        g.b.synchronize().unwrap();
        assert_eq!(g.exported.value(), 6);
        g.gate.signal(1).unwrap();
        g.a.synchronize().unwrap();
        assert_eq!(g.exported.value(), 5, "the counter went back");
    });
}

/// A stated ordering (B waits until A's signal is reached) lets B go on.
#[test]
fn a_stated_ordering_lets_the_second_stream_signal() {
    on_sim(|_, ctx| {
        let mut g = gated(ctx);
        g.a.signal(&mut g.timeline, SignalParams::timeline(5))
            .unwrap();
        // Make B really run after A's signal, then say so.
        g.b.wait(&g.timeline, WaitParams::timeline(5)).unwrap();
        g.timeline.order_streams(&g.b, &g.a).unwrap();
        assert_eq!(
            g.b.signal(&mut g.timeline, SignalParams::timeline(6))
                .unwrap(),
            Some(6)
        );
        // The ordering has a direction: back to A needs its own statement.
        assert!(matches!(
            g.a.signal(&mut g.timeline, SignalParams::timeline(7)),
            Err(Error::Validation(ValidationError::StreamNotOrdered { .. }))
        ));
        g.gate.signal(1).unwrap();
        g.b.synchronize().unwrap();
        assert_eq!(g.exported.value(), 6);
        assert!(g.exported.wait(6, TIMEOUT));
    });
}

/// In a batch, one refused entry refuses the whole call and leaves every
/// other semaphore's tracked value as it was.
#[test]
fn a_batch_with_one_unordered_semaphore_is_refused_whole() {
    on_sim(|sim, ctx| {
        let (a, b) = two_streams(ctx);
        let (mut t1, e1) = timeline(ctx);
        let (mut t2, e2) = timeline(ctx);
        a.signal(&mut t2, SignalParams::timeline(1)).unwrap();
        let calls = sim.calls();
        let err = b
            .signal_batch(&mut [
                SemaphoreSignal::timeline(&mut t1, 1),
                SemaphoreSignal::timeline(&mut t2, 2),
            ])
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Validation(ValidationError::StreamNotOrdered { .. })
            ),
            "{err}"
        );
        assert_eq!(sim.calls(), calls);
        assert_eq!(t1.last_timeline_value(), Some(0));
        assert_eq!(t2.last_timeline_value(), Some(1));
        // Nothing stays reserved: t1 signals on B afterwards.
        assert_eq!(
            b.signal(&mut t1, SignalParams::timeline(1)).unwrap(),
            Some(1)
        );
        a.synchronize().unwrap();
        b.synchronize().unwrap();
        assert_eq!((e1.value(), e2.value()), (1, 1));
    });
}

/// Values the exporter signals are invisible until reported; reported, they
/// raise the floor.
#[test]
fn observed_values_raise_the_floor() {
    on_sim(|_, ctx| {
        let stream = Stream::new(ctx).unwrap();
        let (mut timeline, exported) = timeline(ctx);
        exported.signal(10).unwrap(); // the exporter's own signal
        assert_eq!(timeline.observe_timeline(10).unwrap(), 10);
        // A lower report changes nothing.
        assert_eq!(timeline.observe_timeline(4).unwrap(), 10);
        assert_eq!(
            stream.signal(&mut timeline, SignalParams::timeline(7)),
            Err(Error::Validation(ValidationError::FenceNotIncreasing {
                last: 10,
                requested: 7
            }))
        );
        assert_eq!(
            stream
                .signal(&mut timeline, SignalParams::timeline(11))
                .unwrap(),
            Some(11)
        );
        stream.synchronize().unwrap();
        assert_eq!(exported.value(), 11);

        // Not a timeline: refused.
        let (bfd, _binary) = export::binary_semaphore().unwrap();
        let mut binary = ExternalSemaphore::binary_fd(ctx, bfd).unwrap();
        assert!(matches!(
            binary.observe_timeline(1),
            Err(Error::Unsupported { .. })
        ));
        assert!(matches!(
            binary.order_streams(&stream, &stream),
            Err(Error::Unsupported { .. })
        ));
    });
}

/// What the crate cannot see: a second import of the same semaphore has its
/// own tracker, so 8 through one and then 3 through the other is accepted
/// (and the device counter goes back) unless the user reports the value.
#[test]
fn another_import_of_the_same_semaphore_is_invisible_until_observed() {
    on_sim(|_, ctx| {
        let stream = Stream::new(ctx).unwrap();
        let (fd, exported) = export::timeline_semaphore(0).unwrap();
        let mut first = ExternalSemaphore::timeline_fd(ctx, dup(&fd)).unwrap();
        let mut second = ExternalSemaphore::timeline_fd(ctx, fd).unwrap();
        stream
            .signal(&mut first, SignalParams::timeline(8))
            .unwrap();
        // The documented limit: `second` does not know about 8.
        assert_eq!(second.last_timeline_value(), Some(0));
        stream.synchronize().unwrap();
        // Reported, it is refused.
        second
            .observe_timeline(first.last_timeline_value().unwrap())
            .unwrap();
        assert!(matches!(
            stream.signal(&mut second, SignalParams::timeline(3)),
            Err(Error::Validation(ValidationError::FenceNotIncreasing {
                last: 8,
                requested: 3
            }))
        ));
        stream.synchronize().unwrap();
        assert_eq!(exported.value(), 8);
    });
}
