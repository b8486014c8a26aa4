//! Multicast over processes on the simulator: a [`ProcessFanout`] whose
//! consumers are `pipeline --role consumer` processes, each given the
//! slots' memory and fences as fds over a Unix socket.
//!
//! - two FIFO consumer processes verify every frame, and this process's fd
//!   ledger (`/proc/self/fd`) is back where it was afterwards;
//! - one of two FIFO consumer processes killed with `SIGKILL` in the
//!   middle of a run: the ring reports the typed
//!   [`DisconnectReason::ProcessEnded`], the producer and the other
//!   consumer go on and verify every frame, the dead consumer's fds are
//!   closed here once it is gone, and the surviving consumer process
//!   exits cleanly with every frame verified and no fd left open;
//! - the program's form, `pipeline --consumers ... --consumer-processes
//!   --backend sim-fd`: one verified line per consumer process.
//! - hostile peers: a consumer process refuses a hello for another ring
//!   and a memory fd whose declared size is over the memfd's (before any
//!   import); a consumer that answers a frame it was never sent is
//!   disconnected, naming it, while the other verifies every frame.
//!
//! The library tests start the consumer processes through the cross test
//! runner where one is set (as `two_process_fd.rs`'s `--role` tests do);
//! the program's form starts its own executable, which an emulated binary
//! cannot do without binfmt_misc: skipped there, saying so. The ledger
//! must not see another test's fds, so every test takes one lock.
//!
//! The same killed-consumer run over the Vulkan exporter, with `--backend
//! gpu` consumer processes, is `gpu_consumer_process_killed_mid_run`
//! (`--features vulkan`, ignored: it needs a GPU).
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)]

mod common;

use std::os::fd::OwnedFd;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tegra_interop_pipeline::camera::TestPattern;
use tegra_interop_pipeline::multicast::fanout::FIFO_DEPTH;
use tegra_interop_pipeline::multicast::process::{Farewells, McMsg, ProcessFanout, RemoteConsumer};
use tegra_interop_pipeline::multicast::ring::{MulticastRing, Polled};
use tegra_interop_pipeline::multicast::{
    ConsumerEvent, ConsumerId, ConsumerSpec, DisconnectReason, FanoutTransport,
};
use tegra_interop_pipeline::transport::export::{ExportedFrame, Exporter, SimExporter};
use tegra_interop_pipeline::transport::fdpass::{open_fds, Channel, Limits};
use tegra_interop_pipeline::transport::FrameGeometry;

static LEDGER: Mutex<()> = Mutex::new(());

const WIDTH: usize = 64;
const HEIGHT: usize = 16;
const RING: usize = 6;
const G: FrameGeometry = FrameGeometry {
    stride: WIDTH * 4,
    rows: HEIGHT,
};

/// Every wait's limit (generous: an emulated process starts slowly).
const LIMIT: Duration = Duration::from_secs(20);

/// The pipeline binary: `TEGRA_INTEROP_PIPELINE` where set (the GPU
/// machine, where the binaries built here lie elsewhere), else cargo's.
fn pipeline_exe() -> std::ffi::OsString {
    std::env::var_os("TEGRA_INTEROP_PIPELINE")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_pipeline").into())
}

/// `pipeline --role consumer` on `backend` with `sock` as its stdin.
fn consumer(backend: &str, sock: OwnedFd) -> Child {
    consumer_with(backend, sock, Stdio::inherit(), RING)
}

/// As [`consumer`], with its stderr going to `stderr`, for a ring of `ring`.
fn consumer_with(backend: &str, sock: OwnedFd, stderr: Stdio, ring: usize) -> Child {
    let (w, h, r) = (WIDTH.to_string(), HEIGHT.to_string(), ring.to_string());
    let t = LIMIT.as_secs().to_string();
    common::child_command(pipeline_exe())
        .args(["--role", "consumer", "--backend", backend, "--ring", &r])
        .args(["--width", &w, "--height", &h, "--format", "rgba8"])
        .args(["--peer-timeout", &t])
        .stdin(Stdio::from(sock))
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// Starts a consumer process and attaches it as a FIFO consumer; its id
/// and process id.
fn attach<T: FanoutTransport<Work = RemoteConsumer>>(
    ring: &mut MulticastRing<T>,
    backend: &str,
) -> (ConsumerId, u32) {
    let (mine, theirs) = Channel::pair(Limits::new(LIMIT)).unwrap();
    let child = consumer(backend, theirs.into_socket());
    let pid = child.id();
    let work = RemoteConsumer::new(mine).with_child(child);
    (ring.attach(ConsumerSpec::fifo(work, LIMIT)).unwrap(), pid)
}

/// Writes and hands over one test-pattern frame; what the ring polled.
fn produce<T: FanoutTransport>(ring: &mut MulticastRing<T>, out: &mut Vec<Polled>) {
    let mut lease = ring.acquire().unwrap();
    TestPattern::new(lease.frame(), G.stride).fill(lease.bytes_mut().unwrap());
    ring.hand_over(lease).unwrap();
    out.extend(ring.poll().unwrap());
}

/// The frames `id` finished, in order, each checked to have no mismatch.
fn verified(events: &[Polled], id: ConsumerId) -> Vec<u64> {
    events
        .iter()
        .filter_map(|p| match p {
            Polled::Finished(d) if d.consumer == id => {
                assert_eq!(d.completion.mismatches, 0, "{d:?}");
                Some(d.completion.frame)
            }
            _ => None,
        })
        .collect()
}

#[test]
fn two_consumer_processes_verify_every_frame() {
    const FRAMES: u64 = 60;
    let _one = LEDGER.lock().unwrap_or_else(|e| e.into_inner());
    let before = open_fds().unwrap();
    let fanout = ProcessFanout::open(SimExporter, G, RING).unwrap();
    let farewells = fanout.farewells();
    let mut ring = MulticastRing::new(fanout).unwrap();
    let (a, _) = attach(&mut ring, "sim-fd");
    let (b, _) = attach(&mut ring, "sim-fd");
    let mut events = Vec::new();
    for _ in 0..FRAMES {
        produce(&mut ring, &mut events);
    }
    events.extend(ring.drain(LIMIT).unwrap());
    let all: Vec<u64> = (0..FRAMES).collect();
    assert_eq!(verified(&events, a), all);
    assert_eq!(verified(&events, b), all);
    ring.detach(a).unwrap();
    ring.detach(b).unwrap();
    ring.poll().unwrap();
    ring.close().unwrap();
    for f in farewells.lock().unwrap().iter() {
        let g = f.figures.unwrap();
        assert_eq!(
            (g.taken, g.verified, g.failed, g.fds_left),
            (FRAMES, FRAMES, 0, 0),
            "{f:?}"
        );
        assert!(f.exit_ok, "{f:?}");
    }
    assert_eq!(farewells.lock().unwrap().len(), 2);
    assert_eq!(open_fds().unwrap(), before, "this process's fd ledger");
}

/// Polls until the ledger reads `want` (the dead consumer's fds close once
/// it is reaped), at most `LIMIT`.
fn settle_ledger<T: FanoutTransport>(ring: &mut MulticastRing<T>, want: usize) -> usize {
    let deadline = Instant::now() + LIMIT;
    loop {
        ring.poll().unwrap();
        let now = open_fds().unwrap();
        if now == want || Instant::now() >= deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Two FIFO consumer processes over `exporter`, the second killed with
/// `SIGKILL` at frame `frames / 3`: see the module docs.
fn killed_consumer_run<E: Exporter>(exporter: E, backend: &str, frames: u64) {
    let _one = LEDGER.lock().unwrap_or_else(|e| e.into_inner());
    let before = open_fds().unwrap();
    let fanout = ProcessFanout::open(exporter, G, RING).unwrap();
    let farewells = fanout.farewells();
    let mut ring = MulticastRing::new(fanout).unwrap();
    let opened = open_fds().unwrap();
    let (a, _) = attach(&mut ring, backend);
    let (b, b_pid) = attach(&mut ring, backend);
    let both = open_fds().unwrap();
    let per_consumer = (both - opened) / 2;
    assert_eq!(both - opened, 2 * per_consumer);
    let mut events = Vec::new();
    let began = Instant::now();
    for f in 0..frames {
        if f == frames / 3 {
            let pid = rustix::process::Pid::from_raw(b_pid as i32).unwrap();
            rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
        }
        produce(&mut ring, &mut events);
    }
    events.extend(ring.drain(LIMIT).unwrap());
    // The producer never waited out a limit for the dead consumer.
    assert!(began.elapsed() < LIMIT, "{:?}", began.elapsed());
    let all: Vec<u64> = (0..frames).collect();
    assert_eq!(verified(&events, a), all, "the surviving consumer");
    check_killed(&events, b, b_pid);
    // Its fds (channel, release semaphores) close once it is reaped.
    let left = settle_ledger(&mut ring, both - per_consumer);
    assert_eq!(left, both - per_consumer, "the dead consumer's fds");
    ring.detach(a).unwrap();
    events.extend(ring.poll().unwrap());
    ring.close().unwrap();
    check_farewells(&farewells, b_pid, frames);
    assert_eq!(open_fds().unwrap(), before, "this process's fd ledger");
}

/// The killed consumer `b` was disconnected with the typed reason, and
/// retired at most `FIFO_DEPTH` slots (those it may have been reading).
fn check_killed(events: &[Polled], b: ConsumerId, b_pid: u32) {
    let reason = events.iter().find_map(|p| match p {
        Polled::Event(ConsumerEvent::Disconnected { consumer, reason }) if *consumer == b => {
            Some(reason.clone())
        }
        _ => None,
    });
    match reason {
        Some(DisconnectReason::ProcessEnded { pid, detail }) => {
            assert_eq!(pid, b_pid as i32, "{detail}");
        }
        other => panic!("the killed consumer's event: {other:?} ({events:?})"),
    }
    let retired = events
        .iter()
        .filter(|p| {
            matches!(p, Polled::Event(ConsumerEvent::SlotRetired { consumer, .. }) if *consumer == b)
        })
        .count();
    assert!(retired <= FIFO_DEPTH, "{retired} slots retired");
}

/// The surviving consumer process verified every frame, left no fd open
/// and exited with status 0; the killed one was reaped, killed by SIGKILL.
fn check_farewells(farewells: &Farewells, b_pid: u32, frames: u64) {
    let all = farewells.lock().unwrap();
    assert_eq!(all.len(), 2, "{all:?}");
    for f in all.iter() {
        if f.pid == b_pid as i32 {
            assert!(f.figures.is_none() && !f.exit_ok, "{f:?}");
            assert!(
                f.exit.as_deref().is_some_and(|e| e.contains("SIGKILL")),
                "{f:?}"
            );
            assert!(f.ended.is_some(), "{f:?}");
        } else {
            let g = f.figures.unwrap();
            assert_eq!(
                (g.taken, g.verified, g.failed, g.fds_left),
                (frames, frames, 0, 0),
                "{f:?}"
            );
            assert!(f.exit_ok && f.ended.is_none(), "{f:?}");
        }
    }
}

#[test]
fn a_consumer_process_killed_mid_run_leaves_the_others_going_and_no_fd() {
    killed_consumer_run(SimExporter, "sim-fd", 90);
}

/// The same on the GPU machine: the Vulkan exporter in this process,
/// `--backend gpu` consumer processes (build with `--features vulkan`).
#[cfg(feature = "vulkan")]
#[test]
#[ignore = "needs a GPU with CUDA and Vulkan on one device (the GPU machine)"]
fn gpu_consumer_process_killed_mid_run() {
    use tegra_interop::driver::Backend;
    use tegra_interop_pipeline::transport::export::VulkanFdExporter;
    let backend = Backend::real().unwrap();
    let uuid = backend.device(0).and_then(|d| d.uuid()).unwrap();
    let exporter = VulkanFdExporter::open(uuid, None).unwrap();
    killed_consumer_run(exporter, "gpu", 2000);
}

#[test]
fn the_program_runs_one_process_per_consumer() {
    if !common::can_start_a_camera_process() {
        return;
    }
    let _one = LEDGER.lock().unwrap_or_else(|e| e.into_inner());
    let o = common::child_command(pipeline_exe())
        .args([
            "--consumers",
            "fifo,fifo,mailbox:slow=3",
            "--consumer-processes",
        ])
        .args(["--backend", "sim-fd", "--frames", "40", "--ring", "6"])
        .args(["--width", "64", "--height", "16"])
        .output()
        .unwrap();
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{t}");
    assert!(t.contains("one process per consumer"), "{t}");
    let lines: Vec<&str> = t
        .lines()
        .filter(|l| l.starts_with("consumer process "))
        .collect();
    assert_eq!(lines.len(), 3, "{t}");
    for l in &lines {
        assert!(
            l.ends_with(": verified") && l.contains("0 fds left open"),
            "{l}"
        );
        assert!(l.contains("exited with status 0"), "{l}");
    }
    assert!(
        lines[0].contains("40/40 frames verified in its process"),
        "{t}"
    );
    assert!(
        lines[1].contains("40/40 frames verified in its process"),
        "{t}"
    );
    // Bad combinations are refused before anything starts.
    let refused = common::child_command(pipeline_exe())
        .args([
            "--consumers",
            "fifo",
            "--consumer-processes",
            "--backend",
            "sim",
        ])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--backend sim-fd or gpu"));
}

/// Waits (bounded) for `child` to exit; its status and stderr.
fn ended(mut child: Child) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            child.kill().unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let o = child.wait_with_output().unwrap();
    (o.status, String::from_utf8_lossy(&o.stderr).into_owned())
}

/// This test plays a hostile producer: a consumer process started for
/// another ring refuses the hello, and one sent a memory fd whose declared
/// size is over what the memfd holds refuses it before any import; each
/// exits with a typed error on stderr.
#[test]
fn a_consumer_process_refuses_a_wrong_hello_and_a_forged_memory_size() {
    use std::os::fd::AsFd;
    let _one = LEDGER.lock().unwrap_or_else(|e| e.into_inner());
    let hello = McMsg::Hello {
        index: 0,
        slots: RING as u64,
        stride: G.stride as u64,
        rows: G.rows as u64,
        mailbox: false,
    };
    let (mut mine, theirs) = Channel::pair(Limits::new(LIMIT)).unwrap();
    let child = consumer_with("sim-fd", theirs.into_socket(), Stdio::piped(), RING + 1);
    mine.send(&hello.encode(), &[]).unwrap();
    let (status, err) = ended(child);
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("this consumer was started for 7 slots"),
        "{err}"
    );

    let (mut mine, theirs) = Channel::pair(Limits::new(LIMIT)).unwrap();
    let child = consumer_with("sim-fd", theirs.into_socket(), Stdio::piped(), RING);
    mine.send(&hello.encode(), &[]).unwrap();
    let frame = SimExporter.export_frame(G.frame_len() as u64).unwrap();
    let forged = McMsg::Memory {
        slot: 0,
        size: 1 << 20,
        dedicated: false,
    };
    let fd = frame.export_fd().unwrap();
    mine.send(&forged.encode(), &[fd.as_fd()]).unwrap();
    let (status, err) = ended(child);
    assert!(!status.success(), "{err}");
    assert!(err.contains("refused before any import"), "{err}");
}

/// A consumer (played by a thread of this test) that answers a frame it
/// was never sent is disconnected, naming what it sent; the consumer
/// process beside it verifies every frame, and the ledger is back at the
/// end.
#[test]
fn a_consumer_that_breaks_the_protocol_is_disconnected_and_the_other_goes_on() {
    const FRAMES: u64 = 40;
    let _one = LEDGER.lock().unwrap_or_else(|e| e.into_inner());
    let before = open_fds().unwrap();
    let mut ring = MulticastRing::new(ProcessFanout::open(SimExporter, G, RING).unwrap()).unwrap();
    let (a, _) = attach(&mut ring, "sim-fd");
    let (mine, mut theirs) = Channel::pair(Limits::new(LIMIT)).unwrap();
    let hostile = std::thread::spawn(move || {
        // The hello, three fds per slot and the end of the set-up.
        for _ in 0..2 + 3 * RING {
            drop(theirs.recv(&|| "the set-up".into()).unwrap());
        }
        theirs
            .send(&McMsg::Attached { pid: 1 }.encode(), &[])
            .unwrap();
        drop(theirs.recv(&|| "a ticket".into()).unwrap());
        let forged = McMsg::Done {
            frame: 999,
            slot: 0,
            use_: 1,
            mismatches: 0,
            process_ns: 0,
        };
        theirs.send(&forged.encode(), &[]).unwrap();
        while theirs.recv(&|| "the producer to close".into()).is_ok() {}
    });
    let spec = ConsumerSpec::fifo(RemoteConsumer::new(mine), LIMIT);
    let bad = ring.attach(spec).unwrap();
    let mut events = Vec::new();
    for _ in 0..FRAMES {
        produce(&mut ring, &mut events);
    }
    events.extend(ring.drain(LIMIT).unwrap());
    assert_eq!(verified(&events, a), (0..FRAMES).collect::<Vec<_>>());
    let reason = events.iter().find_map(|p| match p {
        Polled::Event(ConsumerEvent::Disconnected { consumer, reason }) if *consumer == bad => {
            Some(reason.clone())
        }
        _ => None,
    });
    match reason {
        Some(DisconnectReason::Failed { reason }) => {
            assert!(
                reason.contains("broke the protocol") && reason.contains("frame 999"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    hostile.join().unwrap();
    ring.detach(a).unwrap();
    ring.poll().unwrap();
    ring.close().unwrap();
    assert_eq!(open_fds().unwrap(), before, "this process's fd ledger");
}
