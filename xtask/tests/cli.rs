//! Runs the built `xtask` binary the way a user or CI does.
//!
//! The codegen tests are real: they run bindgen (libclang) on the pinned CUDA
//! header, fetched once into `target/codegen-cache` (pip + network on a fresh
//! machine; .ci/run installs libclang-dev and runs them). They never touch
//! the committed bindings: the staleness check runs against copies in a
//! temporary directory (`codegen --check --against DIR`).
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

fn xtask(args: &[&str]) -> Output {
    xtask_env(args, &[])
}

fn xtask_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    // A backtrace request must not change what the user sees.
    cmd.env("RUST_BACKTRACE", "1");
    cmd.output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The contract for every failure: one `error:` line (plus, for usage
/// mistakes, one pointer to the help), no panic output, the given exit code.
fn assert_clean_failure(out: &Output, code: i32, must_mention: &[&str]) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "exit code; stderr:\n{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| !l.starts_with("codegen: fetching"))
        .collect();
    assert!(!lines.is_empty(), "no error message");
    assert!(
        lines[0].starts_with("error: "),
        "first line: {:?}",
        lines[0]
    );
    let expected_lines = if code == 2 { 2 } else { 1 };
    assert_eq!(
        lines.len(),
        expected_lines,
        "stderr should be one error line:\n{err}"
    );
    if code == 2 {
        assert_eq!(lines[1], "(run `cargo xtask help` for usage)");
    }
    for word in ["panicked", "backtrace", "RUST_BACKTRACE"] {
        assert!(!err.contains(word), "panic output in stderr:\n{err}");
    }
    for needle in must_mention {
        assert!(
            lines[0].contains(needle),
            "{:?} should mention {needle:?}",
            lines[0]
        );
    }
    lines[0].to_string()
}

fn temp_dir(name: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("xtask-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Copies the committed generated files into a fresh directory.
fn copy_of_generated(name: &str) -> PathBuf {
    let dir = temp_dir(name);
    for file in ["cuda.rs", "nvsci.rs", "lists.rs", "nvrtc.rs", "versions.rs"] {
        std::fs::copy(repo().join("crates/sys/src").join(file), dir.join(file)).unwrap();
    }
    std::fs::copy(
        repo().join("crates/sys/CUDA_VERSIONS.md"),
        dir.join("CUDA_VERSIONS.md"),
    )
    .unwrap();
    dir
}

#[test]
fn check_passes_on_an_exact_copy_of_the_committed_bindings() {
    let dir = copy_of_generated("clean");
    let out = xtask(&["codegen", "--check", "--against", dir.to_str().unwrap()]);
    assert!(out.status.success(), "stderr:\n{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("up to date"), "stdout:\n{stdout}");
}

#[test]
fn check_fails_after_a_hand_edit_of_cuda_rs_and_names_it() {
    let dir = copy_of_generated("cuda-edit");
    let path = dir.join("cuda.rs");
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text.replace(
        "pub const CUDA_EXTERNAL_MEMORY_DEDICATED: u32 = 1;",
        "pub const CUDA_EXTERNAL_MEMORY_DEDICATED: u32 = 3;",
    );
    assert_ne!(text, edited, "the edit must change the file");
    std::fs::write(&path, edited).unwrap();

    let out = xtask(&["codegen", "--check", "--against", dir.to_str().unwrap()]);
    let line = assert_clean_failure(&out, 1, &["stale", "cuda.rs"]);
    assert!(
        !line.contains("nvsci.rs"),
        "only cuda.rs was edited: {line}"
    );
}

#[test]
fn check_fails_after_a_whitespace_only_edit_of_nvsci_rs() {
    let dir = copy_of_generated("nvsci-edit");
    let path = dir.join("nvsci.rs");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push('\n');
    std::fs::write(&path, text).unwrap();

    let out = xtask(&["codegen", "--check", "--against", dir.to_str().unwrap()]);
    let line = assert_clean_failure(&out, 1, &["stale", "nvsci.rs"]);
    assert!(
        !line.contains("cuda.rs"),
        "only nvsci.rs was edited: {line}"
    );
}

/// The version table (issue 25) is generated too: a hand edit of a release,
/// in the Rust table or in the markdown, is stale.
#[test]
fn check_fails_after_a_hand_edit_of_the_version_tables_and_names_them() {
    for (file, from, to) in [
        (
            "versions.rs",
            "name: \"cuFuncGetParamInfo\", symbol: \"cuFuncGetParamInfo\", since: 12040",
            "name: \"cuFuncGetParamInfo\", symbol: \"cuFuncGetParamInfo\", since: 11040",
        ),
        (
            "CUDA_VERSIONS.md",
            "| `cuFuncGetParamInfo` | `cuFuncGetParamInfo` | 12.4 | **no** |",
            "| `cuFuncGetParamInfo` | `cuFuncGetParamInfo` | 11.4 | yes |",
        ),
    ] {
        let dir = copy_of_generated(&format!("versions-edit-{file}"));
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let edited = text.replace(from, to);
        assert_ne!(text, edited, "the edit must change {file}");
        std::fs::write(&path, edited).unwrap();
        let out = xtask(&["codegen", "--check", "--against", dir.to_str().unwrap()]);
        let line = assert_clean_failure(&out, 1, &["stale", file]);
        assert!(!line.contains("cuda.rs"), "only {file} was edited: {line}");
    }
}

#[test]
fn check_fails_after_a_hand_edit_of_nvrtc_rs_and_names_it() {
    let dir = copy_of_generated("nvrtc-edit");
    let path = dir.join("nvrtc.rs");
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text.replace(
        "pub const NVRTC_ERROR_COMPILATION: nvrtcResult = nvrtcResult(6);",
        "pub const NVRTC_ERROR_COMPILATION: nvrtcResult = nvrtcResult(7);",
    );
    assert_ne!(text, edited, "the edit must change the file");
    std::fs::write(&path, edited).unwrap();

    let out = xtask(&["codegen", "--check", "--against", dir.to_str().unwrap()]);
    let line = assert_clean_failure(&out, 1, &["stale", "nvrtc.rs"]);
    assert!(
        !line.contains("cuda.rs"),
        "only nvrtc.rs was edited: {line}"
    );
}

#[test]
fn check_fails_when_a_generated_file_is_missing() {
    let dir = copy_of_generated("missing");
    std::fs::remove_file(dir.join("cuda.rs")).unwrap();
    let out = xtask(&["codegen", "--check", "--against", dir.to_str().unwrap()]);
    assert_clean_failure(&out, 1, &["--against", "cuda.rs", "does not exist"]);
}

#[test]
fn unknown_flag_is_a_usage_error() {
    let out = xtask(&["codegen", "--chek"]);
    assert_clean_failure(&out, 2, &["unexpected argument '--chek'"]);
    let out = xtask(&["cross", "--fast"]);
    assert_clean_failure(&out, 2, &["unexpected argument '--fast'"]);
}

#[test]
fn unknown_or_missing_command_is_a_usage_error() {
    let out = xtask(&["frobnicate"]);
    assert_clean_failure(&out, 2, &["unrecognized subcommand 'frobnicate'"]);
    let out = xtask(&[]);
    assert_clean_failure(&out, 2, &["no command"]);
}

#[test]
fn flag_without_value_is_a_usage_error() {
    let out = xtask(&["codegen", "--cuda-include"]);
    assert_clean_failure(&out, 2, &["a value is required for '--cuda-include <DIR>'"]);
    let out = xtask(&["codegen", "--cuda-include", "--check"]);
    assert_clean_failure(&out, 2, &["a value is required for '--cuda-include <DIR>'"]);
    let out = xtask(&["codegen", "--against", "/tmp"]);
    assert_clean_failure(&out, 2, &["--against only makes sense with --check"]);
}

#[test]
fn missing_cuda_include_dir_is_one_clear_line() {
    let out = xtask(&[
        "codegen",
        "--check",
        "--cuda-include",
        "/nonexistent/cuda/include",
    ]);
    assert_clean_failure(
        &out,
        1,
        &[
            "--cuda-include",
            "/nonexistent/cuda/include/cuda.h",
            "does not exist",
        ],
    );
}

#[test]
fn missing_nvsci_include_dir_is_one_clear_line() {
    let out = xtask(&[
        "codegen",
        "--check",
        "--nvsci-include",
        "/nonexistent/nvsci",
    ]);
    assert_clean_failure(
        &out,
        1,
        &["--nvsci-include", "nvscibuf.h", "does not exist"],
    );
}

#[test]
fn wheel_not_fetchable_without_pip_is_one_clear_line() {
    // An empty cache forces a fetch; a Python that does not exist cannot run pip.
    let cache = temp_dir("no-python");
    let out = xtask_env(
        &["codegen", "--check", "--cache-dir", cache.to_str().unwrap()],
        &[("PYTHON", "/nonexistent/python3")],
    );
    assert_clean_failure(
        &out,
        1,
        &[
            "cannot run",
            "nvidia-cuda-runtime-cu12==12.9.79",
            "--cuda-include",
        ],
    );
}

#[test]
fn wheel_not_fetchable_when_pip_fails_is_one_clear_line() {
    // `false` runs and exits 1, as pip does when the index is unreachable.
    let cache = temp_dir("pip-fails");
    let out = xtask_env(
        &["codegen", "--check", "--cache-dir", cache.to_str().unwrap()],
        &[("PYTHON", "false")],
    );
    assert_clean_failure(&out, 1, &["could not fetch the wheel", "--cuda-include"]);
}

#[test]
fn cross_rejects_an_unknown_target() {
    let out = xtask(&["cross", "--only", "riscv64gc-unknown-none-elf", "--list"]);
    assert_clean_failure(
        &out,
        2,
        &[
            "riscv64gc-unknown-none-elf",
            "known: aarch64-unknown-linux-gnu",
        ],
    );
}

#[test]
fn cross_lists_every_target_and_the_qemu_runner() {
    let out = xtask(&["cross", "--list"]);
    assert!(out.status.success(), "stderr:\n{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "aarch64-unknown-linux-gnu: test core",
        "RUNNER=\"qemu-aarch64 -L /usr/aarch64-linux-gnu\"",
        // Linked by zig against glibc 2.31, the release binaries checked.
        "cargo zigbuild --target aarch64-unknown-linux-gnu.2.31 --release -p tegra-interop-pipeline --bins --message-format=json-render-diagnostics",
        "cargo-zigbuild test --target aarch64-unknown-linux-gnu.2.31 -p tegra-interop-core",
        "cargo build --target aarch64-unknown-none -p tegra-interop-sys",
        "cargo build --target thumbv7em-none-eabihf -p tegra-interop-core --features defmt",
        "cargo +nightly build --target armv7r-none-eabihf -Z build-std=core -p tegra-interop-sys",
        "-p tegra-interop --no-default-features",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

#[test]
fn help_lists_both_commands() {
    for args in [&["help"][..], &["--help"][..]] {
        let out = xtask(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("codegen")
                && stdout.contains("cross")
                && stdout.contains("glibc-floor"),
            "{stdout}"
        );
    }
    // Each command's help lists its options.
    for (command, options) in [
        (
            "codegen",
            &[
                "--check",
                "--cuda-include <DIR>",
                "--nvsci-include <DIR>",
                "--against <DIR>",
                "--cache-dir <DIR>",
            ][..],
        ),
        (
            "cross",
            &["--only <TARGET>", "--no-run", "--keep-going", "--list"][..],
        ),
    ] {
        for args in [vec!["help", command], vec![command, "--help"]] {
            let out = xtask(&args);
            assert!(out.status.success(), "{args:?}: {}", stderr(&out));
            let stdout = String::from_utf8_lossy(&out.stdout);
            for o in options {
                assert!(stdout.contains(o), "{args:?}: {o} in {stdout}");
            }
        }
    }
}

#[test]
fn missing_libclang_is_one_clear_line_not_a_panic() {
    // bindgen itself panics when libclang cannot be loaded; the xtask must
    // turn that into its usual one-line error.
    let out = xtask_env(
        &["codegen", "--check"],
        &[("LIBCLANG_PATH", "/nonexistent/libclang")],
    );
    assert_clean_failure(&out, 1, &["bindgen failed", "libclang"]);
}

fn glibc_fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/glibc")
        .join(name)
        .display()
        .to_string()
}

/// `glibc-floor` on a binary linked the old way (Debian 12's cross gcc)
/// fails against 2.31, names the file and the version; the zig-built one
/// passes, and its line says what it needs.
#[test]
fn glibc_floor_fails_above_the_floor_and_passes_at_it() {
    let old = glibc_fixture("gcc-cross-2.34.elf");
    let zig = glibc_fixture("zig-2.31.elf");
    let out = xtask(&["glibc-floor", "--max", "2.31", &zig, &old]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        stdout.contains("zig-2.31.elf: needs GLIBC_2.17 (at most 2.31: ok)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("gcc-cross-2.34.elf: needs GLIBC_2.34, above the floor 2.31"),
        "{stdout}"
    );
    assert_clean_failure(
        &out,
        1,
        &["1 file(s) above GLIBC_2.31", "gcc-cross-2.34.elf"],
    );

    let out = xtask(&["glibc-floor", "--max", "2.35", &old]);
    assert!(out.status.success(), "{}", stderr(&out));

    let out = xtask(&["glibc-floor", "--max", "two", &old]);
    assert_clean_failure(&out, 2, &["--max two"]);
}
