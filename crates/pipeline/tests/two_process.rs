//! `pipeline --processes 2` on the simulator: the camera in a second
//! process, connected to the CUDA process only by simulated NvSciIpc.
//!
//! Peers are stopped (SIGSTOP) and killed (SIGKILL) from the outside, the
//! way a debugger, the OOM killer or a crash would; the binary has no hook
//! for tests.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tegra_interop_sim::nvsci::IpcConfigFile;

/// The `--peer-timeout` of these tests, in seconds: 3, or 10 under the
/// cross test runner (an emulated process takes its time to start and set
/// up; the healthy side must not give up on a slow but running peer).
fn limit() -> u64 {
    if std::env::var("TEGRA_INTEROP_TEST_RUNNER").is_ok_and(|r| !r.trim().is_empty()) {
        10
    } else {
        3
    }
}

/// The start of the timeout error for waiting on `peer`.
fn timed_out(peer: &str) -> String {
    format!("timed out after {}s waiting for the {peer}", limit())
}
/// What a process may take beyond the limit to notice, clean up and exit
/// (a loaded 2-core CI machine).
const SLACK: Duration = Duration::from_secs(12);

/// The pipeline binary, through the cross test runner where one is set.
fn binary() -> Command {
    let exe = env!("CARGO_BIN_EXE_pipeline");
    match std::env::var("TEGRA_INTEROP_TEST_RUNNER") {
        Ok(r) if !r.trim().is_empty() => {
            let mut words = r.split_whitespace();
            let mut c = Command::new(words.next().unwrap());
            c.args(words).arg(exe);
            c
        }
        _ => Command::new(exe),
    }
}

/// The pipeline binary with the small simulator run's options.
fn command(frames: u64) -> Command {
    let mut c = binary();
    c.args(["--backend", "sim", "--frames", &frames.to_string()])
        .args(["--ring", "3", "--width", "64", "--height", "16", "--quiet"]);
    c
}

fn run(extra: &[&str]) -> Output {
    command(30)
        .args(["--processes", "2"])
        .args(extra)
        .output()
        .unwrap()
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) with a pid this test started (or its child) and a
    // valid signal number.
    let r = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert!(r == 0 || sig == libc::SIGKILL, "kill({pid}, {sig}) failed");
}

/// The state letter of `/proc/<pid>/stat` and the parent's pid; `None`
/// once the process is gone.
fn stat(pid: u32) -> Option<(char, u32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let mut f = rest.split(' ');
    let state = f.next()?.chars().next()?;
    Some((state, f.next()?.parse().ok()?))
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&c| stat(c).is_some_and(|(_, ppid)| ppid == pid))
        .collect()
}

/// Polls until `f` gives a value or `within` passed.
fn poll<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for `child` to exit within `within`; kills it (and fails) if not.
/// `others` share its stderr pipe (its camera process): each still running
/// (not even a zombie) 5 s after it exited is killed before the output is
/// read, and returned.
fn exit_within(
    child: Child,
    within: Duration,
    what: &str,
    others: &[u32],
) -> (Output, Duration, Vec<u32>) {
    let start = Instant::now();
    let mut child = child;
    let done = poll(within, || child.try_wait().unwrap());
    let took = start.elapsed();
    let mut left = Vec::new();
    for &pid in others {
        let ended = poll(Duration::from_secs(5), || {
            stat(pid).is_none_or(|(s, _)| s == 'Z').then_some(())
        });
        if ended.is_none() {
            signal(pid, libc::SIGKILL);
            left.push(pid);
        }
    }
    if done.is_none() {
        let _ = child.kill();
        let o = child.wait_with_output().unwrap();
        panic!(
            "{what}: still running after {within:?}; stderr: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    (child.wait_with_output().unwrap(), took, left)
}

/// The camera process of a `--processes 2` run started as `parent`.
fn camera_of(parent: &Child) -> u32 {
    poll(Duration::from_secs(20), || {
        children_of(parent.id()).into_iter().next()
    })
    .expect("the CUDA process started no camera process")
}

#[test]
fn every_frame_crosses_and_comes_back_verified() {
    if !common::can_start_a_camera_process() {
        return;
    }
    let o = run(&["--json"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(j["processes"], 2, "{j}");
    assert_eq!(j["verified"], true, "{j}");
    let v = &j["verification"];
    assert_eq!(
        (&v["consumer_ok"], &v["readback_ok"]),
        (&30.into(), &30.into()),
        "{j}"
    );
    assert_eq!(v["failed"], 0, "{j}");
    assert!(j["why"].as_str().unwrap().ends_with("fences built"), "{j}");
    // Two different processes reported.
    let details = j["transport_details"].as_str().unwrap();
    let pid = |key: &str| {
        let i = details.find(key).unwrap() + key.len();
        details[i..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .to_owned()
    };
    assert!(details.contains(" 0 bytes differed"), "{details}");
    assert_ne!(pid("cuda pid "), pid("camera pid "));
}

/// A camera process stopped in the middle of the run (SIGSTOP): the CUDA
/// process gives up after `--peer-timeout`, says what it waited for, stops
/// the camera it started and exits non-zero. (Before: it waited for the
/// camera process without a limit, silently, for ever.)
#[test]
fn a_stopped_camera_ends_the_cuda_process_within_the_limit() {
    if !common::can_start_a_camera_process() {
        return;
    }
    let parent = command(1_000_000)
        .args(["--processes", "2", "--peer-timeout", &limit().to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let camera = camera_of(&parent);
    std::thread::sleep(Duration::from_millis(700));
    signal(camera, libc::SIGSTOP);
    let limit = Duration::from_secs(limit());
    let (o, took, left) = exit_within(parent, limit + SLACK, "the CUDA process", &[camera]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("error (cuda process)") && err.contains(&timed_out("camera process")),
        "{err}"
    );
    assert!(
        took >= limit - Duration::from_millis(800),
        "{took:?}: {err}"
    );
    assert!(
        left.is_empty(),
        "the stopped camera process was left running: {err}"
    );
}

/// The CUDA process (the one the user started) stopped in the middle of
/// the run: the camera process it started gives up after `--peer-timeout`
/// with the timeout error on the shared stderr, and exits (a zombie until
/// its stopped parent reaps it).
#[test]
fn a_stopped_cuda_process_ends_its_camera_process_within_the_limit() {
    if !common::can_start_a_camera_process() {
        return;
    }
    let parent = command(1_000_000)
        .args(["--processes", "2", "--peer-timeout", &limit().to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let camera = camera_of(&parent);
    std::thread::sleep(Duration::from_millis(700));
    signal(parent.id(), libc::SIGSTOP);
    let limit = Duration::from_secs(limit());
    let ended = poll(limit + SLACK, || {
        stat(camera).is_none_or(|(s, _)| s == 'Z').then_some(())
    });
    signal(parent.id(), libc::SIGKILL);
    if ended.is_none() {
        // It holds the stderr pipe open: end it before reading.
        signal(camera, libc::SIGKILL);
    }
    let o = parent.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        ended.is_some(),
        "the camera process outlived the limit: {err}"
    );
    assert!(
        err.contains(&format!(
            "error (camera process): {}",
            timed_out("CUDA process")
        )),
        "{err}"
    );
}

/// The two roles started separately (as on a Jetson, or by hand), over a
/// configuration file of the test's.
struct Pair {
    _cfg: IpcConfigFile,
    camera: Child,
    cuda: Child,
}

fn pair(frames: u64) -> Pair {
    let cfg =
        IpcConfigFile::inter_process(&[("tegra-interop-camera", "tegra-interop-cuda", 16, 4096)])
            .unwrap();
    let path = cfg.path().to_str().unwrap().to_owned();
    let role = |role: &str| {
        command(frames)
            .args(["--role", role, "--nvsciipc-config", &path])
            .args(["--peer-timeout", &limit().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let camera = role("camera");
    let cuda = role("cuda");
    Pair {
        _cfg: cfg,
        camera,
        cuda,
    }
}

/// Stops (or kills) one role after `after`; the other must end non-zero
/// within the limit with its one-line error. Returns that error.
fn victim_and_survivor(victim: &str, sig: libc::c_int, after: Duration) -> String {
    let Pair { _cfg, camera, cuda } = pair(1_000_000);
    let (victim_child, survivor, survivor_name) = if victim == "camera" {
        (camera, cuda, "cuda")
    } else {
        (cuda, camera, "camera")
    };
    std::thread::sleep(after);
    signal(victim_child.id(), sig);
    let limit = Duration::from_secs(limit());
    let (o, _, _) = exit_within(survivor, limit + SLACK, survivor_name, &[]);
    signal(victim_child.id(), libc::SIGKILL);
    let _ = victim_child.wait_with_output();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !o.status.success(),
        "{victim} got {sig}, yet the {survivor_name} side succeeded: {err}"
    );
    assert!(
        err.contains(&format!("error ({survivor_name} process)")),
        "{err}"
    );
    err
}

/// Either role stopped (SIGSTOP) in its frame loop: the other ends with a
/// timeout naming what it waited for, within the limit.
#[test]
fn a_stopped_peer_ends_the_other_role_with_a_timeout() {
    for (victim, peer) in [("camera", "camera"), ("cuda", "CUDA")] {
        let err = victim_and_survivor(victim, libc::SIGSTOP, Duration::from_millis(900));
        assert!(
            err.contains(&timed_out(&format!("{peer} process"))),
            "{victim} stopped: {err}"
        );
    }
}

/// Either role killed (SIGKILL) at several points: the other ends with a
/// typed error (the connection reset, or, killed before it connected, the
/// timeout of the connection), never a hang or a success.
#[test]
fn a_killed_peer_ends_the_other_role_with_a_typed_error() {
    for victim in ["camera", "cuda"] {
        for ms in [0, 150, 900] {
            let err = victim_and_survivor(victim, libc::SIGKILL, Duration::from_millis(ms));
            assert!(
                err.contains("connection was reset") || err.contains(&timed_out("")),
                "{victim} killed after {ms} ms: {err}"
            );
        }
    }
}

fn config_files(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("tegra-interop-sim-nvsciipc-"))
        })
        .collect()
}

/// The CUDA process killed (SIGKILL) at several points from start-up to
/// the frame loop: no NvSciIpc configuration file is left in the temporary
/// directory, and the orphaned camera process ends by itself. (Before:
/// the file was left behind every time.)
#[test]
fn a_killed_cuda_process_leaves_no_file_behind() {
    if !common::can_start_a_camera_process() {
        return;
    }
    let tmp = std::env::temp_dir().join(format!("two-process-tmp-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    for ms in [0, 40, 200, 900] {
        let mut parent = command(1_000_000)
            .args(["--processes", "2", "--peer-timeout", &limit().to_string()])
            .env("TMPDIR", &tmp)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(ms));
        let camera = children_of(parent.id());
        signal(parent.id(), libc::SIGKILL);
        parent.wait().unwrap();
        for c in camera {
            let ended = poll(Duration::from_secs(limit()) + SLACK, || {
                stat(c)
                    .is_none_or(|(s, ppid)| s == 'Z' || ppid == 0)
                    .then_some(())
            });
            if ended.is_none() {
                signal(c, libc::SIGKILL);
                panic!("killed after {ms} ms: the camera process {c} did not end");
            }
        }
        let left = config_files(&tmp);
        assert!(left.is_empty(), "killed after {ms} ms: left {left:?}");
    }
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// The shipped binary runs no program an environment variable names and
/// has no hidden flag to make a process die. (Before: the camera process
/// was started through `TEGRA_INTEROP_TEST_RUNNER`, and `--die-at`
/// existed.)
#[test]
fn the_shipped_binary_has_no_test_hooks() {
    if !common::can_start_a_camera_process() {
        return;
    }
    let o = command(30)
        .args(["--processes", "2"])
        .env("TEGRA_INTEROP_TEST_RUNNER", "/bin/false")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the runner variable was obeyed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = run(&["--die-at", "3"]);
    assert_eq!(o.status.code(), Some(2), "--die-at is accepted");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--die-at"), "{err}");
}

/// `--fault` in the two-process mode: a byte the camera damages is seen by
/// the consumer, a frame the CUDA side leaves unprocessed by the camera's
/// read-back; either fails the run (exit 1). (Before: `--fault corrupt`
/// was ignored there and the run passed.)
#[test]
fn verification_catches_an_injected_fault_on_either_side() {
    if !common::can_start_a_camera_process() {
        return;
    }
    // (fault, frames the consumer found intact, what the report names)
    for (fault, consumer_ok, seen) in [
        ("corrupt", 0, "the consumer saw"),
        ("skip-process", 30, "read back"),
    ] {
        let o = run(&["--fault", fault, "--json"]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(1), "--fault {fault}: {out}");
        let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(j["verified"], false, "{j}");
        let v = &j["verification"];
        assert_eq!(v["consumer_ok"], consumer_ok, "{j}");
        assert_eq!(v["readback_ok"], 0, "every frame fails its read-back: {j}");
        let first = v["first_failure"].as_str().unwrap();
        assert!(first.contains(seen), "--fault {fault}: {first}");
    }
}

#[test]
fn the_split_mode_refuses_other_backends() {
    let o = binary()
        .args(["--processes", "2", "--backend", "host", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "a bad argument");
    assert!(String::from_utf8_lossy(&o.stderr).contains("runs over NvSci"));
}

/// The CUDA side's frames are processed by the consumer's kernel (on the
/// simulator its registered Rust twin, launched through the same NVRTC
/// compile, module load and `cuLaunchKernel` as on a Jetson), not by a
/// host function: the twin counts one launch per frame, and none when the
/// kernel is skipped (`--fault skip-process`, which the camera's read-back
/// catches). The roles are started separately, so this runs under the
/// cross test runner too. (Before: a stream-ordered host function
/// processed the frames and the kernel path was refused.)
#[test]
fn the_kernel_processes_every_frame_on_the_cuda_side() {
    let cfg =
        IpcConfigFile::inter_process(&[("tegra-interop-camera", "tegra-interop-cuda", 16, 4096)])
            .unwrap();
    let path = cfg.path().to_str().unwrap().to_owned();
    let role = |role: &str, extra: &[&str]| {
        command(30)
            .args(["--role", role, "--nvsciipc-config", &path])
            .args(["--peer-timeout", &limit().to_string()])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let camera = role("camera", &[]);
    let cuda = role("cuda", &["--json"]);
    let within = Duration::from_secs(limit()) + SLACK;
    let (o, _, _) = exit_within(cuda, within, "cuda", &[]);
    let (c, _, _) = exit_within(camera, within, "camera", &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(j["verified"], true, "{j}");
    assert_eq!(j["verification"]["readback_ok"], 30, "{j}");
    let processing = j["processing"].as_str().unwrap();
    assert!(
        processing.contains("NVRTC kernel path") && processing.contains("Rust twin"),
        "{processing}"
    );
    assert!(!processing.contains("host function"), "{processing}");
    let details = j["transport_details"].as_str().unwrap();
    assert!(details.contains(" 30 kernel launches"), "{details}");

    // The kernel skipped: no launch, and the camera sees unprocessed frames.
    if !common::can_start_a_camera_process() {
        return;
    }
    let o = run(&["--fault", "skip-process", "--json"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let details = j["transport_details"].as_str().unwrap();
    assert!(details.contains(" 0 kernel launches"), "{details}");
    assert_eq!(j["verification"]["readback_ok"], 0, "{j}");
}

/// `--backend jetson` (or a Jetson's pair with `--endpoints`) selects the
/// real driver for both processes; where there is no Jetson it is refused
/// with the Jetson probe's reason before a camera process is started.
/// (Before: refused on every machine, as not written.)
#[test]
fn the_real_driver_is_selected_and_refused_with_the_reason_off_a_jetson() {
    if Path::new("/etc/nv_tegra_release").exists() {
        eprintln!("skipped: this machine is a Jetson");
        return;
    }
    for args in [
        &["--backend", "jetson", "--endpoints", "cam,cuda"][..],
        &["--backend", "auto", "--endpoints", "cam,cuda"][..],
    ] {
        let o = binary()
            .args(["--processes", "2", "--frames", "3", "--quiet"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?}: {err}");
        assert!(
            err.contains("on the real driver (the NvSci pair cam,cuda) needs a Jetson: "),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(!err.contains("camera process"), "{args:?}: {err}");
    }
}
