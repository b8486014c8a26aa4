//! Where a diagnostic goes: recorded always; written to stderr as well
//! unless the simulator's echo is off (issue 24: a passing `cargo test`
//! printed hundreds of misuse lines from tests that provoke misuse on
//! purpose). The stderr side is checked on a child process (this test
//! binary running its ignored `child_*` test), whose stderr the parent reads.
#![allow(clippy::unwrap_used)] // tests may unwrap

use std::process::Command;

use tegra_interop_sim::{DiagnosticKind, Sim, SimConfig};

/// Destroys a stream handle the simulator never made: one `UnknownHandle`
/// diagnostic naming `bogus`.
fn misuse(sim: &Sim, bogus: usize) {
    let t = sim.table();
    // SAFETY: flags only.
    assert_eq!(unsafe { (t.cuda.cuInit.unwrap())(0) }.0, 0);
    let destroy = t.cuda.cuStreamDestroy.unwrap();
    // SAFETY: the simulator checks the handle before any use (it is never
    // dereferenced), which is what this test provokes.
    let r = unsafe { destroy(core::ptr::without_provenance_mut(bogus)) };
    assert_ne!(r.0, 0);
}

#[test]
#[ignore = "run by `only_a_loud_simulator_writes_to_stderr` in a child process"]
fn child_provokes_misuse_on_a_loud_and_on_a_quiet_simulator() {
    let loud = Sim::new().unwrap();
    misuse(&loud, 0x1111_0000);
    let quiet = Sim::with_config(SimConfig::default().with_diagnostic_echo(false)).unwrap();
    misuse(&quiet, 0x2222_0000);
    let switched = Sim::new().unwrap();
    switched.set_diagnostic_echo(false);
    misuse(&switched, 0x3333_0000);
    // Recorded either way.
    for (sim, bogus) in [
        (&loud, "0x11110000"),
        (&quiet, "0x22220000"),
        (&switched, "0x33330000"),
    ] {
        let d = sim.take_diagnostics();
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].kind, DiagnosticKind::UnknownHandle);
        assert!(d[0].message.contains(bogus), "{}", d[0]);
    }
}

#[test]
fn only_a_loud_simulator_writes_to_stderr() {
    // Under a cross test runner without binfmt (`TEGRA_INTEROP_TEST_RUNNER`,
    // e.g. qemu-aarch64) the child goes through it too.
    let exe = std::env::current_exe().unwrap();
    let mut command = match std::env::var("TEGRA_INTEROP_TEST_RUNNER") {
        Ok(r) if !r.trim().is_empty() => {
            let mut words = r.split_whitespace();
            let mut c = Command::new(words.next().unwrap());
            c.args(words).arg(exe);
            c
        }
        _ => Command::new(exe),
    };
    let out = command
        .args([
            "--exact",
            "child_provokes_misuse_on_a_loud_and_on_a_quiet_simulator",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("tegra-interop-sim"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("0x11110000"), "{stderr}");
    assert!(lines[0].contains("UnknownHandle"), "{stderr}");
}
