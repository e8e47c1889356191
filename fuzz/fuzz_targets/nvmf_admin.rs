//! cargo-fuzz target: the NVMe admin and I/O command sets on a connected controller.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pollux_nvmf::fuzz::fuzz_admin(data));
