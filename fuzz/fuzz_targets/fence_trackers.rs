//! libFuzzer entry point; the property is `tegra_interop_fuzz::fence_trackers`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tegra_interop_fuzz::fence_trackers(data));
