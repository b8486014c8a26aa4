//! The programs' own output when it cannot be written (issue 30, item 5):
//! stdout on a full device (`/dev/full`) or a closed pipe, stderr on a full
//! device, for `pipeline` and `interop_info`, `--help` included; and that
//! `pipeline --json` answers with one JSON object on stdout whatever
//! happens.
//!
//! The documented behaviour: a closed stdout (EPIPE, e.g. `pipeline | head
//! -c0`) is not reported and leaves the exit status the run's; any other
//! failed write to stdout is one line on stderr and exit status 1; a failed
//! write to stderr is ignored. Nothing panics (status 101, "panicked").
#![allow(clippy::unwrap_used)]

mod common;
use common::child_command;

use std::fs::File;
use std::process::{Command, Output, Stdio};

fn pipeline() -> Command {
    child_command(env!("CARGO_BIN_EXE_pipeline"))
}

fn interop_info() -> Command {
    child_command(env!("CARGO_BIN_EXE_interop_info"))
}

const SMALL: &[&str] = &[
    "--frames", "6", "--ring", "3", "--width", "64", "--height", "16", "--quiet",
];

fn dev_full() -> Stdio {
    Stdio::from(File::options().write(true).open("/dev/full").unwrap())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `cmd` with stdout on `/dev/full`.
fn stdout_full(mut cmd: Command) -> Output {
    cmd.stdout(dev_full()).stderr(Stdio::piped());
    cmd.output().unwrap()
}

/// Runs `cmd` with stdout on a pipe whose reading end is closed before the
/// program writes (it starts, runs, then writes: the pipe is gone by then).
fn stdout_closed(mut cmd: Command) -> Output {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

fn assert_no_panic(o: &Output, what: &str) {
    let err = text(&o.stderr);
    assert_ne!(o.status.code(), Some(101), "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(!err.contains("backtrace"), "{what}: {err}");
}

/// A full stdout: one line on stderr naming stdout and the error, status 1.
fn assert_full_reported(o: &Output, what: &str) {
    assert_no_panic(o, what);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{what}: {err}");
    let line = err
        .lines()
        .find(|l| l.contains("stdout"))
        .unwrap_or_else(|| panic!("{what}: no line about stdout: {err}"));
    assert!(line.starts_with("error: "), "{what}: {line}");
    assert!(line.contains("No space left on device"), "{what}: {line}");
}

#[test]
fn pipeline_on_a_full_stdout_says_so_and_exits_1() {
    for extra in [&[][..], &["--json"][..]] {
        let mut cmd = pipeline();
        cmd.args(["--backend", "sim"]).args(SMALL).args(extra);
        assert_full_reported(&stdout_full(cmd), &format!("sim {extra:?}"));
    }
    let mut help = pipeline();
    help.arg("--help");
    assert_full_reported(&stdout_full(help), "--help");
}

#[test]
fn pipeline_on_a_closed_pipe_is_quiet_and_keeps_the_runs_status() {
    let mut cmd = pipeline();
    cmd.args(["--backend", "host"]).args(SMALL);
    let o = stdout_closed(cmd);
    assert_no_panic(&o, "host");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stderr), "");
    // A run that fails verification still says so, and exits 1.
    let mut cmd = pipeline();
    cmd.args(["--backend", "host", "--fault", "corrupt"])
        .args(SMALL);
    let o = stdout_closed(cmd);
    assert_no_panic(&o, "corrupt");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("failed verification"));
    let mut help = pipeline();
    help.arg("--help");
    let o = stdout_closed(help);
    assert_no_panic(&o, "--help");
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn a_full_stderr_does_not_change_the_exit_status() {
    // A usage error is written to stderr only.
    let o = pipeline()
        .args(["--frames", "0"])
        .stderr(dev_full())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    // A run error too (a trace that cannot be created stops the run).
    let o = pipeline()
        .args([
            "--backend",
            "host",
            "--trace",
            "/nonexistent-dir-of-this-test/t.json",
        ])
        .args(SMALL)
        .stderr(dev_full())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let o = interop_info()
        .arg("--bogus")
        .stderr(dev_full())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn interop_info_on_a_full_or_closed_stdout() {
    for args in [&["--sim"][..], &["--help"][..]] {
        let mut cmd = interop_info();
        cmd.args(args);
        assert_full_reported(&stdout_full(cmd), &format!("interop_info {args:?}"));
        let mut cmd = interop_info();
        cmd.args(args);
        let o = stdout_closed(cmd);
        assert_no_panic(&o, &format!("interop_info {args:?} | closed"));
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    }
}

/// The one JSON object `--json` leaves on stdout, with its exit status.
fn json_answer(args: &[&str]) -> (serde_json::Value, Option<i32>, String) {
    let o = pipeline().args(args).output().unwrap();
    let out = text(&o.stdout);
    assert_eq!(out.lines().count(), 1, "{args:?}: one line: {out:?}");
    let j: serde_json::Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("{args:?}: stdout is not JSON ({e}): {out:?}"));
    (j, o.status.code(), text(&o.stderr))
}

#[test]
fn json_on_a_run_that_cannot_start_is_an_error_object() {
    // No CUDA driver here, and without `--features vulkan` no GPU backend
    // at all: either way the run cannot start. (On a machine with a GPU
    // and the feature this run works; the object then is the report.)
    let (j, code, err) = json_answer(&["--backend", "gpu", "--json", "--frames", "3", "--quiet"]);
    if j["ok"] == true {
        assert_eq!(code, Some(0), "{j}");
        assert_eq!(j["verified"], true, "{j}");
        return;
    }
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(j["ok"], false, "{j}");
    assert_eq!(j["stage"], "run", "{j}");
    assert_eq!(j["schema_version"], 1, "{j}");
    let e = j["error"].as_str().unwrap();
    assert!(e.contains("gpu"), "{e}");
    // The same line on stderr, for a person.
    assert!(err.contains(e), "{err}");
}

#[test]
fn json_with_bad_arguments_is_an_error_object_too() {
    let (j, code, err) = json_answer(&["--json", "--frames", "0"]);
    assert_eq!(code, Some(2), "{err}");
    assert_eq!(
        (&j["ok"], &j["stage"]),
        (&false.into(), &"arguments".into())
    );
    assert!(j["error"].as_str().unwrap().contains("--frames"), "{j}");
    // A successful run's report says ok too.
    let mut args = vec!["--backend", "host", "--json"];
    args.extend_from_slice(SMALL);
    let (j, code, _) = json_answer(&args);
    assert_eq!(
        (code, &j["ok"], &j["verified"]),
        (Some(0), &true.into(), &true.into())
    );
    // A run that fails verification: its report, ok false.
    args.extend_from_slice(&["--fault", "corrupt"]);
    let (j, code, _) = json_answer(&args);
    assert_eq!(
        (code, &j["ok"], &j["verified"]),
        (Some(1), &false.into(), &false.into())
    );
}
