//! Parameter data of the non-medium commands, one command per file.

pub mod capacity;
pub mod inquiry;
pub mod mode_sense;
pub mod opcodes;
pub mod report_luns;
pub mod unmap;
