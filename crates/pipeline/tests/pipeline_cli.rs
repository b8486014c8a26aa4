//! Runs the compiled `pipeline` binary: exit codes, one-line errors, the
//! JSON summary, and that injected defects fail verification.
//!
//! Cargo builds the binary for this test (`CARGO_BIN_EXE_pipeline`).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pipeline"))
}

fn run(args: &[&str]) -> Output {
    child_command(example()).args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const SMALL: &[&str] = &[
    "--frames", "40", "--ring", "3", "--width", "64", "--height", "16", "--quiet",
];

fn small(extra: &[&str]) -> Output {
    let mut args = vec!["--backend", "host"];
    args.extend_from_slice(SMALL);
    args.extend_from_slice(extra);
    run(&args)
}

fn small_on(backend: &str, extra: &[&str]) -> Output {
    let mut args = vec!["--backend", backend];
    args.extend_from_slice(SMALL);
    args.extend_from_slice(extra);
    run(&args)
}

#[test]
fn help_exits_zero() {
    let o = run(&["--help"]);
    assert!(o.status.success());
    assert!(stdout(&o).contains("--backend"));
}

#[test]
fn bad_input_is_one_line_and_non_zero() {
    let cases: &[(&[&str], i32, &str)] = &[
        (&["--frames", "0"], 2, "--frames"),
        (&["--ring", "0"], 2, "fixed capacity"),
        (&["--ring", "9"], 2, "fixed capacity"),
        (&["--backend", "opencl"], 2, "unknown backend"),
        (&["--width", "abc"], 2, "expects a number"),
        (&["--backend", "cuda"], 2, "unknown backend"),
        (&["--ring", "1000"], 2, "fixed capacity"),
        (&["--fault", "corrupt"], 2, "only applies"),
        (
            &["--backend", "gpu", "--frames", "1"],
            1,
            "backend `gpu` is not available: ",
        ),
        (
            &["--backend", "jetson", "--frames", "1"],
            1,
            "backend `jetson` is not available: ",
        ),
    ];
    for (args, code, want) in cases {
        let o = run(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(*code), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(want),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(stdout(&o).is_empty(), "{args:?}");
    }
}

#[test]
fn host_run_verifies_every_frame() {
    for mode in [&[][..], &["--copy"][..]] {
        let mut extra = vec!["--json"];
        extra.extend_from_slice(mode);
        let o = small(&extra);
        let out = stdout(&o);
        assert!(o.status.success(), "{out}{}", stderr(&o));
        assert!(out.contains("\"backend\": \"host-reference\""), "{out}");
        assert!(out.contains("\"frames\": 40"), "{out}");
        assert!(out.contains("\"verified\": true"), "{out}");
        assert!(
            out.contains("\"consumer_ok\": 40, \"readback_ok\": 40, \"pulses\": 40"),
            "{out}"
        );
        assert_eq!(out.trim().lines().count(), 1, "one JSON object");
        for key in ["\"queued_us\": {", "\"held_us\": {", "\"overhead_us\": {"] {
            assert!(out.contains(key), "{key}: {out}");
        }
        let want_mode = if mode.is_empty() { "zero-copy" } else { "copy" };
        assert!(out.contains(&format!("\"mode\": \"{want_mode}\"")), "{out}");
    }
}

#[test]
fn human_summary_labels_the_reference_transport() {
    let o = small(&["--format", "raw16"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(out.starts_with("backend: host-reference"), "{out}");
    assert!(out.contains("not the simulator and not CUDA"), "{out}");
    assert!(out.contains("verified: 40/40 frames"), "{out}");
    for word in [
        "latency",
        "p50",
        "p99",
        "max",
        "interop overhead",
        "held before ready",
        "frames/s",
        "MB/s",
    ] {
        assert!(out.contains(word), "{word}: {out}");
    }
}

#[test]
fn every_ring_size_checks_every_frame_once() {
    // Rings of 3 and more check a frame while the camera writes a later one;
    // smaller rings check it when its slot comes round: each frame once.
    for ring in ["1", "2", "3", "4", "5", "8"] {
        let o = small(&["--json", "--ring", ring]);
        let out = stdout(&o);
        assert!(o.status.success(), "ring {ring}: {out}{}", stderr(&o));
        assert!(
            out.contains("\"consumer_ok\": 40, \"readback_ok\": 40, \"pulses\": 40"),
            "ring {ring}: {out}"
        );
    }
}

#[test]
fn broken_pipelines_do_not_report_success() {
    for (backend, ring) in [("host", "4"), ("host", "2"), ("sim", "4"), ("sim", "1")] {
        for fault in ["skip-process", "corrupt"] {
            let o = small_on(backend, &["--json", "--ring", ring, "--fault", fault]);
            let out = stdout(&o);
            assert_eq!(o.status.code(), Some(1), "{backend} {fault}: {out}");
            assert!(
                out.contains("\"verified\": false"),
                "{backend} {fault}: {out}"
            );
            assert!(
                stderr(&o).contains("failed verification"),
                "{backend} {fault}"
            );
            if fault == "skip-process" {
                // Every frame's read-back check ran and failed, those on the
                // checker thread (rings of 3 or more) included.
                assert!(
                    out.contains(
                        "\"consumer_ok\": 40, \"readback_ok\": 0, \"pulses\": 40, \"failed\": 40"
                    ),
                    "{backend} {fault}: {out}"
                );
            }
        }
    }
}

#[test]
fn sim_run_verifies_every_frame_through_nvsci() {
    for mode in [
        &[][..],
        &["--copy"][..],
        &["--ring", "1"][..],
        &["--ring", "2"][..],
        &["--ring", "3"][..],
        &["--ring", "8", "--format", "raw8"][..],
    ] {
        let mut extra = vec!["--json"];
        extra.extend_from_slice(mode);
        let o = small_on("sim", &extra);
        let out = stdout(&o);
        assert!(o.status.success(), "{mode:?}: {out}{}", stderr(&o));
        assert!(out.contains("\"backend\": \"nvsci-sim\""), "{out}");
        assert!(
            out.contains("\"processing\": \"sim: processing runs as a stream-ordered host function over simulated device memory; deterministic fences built by each waiter (NvSciSyncFenceUpdateFence)\""),
            "{out}"
        );
        assert!(out.contains("\"verified\": true"), "{out}");
        assert!(
            out.contains("\"consumer_ok\": 40, \"readback_ok\": 40, \"pulses\": 40"),
            "{out}"
        );
        assert_eq!(out.trim().lines().count(), 1, "one JSON object");
    }
}

#[test]
fn egl_run_verifies_every_frame_through_an_egl_stream() {
    for mode in [
        &[][..],
        &["--ring", "1"][..],
        &["--ring", "2", "--readback", "inline"][..],
        &["--ring", "8", "--format", "raw8"][..],
    ] {
        let mut extra = vec!["--json"];
        extra.extend_from_slice(mode);
        let o = small_on("egl", &extra);
        let out = stdout(&o);
        assert!(o.status.success(), "{mode:?}: {out}{}", stderr(&o));
        // No GPU with EGL here (or no `--features vulkan`): the simulator.
        assert!(out.contains("\"backend\": \"egl-sim\""), "{out}");
        assert!(out.contains("because no real EGLStream opened: "), "{out}");
        // The stream copies (measured): reported as copy-based.
        assert!(out.contains("\"mode\": \"copy\""), "{out}");
        assert!(out.contains("\"verified\": true"), "{out}");
        assert!(
            out.contains("\"consumer_ok\": 40, \"readback_ok\": 40, \"pulses\": 40"),
            "{out}"
        );
    }
}

#[test]
fn the_default_command_runs_the_simulator_and_says_why() {
    // `cargo run --release` on a machine without a
    // usable GPU (CI): the NvSci ring on the simulator, default frame size
    // (fewer frames: tests run a debug build).
    let o = run(&["--quiet", "--frames", "12"]);
    let out = stdout(&o);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(
        out.starts_with("backend: nvsci-sim (auto: the simulator, because jetson: not available: "),
        "{out}"
    );
    assert!(out.contains("; gpu: not available: "), "{out}");
    assert!(
        out.contains(
            "sim: processing runs as a stream-ordered host function over simulated device memory; deterministic fences built by each waiter"
        ),
        "{out}"
    );
    assert!(out.contains("verified: 12/12 frames"), "{out}");
    assert!(out.contains("interop overhead"), "{out}");
    assert!(out.contains("frames/s"), "{out}");
}

/// A command that starts `exe`; under a cross test runner without binfmt
/// (`TEGRA_INTEROP_TEST_RUNNER`, e.g. `qemu-aarch64`, set by
/// targets/aarch64-unknown-linux-gnu.toml) the child goes through it too.
fn child_command(exe: impl AsRef<std::ffi::OsStr>) -> Command {
    match std::env::var("TEGRA_INTEROP_TEST_RUNNER") {
        Ok(runner) if !runner.trim().is_empty() => {
            let mut words = runner.split_whitespace();
            let mut command = Command::new(words.next().unwrap_or_default());
            command.args(words).arg(exe);
            command
        }
        _ => Command::new(exe),
    }
}
