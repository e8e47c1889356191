//! The iSCSI target: shared configuration ([`IscsiTarget`]), the
//! transport-independent connection core ([`Connection`] driven through
//! [`ConnOps`]) and the iSER transport ([`iser`]).

pub mod config;
pub mod conn;
mod core_ctx;
pub mod iser;
pub mod ops;
mod sessions;

pub use config::{ConfigError, IscsiTarget, PortalGroup, TargetNode, TargetOptions};
pub use conn::{ConnParams, ConnStats, Connection, NopPing};
pub use core_ctx::CoreCtx;
pub use ops::{ConnOps, Transfer};
pub use sessions::SessionInfo;
