//! `pollux-rpc`: the command-line client of the JSON-RPC socket, with
//! `spdk-rpc`'s verbs and arguments for the methods Pollux has, for
//! machines without Python.
//!
//! ```text
//! pollux-rpc [-s SOCK] [-t SECONDS] VERB [ARGS]
//! pollux-rpc bdev_malloc_create -b Malloc0 64 512
//! pollux-rpc bdev_get_bdevs -b Malloc0
//! pollux-rpc nvmf_create_transport -t TCP
//! pollux-rpc nvmf_create_subsystem nqn.2016-06.io.spdk:cnode1 -a -s SN1
//! pollux-rpc nvmf_subsystem_add_ns nqn.2016-06.io.spdk:cnode1 Malloc0
//! pollux-rpc nvmf_subsystem_add_listener nqn.2016-06.io.spdk:cnode1 -t tcp -a 127.0.0.1 -s 4420
//! pollux-rpc save_config > tgt.json
//! pollux-rpc call METHOD '{"json": "params"}'
//! ```
//!
//! Results print as `spdk-rpc` prints them (JSON indented by 2, a bare
//! string for a name); an error prints the request and the error object
//! on stderr and exits 1.

#![forbid(unsafe_code)]

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use pollux_rpc::bdev::params::{AioCreate, Delete, GetBdevs, GetIostat, MallocCreate, NullCreate};
use pollux_rpc::nvmf::params::{
    AddNs, AllowAnyHost, CreateSubsystem, CreateTransport, GetFilter, HostParams, ListenAddress,
    ListenerParams, NamespaceParams, RemoveNs, SubsystemRef,
};
use pollux_rpc::{ClientError, RpcClient, DEFAULT_SOCKET};
use serde_json::{json, Value};

/// Command-line client of pollux-tgt's JSON-RPC socket (spdk-rpc's verbs).
#[derive(Parser, Debug)]
#[command(name = "pollux-rpc", version)]
struct Args {
    /// The server's Unix socket.
    #[arg(short = 's', value_name = "SOCK", default_value = DEFAULT_SOCKET)]
    server: PathBuf,
    /// Seconds to wait for the answer.
    #[arg(short = 't', value_name = "SECONDS", default_value_t = 60.0)]
    timeout: f64,
    #[command(subcommand)]
    verb: Verb,
}

/// The arguments of the listener verbs.
#[derive(clap::Args, Debug)]
struct ListenerArgs {
    /// Subsystem NQN.
    nqn: String,
    /// rdma or tcp.
    #[arg(short = 't', long)]
    trtype: String,
    /// Address.
    #[arg(short = 'a', long)]
    traddr: String,
    /// ipv4, ipv6 or intra_host.
    #[arg(short = 'f', long)]
    adrfam: Option<String>,
    /// Port.
    #[arg(short = 's', long)]
    trsvcid: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Verb {
    /// Get the target's version.
    #[command(name = "spdk_get_version")]
    SpdkGetVersion,
    /// List the methods.
    #[command(name = "rpc_get_methods")]
    RpcGetMethods {
        /// Only those callable in the current state.
        #[arg(long)]
        current: bool,
        /// Include deprecated aliases.
        #[arg(short = 'i', long)]
        include_aliases: bool,
    },
    /// Start initialisation (in the startup state).
    #[command(name = "framework_start_init")]
    FrameworkStartInit,
    /// Wait until the framework is initialised.
    #[command(name = "framework_wait_init")]
    FrameworkWaitInit,
    /// Show the reactors.
    #[command(name = "framework_get_reactors")]
    FrameworkGetReactors,
    /// List the subsystems.
    #[command(name = "framework_get_subsystems")]
    FrameworkGetSubsystems,
    /// Show a subsystem's configuration.
    #[command(name = "framework_get_config")]
    FrameworkGetConfig {
        /// The subsystem.
        name: String,
    },
    /// Print the whole configuration (SPDK's JSON shape).
    #[command(name = "save_config")]
    SaveConfig {
        /// Indent; below 0 prints one line.
        #[arg(short = 'i', long, default_value_t = 2, allow_negative_numbers = true)]
        indent: i32,
    },
    /// Apply a configuration (all or nothing).
    #[command(name = "load_config")]
    LoadConfig {
        /// The file (default: standard input).
        #[arg(short = 'j', long = "json-conf")]
        json_conf: Option<PathBuf>,
    },
    /// Create a malloc bdev.
    #[command(name = "bdev_malloc_create")]
    BdevMallocCreate {
        /// Name.
        #[arg(short = 'b', long)]
        name: Option<String>,
        /// UUID.
        #[arg(short = 'u', long)]
        uuid: Option<String>,
        /// Size in MiB.
        total_size: f64,
        /// Data block size.
        block_size: u32,
        /// Metadata size.
        #[arg(short = 'm', long)]
        md_size: Option<u32>,
        /// Interleave the metadata.
        #[arg(short = 'i', long)]
        md_interleave: bool,
        /// Protection information type.
        #[arg(short = 't', long)]
        dif_type: Option<i32>,
    },
    /// Delete a malloc bdev.
    #[command(name = "bdev_malloc_delete")]
    BdevMallocDelete {
        /// Name.
        name: String,
    },
    /// Create a null bdev.
    #[command(name = "bdev_null_create")]
    BdevNullCreate {
        /// Name.
        name: String,
        /// Size in MiB.
        total_size: u64,
        /// Data block size.
        block_size: u32,
        /// UUID.
        #[arg(short = 'u', long)]
        uuid: Option<String>,
        /// Metadata size.
        #[arg(short = 'm', long)]
        md_size: Option<u32>,
        /// Protection information type.
        #[arg(short = 't', long)]
        dif_type: Option<i32>,
    },
    /// Delete a null bdev.
    #[command(name = "bdev_null_delete")]
    BdevNullDelete {
        /// Name.
        name: String,
    },
    /// Create an aio bdev.
    #[command(name = "bdev_aio_create")]
    BdevAioCreate {
        /// The file or block device.
        filename: String,
        /// Name.
        name: String,
        /// Block size.
        block_size: Option<u32>,
        /// UUID.
        #[arg(short = 'u', long)]
        uuid: Option<String>,
    },
    /// Delete an aio bdev.
    #[command(name = "bdev_aio_delete")]
    BdevAioDelete {
        /// Name.
        name: String,
    },
    /// Show the bdevs (or one).
    #[command(name = "bdev_get_bdevs")]
    BdevGetBdevs {
        /// Only this bdev.
        #[arg(short = 'b', long)]
        name: Option<String>,
        /// Milliseconds to wait for it to appear.
        #[arg(short = 't', long = "timeout-ms")]
        timeout_ms: Option<u64>,
    },
    /// Show I/O statistics.
    #[command(name = "bdev_get_iostat")]
    BdevGetIostat {
        /// Only this bdev.
        #[arg(short = 'b', long)]
        name: Option<String>,
        /// Per core.
        #[arg(short = 'c', long)]
        per_channel: bool,
    },
    /// Create an NVMe-oF transport.
    #[command(name = "nvmf_create_transport")]
    NvmfCreateTransport {
        /// RDMA or TCP.
        #[arg(short = 't', long)]
        trtype: String,
        /// Queue depth.
        #[arg(short = 'q', long)]
        max_queue_depth: Option<u16>,
        /// I/O queues per controller.
        #[arg(short = 'm', long)]
        max_io_qpairs_per_ctrlr: Option<u16>,
        /// In-capsule data bytes.
        #[arg(short = 'c', long)]
        in_capsule_data_size: Option<u32>,
    },
    /// Show the NVMe-oF transports.
    #[command(name = "nvmf_get_transports")]
    NvmfGetTransports {
        /// Only this type.
        #[arg(short = 't', long)]
        trtype: Option<String>,
    },
    /// Create an NVMe-oF subsystem.
    #[command(name = "nvmf_create_subsystem")]
    NvmfCreateSubsystem {
        /// NQN.
        nqn: String,
        /// Serial number.
        #[arg(short = 's', long)]
        serial_number: Option<String>,
        /// Model number.
        #[arg(short = 'd', long)]
        model_number: Option<String>,
        /// Allow any host.
        #[arg(short = 'a', long)]
        allow_any_host: bool,
        /// Largest NSID.
        #[arg(short = 'm', long)]
        max_namespaces: Option<u32>,
    },
    /// Delete an NVMe-oF subsystem.
    #[command(name = "nvmf_delete_subsystem")]
    NvmfDeleteSubsystem {
        /// NQN.
        nqn: String,
    },
    /// Show the NVMe-oF subsystems (or one).
    #[command(name = "nvmf_get_subsystems")]
    NvmfGetSubsystems {
        /// Only this one.
        nqn: Option<String>,
    },
    /// Add a namespace.
    #[command(name = "nvmf_subsystem_add_ns")]
    NvmfSubsystemAddNs {
        /// Subsystem NQN.
        nqn: String,
        /// Bdev.
        bdev_name: String,
        /// NSID.
        #[arg(short = 'n', long)]
        nsid: Option<u32>,
    },
    /// Remove a namespace.
    #[command(name = "nvmf_subsystem_remove_ns")]
    NvmfSubsystemRemoveNs {
        /// Subsystem NQN.
        nqn: String,
        /// NSID.
        nsid: u32,
    },
    /// Add a listener.
    #[command(name = "nvmf_subsystem_add_listener")]
    NvmfSubsystemAddListener(ListenerArgs),
    /// Remove a listener.
    #[command(name = "nvmf_subsystem_remove_listener")]
    NvmfSubsystemRemoveListener(ListenerArgs),
    /// Allow a host.
    #[command(name = "nvmf_subsystem_add_host")]
    NvmfSubsystemAddHost {
        /// Subsystem NQN.
        nqn: String,
        /// Host NQN.
        host: String,
    },
    /// Stop allowing a host.
    #[command(name = "nvmf_subsystem_remove_host")]
    NvmfSubsystemRemoveHost {
        /// Subsystem NQN.
        nqn: String,
        /// Host NQN.
        host: String,
    },
    /// Allow any host (-e) or only the listed ones (-d).
    #[command(name = "nvmf_subsystem_allow_any_host")]
    NvmfSubsystemAllowAnyHost {
        /// Subsystem NQN.
        nqn: String,
        /// Allow any host.
        #[arg(short = 'e', long, conflicts_with = "disable")]
        enable: bool,
        /// Only the listed hosts.
        #[arg(short = 'd', long)]
        disable: bool,
    },
    /// Show a subsystem's controllers.
    #[command(name = "nvmf_subsystem_get_controllers")]
    NvmfSubsystemGetControllers {
        /// Subsystem NQN.
        nqn: String,
    },
    /// Show a subsystem's queue pairs.
    #[command(name = "nvmf_subsystem_get_qpairs")]
    NvmfSubsystemGetQpairs {
        /// Subsystem NQN.
        nqn: String,
    },
    /// Show a subsystem's listeners.
    #[command(name = "nvmf_subsystem_get_listeners")]
    NvmfSubsystemGetListeners {
        /// Subsystem NQN.
        nqn: String,
    },
    /// Show the NVMe-oF statistics.
    #[command(name = "nvmf_get_stats")]
    NvmfGetStats,
    /// Call any method with JSON parameters.
    Call {
        /// The method.
        method: String,
        /// Its parameters (a JSON object).
        params: Option<String>,
    },
}

/// How a result is printed.
enum Print {
    /// Indented JSON (`spdk-rpc`'s print_dict).
    Json,
    /// A string without quotes (print_json of a string).
    Bare,
    /// Nothing (deletes).
    Nothing,
}

fn to_params<T: serde::Serialize>(v: &T) -> Result<Option<Value>, String> {
    serde_json::to_value(v).map(Some).map_err(|e| e.to_string())
}

fn mib_blocks(mib: f64, block: u32) -> Result<u64, String> {
    if !mib.is_finite() || mib <= 0.0 || block == 0 {
        return Err("the size must be above 0 MiB and the block size above 0".into());
    }
    Ok((mib * 1024.0 * 1024.0 / f64::from(block)) as u64)
}

/// The request a verb makes: method, params, how to print the result.
fn request(verb: Verb) -> Result<(String, Option<Value>, Print), String> {
    let none = |m: &str, p: Print| Ok((m.to_owned(), None, p));
    match verb {
        Verb::SpdkGetVersion => none("spdk_get_version", Print::Json),
        Verb::RpcGetMethods {
            current,
            include_aliases,
        } => {
            let mut p = serde_json::Map::new();
            if current {
                p.insert("current".into(), Value::Bool(true));
            }
            if include_aliases {
                p.insert("include_aliases".into(), Value::Bool(true));
            }
            let p = (!p.is_empty()).then_some(Value::Object(p));
            Ok(("rpc_get_methods".into(), p, Print::Json))
        }
        Verb::FrameworkStartInit => none("framework_start_init", Print::Nothing),
        Verb::FrameworkWaitInit => none("framework_wait_init", Print::Nothing),
        Verb::FrameworkGetReactors => none("framework_get_reactors", Print::Json),
        Verb::FrameworkGetSubsystems => none("framework_get_subsystems", Print::Json),
        Verb::FrameworkGetConfig { name } => Ok((
            "framework_get_config".into(),
            Some(json!({ "name": name })),
            Print::Json,
        )),
        Verb::SaveConfig { .. } => none("save_config", Print::Json),
        Verb::LoadConfig { json_conf } => {
            let mut text = String::new();
            match json_conf {
                Some(p) => {
                    text =
                        std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?
                }
                None => {
                    std::io::stdin()
                        .read_to_string(&mut text)
                        .map_err(|e| format!("stdin: {e}"))?;
                }
            }
            let v: Value =
                serde_json::from_str(&text).map_err(|e| format!("the configuration: {e}"))?;
            Ok(("load_config".into(), Some(v), Print::Nothing))
        }
        Verb::BdevMallocCreate {
            name,
            uuid,
            total_size,
            block_size,
            md_size,
            md_interleave,
            dif_type,
        } => {
            let p = MallocCreate {
                name,
                uuid,
                block_size,
                num_blocks: mib_blocks(total_size, block_size)?,
                md_size,
                md_interleave: md_interleave.then_some(true),
                dif_type,
                ..MallocCreate::default()
            };
            Ok(("bdev_malloc_create".into(), to_params(&p)?, Print::Bare))
        }
        Verb::BdevMallocDelete { name } => Ok((
            "bdev_malloc_delete".into(),
            to_params(&Delete { name })?,
            Print::Nothing,
        )),
        Verb::BdevNullCreate {
            name,
            total_size,
            block_size,
            uuid,
            md_size,
            dif_type,
        } => {
            let p = NullCreate {
                name,
                uuid,
                block_size,
                num_blocks: mib_blocks(total_size as f64, block_size)?,
                md_size,
                dif_type,
                ..NullCreate::default()
            };
            Ok(("bdev_null_create".into(), to_params(&p)?, Print::Bare))
        }
        Verb::BdevNullDelete { name } => Ok((
            "bdev_null_delete".into(),
            to_params(&Delete { name })?,
            Print::Nothing,
        )),
        Verb::BdevAioCreate {
            filename,
            name,
            block_size,
            uuid,
        } => {
            let p = AioCreate {
                name,
                filename,
                block_size,
                uuid,
                ..AioCreate::default()
            };
            Ok(("bdev_aio_create".into(), to_params(&p)?, Print::Bare))
        }
        Verb::BdevAioDelete { name } => Ok((
            "bdev_aio_delete".into(),
            to_params(&Delete { name })?,
            Print::Nothing,
        )),
        Verb::BdevGetBdevs { name, timeout_ms } => {
            let p = GetBdevs {
                name,
                timeout: timeout_ms,
            };
            Ok(("bdev_get_bdevs".into(), to_params(&p)?, Print::Json))
        }
        Verb::BdevGetIostat { name, per_channel } => {
            let p = GetIostat {
                name,
                per_channel: per_channel.then_some(true),
                ..GetIostat::default()
            };
            Ok(("bdev_get_iostat".into(), to_params(&p)?, Print::Json))
        }
        Verb::Call { method, params } => {
            let p = params
                .map(|t| serde_json::from_str::<Value>(&t))
                .transpose()
                .map_err(|e| format!("params: {e}"))?;
            Ok((method, p, Print::Json))
        }
        other => nvmf_request(other),
    }
}

/// The request of an `nvmf_*` verb (see [`request`]).
fn nvmf_request(verb: Verb) -> Result<(String, Option<Value>, Print), String> {
    let sub = |nqn: String| {
        to_params(&SubsystemRef {
            nqn,
            tgt_name: None,
        })
    };
    let listener = |a: ListenerArgs| {
        to_params(&ListenerParams {
            nqn: a.nqn,
            listen_address: ListenAddress {
                trtype: a.trtype,
                adrfam: a.adrfam,
                traddr: a.traddr,
                trsvcid: a.trsvcid,
            },
            tgt_name: None,
            secure_channel: None,
            ana_state: None,
            sock_impl: None,
        })
    };
    let host = |nqn, host| {
        to_params(&HostParams {
            nqn,
            host,
            ..HostParams::default()
        })
    };
    let (m, p, print) = match verb {
        Verb::NvmfCreateTransport {
            trtype,
            max_queue_depth,
            max_io_qpairs_per_ctrlr,
            in_capsule_data_size,
        } => (
            "nvmf_create_transport",
            to_params(&CreateTransport {
                trtype,
                max_queue_depth,
                max_io_qpairs_per_ctrlr,
                in_capsule_data_size,
                ..CreateTransport::default()
            })?,
            Print::Nothing,
        ),
        Verb::NvmfGetTransports { trtype } => (
            "nvmf_get_transports",
            to_params(&GetFilter {
                trtype,
                ..GetFilter::default()
            })?,
            Print::Json,
        ),
        Verb::NvmfCreateSubsystem {
            nqn,
            serial_number,
            model_number,
            allow_any_host,
            max_namespaces,
        } => (
            "nvmf_create_subsystem",
            to_params(&CreateSubsystem {
                nqn,
                serial_number,
                model_number,
                allow_any_host: allow_any_host.then_some(true),
                max_namespaces,
                ..CreateSubsystem::default()
            })?,
            Print::Nothing,
        ),
        Verb::NvmfDeleteSubsystem { nqn } => ("nvmf_delete_subsystem", sub(nqn)?, Print::Nothing),
        Verb::NvmfGetSubsystems { nqn } => (
            "nvmf_get_subsystems",
            to_params(&GetFilter {
                nqn,
                ..GetFilter::default()
            })?,
            Print::Json,
        ),
        Verb::NvmfSubsystemAddNs {
            nqn,
            bdev_name,
            nsid,
        } => (
            "nvmf_subsystem_add_ns",
            to_params(&AddNs {
                nqn,
                namespace: NamespaceParams {
                    bdev_name,
                    nsid,
                    ..NamespaceParams::default()
                },
                tgt_name: None,
            })?,
            Print::Json,
        ),
        Verb::NvmfSubsystemRemoveNs { nqn, nsid } => (
            "nvmf_subsystem_remove_ns",
            to_params(&RemoveNs {
                nqn,
                nsid,
                tgt_name: None,
            })?,
            Print::Nothing,
        ),
        Verb::NvmfSubsystemAddListener(a) => {
            ("nvmf_subsystem_add_listener", listener(a)?, Print::Nothing)
        }
        Verb::NvmfSubsystemRemoveListener(a) => (
            "nvmf_subsystem_remove_listener",
            listener(a)?,
            Print::Nothing,
        ),
        Verb::NvmfSubsystemAddHost { nqn, host: h } => {
            ("nvmf_subsystem_add_host", host(nqn, h)?, Print::Nothing)
        }
        Verb::NvmfSubsystemRemoveHost { nqn, host: h } => {
            ("nvmf_subsystem_remove_host", host(nqn, h)?, Print::Nothing)
        }
        Verb::NvmfSubsystemAllowAnyHost {
            nqn,
            enable,
            disable,
        } => {
            if enable == disable {
                return Err("give -e (allow any host) or -d (only the listed ones)".into());
            }
            (
                "nvmf_subsystem_allow_any_host",
                to_params(&AllowAnyHost {
                    nqn,
                    allow_any_host: enable,
                    tgt_name: None,
                })?,
                Print::Nothing,
            )
        }
        Verb::NvmfSubsystemGetControllers { nqn } => {
            ("nvmf_subsystem_get_controllers", sub(nqn)?, Print::Json)
        }
        Verb::NvmfSubsystemGetQpairs { nqn } => {
            ("nvmf_subsystem_get_qpairs", sub(nqn)?, Print::Json)
        }
        Verb::NvmfSubsystemGetListeners { nqn } => {
            ("nvmf_subsystem_get_listeners", sub(nqn)?, Print::Json)
        }
        Verb::NvmfGetStats => ("nvmf_get_stats", None, Print::Json),
        _ => return Err("not an nvmf verb".into()),
    };
    Ok((m.to_owned(), p, print))
}

fn pretty(v: &Value, indent: i32) -> String {
    if indent < 0 {
        return v.to_string();
    }
    let pad = vec![b' '; indent as usize];
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(&pad);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    match serde::Serialize::serialize(v, &mut ser) {
        Ok(()) => String::from_utf8_lossy(&out).into_owned(),
        Err(_) => v.to_string(),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let indent = match &args.verb {
        Verb::SaveConfig { indent } => *indent,
        _ => 2,
    };
    let (method, params, print) = match request(args.verb) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pollux-rpc: {e}");
            return ExitCode::from(2);
        }
    };
    let timeout = Duration::try_from_secs_f64(args.timeout).unwrap_or(Duration::from_secs(60));
    let result =
        RpcClient::connect(&args.server, timeout).and_then(|mut c| c.call(&method, params.clone()));
    match result {
        Ok(v) => {
            match (print, &v) {
                (Print::Nothing, _) => {}
                (Print::Bare, Value::String(s)) => println!("{s}"),
                _ => println!("{}", pretty(&v, indent)),
            }
            ExitCode::SUCCESS
        }
        Err(ClientError::Rpc(e)) => {
            let mut req = params.unwrap_or_else(|| json!({}));
            if let Value::Object(m) = &mut req {
                m.insert("method".into(), Value::String(method));
            }
            eprintln!(
                "request:\n{}\nGot JSON-RPC error response\nresponse:\n{}",
                pretty(&req, 2),
                pretty(&e.to_json(), 2)
            );
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("pollux-rpc: {e}");
            ExitCode::from(1)
        }
    }
}
