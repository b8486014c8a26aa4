//! The app-level defects of the two-process mode that probes of the
//! NvSciIpc path found (issue 31, item 5), each run the way the probe ran
//! it: the `pipeline` binary, both roles started by hand (`--role camera`,
//! `--role cuda` over a configuration file) or `--processes 2`. Each test
//! failed before its fix.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tegra_interop_sim::nvsci::IpcConfigFile;

/// The `--peer-timeout` of the healthy runs here, in seconds (more under
/// the cross test runner, whose emulated processes start slowly).
fn limit() -> u64 {
    if std::env::var("TEGRA_INTEROP_TEST_RUNNER").is_ok_and(|r| !r.trim().is_empty()) {
        10
    } else {
        3
    }
}

/// The pipeline binary, through the cross test runner where one is set.
fn binary() -> Command {
    common::child_command(env!("CARGO_BIN_EXE_pipeline"))
}

/// The pipeline binary with the small simulator run's options.
fn command(frames: u64) -> Command {
    let mut c = binary();
    c.args(["--backend", "sim", "--frames", &frames.to_string()])
        .args(["--ring", "3", "--width", "64", "--height", "16", "--quiet"]);
    c
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

/// Whether `pid` has ended (gone, or a zombie nobody reaped yet).
fn ended(pid: u32) -> bool {
    stat(pid).is_none_or(|(s, _)| s == 'Z')
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    pids()
        .filter(|&c| stat(c).is_some_and(|(_, ppid)| ppid == pid))
        .collect()
}

fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
}

/// The processes whose environment holds `VAR=value`.
fn with_env(var: &str, value: &str) -> Vec<u32> {
    let want = format!("{var}={value}");
    pids()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/environ"))
                .is_ok_and(|e| e.split(|&b| b == 0).any(|kv| kv == want.as_bytes()))
        })
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

/// Waits at most `within` for `child`; kills it (and fails) if it is
/// still running then.
fn output_within(mut child: Child, within: Duration, what: &str) -> Output {
    if poll(within, || child.try_wait().unwrap()).is_none() {
        let _ = child.kill();
        let o = child.wait_with_output().unwrap();
        panic!(
            "{what}: still running after {within:?}; stderr: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    child.wait_with_output().unwrap()
}

/// The line of `stderr` that starts with `prefix`.
fn line<'a>(stderr: &'a str, prefix: &str) -> &'a str {
    stderr
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in: {stderr}"))
}

/// Both roles started by hand over a configuration file of the test's,
/// each with its own extra options; their outputs once both ended.
fn roles(frames: u64, camera: &[&str], cuda: &[&str]) -> (Output, Output) {
    let cfg =
        IpcConfigFile::inter_process(&[("tegra-interop-camera", "tegra-interop-cuda", 16, 4096)])
            .unwrap();
    let path = cfg.path().to_str().unwrap().to_owned();
    let start = |role: &str, extra: &[&str]| {
        command(frames)
            .args(["--role", role, "--nvsciipc-config", &path])
            .args(["--peer-timeout", &limit().to_string()])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let cam = start("camera", camera);
    let cud = start("cuda", cuda);
    let within = Duration::from_secs(limit() + 20);
    let cuda_out = output_within(cud, within, "the CUDA role");
    let camera_out = output_within(cam, within, "the camera role");
    (camera_out, cuda_out)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `--fault` given to one role only: the run fails verification (exit 1)
/// on the CUDA side, which reports. (Before: `--role cuda --fault corrupt`
/// with a plain `--role camera` verified 20/20 and exited 0, the fault was
/// not in the hello; `--role camera --fault skip-process` was ignored the
/// same way.)
#[test]
fn a_fault_given_to_one_role_fails_the_run() {
    for (camera, cuda, seen) in [
        (&[][..], &["--fault", "corrupt"][..], "the consumer saw"),
        (&["--fault", "skip-process"][..], &[][..], "read back"),
        (&["--fault", "corrupt"][..], &[][..], "the consumer saw"),
    ] {
        let mut json = cuda.to_vec();
        json.push("--json");
        let (cam, cud) = roles(20, camera, &json);
        let out = text(&cud.stdout);
        let why = format!(
            "camera {camera:?}, cuda {cuda:?}: {out}\ncuda: {}\ncamera: {}",
            text(&cud.stderr),
            text(&cam.stderr)
        );
        assert_eq!(cud.status.code(), Some(1), "{why}");
        let j: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(j["verified"], false, "{why}");
        let first = j["verification"]["first_failure"].as_str().unwrap();
        assert!(first.contains(seen), "{why}");
        // The camera did its part and ended cleanly.
        assert!(cam.status.success(), "{why}");
    }
}

/// Two different faults, one per role: refused by both, naming `--fault`.
#[test]
fn different_faults_on_the_two_roles_are_refused() {
    let (cam, cud) = roles(20, &["--fault", "corrupt"], &["--fault", "skip-process"]);
    let err = text(&cud.stderr);
    assert_eq!(cud.status.code(), Some(1), "{err}");
    let l = line(&err, "error (cuda process)");
    assert!(
        l.contains("--fault") && l.contains("corrupt") && l.contains("skip-process"),
        "{l}"
    );
    assert!(!cam.status.success(), "{}", text(&cam.stderr));
}

/// Roles started with different options: the CUDA side names the options
/// that differ, with both values, instead of "connection was reset".
#[test]
fn an_option_mismatch_is_named_on_both_sides() {
    let (cam, cud) = roles(20, &["--ring", "4"], &["--frames", "21"]);
    let err = text(&cud.stderr);
    assert_eq!(cud.status.code(), Some(1), "{err}");
    let l = line(&err, "error (cuda process)");
    assert!(!l.contains("connection was reset"), "{l}");
    for want in ["--frames 21", "--frames 20", "--ring 3", "--ring 4"] {
        assert!(l.contains(want), "{want:?} not in: {l}");
    }
    let cerr = text(&cam.stderr);
    assert!(!cam.status.success(), "{cerr}");
    let l = line(&cerr, "error (camera process)");
    assert!(l.contains("--frames") && l.contains("--ring"), "{l}");
}

/// The camera process killed mid-run: the CUDA process's error says how
/// its camera process ended. (Before: the camera's exit status was never
/// reported when the CUDA side failed.)
#[test]
fn the_cuda_process_reports_how_its_camera_process_ended() {
    if !common::can_start_a_camera_process() {
        return;
    }
    let parent = command(1_000_000)
        .args(["--processes", "2", "--peer-timeout", &limit().to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let camera = poll(Duration::from_secs(20), || {
        children_of(parent.id()).into_iter().next()
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    signal(camera, libc::SIGKILL);
    let o = output_within(
        parent,
        Duration::from_secs(limit() + 12),
        "the CUDA process",
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let l = line(&err, "error (cuda process)");
    assert!(
        l.contains("the camera process was killed by signal 9"),
        "{l}"
    );
}

/// The CUDA process killed (SIGKILL) in its first milliseconds, before it
/// opened its end of the pair: the camera process it started ends at once
/// (it watches the process that started it until it is connected),
/// however long `--peer-timeout` is. (Before: it waited the whole limit,
/// 30 s by default, for a peer that was dead.) Several kill times, so that
/// some fall between the camera's start and the CUDA side's open.
#[test]
fn a_cuda_process_killed_at_start_leaves_no_camera_waiting() {
    if !common::can_start_a_camera_process() {
        return;
    }
    let tag = format!("{}", std::process::id());
    let mut cameras = 0;
    for us in [500, 1000, 1500, 2000, 2500, 3000, 4000, 5000, 6000, 8000] {
        let value = format!("{tag}-{us}");
        let mut parent = command(1_000_000)
            .args(["--processes", "2", "--peer-timeout", "60"])
            .env("TWO_PROCESS_DEFECTS_RUN", &value)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(us));
        signal(parent.id(), libc::SIGKILL);
        parent.wait().unwrap();
        let orphans: Vec<u32> = with_env("TWO_PROCESS_DEFECTS_RUN", &value)
            .into_iter()
            .filter(|&p| !ended(p))
            .collect();
        cameras += orphans.len();
        for c in orphans {
            let gone = poll(Duration::from_secs(5), || ended(c).then_some(()));
            if gone.is_none() {
                signal(c, libc::SIGKILL);
                panic!("killed after {us} us: its camera process {c} still waits");
            }
        }
    }
    eprintln!("{cameras} orphaned camera processes seen, each ended");
}

/// A configuration file the simulator cannot use: the error line says
/// why (the file's fault, with its line), not only `NotPermitted (33)`
/// with the reason in a diagnostic line above it.
#[test]
fn a_bad_configuration_file_is_reported_with_its_reason() {
    let dir = std::env::temp_dir().join(format!("two-process-defects-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.cfg");
    std::fs::write(&path, "INTER_PROCESS a b 16 4096\nGARBAGE x y\n").unwrap();
    let o = command(5)
        .args(["--role", "cuda", "--nvsciipc-config"])
        .arg(&path)
        .args(["--peer-timeout", "2"])
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let l = line(&err, "error (cuda process)");
    let reason = l.find("line 2: unknown backend \"GARBAGE\"");
    assert!(reason.is_some(), "the reason is not in the error: {l}");
    if let Some(code) = l.find("NotPermitted") {
        assert!(reason < Some(code), "the code comes before the reason: {l}");
    }
}

/// `--peer-timeout` values that round to no time at all, or below the
/// smallest useful limit, are bad arguments (exit 2) naming the minimum.
/// (Before: `1e-10` was taken as a limit of 0 ns.)
#[test]
fn a_peer_timeout_below_a_millisecond_is_refused() {
    for v in ["1e-10", "0.0001", "0.0009999"] {
        let o = command(5)
            .args(["--processes", "2", "--peer-timeout", v])
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "--peer-timeout {v}: {err}");
        assert!(
            err.contains("--peer-timeout") && err.contains("0.001"),
            "--peer-timeout {v}: {err}"
        );
    }
}
