//! JSON-RPC 2.0 requests and responses, checked as SPDK's server checks them.
//!
//! A request is an object with `method` (a string), optionally `jsonrpc`
//! (when present it must be `"2.0"`), `id` (a string, a number or null) and
//! `params` (an object, an array or null; null means none). Anything else
//! is answered with -32600. A request without an id, or with a null id, is
//! a notification: its result is not sent, but an error is (with `"id":
//! null`), as SPDK does. An array is a batch: each element is handled as a
//! request and the answers go back as one array, in order, notifications'
//! results left out (nothing at all when every element was a notification
//! that succeeded); an empty array is -32600.

use serde_json::{Map, Value};

use crate::error::RpcError;

/// One request, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The method name.
    pub method: String,
    /// The parameters (`None`: absent or null).
    pub params: Option<Value>,
    /// The id (`None`: absent).
    pub id: Option<Value>,
}

impl Request {
    /// A request with an id, as clients build them.
    pub fn new(method: impl Into<String>, params: Option<Value>, id: u64) -> Self {
        Self {
            method: method.into(),
            params,
            id: Some(Value::from(id)),
        }
    }

    /// Whether the result is not sent back (no id, or a null id).
    pub fn is_notification(&self) -> bool {
        matches!(self.id, None | Some(Value::Null))
    }

    /// Checks a received value as a request.
    ///
    /// # Errors
    ///
    /// -32600 with the id when one could be read (else null): the value is
    /// not an object, `jsonrpc` is not `"2.0"`, `method` is missing or not
    /// a string, `id` or `params` has the wrong type, or a member is unknown.
    pub fn from_value(v: Value) -> Result<Request, (Option<Value>, RpcError)> {
        let Value::Object(mut obj) = v else {
            return Err((
                None,
                RpcError::invalid_request("a request must be a JSON object"),
            ));
        };
        let id = match obj.remove("id") {
            None => None,
            Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => Some(id),
            Some(_) => {
                return Err((
                    None,
                    RpcError::invalid_request("`id` must be a string, a number or null"),
                ))
            }
        };
        let fail =
            |id: &Option<Value>, msg: &str| Err((id.clone(), RpcError::invalid_request(msg)));
        match obj.remove("jsonrpc") {
            None => {}
            Some(Value::String(s)) if s == "2.0" => {}
            Some(_) => return fail(&id, "`jsonrpc` must be \"2.0\""),
        }
        let method = match obj.remove("method") {
            Some(Value::String(m)) => m,
            Some(_) => return fail(&id, "`method` must be a string"),
            None => return fail(&id, "`method` is missing"),
        };
        let params = match obj.remove("params") {
            None | Some(Value::Null) => None,
            Some(p @ (Value::Object(_) | Value::Array(_))) => Some(p),
            Some(_) => return fail(&id, "`params` must be an object, an array or null"),
        };
        if let Some(k) = obj.keys().next() {
            let msg = format!("unknown member `{k}`");
            return fail(&id, &msg);
        }
        Ok(Request { method, params, id })
    }

    /// The request as it goes on the wire.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("jsonrpc".into(), "2.0".into());
        m.insert("method".into(), Value::String(self.method.clone()));
        if let Some(id) = &self.id {
            m.insert("id".into(), id.clone());
        }
        if let Some(p) = &self.params {
            m.insert("params".into(), p.clone());
        }
        Value::Object(m)
    }
}

/// The response to a request with `id` (`None` or null for a
/// notification): `None` when nothing is to be sent (a notification that
/// succeeded), else the response object's text, members in SPDK's order
/// (`jsonrpc`, `id`, then `result` or `error`).
pub fn response(id: Option<&Value>, outcome: Result<Value, RpcError>) -> Option<String> {
    let notification = matches!(id, None | Some(Value::Null));
    let id = id.cloned().unwrap_or(Value::Null);
    match outcome {
        Ok(_) if notification => None,
        Ok(result) => Some(format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{result}}}"
        )),
        Err(e) => Some(format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{}}}",
            e.to_json()
        )),
    }
}

/// Why a value is not a response ([`Response::from_value`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    /// The value is not a JSON object.
    #[error("a response must be an object, got {0}")]
    NotAnObject(Value),
    /// The object has neither `result` nor an object `error`.
    #[error("a response without `result` or `error`")]
    NoOutcome,
    /// The `error` object has no `code` that fits an `i32`.
    #[error("an error without an integer `code`")]
    NoCode,
}

/// A response as a client reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The id it answers.
    pub id: Value,
    /// The result, or the error.
    pub outcome: Result<Value, RpcError>,
}

impl Response {
    /// Reads a response object.
    ///
    /// # Errors
    ///
    /// [`ProtocolError`] saying what the object lacks.
    pub fn from_value(v: Value) -> Result<Response, ProtocolError> {
        let Value::Object(mut obj) = v else {
            return Err(ProtocolError::NotAnObject(v));
        };
        let id = obj.remove("id").unwrap_or(Value::Null);
        if let Some(r) = obj.remove("result") {
            return Ok(Response { id, outcome: Ok(r) });
        }
        let Some(Value::Object(mut e)) = obj.remove("error") else {
            return Err(ProtocolError::NoOutcome);
        };
        let code = e
            .get("code")
            .and_then(Value::as_i64)
            .and_then(|c| i32::try_from(c).ok())
            .ok_or(ProtocolError::NoCode)?;
        let message = match e.remove("message") {
            Some(Value::String(s)) => s,
            _ => String::new(),
        };
        let data = match e.remove("data") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => Some(other.to_string()),
        };
        Ok(Response {
            id,
            outcome: Err(RpcError {
                code,
                message,
                data,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::INVALID_REQUEST;
    use serde_json::json;

    #[test]
    fn accepts_what_spdk_accepts() {
        let r = Request::from_value(json!({"jsonrpc": "2.0", "method": "m", "id": 1})).unwrap();
        assert_eq!((r.method.as_str(), r.is_notification()), ("m", false));
        assert_eq!(r.params, None);
        let r = Request::from_value(json!({"method": "m", "params": null, "id": "x"})).unwrap();
        assert_eq!(r.id, Some(json!("x")));
        let r = Request::from_value(json!({"method": "m", "params": [1]})).unwrap();
        assert!(r.is_notification());
        assert!(Request::from_value(json!({"method": "m", "id": null}))
            .unwrap()
            .is_notification());
    }

    #[test]
    fn refuses_malformed_requests_with_invalid_request() {
        for (v, id) in [
            (json!([1]), None),
            (json!("m"), None),
            (json!({"id": 3}), Some(json!(3))),
            (json!({"method": 5, "id": 4}), Some(json!(4))),
            (json!({"method": "m", "jsonrpc": "1.0"}), None),
            (json!({"method": "m", "id": {}}), None),
            (json!({"method": "m", "params": 3, "id": 1}), Some(json!(1))),
            (json!({"method": "m", "extra": 1}), None),
        ] {
            let (got_id, e) = Request::from_value(v.clone()).expect_err(&v.to_string());
            assert_eq!(e.code, INVALID_REQUEST, "{v}");
            assert_eq!(got_id, id, "{v}");
        }
    }

    #[test]
    fn responses_round_trip_and_notifications_are_silent() {
        let text = response(Some(&json!(7)), Ok(json!({"a": 1}))).unwrap();
        assert!(text.starts_with("{\"jsonrpc\":\"2.0\",\"id\":7,\"result\""));
        let r = Response::from_value(serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!((r.id, r.outcome), (json!(7), Ok(json!({"a": 1}))));
        assert_eq!(response(None, Ok(json!(true))), None);
        assert_eq!(response(Some(&Value::Null), Ok(json!(true))), None);
        let err = RpcError::invalid_params("x");
        let text = response(None, Err(err.clone())).unwrap();
        let r = Response::from_value(serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!((r.id, r.outcome), (Value::Null, Err(err)));
    }
}
