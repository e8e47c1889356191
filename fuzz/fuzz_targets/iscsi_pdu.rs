//! cargo-fuzz target: iSER header and iSCSI PDU parsing (with round trips).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pollux_iser::fuzz::fuzz_pdu(data));
