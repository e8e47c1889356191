//! A minimal NVMe/RDMA test host built straight on verbs (soft provider):
//! CM connect with NVMe private data, SEND capsules, 16-byte response
//! receives, and one registered memory region the target READs from and
//! WRITEs to.

use pollux_reactor::mem::DmaBuf;
use pollux_reactor::TestCluster;
use pollux_verbs::soft::{Soft, SoftCmId, SoftCq, SoftDevice, SoftMr, SoftPd, SoftQp};
use pollux_verbs::{
    Access, CmAddr, CmEvent, CmId, CompletionQueue, ConnParam, Device, MemoryRegion,
    ProtectionDomain, Provider, QpAttr, QpCaps, QpInit, QpState, QueuePair, RecvWr, SendOp, SendWr,
    Sge, Wc, WcFlags, WcOpcode, WcStatus, WrId,
};

use crate::spec::cmd::{NvmeCmd, SQE_SIZE};
use crate::spec::connect::{ConnectCmd, ConnectData, CNTLID_DYNAMIC};
use crate::spec::cpl::NvmeCompletion;
use crate::spec::rdma_cm::{CmReject, CmRejectStatus, CmRequest};
use crate::spec::sgl::SglDescriptor;

pub(crate) const HOSTNQN: &str =
    "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
/// Bytes of one capsule slot (SQE + 16 KiB in-capsule data).
const CAP_SLOT: usize = SQE_SIZE + 16384;
const CAP_SLOTS: usize = 4;
const RSP_OFF: usize = CAP_SLOTS * CAP_SLOT;
const RSP_SLOTS: usize = 256;
/// Where the data area starts.
pub(crate) const DATA_OFF: usize = RSP_OFF + RSP_SLOTS * 16;
pub(crate) const DATA_LEN: usize = 512 * 1024;
const SPINS: usize = 200_000;

/// One response as the host saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rsp {
    pub(crate) cpl: NvmeCompletion,
    /// The rkey the target invalidated (SEND_WITH_INV), if any.
    pub(crate) invalidated: Option<u32>,
}

pub(crate) struct Host {
    pub(crate) qp: SoftQp,
    pub(crate) id: Option<SoftCmId>,
    cq: SoftCq,
    pub(crate) mem: DmaBuf,
    pub(crate) mr: SoftMr,
    /// A fast-registration MR: keys the target may invalidate.
    fr: SoftMr,
    reg_done: bool,
    pd: SoftPd,
    dev: SoftDevice,
    depth: u16,
    next_cap: usize,
    pub(crate) rsps: std::collections::VecDeque<Rsp>,
}

/// Poll the cluster and `f` until `f` answers (bounded).
pub(crate) fn spin<T>(cl: &TestCluster, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    for _ in 0..SPINS {
        cl.poll_once_all();
        if let Some(v) = f() {
            return Some(v);
        }
    }
    None
}

/// How a connect attempt ended.
#[derive(Debug)]
pub(crate) enum ConnectOutcome {
    Connected(Host),
    Rejected(Option<CmRejectStatus>),
}

impl Host {
    /// Connect a queue with raw private data.
    pub(crate) fn connect_raw(
        cl: &TestCluster,
        addr: &str,
        private: &[u8],
        depth: u16,
    ) -> ConnectOutcome {
        let dev = Soft::open_device("soft0").expect("device");
        let pd = dev.alloc_pd().expect("pd");
        let cq = dev.create_cq(4 * u32::from(depth) + 64).expect("cq");
        let qp = pd
            .create_qp(&QpInit {
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps: QpCaps {
                    max_send_wr: u32::from(depth) + 8,
                    max_recv_wr: u32::from(depth.max(16)) + 8,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 64,
                },
                sq_sig_all: false,
            })
            .expect("qp");
        let mem = DmaBuf::alloc(DATA_OFF + DATA_LEN).expect("host memory");
        let arena = mem.arena().clone();
        let mr = pd
            .reg_mr(
                &arena,
                0,
                arena.len(),
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
            .expect("mr");
        qp.modify(&QpAttr::to(QpState::Init)).expect("init");
        let fr = pd.alloc_fast_reg_mr(8).expect("fast-reg mr");
        let mut h = Host {
            qp,
            id: None,
            cq,
            mem,
            mr,
            fr,
            reg_done: false,
            pd,
            dev,
            depth,
            next_cap: 0,
            rsps: Default::default(),
        };
        for i in 0..usize::from(depth.max(16)) {
            h.post_rsp_recv(i);
        }
        let mut p = ConnParam::with_data(private);
        p.initiator_depth = 0;
        let id = h
            .dev
            .connect(&CmAddr::new(addr), &h.qp, &p)
            .expect("connect");
        let ev = spin(cl, || id.get_event().ok().flatten()).expect("a CM event");
        match ev {
            CmEvent::Established { .. } => {
                h.id = Some(id);
                ConnectOutcome::Connected(h)
            }
            CmEvent::Rejected { private_data, .. } => ConnectOutcome::Rejected(
                CmReject::parse(private_data.as_bytes())
                    .ok()
                    .map(|r| r.status),
            ),
            e => panic!("unexpected CM event {e:?}"),
        }
    }

    /// Connect queue `qid` with `depth` entries and valid private data.
    pub(crate) fn connect(cl: &TestCluster, addr: &str, qid: u16, depth: u16) -> Host {
        let req = CmRequest {
            recfmt: 0,
            qid,
            hrqsize: depth,
            hsqsize: depth - 1,
            cntlid: 0,
        };
        match Host::connect_raw(cl, addr, &req.encode(), depth) {
            ConnectOutcome::Connected(h) => h,
            ConnectOutcome::Rejected(s) => panic!("rejected: {s:?}"),
        }
    }

    fn addr(&self, off: usize) -> u64 {
        self.mr.addr() + (self.mem.arena_offset() + off) as u64
    }

    fn post_rsp_recv(&self, i: usize) {
        let sge = [Sge {
            addr: self.addr(RSP_OFF + i * 16),
            length: 16,
            lkey: self.mr.lkey(),
        }];
        self.qp
            .post_recv(&[RecvWr {
                wr_id: WrId(i as u64),
                sg_list: &sge,
            }])
            .expect("post recv");
    }

    /// A keyed SGL over `len` bytes at `off` of the data area.
    pub(crate) fn keyed(&self, off: usize, len: u32, invalidate: bool) -> SglDescriptor {
        SglDescriptor::keyed(self.addr(DATA_OFF + off), len, self.mr.rkey(), invalidate)
            .expect("sgl")
    }

    /// Fast-register `len` bytes at `off` of the data area under a fresh
    /// key and return a keyed SGL asking the target to invalidate it.
    pub(crate) fn keyed_inv(
        &mut self,
        cl: &TestCluster,
        off: usize,
        len: u32,
    ) -> (SglDescriptor, u32) {
        const IOVA: u64 = 0x1000_0000;
        let key = self.fr.next_key();
        let pages = [Sge {
            addr: self.addr(DATA_OFF + off),
            length: len,
            lkey: self.mr.lkey(),
        }];
        let op = SendOp::RegMr {
            key,
            iova: IOVA,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        };
        self.reg_done = false;
        self.qp
            .post_send(&[SendWr::new(WrId(7777), op, &pages).signaled()])
            .expect("post reg");
        spin(cl, || {
            self.poll();
            self.reg_done.then_some(())
        })
        .expect("registration");
        (
            SglDescriptor::keyed(IOVA, len, key, true).expect("sgl"),
            key,
        )
    }

    pub(crate) fn data(&self, off: usize, len: usize) -> &[u8] {
        &self.mem.as_slice()[DATA_OFF + off..DATA_OFF + off + len]
    }

    pub(crate) fn data_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        &mut self.mem.as_mut_slice()[DATA_OFF + off..DATA_OFF + off + len]
    }

    /// Send a command capsule (SQE + in-capsule data), not waiting.
    pub(crate) fn send(&mut self, cmd: &NvmeCmd, icd: &[u8]) {
        let slot = self.next_cap;
        self.next_cap = (self.next_cap + 1) % CAP_SLOTS;
        let off = slot * CAP_SLOT;
        let b = self.mem.as_mut_slice();
        b[off..off + SQE_SIZE].copy_from_slice(&cmd.encode());
        b[off + SQE_SIZE..off + SQE_SIZE + icd.len()].copy_from_slice(icd);
        let sge = [Sge {
            addr: self.addr(off),
            length: (SQE_SIZE + icd.len()) as u32,
            lkey: self.mr.lkey(),
        }];
        self.qp
            .post_send(&[SendWr::new(WrId(1000 + slot as u64), SendOp::Send, &sge)])
            .expect("post send");
    }

    /// Send a malformed capsule: the first `len` (< 64) bytes of an SQE.
    pub(crate) fn send_short(&mut self, len: usize) {
        let slot = self.next_cap;
        self.next_cap = (self.next_cap + 1) % CAP_SLOTS;
        let off = slot * CAP_SLOT;
        self.mem.as_mut_slice()[off..off + len].fill(0xA5);
        let sge = [Sge {
            addr: self.addr(off),
            length: len as u32,
            lkey: self.mr.lkey(),
        }];
        self.qp
            .post_send(&[SendWr::new(WrId(1000 + slot as u64), SendOp::Send, &sge)])
            .expect("post send");
    }

    /// Send `len` bytes of the data area from `off` as one capsule, not
    /// waiting: a capsule of any length, longer than a receive buffer too.
    pub(crate) fn send_from_data(&mut self, off: usize, len: usize) {
        let sge = [Sge {
            addr: self.addr(DATA_OFF + off),
            length: len as u32,
            lkey: self.mr.lkey(),
        }];
        self.qp
            .post_send(&[SendWr::new(WrId(2000), SendOp::Send, &sge)])
            .expect("post send");
    }

    /// Reap completions; responses go to `rsps`. `false` on a dead queue.
    pub(crate) fn poll(&mut self) -> bool {
        let mut wcs = [Wc::default(); 32];
        let Ok(n) = self.cq.poll(&mut wcs) else {
            return false;
        };
        let mut alive = true;
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                alive = false;
                continue;
            }
            if wc.opcode == WcOpcode::RegMr {
                self.reg_done = true;
            }
            if wc.opcode == WcOpcode::Recv {
                let i = wc.wr_id.0 as usize;
                let raw = &self.mem.as_slice()[RSP_OFF + i * 16..RSP_OFF + i * 16 + 16];
                let cpl = NvmeCompletion::parse(raw).expect("cqe");
                let invalidated = wc.flags.contains(WcFlags::WITH_INV).then_some(wc.imm);
                self.rsps.push_back(Rsp { cpl, invalidated });
                if i < usize::from(self.depth.max(16)) {
                    self.post_rsp_recv(i);
                }
            }
        }
        alive
    }

    /// Send and wait for the response to `cmd`.
    pub(crate) fn exec(&mut self, cl: &TestCluster, cmd: &NvmeCmd, icd: &[u8]) -> Rsp {
        self.send(cmd, icd);
        let cid = cmd.cid;
        spin(cl, || {
            self.poll();
            let i = self.rsps.iter().position(|r| r.cpl.cid == cid)?;
            self.rsps.remove(i)
        })
        .expect("a response")
    }

    /// Fabrics Connect on this queue (admin: data via keyed SGL; I/O: in capsule).
    pub(crate) fn fabrics_connect(
        &mut self,
        cl: &TestCluster,
        qid: u16,
        subnqn: &str,
        cntlid: u16,
    ) -> NvmeCompletion {
        let data = ConnectData {
            hostid: [7; 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: HOSTNQN.into(),
        }
        .encode();
        let mut cmd = ConnectCmd {
            recfmt: 0,
            qid,
            sqsize: self.depth - 1,
            cattr: 0,
            kato: if qid == 0 { 30_000 } else { 0 },
        }
        .to_cmd(1);
        if qid == 0 {
            self.data_mut(0, data.len()).copy_from_slice(&data);
            cmd.set_sgl(&self.keyed(0, data.len() as u32, false));
            self.exec(cl, &cmd, &[]).cpl
        } else {
            cmd.set_sgl(&SglDescriptor::in_capsule(0, data.len() as u32));
            self.exec(cl, &cmd, &data).cpl
        }
    }

    /// Drop the host's end abruptly (no CM disconnect first).
    pub(crate) fn kill(self) {
        if let Some(id) = &self.id {
            id.kill();
        }
        drop(self);
    }

    #[allow(dead_code)]
    pub(crate) fn pd(&self) -> &SoftPd {
        &self.pd
    }
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Host(qp {})", self.qp.qp_num())
    }
}

/// Unused-CNTLID helper for admin connects.
pub(crate) const DYNAMIC: u16 = CNTLID_DYNAMIC;
