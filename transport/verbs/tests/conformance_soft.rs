//! The conformance suite against the soft provider (two endpoints in one
//! process, connected through the real Unix-socket CM).

#![allow(clippy::unwrap_used)]

use pollux_verbs::conformance::{self as c, SoftFixture};

const SOFT: SoftFixture = SoftFixture::new("pollux-conf");

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        $(#[test] fn $name() { c::$name(&SOFT); })*
    };
}

cases!(
    connect_accept_private_data,
    reject_with_private_data,
    private_data_limits,
    qp_state_table_and_post_checks,
    send_recv_imm_inline,
    write_then_send_ordering,
    write_with_imm,
    rdma_read,
    bad_rkey_is_remote_access_error,
    out_of_bounds_and_rights,
    bad_lkey_is_local_protection_error,
    recv_too_small,
    rnr_retry_forever_waits,
    rnr_retry_exhausted,
    fast_reg_send_with_inv_local_inv,
    flush_after_error_and_drain,
    srq_shared_by_qps_and_cq_shared,
    cq_overflow,
    disconnect_during_traffic,
    cq_arm_event_fd,
    integrity_t10_pi,
    fast_reg_window_read_write,
    fast_reg_access_beyond_window_fails,
    fast_reg_send_with_inv_invalidates,
    fast_reg_local_inv_invalidates,
    fast_reg_rebind_new_key,
    accept_on_another_thread,
    dropped_detached_request_is_rejected,
);
