//! Helpers shared by the pipeline's integration tests.

/// Whether `--processes 2` can start its camera process here: it starts its
/// own executable, which under the cross test runner (qemu-user, no
/// binfmt_misc entry, as in most containers) the kernel cannot run. The
/// binary has no runner hook (by design), so those runs are skipped there,
/// saying so; the `--role` tests, which start both sides through the
/// runner, still run.
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
