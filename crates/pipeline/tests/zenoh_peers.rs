//! The `pipeline` program against Zenoh peers written with clients no one
//! here wrote (the Python scripts of `tests/peers/`: eclipse-zenoh for
//! Zenoh, rosbags for CDR and the type hash).
//!
//! These tests need python3 with the `eclipse-zenoh` and `rosbags`
//! packages, so they are ignored by default (listed as ignored, never
//! passed). CI's `zenoh` step installs both in a venv and runs them with
//! `--include-ignored`, naming the venv's python in
//! `TEGRA_INTEROP_ZENOH_PYTHON`; there a python without the packages fails
//! the test rather than skipping it.
#![cfg(feature = "zenoh")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_pipeline");
const LIMIT: Duration = Duration::from_secs(180);
const NEEDS: &str =
    "needs python3 with eclipse-zenoh and rosbags (TEGRA_INTEROP_ZENOH_PYTHON; CI's zenoh step)";

fn python() -> String {
    std::env::var("TEGRA_INTEROP_ZENOH_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn peers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/peers")
}

/// Fails (not skips) when the python named cannot import the packages.
fn require_python() -> String {
    let py = python();
    let out = Command::new(&py)
        .args(["-c", "import zenoh, rosbags, numpy"])
        .output()
        .unwrap_or_else(|e| panic!("{NEEDS}: cannot run `{py}`: {e}"));
    assert!(
        out.status.success(),
        "{NEEDS}: `{py}` cannot import them: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    py
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `child`'s output once it ended, at most `limit` from now (killed and
/// panicking past it).
fn finish(mut child: Child, what: &str, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} still ran after {limit:?}; stdout: {} stderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn spawn(program: &str, args: &[&str], dir: &Path) -> Child {
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Waits (bounded) until something accepts TCP connections on `port`.
fn wait_listening(port: u16, limit: Duration) {
    let deadline = Instant::now() + limit;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing listened on port {port} within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits (bounded) for `path` to exist.
fn wait_for(path: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} not made within {limit:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[ignore = "needs python3 with eclipse-zenoh and rosbags (TEGRA_INTEROP_ZENOH_PYTHON; CI's zenoh step)"]
fn an_eclipse_zenoh_subscriber_checks_count_order_crc_and_the_cdr() {
    let py = require_python();
    let endpoint = format!("tcp/127.0.0.1:{}", free_port());
    let tmp = std::env::temp_dir();
    let id = std::process::id();
    let log = tmp.join(format!("zenoh-peer-{id}.log"));
    let ready = tmp.join(format!("zenoh-peer-{id}.ready"));
    let _ = std::fs::remove_file(&ready);
    let (log_s, ready_s) = (log.to_str().unwrap(), ready.to_str().unwrap());
    let sub_args = [
        "subscriber.py",
        "--topic",
        "peers/image",
        "--listen",
        &endpoint,
        "--log",
        log_s,
        "--count",
        "300",
        "--width",
        "320",
        "--height",
        "240",
        "--ready",
        ready_s,
        "--timeout",
        "120",
    ];
    let subscriber = spawn(&py, &sub_args, &peers_dir());
    wait_for(&ready, Duration::from_secs(60));
    let pub_args = [
        "--frames",
        "300",
        "--width",
        "320",
        "--height",
        "240",
        "--publish",
        "zenoh/peers/image",
        "--publish-queue",
        "300",
        "--zenoh-connect",
        &endpoint,
        "--publish-log",
        log_s,
        "--publish-wait",
        "60",
    ];
    let publisher = finish(spawn(BIN, &pub_args, &peers_dir()), "the publisher", LIMIT);
    let checked = finish(subscriber, "the Python subscriber", LIMIT);
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&ready);
    assert!(publisher.status.success(), "{}", text(&publisher));
    assert!(checked.status.success(), "{}", text(&checked));
    let summary = String::from_utf8_lossy(&checked.stdout);
    assert!(summary.contains("\"received\": 300"), "{summary}");
    assert!(summary.contains("\"crc_matches\": 300"), "{summary}");
}

#[test]
#[ignore = "needs python3 with eclipse-zenoh and rosbags (TEGRA_INTEROP_ZENOH_PYTHON; CI's zenoh step)"]
fn frames_an_eclipse_zenoh_publisher_sends_are_verified_through_a_ring() {
    let py = require_python();
    let port = free_port();
    let endpoint = format!("tcp/127.0.0.1:{port}");
    let src_args = [
        "--source",
        "zenoh/peers/frames",
        "--frames",
        "300",
        "--width",
        "320",
        "--height",
        "240",
        "--zenoh-listen",
        &endpoint,
    ];
    let source = spawn(BIN, &src_args, &peers_dir());
    wait_listening(port, Duration::from_secs(60));
    let pub_args = [
        "publisher.py",
        "--topic",
        "peers/frames",
        "--connect",
        &endpoint,
        "--count",
        "300",
        "--width",
        "320",
        "--height",
        "240",
        "--timeout",
        "120",
    ];
    let publisher = finish(
        spawn(&py, &pub_args, &peers_dir()),
        "the Python publisher",
        LIMIT,
    );
    let received = finish(source, "the source", LIMIT);
    assert!(publisher.status.success(), "{}", text(&publisher));
    assert!(received.status.success(), "{}", text(&received));
    let out = String::from_utf8_lossy(&received.stdout);
    let err = String::from_utf8_lossy(&received.stderr);
    assert!(out.contains("verified: 300/300 frames"), "{out}");
    assert!(err.contains("took 300, refused 0"), "{err}");
    assert!(err.contains("sequence gaps 0"), "{err}");
}
