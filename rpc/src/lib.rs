//! Pollux's management plane: SPDK-compatible JSON-RPC 2.0 over a Unix
//! socket, so that SPDK's own client (`spdk-rpc`, `rpc.py`) and the tools
//! written against its method names manage a Pollux target unchanged.
//!
//! # Shape
//!
//! - [`framing`] splits a connection's bytes into JSON values (SPDK frames
//!   nothing: values follow each other); [`protocol`] checks requests and
//!   writes responses as SPDK's server does (batches, notifications,
//!   -32700/-32600/-32601/-32602, [`error`] has SPDK's errno codes).
//! - [`RpcService`] is the method registry and dispatcher. The framework's
//!   methods ([`framework`]: `spdk_get_version`, `rpc_get_methods`,
//!   `framework_wait_init`, `framework_get_reactors`, `save_config`,
//!   `load_config`, ...) are built in; each subsystem is one provider
//!   module implementing [`Subsystem`] (its methods, its part of the
//!   configuration, how to undo its calls): [`bdev::BdevSubsystem`] and
//!   [`nvmf::NvmfSubsystem`] (the NVMe-oF target's subsystems, namespaces,
//!   hosts, listeners and transports) and [`iscsi::IscsiSubsystem`]
//!   (portal groups, initiator groups and target nodes of the iSER target).
//!   SPDK's framework-option methods, which its `save_config` always
//!   writes, are in [`options`]: SPDK's defaults pass, what Pollux honours
//!   is applied, other values are refused naming method and parameter.
//! - [`RpcServer`] serves a service on a Unix socket from one control
//!   thread (never a reactor); [`CoreBus`] carries what a method needs
//!   from the cores as reactor messages and waits for every core's answer.
//! - [`config`] reads and writes SPDK's JSON configuration files and
//!   applies them through the same dispatcher, all or nothing.
//! - [`RpcClient`] is a blocking client; the `pollux-rpc` binary is the
//!   command-line client with `spdk-rpc`'s verbs, built on the request
//!   types of [`bdev::params`] that the server decodes.
//!
//! ```
//! use std::sync::Arc;
//! use pollux_bdev::BdevRegistry;
//! use pollux_rpc::{bdev::BdevSubsystem, CoreBus, RpcService};
//! use serde_json::json;
//!
//! let mut svc = RpcService::new(CoreBus::none());
//! svc.register(BdevSubsystem::new(Arc::new(BdevRegistry::new()))).unwrap();
//! let name = svc
//!     .call("bdev_malloc_create", Some(json!({"block_size": 512, "num_blocks": 64})))
//!     .unwrap();
//! assert_eq!(name, json!("Malloc0"));
//! let answer = svc.handle(json!({"jsonrpc": "2.0", "id": 1, "method": "bdev_get_bdevs"}));
//! assert!(answer.unwrap().contains("\"num_blocks\":64"));
//! ```

#![forbid(unsafe_code)]

pub mod bdev;
pub mod client;
pub mod config;
pub mod cores;
pub mod error;
pub mod framework;
pub mod framing;
pub mod fuzz;
pub mod iscsi;
pub mod nvmf;
pub mod options;
pub mod protocol;
pub mod server;
pub mod service;
pub mod uuid;

pub use client::{ClientError, RpcClient};
pub use config::{ConfigEntry, ConfigError, JsonConfig};
pub use cores::CoreBus;
pub use error::{Errno, RpcError};
pub use server::{RpcServer, ServerConfig, ServerError, DEFAULT_SOCKET};
pub use service::{Method, RpcService, RpcState, StateMask, Subsystem};
