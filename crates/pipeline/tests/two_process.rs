//! `pipeline --processes 2` on the simulator: the camera in a second
//! process, connected to the CUDA process only by simulated NvSciIpc.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output, Stdio};

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
    assert!(out.contains("\"processes\":2"), "{out}");
    assert!(out.contains("\"passed\":true"), "{out}");
    assert!(out.contains("\"verified\":30,\"failed\":0"), "{out}");
    assert!(out.contains("\"mismatched_bytes\":0"), "{out}");
    assert!(out.contains("\"fences\":\"built\""), "{out}");
    // Two different processes reported.
    let pid = |key: &str| {
        let i = out.find(key).unwrap() + key.len();
        out[i..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .to_owned()
    };
    assert_ne!(pid("\"cuda\":{\"pid\":"), pid("\"camera\":{\"pid\":"));
}

/// The camera process killed at messages across set-up and the frame loop:
/// the CUDA process ends with a one-line typed error, never a hang.
#[test]
fn a_camera_that_dies_gives_the_cuda_process_a_clear_error() {
    // 1: hello; 2..=28: the three slots' objects; later: the frames.
    for die_at in [1, 2, 5, 10, 28, 29, 31, 40, 60] {
        let o = run(&["--die-at", &die_at.to_string()]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "camera died at {die_at}, yet success");
        assert!(
            err.contains("error (cuda process)") && err.contains("connection was reset"),
            "camera died at {die_at}: {err}"
        );
    }
}

/// The CUDA process killed the same way: the camera ends with the error.
#[test]
fn a_cuda_process_that_dies_gives_the_camera_a_clear_error() {
    for die_at in [1, 3, 12, 28, 30, 45] {
        let cfg = IpcConfigFile::inter_process(&[(
            "tegra-interop-camera",
            "tegra-interop-cuda",
            16,
            4096,
        )])
        .unwrap();
        let path = cfg.path().to_str().unwrap().to_owned();
        let camera = command()
            .args(["--role", "camera", "--nvsciipc-config", &path])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let cuda = command()
            .args(["--role", "cuda", "--nvsciipc-config", &path])
            .args(["--die-at", &die_at.to_string()])
            .output()
            .unwrap();
        assert!(
            cuda.status.success(),
            "the CUDA side ends quietly at {die_at}"
        );
        let cam = camera.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&cam.stderr);
        assert!(
            !cam.status.success(),
            "CUDA died at {die_at}, yet the camera succeeded"
        );
        assert!(
            err.contains("error (camera process)") && err.contains("connection was reset"),
            "CUDA died at {die_at}: {err}"
        );
    }
}

#[test]
fn the_split_mode_refuses_other_backends() {
    let o = binary()
        .args(["--processes", "2", "--backend", "host", "--quiet"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("runs over NvSci"));
}
