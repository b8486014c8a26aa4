//! Batches from slices: a `Vec` of semaphores signalled and waited with one
//! driver call each (`signal_each` / `wait_each`, `signal_batch` over a
//! `Vec` of entries), the capacity refusal, and refusals before any call
//! that advance nothing.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::time::Duration;

use tegra_interop_core::{SignalParams, ValidationError, WaitParams};
use tegra_interop_driver::stream::MAX_BATCH;
use tegra_interop_driver::{Context, Error, ExternalSemaphore, SemaphoreSignal, Stream};
use tegra_interop_sim::export::ExportedTimelineSemaphore;
use tegra_interop_sim::{export, Sim};

/// A simulator, its primary context and a stream on it (dropped in reverse:
/// stream, context, simulator).
fn sim_stream() -> (Sim, Context, Stream) {
    let sim = Sim::new().unwrap();
    let ctx = Context::primary(sim.backend(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    (sim, ctx, stream)
}

fn timelines(ctx: &Context, n: usize) -> (Vec<ExternalSemaphore>, Vec<ExportedTimelineSemaphore>) {
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for _ in 0..n {
        let (fd, exported) = export::timeline_semaphore(0).unwrap();
        ours.push(ExternalSemaphore::timeline_fd(ctx, fd).unwrap());
        theirs.push(exported);
    }
    (ours, theirs)
}

/// Runs `f` and counts the `cuSignalExternalSemaphoresAsync` calls it made.
fn signal_calls_during(sim: &Sim, f: impl FnOnce()) -> usize {
    let before = sim.call_log().len();
    f();
    sim.call_log()[before..]
        .iter()
        .filter(|c| **c == "cuSignalExternalSemaphoresAsync")
        .count()
}

#[test]
fn a_vec_of_semaphores_is_one_driver_call_each_way() {
    let (sim, ctx, stream) = sim_stream();
    let (mut sems, exported) = timelines(&ctx, 5);

    let params: Vec<SignalParams> = (1..=5).map(SignalParams::timeline).collect();
    let signals = signal_calls_during(&sim, || stream.signal_each(&mut sems, &params).unwrap());
    assert_eq!(signals, 1);
    stream.synchronize().unwrap();
    for (k, (sem, exp)) in sems.iter().zip(&exported).enumerate() {
        assert_eq!(sem.last_timeline_value(), Some(k as u64 + 1));
        assert_eq!(exp.value(), k as u64 + 1);
    }

    let waits: Vec<WaitParams> = (1..=5).map(WaitParams::timeline).collect();
    stream.wait_each(&sems, &waits).unwrap();
    stream.synchronize().unwrap();

    // The same through a Vec of entries, values read back per entry.
    let mut batch: Vec<_> = sems
        .iter_mut()
        .map(|s| SemaphoreSignal::timeline(s, 10))
        .collect();
    stream.signal_batch(&mut batch).unwrap();
    assert!(batch.iter().all(|s| s.tracked() == Some(10)));
    drop(batch);
    stream.synchronize().unwrap();
    assert!(exported.iter().all(|e| e.wait(10, Duration::from_secs(5))));
}

#[test]
fn refusals_come_before_the_call_and_advance_nothing() {
    let (sim, ctx, stream) = sim_stream();
    let (mut sems, _exported) = timelines(&ctx, 3);
    let calls = sim.calls();

    // Lengths differ.
    let two = [SignalParams::timeline(1); 2];
    assert!(matches!(
        stream.signal_each(&mut sems, &two),
        Err(Error::Unsupported { .. })
    ));
    assert!(matches!(
        stream.wait_each(&sems, &[WaitParams::timeline(1)]),
        Err(Error::Unsupported { .. })
    ));
    // The last entry goes backwards: the whole batch is refused.
    let params = [
        SignalParams::timeline(1),
        SignalParams::timeline(1),
        SignalParams::timeline(0),
    ];
    assert!(matches!(
        stream.signal_each(&mut sems, &params),
        Err(Error::Validation(
            ValidationError::FenceNotIncreasing { .. }
        ))
    ));
    assert_eq!(sim.calls(), calls, "no driver call was made");
    assert!(sems.iter().all(|s| s.last_timeline_value() == Some(0)));
}

#[test]
fn more_than_max_batch_entries_are_refused_whole() {
    let (sim, ctx, stream) = sim_stream();
    let (mut sems, _exported) = timelines(&ctx, MAX_BATCH + 1);
    let params = vec![SignalParams::timeline(1); MAX_BATCH + 1];
    let calls = sim.calls();
    assert!(matches!(
        stream.signal_each(&mut sems, &params),
        Err(Error::Validation(ValidationError::CapacityExceeded { capacity })) if capacity == MAX_BATCH
    ));
    assert_eq!(sim.calls(), calls);
    assert!(sems.iter().all(|s| s.last_timeline_value() == Some(0)));
    // Exactly MAX_BATCH is one call.
    stream
        .signal_each(&mut sems[..MAX_BATCH], &params[..MAX_BATCH])
        .unwrap();
    assert_eq!(sim.calls(), calls + 2, "bind check + one signal call");
}

/// A refusal anywhere in a batch of timeline entries, behind valid ones,
/// comes before any call and advances nothing: a binary payload for a
/// timeline, a flag only NvSciSync takes, a value not above the last.
#[test]
fn a_refused_timeline_entry_behind_valid_ones_advances_nothing() {
    let (sim, ctx, stream) = sim_stream();
    let (mut sems, _exported) = timelines(&ctx, 3);
    stream
        .signal_each(&mut sems, &[SignalParams::timeline(4); 3])
        .unwrap();
    let calls = sim.calls();
    // SAFETY: the flag is refused before any call (a timeline takes no
    // flags), so the memsync contract never comes into play.
    let flagged = unsafe { SignalParams::timeline(5).skip_nvscibuf_memsync() };
    let bad = [
        (SignalParams::binary(), "binary payload"),
        (flagged, "NvSciSync flag"),
        (SignalParams::timeline(4), "value not above the last"),
    ];
    for (last, what) in bad {
        let params = [SignalParams::timeline(5), SignalParams::timeline(5), last];
        let r = stream.signal_each(&mut sems, &params);
        assert!(matches!(r, Err(Error::Validation(_))), "{what}: {r:?}");
        assert_eq!(sim.calls(), calls, "{what}: no driver call");
        assert!(
            sems.iter().all(|s| s.last_timeline_value() == Some(4)),
            "{what}: nothing advanced"
        );
    }
    stream
        .signal_each(&mut sems, &[SignalParams::timeline(5); 3])
        .unwrap();
    assert!(sems.iter().all(|s| s.last_timeline_value() == Some(5)));
}

/// A `TimelineSignals` set: one driver call per signal, the exported values
/// reached, and the same refusals as `signal_batch` (before any call,
/// nothing advanced) for what can change between calls; what cannot is
/// refused when the set is made.
#[test]
fn a_timeline_set_signals_in_one_call_and_refuses_like_a_batch() {
    use tegra_interop_driver::stream::TimelineSignals;
    let (sim, ctx, stream) = sim_stream();
    let (mut sems, exported) = timelines(&ctx, 4);
    {
        let mut set = TimelineSignals::new(&stream, sems.iter_mut()).unwrap();
        assert_eq!(set.len(), 4);
        let signals = signal_calls_during(&sim, || set.signal(&stream, &[3, 4, 5, 6]).unwrap());
        assert_eq!(signals, 1);

        // Refused before any call, nothing advanced: a value not above the
        // floor (last entry), a length mismatch, a stream of another context.
        let other = Context::create(sim.backend(), 0, 0).unwrap();
        let elsewhere = Stream::new(&other).unwrap();
        let second = Stream::new(&ctx).unwrap();
        let calls = sim.calls();
        let r = set.signal(&stream, &[7, 7, 7, 6]);
        assert!(
            matches!(
                r,
                Err(Error::Validation(
                    ValidationError::FenceNotIncreasing { .. }
                ))
            ),
            "{r:?}"
        );
        assert!(matches!(
            set.signal(&stream, &[7, 7, 7]),
            Err(Error::Unsupported { .. })
        ));
        let r = set.signal(&elsewhere, &[7; 4]);
        assert!(matches!(r, Err(Error::WrongContext { .. })), "{r:?}");
        // A second stream that is not ordered after the first.
        let r = set.signal(&second, &[7; 4]);
        assert!(matches!(r, Err(Error::Validation(_))), "{r:?}");
        assert_eq!(sim.calls(), calls, "no driver call");
        set.signal(&stream, &[7; 4]).unwrap();
    }
    stream.synchronize().unwrap();
    assert!(sems.iter().all(|s| s.last_timeline_value() == Some(7)));
    assert!(exported.iter().all(|e| e.value() == 7));

    // What cannot change is refused when the set is made.
    assert!(matches!(
        TimelineSignals::new(&stream, std::iter::empty()),
        Err(Error::Unsupported { .. })
    ));
    let other = Context::create(sim.backend(), 0, 0).unwrap();
    let elsewhere = Stream::new(&other).unwrap();
    assert!(matches!(
        TimelineSignals::new(&elsewhere, sems.iter_mut()),
        Err(Error::WrongContext { .. })
    ));
    let (fd, _binary) = export::binary_semaphore().unwrap();
    let mut binary = ExternalSemaphore::binary_fd(&ctx, fd).unwrap();
    assert!(matches!(
        TimelineSignals::new(&stream, std::iter::once(&mut binary)),
        Err(Error::Validation(
            ValidationError::FenceValueNotSupported { .. }
        ))
    ));
    let (mut many, _e) = timelines(&ctx, MAX_BATCH + 1);
    assert!(TimelineSignals::new(&stream, many.iter_mut()).is_err());
}
