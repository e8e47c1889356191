//! A blocking client for the JSON-RPC socket (what `pollux-rpc` and the
//! tests use): one request at a time, answers read as a stream of JSON
//! values, as SPDK's `rpc.py` reads them.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::RpcError;
use crate::framing::FrameBuffer;
use crate::protocol::{ProtocolError, Request, Response};

/// The largest answer a client reads (`save_config` of a big target).
const MAX_RESPONSE: usize = 64 << 20;

/// What went wrong with a call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No server at the path.
    #[error("cannot connect to {path}: {source} (is pollux-tgt running with -r {path}?)")]
    Connect {
        /// The socket path.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Reading or writing the socket failed.
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    /// The server closed the connection before answering.
    #[error("the server closed the connection without an answer")]
    Closed,
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The answer is JSON but not a JSON-RPC response.
    #[error("bad answer: {0}")]
    Protocol(#[from] ProtocolError),
    /// The answer is not JSON (or too large to frame).
    #[error("bad answer: {0}")]
    Framing(RpcError),
    /// The server answered with an error.
    #[error("{0}")]
    Rpc(RpcError),
}

/// A connection to a server.
#[derive(Debug)]
pub struct RpcClient {
    stream: UnixStream,
    frames: FrameBuffer,
    next_id: u64,
    timeout: Duration,
}

impl RpcClient {
    /// Connects to the socket at `path`; each answer must come within `timeout`.
    ///
    /// # Errors
    ///
    /// [`ClientError::Connect`].
    pub fn connect(path: &Path, timeout: Duration) -> Result<RpcClient, ClientError> {
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.display().to_string(),
            source,
        })?;
        Ok(RpcClient {
            stream,
            frames: FrameBuffer::new(MAX_RESPONSE),
            next_id: 1,
            timeout,
        })
    }

    /// Calls `method` and returns its result.
    ///
    /// # Errors
    ///
    /// [`ClientError::Rpc`] with the server's error, or a transport error.
    pub fn call(&mut self, method: &str, params: Option<Value>) -> Result<Value, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let req = Request::new(method, params, id);
        self.send_raw(req.to_json().to_string().as_bytes())?;
        loop {
            let v = self.read_value()?;
            let resp = Response::from_value(v)?;
            if resp.id.as_u64() == Some(id) || resp.id.is_null() {
                return resp.outcome.map_err(ClientError::Rpc);
            }
        }
    }

    /// Sends bytes as they are (tests send malformed requests with it).
    ///
    /// # Errors
    ///
    /// [`ClientError::Io`].
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Reads the next JSON value the server sends.
    ///
    /// # Errors
    ///
    /// [`ClientError::Closed`], [`ClientError::Timeout`],
    /// [`ClientError::Framing`] for bytes that are not JSON.
    pub fn read_value(&mut self) -> Result<Value, ClientError> {
        let deadline = Instant::now() + self.timeout;
        let mut buf = [0u8; 16 << 10];
        loop {
            if let Some(v) = self.frames.next_value() {
                return v.map_err(ClientError::Framing);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Timeout(self.timeout));
            }
            self.stream.set_read_timeout(Some(left))?;
            match self.stream.read(&mut buf) {
                Ok(0) => return Err(ClientError::Closed),
                Ok(n) => self.frames.push(buf.get(..n).unwrap_or_default()),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                    return Err(ClientError::Closed)
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Whether the server has closed the connection (reads until EOF or
    /// `timeout`; data that arrives is discarded).
    ///
    /// # Errors
    ///
    /// A read error other than a reset.
    pub fn closed_within(&mut self, timeout: Duration) -> Result<bool, ClientError> {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            self.stream.set_read_timeout(Some(left))?;
            match self.stream.read(&mut buf) {
                Ok(0) => return Ok(true),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(true),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    /// A client connected to a one-shot server that reads the request and
    /// answers `answer` (then closes).
    fn answered(name: &str, answer: &'static [u8]) -> (RpcClient, std::thread::JoinHandle<()>) {
        let path =
            std::env::temp_dir().join(format!("pollux-client-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).unwrap();
            s.write_all(answer).unwrap();
        });
        let c = RpcClient::connect(&path, Duration::from_secs(5)).unwrap();
        let _ = std::fs::remove_file(&path);
        (c, server)
    }

    #[test]
    fn an_answer_that_is_not_json_is_a_framing_error() {
        let (mut c, s) = answered("garbage", b"}{ not json\n");
        let e = c.call("spdk_get_version", None).unwrap_err();
        assert!(matches!(e, ClientError::Framing(_)), "{e:?}");
        s.join().unwrap();
    }

    #[test]
    fn json_that_is_not_a_response_is_a_protocol_error() {
        let (mut c, s) = answered("no-outcome", br#"{"jsonrpc":"2.0","id":1}"#);
        let e = c.call("spdk_get_version", None).unwrap_err();
        assert!(
            matches!(e, ClientError::Protocol(ProtocolError::NoOutcome)),
            "{e:?}"
        );
        s.join().unwrap();
        let (mut c, s) = answered("array", b"[1, 2]");
        let e = c.call("spdk_get_version", None).unwrap_err();
        assert!(
            matches!(e, ClientError::Protocol(ProtocolError::NotAnObject(_))),
            "{e:?}"
        );
        s.join().unwrap();
    }

    #[test]
    fn a_server_that_closes_without_answering_is_closed() {
        let (mut c, s) = answered("closed", b"");
        let e = c.call("spdk_get_version", None).unwrap_err();
        assert!(matches!(e, ClientError::Closed), "{e:?}");
        s.join().unwrap();
    }
}
