//! Pollux iSCSI over iSER (RFC 7143 + RFC 7145).
//!
//! - [`pdu`]: every BHS the protocol uses, AHS, data-segment padding, the
//!   28-byte iSER header and the iSER CM private data; strict
//!   `&[u8] -> Result<Pdu, PduError>` parsing and fixed-size encoders.
//! - [`session`]: key=value negotiation with the result function of each
//!   key (iSER keys included), the target login state machine
//!   ([`session::TargetLogin`]) and the CmdSN window.
//! - [`scsi`]: CDB decoding, fixed-format sense, the SBC/SPC subset a Linux
//!   initiator needs ([`scsi::Disk`]) and T10 PI (the PROTECT field as a bdev
//!   `PiAction`; the bdev layer generates and checks).
//! - [`target`]: the shared configuration ([`target::IscsiTarget`]: nodes,
//!   LUNs, ACLs, portal groups) and the transport-independent connection
//!   core ([`target::Connection`]) that a transport drives through
//!   [`target::ConnOps`], and the iSER verbs transport ([`target::iser`]).
//! - [`initiator`]: the iSER initiator (login, discovery, per-task memory
//!   registration, T10 PI with signature offload or in software).
//! - [`fuzz`]: never-panicking fuzz entry points.
#![forbid(unsafe_code)]

pub mod fuzz;
pub mod initiator;
pub mod pdu;
pub mod scsi;
pub mod session;
pub mod target;
