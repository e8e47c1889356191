//! JSON-RPC error objects: the protocol's codes and SPDK's negative errno
//! codes, with the messages SPDK sends for them.
//!
//! SPDK answers a failed method with `{"code": -errno, "message":
//! strerror(errno)}` (`-17` `"File exists"`, `-19` `"No such device"`, ...)
//! and protocol failures with the JSON-RPC 2.0 codes. Pollux sends the same
//! code and message, and puts what exactly went wrong in the optional
//! `data` member (a string), which SPDK's `rpc.py` prints with the rest of
//! the error object.

use serde_json::{json, Value};

/// JSON-RPC 2.0: the request is not valid JSON (the connection is closed
/// after this error: a byte stream has no point to resynchronise at).
pub const PARSE_ERROR: i32 = -32700;
/// JSON-RPC 2.0: the JSON is not a valid request object.
pub const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC 2.0: no such method.
pub const METHOD_NOT_FOUND: i32 = -32601;
/// JSON-RPC 2.0: the method's parameters are missing, unknown or of the wrong type.
pub const INVALID_PARAMS: i32 = -32602;
/// JSON-RPC 2.0: the server failed (a core did not answer, for instance).
pub const INTERNAL_ERROR: i32 = -32603;
/// SPDK: the method exists but may not be called in the current state.
pub const INVALID_STATE: i32 = -1;

/// The errno values the methods return (Linux numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Errno {
    /// `ENOENT` (2).
    NoEntry,
    /// `EIO` (5).
    Io,
    /// `ENOMEM` (12).
    NoMemory,
    /// `EBUSY` (16).
    Busy,
    /// `EEXIST` (17).
    Exists,
    /// `ENODEV` (19).
    NoDevice,
    /// `EINVAL` (22).
    Invalid,
    /// `EOPNOTSUPP` (95).
    NotSupported,
    /// `ETIMEDOUT` (110).
    TimedOut,
    /// Any other errno, by number.
    Other(i32),
}

impl Errno {
    /// The positive errno number.
    pub fn number(self) -> i32 {
        match self {
            Errno::NoEntry => 2,
            Errno::Io => 5,
            Errno::NoMemory => 12,
            Errno::Busy => 16,
            Errno::Exists => 17,
            Errno::NoDevice => 19,
            Errno::Invalid => 22,
            Errno::NotSupported => 95,
            Errno::TimedOut => 110,
            Errno::Other(n) => n,
        }
    }

    /// The C library's text for it (what SPDK's `spdk_strerror` gives).
    pub fn message(self) -> String {
        let text = std::io::Error::from_raw_os_error(self.number()).to_string();
        // std appends " (os error N)" to strerror's text.
        match text.rfind(" (os error ") {
            Some(i) => text[..i].to_owned(),
            None => text,
        }
    }
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {message}{}", data.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
pub struct RpcError {
    /// The code (negative).
    pub code: i32,
    /// SPDK's message for the code.
    pub message: String,
    /// What exactly went wrong, when there is more to say.
    pub data: Option<String>,
}

impl RpcError {
    /// An error with this code and message and no detail.
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// The same error with `data` set.
    pub fn with_data(mut self, data: impl Into<String>) -> Self {
        self.data = Some(data.into());
        self
    }

    /// -32700 "Parse error".
    pub fn parse_error(detail: impl Into<String>) -> Self {
        Self::new(PARSE_ERROR, "Parse error").with_data(detail)
    }

    /// -32600 "Invalid request".
    pub fn invalid_request(detail: impl Into<String>) -> Self {
        Self::new(INVALID_REQUEST, "Invalid request").with_data(detail)
    }

    /// -32601 "Method not found", naming it.
    pub fn method_not_found(method: &str) -> Self {
        Self::new(METHOD_NOT_FOUND, "Method not found").with_data(format!("no method `{method}`"))
    }

    /// -32602 "Invalid parameters".
    pub fn invalid_params(detail: impl Into<String>) -> Self {
        Self::new(INVALID_PARAMS, "Invalid parameters").with_data(detail)
    }

    /// -32603 "Internal error".
    pub fn internal(detail: impl Into<String>) -> Self {
        Self::new(INTERNAL_ERROR, "Internal error").with_data(detail)
    }

    /// `-errno` with the C library's message and `detail`.
    pub fn errno(e: Errno, detail: impl Into<String>) -> Self {
        Self::new(-e.number(), e.message()).with_data(detail)
    }

    /// The error object as it goes on the wire.
    pub fn to_json(&self) -> Value {
        let mut v = json!({ "code": self.code, "message": self.message });
        if let Some(d) = &self.data {
            v["data"] = Value::String(d.clone());
        }
        v
    }
}

impl From<pollux_bdev::BdevError> for RpcError {
    fn from(e: pollux_bdev::BdevError) -> Self {
        use pollux_bdev::BdevError as B;
        let errno = match &e {
            B::NotFound(_) => Errno::NoDevice,
            B::AlreadyExists(_) => Errno::Exists,
            B::InUse { .. } => Errno::Busy,
            B::Unsupported(_) => Errno::NotSupported,
            B::Memory(_) => Errno::NoMemory,
            B::Os { source, .. } => source.raw_os_error().map_or(Errno::Io, Errno::Other),
            B::Engine(_) => Errno::Io,
            _ => Errno::Invalid,
        };
        let detail = match &e {
            B::InUse { name, opens } => format!(
                "bdev `{name}` is in use ({opens} open descriptor(s): a namespace, LUN or job); remove its users first"
            ),
            other => other.to_string(),
        };
        RpcError::errno(errno, detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_messages_are_the_c_librarys() {
        assert_eq!(Errno::Exists.message(), "File exists");
        assert_eq!(Errno::NoDevice.message(), "No such device");
        assert_eq!(Errno::Busy.message(), "Device or resource busy");
        assert_eq!(Errno::Invalid.message(), "Invalid argument");
        let e = RpcError::errno(Errno::Exists, "bdev `a`");
        assert_eq!(e.code, -17);
        assert_eq!(
            e.to_json(),
            json!({"code": -17, "message": "File exists", "data": "bdev `a`"})
        );
        assert_eq!(
            RpcError::new(-1, "x").to_json(),
            json!({"code": -1, "message": "x"})
        );
    }
}
