//! Where `pipeline --trace FILE` writes (issue 30, item 5): the trace goes
//! to a temporary file beside FILE and replaces FILE only once it is
//! written, so a run that fails before it starts leaves an existing FILE
//! as it was; a target that is not a regular file (a FIFO, a device, a
//! directory) is refused before the run, and nothing waits on it; `-` is
//! stdout (the report then goes to stderr, and `--json` is refused).
#![allow(clippy::unwrap_used)]

mod common;
use common::child_command;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn pipeline() -> Command {
    child_command(env!("CARGO_BIN_EXE_pipeline"))
}

const SMALL: &[&str] = &[
    "--frames", "6", "--ring", "3", "--width", "64", "--height", "16", "--quiet",
];

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A fresh, empty directory for one test.
fn fresh_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pipeline-tracefile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Runs `cmd`, killing it (and failing) if it takes more than a minute.
fn output_within_a_minute(mut cmd: Command) -> Output {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let began = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if began.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the program hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_run_that_fails_before_it_starts_leaves_an_existing_trace_untouched() {
    let dir = fresh_dir("early");
    let file = dir.join("t.json");
    std::fs::write(&file, b"an earlier trace").unwrap();
    // The Jetson backend cannot open off a Jetson: the run fails after the
    // trace was opened and before any frame.
    let mut cmd = pipeline();
    cmd.args(["--backend", "jetson", "--trace"])
        .arg(&file)
        .args(SMALL);
    let o = output_within_a_minute(cmd);
    if o.status.success() {
        // On a Jetson the run works: then the trace replaced the file.
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(v["otherData"]["frames_traced"], 6);
    } else {
        assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
        assert_eq!(std::fs::read(&file).unwrap(), b"an earlier trace");
    }
    // No temporary file is left behind.
    assert_eq!(entries(&dir), ["t.json"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_finished_run_replaces_the_file_and_leaves_nothing_else() {
    let dir = fresh_dir("replace");
    let file = dir.join("t.json");
    std::fs::write(&file, b"an earlier trace").unwrap();
    let mut cmd = pipeline();
    cmd.args(["--backend", "host", "--trace"])
        .arg(&file)
        .args(SMALL);
    let o = output_within_a_minute(cmd);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(v["otherData"]["frames_traced"], 6);
    assert_eq!(entries(&dir), ["t.json"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_target_that_is_not_a_regular_file_is_refused_without_waiting() {
    let dir = fresh_dir("fifo");
    let fifo = dir.join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    for target in [fifo.as_path(), Path::new("/dev/null"), dir.as_path()] {
        let mut cmd = pipeline();
        cmd.args(["--backend", "host", "--trace"])
            .arg(target)
            .args(SMALL);
        let o = output_within_a_minute(cmd);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{target:?}: {err}");
        assert!(err.contains("not a regular file"), "{target:?}: {err}");
        assert!(err.contains(target.to_str().unwrap()), "{err}");
        assert!(o.stdout.is_empty(), "{target:?}: nothing ran");
    }
    assert_eq!(entries(&dir), ["fifo"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dash_is_stdout_and_the_report_goes_to_stderr() {
    let dir = fresh_dir("dash");
    let mut cmd = pipeline();
    cmd.current_dir(&dir)
        .args(["--backend", "host", "--trace", "-"])
        .args(SMALL);
    let o = output_within_a_minute(cmd);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not the trace ({e}): {}", text(&o.stdout)));
    assert_eq!(v["otherData"]["frames_traced"], 6);
    assert!(err.contains("verified: 6/6 frames"), "{err}");
    // No file named `-`.
    assert!(entries(&dir).is_empty(), "{:?}", entries(&dir));
    // `--json` would share stdout with the trace: refused.
    let mut cmd = pipeline();
    cmd.current_dir(&dir)
        .args(["--backend", "host", "--json", "--trace", "-"])
        .args(SMALL);
    let o = output_within_a_minute(cmd);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--trace -") && err.contains("--json"), "{err}");
    assert!(entries(&dir).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}
