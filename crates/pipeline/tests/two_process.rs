//! `pipeline --processes 2` on the simulator: the camera in a second
//! process, connected to the CUDA process only by simulated NvSciIpc.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

fn run(extra: &[&str]) -> Output {
    let exe = env!("CARGO_BIN_EXE_pipeline");
    let mut c = match std::env::var("TEGRA_INTEROP_TEST_RUNNER") {
        Ok(r) if !r.trim().is_empty() => {
            let mut words = r.split_whitespace();
            let mut c = Command::new(words.next().unwrap());
            c.args(words).arg(exe);
            c
        }
        _ => Command::new(exe),
    };
    c.args([
        "--processes",
        "2",
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
    ])
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

#[test]
fn the_split_mode_refuses_other_backends() {
    let o = Command::new(env!("CARGO_BIN_EXE_pipeline"))
        .args(["--processes", "2", "--backend", "host", "--quiet"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("runs over NvSci"));
}
