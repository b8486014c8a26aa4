//! Two `pipeline` processes over Zenoh on TCP loopback, peers without a
//! router: `--source zenoh/<topic>` (listening) feeds its ring from what
//! `--publish zenoh/<topic>` (connecting) publishes, and verifies every
//! frame by the CRC-32 it had on arrival; the publisher's log has one line
//! per frame, in order. Every wait is bounded; a process still running at
//! its limit is killed and the test fails saying so.
#![cfg(feature = "zenoh")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_pipeline");
const LIMIT: Duration = Duration::from_secs(120);

/// A free TCP port on loopback (the listener is closed before use).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `child`'s output once it ended, at most `limit` from now (killed and
/// panicking past it).
pub fn finish(mut child: Child, what: &str, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} still ran after {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Waits (bounded) until something accepts TCP connections on `port`.
pub fn wait_listening(port: u16, limit: Duration) {
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

fn spawn(args: &[&str]) -> Child {
    Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn three_hundred_frames_cross_from_one_process_to_another() {
    let port = free_port();
    let endpoint = format!("tcp/127.0.0.1:{port}");
    let log = std::env::temp_dir().join(format!("zenoh-loopback-{}.log", std::process::id()));
    let size = ["--width", "320", "--height", "240"];
    let topic = "zenoh/loopback/image";
    let mut source_args = vec!["--source", topic, "--frames", "300"];
    source_args.extend(size);
    source_args.extend(["--zenoh-listen", &endpoint]);
    let source = spawn(&source_args);
    wait_listening(port, Duration::from_secs(60));
    let log_arg = log.to_str().unwrap();
    // A queue as deep as the run: the two processes share 2 cores here, and
    // the point of this test is that every frame crosses (the mailbox's
    // drops have their own tests).
    let mut publish_args = vec!["--frames", "300", "--publish", topic, "--json"];
    publish_args.extend(size);
    publish_args.extend(["--publish-queue", "300", "--zenoh-connect", &endpoint]);
    publish_args.extend(["--publish-log", log_arg, "--publish-wait", "60"]);
    let publisher = spawn(&publish_args);
    let published = finish(publisher, "the publisher", LIMIT);
    let received = finish(source, "the source", LIMIT);
    let p_out = String::from_utf8_lossy(&published.stdout);
    let s_out = String::from_utf8_lossy(&received.stdout);
    let s_err = String::from_utf8_lossy(&received.stderr);
    assert!(
        published.status.success(),
        "publisher: {p_out} {}",
        String::from_utf8_lossy(&published.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(p_out.trim()).unwrap();
    let z = &report["zenoh_publish"];
    assert_eq!(
        (&z["offered"], &z["published"], &z["dropped"], &z["failed"]),
        (&300.into(), &300.into(), &0.into(), &0.into()),
        "{report}"
    );
    assert_eq!(z["subscriber_at_start"], true);
    assert!(received.status.success(), "source: {s_out} {s_err}");
    assert!(s_out.contains("verified: 300/300 frames"), "{s_out}");
    assert!(s_err.contains("took 300, refused 0"), "{s_err}");
    assert!(s_err.contains("sequence gaps 0"), "{s_err}");
    let lines = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    let rows: Vec<Vec<&str>> = lines.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(rows.len(), 300);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.len(), 3, "{row:?}");
        assert_eq!(row[0], (i + 1).to_string(), "sequence numbers count from 1");
        assert_eq!(row[1], i.to_string(), "frames in order");
        assert_eq!(row[2].len(), 8);
        assert!(u32::from_str_radix(row[2], 16).is_ok());
    }
}

#[test]
fn zenoh_options_are_checked_before_anything_opens() {
    for (args, says) in [
        (&["--publish", "zenoh/"][..], "needs a topic"),
        (&["--publish", "udp/x"][..], "zenoh/TOPIC"),
        (&["--publish", "zenoh/a b"][..], "not a topic name"),
        (&["--publish-queue", "3"][..], "need --publish"),
        (&["--zenoh-listen", "tcp/127.0.0.1:1"][..], "need --publish"),
        (
            &["--publish", "zenoh/a", "--publish-queue", "0"][..],
            "outside 1..=1024",
        ),
        (
            &["--publish", "zenoh/a", "--backend", "host"][..],
            "--backend",
        ),
        (
            &["--publish", "zenoh/a", "--source", "zenoh/b"][..],
            "--source",
        ),
        (
            &["--publish", "zenoh/a", "--ros-domain", "300"][..],
            "0..=232",
        ),
    ] {
        let out = finish(spawn(args), "pipeline", LIMIT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} passed");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
