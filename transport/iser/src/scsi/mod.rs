//! SCSI block commands (SBC/SPC subset) executed against bdevs: CDB
//! decoding, sense data, parameter data and the [`Disk`] that
//! answers or plans each command.

pub mod cdb;
pub mod commands;
pub mod disk;
pub mod pi;
pub mod reservation;
pub mod sense;

pub use cdb::{Cdb, PiTags, Rw};
pub use disk::{Action, BlockIo, BlockOp, Disk, DiskInfo, PiMode};
pub use sense::Sense;
