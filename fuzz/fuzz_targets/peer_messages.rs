//! libFuzzer entry point; the property is `tegra_interop_fuzz::peer_messages`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tegra_interop_fuzz::peer_messages(data));
