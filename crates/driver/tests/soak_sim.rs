//! Soak test on the simulator: many signal/wait cycles through deterministic
//! NvSciSync counters that wrap at 32 bits, alternating between two streams
//! whose order the test states explicitly (and enforces with the waits).
//!
//! The number of cycles comes from `TEGRA_INTEROP_SOAK_CYCLES` (default
//! 200,000 so a plain `cargo test` stays quick; 128 under Miri); CI runs 10,000,000 in a
//! release build (`.ci/run`, step `soak`). One cycle is one semaphore signal
//! matched by one wait; each iteration moves 8 semaphores in one batched
//! signal call and one batched wait call.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::time::Instant;

use tegra_interop_core::{DeterministicCounter, PrimitiveWidth, SemaphoreImport};
use tegra_interop_driver::{
    Context, ExternalSemaphore, SemaphoreSignal, SemaphoreWait, Stream, Tracking,
};
use tegra_interop_sim::{Sim, SimConfig, SyncObjectHandle, SyncObjectSpec};
use tegra_interop_sys::nvsci::NvSciSyncFence;

const LANES: usize = 8;
/// Starting values close to the 32-bit limit, so the counters wrap early
/// (under Miri, within the first few iterations of its small default).
const INITIAL: u64 = u32::MAX as u64 - if cfg!(miri) { 8 } else { 1_000 };
/// Iterations between host synchronisations (bounds the queued work).
const SYNC_EVERY: u64 = if cfg!(miri) { 4 } else { 4_096 };

fn cycles() -> u64 {
    std::env::var("TEGRA_INTEROP_SOAK_CYCLES")
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        // Miri interprets every step, so its default is tiny (enough to
        // wrap the counters, see INITIAL); the variable still overrides it.
        .unwrap_or(if cfg!(miri) { 128 } else { 200_000 })
}

fn import(ctx: &Context, object: &SyncObjectHandle) -> ExternalSemaphore {
    let import = SemaphoreImport::nvscisync(object.as_ptr()).unwrap();
    // SAFETY: `object` is a live simulated NvSciSync object that outlives the semaphore.
    unsafe { ExternalSemaphore::import_handle(ctx, &import) }.unwrap()
}

fn zero_fence() -> NvSciSyncFence {
    // SAFETY: NvSciSyncFence is plain integers; all-zero is the cleared fence.
    unsafe { std::mem::zeroed() }
}

#[test]
fn deterministic_fences_soak_with_32_bit_wrap_and_two_ordered_streams() {
    let total_cycles = cycles();
    let iterations = total_cycles.div_ceil(LANES as u64);
    let sim = Sim::with_config(SimConfig::tegra()).unwrap();
    let backend = sim.backend();
    let ctx = Context::primary(backend.clone(), 0).unwrap();
    let streams = [Stream::new(&ctx).unwrap(), Stream::new(&ctx).unwrap()];

    let spec = SyncObjectSpec {
        initial: INITIAL,
        ..SyncObjectSpec::default()
    };
    let objects: Vec<SyncObjectHandle> = (0..LANES)
        .map(|_| sim.create_sync_object(spec).unwrap())
        .collect();
    let mut sems: Vec<ExternalSemaphore> = objects
        .iter()
        .map(|o| {
            let counter = DeterministicCounter::new(PrimitiveWidth::U32, INITIAL).unwrap();
            let mut sem = import(&ctx, o).with_deterministic_counter(counter).unwrap();
            // The explicit ordering statements, both directions. The test keeps
            // them true: a stream signals only after it waited for the other
            // stream's previous signal of the same semaphore.
            assert!(matches!(sem.tracking(), Tracking::Deterministic(_)));
            sem.order_streams(&streams[1], &streams[0]).unwrap();
            sem.order_streams(&streams[0], &streams[1]).unwrap();
            sem
        })
        .collect();

    let mut fences = [zero_fence(); LANES];
    let started = Instant::now();
    let mut expected = INITIAL;
    for i in 0..iterations {
        let signaller = &streams[(i % 2) as usize];
        let waiter = &streams[((i + 1) % 2) as usize];
        let mut signals: [SemaphoreSignal<'_>; LANES] = {
            let mut it = sems.iter_mut().zip(fences.iter_mut());
            std::array::from_fn(|_| {
                let (sem, fence) = it.next().unwrap();
                SemaphoreSignal::nvscisync(sem, fence)
            })
        };
        signaller.signal_batch(&mut signals).unwrap();
        expected = (expected + 1) & u64::from(u32::MAX);
        for value in signals.iter().map(SemaphoreSignal::tracked) {
            // No drift: every counter produced exactly the next value, wrapped.
            assert_eq!(value, Some(expected), "iteration {i}");
        }
        let waits: [SemaphoreWait<'_>; LANES] =
            // SAFETY: each fence was just filled by the signal on the same
            // object (above) and is not modified.
            std::array::from_fn(|k| unsafe { SemaphoreWait::nvscisync(&sems[k], &fences[k]) });
        waiter.wait_batch(&waits).unwrap();
        if i % SYNC_EVERY == SYNC_EVERY - 1 {
            waiter.synchronize().unwrap();
        }
    }
    for s in &streams {
        s.synchronize().unwrap();
    }
    let elapsed = started.elapsed();

    for (k, object) in objects.iter().enumerate() {
        assert_eq!(
            object.value() & u64::from(u32::MAX),
            expected,
            "lane {k}: the simulated primitive drifted from the tracked count"
        );
        match sems[k].tracking() {
            Tracking::Deterministic(c) => assert_eq!(
                c.next_signal_value(),
                (expected + 1) & u64::from(u32::MAX),
                "lane {k}: the next value does not follow"
            ),
            other => panic!("tracking {other:?}"),
        }
    }
    assert!(
        INITIAL + iterations > u64::from(u32::MAX),
        "the run must cross the 32-bit wrap"
    );
    eprintln!(
        "soak: {} signal/wait cycles ({} batched iterations x {LANES}) in {:.2?}",
        iterations * LANES as u64,
        iterations,
        elapsed
    );

    drop(sems);
    drop(streams);
    drop(ctx);
    drop(objects);
    drop(backend);
    assert!(sim.ledger().is_clean(), "leaked: {}", sim.ledger());
    let diagnostics = sim.diagnostics();
    assert!(diagnostics.is_empty(), "diagnostics: {diagnostics:#?}");
}
