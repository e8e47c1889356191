//! cargo-fuzz target: NVMe/TCP PDU parsers and the bytes as a PDU stream to a live TCP target.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pollux_nvmf::fuzz_tcp::fuzz_tcp_pdu(data));
