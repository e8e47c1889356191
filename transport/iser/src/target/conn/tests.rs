//! The connection core driven through an in-process [`ConnOps`] that plays
//! the initiator's memory: login, discovery, every SCSI path on malloc
//! bdevs with data verification, T10 PI with injected corruption, the CmdSN
//! window, NOP, TMF and logout.

use std::collections::HashMap;

use pollux_bdev::{BdevRegistry, CompletedIo};
use pollux_reactor::TestCluster;

use super::*;
use crate::pdu::text::parse_text;
use crate::pdu::{LoginFlags, LoginRequest, Stage, TaskAttr};
use crate::session::{SessionParams, TargetLimits};
use crate::target::{PortalGroup, TargetNode, TargetOptions};

const TGT: &str = "iqn.2024-01.io.pollux:disk";
const INI: &str = "iqn.2024-01.io.pollux:host";

#[derive(Default)]
struct Fake {
    sent: Vec<(Vec<u8>, Option<u32>)>,
    mem: HashMap<u32, Vec<u8>>,
    closed: bool,
    /// Closed by `abort` (without waiting for queued sends).
    aborted: bool,
    /// Closed by `close_after_logout` (the initiator closes).
    logged_out: bool,
    /// Refuse every send (no send slot free).
    refuse_sends: bool,
    reads: usize,
    /// Answer Data-In WRITEs with `Pending` (like the iSER transport) and
    /// record the task; the test completes them with `data_done`.
    defer_writes: bool,
    deferred: Vec<u16>,
}

impl ConnOps for Fake {
    fn send_pdu(&mut self, bhs: &[u8; BHS_LEN], data: &[u8], inv: Option<u32>) -> bool {
        if self.refuse_sends {
            return false;
        }
        let mut v = bhs.to_vec();
        v.extend_from_slice(data);
        self.sent.push((v, inv));
        true
    }
    fn read_data(&mut self, _t: u16, from: Stag, buf: &DmaBuf, off: usize, len: usize) -> Transfer {
        self.reads += 1;
        let src = &self.mem[&from.stag][from.va as usize..from.va as usize + len];
        buf.arena()
            .copy_in(buf.arena_offset() + off, src)
            .expect("copy in");
        Transfer::Done
    }
    fn write_data(&mut self, _t: u16, to: Stag, buf: &DmaBuf, len: usize) -> Transfer {
        let dst = self.mem.entry(to.stag).or_default();
        let end = to.va as usize + len;
        if dst.len() < end {
            dst.resize(end, 0);
        }
        dst[to.va as usize..end].copy_from_slice(&buf.as_slice()[..len]);
        if self.defer_writes {
            self.deferred.push(_t);
            return Transfer::Pending;
        }
        Transfer::Done
    }
    fn close(&mut self) {
        self.closed = true;
    }
    fn close_after_logout(&mut self) {
        self.closed = true;
        self.logged_out = true;
    }
    fn abort(&mut self) {
        self.closed = true;
        self.aborted = true;
    }
}

struct Fx {
    cl: TestCluster,
    target: Arc<IscsiTarget>,
    conn: Connection,
    ops: Fake,
    cmd_sn: u32,
    itt: u32,
    pi_bdev: Arc<pollux_bdev::Bdev>,
}

fn fixture(send_with_inv: bool) -> Fx {
    fixture_with(send_with_inv, small_target())
}

/// The fixtures' target options: 4 tasks, 64 KiB I/Os, 16 task buffers.
fn small_target() -> TargetOptions {
    TargetOptions {
        limits: TargetLimits {
            queue_depth: 4,
            ..TargetLimits::default()
        },
        max_io_bytes: 64 * 1024,
        task_buffers: 16,
    }
}

fn fixture_with(send_with_inv: bool, opts: TargetOptions) -> Fx {
    let reg = BdevRegistry::new();
    let plain = reg
        .create("malloc:size=4M,block=512,name=plain")
        .expect("bdev");
    let pi_bdev = reg
        .create("malloc:size=4M,block=512,md=8,md_interleave=true,pi=1,name=pi")
        .expect("pi bdev");
    let luns = vec![(0, plain), (1, pi_bdev.clone())];
    fixture_node(send_with_inv, opts, Some("disk"), luns, pi_bdev)
}

/// A connection to a target whose one node, [`TGT`] (its alias `alias`),
/// maps `luns`; `pi_bdev` is the fixture's PI LU.
fn fixture_node(
    send_with_inv: bool,
    opts: TargetOptions,
    alias: Option<&str>,
    luns: Vec<(u16, Arc<pollux_bdev::Bdev>)>,
    pi_bdev: Arc<pollux_bdev::Bdev>,
) -> Fx {
    let cl = TestCluster::new(1);
    let target = IscsiTarget::new(opts).expect("target");
    target
        .add_portal_group(PortalGroup {
            tag: 1,
            addrs: vec!["@t".into()],
        })
        .expect("pg");
    target
        .add_node(TargetNode {
            name: TGT.into(),
            alias: alias.map(Into::into),
            luns,
            allowed_initiators: vec![INI.into()],
            portal_groups: vec![1],
        })
        .expect("node");
    let conn = cl.on(0, |r| {
        Connection::new(
            &target,
            r,
            ConnParams {
                portal_tag: 1,
                send_with_inv,
                nop: NopPing::default(),
            },
        )
    });
    Fx {
        cl,
        target,
        conn,
        ops: Fake::default(),
        cmd_sn: 1,
        itt: 100,
        pi_bdev,
    }
}

fn login_req(text: &[u8]) -> Vec<u8> {
    login_req_as(text, [0x80, 0, 0, 0, 0, 1], 0)
}

fn login_req_as(text: &[u8], isid: [u8; 6], tsih: u16) -> Vec<u8> {
    let req = LoginRequest {
        flags: LoginFlags {
            transit: true,
            cont: false,
            csg: Stage::Operational,
            nsg: Stage::FullFeature,
        },
        version_max: 0,
        version_min: 0,
        isid,
        tsih,
        itt: 1,
        cid: 0,
        cmd_sn: 1,
        exp_stat_sn: 0,
    };
    let mut v = Bhs::LoginReq(req).encode(0, text.len() as u32).to_vec();
    v.extend_from_slice(text);
    v
}

/// The text of a one-PDU login (open-iscsi's keys).
fn login_text(initiator: &str, session: &str) -> Vec<u8> {
    let mut t = Vec::new();
    push_pair(&mut t, "InitiatorName", initiator);
    push_pair(&mut t, "SessionType", session);
    if session == "Normal" {
        push_pair(&mut t, "TargetName", TGT);
    }
    SessionParams::initiator_offer(&mut t, 262144, 1 << 20, 65536);
    t
}

/// A READ-direction INQUIRY (36 bytes into STag 1) as (header, PDU).
fn inquiry(itt: u32, cmd_sn: u32, immediate: bool) -> (IserHeader, Vec<u8>) {
    let mut c = [0u8; 16];
    c[..6].copy_from_slice(&[0x12, 0, 0, 0, 36, 0]);
    let cmd = ScsiCommand {
        immediate,
        final_: true,
        read: true,
        write: false,
        attr: TaskAttr::Simple,
        lun: Lun::from_index(0),
        itt,
        edtl: 36,
        cmd_sn,
        exp_stat_sn: 0,
        cdb: c,
    };
    let hdr = IserHeader::Control {
        write: None,
        read: Some(Stag { stag: 1, va: 0 }),
    };
    (hdr, Bhs::ScsiCmd(cmd).encode(0, 0).to_vec())
}

/// SCSI Responses among `ops`' PDUs: (ITT, status).
fn responses(ops: &Fake) -> Vec<(u32, u8)> {
    ops.sent
        .iter()
        .filter_map(|(p, _)| match Pdu::parse(p).map(|p| p.bhs) {
            Ok(Bhs::ScsiRsp(r)) => Some((r.itt, r.status)),
            _ => None,
        })
        .collect()
}

impl Fx {
    fn pdu(&mut self, hdr: IserHeader, buf: &[u8]) -> bool {
        self.conn.on_pdu(&hdr, buf, &mut self.ops)
    }

    fn last(&self) -> Pdu<'_> {
        Pdu::parse(&self.ops.sent.last().expect("a PDU").0).expect("valid PDU")
    }

    fn login(&mut self, initiator: &str, session: &str) -> Option<crate::pdu::LoginResponse> {
        let t = login_text(initiator, session);
        let buf = login_req(&t);
        self.pdu(IserHeader::PLAIN, &buf);
        match self.last().bhs {
            Bhs::LoginRsp(r) => Some(r),
            _ => None,
        }
    }

    /// Run a command to its response: (response, sense, data written to stag 1).
    /// Send an immediate Logout Request (`reason`, `cid`, ITT `itt`):
    /// whether the connection is still open.
    fn logout(&mut self, reason: LogoutReason, cid: u16, itt: u32) -> bool {
        let lo = LogoutRequest {
            immediate: true,
            reason,
            itt,
            cid,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
        };
        self.pdu(IserHeader::PLAIN, &Bhs::LogoutReq(lo).encode(0, 0))
    }

    fn cmd(
        &mut self,
        cdb: &[u8],
        edtl: u32,
        write: Option<&[u8]>,
        imm: usize,
    ) -> (ScsiResponse, Option<Sense>, Vec<u8>) {
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        self.itt += 1;
        let cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read: write.is_none() && edtl > 0,
            write: write.is_some(),
            attr: TaskAttr::Simple,
            lun: Lun::from_index(u16::from(cdb_lun(cdb))),
            itt: self.itt,
            edtl,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            cdb: c,
        };
        self.cmd_lun(cmd, write, imm)
    }

    fn cmd_lun(
        &mut self,
        cmd: ScsiCommand,
        write: Option<&[u8]>,
        imm: usize,
    ) -> (ScsiResponse, Option<Sense>, Vec<u8>) {
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.ops.mem.insert(1, vec![0; cmd.edtl as usize]);
        let mut data = Vec::new();
        let hdr = match write {
            Some(w) => {
                data.extend_from_slice(&w[..imm]);
                self.ops.mem.insert(2, w.to_vec());
                IserHeader::Control {
                    write: Some(Stag {
                        stag: 2,
                        va: imm as u64,
                    }),
                    read: None,
                }
            }
            None => IserHeader::Control {
                write: None,
                read: Some(Stag { stag: 1, va: 0 }),
            },
        };
        let mut v = Bhs::ScsiCmd(cmd).encode(0, data.len() as u32).to_vec();
        v.extend_from_slice(&data);
        let before = self.ops.sent.len();
        self.pdu(hdr, &v);
        for _ in 0..10_000 {
            if self.ops.sent.len() > before {
                if let Ok(p) = Pdu::parse(&self.ops.sent[before].0) {
                    if let Bhs::ScsiRsp(r) = p.bhs {
                        let sense = (p.data.len() > 2)
                            .then(|| Sense::parse(&p.data[2..]))
                            .flatten();
                        return (r, sense, self.ops.mem[&1].clone());
                    }
                }
            }
            self.cl.poll_once_all();
            self.conn.poll(&mut self.ops);
        }
        panic!("no response");
    }
}

thread_local! {
    static LUN: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}
fn cdb_lun(_cdb: &[u8]) -> u8 {
    LUN.with(|l| l.get())
}
fn on_lun(l: u8) {
    LUN.with(|c| c.set(l));
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) | 1)
        .collect()
}

fn rw10(opc: u8, protect: u8, lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = opc;
    c[1] = protect << 5;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&blocks.to_be_bytes());
    c
}

mod buffers;
mod extended_cdb;
mod first_burst;
mod fua;
mod nop;
mod pr_in;
mod reinstatement;
mod report_luns;
mod residuals;
mod sbc;
mod send_targets;
mod tmf;
mod unexpected;
mod unmapped_lun;
mod unsolicited;

#[test]
fn login_scan_and_data_round_trip() {
    let mut fx = fixture(true);
    on_lun(0);
    let r = fx.login(INI, "Normal").expect("login response");
    assert_eq!((r.status_class, r.tsih != 0), (0, true));
    assert!(fx.conn.is_full_feature());
    // REPORT LUNS, INQUIRY, READ CAPACITY(16).
    let mut rl = [0u8; 12];
    rl[0] = 0xA0;
    rl[9] = 64;
    let (rsp, _, d) = fx.cmd(&rl, 64, None, 0);
    assert_eq!(rsp.status, 0);
    assert_eq!(&d[..4], &16u32.to_be_bytes());
    assert_eq!(&d[16..18], &[0, 1]);
    assert_eq!(rsp.flags, crate::pdu::scsi::RSP_UNDERFLOW);
    assert_eq!(rsp.residual, 64 - 24);
    let (rsp, _, d) = fx.cmd(&[0x12, 0, 0, 0, 96, 0], 96, None, 0);
    assert_eq!((rsp.status, &d[8..14]), (0, &b"POLLUX"[..]));
    let mut rc = [0u8; 16];
    rc[0] = 0x9E;
    rc[1] = 0x10;
    rc[13] = 32;
    let (_, _, d) = fx.cmd(&rc, 32, None, 0);
    assert_eq!(u64::from_be_bytes(d[..8].try_into().unwrap()), 8191);
    // Write 16 KiB: 4 KiB immediate + RDMA READ of the rest, then read back.
    let data = pattern(3, 16384);
    let (rsp, s, _) = fx.cmd(&rw10(0x2A, 0, 40, 32), 16384, Some(&data), 4096);
    assert_eq!((rsp.status, s), (0, None));
    assert_eq!(fx.ops.reads, 1);
    let (rsp, _, d) = fx.cmd(&rw10(0x28, 0, 40, 32), 16384, None, 0);
    assert_eq!(rsp.status, 0);
    assert_eq!(d, data);
    // The response invalidated the read STag.
    assert_eq!(fx.ops.sent.last().expect("rsp").1, Some(1));
    // A write that is all immediate data needs no RDMA READ.
    let small = pattern(9, 512);
    fx.cmd(&rw10(0x2A, 0, 7, 1), 512, Some(&small), 512);
    assert_eq!(fx.ops.reads, 1);
    assert_eq!(fx.cmd(&rw10(0x28, 0, 7, 1), 512, None, 0).2, small);
    // SYNCHRONIZE CACHE, UNMAP, WRITE SAME(16) zeroes.
    assert_eq!(
        fx.cmd(&[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0, None, 0)
            .0
            .status,
        0
    );
    let mut ws = [0u8; 16];
    ws[0] = 0x93;
    ws[1] = 0x01;
    ws[9] = 40;
    ws[13] = 2;
    assert_eq!(fx.cmd(&ws, 0, None, 0).0.status, 0);
    let d = fx.cmd(&rw10(0x28, 0, 40, 3), 1536, None, 0).2;
    assert!(d[..1024].iter().all(|&b| b == 0));
    assert_eq!(&d[1024..], &data[1024..1536]);
    let mut pl = vec![0u8; 24];
    pl[1] = 22;
    pl[3] = 16;
    pl[15] = 42;
    pl[19] = 1;
    let (rsp, s, _) = fx.cmd(&[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], 24, Some(&pl), 24);
    assert_eq!((rsp.status, s), (0, None));
}

#[test]
fn errors_come_back_as_check_conditions() {
    let mut fx = fixture(false);
    on_lun(0);
    fx.login(INI, "Normal");
    let code = |r: (ScsiResponse, Option<Sense>, Vec<u8>)| {
        assert_eq!(r.0.status, sense::CHECK_CONDITION);
        r.1.expect("sense").code()
    };
    assert_eq!(
        code(fx.cmd(&[0xC1, 0, 0, 0, 0, 0], 0, None, 0)),
        (5, 0x20, 0)
    );
    assert_eq!(
        code(fx.cmd(&[0x12, 0, 0x80, 0, 36, 0], 36, None, 0)),
        (5, 0x24, 0)
    );
    assert_eq!(
        code(fx.cmd(&rw10(0x28, 0, 8190, 8), 4096, None, 0)),
        (5, 0x21, 0)
    );
    assert_eq!(
        code(fx.cmd(&rw10(0x28, 1, 0, 1), 520, None, 0)),
        (5, 0x24, 0),
        "RDPROTECT on a plain LU"
    );
    let data = pattern(1, 1024);
    assert_eq!(
        code(fx.cmd(&rw10(0x2A, 0, 0, 1), 1024, Some(&data), 0)),
        (5, 0x24, 0),
        "EDTL mismatch"
    );
    // Unknown LUN: INQUIRY says "not connected", other commands 25/00.
    on_lun(9);
    let (rsp, _, d) = fx.cmd(&[0x12, 0, 0, 0, 36, 0], 36, None, 0);
    assert_eq!((rsp.status, d[0]), (0, 0x7F));
    assert_eq!(code(fx.cmd(&[0, 0, 0, 0, 0, 0], 0, None, 0)), (5, 0x25, 0));
    // No invalidation was allowed.
    assert!(fx.ops.sent.iter().all(|(_, inv)| inv.is_none()));
    assert!(fx.conn.stats().check_conditions >= 6);
}

#[test]
fn protection_information_paths_and_corruption() {
    let mut fx = fixture(true);
    on_lun(1);
    fx.login(INI, "Normal");
    let mut rc = [0u8; 16];
    rc[0] = 0x9E;
    rc[1] = 0x10;
    rc[13] = 32;
    assert_eq!(fx.cmd(&rc, 32, None, 0).2[12], 0x01, "PROT_EN Type 1");
    // WRPROTECT 000b: the target generates PI; RDPROTECT 000b strips it.
    let data = pattern(5, 4096);
    assert_eq!(
        fx.cmd(&rw10(0x2A, 0, 16, 8), 4096, Some(&data), 0).0.status,
        0
    );
    assert_eq!(fx.cmd(&rw10(0x28, 0, 16, 8), 4096, None, 0).2, data);
    // RDPROTECT 001b: 520-byte blocks with valid tuples (ref tag = LBA).
    let (_, _, d) = fx.cmd(&rw10(0x28, 1, 16, 8), 8 * 520, None, 0);
    assert_eq!(&d[..512], &data[..512]);
    assert_eq!(&d[520 + 516..520 + 520], &17u32.to_be_bytes());
    let p = pollux_pi::PiParams::for_type(pollux_pi::PiType::Type1, 512, 16, 0);
    pollux_pi::verify(pollux_pi::Buffers::Dif(&d), &p).expect("valid PI");
    // WRPROTECT 001b with PI from the initiator.
    let mut wire = d.clone();
    let (rsp, s, _) = fx.cmd(&rw10(0x2A, 1, 16, 8), 8 * 520, Some(&wire), 0);
    assert_eq!((rsp.status, s), (0, None));
    // A bad guard from the initiator: ABORTED COMMAND 10/01 at that LBA.
    wire[3 * 520 + 10] ^= 0x40;
    let (_, s, _) = fx.cmd(&rw10(0x2A, 1, 16, 8), 8 * 520, Some(&wire), 0);
    let s = s.expect("sense");
    assert_eq!((s.code(), s.info), ((0xB, 0x10, 0x01), Some(19)));
    // A bad ref tag: 10/03; with WRPROTECT 011b nothing is checked.
    let mut wire = d.clone();
    wire[2 * 520 + 519] ^= 1;
    assert_eq!(
        fx.cmd(&rw10(0x2A, 1, 16, 8), 8 * 520, Some(&wire), 0)
            .1
            .expect("sense")
            .code(),
        (0xB, 0x10, 0x03)
    );
    assert_eq!(
        fx.cmd(&rw10(0x2A, 3, 16, 8), 8 * 520, Some(&wire), 0)
            .0
            .status,
        0
    );
    // Now the medium holds a bad ref tag at LBA 18: a checked read fails,
    // an unchecked one passes.
    let s = fx
        .cmd(&rw10(0x28, 0, 16, 8), 4096, None, 0)
        .1
        .expect("sense");
    assert_eq!((s.code(), s.info), ((0xB, 0x10, 0x03), Some(18)));
    assert_eq!(fx.cmd(&rw10(0x28, 3, 16, 8), 8 * 520, None, 0).0.status, 0);
    // Corrupt the medium behind the target's back (data of LBA 20).
    let corrupt = fx.cl.on(0, |r| {
        let ch = fx
            .pi_bdev
            .open(true)
            .expect("open")
            .channel(r)
            .expect("channel");
        let mut b = DmaBuf::alloc(520).expect("buf");
        b.as_mut_slice().copy_from_slice(&d[4 * 520..5 * 520]);
        b.as_mut_slice()[100] ^= 0xFF;
        let done: Rc<RefCell<Option<IoStatus>>> = Rc::default();
        let d2 = done.clone();
        let cb: Rc<dyn IoCompletion> =
            Rc::new(move |io: CompletedIo| *d2.borrow_mut() = Some(io.status()));
        ch.write(20, 1, SgList::from_buf(b), &cb, 0)
            .expect("submit");
        done
    });
    fx.cl.poll_until_idle().expect("settle");
    assert_eq!(*corrupt.borrow(), Some(Ok(())));
    let s = fx
        .cmd(&rw10(0x28, 1, 20, 1), 520, None, 0)
        .1
        .expect("sense");
    assert_eq!((s.code(), s.info), ((0xB, 0x10, 0x01), Some(20)));
    assert!(fx.conn.stats().pi_errors >= 4);
}

#[test]
fn window_nop_text_tmf_logout() {
    let mut fx = fixture(false);
    on_lun(0);
    let r = fx.login(INI, "Normal").expect("rsp");
    assert_eq!(r.max_cmd_sn, 4);
    // NOP-Out ping answered with the same ITT.
    let nop = NopOut {
        immediate: true,
        lun: Lun::default(),
        itt: 77,
        ttt: RESERVED_TAG,
        cmd_sn: fx.cmd_sn,
        exp_stat_sn: 0,
    };
    fx.pdu(IserHeader::PLAIN, &Bhs::NopOut(nop).encode(0, 0));
    let Bhs::NopIn(n) = fx.last().bhs else {
        panic!()
    };
    assert_eq!(
        (n.itt, n.ttt, n.exp_cmd_sn, n.max_cmd_sn),
        (77, RESERVED_TAG, 1, 4)
    );
    // Out-of-window CmdSN is dropped (no response).
    let before = fx.ops.sent.len();
    fx.cmd_sn = 50;
    let mut c = [0u8; 16];
    let cmd = ScsiCommand {
        immediate: false,
        final_: true,
        read: false,
        write: false,
        attr: TaskAttr::Simple,
        lun: Lun::default(),
        itt: 5,
        edtl: 0,
        cmd_sn: 50,
        exp_stat_sn: 0,
        cdb: c,
    };
    fx.pdu(IserHeader::PLAIN, &Bhs::ScsiCmd(cmd).encode(0, 0));
    assert_eq!(fx.ops.sent.len(), before);
    fx.cmd_sn = 1;
    c[0] = 0;
    assert_eq!(fx.cmd(&c[..6], 0, None, 0).0.exp_cmd_sn, 2);
    // SendTargets on a normal session.
    let mut t = Vec::new();
    push_pair(&mut t, "SendTargets", "All");
    let tp = TextPdu {
        immediate: true,
        final_: true,
        itt: 9,
        ttt: RESERVED_TAG,
        sn: fx.cmd_sn,
        ..Default::default()
    };
    let mut v = Bhs::TextReq(tp).encode(0, t.len() as u32).to_vec();
    v.extend_from_slice(&t);
    fx.pdu(IserHeader::PLAIN, &v);
    let p = fx.last();
    let keys = parse_text(p.data).expect("text");
    assert_eq!(keys, vec![("TargetName", TGT), ("TargetAddress", "@t,1")]);
    // TMF: abort of an unknown task.
    let tmf = TmfRequest {
        immediate: true,
        function: TmfFunction::AbortTask,
        lun: Lun::default(),
        itt: 10,
        ref_task_tag: 1234,
        cmd_sn: fx.cmd_sn,
        exp_stat_sn: 0,
        ref_cmd_sn: 0,
        exp_data_sn: 0,
    };
    fx.pdu(IserHeader::PLAIN, &Bhs::TmfReq(tmf).encode(0, 0));
    let Bhs::TmfRsp(t) = fx.last().bhs else {
        panic!()
    };
    assert_eq!(t.response, tmf_response::NO_TASK);
    // A malformed PDU is rejected with the BHS echoed.
    let mut bad = Bhs::NopOut(nop).encode(0, 0);
    bad[1] = 0;
    fx.pdu(IserHeader::PLAIN, &bad);
    let p = fx.last();
    assert!(matches!(
        p.bhs,
        Bhs::Reject(Reject {
            reason: reject_reason::INVALID_PDU_FIELD,
            ..
        })
    ));
    assert_eq!(p.data, &bad[..]);
    // Logout closes.
    assert!(!fx.logout(LogoutReason::CloseSession, 0, 11));
    assert!(matches!(
        fx.last().bhs,
        Bhs::LogoutRsp(LogoutResponse { response: 0, .. })
    ));
    // An orderly logout: the transport leaves the disconnect to the
    // initiator (not `close`, not `abort`).
    assert!(fx.ops.closed && fx.ops.logged_out && !fx.ops.aborted);
    assert!(fx.conn.is_closed());
    let _ = &fx.target;
}

/// A Logout whose response cannot be sent closes as an error does (there
/// is no response for the initiator to act on); a protocol error never
/// takes the logout path.
#[test]
fn logout_without_a_response_and_errors_close_at_once() {
    let mut fx = fixture(false);
    fx.login(INI, "Normal");
    fx.ops.refuse_sends = true;
    assert!(!fx.logout(LogoutReason::CloseSession, 0, 11));
    assert!(fx.ops.closed && !fx.ops.logged_out);
    // A non-login PDU during login: closed, not as a logout.
    let mut fx = fixture(false);
    let nop = NopOut {
        immediate: true,
        lun: Lun::default(),
        itt: 1,
        ttt: RESERVED_TAG,
        cmd_sn: 1,
        exp_stat_sn: 0,
    };
    assert!(!fx.pdu(IserHeader::PLAIN, &Bhs::NopOut(nop).encode(0, 0)));
    assert!(fx.ops.closed && !fx.ops.logged_out);
}

/// Logout reasons on a session of one connection at ErrorRecoveryLevel 0:
/// closing another connection's CID finds none and removing a connection
/// for recovery is not supported (each answered, the connection carries
/// on); closing this connection by its own CID (the login's, 0) succeeds.
#[test]
fn logout_reasons_and_cids() {
    let mut fx = fixture(false);
    fx.login(INI, "Normal");
    let mut itt = 20;
    let mut logout = |fx: &mut Fx, reason, cid| {
        itt += 1;
        let alive = fx.logout(reason, cid, itt);
        let Bhs::LogoutRsp(r) = fx.last().bhs else {
            panic!("no logout response")
        };
        assert_eq!(r.itt, itt);
        (alive, r.response)
    };
    assert_eq!(
        logout(&mut fx, LogoutReason::CloseConnection, 7),
        (true, logout_response::CID_NOT_FOUND)
    );
    assert_eq!(
        logout(&mut fx, LogoutReason::RemoveForRecovery, 0),
        (true, logout_response::RECOVERY_NOT_SUPPORTED)
    );
    assert!(!fx.ops.closed && !fx.conn.is_closed());
    // Still in full feature phase: a command is served (RESERVE(6)).
    on_lun(0);
    assert_eq!(fx.cmd(&[0x16, 0, 0, 0, 0, 0], 0, None, 0).0.response, 0);
    let lu = fx.target.lun_shared(TGT, 0);
    let other = crate::scsi::reservation::ItNexus {
        initiator: "iqn.2024-01.io.pollux:other".into(),
        ..Default::default()
    };
    assert_eq!(
        lu.lock().access(&other),
        crate::scsi::reservation::Access::Reserved6
    );
    assert_eq!(fx.target.live_sessions(), 1);
    assert_eq!(
        logout(&mut fx, LogoutReason::CloseConnection, 0),
        (false, logout_response::SUCCESS)
    );
    assert!(fx.ops.logged_out && fx.conn.is_closed());
    // The session ended with its logout: its reservation and its place in
    // the session table with it, while the connection still waits for the
    // initiator to disconnect.
    assert_eq!(
        lu.lock().access(&other),
        crate::scsi::reservation::Access::All
    );
    assert_eq!(fx.target.live_sessions(), 0);
    assert_eq!(fx.conn.tsih(), None);
}

#[test]
fn acl_discovery_and_login_failures() {
    let mut fx = fixture(false);
    let r = fx
        .login("iqn.2024-01.io.pollux:intruder", "Normal")
        .expect("rsp");
    assert_eq!((r.status_class, r.status_detail), (2, 2));
    assert!(fx.ops.closed && fx.conn.is_closed());
    let mut fx = fixture(false);
    let r = fx
        .login("iqn.2024-01.io.pollux:anyone", "Discovery")
        .expect("rsp");
    assert_eq!(r.status_class, 0);
    // The discovery list hides nodes the initiator may not use.
    let mut t = Vec::new();
    push_pair(&mut t, "SendTargets", "All");
    let tp = TextPdu {
        immediate: false,
        final_: true,
        itt: 9,
        ttt: RESERVED_TAG,
        sn: 1,
        ..Default::default()
    };
    let mut v = Bhs::TextReq(tp).encode(0, t.len() as u32).to_vec();
    v.extend_from_slice(&t);
    fx.pdu(IserHeader::PLAIN, &v);
    assert!(fx.last().data.is_empty());
    // SCSI commands on a discovery session are rejected.
    let cmd = ScsiCommand {
        immediate: false,
        final_: true,
        read: false,
        write: false,
        attr: TaskAttr::Simple,
        lun: Lun::default(),
        itt: 5,
        edtl: 0,
        cmd_sn: 2,
        exp_stat_sn: 0,
        cdb: [0; 16],
    };
    fx.pdu(IserHeader::PLAIN, &Bhs::ScsiCmd(cmd).encode(0, 0));
    assert!(matches!(fx.last().bhs, Bhs::Reject(_)));
    // A non-login PDU during login closes the connection.
    let mut fx = fixture(false);
    fx.pdu(IserHeader::PLAIN, &Bhs::ScsiCmd(cmd).encode(0, 0));
    assert!(fx.ops.closed);
}

#[test]
fn data_in_task_waits_for_its_write_completion() {
    let mut fx = fixture(true);
    fx.login(INI, "Normal");
    fx.ops.defer_writes = true;
    // Two INQUIRYs on the same connection while the first WRITE is in
    // flight: the second must get another task (buffer), and neither
    // response may go out before its WRITE completed.
    let mut itts = Vec::new();
    for _ in 0..2 {
        fx.itt += 1;
        let mut c = [0u8; 16];
        c[..6].copy_from_slice(&[0x12, 0, 0, 0, 36, 0]);
        let cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read: true,
            write: false,
            attr: TaskAttr::Simple,
            lun: Lun::from_index(0),
            itt: fx.itt,
            edtl: 36,
            cmd_sn: fx.cmd_sn,
            exp_stat_sn: 0,
            cdb: c,
        };
        fx.cmd_sn += 1;
        itts.push(fx.itt);
        let v = Bhs::ScsiCmd(cmd).encode(0, 0).to_vec();
        let hdr = IserHeader::Control {
            write: None,
            read: Some(Stag { stag: 1, va: 0 }),
        };
        assert!(fx.pdu(hdr, &v));
    }
    for _ in 0..100 {
        fx.cl.poll_once_all();
        fx.conn.poll(&mut fx.ops);
    }
    let responses = |ops: &Fake| {
        ops.sent
            .iter()
            .filter(|(p, _)| matches!(Pdu::parse(p).map(|p| p.bhs), Ok(Bhs::ScsiRsp(_))))
            .count()
    };
    assert_eq!(fx.ops.deferred.len(), 2, "both WRITEs posted");
    assert_ne!(
        fx.ops.deferred[0], fx.ops.deferred[1],
        "a busy task was reused"
    );
    assert_eq!(responses(&fx.ops), 0, "a response went out before its data");
    assert_eq!(fx.conn.tasks_in_flight(), 2);
    let first = fx.ops.deferred[0];
    fx.conn.data_done(first, true, &mut fx.ops);
    assert_eq!(responses(&fx.ops), 1);
    let second = fx.ops.deferred[1];
    fx.conn.data_done(second, false, &mut fx.ops);
    assert_eq!(responses(&fx.ops), 2);
    assert_eq!(fx.conn.tasks_in_flight(), 0);
    // A failed WRITE is reported, not GOOD.
    let last = fx
        .ops
        .sent
        .last()
        .map(|(p, _)| p.clone())
        .unwrap_or_default();
    let Ok(Pdu {
        bhs: Bhs::ScsiRsp(r),
        ..
    }) = Pdu::parse(&last)
    else {
        panic!("last PDU is not a response");
    };
    assert_eq!((r.itt, r.status), (itts[1], 2));
}
