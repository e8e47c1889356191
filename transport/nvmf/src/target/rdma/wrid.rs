//! Typed work-request tokens, shared with the other verbs transports
//! (`pollux_verbs::token`): `(kind, connection slot, connection generation,
//! index)` packed into a `wr_id`. Never a pointer; a stale or unknown token
//! names nothing and is ignored.

pub(crate) use pollux_verbs::token::{WrKind, WrToken as Token};
