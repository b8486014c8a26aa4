//! Scenarios against the simulator: the seed scenarios, NvSciSync semaphores,
//! refusals that must not reach the driver, and failure injection at every
//! call of the main scenarios.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::time::Duration;

use tegra_interop_core::{
    ArrayDesc, ArrayFormat, BufferMapping, CuResult, DeterministicCounter, MipmappedArrayMapping,
    PrimitiveWidth, SemaphoreImport, SignalParams, StreamId, ValidationError, WaitParams,
};
use tegra_interop_driver::{
    Backend, Context, Error, ExternalMemory, ExternalSemaphore, SemaphoreSignal, SemaphoreWait,
    Stream, Tracking,
};
use tegra_interop_sim::{export, fence, Sim, SimConfig, SyncObjectSpec};
use tegra_interop_sys::nvsci::NvSciSyncFence;

const TIMEOUT: Duration = Duration::from_secs(5);

fn assert_clean(sim: &Sim) {
    assert!(sim.ledger().is_clean(), "leaked: {}", sim.ledger());
    let diagnostics = sim.diagnostics();
    assert!(
        diagnostics.is_empty(),
        "simulator diagnostics: {diagnostics:#?}"
    );
}

fn zero_fence() -> NvSciSyncFence {
    // SAFETY: NvSciSyncFence is plain integers; all-zero is the cleared fence.
    unsafe { std::mem::zeroed() }
}

// ---------------------------------------------------------------------------
// Seed scenario error-invalid-sync-object: a semaphore used on a stream of
// another context. The real driver answers a bare INVALID_VALUE; we refuse it
// before the call, naming both contexts.

#[test]
fn cross_context_is_refused_before_the_call_naming_both_contexts() {
    let sim = Sim::new().unwrap();
    let backend = sim.backend();
    let a = Context::primary(backend.clone(), 0).unwrap();
    let b = Context::create(backend.clone(), 0, 0).unwrap();
    let stream_b = Stream::new(&b).unwrap();
    let (fd, _exported) = export::timeline_semaphore(0).unwrap();
    let mut sem = ExternalSemaphore::timeline_fd(&a, fd).unwrap();

    let calls = sim.calls();
    let err = stream_b
        .signal(&mut sem, SignalParams::timeline(1))
        .unwrap_err();
    assert_eq!(
        err,
        Error::WrongContext {
            semaphore_ctx: a.id(),
            stream_ctx: b.id()
        }
    );
    let text = err.to_string();
    assert!(text.contains(&format!("context #{}", a.id().id)), "{text}");
    assert!(text.contains(&format!("context #{}", b.id().id)), "{text}");
    let err = stream_b
        .wait_batch(&[SemaphoreWait::timeline(&sem, 1)])
        .unwrap_err();
    assert!(matches!(err, Error::WrongContext { .. }));
    assert_eq!(sim.calls(), calls, "a refused call reached the driver");
    assert_eq!(sem.last_timeline_value(), Some(0));

    drop(sem);
    drop(stream_b);
    drop((a, b));
    drop(backend);
    assert_clean(&sim);
}

// ---------------------------------------------------------------------------
// Seed scenario error-driver-not-ready: handles released after the driver's
// exit handlers ran. Every destroy answers DEINITIALIZED; that is "already
// gone", not an error, and nothing panics.

#[test]
fn teardown_after_driver_shutdown_is_clean() {
    let sim = Sim::new().unwrap();
    let backend = sim.backend();
    let ctx = Context::primary(backend.clone(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let (mfd, _m) = export::memory(4096).unwrap();
    let memory = ExternalMemory::opaque_fd(&ctx, mfd, 4096).unwrap();
    let buffer = memory.map_whole().unwrap();
    let (sfd, _s) = export::timeline_semaphore(0).unwrap();
    let mut sem = ExternalSemaphore::timeline_fd(&ctx, sfd).unwrap();
    stream.signal(&mut sem, SignalParams::timeline(1)).unwrap();
    let (bfd, _b) = export::binary_semaphore().unwrap();
    let other = ExternalSemaphore::binary_fd(&ctx, bfd).unwrap();

    sim.shutdown();

    // An explicit destroy reports success: the driver freed everything.
    buffer.destroy().unwrap();
    other.destroy().unwrap();
    // The rest goes through Drop.
    drop(sem);
    drop(memory);
    drop(stream);
    ctx.destroy().unwrap();
    assert_eq!(backend.take_drop_errors(), vec![]);
    // Calls after shutdown say DEINITIALIZED with the project's hint.
    let err = Context::primary(backend.clone(), 0).unwrap_err();
    assert!(err.is_driver_shut_down(), "{err}");
    assert!(err.to_string().contains("shut"), "{err}");
    let diagnostics = sim.diagnostics();
    assert!(diagnostics.is_empty(), "{diagnostics:#?}");
}

// ---------------------------------------------------------------------------
// Refusals that must never reach the driver.

#[test]
fn validation_refusals_make_no_driver_call() {
    let sim = Sim::new().unwrap();
    let backend = sim.backend();
    let ctx = Context::primary(backend.clone(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let (mfd, _m) = export::memory(8192).unwrap();
    let memory = ExternalMemory::opaque_fd(&ctx, mfd, 8192).unwrap();
    let (tfd, _t) = export::timeline_semaphore(0).unwrap();
    let mut timeline = ExternalSemaphore::timeline_fd(&ctx, tfd).unwrap();
    stream
        .signal(&mut timeline, SignalParams::timeline(8))
        .unwrap();
    let buffer = memory.map_whole().unwrap();

    let calls = sim.calls();
    let (fd, _m2) = export::memory(4096).unwrap();
    let err = ExternalMemory::opaque_fd(&ctx, fd, 0).unwrap_err();
    assert_eq!(err.error, Error::Validation(ValidationError::ZeroSize));
    drop(err);
    assert!(memory.map_buffer(BufferMapping::new(8000, 500)).is_err());
    assert!(memory.map_buffer(BufferMapping::new(0, 0)).is_err());
    assert!(matches!(
        stream.signal(&mut timeline, SignalParams::timeline(3)),
        Err(Error::Validation(ValidationError::FenceNotIncreasing {
            last: 8,
            requested: 3
        }))
    ));
    assert!(matches!(
        stream.wait(&timeline, WaitParams::binary()),
        Err(Error::Validation(_))
    ));
    assert!(matches!(
        buffer.copy_from_host(8190, &[1, 2, 3]),
        Err(Error::OutOfBounds {
            offset: 8190,
            len: 3,
            size: 8192
        })
    ));
    let array = ArrayDesc::new_2d(64, 64, ArrayFormat::U8, 4).unwrap();
    assert!(matches!(
        memory.map_mipmapped_array(MipmappedArrayMapping::new(0, array, 1)),
        Err(Error::Validation(ValidationError::MappingOutOfRange { .. }))
    ));
    assert_eq!(
        sim.calls(),
        calls,
        "{:?}",
        &sim.call_log()[calls as usize..]
    );

    drop(buffer);
    drop((memory, timeline));
    drop(stream);
    drop(ctx);
    drop(backend);
    assert_clean(&sim);
}

#[test]
fn windows_only_kinds_are_refused_on_linux() {
    let sim = Sim::new().unwrap();
    let ctx = Context::primary(sim.backend(), 0).unwrap();
    let handle = std::ptr::without_provenance_mut::<std::ffi::c_void>(0x1234);
    let import = SemaphoreImport::opaque_win32_kmt(handle).unwrap();
    let calls = sim.calls();
    // SAFETY: refused before the call on Linux: the handle is never used.
    let err = unsafe { ExternalSemaphore::import_handle(&ctx, &import) }.unwrap_err();
    assert_eq!(
        err,
        Error::UnsupportedOnPlatform {
            kind: import.kind().name(),
            available_on: "Windows"
        }
    );
    assert!(err.to_string().contains("Windows"), "{err}");
    let mem =
        tegra_interop_core::MemoryImport::d3d12_resource(handle, std::ptr::null(), 4096).unwrap();
    // SAFETY: refused before the call on Linux.
    let err = unsafe { ExternalMemory::import_handle(&ctx, &mem) }.unwrap_err();
    assert!(matches!(err, Error::UnsupportedOnPlatform { .. }), "{err}");
    // fd kinds must go through the OwnedFd API.
    let fd_import = SemaphoreImport::opaque_fd(3).unwrap();
    // SAFETY: refused before the call: fd kinds are not accepted here.
    let err = unsafe { ExternalSemaphore::import_handle(&ctx, &fd_import) }.unwrap_err();
    assert_eq!(err, Error::Validation(ValidationError::HandleKindMismatch));
    assert_eq!(sim.calls(), calls);
}

#[test]
fn import_consumes_the_fd_only_on_success() {
    let sim = Sim::new().unwrap();
    let backend = sim.backend();
    let ctx = Context::primary(backend.clone(), 0).unwrap();
    let (fd, _m) = export::memory(4096).unwrap();
    sim.fail_symbol("cuImportExternalMemory", 0, CuResult::OUT_OF_MEMORY.0);
    let err = ExternalMemory::opaque_fd(&ctx, fd, 4096).unwrap_err();
    assert_eq!(err.error.code(), Some(CuResult::OUT_OF_MEMORY));
    assert_eq!(sim.ledger().open_fds, 0);
    // The same fd, handed back, imports fine; the simulator now holds it.
    let memory = ExternalMemory::opaque_fd(&ctx, err.fd, 4096).unwrap();
    assert_eq!(sim.ledger().open_fds, 1);
    memory.destroy().unwrap();
    assert_eq!(sim.ledger().open_fds, 0);
    drop(ctx);
    drop(backend);
    assert_clean(&sim);
}

// ---------------------------------------------------------------------------
// Mipmapped arrays, device queries, streams.

#[test]
fn mipmapped_array_maps_and_is_destroyed() {
    let sim = Sim::new().unwrap();
    let backend = sim.backend();
    let ctx = Context::primary(backend.clone(), 0).unwrap();
    let size = 1024 * 1024 * 4 * 2;
    let (fd, _m) = export::memory(size).unwrap();
    let memory = ExternalMemory::opaque_fd(&ctx, fd, size as u64).unwrap();
    let desc = ArrayDesc::new_2d(1024, 1024, ArrayFormat::U8, 4).unwrap();
    let array = memory
        .map_mipmapped_array(MipmappedArrayMapping::new(0, desc, 3))
        .unwrap();
    assert_eq!(array.levels(), 3);
    assert!(!array.level(0).unwrap().is_null());
    assert!(matches!(
        array.level(3),
        Err(Error::Validation(ValidationError::IndexOutOfRange {
            index: 3,
            len: 3
        }))
    ));
    assert_eq!(sim.ledger().live_mappings, 1);
    array.destroy().unwrap();
    assert_eq!(sim.ledger().live_mappings, 0);
    drop(memory);
    drop(ctx);
    drop(backend);
    assert_clean(&sim);
}

#[test]
fn device_queries() {
    let sim = Sim::with_config(SimConfig::tegra().with_devices(2)).unwrap();
    let backend = sim.backend();
    assert_eq!(backend.device_count().unwrap(), 2);
    assert_eq!(backend.driver_version().unwrap(), 12090);
    let device = backend.device(1).unwrap();
    assert_eq!(device.ordinal(), 1);
    assert!(!device.name().unwrap().is_empty());
    assert_ne!(
        device.uuid().unwrap(),
        backend.device(0).unwrap().uuid().unwrap()
    );
    assert!(device.is_integrated().unwrap());
    assert!(device.supports_timeline_semaphore_interop().unwrap());
    assert!(device.supports_dma_buf().unwrap());
    assert!(backend.device(2).is_err());
}

#[test]
fn streams_report_idle_and_synchronize() {
    let sim = Sim::new().unwrap();
    let backend = sim.backend();
    let ctx = Context::primary(backend.clone(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    assert!(stream.is_idle().unwrap());
    let (fd, exported) = export::timeline_semaphore(0).unwrap();
    let sem = ExternalSemaphore::timeline_fd(&ctx, fd).unwrap();
    stream.wait(&sem, WaitParams::timeline(1)).unwrap();
    assert!(!stream.is_idle().unwrap());
    exported.signal(1).unwrap();
    stream.synchronize().unwrap();
    assert!(stream.is_idle().unwrap());
    ctx.synchronize().unwrap();
    let default = Stream::default_stream(&ctx);
    assert!(default.as_raw().is_null());
    default.destroy().unwrap();
    drop(sem);
    stream.destroy().unwrap();
    drop(ctx);
    drop(backend);
    assert_clean(&sim);
}

#[test]
fn context_reset_needs_no_live_handles_and_only_primary() {
    let sim = Sim::new().unwrap();
    let backend = sim.backend();
    let mut ctx = Context::primary(backend.clone(), 0).unwrap();
    {
        let (fd, _s) = export::binary_semaphore().unwrap();
        let _sem = ExternalSemaphore::binary_fd(&ctx, fd).unwrap();
    }
    ctx.reset().unwrap();
    // Still usable after the reset.
    let (fd, _s) = export::binary_semaphore().unwrap();
    ExternalSemaphore::binary_fd(&ctx, fd)
        .unwrap()
        .destroy()
        .unwrap();
    let mut created = Context::create(backend.clone(), 0, 0).unwrap();
    assert!(!created.is_primary());
    assert!(matches!(created.reset(), Err(Error::Unsupported { .. })));
    drop(created);
    drop(ctx);
    drop(backend);
    assert_clean(&sim);
}

#[test]
fn timeline_initial_value_is_respected() {
    let sim = Sim::new().unwrap();
    let ctx = Context::primary(sim.backend(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let (fd, exported) = export::timeline_semaphore(10).unwrap();
    let mut sem = ExternalSemaphore::timeline_fd(&ctx, fd)
        .unwrap()
        .with_timeline_initial(10)
        .unwrap();
    assert!(matches!(
        stream.signal(&mut sem, SignalParams::timeline(10)),
        Err(Error::Validation(ValidationError::FenceNotIncreasing {
            last: 10,
            ..
        }))
    ));
    assert_eq!(
        stream.signal(&mut sem, SignalParams::timeline(11)).unwrap(),
        Some(11)
    );
    stream.synchronize().unwrap();
    assert_eq!(exported.value(), 11);
    let sem = sem.with_timeline_initial(0);
    assert!(matches!(sem, Err(Error::Unsupported { .. })));
}

// ---------------------------------------------------------------------------
// NvSciSync semaphores (simulated sync objects: deterministic +1 per signal).

fn nvsci_semaphore(
    ctx: &Context,
    object: &tegra_interop_sim::SyncObjectHandle,
) -> ExternalSemaphore {
    let import = SemaphoreImport::nvscisync(object.as_ptr()).unwrap();
    // SAFETY: `object` is a live simulated NvSciSync object.
    unsafe { ExternalSemaphore::import_handle(ctx, &import) }.unwrap()
}

#[test]
fn nvscisync_signal_is_deterministic_and_tracked() {
    let sim = Sim::with_config(SimConfig::tegra()).unwrap();
    let backend = sim.backend();
    let ctx = Context::primary(backend.clone(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let other = Stream::new(&ctx).unwrap();
    let object = sim.create_sync_object(SyncObjectSpec::default()).unwrap();
    let counter = DeterministicCounter::new(PrimitiveWidth::U32, 0).unwrap();
    let mut sem = nvsci_semaphore(&ctx, &object)
        .with_deterministic_counter(counter)
        .unwrap();

    for expected in 1..=3u64 {
        let mut fence = zero_fence();
        let value = signal_one(&stream, SemaphoreSignal::nvscisync(&mut sem, &mut fence)).unwrap();
        assert_eq!(value, Some(expected));
        match fence::decode(&fence) {
            fence::FenceContent::Fence(f) => assert_eq!(f.value, expected),
            other => panic!("the driver wrote no fence: {other:?}"),
        }
        stream.synchronize().unwrap();
        assert!(object.is_reached(&fence));
    }
    // A second stream without a stated ordering is refused before the call.
    let calls = sim.calls();
    let mut fence = zero_fence();
    let err = signal_one(&other, SemaphoreSignal::nvscisync(&mut sem, &mut fence)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Validation(ValidationError::StreamNotOrdered { .. })
        ),
        "{err}"
    );
    assert_eq!(sim.calls(), calls);
    // Once ordered, it may signal; the count continues at 4.
    assert!(matches!(sem.tracking(), Tracking::Deterministic(_)));
    sem.order_streams(&other, &stream).unwrap();
    assert_eq!(
        signal_one(&other, SemaphoreSignal::nvscisync(&mut sem, &mut fence)).unwrap(),
        Some(4)
    );
    other.synchronize().unwrap();
    assert_eq!(object.value(), 4);
    drop(sem);
    drop((stream, other));
    drop(ctx);
    drop(object);
    drop(backend);
    assert_clean(&sim);
}

#[test]
fn nvscisync_wait_and_batched_mixed_kinds() {
    let sim = Sim::with_config(SimConfig::tegra()).unwrap();
    let backend = sim.backend();
    let ctx = Context::primary(backend.clone(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let producer = sim.create_sync_object(SyncObjectSpec::default()).unwrap();
    let consumer = sim.create_sync_object(SyncObjectSpec::default()).unwrap();
    let wait_sem = nvsci_semaphore(&ctx, &producer);
    let mut signal_sem = nvsci_semaphore(&ctx, &consumer);
    let (tfd, timeline) = export::timeline_semaphore(0).unwrap();
    let mut t = ExternalSemaphore::timeline_fd(&ctx, tfd).unwrap();

    // Wait before the producer signals (deterministic fence built ahead).
    let ready = producer.cpu_signal();
    stream
        // SAFETY: `ready` is a fence the simulated NvSciSync produced for the
        // object `wait_sem` was imported from.
        .wait_batch(&[unsafe { SemaphoreWait::nvscisync(&wait_sem, &ready) }])
        .unwrap();
    stream.synchronize().unwrap();

    let mut done = zero_fence();
    let mut batch = [
        SemaphoreSignal::nvscisync(&mut signal_sem, &mut done),
        SemaphoreSignal::timeline(&mut t, 1),
    ];
    stream.signal_batch(&mut batch).unwrap();
    // No counter attached to this NvSciSync semaphore: nothing tracked.
    assert_eq!(
        batch.each_ref().map(SemaphoreSignal::tracked),
        [None, Some(1)]
    );
    assert!(consumer.cpu_wait(&done, TIMEOUT));
    assert!(timeline.wait(1, TIMEOUT));

    // The memsync-skip opt-in passes through on NvSciSync semaphores.
    let mut skipped = zero_fence();
    // SAFETY: no NvSciBuf memory is written before this signal.
    let signal = unsafe { SemaphoreSignal::nvscisync_skip_memsync(&mut signal_sem, &mut skipped) };
    assert!(signal.params().flags().bits() != 0);
    stream.signal_batch(&mut [signal]).unwrap();
    let next = producer.cpu_signal();
    // SAFETY: nothing after this wait reads NvSciBuf memory; `next` is a
    // fence the simulated NvSciSync produced for `wait_sem`'s object.
    let wait = unsafe { SemaphoreWait::nvscisync_skip_memsync(&wait_sem, &next) };
    stream.wait_batch(&[wait]).unwrap();
    stream.synchronize().unwrap();
    assert!(consumer.is_reached(&skipped));

    drop((wait_sem, signal_sem, t));
    drop(stream);
    drop(ctx);
    drop((producer, consumer));
    drop(backend);
    assert_clean(&sim);
}

#[test]
fn deterministic_counters_wrap_at_32_bits() {
    let sim = Sim::with_config(SimConfig::tegra()).unwrap();
    let ctx = Context::primary(sim.backend(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let spec = SyncObjectSpec {
        initial: u64::from(u32::MAX) - 1,
        ..SyncObjectSpec::default()
    };
    let object = sim.create_sync_object(spec).unwrap();
    let counter = DeterministicCounter::new(PrimitiveWidth::U32, u64::from(u32::MAX) - 1).unwrap();
    let mut sem = nvsci_semaphore(&ctx, &object)
        .with_deterministic_counter(counter)
        .unwrap();
    let mut fence = zero_fence();
    assert_eq!(
        signal_one(&stream, SemaphoreSignal::nvscisync(&mut sem, &mut fence)).unwrap(),
        Some(u64::from(u32::MAX))
    );
    assert_eq!(
        signal_one(&stream, SemaphoreSignal::nvscisync(&mut sem, &mut fence)).unwrap(),
        Some(0)
    );
    stream.synchronize().unwrap();
    assert_eq!(object.value() & 0xFFFF_FFFF, 0);
    // A counter only fits NvSciSync semaphores.
    let (fd, _b) = export::binary_semaphore().unwrap();
    let binary = ExternalSemaphore::binary_fd(&ctx, fd).unwrap();
    let counter = DeterministicCounter::new(PrimitiveWidth::U32, 0).unwrap();
    assert!(matches!(
        binary.with_deterministic_counter(counter),
        Err(Error::Unsupported { .. })
    ));
    let _ = StreamId(0);
}

// ---------------------------------------------------------------------------
// Failure injection: fail each call of a scenario in turn.

const INJECTED: CuResult = CuResult::OPERATING_SYSTEM;

/// Destroy/release entry points: a failed destroy is not retried (retrying a
/// destroy can be a double destroy, which crashes the real driver), so the
/// object it was meant to free stays in the simulator's ledger.
fn is_release(symbol: &str) -> bool {
    matches!(
        symbol,
        "cuDestroyExternalMemory"
            | "cuDestroyExternalSemaphore"
            | "cuMemFree"
            | "cuMipmappedArrayDestroy"
            | "cuStreamDestroy"
            | "cuCtxDestroy"
            | "cuDevicePrimaryCtxRelease"
    )
}

/// Import + map + data + signal/wait + explicit teardown.
fn single_frame(backend: &std::sync::Arc<Backend>) -> Result<Vec<u8>, Error> {
    let (mfd, exported) = export::memory(4096).unwrap();
    let (sfd, timeline) = export::timeline_semaphore(0).unwrap();
    let (bfd, binary) = export::binary_semaphore().unwrap();
    let ctx = Context::primary(backend.clone(), 0)?;
    let stream = Stream::new(&ctx)?;
    let memory = ExternalMemory::opaque_fd(&ctx, mfd, 4096)?;
    let buffer = memory.map_buffer(BufferMapping::new(0, 4096))?;
    let mut t = ExternalSemaphore::timeline_fd(&ctx, sfd)?;
    let b = ExternalSemaphore::binary_fd(&ctx, bfd)?;
    exported.write(0, b"camera frame").unwrap();
    binary.signal();
    stream.wait(&b, WaitParams::binary())?;
    let mut seen = vec![0; 12];
    buffer.copy_to_host(0, &mut seen)?;
    buffer.copy_from_host(100, b"processed")?;
    stream.signal(&mut t, SignalParams::timeline(1))?;
    stream.synchronize()?;
    if timeline.value() != 1 {
        return Err(Error::Unsupported {
            operation: "test",
            reason: "timeline not signalled",
        });
    }
    buffer.destroy()?;
    t.destroy()?;
    b.destroy()?;
    memory.destroy()?;
    stream.destroy()?;
    ctx.destroy()?;
    Ok(seen)
}

/// Three frames of batched waits and signals.
fn batched_frames(backend: &std::sync::Arc<Backend>) -> Result<(), Error> {
    let (mfd, _exported) = export::memory(1 << 16).unwrap();
    let (afd, a_exp) = export::timeline_semaphore(0).unwrap();
    let (bfd, b_exp) = export::timeline_semaphore(0).unwrap();
    let (cfd, c_exp) = export::binary_semaphore().unwrap();
    let ctx = Context::primary(backend.clone(), 0)?;
    let stream = Stream::new(&ctx)?;
    let memory = ExternalMemory::opaque_fd(&ctx, mfd, 1 << 16)?;
    let buffer = memory.map_whole()?;
    let a = ExternalSemaphore::timeline_fd(&ctx, afd)?;
    let mut b = ExternalSemaphore::timeline_fd(&ctx, bfd)?;
    let mut c = ExternalSemaphore::binary_fd(&ctx, cfd)?;
    for frame in 1..=3u64 {
        a_exp.signal(frame).unwrap();
        stream.wait_batch(&[SemaphoreWait::timeline(&a, frame)])?;
        buffer.copy_from_host(frame * 64, &frame.to_le_bytes())?;
        stream.signal_batch(&mut [
            SemaphoreSignal::timeline(&mut b, frame),
            SemaphoreSignal::binary(&mut c),
        ])?;
        stream.synchronize()?;
        assert!(b_exp.wait(frame, TIMEOUT));
        assert!(c_exp.wait(TIMEOUT));
    }
    buffer.destroy()?;
    a.destroy()?;
    b.destroy()?;
    c.destroy()?;
    memory.destroy()?;
    stream.destroy()?;
    ctx.destroy()?;
    Ok(())
}

fn inject_everywhere<T: std::fmt::Debug>(
    scenario: fn(&std::sync::Arc<Backend>) -> Result<T, Error>,
) {
    // A clean run first: it must succeed and tell how many calls it makes.
    let sim = Sim::new().unwrap();
    let backend = sim.backend();
    scenario(&backend).unwrap();
    let log = sim.call_log();
    drop(backend);
    assert_clean(&sim);
    drop(sim);
    assert!(log.len() > 10, "{log:?}");

    // Miri interprets every call, so under Miri the failure goes to every
    // MIRI_STRIDE-th call and to the last one; natively, to every call.
    const MIRI_STRIDE: usize = 6;
    let chosen =
        |index: usize| !cfg!(miri) || index.is_multiple_of(MIRI_STRIDE) || index + 1 == log.len();
    for (index, symbol) in log.iter().enumerate().filter(|(i, _)| chosen(*i)) {
        let sim = Sim::new().unwrap();
        let backend = sim.backend();
        sim.fail_at(index as u64, INJECTED.0);
        let result = scenario(&backend);
        // Binding the context before a release is best effort: the release
        // itself goes ahead and its own answer counts.
        let best_effort_bind =
            *symbol == "cuCtxSetCurrent" && log.get(index + 1).is_some_and(|next| is_release(next));
        let err = match result {
            Err(e) => e,
            Ok(_) if best_effort_bind => {
                drop(backend);
                assert_clean(&sim);
                continue;
            }
            Ok(v) => panic!("call #{index} ({symbol}) failed but the scenario succeeded: {v:?}"),
        };
        let recorded = backend.take_drop_errors();
        // The error is typed and names the failed call (directly, or the
        // failure was met by Drop during the unwinding of an earlier error).
        let named =
            err == Error::Driver {
                call: symbol,
                code: INJECTED,
            } || recorded.contains(&Error::Driver {
                call: symbol,
                code: INJECTED,
            });
        assert!(
            named || matches!(err, Error::Driver { code: INJECTED, .. }),
            "call #{index} ({symbol}): got {err:?}, drop errors {recorded:?}"
        );
        drop(backend);
        let ledger = sim.ledger();
        if is_release(symbol) {
            // At most the one object whose release failed stays (none when
            // its context was destroyed afterwards, which frees it).
            let leaked = ledger.live_contexts
                + ledger.primary_context_refs
                + ledger.live_streams
                + ledger.live_memories
                + ledger.live_mappings
                + ledger.live_semaphores;
            assert!(leaked <= 1, "call #{index} ({symbol}): {ledger}");
            assert!(ledger.open_fds <= 1, "call #{index} ({symbol}): {ledger}");
            assert_eq!(ledger.pending_work, 0, "call #{index} ({symbol}): {ledger}");
        } else {
            assert!(ledger.is_clean(), "call #{index} ({symbol}): {ledger}");
        }
        let diagnostics = sim.diagnostics();
        assert!(
            diagnostics.is_empty(),
            "call #{index} ({symbol}): {diagnostics:#?}"
        );
        assert_eq!(sim.injected_failures(), 1, "call #{index} ({symbol})");
    }
}

#[test]
fn failure_injection_single_frame() {
    inject_everywhere(single_frame);
}

#[test]
fn failure_injection_batched_frames() {
    inject_everywhere(batched_frames);
}

/// After a failed enqueue or mapping, the handles still work: retry the
/// same step and carry on to a clean teardown.
#[test]
fn handles_stay_usable_after_a_failed_step() {
    let steps = [
        "cuExternalMemoryGetMappedBuffer",
        "cuMemcpyHtoD",
        "cuMemcpyDtoH",
        "cuSignalExternalSemaphoresAsync",
        "cuWaitExternalSemaphoresAsync",
        "cuStreamSynchronize",
        "cuImportExternalMemory",
        "cuImportExternalSemaphore",
    ];
    for step in steps {
        let sim = Sim::new().unwrap();
        let backend = sim.backend();
        sim.fail_symbol(step, 0, INJECTED.0);
        let ctx = Context::primary(backend.clone(), 0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let (mfd, exported) = export::memory(4096).unwrap();
        let memory = ExternalMemory::opaque_fd(&ctx, mfd, 4096)
            .or_else(|e| {
                assert_eq!(e.error.code(), Some(INJECTED));
                ExternalMemory::opaque_fd(&ctx, e.fd, 4096)
            })
            .unwrap();
        let buffer = memory
            .map_whole()
            .or_else(|e| {
                assert_eq!(e.code(), Some(INJECTED));
                memory.map_whole()
            })
            .unwrap();
        let (sfd, timeline) = export::timeline_semaphore(0).unwrap();
        let mut sem = ExternalSemaphore::timeline_fd(&ctx, sfd)
            .or_else(|e| ExternalSemaphore::timeline_fd(&ctx, e.fd))
            .unwrap();
        buffer
            .copy_from_host(0, b"abc")
            .or_else(|_| buffer.copy_from_host(0, b"abc"))
            .unwrap();
        let mut back = [0u8; 3];
        buffer
            .copy_to_host(0, &mut back)
            .or_else(|_| buffer.copy_to_host(0, &mut back))
            .unwrap();
        assert_eq!(&back, b"abc");
        let mut read = [0u8; 3];
        exported.read(0, &mut read).unwrap();
        assert_eq!(&read, b"abc");
        // The failed signal did not consume value 1: retrying it works.
        if stream.signal(&mut sem, SignalParams::timeline(1)).is_err() {
            assert_eq!(sem.last_timeline_value(), Some(0));
            stream.signal(&mut sem, SignalParams::timeline(1)).unwrap();
        }
        assert_eq!(sem.last_timeline_value(), Some(1));
        if stream.wait(&sem, WaitParams::timeline(1)).is_err() {
            stream.wait(&sem, WaitParams::timeline(1)).unwrap();
        }
        stream
            .synchronize()
            .or_else(|_| stream.synchronize())
            .unwrap();
        assert_eq!(timeline.value(), 1);
        assert_eq!(sim.injected_failures(), 1, "{step} never failed");
        drop(buffer);
        drop(sem);
        drop(memory);
        drop(stream);
        drop(ctx);
        assert_eq!(backend.take_drop_errors(), vec![], "{step}");
        drop(backend);
        assert_clean(&sim);
    }
}

/// One signal through the batch call; the value it tracked.
fn signal_one(stream: &Stream, signal: SemaphoreSignal<'_>) -> Result<Option<u64>, Error> {
    let mut batch = [signal];
    stream.signal_batch(&mut batch)?;
    Ok(batch[0].tracked())
}
