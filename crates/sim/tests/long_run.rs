//! A simulator that serves many calls stays at a constant size: its call
//! log keeps the most recent calls only (issue 24, item 6: it kept every
//! call, 16 bytes each, about 250 bytes a frame of the pipeline). The
//! pipeline-level soak is `crates/pipeline/tests/soak.rs`.
#![allow(clippy::unwrap_used)] // tests may unwrap

use tegra_interop_sim::Sim;

#[test]
fn the_call_log_keeps_the_most_recent_calls_only() {
    // The bound, written out: 65,536 calls.
    const LIMIT: usize = 1 << 16;
    let sim = Sim::new().unwrap();
    let table = sim.table();
    let version = table.cuda.cuDriverGetVersion.unwrap();
    let init = table.cuda.cuInit.unwrap();
    let calls = LIMIT as u64 + 4_000;
    for _ in 0..calls - 1 {
        let mut v = 0;
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { version(&mut v) }.0, 0);
    }
    // SAFETY: flags only.
    assert_eq!(unsafe { init(0) }.0, 0);
    assert_eq!(sim.calls(), calls);
    let log = sim.call_log();
    assert_eq!(log.len(), LIMIT, "the log is bounded");
    assert_eq!(log.last(), Some(&"cuInit"), "the newest call is kept");
    assert_eq!(log[LIMIT - 2], "cuDriverGetVersion");
    let kept = sim.kept_records();
    assert_eq!(kept.calls, LIMIT);
    assert_eq!(kept.calls_forgotten, calls - LIMIT as u64);
    assert_eq!(tegra_interop_sim::LOG_LIMIT, LIMIT);
}
