//! `pipeline --processes 2` on the simulator: the camera in a second
//! process, connected to the CUDA process only by simulated NvSciIpc.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use tegra_interop_sim::nvsci::IpcConfigFile;

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
fn command() -> Command {
    let mut c = binary();
    c.args([
        "--backend",
        "sim",
        "--frames",
        "30",
        "--ring",
        "3",
        "--width",
        "64",
        "--height",
        "16",
        "--quiet",
    ]);
    c
}

fn run(extra: &[&str]) -> Output {
    command()
        .args(["--processes", "2"])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn every_frame_crosses_and_comes_back_verified() {
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

/// Both sides run alone (`--role`) on one configuration file, for a run
/// long enough to be cut short; `victim` is killed `after` its start, the
/// other side's output is returned (it must end by itself).
fn kill_one_side(victim: &str, after: Duration) -> Output {
    let cfg =
        IpcConfigFile::inter_process(&[("tegra-interop-camera", "tegra-interop-cuda", 16, 4096)])
            .unwrap();
    let path = cfg.path().to_str().unwrap().to_owned();
    let side = |role: &str| {
        let mut c = command();
        c.args([
            "--frames",
            "1000000",
            "--role",
            role,
            "--nvsciipc-config",
            &path,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    let mut camera = side("camera");
    let mut cuda = side("cuda");
    let (mut dead, survivor) = if victim == "camera" {
        (camera, cuda)
    } else {
        std::mem::swap(&mut camera, &mut cuda);
        (camera, cuda)
    };
    std::thread::sleep(after);
    dead.kill().unwrap();
    dead.wait().unwrap();
    // The survivor ends by itself: on "connection reset", or after the
    // mode's own limit where the victim died before it connected.
    let (tx, rx) = std::sync::mpsc::channel();
    let pid = survivor.id();
    std::thread::spawn(move || tx.send(survivor.wait_with_output()));
    match rx.recv_timeout(Duration::from_secs(90)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{victim} killed after {after:?}: the other side never ended");
        }
    }
}

/// The survivor's error names the lost peer: the connection reset, or (the
/// victim killed before it connected, e.g. under a slow emulator) no answer
/// within the mode's limit.
fn peer_gone(err: &str) -> bool {
    err.contains("connection was reset") || err.contains("no answer from the peer within")
}

/// The camera process killed at times across set-up and the frame loop:
/// the CUDA process ends with a one-line typed error, never a hang.
#[test]
fn a_camera_that_dies_gives_the_cuda_process_a_clear_error() {
    for ms in [150, 600, 2000] {
        let o = kill_one_side("camera", Duration::from_millis(ms));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "camera killed at {ms} ms, yet success");
        assert!(
            err.contains("error (cuda process)") && peer_gone(&err),
            "camera killed at {ms} ms: {err}"
        );
    }
}

/// The CUDA process killed the same way: the camera ends with the error.
#[test]
fn a_cuda_process_that_dies_gives_the_camera_a_clear_error() {
    for ms in [150, 600, 2000] {
        let o = kill_one_side("cuda", Duration::from_millis(ms));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success(),
            "CUDA killed at {ms} ms, yet the camera succeeded"
        );
        assert!(
            err.contains("error (camera process)") && peer_gone(&err),
            "CUDA killed at {ms} ms: {err}"
        );
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
