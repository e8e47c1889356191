//! cargo-fuzz target: iSCSI key=value text and the login state machine.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pollux_iser::fuzz::fuzz_login_text(data));
