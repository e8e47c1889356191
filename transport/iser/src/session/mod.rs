//! Session-level protocol: operational parameters, the login state
//! machine and sequence numbers.

pub mod login;
pub mod params;
pub mod seq;

pub use login::{
    LoginEnv, LoginOutcome, LoginStatus, LoginStep, LoginTargetInfo, SessionType, TargetLogin,
};
pub use params::{KeyError, SessionParams, TargetLimits};
pub use seq::{sn_le, sn_lt, CmdSnCheck, CmdWindow};
