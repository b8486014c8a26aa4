//! Helpers shared by the pipeline's integration tests.

/// Whether `--processes 2` can start its camera process here: it starts its
/// own executable, which under the cross test runner (qemu-user, no
/// binfmt_misc entry, as in most containers) the kernel cannot run. The
/// binary has no runner hook (by design), so those runs are skipped there,
/// saying so; the `--role` tests, which start both sides through the
/// runner, still run.
#[allow(dead_code)] // not every test binary that shares this module starts a camera process
pub fn can_start_a_camera_process() -> bool {
    let emulated = std::env::var("TEGRA_INTEROP_TEST_RUNNER").is_ok_and(|r| !r.trim().is_empty());
    let binfmt = std::fs::read_dir("/proc/sys/fs/binfmt_misc")
        .map(|d| {
            d.filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().starts_with("qemu-"))
        })
        .unwrap_or(false);
    if emulated && !binfmt {
        eprintln!("skipped: an emulated binary cannot start itself without binfmt_misc");
        return false;
    }
    true
}

/// A command that starts `exe`; under a cross test runner without binfmt
/// (`TEGRA_INTEROP_TEST_RUNNER`, e.g. `qemu-aarch64`, set by
/// targets/aarch64-unknown-linux-gnu.toml) the child goes through it too.
#[allow(dead_code)] // not every test binary that shares this module starts children this way
pub fn child_command(exe: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
    use std::process::Command;
    match std::env::var("TEGRA_INTEROP_TEST_RUNNER") {
        Ok(runner) if !runner.trim().is_empty() => {
            let mut words = runner.split_whitespace();
            let mut command = Command::new(words.next().unwrap_or_default());
            command.args(words).arg(exe);
            command
        }
        _ => Command::new(exe),
    }
}
