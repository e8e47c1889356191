//! SPDK's framework-option methods, which SPDK's `save_config` writes into
//! every configuration whatever the application did (`iobuf_set_options`,
//! `sock_set_default_impl`, `sock_impl_set_options`, `accel_set_options`,
//! `bdev_set_options`, `bdev_raid_set_options`, `bdev_nvme_set_options`,
//! `bdev_nvme_set_hotplug`, `bdev_wait_for_examine`,
//! `framework_set_scheduler`; `sock_impl_set_options`, `nvmf_set_config`,
//! `nvmf_set_max_subsystems` and `nvmf_set_crdt` live with the
//! [`nvmf`](crate::nvmf) provider, whose TCP transport is the one user of
//! sockets).
//!
//! Pollux has none of the machinery these options tune (no iobuf pools, no
//! accel framework, no socket layer with pluggable implementations, no
//! raid or NVMe bdevs, no scheduler but pinned reactors), so a file that
//! SPDK's `nvmf_tgt` saved would otherwise be refused for options its
//! writer never chose. The rule, for every one of them:
//!
//! - a parameter at **SPDK's default** (v25.09's, as its `save_config`
//!   writes them; [`defaults`]) is accepted and changes nothing: Pollux
//!   behaves as it always does (its TCP transport uses the kernel's
//!   sockets, as SPDK's `posix` implementation does; its reactors are
//!   pinned and never rebalanced, as SPDK's `static` scheduler);
//! - a parameter Pollux **honours** is applied: `sock_set_default_impl`
//!   to `posix`, `framework_set_scheduler` to `static`,
//!   `bdev_wait_for_examine` (a barrier: it answers once every core has
//!   gone round its loop since the bdevs before it were made, so they are
//!   visible everywhere), `nvmf_set_max_subsystems` (the limit
//!   `nvmf_create_subsystem` enforces), `sock_impl_set_options` of
//!   `posix`: `recv_buf_size` and `send_buf_size` become `SO_RCVBUF` and
//!   `SO_SNDBUF` of the sockets of a TCP transport made after it (SPDK's
//!   default, 2 MiB, leaves the kernel's sizing, as before);
//! - any **other value** is refused with -95 naming the method, the
//!   parameter, the value and SPDK's default: the target would not do what
//!   the file asks, so it does not start from it;
//! - an **unknown parameter** is refused with -32602 naming it.
//!
//! The methods may be called in any state (SPDK takes most of them only
//! before `framework_start_init`; Pollux applies nothing that needs it).
//! They leave nothing to undo, except `nvmf_set_max_subsystems` and
//! `sock_impl_set_options`.

use serde_json::{json, Map, Value};

use crate::error::{Errno, RpcError};
use crate::service::{Method, RpcService, StateMask};

/// SPDK v25.09's default parameters of the option method `method`
/// (`sock_impl_set_options`: of the implementation `impl_name`), as its
/// `save_config` writes them; `None` for a method that is not one of them.
pub fn defaults(method: &str, impl_name: Option<&str>) -> Option<Value> {
    let dhchap_digests = json!(["sha256", "sha384", "sha512"]);
    let dhchap_dhgroups = json!([
        "null",
        "ffdhe2048",
        "ffdhe3072",
        "ffdhe4096",
        "ffdhe6144",
        "ffdhe8192"
    ]);
    Some(match method {
        "iobuf_set_options" => json!({
            "small_pool_count": 8192,
            "large_pool_count": 1024,
            "small_bufsize": 8192,
            "large_bufsize": 135168,
            "enable_numa": false,
        }),
        "sock_set_default_impl" => json!({"impl_name": "posix"}),
        "sock_impl_set_options" => {
            let (buf, zcopy_server) = match impl_name? {
                "posix" => (2_097_152, true),
                "uring" => (2_097_152, false),
                "ssl" => (4096, true),
                _ => return None,
            };
            json!({
                "impl_name": impl_name,
                "recv_buf_size": buf,
                "send_buf_size": buf,
                "enable_recv_pipe": true,
                "enable_quickack": false,
                "enable_placement_id": 0,
                "enable_zerocopy_send_server": zcopy_server,
                "enable_zerocopy_send_client": false,
                "zerocopy_threshold": 0,
                "tls_version": 0,
                "enable_ktls": false,
            })
        }
        "accel_set_options" => json!({
            "small_cache_size": 128,
            "large_cache_size": 16,
            "task_count": 2048,
            "sequence_count": 2048,
            "buf_count": 2048,
        }),
        "bdev_set_options" => json!({
            "bdev_io_pool_size": 65535,
            "bdev_io_cache_size": 256,
            "bdev_auto_examine": true,
            "iobuf_small_cache_size": 128,
            "iobuf_large_cache_size": 16,
        }),
        "bdev_raid_set_options" => json!({
            "process_window_size_kb": 1024,
            "process_max_bandwidth_mb_sec": 0,
        }),
        "bdev_nvme_set_options" => json!({
            "action_on_timeout": "none",
            "timeout_us": 0,
            "timeout_admin_us": 0,
            "keep_alive_timeout_ms": 10000,
            "arbitration_burst": 0,
            "low_priority_weight": 0,
            "medium_priority_weight": 0,
            "high_priority_weight": 0,
            "nvme_adminq_poll_period_us": 10000,
            "nvme_ioq_poll_period_us": 0,
            "io_queue_requests": 0,
            "delay_cmd_submit": true,
            "transport_retry_count": 4,
            "bdev_retry_count": 3,
            "transport_ack_timeout": 0,
            "ctrlr_loss_timeout_sec": 0,
            "reconnect_delay_sec": 0,
            "fast_io_fail_timeout_sec": 0,
            "disable_auto_failback": false,
            "generate_uuids": false,
            "transport_tos": 0,
            "nvme_error_stat": false,
            "rdma_srq_size": 0,
            "io_path_stat": false,
            "allow_accel_sequence": false,
            "rdma_max_cq_size": 0,
            "rdma_cm_event_timeout_ms": 0,
            "dhchap_digests": dhchap_digests,
            "dhchap_dhgroups": dhchap_dhgroups,
            "rdma_umr_per_io": false,
            "tcp_connect_timeout_ms": 0,
            "enable_flush": false,
        }),
        "bdev_nvme_set_hotplug" => json!({"enable": false, "period_us": 100_000}),
        "bdev_wait_for_examine" => json!({}),
        "framework_set_scheduler" => json!({"name": "static"}),
        "nvmf_set_config" => json!({
            "discovery_filter": "match_any",
            "admin_cmd_passthru": {"identify_ctrlr": false, "vendor_specific": false},
            "dhchap_digests": dhchap_digests,
            "dhchap_dhgroups": dhchap_dhgroups,
        }),
        "nvmf_set_max_subsystems" => json!({"max_subsystems": 1024}),
        "nvmf_set_crdt" => json!({"crdt1": 0, "crdt2": 0, "crdt3": 0}),
        _ => return None,
    })
}

/// Checks the parameters of the option method `method` against SPDK's
/// defaults (see the module docs): returns the parameters that differ
/// from their default and are among `honoured` (for the method to
/// apply).
///
/// # Errors
///
/// -32602 for positional parameters, an unknown parameter or an unknown
/// `impl_name`; -95 for a value that differs from SPDK's default and is not
/// `honoured`.
pub fn check(
    method: &str,
    params: Option<&Value>,
    honoured: &[&str],
) -> Result<Map<String, Value>, RpcError> {
    let given = match params {
        None | Some(Value::Null) => return Ok(Map::new()),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(RpcError::invalid_params(format!(
                "{method}: parameters must be named (an object), not positional"
            )))
        }
    };
    let impl_name = given.get("impl_name").and_then(Value::as_str);
    let defaults = defaults(method, impl_name).ok_or_else(|| {
        RpcError::invalid_params(format!(
            "{method}: impl_name {}: not a socket implementation SPDK has (posix, uring, ssl)",
            given.get("impl_name").unwrap_or(&Value::Null)
        ))
    })?;
    let mut apply = Map::new();
    differences(method, "", given, &defaults, &mut |path, v| {
        if honoured.contains(&path) {
            apply.insert(path.to_owned(), v.clone());
            Ok(())
        } else {
            Err(())
        }
    })?;
    Ok(apply)
}

/// Walks `given` against `defaults` (objects member by member), calling
/// `differs(path, value)` for each value not at its default; an `Err` from
/// it refuses that value.
fn differences(
    method: &str,
    prefix: &str,
    given: &Map<String, Value>,
    defaults: &Value,
    differs: &mut dyn FnMut(&str, &Value) -> Result<(), ()>,
) -> Result<(), RpcError> {
    for (key, v) in given {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let Some(d) = defaults.get(key) else {
            return Err(RpcError::invalid_params(format!(
                "{method}: unknown parameter `{path}`"
            )));
        };
        match (v, d) {
            (Value::Object(inner), Value::Object(_)) => {
                differences(method, &path, inner, d, differs)?;
            }
            _ if same(v, d) => {}
            _ => {
                differs(&path, v).map_err(|()| {
                    RpcError::errno(
                        Errno::NotSupported,
                        format!(
                            "{method}: parameter `{path}` = {v}: Pollux cannot honour it (only SPDK's default {d} is accepted)"
                        ),
                    )
                })?;
            }
        }
    }
    Ok(())
}

/// JSON equality that takes `1` and `1.0` as the same number.
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// A method that accepts SPDK's defaults and honours nothing else.
fn defaults_only(name: &'static str) -> Method {
    Method::new(name, StateMask::ANY, move |_, p| {
        check(name, p.as_ref(), &[])?;
        Ok(Value::Bool(true))
    })
}

/// The option methods that belong to no provider of Pollux's (see the
/// module docs; the nvmf ones are the nvmf provider's).
pub(crate) fn methods() -> Vec<Method> {
    let mut out: Vec<Method> = [
        "iobuf_set_options",
        "accel_set_options",
        "bdev_set_options",
        "bdev_raid_set_options",
        "bdev_nvme_set_options",
        "bdev_nvme_set_hotplug",
    ]
    .into_iter()
    .map(defaults_only)
    .collect();
    // The values Pollux runs with are the defaults of these two: `posix`
    // sockets and the `static` scheduler.
    out.push(defaults_only("sock_set_default_impl"));
    out.push(defaults_only("framework_set_scheduler"));
    out.push(Method::new(
        "bdev_wait_for_examine",
        StateMask::ANY,
        |svc: &RpcService, p| {
            check("bdev_wait_for_examine", p.as_ref(), &[])?;
            svc.cores().on_each_core(|_| ())?;
            Ok(Value::Bool(true))
        },
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_and_other_values_are_named() {
        let d = defaults("bdev_set_options", None);
        assert!(check("bdev_set_options", d.as_ref(), &[]).is_ok_and(|m| m.is_empty()));
        let e = check(
            "bdev_set_options",
            Some(&json!({"bdev_io_pool_size": 100})),
            &[],
        )
        .err();
        let msg = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("bdev_set_options"), "{msg}");
        assert!(msg.contains("`bdev_io_pool_size` = 100"), "{msg}");
        assert!(msg.contains("65535"), "{msg}");
    }

    #[test]
    fn nested_members_are_checked_one_by_one() {
        let partial = json!({"admin_cmd_passthru": {"identify_ctrlr": false}});
        assert!(check("nvmf_set_config", Some(&partial), &[]).is_ok());
        let on = json!({"admin_cmd_passthru": {"identify_ctrlr": true}});
        let msg = check("nvmf_set_config", Some(&on), &[])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains("`admin_cmd_passthru.identify_ctrlr`"), "{msg}");
        let unknown = json!({"admin_cmd_passthru": {"bogus": 1}});
        let e = check("nvmf_set_config", Some(&unknown), &[]).err();
        assert_eq!(e.map(|e| e.code), Some(crate::error::INVALID_PARAMS));
    }

    #[test]
    fn socket_implementations_have_their_own_defaults() {
        let ssl = json!({"impl_name": "ssl", "recv_buf_size": 4096});
        assert!(check("sock_impl_set_options", Some(&ssl), &[]).is_ok());
        let posix = json!({"impl_name": "posix", "recv_buf_size": 4096});
        assert!(check("sock_impl_set_options", Some(&posix), &[]).is_err());
        let other = json!({"impl_name": "vpp"});
        assert!(check("sock_impl_set_options", Some(&other), &[]).is_err());
    }

    #[test]
    fn honoured_values_are_handed_back() {
        let p = json!({"max_subsystems": 8});
        let m = check("nvmf_set_max_subsystems", Some(&p), &["max_subsystems"]);
        assert_eq!(
            m.ok().and_then(|m| m.get("max_subsystems").cloned()),
            Some(json!(8))
        );
    }
}
