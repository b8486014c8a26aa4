//! The test harness features: failure injection, call counting, ledger,
//! shutdown, isolation of parallel simulators, the driver backend.
#![allow(
    clippy::unwrap_used,
    clippy::field_reassign_with_default,
    clippy::redundant_closure_call
)]
mod common;
use common::*;
use std::time::Duration;

/// A full scenario written like careful C: import, map, signal/wait, copy,
/// teardown; on the first failure it releases what it made and returns the
/// failing code. Returns the fd it handed to the memory import so the
/// caller can check its ownership, and the number of calls made before the
/// teardown started.
fn scenario(c: &Cu) -> (Result<(), u32>, Tracked, export::ExportedMemory, u64) {
    let (mfd, mem) = export::memory(4096).unwrap();
    mem.write(0, b"frame").unwrap();
    let tracked = Tracked::new(mfd);
    let mut before_teardown = 0;
    let r = (|| {
        let mut undo: Vec<Box<dyn FnOnce()>> = Vec::new();
        let res = (|| -> Result<(), u32> {
            let ok = |r: u32| if r == SUCCESS { Ok(()) } else { Err(r) };
            ok(cu!(c.t, cuInit(0)))?;
            let mut ctx: CUcontext = std::ptr::null_mut();
            ok(cu!(c.t, cuCtxCreate(&mut ctx, 0, 0)))?;
            let t = c.t;
            undo.push(Box::new(move || {
                assert_eq!(cu!(t, cuCtxDestroy(ctx)), SUCCESS)
            }));
            let mut s: CUstream = std::ptr::null_mut();
            ok(cu!(c.t, cuStreamCreate(&mut s, 0)))?;
            let sa = s as usize;
            undo.push(Box::new(move || {
                assert_eq!(cu!(t, cuStreamDestroy(sa as CUstream)), SUCCESS)
            }));
            let (r, m) = c.import_mem_raw(1, tracked.raw, 4096);
            ok(r)?;
            let ma = m as usize;
            undo.push(Box::new(move || {
                assert_eq!(
                    cu!(t, cuDestroyExternalMemory(ma as CUexternalMemory)),
                    SUCCESS
                )
            }));
            let (r, p) = c.map(m, 0, 4096);
            ok(r)?;
            undo.push(Box::new(move || assert_eq!(cu!(t, cuMemFree(p)), SUCCESS)));
            let (sfd, _exp) = export::timeline_semaphore(0).unwrap();
            let st = Tracked::new(sfd);
            let (r, sem) = c.import_sem_raw(9, st.raw);
            if r != SUCCESS {
                st.close();
                return Err(r);
            }
            let sema = sem as usize;
            undo.push(Box::new(move || {
                assert_eq!(
                    cu!(t, cuDestroyExternalSemaphore(sema as CUexternalSemaphore)),
                    SUCCESS
                )
            }));
            ok(c.signal(sem, 1, 0, s))?;
            ok(c.wait(sem, 1, 0, s))?;
            ok(c.sync(s))?;
            let mut out = [0u8; 5];
            ok(cu!(c.t, cuMemcpyDtoH(out.as_mut_ptr().cast(), p, 5)))?;
            assert_eq!(&out, b"frame");
            Ok(())
        })();
        before_teardown = c.sim.calls();
        while let Some(f) = undo.pop() {
            f();
        }
        res
    })();
    (r, tracked, mem, before_teardown)
}

#[test]
fn failure_at_every_call_index_leaks_nothing() {
    let clean = Cu::new();
    let (r, fd, _mem, n) = scenario(&clean);
    assert_eq!(r, Ok(()));
    assert!(!fd.still_open());
    let log = clean.sim.call_log();
    assert_eq!(log.len() as u64, clean.sim.calls());
    assert!(n >= 10 && n < clean.sim.calls());
    assert!(clean.sim.ledger().is_clean());
    drop(clean);

    let code = 2; // OUT_OF_MEMORY
    let import_index = log
        .iter()
        .position(|s| *s == "cuImportExternalMemory")
        .unwrap() as u64;
    for i in 0..n {
        let c = Cu::new();
        c.sim.fail_at(i, code);
        let (r, fd, _mem, _) = scenario(&c);
        assert_eq!(r, Err(code), "injection at call {i} ({})", log[i as usize]);
        assert_eq!(c.sim.injected_failures(), 1);
        let l = settled_ledger(&c.sim);
        assert!(l.is_clean(), "call {i}: {l}");
        // The fd stays the caller's while the import was not reached; the
        // import takes it when it succeeds, and (as the H200 did on every
        // failed OPAQUE_FD memory import) when it fails, injected or not.
        if i < import_index {
            assert!(
                fd.still_open(),
                "call {i}: an import that was never reached must not close the fd"
            );
            fd.close();
        } else {
            assert!(!fd.still_open(), "call {i}");
        }
        assert!(
            !c.sim
                .diagnostics()
                .iter()
                .any(|d| d.kind.real_driver_would_crash()
                    || matches!(
                        d.kind,
                        DiagnosticKind::DoubleClose | DiagnosticKind::ForeignFd
                    )),
            "call {i}: {:?}",
            c.sim.diagnostics()
        );
    }
}

#[test]
fn failed_teardown_call_can_be_retried() {
    let c = Cu::new();
    let ctx = c.ctx();
    let (fd, _exp) = export::binary_semaphore().unwrap();
    let sem = c.import_binary(fd);
    c.sim.fail_symbol("cuDestroyExternalSemaphore", 0, 999);
    assert_eq!(cu!(c.t, cuDestroyExternalSemaphore(sem)), UNKNOWN);
    assert_eq!(
        c.sim.ledger().live_semaphores,
        1,
        "an injected failure does nothing"
    );
    assert_eq!(cu!(c.t, cuDestroyExternalSemaphore(sem)), SUCCESS);
    assert_eq!(cu!(c.t, cuCtxDestroy(ctx)), SUCCESS);
    assert!(c.sim.ledger().is_clean());
    assert!(c.sim.diagnostics().is_empty());
}

#[test]
fn fail_symbol_hits_the_nth_call_of_that_symbol() {
    let c = Cu::new();
    let _ctx = c.ctx();
    c.sim.fail_symbol("cuStreamCreate", 1, 999);
    let mut s: CUstream = std::ptr::null_mut();
    assert_eq!(cu!(c.t, cuStreamCreate(&mut s, 0)), SUCCESS);
    assert_eq!(cu!(c.t, cuStreamCreate(&mut s, 0)), UNKNOWN);
    assert_eq!(cu!(c.t, cuStreamCreate(&mut s, 0)), SUCCESS);
    assert_eq!(c.sim.ledger().live_streams, 2);
    c.sim.fail_at(c.sim.calls() + 1, 2);
    c.sim.clear_failures();
    assert_eq!(cu!(c.t, cuCtxSynchronize()), SUCCESS);
    assert_eq!(cu!(c.t, cuCtxSynchronize()), SUCCESS);
    assert_eq!(c.sim.injected_failures(), 1);
}

#[test]
fn shutdown_makes_every_call_deinitialized() {
    let c = Cu::new();
    let ctx = c.ctx();
    let s = c.stream();
    let (fd, _exp) = export::binary_semaphore().unwrap();
    let sem = c.import_binary(fd);
    c.sim.shutdown();
    assert!(c.sim.is_shut_down());
    assert_eq!(cu!(c.t, cuDestroyExternalSemaphore(sem)), DEINITIALIZED);
    assert_eq!(cu!(c.t, cuStreamDestroy(s)), DEINITIALIZED);
    assert_eq!(cu!(c.t, cuCtxDestroy(ctx)), DEINITIALIZED);
    assert_eq!(cu!(c.t, cuInit(0)), DEINITIALIZED);
    let mut v = 0;
    assert_eq!(cu!(c.t, cuDriverGetVersion(&mut v)), DEINITIALIZED);
    // The exit handlers freed everything.
    assert!(c.sim.ledger().is_clean());
    assert!(c.sim.diagnostics().is_empty());
}

#[test]
fn parallel_simulators_are_isolated() {
    let threads: Vec<_> = (0..8)
        .map(|k| {
            std::thread::spawn(move || {
                let c = Cu::new();
                let ctx = c.ctx();
                let (fd, mem) = export::memory(1024).unwrap();
                let m = c.import_mem(fd, 1024);
                let (_, p) = c.map(m, 0, 1024);
                c.htod(p, &[k as u8; 16]);
                assert_eq!(mem.to_vec()[..16], [k as u8; 16]);
                // Failure injection in one simulator does not touch the others.
                c.sim.fail_at(c.sim.calls(), 2);
                let mut s: CUstream = std::ptr::null_mut();
                assert_eq!(cu!(c.t, cuStreamCreate(&mut s, 0)), 2);
                assert_eq!(cu!(c.t, cuMemFree(p)), SUCCESS);
                assert_eq!(cu!(c.t, cuDestroyExternalMemory(m)), SUCCESS);
                assert_eq!(cu!(c.t, cuCtxDestroy(ctx)), SUCCESS);
                assert!(c.sim.ledger().is_clean());
                (c.sim.slot(), c.sim.calls())
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for (_, calls) in &results {
        assert_eq!(*calls, 9, "each simulator counts only its own calls");
    }
}

#[test]
fn handles_of_one_sim_are_foreign_to_another() {
    let a = Cu::new();
    let b = Cu::new();
    assert_ne!(a.sim.slot(), b.sim.slot());
    let _ca = a.ctx();
    let _cb = b.ctx();
    let (fd, _exp) = export::binary_semaphore().unwrap();
    let sem = a.import_binary(fd);
    assert_eq!(cu!(b.t, cuDestroyExternalSemaphore(sem)), INVALID_VALUE);
    assert!(b.has_diag(DiagnosticKind::UnknownHandle));
    assert_eq!(cu!(a.t, cuDestroyExternalSemaphore(sem)), SUCCESS);
}

#[test]
fn a_stale_table_answers_deinitialized() {
    let sim = Sim::new().unwrap();
    let t = sim.table().cuda;
    drop(sim);
    // The slot is free now (or reused by a parallel test: then the call is
    // still harmless, but not necessarily DEINITIALIZED).
    let r = cu!(t, cuDeviceGetCount(&mut 0));
    assert!(r == DEINITIALIZED || r == NOT_INITIALIZED, "{r}");
}

#[test]
fn backend_from_the_driver_crate_runs_on_the_simulator() {
    let sim = Sim::new().unwrap();
    let backend = sim.backend();
    assert_eq!(backend.name(), "sim");
    backend.ensure_init().unwrap();
    assert_eq!(backend.device_count().unwrap(), 1);
    // Dropping the Sim while the backend lives: calls answer DEINITIALIZED.
    let keep = backend.clone();
    drop(backend);
    drop(sim);
    let f = keep.table().cuda.cuDeviceGetCount.unwrap();
    let mut n = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { f(&mut n) }.0, DEINITIALIZED);
}

#[test]
fn stream_destroy_with_pending_work_finishes_it() {
    let c = Cu::new();
    let ctx = c.ctx();
    let s = c.stream();
    let (fd, tl) = export::timeline_semaphore(0).unwrap();
    let sem = c.import_timeline(fd);
    assert_eq!(c.wait(sem, 1, 0, s), SUCCESS);
    assert_eq!(c.signal(sem, 2, 0, s), SUCCESS);
    assert_eq!(cu!(c.t, cuStreamDestroy(s)), SUCCESS);
    assert!(c.sim.ledger().pending_work > 0);
    tl.signal(1).unwrap();
    assert!(tl.wait(2, Duration::from_secs(5)));
    assert_eq!(settled_ledger(&c.sim).pending_work, 0);
    assert_eq!(cu!(c.t, cuDestroyExternalSemaphore(sem)), SUCCESS);
    assert_eq!(cu!(c.t, cuCtxDestroy(ctx)), SUCCESS);
    assert!(c.sim.ledger().is_clean(), "{}", c.sim.ledger());
}
