//! Splitting a connection's byte stream into JSON values.
//!
//! SPDK's server and its `rpc.py` client frame nothing: a connection
//! carries JSON values one after the other (`rpc.py` sends pretty-printed
//! objects joined by newlines; any whitespace, or none, may separate
//! them). [`FrameBuffer`] collects the bytes received so far and hands out
//! each complete value; a value that is not valid JSON, or a request that
//! grows past the stated limit, is an error after which the connection
//! cannot be resynchronised (the server answers -32700 and closes it).

use std::collections::HashSet;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::error::RpcError;

/// One step of the path to a JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSeg {
    /// An object's member.
    Key(String),
    /// An array's element.
    Index(usize),
}

/// A key given twice in one object of a received value (SPDK's decoders
/// refuse it; a [`Value`] keeps only the last).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuplicateKey {
    /// The path to the object, from the top.
    pub path: Vec<PathSeg>,
    /// The key.
    pub key: String,
}

/// The first key given twice in one object of `json` (a whole, valid
/// JSON value), if any.
pub fn duplicate_key(json: &[u8]) -> Option<DuplicateKey> {
    let mut path = Vec::new();
    let mut found = None;
    let mut de = serde_json::Deserializer::from_slice(json);
    let _ = Scan {
        path: &mut path,
        found: &mut found,
    }
    .deserialize(&mut de);
    found
}

/// Walks a value, noting the first repeated key.
struct Scan<'a> {
    path: &'a mut Vec<PathSeg>,
    found: &'a mut Option<DuplicateKey>,
}

impl<'de> DeserializeSeed<'de> for Scan<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Scan<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        for i in 0.. {
            self.path.push(PathSeg::Index(i));
            let more = seq.next_element_seed(Scan {
                path: &mut *self.path,
                found: &mut *self.found,
            })?;
            self.path.pop();
            if more.is_none() {
                break;
            }
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if self.found.is_none() && !seen.insert(key.clone()) {
                *self.found = Some(DuplicateKey {
                    path: self.path.clone(),
                    key: key.clone(),
                });
            }
            self.path.push(PathSeg::Key(key));
            map.next_value_seed(Scan {
                path: &mut *self.path,
                found: &mut *self.found,
            })?;
            self.path.pop();
        }
        Ok(())
    }
}

/// The default largest request, in bytes (1 MiB; SPDK's own receive
/// buffer is 256 KiB, and `load_config` carries a whole configuration).
pub const DEFAULT_MAX_REQUEST: usize = 1 << 20;

/// Bytes received on one connection, not yet parsed.
#[derive(Debug)]
pub struct FrameBuffer {
    buf: Vec<u8>,
    limit: usize,
    /// A `}` or `]` arrived since the last incomplete parse: only such a
    /// byte can complete an object or array, so parsing again before one
    /// arrives would be wasted work (and quadratic for a large request).
    may_be_complete: bool,
    /// Bytes held at the last incomplete parse (0: none since the last
    /// value). Without a closing bracket the bytes are parsed again only
    /// once they doubled, so that bytes that are not JSON are seen
    /// (answered -32700) without waiting for a `}` that may never come,
    /// at a cost linear in the request's size.
    parsed_len: usize,
    /// The first key repeated in the value last handed out.
    duplicate: Option<DuplicateKey>,
}

impl FrameBuffer {
    /// An empty buffer refusing requests larger than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            buf: Vec::new(),
            limit,
            may_be_complete: false,
            parsed_len: 0,
            duplicate: None,
        }
    }

    /// The largest request accepted, in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held (whitespace included).
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing but whitespace is held: no request is under way.
    pub fn is_idle(&self) -> bool {
        self.buf.iter().all(u8::is_ascii_whitespace)
    }

    /// Whether more bytes may be read: false once the buffer holds more
    /// than the limit (the next [`FrameBuffer::next_value`] reports it).
    pub fn wants_more(&self) -> bool {
        self.buf.len() <= self.limit
    }

    /// The first key given twice in one object of the value
    /// [`FrameBuffer::next_value`] last handed out (taken: asked once).
    pub fn take_duplicate(&mut self) -> Option<DuplicateKey> {
        self.duplicate.take()
    }

    /// Appends received bytes.
    pub fn push(&mut self, data: &[u8]) {
        if data.iter().any(|b| matches!(b, b'}' | b']')) {
            self.may_be_complete = true;
        }
        self.buf.extend_from_slice(data);
    }

    /// The next complete value, `None` when more bytes are needed.
    ///
    /// # Errors
    ///
    /// -32700 when the bytes are not JSON or the request is larger than
    /// the limit; the buffer is then of no further use.
    pub fn next_value(&mut self) -> Option<Result<Value, RpcError>> {
        let start = self
            .buf
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .unwrap_or(self.buf.len());
        if start > 0 {
            self.buf.drain(..start);
        }
        if self.buf.is_empty() {
            self.may_be_complete = false;
            self.parsed_len = 0;
            return None;
        }
        let container = matches!(self.buf[0], b'{' | b'[');
        let grown = self.parsed_len == 0 || self.buf.len() >= self.parsed_len.saturating_mul(2);
        if container && !self.may_be_complete && !grown {
            return self.too_large();
        }
        let mut stream = serde_json::Deserializer::from_slice(&self.buf).into_iter::<Value>();
        match stream.next() {
            Some(Ok(v)) => {
                let used = stream.byte_offset();
                if used > self.limit {
                    return Some(Err(self.limit_error()));
                }
                self.duplicate = self.buf.get(..used).and_then(duplicate_key);
                self.buf.drain(..used);
                self.parsed_len = 0;
                Some(Ok(v))
            }
            Some(Err(e)) if e.is_eof() => {
                self.may_be_complete = false;
                self.parsed_len = self.buf.len();
                self.too_large()
            }
            Some(Err(e)) => Some(Err(RpcError::parse_error(e.to_string()))),
            None => None,
        }
    }

    fn too_large(&self) -> Option<Result<Value, RpcError>> {
        (self.buf.len() > self.limit).then(|| Err(self.limit_error()))
    }

    fn limit_error(&self) -> RpcError {
        RpcError::parse_error(format!(
            "request larger than the limit of {} bytes",
            self.limit
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::PARSE_ERROR;

    fn all(fb: &mut FrameBuffer) -> Vec<Value> {
        let mut out = Vec::new();
        while let Some(v) = fb.next_value() {
            out.push(v.expect("valid"));
        }
        out
    }

    #[test]
    fn values_split_across_reads_and_packed_together() {
        let text = b"{\n  \"a\": 1\n}\n{\"b\": [2, 3]}{\"c\":{}}  ";
        for cut in 0..text.len() {
            let mut fb = FrameBuffer::new(1024);
            fb.push(&text[..cut]);
            let mut got = all(&mut fb);
            fb.push(&text[cut..]);
            got.extend(all(&mut fb));
            assert_eq!(got.len(), 3, "cut at {cut}");
            assert_eq!(got[1]["b"][1], 3);
            assert!(fb.is_idle());
        }
    }

    #[test]
    fn garbage_is_a_parse_error() {
        let mut fb = FrameBuffer::new(1024);
        fb.push(b"{\"a\": nope}");
        let e = fb.next_value().expect("an answer").expect_err("not JSON");
        assert_eq!(e.code, PARSE_ERROR);
    }

    #[test]
    fn garbage_is_seen_before_any_closing_bracket() {
        let mut fb = FrameBuffer::new(1 << 20);
        fb.push(b"{nope\n");
        let e = fb.next_value().expect("an answer").expect_err("not JSON");
        assert_eq!(e.code, PARSE_ERROR);
        // Also when the garbage follows a valid start sent byte by byte.
        let mut fb = FrameBuffer::new(1 << 20);
        let text = b"{\"method\": \"m\", \"params\": [1, 2, oops";
        let mut answer = None;
        for b in text.iter().chain([b' '; 64].iter()) {
            fb.push(&[*b]);
            if let Some(r) = fb.next_value() {
                answer = Some(r);
                break;
            }
        }
        let e = answer.expect("an answer").expect_err("not JSON");
        assert_eq!(e.code, PARSE_ERROR);
    }

    #[test]
    fn repeated_keys_are_found_where_they_are() {
        let mut fb = FrameBuffer::new(1024);
        fb.push(br#"{"a": 1, "b": {"c": 1}, "d": [{"c": 1}, {"e": 1, "f": [], "e": 2}]} {"a": 1}"#);
        fb.next_value().expect("a value").expect("valid");
        let d = fb.take_duplicate().expect("a repeated key");
        assert_eq!(d.key, "e");
        let path = [PathSeg::Key("d".into()), PathSeg::Index(1)];
        assert_eq!(d.path, path);
        assert_eq!(fb.take_duplicate(), None);
        fb.next_value().expect("a value").expect("valid");
        assert_eq!(fb.take_duplicate(), None);
    }

    #[test]
    fn a_request_past_the_limit_is_refused() {
        let mut fb = FrameBuffer::new(64);
        fb.push(b"{\"method\": \"");
        fb.push(&[b'x'; 100]);
        assert!(!fb.wants_more());
        let e = fb.next_value().expect("an answer").expect_err("too big");
        assert_eq!(e.code, PARSE_ERROR);
        assert!(e.data.unwrap_or_default().contains("64 bytes"));
        // Complete but too large: refused too.
        let mut fb = FrameBuffer::new(16);
        fb.push(b"{\"method\": \"0123456789abcdef\"}");
        assert!(fb.next_value().expect("an answer").is_err());
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let mut fb = FrameBuffer::new(1 << 20);
        fb.push(&[b'['; 100_000]);
        fb.push(&[b']'; 100_000]);
        assert!(fb.next_value().expect("an answer").is_err());
    }
}
