//! libFuzzer entry point; the property is `tegra_interop_fuzz::descriptors`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tegra_interop_fuzz::descriptors(data));
