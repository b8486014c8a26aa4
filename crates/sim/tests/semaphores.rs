//! External semaphores: binary, timeline, NvSciSync-like; stream ordering.
#![allow(
    clippy::unwrap_used,
    clippy::field_reassign_with_default,
    clippy::redundant_closure_call
)]
mod common;
use common::*;
use std::time::Duration;
use tegra_interop_sim::fence::{self, FenceContent};
use tegra_interop_sim::SyncObjectSpec;
use tegra_interop_sys::nvsci::NvSciSyncFence;

const SEC: Duration = Duration::from_secs(5);

#[test]
fn binary_signal_reaches_the_exporter() {
    let c = Cu::new();
    let ctx = c.ctx();
    let s = c.stream();
    let (fd, exp) = export::binary_semaphore().unwrap();
    let sem = c.import_binary(fd);
    assert_eq!(c.signal(sem, 0, 0, s), SUCCESS);
    assert!(exp.wait(SEC));
    assert!(
        !exp.is_signaled(),
        "the exporter's wait consumed the signal"
    );
    assert_eq!(c.sync(s), SUCCESS);
    assert_eq!(cu!(c.t, cuDestroyExternalSemaphore(sem)), SUCCESS);
    assert_eq!(cu!(c.t, cuStreamDestroy(s)), SUCCESS);
    assert_eq!(cu!(c.t, cuCtxDestroy(ctx)), SUCCESS);
    assert!(c.sim.ledger().is_clean(), "{}", c.sim.ledger());
}

#[test]
fn wait_blocks_the_stream_until_the_exporter_signals() {
    let c = Cu::new();
    let _ctx = c.ctx();
    let s = c.stream();
    let (fd, exp) = export::binary_semaphore().unwrap();
    let sem = c.import_binary(fd);
    let (tfd, tl) = export::timeline_semaphore(0).unwrap();
    let done = c.import_timeline(tfd);
    // Wait enqueued before anything signals it.
    assert_eq!(c.wait(sem, 0, 0, s), SUCCESS);
    assert_eq!(c.signal(done, 1, 0, s), SUCCESS);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(c.query(s), NOT_READY);
    assert!(c.sim.ledger().pending_work >= 1);
    assert_eq!(tl.value(), 0, "the signal after the wait has not run");
    exp.signal();
    assert_eq!(c.sync(s), SUCCESS);
    assert_eq!(c.query(s), SUCCESS);
    assert_eq!(tl.value(), 1);
    assert_eq!(c.sim.ledger().pending_work, 0);
}

#[test]
fn stream_work_runs_in_order() {
    let c = Cu::new();
    let _ctx = c.ctx();
    let s = c.stream();
    let (fd, tl) = export::timeline_semaphore(0).unwrap();
    let sem = c.import_timeline(fd);
    let (gfd, gate) = export::timeline_semaphore(0).unwrap();
    let g = c.import_timeline(gfd);
    assert_eq!(c.wait(g, 1, 0, s), SUCCESS);
    for v in 1..=50 {
        assert_eq!(c.signal(sem, v, 0, s), SUCCESS);
    }
    assert_eq!(c.query(s), NOT_READY);
    assert_eq!(tl.value(), 0);
    gate.signal(1).unwrap();
    assert_eq!(c.sync(s), SUCCESS);
    assert_eq!(tl.value(), 50);
}

#[test]
fn timeline_goes_back_and_rejects_flags() {
    let c = Cu::new();
    let _ctx = c.ctx();
    let s = c.stream();
    let (fd, tl) = export::timeline_semaphore(0).unwrap();
    let sem = c.import_timeline(fd);
    assert_eq!(c.signal(sem, 8, 0, s), SUCCESS);
    assert_eq!(c.sync(s), SUCCESS);
    assert_eq!(tl.value(), 8);
    // Measured: a smaller value succeeds and really sets the counter back.
    assert_eq!(c.signal(sem, 3, 0, s), SUCCESS);
    assert_eq!(c.sync(s), SUCCESS);
    assert_eq!(tl.value(), 3);
    // Skip-memsync on a timeline semaphore: INVALID_VALUE (signal and wait).
    assert_eq!(c.signal(sem, 4, 1, s), INVALID_VALUE);
    assert_eq!(c.wait(sem, 4, 2, s), INVALID_VALUE);
    // Waiting on a reached value completes at once.
    assert_eq!(c.wait(sem, 2, 0, s), SUCCESS);
    assert_eq!(c.sync(s), SUCCESS);
    // CUDA waits on an exporter signal.
    assert_eq!(c.wait(sem, 10, 0, s), SUCCESS);
    assert_eq!(c.query(s), NOT_READY);
    tl.signal(10).unwrap();
    assert_eq!(c.sync(s), SUCCESS);
}

/// The exporter stands in for Vulkan, whose host signal must move a
/// timeline forward (VUID-VkSemaphoreSignalInfo-value-03258): a late host
/// `signal(1)` after CUDA's 2 is refused with a typed error and the counter
/// keeps CUDA's value (before, it silently went back to 1). CUDA's own
/// smaller signal still goes back, as measured (test above).
#[test]
fn a_late_host_signal_does_not_move_the_timeline_back() {
    let c = Cu::new();
    let _ctx = c.ctx();
    let s = c.stream();
    let (fd, tl) = export::timeline_semaphore(0).unwrap();
    let sem = c.import_timeline(fd);
    assert_eq!(c.signal(sem, 2, 0, s), SUCCESS);
    assert_eq!(c.sync(s), SUCCESS);
    assert_eq!(tl.value(), 2);
    for late in [1, 2] {
        let refused = tl.signal(late).unwrap_err();
        assert_eq!(
            refused,
            export::TimelineNotIncreasing {
                value: late,
                current: 2
            }
        );
        let text = refused.to_string();
        assert!(
            text.contains("already at 2") && text.contains("03258"),
            "{text}"
        );
        assert_eq!(tl.value(), 2, "signal({late}) moved the timeline");
    }
    // A CUDA wait for 2 still passes at once; a larger host signal works.
    assert_eq!(c.wait(sem, 2, 0, s), SUCCESS);
    assert_eq!(c.sync(s), SUCCESS);
    tl.signal(3).unwrap();
    assert_eq!(tl.value(), 3);
    assert!(c.sim.diagnostics().is_empty(), "{:?}", c.sim.diagnostics());
}

#[test]
fn binary_semaphore_flags_and_kind_checks() {
    let c = Cu::new();
    let _ctx = c.ctx();
    let s = c.stream();
    let (fd, _exp) = export::binary_semaphore().unwrap();
    let sem = c.import_binary(fd);
    assert_eq!(c.signal(sem, 0, 1, s), INVALID_VALUE);
    assert_eq!(c.wait(sem, 0, 4, s), INVALID_VALUE);
    // A binary semaphore fd imported as a timeline one is refused, fd kept.
    let (fd, _exp2) = export::binary_semaphore().unwrap();
    let t = Tracked::new(fd);
    assert_eq!(c.import_sem_raw(9, t.raw).0, INVALID_VALUE);
    assert!(t.still_open());
    // Memory is not a semaphore: UNKNOWN and the fd stays open (measured
    // with a memfd on the H200), binary and timeline; /dev/null the same.
    let (mfd, _m) = export::memory(4096).unwrap();
    let mt = Tracked::new(mfd);
    assert_eq!(c.import_sem_raw(1, mt.raw).0, UNKNOWN);
    assert_eq!(c.import_sem_raw(9, mt.raw).0, UNKNOWN);
    mt.close();
    let null = Tracked::new(std::fs::File::open("/dev/null").unwrap().into());
    assert_eq!(c.import_sem_raw(1, null.raw).0, UNKNOWN);
    assert_eq!(c.import_sem_raw(9, null.raw).0, UNKNOWN);
    null.close();
    // Injected failures leave the fd too (the driver left it open on failure).
    let (ifd, _exp3) = export::binary_semaphore().unwrap();
    let it = Tracked::new(ifd);
    c.sim.fail_at(c.sim.calls(), 999);
    assert_eq!(c.import_sem_raw(1, it.raw).0, UNKNOWN);
    assert!(it.still_open());
    it.close();
    // Windows kinds (NOT_SUPPORTED, chosen like the measured OPAQUE_WIN32
    // memory import), fd -1, NULL NvSciSync object.
    for kind in [2, 3, 4, 5, 7, 8, 10] {
        assert_eq!(
            c.import_sem_raw(kind, t.raw).0,
            NOT_SUPPORTED,
            "kind {kind}"
        );
    }
    assert!(t.still_open());
    assert_eq!(c.import_sem_raw(1, -1).0, UNKNOWN);
    let mut d = CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC::default();
    d.type_ = CUexternalSemaphoreHandleType(6);
    let mut out: CUexternalSemaphore = std::ptr::null_mut();
    assert_eq!(
        cu!(c.t, cuImportExternalSemaphore(&mut out, &d)),
        INVALID_VALUE
    );
    // Success consumes the fd.
    let (r, sem2) = c.import_sem_raw(1, t.raw);
    assert_eq!(r, SUCCESS);
    assert!(!t.still_open());
    assert_eq!(cu!(c.t, cuDestroyExternalSemaphore(sem2)), SUCCESS);
}

#[test]
fn destroyed_semaphore_and_double_destroy_are_caught() {
    let c = Cu::new();
    let _ctx = c.ctx();
    let s = c.stream();
    let (fd, _exp) = export::binary_semaphore().unwrap();
    let sem = c.import_binary(fd);
    assert_eq!(cu!(c.t, cuDestroyExternalSemaphore(sem)), SUCCESS);
    // Measured: signal on a destroyed semaphore -> INVALID_VALUE.
    assert_eq!(c.signal(sem, 0, 0, s), INVALID_VALUE);
    assert!(c.has_diag(DiagnosticKind::UseAfterDestroy));
    // The real driver segfaults here; the simulator reports it.
    assert_eq!(cu!(c.t, cuDestroyExternalSemaphore(sem)), INVALID_VALUE);
    let d = c.sim.diagnostics();
    let dd = d
        .iter()
        .find(|d| d.kind == DiagnosticKind::DoubleDestroy)
        .unwrap();
    assert_eq!(dd.symbol, "cuDestroyExternalSemaphore");
    assert!(dd.kind.real_driver_would_crash());
}

#[test]
fn semaphore_from_another_context_is_refused() {
    let c = Cu::new();
    let a = c.ctx();
    let (fd, _exp) = export::binary_semaphore().unwrap();
    let sem = c.import_binary(fd);
    let mut b: CUcontext = std::ptr::null_mut();
    assert_eq!(cu!(c.t, cuCtxCreate(&mut b, 0, 0)), SUCCESS);
    let sb = c.stream();
    // Measured: INVALID_VALUE.
    assert_eq!(c.signal(sem, 0, 0, sb), INVALID_VALUE);
    assert_eq!(c.wait(sem, 0, 0, sb), INVALID_VALUE);
    assert!(c.has_diag(DiagnosticKind::CrossContext));
    // The NULL stream of context A is fine.
    assert_eq!(cu!(c.t, cuCtxSetCurrent(a)), SUCCESS);
    assert_eq!(c.signal(sem, 0, 0, std::ptr::null_mut()), SUCCESS);
    assert_eq!(c.sync(std::ptr::null_mut()), SUCCESS);
}

#[test]
fn destroy_after_primary_reset_is_caught() {
    let c = Cu::new();
    assert_eq!(cu!(c.t, cuInit(0)), SUCCESS);
    let mut p: CUcontext = std::ptr::null_mut();
    assert_eq!(cu!(c.t, cuDevicePrimaryCtxRetain(&mut p, 0)), SUCCESS);
    assert_eq!(cu!(c.t, cuCtxSetCurrent(p)), SUCCESS);
    let (fd, _exp) = export::timeline_semaphore(0).unwrap();
    let sem = c.import_timeline(fd);
    // Measured: reset with a live semaphore succeeds...
    assert_eq!(cu!(c.t, cuDevicePrimaryCtxReset(0)), SUCCESS);
    assert_eq!(c.sim.ledger().live_semaphores, 0);
    assert_eq!(c.sim.ledger().open_fds, 0);
    // ...and destroying it afterwards segfaults the real driver.
    assert_eq!(
        cu!(c.t, cuDestroyExternalSemaphore(sem)),
        CONTEXT_IS_DESTROYED
    );
    assert!(c.has_diag(DiagnosticKind::UseAfterContextLoss));
    assert_eq!(cu!(c.t, cuDevicePrimaryCtxRelease(0)), SUCCESS);
    assert!(c.sim.ledger().is_clean());
}

#[test]
fn batched_signal_and_wait() {
    let c = Cu::new();
    let _ctx = c.ctx();
    let s = c.stream();
    let mut exps = Vec::new();
    let mut sems = Vec::new();
    for i in 0..8 {
        let (fd, e) = export::timeline_semaphore(i).unwrap();
        sems.push(c.import_timeline(fd));
        exps.push(e);
    }
    let mut params = vec![CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default(); 8];
    for (i, p) in params.iter_mut().enumerate() {
        p.params.fence.value = 100 + i as u64;
    }
    assert_eq!(
        cu!(
            c.t,
            cuSignalExternalSemaphoresAsync(sems.as_ptr(), params.as_ptr(), 8, s)
        ),
        SUCCESS
    );
    assert_eq!(c.sync(s), SUCCESS);
    for (i, e) in exps.iter().enumerate() {
        assert_eq!(e.value(), 100 + i as u64);
    }
    // One bad element fails the whole batch and nothing is enqueued.
    params[5].flags = 1;
    for p in params.iter_mut() {
        p.params.fence.value += 1000;
    }
    assert_eq!(
        cu!(
            c.t,
            cuSignalExternalSemaphoresAsync(sems.as_ptr(), params.as_ptr(), 8, s)
        ),
        INVALID_VALUE
    );
    assert_eq!(c.sync(s), SUCCESS);
    assert_eq!(exps[0].value(), 100);
    // Batched wait: waits for all.
    let mut wp = vec![CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default(); 8];
    for p in wp.iter_mut() {
        p.params.fence.value = 500;
    }
    assert_eq!(
        cu!(
            c.t,
            cuWaitExternalSemaphoresAsync(sems.as_ptr(), wp.as_ptr(), 8, s)
        ),
        SUCCESS
    );
    for e in &exps[..7] {
        e.signal(500).unwrap();
    }
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(c.query(s), NOT_READY);
    exps[7].signal(500).unwrap();
    assert_eq!(c.sync(s), SUCCESS);
    // Reserved fields must be zero; NULL arrays refused; zero count is a no-op.
    let mut bad = CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
    bad.reserved[3] = 1;
    assert_eq!(
        cu!(
            c.t,
            cuSignalExternalSemaphoresAsync(sems.as_ptr(), &bad, 1, s)
        ),
        INVALID_VALUE
    );
    assert_eq!(
        cu!(
            c.t,
            cuSignalExternalSemaphoresAsync(std::ptr::null(), params.as_ptr(), 1, s)
        ),
        INVALID_VALUE
    );
    assert_eq!(
        cu!(
            c.t,
            cuSignalExternalSemaphoresAsync(std::ptr::null(), std::ptr::null(), 0, s)
        ),
        SUCCESS
    );
}

#[test]
fn destroying_a_semaphore_with_queued_work_is_reported() {
    let c = Cu::new();
    let _ctx = c.ctx();
    let s = c.stream();
    let (fd, tl) = export::timeline_semaphore(0).unwrap();
    let sem = c.import_timeline(fd);
    assert_eq!(c.wait(sem, 5, 0, s), SUCCESS);
    assert_eq!(cu!(c.t, cuDestroyExternalSemaphore(sem)), SUCCESS);
    assert!(c.has_diag(DiagnosticKind::OutstandingWork));
    // The queued wait still works on the shared state.
    tl.signal(5).unwrap();
    assert_eq!(c.sync(s), SUCCESS);
}

#[test]
fn hang_is_reported_not_deadlocked() {
    let c = Cu::with(SimConfig::default().with_hang_timeout(Duration::from_millis(100)));
    let _ctx = c.ctx();
    let s = c.stream();
    let (fd, _tl) = export::timeline_semaphore(0).unwrap();
    let sem = c.import_timeline(fd);
    assert_eq!(c.wait(sem, 1, 0, s), SUCCESS);
    assert_eq!(c.sync(s), 909);
    assert!(c.has_diag(DiagnosticKind::Hang));
    // Dropping the Sim cancels the stuck wait.
}

fn nvsci_signal(
    c: &Cu,
    sem: CUexternalSemaphore,
    s: CUstream,
    flags: u32,
) -> (u32, NvSciSyncFence) {
    let mut f = NvSciSyncFence::default();
    let mut p = CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS::default();
    p.params.nvSciSync.fence = (&mut f as *mut NvSciSyncFence).cast();
    p.flags = flags;
    let r = cu!(c.t, cuSignalExternalSemaphoresAsync(&sem, &p, 1, s));
    (r, f)
}

fn nvsci_wait(c: &Cu, sem: CUexternalSemaphore, s: CUstream, f: &NvSciSyncFence) -> u32 {
    let mut p = CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS::default();
    p.params.nvSciSync.fence = (f as *const NvSciSyncFence).cast_mut().cast();
    cu!(c.t, cuWaitExternalSemaphoresAsync(&sem, &p, 1, s))
}

fn import_sync(c: &Cu, obj: *mut std::ffi::c_void) -> (u32, CUexternalSemaphore) {
    let mut d = CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC::default();
    d.type_ = CUexternalSemaphoreHandleType(6);
    d.handle.nvSciSyncObj = obj;
    let mut s: CUexternalSemaphore = std::ptr::null_mut();
    let r = cu!(c.t, cuImportExternalSemaphore(&mut s, &d));
    (r, s)
}

#[test]
fn nvscisync_is_deterministic_and_wraps_at_32_bits() {
    let c = Cu::with(SimConfig::tegra());
    let _ctx = c.ctx();
    let s = c.stream();
    let obj = c
        .sim
        .create_sync_object(SyncObjectSpec {
            initial: 0xffff_fffe,
            ..SyncObjectSpec::default()
        })
        .unwrap();
    let (r, sem) = import_sync(&c, obj.as_ptr());
    assert_eq!(r, SUCCESS);
    let mut values = Vec::new();
    for _ in 0..4 {
        let (r, f) = nvsci_signal(&c, sem, s, 0);
        assert_eq!(r, SUCCESS);
        match fence::decode(&f) {
            FenceContent::Fence(sf) => {
                assert_eq!(sf.object_id, obj.id());
                values.push(sf.value);
            }
            other => panic!("{other:?}"),
        }
    }
    // +1 per signal, decided at enqueue time, wrapping at 2^32.
    assert_eq!(values, vec![0xffff_ffff, 0, 1, 2]);
    assert_eq!(c.sync(s), SUCCESS);
    assert_eq!(obj.value(), 2);
    // Skip-memsync is allowed on NvSciSync semaphores.
    let (r, f) = nvsci_signal(&c, sem, s, 1);
    assert_eq!(r, SUCCESS);
    assert!(obj.cpu_wait(&f, SEC));
    assert_eq!(nvsci_signal(&c, sem, s, 2).0, INVALID_VALUE);
}

#[test]
fn nvscisync_wait_before_signal_and_permissions() {
    let c = Cu::with(SimConfig::tegra());
    let _ctx = c.ctx();
    let s = c.stream();
    let obj = c.sim.create_sync_object(SyncObjectSpec::default()).unwrap();
    let (_, sem) = import_sync(&c, obj.as_ptr());
    let (gfd, gate) = export::timeline_semaphore(0).unwrap();
    let g = c.import_timeline(gfd);
    // The CPU will signal value 1; CUDA waits for it before it is signalled.
    let f1 = fence::encode(fence::SimFence {
        object_id: obj.id(),
        value: 1,
    });
    assert_eq!(nvsci_wait(&c, sem, s, &f1), SUCCESS);
    assert_eq!(c.signal(g, 1, 0, s), SUCCESS);
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(c.query(s), NOT_READY);
    let cpu = obj.cpu_signal();
    assert_eq!(cpu, f1);
    assert_eq!(c.sync(s), SUCCESS);
    assert_eq!(gate.value(), 1);
    // A cleared fence is a no-op wait; garbage is refused.
    assert_eq!(nvsci_wait(&c, sem, s, &NvSciSyncFence::default()), SUCCESS);
    assert_eq!(
        nvsci_wait(&c, sem, s, &NvSciSyncFence { payload: [1; 6] }),
        INVALID_VALUE
    );
    // Permissions: a wait-only object cannot be signalled by CUDA.
    let wait_only = c
        .sim
        .create_sync_object(SyncObjectSpec {
            can_signal: false,
            ..SyncObjectSpec::default()
        })
        .unwrap();
    let (_, ws) = import_sync(&c, wait_only.as_ptr());
    assert_eq!(nvsci_signal(&c, ws, s, 0).0, NOT_SUPPORTED);
    let signal_only = c
        .sim
        .create_sync_object(SyncObjectSpec {
            can_wait: false,
            ..SyncObjectSpec::default()
        })
        .unwrap();
    let (_, ss) = import_sync(&c, signal_only.as_ptr());
    assert_eq!(
        nvsci_wait(&c, ss, s, &NvSciSyncFence::default()),
        NOT_SUPPORTED
    );
    // Another object's fence is refused.
    assert_eq!(nvsci_wait(&c, ws, s, &f1), INVALID_VALUE);
}

#[test]
fn nvscisync_without_nvsci_is_not_supported() {
    let c = Cu::new();
    let _ctx = c.ctx();
    let mut junk = 0u64;
    let (r, _) = import_sync(&c, (&mut junk as *mut u64).cast());
    assert_eq!(r, NOT_SUPPORTED);
}
