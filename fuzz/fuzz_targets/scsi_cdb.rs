//! cargo-fuzz target: SCSI CDB execution on a PI-formatted disk model.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pollux_iser::fuzz::fuzz_cdb(data));
