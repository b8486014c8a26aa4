//! libFuzzer entry point; the property is `tegra_interop_fuzz::ipc_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tegra_interop_fuzz::ipc_frames(data));
