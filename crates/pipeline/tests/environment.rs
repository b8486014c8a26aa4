//! The environment (issue 30, item 5): the library reads none; the
//! `pipeline` program reads every `TEGRA_INTEROP_*` variable it knows in
//! one place (`app::cli`), and refuses a bad value with one line naming the
//! variable, the value and what it accepts, before anything runs.
#![allow(clippy::unwrap_used)]

mod common;
use common::child_command;

use std::path::{Path, PathBuf};
use std::process::Output;

/// Every file under `dir` ending in `.rs`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_library_reads_no_environment() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let program = [src.join("app"), src.join("bin")];
    let mut library = 0;
    let mut found = Vec::new();
    for f in files {
        if program.iter().any(|p| f.starts_with(p)) {
            continue;
        }
        library += 1;
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            if ["env::var", "env::vars", "getenv"]
                .iter()
                .any(|w| line.contains(w))
            {
                found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        library > 10,
        "only {library} library files found under {src:?}"
    );
    assert!(
        found.is_empty(),
        "the library reads the environment:\n{}",
        found.join("\n")
    );
}

fn run_with(var: &str, value: &str, args: &[&str]) -> Output {
    child_command(env!("CARGO_BIN_EXE_pipeline"))
        .env(var, value)
        .args(args)
        .output()
        .unwrap()
}

const HOST: &[&str] = &[
    "--backend",
    "host",
    "--frames",
    "4",
    "--ring",
    "3",
    "--width",
    "64",
    "--height",
    "16",
    "--quiet",
];

const EGL: &[&str] = &[
    "--backend",
    "egl",
    "--frames",
    "4",
    "--ring",
    "3",
    "--width",
    "64",
    "--height",
    "16",
    "--quiet",
];

/// Each variable with values it refuses (garbage, 0 and 100000 where they
/// are not accepted), and what the message says it accepts.
const REFUSED: &[(&str, &[&str], &str)] = &[
    (
        "TEGRA_INTEROP_FRAME_THREADS",
        &["abc", "0", "100000", "-1", "2.5"],
        "1..=64",
    ),
    (
        "TEGRA_INTEROP_EGL_POOL",
        &["abc", "0", "100000", "3"],
        "4..=64",
    ),
    (
        "TEGRA_INTEROP_CAMERA_AHEAD",
        &["abc", "100000", "yes"],
        "on",
    ),
    (
        "TEGRA_INTEROP_GPU_HANDOVER",
        &["abc", "0", "100000"],
        "host-only",
    ),
    (
        "TEGRA_INTEROP_GPU_EARLY",
        &["abc", "100000", "yes"],
        "0 or 1",
    ),
    (
        "TEGRA_INTEROP_GPU_COPY_WITH",
        &["abc", "0", "100000"],
        "kernels",
    ),
    (
        "TEGRA_INTEROP_GPU_COPY_FROM",
        &["abc", "0", "100000"],
        "registered",
    ),
    (
        "TEGRA_INTEROP_GPU_RECLAIM_AFTER",
        &["abc", "9", "100000"],
        "0..=8",
    ),
    (
        "TEGRA_INTEROP_VK_QUEUE",
        &["abc", "0", "100000"],
        "transfer-only",
    ),
];

#[test]
fn every_variable_refuses_a_bad_value_naming_it() {
    for (var, values, accepts) in REFUSED {
        for value in *values {
            // The EGL pool's range depends on the ring (3 here).
            let o = run_with(var, value, if var.contains("EGL") { EGL } else { HOST });
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{var}={value}: {err}");
            assert_eq!(err.lines().count(), 1, "{var}={value}: {err}");
            for w in [*var, value, accepts] {
                assert!(err.contains(w), "{var}={value}: {err} (wanted {w:?})");
            }
            assert!(o.stdout.is_empty(), "{var}={value}: nothing ran");
        }
    }
}

#[test]
fn good_values_are_taken() {
    for (var, value, args) in [
        ("TEGRA_INTEROP_FRAME_THREADS", "2", HOST),
        ("TEGRA_INTEROP_FRAME_THREADS", " 64 ", HOST),
        ("TEGRA_INTEROP_EGL_POOL", "4", EGL),
        ("TEGRA_INTEROP_EGL_POOL", "64", EGL),
        ("TEGRA_INTEROP_CAMERA_AHEAD", "off", HOST),
        ("TEGRA_INTEROP_GPU_EARLY", "0", HOST),
        ("TEGRA_INTEROP_GPU_RECLAIM_AFTER", "0", HOST),
        ("TEGRA_INTEROP_VK_QUEUE", "compute-only", HOST),
        ("TEGRA_INTEROP_FRAME_THREADS", "", HOST),
    ] {
        let o = run_with(var, value, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{var}={value:?}: {err}");
    }
}

#[test]
fn a_flag_wins_over_its_variable() {
    // Both valid: the flag is taken (`app::cli`'s unit tests check which).
    let mut args = HOST.to_vec();
    args.extend_from_slice(&["--frame-threads", "3"]);
    let o = run_with("TEGRA_INTEROP_FRAME_THREADS", "5", &args);
    assert_eq!(o.status.code(), Some(0));
    let mut args = EGL.to_vec();
    args.extend_from_slice(&["--egl-pool", "6"]);
    let o = run_with("TEGRA_INTEROP_EGL_POOL", "5", &args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut args = EGL.to_vec();
    args.extend_from_slice(&["--egl-pool", "3"]);
    let o = run_with("TEGRA_INTEROP_EGL_POOL", "5", &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--egl-pool") && err.contains("4..=64"),
        "{err}"
    );
    // `--egl-pool` only applies to the EGL backend.
    let mut args = HOST.to_vec();
    args.extend_from_slice(&["--egl-pool", "6"]);
    let o = run_with("TEGRA_INTEROP_EGL_POOL", "", &args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--egl-pool") && err.contains("--backend egl"),
        "{err}"
    );
}
