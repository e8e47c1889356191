//! cargo-fuzz target: NVMe-oF capsule parsers and one capsule on a live loopback queue.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pollux_nvmf::fuzz::fuzz_capsule(data));
