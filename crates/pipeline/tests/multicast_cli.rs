//! `pipeline --consumers ...` and `multicast_bench` on the simulator: every
//! consumer's line verified, bad consumer lists refused (exit 2, the
//! entry named), and the bench's JSON carrying every figure (no timed
//! assertions: the figures are checked for presence and sense, not speed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;

use serde_json::Value;

mod common;

fn pipeline(args: &[&str]) -> Output {
    common::child_command(env!("CARGO_BIN_EXE_pipeline"))
        .args(args)
        .output()
        .unwrap()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Two FIFO consumers and a mailbox ten times slower: each FIFO consumer
/// verifies every frame, the mailbox verifies each frame it took and
/// skipped the rest, and the producer never waited for it.
#[test]
fn every_consumer_is_verified_in_the_json_report() {
    let out = pipeline(&[
        "--consumers",
        "fifo,fifo,mailbox:slow=10",
        "--frames",
        "30",
        "--backend",
        "sim",
        "--json",
    ]);
    let v = json_of(&out);
    assert!(out.status.success(), "{v}");
    assert_eq!(
        (v["ok"].clone(), v["schema_version"].clone()),
        (true.into(), 1.into())
    );
    assert_eq!(v["frames"], 30);
    let c = v["consumers"].as_array().unwrap();
    assert_eq!(c.len(), 3, "{v}");
    for fifo in &c[..2] {
        assert_eq!(fifo["spec"], "fifo");
        assert_eq!(fifo["verified"], 30, "{fifo}");
        assert_eq!(fifo["failed"], 0);
        assert_eq!(fifo["passed"], true);
    }
    let m = &c[2];
    assert_eq!(m["spec"], "mailbox:slow=10");
    let taken = m["verified"].as_u64().unwrap();
    assert!(taken >= 1, "{m}");
    assert_eq!(taken + m["skipped"].as_u64().unwrap(), 30, "{m}");
    assert_eq!(m["producer_waits"], 0, "{m}");
    assert_eq!(m["passed"], true);
    assert!(v["hop"]["p50_us"].as_f64().is_some(), "{v}");
}

/// The text report has one verified line per consumer.
#[test]
fn the_text_report_has_one_line_per_consumer() {
    let out = pipeline(&["--consumers", "fifo,mailbox", "--frames", "12", "-q"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("consumer "))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with("consumer 0 fifo: 12 frames verified"),
        "{text}"
    );
    assert!(lines.iter().all(|l| l.ends_with(": verified")), "{text}");
}

/// A bad consumer list is refused before anything runs: exit 2, the wrong
/// entry named, the JSON error object with `--json`.
#[test]
fn bad_consumer_lists_are_refused_with_exit_2() {
    for (list, says) in [
        ("fifo,lifo", "`lifo` is not fifo or mailbox"),
        ("fifo,,mailbox", "none empty"),
        ("mailbox:slow=0", "slow=N takes a whole number"),
        ("fifo:fast=2", "the only option of a consumer is slow=N"),
        ("fifo,fifo,fifo,fifo,fifo,fifo,fifo,fifo,fifo", "at most 8"),
    ] {
        let out = pipeline(&["--consumers", list, "--frames", "3"]);
        assert_eq!(out.status.code(), Some(2), "{list}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{list}: {err}");
        assert!(out.stdout.is_empty(), "{list}");
    }
    let out = pipeline(&["--consumers", "lifo", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_of(&out);
    assert_eq!(
        (v["ok"].clone(), v["stage"].clone()),
        (false.into(), "arguments".into())
    );
    for other in [
        &["--backend", "host"][..],
        &["--processes", "2"],
        &["--copy"],
    ] {
        let mut args = vec!["--consumers", "fifo", "--frames", "3"];
        args.extend_from_slice(other);
        let out = pipeline(&args);
        assert_eq!(out.status.code(), Some(2), "{other:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--consumers"),
            "{other:?}"
        );
    }
}

/// `multicast_bench --frames 30 --json` on the simulator (frames of 640x360
/// to keep it short in a debug build): every row is
/// there, verified, with its figures.
#[test]
fn the_bench_smoke_run_reports_every_figure() {
    let out = common::child_command(env!("CARGO_BIN_EXE_multicast_bench"))
        .args([
            "--frames", "30", "--width", "640", "--height", "360", "--json",
        ])
        .output()
        .unwrap();
    let v = json_of(&out);
    assert!(out.status.success(), "{v}");
    assert_eq!(
        (v["ok"].clone(), v["backend"].clone()),
        (true.into(), "sim".into())
    );
    assert_eq!(
        (v["width"].clone(), v["height"].clone()),
        (640.into(), 360.into())
    );
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "{v}");
    assert!(rows[0]["name"].as_str().unwrap().starts_with("ring"));
    assert_eq!(rows[0]["ratio_to_ring"], 1.0);
    for r in rows {
        assert_eq!(r["verified"], true, "{r}");
        assert_eq!(r["frames"], 30);
        assert!(r["fps"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["ratio_to_ring"].as_f64().unwrap() > 0.0, "{r}");
    }
    for r in &rows[..3] {
        let hop = &r["hop"];
        assert!(hop["count"].as_u64().unwrap() >= 30, "{r}");
        assert!(hop["p99_us"].as_f64().unwrap() >= hop["p50_us"].as_f64().unwrap());
    }
    assert_eq!(
        rows[2]["hop"]["count"],
        4 * 30,
        "four FIFO consumers, each every frame"
    );
    for (r, consumers) in rows[3..].iter().zip([1, 2, 4]) {
        assert_eq!(r["consumers"], consumers, "{r}");
        assert_eq!(r["producer_waits_for_slow"], 0, "{r}");
        assert!(r["slow_skipped"].as_u64().is_some(), "{r}");
        assert!(r["slow_delay_ms"].as_f64().unwrap() > 0.0, "{r}");
    }
}
