//! `Stream::launch_host_fn` (`cuLaunchHostFunc`) on the simulator: stream
//! order, failure paths, a missing entry point, and a panicking closure.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use tegra_interop_core::WaitParams;
use tegra_interop_driver::{Backend, Context, Error, ExternalSemaphore, Stream};
use tegra_interop_sim::{export, Sim};

/// Counts drops, to tell "dropped unrun" from "leaked" and "ran".
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn host_fn_runs_in_stream_order_after_a_wait() {
    let sim = Sim::new().unwrap();
    {
        let ctx = Context::new(sim.backend(), 0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        let (fd, exported) = export::timeline_semaphore(0).unwrap();
        let sem = ExternalSemaphore::timeline_fd(&ctx, fd).unwrap();
        stream.wait(&sem, WaitParams::timeline(5)).unwrap();
        let (tx, rx) = mpsc::channel();
        let order = Arc::new(AtomicUsize::new(0));
        let (o1, o2) = (Arc::clone(&order), Arc::clone(&order));
        stream
            .launch_host_fn(move || {
                tx.send(o1.fetch_add(1, Ordering::SeqCst)).unwrap();
            })
            .unwrap();
        let (tx2, rx2) = mpsc::channel();
        stream
            .launch_host_fn(move || {
                tx2.send(o2.fetch_add(1, Ordering::SeqCst)).unwrap();
            })
            .unwrap();
        // Held back by the wait.
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(100)),
            Err(mpsc::RecvTimeoutError::Timeout)
        );
        assert!(!stream.is_idle().unwrap());
        exported.signal(5).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(rx.try_recv().unwrap(), 0, "first queued, first run");
        assert_eq!(rx2.try_recv().unwrap(), 1);
    }
    assert!(sim.ledger().is_clean(), "{}", sim.ledger());
    assert!(sim.diagnostics().is_empty(), "{:#?}", sim.diagnostics());
}

#[test]
fn a_failed_launch_drops_the_closure_unrun() {
    let sim = Sim::new().unwrap();
    let ctx = Context::new(sim.backend(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    sim.fail_symbol("cuLaunchHostFunc", 0, 1);
    let drops = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(AtomicUsize::new(0));
    let (guard, r) = (DropCount(Arc::clone(&drops)), Arc::clone(&ran));
    let err = stream
        .launch_host_fn(move || {
            let _keep = &guard;
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Driver {
                call: "cuLaunchHostFunc",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(drops.load(Ordering::SeqCst), 1, "dropped once");
    stream.synchronize().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 0, "never ran");

    // The next launch works, runs once and drops its closure once.
    let guard = DropCount(Arc::clone(&drops));
    let r = Arc::clone(&ran);
    stream
        .launch_host_fn(move || {
            let _keep = &guard;
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(drops.load(Ordering::SeqCst), 2);
}

#[test]
fn a_missing_entry_point_is_not_supported() {
    let sim = Sim::new().unwrap();
    let mut table = sim.table();
    table.cuda.cuLaunchHostFunc = None;
    // SAFETY: the simulator's entries uphold `from_table`'s contract (see
    // `Sim::backend`); the removed entry is only reported as missing.
    let backend = unsafe { Backend::from_table("no-host-fn", table) };
    let ctx = Context::new(backend, 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let err = stream.launch_host_fn(|| {}).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotSupported {
                symbol: "cuLaunchHostFunc",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_panicking_host_fn_does_not_stop_the_stream() {
    let sim = Sim::new().unwrap();
    let ctx = Context::new(sim.backend(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    stream.launch_host_fn(|| panic!("host fn panics")).unwrap();
    let (tx, rx) = mpsc::channel();
    stream.launch_host_fn(move || tx.send(7).unwrap()).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(rx.try_recv().unwrap(), 7);
    assert!(sim.diagnostics().is_empty(), "{:#?}", sim.diagnostics());
}

#[test]
fn the_default_stream_runs_host_fns_too() {
    let sim = Sim::new().unwrap();
    let ctx = Context::new(sim.backend(), 0).unwrap();
    let stream = Stream::default_stream(&ctx);
    let (tx, rx) = mpsc::channel();
    stream.launch_host_fn(move || tx.send(1).unwrap()).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(rx.try_recv().unwrap(), 1);
}

#[test]
fn the_simulator_refuses_a_null_function() {
    let sim = Sim::new().unwrap();
    let ctx = Context::new(sim.backend(), 0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    ctx.bind().unwrap();
    let launch = sim.table().cuda.cuLaunchHostFunc.unwrap();
    // SAFETY: a live stream of the current context; a NULL function and
    // NULL user data are what is being tested (the call must refuse them).
    let code = unsafe { launch(stream.as_raw(), None, std::ptr::null_mut()) };
    assert_eq!(code.0, 1, "CUDA_ERROR_INVALID_VALUE");
}
