//! The method registry and dispatcher: one table of methods, filled by the
//! framework and by one provider module per subsystem (`bdev`, `nvmf`,
//! `iscsi`).
//!
//! A provider implements [`Subsystem`]: its name and dependencies (what
//! `framework_get_subsystems` lists, in registration order), its methods,
//! and its part of the configuration (`framework_get_config`,
//! `save_config`: the calls that rebuild what exists now). Every call,
//! from a client or from a configuration file, goes through
//! [`RpcService::call`], so a file and a client do the same thing.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::config::ConfigEntry;
use crate::cores::CoreBus;
use crate::error::{RpcError, INVALID_STATE};
use crate::framing::{DuplicateKey, PathSeg};
use crate::protocol::{response, Request};

/// The framework's state, as SPDK's: methods say in which they may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RpcState {
    /// Before the framework is initialised (global options may be set).
    Startup = 1,
    /// Initialised: objects may be created, listed and deleted.
    Runtime = 2,
}

/// Which states a method may run in (a set of [`RpcState`]s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateMask(u8);

impl StateMask {
    /// Only once initialised (most methods: SPDK's `SPDK_RPC_RUNTIME`).
    pub const RUNTIME: StateMask = StateMask(RpcState::Runtime as u8);
    /// Only before initialisation.
    pub const STARTUP: StateMask = StateMask(RpcState::Startup as u8);
    /// In any state.
    pub const ANY: StateMask = StateMask(RpcState::Startup as u8 | RpcState::Runtime as u8);

    /// Whether a method with this mask may run in `state`.
    pub fn allows(self, state: RpcState) -> bool {
        self.0 & state as u8 != 0
    }
}

/// A method's body: runs on the control thread with the service and the
/// request's parameters (`None`: absent or null).
pub type Handler = Arc<dyn Fn(&RpcService, Option<Value>) -> Result<Value, RpcError> + Send + Sync>;

/// One method.
#[derive(Clone)]
pub struct Method {
    name: &'static str,
    states: StateMask,
    handler: Handler,
}

impl std::fmt::Debug for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Method").field("name", &self.name).finish()
    }
}

impl Method {
    /// A method callable in the states of `states`.
    pub fn new(
        name: &'static str,
        states: StateMask,
        handler: impl Fn(&RpcService, Option<Value>) -> Result<Value, RpcError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name,
            states,
            handler: Arc::new(handler),
        }
    }

    /// A method callable once initialised.
    pub fn runtime(
        name: &'static str,
        handler: impl Fn(&RpcService, Option<Value>) -> Result<Value, RpcError> + Send + Sync + 'static,
    ) -> Self {
        Self::new(name, StateMask::RUNTIME, handler)
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// A subsystem's provider of methods and configuration.
pub trait Subsystem: Send + Sync + 'static {
    /// Its name in SPDK's configuration files (`"bdev"`, `"nvmf"`, `"iscsi"`).
    fn name(&self) -> &'static str;
    /// The subsystems whose objects it uses (listed before it).
    fn depends_on(&self) -> &'static [&'static str] {
        &[]
    }
    /// Its methods.
    fn methods(self: Arc<Self>) -> Vec<Method>;
    /// The calls that rebuild its objects as they are now, in order.
    ///
    /// # Errors
    ///
    /// When the state cannot be read (a core that does not answer).
    fn config(&self, svc: &RpcService) -> Result<Vec<ConfigEntry>, RpcError>;
    /// The call that undoes a successful call of one of its methods
    /// (`result` is what it returned), for configurations that load all or
    /// nothing; `None` when there is nothing to undo.
    fn undo(&self, method: &str, params: Option<&Value>, result: &Value) -> Option<ConfigEntry> {
        let _ = (method, params, result);
        None
    }
}

/// Why a method or subsystem could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// Two methods of one name.
    #[error("method `{0}` is registered twice")]
    DuplicateMethod(String),
    /// Two subsystems of one name.
    #[error("subsystem `{0}` is registered twice")]
    DuplicateSubsystem(String),
    /// A subsystem registered before one it depends on.
    #[error("subsystem `{0}` depends on `{1}`, which is not registered (register it first)")]
    MissingDependency(String, String),
}

/// The registry and dispatcher. Shared (`Arc`) by the server thread and
/// whoever loads configuration files; every method runs on the caller's
/// thread, which is never a reactor.
pub struct RpcService {
    methods: BTreeMap<&'static str, Method>,
    subsystems: Vec<Arc<dyn Subsystem>>,
    /// Method name -> index in `subsystems` of the subsystem that owns it.
    owners: BTreeMap<&'static str, usize>,
    cores: CoreBus,
    state: AtomicU8,
}

impl std::fmt::Debug for RpcService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcService")
            .field("methods", &self.methods.len())
            .field("subsystems", &self.subsystem_names())
            .finish()
    }
}

impl RpcService {
    /// A service with the framework's methods (see [`crate::framework`])
    /// and SPDK's option methods that no provider owns ([`crate::options`]),
    /// reaching the reactors through `cores`, in the runtime state.
    pub fn new(cores: CoreBus) -> Self {
        let mut svc = Self {
            methods: BTreeMap::new(),
            subsystems: Vec::new(),
            owners: BTreeMap::new(),
            cores,
            state: AtomicU8::new(RpcState::Runtime as u8),
        };
        for m in crate::framework::methods()
            .into_iter()
            .chain(crate::options::methods())
        {
            // The framework's names are distinct (checked by its tests).
            svc.methods.insert(m.name, m);
        }
        svc
    }

    /// Adds one method.
    ///
    /// # Errors
    ///
    /// [`RegistryError::DuplicateMethod`].
    pub fn add_method(&mut self, m: Method) -> Result<(), RegistryError> {
        if self.methods.contains_key(m.name) {
            return Err(RegistryError::DuplicateMethod(m.name.into()));
        }
        self.methods.insert(m.name, m);
        Ok(())
    }

    /// Adds a subsystem and its methods (all or none of them).
    ///
    /// # Errors
    ///
    /// A duplicate name, or a dependency not registered yet.
    pub fn register<S: Subsystem>(&mut self, sub: Arc<S>) -> Result<(), RegistryError> {
        let name = sub.name();
        if self.subsystem(name).is_some() {
            return Err(RegistryError::DuplicateSubsystem(name.into()));
        }
        if let Some(d) = sub
            .depends_on()
            .iter()
            .find(|d| self.subsystem(d).is_none())
        {
            return Err(RegistryError::MissingDependency(name.into(), (*d).into()));
        }
        let methods = Arc::clone(&sub).methods();
        if let Some(m) = methods.iter().find(|m| self.methods.contains_key(m.name)) {
            return Err(RegistryError::DuplicateMethod(m.name.into()));
        }
        for m in methods {
            self.owners.insert(m.name, self.subsystems.len());
            self.methods.insert(m.name, m);
        }
        self.subsystems.push(sub);
        Ok(())
    }

    /// The reactors.
    pub fn cores(&self) -> &CoreBus {
        &self.cores
    }

    /// The current state.
    pub fn state(&self) -> RpcState {
        if self.state.load(Ordering::Acquire) == RpcState::Startup as u8 {
            RpcState::Startup
        } else {
            RpcState::Runtime
        }
    }

    /// Moves to `state`.
    pub fn set_state(&self, state: RpcState) {
        self.state.store(state as u8, Ordering::Release);
    }

    /// The registered subsystems, in registration (dependency) order.
    pub fn subsystems(&self) -> &[Arc<dyn Subsystem>] {
        &self.subsystems
    }

    /// The subsystem called `name`.
    pub fn subsystem(&self, name: &str) -> Option<&Arc<dyn Subsystem>> {
        self.subsystems.iter().find(|s| s.name() == name)
    }

    fn subsystem_names(&self) -> Vec<&'static str> {
        self.subsystems.iter().map(|s| s.name()).collect()
    }

    /// Method names, sorted; with `current`, only those callable now.
    pub fn method_names(&self, current: bool) -> Vec<&'static str> {
        let state = self.state();
        self.methods
            .values()
            .filter(|m| !current || m.states.allows(state))
            .map(|m| m.name)
            .collect()
    }

    /// The call that undoes a successful call of `method` (see
    /// [`Subsystem::undo`]).
    pub fn undo_of(
        &self,
        method: &str,
        params: Option<&Value>,
        result: &Value,
    ) -> Option<ConfigEntry> {
        let i = *self.owners.get(method)?;
        self.subsystems.get(i)?.undo(method, params, result)
    }

    /// Whether a method of this name exists.
    pub fn has_method(&self, name: &str) -> bool {
        self.methods.contains_key(name)
    }

    /// Calls `method` with `params`: what a client's request does.
    ///
    /// # Errors
    ///
    /// -32601 for an unknown method, -1 when it may not run in the current
    /// state, and whatever the method returns. A method that panics is
    /// answered with -32603 and leaves the server running.
    pub fn call(&self, method: &str, params: Option<Value>) -> Result<Value, RpcError> {
        let m = self
            .methods
            .get(method)
            .ok_or_else(|| RpcError::method_not_found(method))?;
        let state = self.state();
        if !m.states.allows(state) {
            let msg = match state {
                RpcState::Startup => "Method may only be called after framework is initialized using framework_start_init RPC.",
                RpcState::Runtime => "Method may only be called before framework is initialized. Use --wait-for-rpc command line parameter and then issue this RPC before the framework_start_init RPC.",
            };
            return Err(RpcError::new(INVALID_STATE, msg));
        }
        let handler = Arc::clone(&m.handler);
        std::panic::catch_unwind(AssertUnwindSafe(|| handler(self, params))).unwrap_or_else(|_| {
            log::error!("rpc: method {method} panicked");
            Err(RpcError::internal(format!(
                "method `{method}` failed unexpectedly"
            )))
        })
    }

    /// Handles one received JSON value (a request or a batch) and returns
    /// the text to send back, if any (see [`crate::protocol`]).
    pub fn handle(&self, v: Value) -> Option<String> {
        self.handle_checked(v, None)
    }

    /// [`RpcService::handle`] for a value in which `duplicate` (see
    /// [`crate::framing::FrameBuffer::take_duplicate`]) was given twice:
    /// that request is refused as SPDK's decoders refuse it, -32602 when
    /// the key is among its parameters (of a method that exists), else
    /// -32600; the other requests of a batch are handled.
    pub fn handle_checked(&self, v: Value, duplicate: Option<&DuplicateKey>) -> Option<String> {
        match v {
            Value::Array(items) if items.is_empty() => {
                response(None, Err(RpcError::invalid_request("an empty batch")))
            }
            Value::Array(items) => {
                // The batch element the repeated key is in, and where.
                let dup = duplicate.and_then(|d| match d.path.split_first() {
                    Some((PathSeg::Index(at), rest)) => Some((*at, rest, d.key.as_str())),
                    _ => None,
                });
                let answers: Vec<String> = items
                    .into_iter()
                    .enumerate()
                    .filter_map(|(i, item)| match dup {
                        Some((at, rest, key)) if at == i => self.refuse_duplicate(item, rest, key),
                        _ => self.handle_one(item),
                    })
                    .collect();
                (!answers.is_empty()).then(|| format!("[{}]", answers.join(",")))
            }
            other => match duplicate {
                Some(d) if other.is_object() => self.refuse_duplicate(other, &d.path, &d.key),
                _ => self.handle_one(other),
            },
        }
    }

    /// The answer to request `v` in which `key` was given twice in the
    /// object at `path` (from the request).
    fn refuse_duplicate(&self, v: Value, path: &[PathSeg], key: &str) -> Option<String> {
        let req = match Request::from_value(v) {
            Ok(req) => req,
            Err((id, e)) => return response(id.as_ref(), Err(e)),
        };
        let error = match path.first() {
            None => RpcError::invalid_request(format!("member `{key}` given twice")),
            Some(PathSeg::Key(k)) if k == "params" => {
                if !self.has_method(&req.method) {
                    return response(
                        req.id.as_ref(),
                        Err(RpcError::method_not_found(&req.method)),
                    );
                }
                RpcError::invalid_params(format!("key `{key}` given twice"))
            }
            Some(_) => RpcError::invalid_request(format!("key `{key}` given twice")),
        };
        log::debug!("rpc: {} refused: {error}", req.method);
        response(req.id.as_ref(), Err(error))
    }

    fn handle_one(&self, v: Value) -> Option<String> {
        match Request::from_value(v) {
            Ok(req) => {
                let outcome = self.call(&req.method, req.params);
                if let Err(e) = &outcome {
                    log::debug!("rpc: {} failed: {e}", req.method);
                }
                response(req.id.as_ref(), outcome)
            }
            Err((id, e)) => response(id.as_ref(), Err(e)),
        }
    }
}

/// Decodes a method's named parameters into `T` (absent or null
/// parameters decode as `{}`, so required members are reported missing).
///
/// # Errors
///
/// -32602 naming the member that is missing, unknown or of the wrong type,
/// or saying that positional (array) parameters are not taken.
pub fn decode<T: DeserializeOwned>(params: Option<Value>) -> Result<T, RpcError> {
    let v = match params {
        None => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v,
        Some(_) => {
            return Err(RpcError::invalid_params(
                "parameters must be named (an object), not positional",
            ))
        }
    };
    serde_json::from_value(v).map_err(|e| RpcError::invalid_params(e.to_string()))
}

/// Serialises a method's result.
///
/// # Errors
///
/// -32603 if it cannot be represented as JSON (never for our types).
pub fn encode<T: serde::Serialize>(v: &T) -> Result<Value, RpcError> {
    serde_json::to_value(v).map_err(|e| RpcError::internal(e.to_string()))
}
