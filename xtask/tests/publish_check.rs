//! `cargo xtask publish-check` on this workspace, run as CI runs it.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

/// The crates CI packages (LIB_CRATES in .ci/run).
const PUBLISHED: &[&str] = &[
    "tegra-interop-sys",
    "tegra-interop-core",
    "tegra-interop-driver",
    "tegra-interop-sim",
    "tegra-interop",
    "tegra-interop-platform",
    "tegra-interop-pipeline",
];

fn publish_check(crates: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .arg("publish-check")
        .args(crates)
        .output()
        .unwrap()
}

#[test]
fn every_published_crate_has_complete_metadata() {
    let out = publish_check(PUBLISHED);
    assert!(
        out.status.success(),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The package lists were read: both licence texts in each, no notebook.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ship both licence texts and no history notebook"),
        "{stdout}"
    );
}

#[test]
fn the_licence_texts_are_at_the_root_and_in_every_published_crate() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    for dir in [
        "crates/sys",
        "crates/core",
        "crates/driver",
        "crates/sim",
        ".",
        "crates/platform",
        "crates/pipeline",
    ] {
        for file in ["LICENSE-MIT", "LICENSE-APACHE"] {
            let here = std::fs::read(root.join(dir).join(file))
                .unwrap_or_else(|e| panic!("{dir}/{file}: {e}"));
            assert_eq!(
                here,
                std::fs::read(root.join(file)).unwrap(),
                "{dir}/{file}"
            );
        }
    }
}

#[test]
fn ci_lists_exactly_the_published_crates() {
    let ci = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/run")).unwrap();
    let line = ci
        .lines()
        .find(|l| l.starts_with("LIB_CRATES=("))
        .expect("LIB_CRATES in .ci/run");
    let listed: Vec<&str> = line
        .trim_start_matches("LIB_CRATES=(")
        .trim_end_matches(')')
        .split_whitespace()
        .collect();
    let mut a = listed.clone();
    let mut b = PUBLISHED.to_vec();
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b);
}

#[test]
fn a_published_crate_left_off_the_list_fails_with_one_error_line() {
    let out = publish_check(&PUBLISHED[1..]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("tegra-interop-sys: published (no `publish = false`) but not in the list"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("error: publish-check: 1 problem"),
        "{stderr}"
    );
}

#[test]
fn no_crate_named_is_a_usage_error() {
    let out = publish_check(&[]);
    assert_eq!(out.status.code(), Some(2));
}
