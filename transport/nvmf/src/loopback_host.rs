//! A small in-process host driver over the loopback transport, for tests,
//! fuzzing and examples: it builds capsules (SQE + SGL + in-capsule data),
//! registers host memory for keyed SGLs, matches completions by CID, and
//! runs the usual fabrics sequences (Connect, enable, Number of Queues).
//!
//! It is not the NVMe-oF host (that lives in `host/`): it allocates freely
//! and knows nothing about retries or reconnects.
//!
//! Driving: the target runs on reactors, so every synchronous helper takes
//! a `drive` closure that runs them until nothing is left to do (with a
//! `TestCluster`: `&|| { cluster.poll_until_idle().unwrap(); }`).

use std::collections::HashMap;
use std::sync::Arc;

use pollux_reactor::Reactor;

use crate::spec::cmd::{NvmeCmd, SQE_SIZE};
use crate::spec::connect::{ConnectCmd, ConnectData, CNTLID_DYNAMIC};
use crate::spec::cpl::NvmeCompletion;
use crate::spec::features::{fid, FeatureCmd};
use crate::spec::property::{ofst, Cc, Csts, PropertyCmd, PropertySize};
use crate::spec::sgl::SglDescriptor;
use crate::spec::transport_id::TransportId;
use crate::spec::WireError;
use crate::target::{
    LoopbackEndpoint, LoopbackQueueOptions, LoopbackTransport, Target, TransportError,
};

/// A host driver failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The transport refused.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A structure could not be built.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The command got no completion after driving the target.
    #[error("no completion for cid {0}")]
    NoCompletion(u16),
    /// A command completed with an error status.
    #[error("command failed: {0:?}")]
    Failed(NvmeCompletion),
    /// The controller did not become ready.
    #[error("controller not ready: {0:?}")]
    NotReady(Csts),
}

/// The data of a command, from the host's side.
#[derive(Debug, Clone, Copy)]
pub enum HostData<'a> {
    /// No data (null keyed SGL).
    None,
    /// Host-to-controller data in registered host memory (keyed SGL).
    Write(&'a [u8]),
    /// Host-to-controller data in the capsule (offset SGL).
    InCapsule(&'a [u8]),
    /// Controller-to-host data: a host buffer of this many bytes (keyed SGL).
    Read(u32),
}

/// A finished command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// The completion.
    pub cpl: NvmeCompletion,
    /// The host buffer of a keyed command, after the command.
    pub data: Option<Vec<u8>>,
    /// Whether the target invalidated the buffer's key (SEND_WITH_INV).
    pub key_invalidated: bool,
}

impl Completed {
    /// `Ok(self)` on success, else [`HostError::Failed`].
    ///
    /// # Errors
    ///
    /// [`HostError::Failed`] for an error status.
    pub fn ok(self) -> Result<Completed, HostError> {
        if self.cpl.status.is_success() {
            Ok(self)
        } else {
            Err(HostError::Failed(self.cpl))
        }
    }
}

/// One host queue over a loopback endpoint.
#[derive(Debug)]
pub struct HostQueue {
    ep: LoopbackEndpoint,
    next_cid: u16,
    keys: HashMap<u16, u32>,
    done: HashMap<u16, Completed>,
    unmatched: Vec<NvmeCompletion>,
    /// Ask for remote invalidation on keyed SGLs (SGL id 0x4F, Linux's default).
    pub invalidate: bool,
    /// The controller id after a successful Connect.
    pub cntlid: Option<u16>,
}

impl HostQueue {
    /// A host queue on `ep`.
    pub fn new(ep: LoopbackEndpoint) -> Self {
        HostQueue {
            ep,
            next_cid: 0,
            keys: HashMap::new(),
            done: HashMap::new(),
            unmatched: Vec::new(),
            invalidate: true,
            cntlid: None,
        }
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &LoopbackEndpoint {
        &self.ep
    }

    /// Whether the queue is up.
    pub fn is_connected(&self) -> bool {
        self.ep.is_connected()
    }

    /// A fresh command id (skips ids still outstanding).
    pub fn alloc_cid(&mut self) -> u16 {
        loop {
            self.next_cid = self.next_cid.wrapping_add(1);
            if !self.keys.contains_key(&self.next_cid) && !self.done.contains_key(&self.next_cid) {
                return self.next_cid;
            }
        }
    }

    /// Submit `cmd` with `data` under a fresh CID (returned). The SGL is
    /// set from `data`.
    ///
    /// # Errors
    ///
    /// [`HostError::Transport`] when the queue is closed,
    /// [`HostError::Wire`] for data over 16 MiB.
    pub fn submit(&mut self, mut cmd: NvmeCmd, data: HostData<'_>) -> Result<u16, HostError> {
        cmd.cid = self.alloc_cid();
        let mut icd: &[u8] = &[];
        let key = match data {
            HostData::None => {
                cmd.set_sgl(&SglDescriptor::null());
                None
            }
            HostData::InCapsule(d) => {
                cmd.set_sgl(&SglDescriptor::in_capsule(0, d.len() as u32));
                icd = d;
                None
            }
            HostData::Write(d) => {
                let key = self.ep.register(d.to_vec());
                cmd.set_sgl(&SglDescriptor::keyed(
                    0,
                    d.len() as u32,
                    key,
                    self.invalidate,
                )?);
                Some(key)
            }
            HostData::Read(len) => {
                let key = self.ep.register(vec![0u8; len as usize]);
                cmd.set_sgl(&SglDescriptor::keyed(0, len, key, self.invalidate)?);
                Some(key)
            }
        };
        self.submit_with_sgl(cmd, icd, key)
    }

    /// Submit `cmd` exactly as given (its CID and SGL untouched) with
    /// in-capsule bytes `icd`; `key` is host memory to collect with the
    /// completion. Returns the CID.
    ///
    /// # Errors
    ///
    /// [`HostError::Transport`] when the queue is closed.
    pub fn submit_with_sgl(
        &mut self,
        cmd: NvmeCmd,
        icd: &[u8],
        key: Option<u32>,
    ) -> Result<u16, HostError> {
        let mut capsule = Vec::with_capacity(SQE_SIZE + icd.len());
        capsule.extend_from_slice(&cmd.encode());
        capsule.extend_from_slice(icd);
        if let Some(k) = key {
            self.keys.insert(cmd.cid, k);
        }
        self.ep.send_capsule(capsule)?;
        Ok(cmd.cid)
    }

    /// Register host memory for a hand-built keyed SGL.
    pub fn register(&self, bytes: Vec<u8>) -> u32 {
        self.ep.register(bytes)
    }

    /// Collect arrived completions; returns how many.
    pub fn poll(&mut self) -> usize {
        let mut n = 0;
        while let Some(cpl) = self.ep.recv_completion() {
            n += 1;
            let key = self.keys.remove(&cpl.cid);
            let (data, key_invalidated) = match key {
                Some(k) => {
                    let inv = !self.ep.is_key_valid(k);
                    (self.ep.deregister(k), inv)
                }
                None => (None, false),
            };
            if self.done.contains_key(&cpl.cid) {
                self.unmatched.push(cpl);
                continue;
            }
            self.done.insert(
                cpl.cid,
                Completed {
                    cpl,
                    data,
                    key_invalidated,
                },
            );
        }
        n
    }

    /// The completion of `cid`, if it arrived (call [`poll`](Self::poll) first).
    pub fn take(&mut self, cid: u16) -> Option<Completed> {
        self.done.remove(&cid)
    }

    /// Every completion collected and not taken yet, in CID order, plus
    /// duplicates (a CID completed twice shows up twice).
    pub fn drain(&mut self) -> Vec<NvmeCompletion> {
        let mut v: Vec<_> = self.done.drain().map(|(_, c)| c.cpl).collect();
        v.append(&mut self.unmatched);
        v.sort_by_key(|c| c.cid);
        v
    }

    /// Submit, drive, and return the completion.
    ///
    /// # Errors
    ///
    /// As [`submit`](Self::submit), or [`HostError::NoCompletion`].
    pub fn exec(
        &mut self,
        cmd: NvmeCmd,
        data: HostData<'_>,
        drive: &dyn Fn(),
    ) -> Result<Completed, HostError> {
        let cid = self.submit(cmd, data)?;
        drive();
        self.poll();
        self.take(cid).ok_or(HostError::NoCompletion(cid))
    }

    /// Property Get.
    ///
    /// # Errors
    ///
    /// As [`exec`](Self::exec), or [`HostError::Failed`].
    pub fn property_get(
        &mut self,
        offset: u32,
        size: PropertySize,
        drive: &dyn Fn(),
    ) -> Result<u64, HostError> {
        let c = self
            .exec(PropertyCmd::get(offset, size, 0), HostData::None, drive)?
            .ok()?;
        Ok(c.cpl.result64())
    }

    /// Property Set (4 bytes).
    ///
    /// # Errors
    ///
    /// As [`exec`](Self::exec), or [`HostError::Failed`].
    pub fn property_set(
        &mut self,
        offset: u32,
        value: u32,
        drive: &dyn Fn(),
    ) -> Result<(), HostError> {
        self.exec(
            PropertyCmd::set(offset, PropertySize::Four, u64::from(value), 0),
            HostData::None,
            drive,
        )?
        .ok()?;
        Ok(())
    }

    /// The Linux enable sequence: CC with EN = 0, then EN = 1, then CSTS
    /// until RDY (one read here: the target is ready at once).
    ///
    /// # Errors
    ///
    /// As [`exec`](Self::exec), or [`HostError::NotReady`].
    pub fn enable(&mut self, drive: &dyn Fn()) -> Result<(), HostError> {
        let mut cc = Cc::linux_default(0);
        self.property_set(ofst::CC, cc.to_u32(), drive)?;
        cc.en = true;
        self.property_set(ofst::CC, cc.to_u32(), drive)?;
        let csts = Csts::from_u32(self.property_get(ofst::CSTS, PropertySize::Four, drive)? as u32);
        if !csts.rdy || csts.cfs {
            return Err(HostError::NotReady(csts));
        }
        Ok(())
    }

    /// Set Features Number of Queues; returns the granted count.
    ///
    /// # Errors
    ///
    /// As [`exec`](Self::exec), or [`HostError::Failed`].
    pub fn set_num_queues(&mut self, n: u16, drive: &dyn Fn()) -> Result<u16, HostError> {
        let v = crate::spec::features::num_queues_value(u32::from(n), u32::from(n));
        let c = self
            .exec(
                FeatureCmd::set(fid::NUMBER_OF_QUEUES, v, 0),
                HostData::None,
                drive,
            )?
            .ok()?;
        let (nsq, ncq) = (c.cpl.dw0 & 0xFFFF, c.cpl.dw0 >> 16);
        Ok((nsq.min(ncq) + 1) as u16)
    }
}

/// A host: an NQN and host id, a loopback transport and a target.
#[derive(Debug, Clone)]
pub struct LoopbackHost {
    /// The transport.
    pub transport: Arc<LoopbackTransport>,
    /// The target.
    pub target: Arc<Target>,
    /// Host NQN.
    pub hostnqn: String,
    /// Host identifier.
    pub hostid: [u8; 16],
}

impl LoopbackHost {
    /// A host named `hostnqn`.
    pub fn new(
        transport: &Arc<LoopbackTransport>,
        target: &Arc<Target>,
        hostnqn: impl Into<String>,
    ) -> Self {
        let hostnqn = hostnqn.into();
        let mut hostid = [0u8; 16];
        for (i, b) in hostnqn.bytes().enumerate() {
            hostid[i % 16] ^= b;
        }
        LoopbackHost {
            transport: Arc::clone(transport),
            target: Arc::clone(target),
            hostnqn,
            hostid,
        }
    }

    /// Open an unconnected queue to `trid` on `reactor`.
    ///
    /// # Errors
    ///
    /// [`HostError::Transport`] when nobody listens there.
    pub fn open(
        &self,
        reactor: &Reactor,
        trid: &TransportId,
        opts: LoopbackQueueOptions,
    ) -> Result<HostQueue, HostError> {
        let ep = self.transport.connect(&self.target, reactor, trid, opts)?;
        Ok(HostQueue::new(ep))
    }

    /// The Connect data for `subnqn` and `cntlid`.
    pub fn connect_data(&self, subnqn: &str, cntlid: u16) -> [u8; 1024] {
        ConnectData {
            hostid: self.hostid,
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: self.hostnqn.clone(),
        }
        .encode()
    }

    /// Send a Connect on `q` (keyed data on the admin queue, in-capsule on
    /// I/O queues, as the Linux host does) and return its completion; on
    /// success `q.cntlid` is set.
    ///
    /// # Errors
    ///
    /// As [`HostQueue::exec`].
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        &self,
        q: &mut HostQueue,
        subnqn: &str,
        qid: u16,
        sqsize: u16,
        kato_ms: u32,
        cntlid: u16,
        drive: &dyn Fn(),
    ) -> Result<Completed, HostError> {
        let cmd = ConnectCmd {
            recfmt: 0,
            qid,
            sqsize,
            cattr: 0,
            kato: kato_ms,
        }
        .to_cmd(0);
        let data = self.connect_data(subnqn, cntlid);
        let d = if qid == 0 {
            HostData::Write(&data)
        } else {
            HostData::InCapsule(&data)
        };
        let c = q.exec(cmd, d, drive)?;
        if c.cpl.status.is_success() {
            q.cntlid = Some(c.cpl.dw0 as u16);
        }
        Ok(c)
    }

    /// Open, connect and enable an admin queue to `subnqn`.
    ///
    /// # Errors
    ///
    /// Any step's error ([`HostError::Failed`] for a refused Connect).
    pub fn connect_admin(
        &self,
        reactor: &Reactor,
        trid: &TransportId,
        subnqn: &str,
        kato_ms: u32,
        drive: &dyn Fn(),
    ) -> Result<HostQueue, HostError> {
        let mut q = self.open(reactor, trid, LoopbackQueueOptions::admin())?;
        self.connect(&mut q, subnqn, 0, 31, kato_ms, CNTLID_DYNAMIC, drive)?
            .ok()?;
        q.enable(drive)?;
        Ok(q)
    }

    /// Open and connect I/O queue `qid` of controller `cntlid`.
    ///
    /// # Errors
    ///
    /// Any step's error ([`HostError::Failed`] for a refused Connect).
    #[allow(clippy::too_many_arguments)]
    pub fn connect_io(
        &self,
        reactor: &Reactor,
        trid: &TransportId,
        subnqn: &str,
        cntlid: u16,
        qid: u16,
        depth: u16,
        drive: &dyn Fn(),
    ) -> Result<HostQueue, HostError> {
        let mut q = self.open(reactor, trid, LoopbackQueueOptions::io(depth))?;
        self.connect(&mut q, subnqn, qid, depth - 1, 0, cntlid, drive)?
            .ok()?;
        Ok(q)
    }
}
