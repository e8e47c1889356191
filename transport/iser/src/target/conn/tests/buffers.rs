//! Task buffers come from the core's cache per command: back-pressure when
//! the pool runs dry (the command waits, or TASK SET FULL when its
//! unsolicited data has nowhere to go), no shared-pool traffic per command,
//! and every buffer back at the end.

use super::*;

fn two_buffer_fixture() -> Fx {
    fixture_with(
        true,
        TargetOptions {
            limits: TargetLimits {
                queue_depth: 4,
                ..TargetLimits::default()
            },
            max_io_bytes: 64 * 1024,
            task_buffers: 2,
        },
    )
}

impl Fx {
    fn run(&mut self, rounds: usize) {
        for _ in 0..rounds {
            self.cl.poll_once_all();
            self.conn.poll(&mut self.ops);
        }
    }

    /// Send an INQUIRY without waiting for it; returns its ITT.
    fn send_inquiry(&mut self) -> u32 {
        self.itt += 1;
        let (hdr, v) = inquiry(self.itt, self.cmd_sn, false);
        self.cmd_sn += 1;
        assert!(self.pdu(hdr, &v));
        self.itt
    }
}

#[test]
fn a_command_without_a_buffer_waits_and_runs_when_one_is_freed() {
    let mut fx = two_buffer_fixture();
    fx.login(INI, "Normal");
    fx.ops.defer_writes = true;
    let pool = fx.target.pool().clone();
    // Two INQUIRYs hold both buffers (their Data-In WRITEs stay in
    // flight); the third has none and waits.
    let itts: Vec<u32> = (0..3).map(|_| fx.send_inquiry()).collect();
    fx.run(50);
    assert_eq!(fx.ops.deferred.len(), 2, "only two had buffers");
    assert_eq!(fx.conn.stats().buffer_waits, 1);
    assert_eq!(fx.conn.tasks_in_flight(), 3);
    assert!(responses(&fx.ops).is_empty());
    assert_eq!(pool.available() + fx.conn.core_ctx().cached_buffers(), 0);
    // A write whose immediate data cannot be kept anywhere: TASK SET FULL
    // at once (SCSI back-pressure), no data lost in a wait.
    let data = pattern(5, 512);
    let (rsp, sense, _) = fx.cmd(&rw10(0x2A, 0, 9, 1), 512, Some(&data), 512);
    assert_eq!((rsp.status, sense), (sense::TASK_SET_FULL, None));
    assert_eq!(fx.conn.stats().task_set_full, 1);
    // The first WRITE completes: its task answers and frees its buffer,
    // which goes to the waiting INQUIRY.
    let first = fx.ops.deferred[0];
    fx.conn.data_done(first, true, &mut fx.ops);
    fx.run(10);
    assert_eq!(fx.ops.deferred.len(), 3, "the waiting command ran");
    for k in 1..3 {
        let t = fx.ops.deferred[k];
        fx.conn.data_done(t, true, &mut fx.ops);
    }
    let got: Vec<(u32, u8)> = responses(&fx.ops)
        .into_iter()
        .filter(|(itt, _)| itts.contains(itt))
        .collect();
    assert_eq!(got, itts.iter().map(|&i| (i, 0)).collect::<Vec<_>>());
    assert_eq!(fx.conn.tasks_in_flight(), 0);
    // The write goes through now.
    fx.ops.defer_writes = false;
    let (rsp, _, _) = fx.cmd(&rw10(0x2A, 0, 9, 1), 512, Some(&data), 512);
    assert_eq!(rsp.status, 0);
    assert_eq!(fx.cmd(&rw10(0x28, 0, 9, 1), 512, None, 0).2, data);
    assert_eq!(pool.available() + fx.conn.core_ctx().cached_buffers(), 2);
    // The connection (and with it the core's cache) goes: all back.
    drop(fx.conn);
    assert_eq!(pool.available(), 2);
}

#[test]
fn commands_take_buffers_from_the_core_cache_not_the_shared_pool() {
    let mut fx = fixture(true);
    fx.login(INI, "Normal");
    let pool = fx.target.pool().clone();
    for _ in 0..50 {
        let (rsp, _, d) = fx.cmd(&[0x12, 0, 0, 0, 36, 0], 36, None, 0);
        assert_eq!((rsp.status, &d[8..14]), (0, &b"POLLUX"[..]));
    }
    let st = fx.conn.core_ctx().cache_stats();
    assert!(st.gets >= 50, "{st:?}");
    // One batch came over from the shared pool; every command after that
    // reused what the previous one gave back to this core's cache.
    assert!(st.refills <= 1 && st.drains == 0, "{st:?}");
    assert_eq!(
        pool.available() + fx.conn.core_ctx().cached_buffers(),
        pool.count()
    );
    drop(fx.conn);
    assert_eq!(pool.available(), pool.count());
}
