//! Replays the committed corpus and every regression input through the fuzz
//! properties with plain `cargo test` (no libFuzzer, stable toolchain).
//!
//! `corpus/<target>/` is the seed corpus cargo-fuzz starts from;
//! `regressions/<target>/` holds inputs that once failed (named after what
//! they found) and must keep passing.

use std::path::Path;

/// `peer_messages` counts the process's fds: the replays run one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn replay(target: &str, property: fn(&[u8])) {
    let _lock = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut count = 0;
    for dir in ["corpus", "regressions"] {
        let dir = root.join(dir).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let result = std::panic::catch_unwind(|| property(&data));
            assert!(result.is_ok(), "{} fails", path.display());
            count += 1;
        }
    }
    assert!(count > 0, "no corpus for {target}");
}

#[test]
fn descriptors_corpus() {
    replay("descriptors", tegra_interop_fuzz::descriptors);
}

#[test]
fn attr_lowering_corpus() {
    replay("attr_lowering", tegra_interop_fuzz::attr_lowering);
}

#[test]
fn fence_trackers_corpus() {
    replay("fence_trackers", tegra_interop_fuzz::fence_trackers);
}

#[test]
fn ipc_frames_corpus() {
    replay("ipc_frames", tegra_interop_fuzz::ipc_frames);
}

#[test]
fn peer_messages_corpus() {
    replay("peer_messages", tegra_interop_fuzz::peer_messages);
}
