//! The loopback host transport: queues to an in-process target through the
//! target core's [`LoopbackTransport`], on the same reactor. Keyed SGLs
//! name host memory registered with the loopback wire (a copy per command:
//! this transport is for tests and in-process use, not for speed), writes
//! that fit travel in the capsule, and remote invalidation is asked for
//! and checked like on RDMA.

use std::sync::Arc;

use pollux_reactor::mem::SgList;
use pollux_reactor::Reactor;

use super::transport::{DataDir, HostQueue, HostTransport, QueueParams, Queued, SlotBufs};
use super::HostError;
use crate::spec::cmd::{NvmeCmd, SQE_SIZE};
use crate::spec::cpl::NvmeCompletion;
use crate::spec::sgl::SglDescriptor;
use crate::spec::transport_id::TransportId;
use crate::target::{
    LoopbackEndpoint, LoopbackQueueOptions, LoopbackTransport, Target, TransportError,
};

/// A loopback host transport on one reactor.
pub struct LoopbackHost {
    transport: Arc<LoopbackTransport>,
    target: Arc<Target>,
    reactor: Reactor,
    trid: TransportId,
    remote_invalidate: bool,
}

impl std::fmt::Debug for LoopbackHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopbackHost")
            .field("trid", &self.trid)
            .finish()
    }
}

impl LoopbackHost {
    /// A transport to `target`'s loopback listener `trid`, on `reactor`.
    pub fn new(
        transport: Arc<LoopbackTransport>,
        target: Arc<Target>,
        reactor: Reactor,
        trid: TransportId,
    ) -> Self {
        LoopbackHost {
            transport,
            target,
            reactor,
            trid,
            remote_invalidate: true,
        }
    }

    /// Ask for remote invalidation of keys (default) or not.
    pub fn remote_invalidate(mut self, on: bool) -> Self {
        self.remote_invalidate = on;
        self
    }
}

impl HostTransport for LoopbackHost {
    type Queue = LoopbackQueue;

    fn name(&self) -> &'static str {
        "loop"
    }

    fn open_queue(&self, p: &QueueParams) -> Result<LoopbackQueue, HostError> {
        let opts = LoopbackQueueOptions {
            depth: p.entries,
            in_capsule_data_size: if p.qid == 0 { 0 } else { p.inline_limit },
        };
        let ep = self
            .transport
            .connect(&self.target, &self.reactor, &self.trid, opts)
            .map_err(|e| match e {
                TransportError::NotListening(t) => HostError::Unreachable(t.to_string()),
                e => HostError::Transport(e.to_string()),
            })?;
        Ok(LoopbackQueue {
            ep,
            inline: if p.qid == 0 { 0 } else { p.inline_limit },
            remote_invalidate: self.remote_invalidate,
            slots: vec![LoopSlot::default(); usize::from(p.entries)],
            staged: Vec::with_capacity(usize::from(p.entries)),
            closed: false,
        })
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct LoopSlot {
    key: Option<u32>,
    from_ctrl: bool,
}

/// One loopback queue.
pub struct LoopbackQueue {
    ep: LoopbackEndpoint,
    inline: u32,
    remote_invalidate: bool,
    slots: Vec<LoopSlot>,
    staged: Vec<Vec<u8>>,
    closed: bool,
}

impl std::fmt::Debug for LoopbackQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopbackQueue")
            .field("ep", &self.ep)
            .finish()
    }
}

impl HostQueue for LoopbackQueue {
    fn max_inline(&self) -> u32 {
        self.inline
    }

    fn queue_cmd(
        &mut self,
        slot: u16,
        cmd: &mut NvmeCmd,
        dir: DataDir,
        data: &SgList,
    ) -> Result<Queued, HostError> {
        if self.closed || !self.ep.is_connected() {
            return Err(HostError::Disconnected(
                "the loopback queue is closed".into(),
            ));
        }
        let len = u32::try_from(data.total_len())
            .map_err(|_| HostError::Unsupported("transfer too large".into()))?;
        let s = self
            .slots
            .get_mut(usize::from(slot))
            .ok_or_else(|| HostError::Protocol(format!("slot {slot} out of range")))?;
        *s = LoopSlot::default();
        let mut capsule = Vec::with_capacity(SQE_SIZE);
        match dir {
            DataDir::None => cmd.set_sgl(&SglDescriptor::null()),
            DataDir::ToCtrl if len <= self.inline && len > 0 => {
                cmd.set_sgl(&SglDescriptor::in_capsule(0, len));
                capsule.resize(SQE_SIZE + len as usize, 0);
                data.copy_to_slice(&mut capsule[SQE_SIZE..]);
            }
            DataDir::ToCtrl | DataDir::FromCtrl => {
                let mut bytes = vec![0u8; len as usize];
                if dir == DataDir::ToCtrl {
                    data.copy_to_slice(&mut bytes);
                }
                let key = self.ep.register(bytes);
                let sgl = SglDescriptor::keyed(0, len, key, self.remote_invalidate)
                    .map_err(|e| HostError::Unsupported(e.to_string()))?;
                cmd.set_sgl(&sgl);
                s.key = Some(key);
                s.from_ctrl = dir == DataDir::FromCtrl;
            }
        }
        capsule.resize(capsule.len().max(SQE_SIZE), 0);
        let sqe: &mut [u8; SQE_SIZE] = (&mut capsule[..SQE_SIZE])
            .try_into()
            .map_err(|_| HostError::Protocol("capsule".into()))?;
        cmd.encode_into(sqe);
        self.staged.push(capsule);
        Ok(Queued::Yes)
    }

    fn flush(&mut self, _bufs: &dyn SlotBufs) -> Result<(), HostError> {
        for c in self.staged.drain(..) {
            self.ep
                .send_capsule(c)
                .map_err(|e| HostError::Disconnected(e.to_string()))?;
        }
        Ok(())
    }

    fn poll(
        &mut self,
        done: &mut Vec<(u16, NvmeCompletion)>,
        _bufs: &mut dyn SlotBufs,
    ) -> Result<bool, HostError> {
        let mut any = false;
        while let Some(cpl) = self.ep.recv_completion() {
            any = true;
            let slot = cpl.cid & 0x3FF;
            if let Some(s) = self.slots.get(usize::from(slot)) {
                if let (Some(key), true) = (s.key, self.remote_invalidate) {
                    if self.ep.is_key_valid(key) {
                        // The target did not invalidate: do it locally.
                        log::trace!("nvmf loopback host: key {key:#x} invalidated locally");
                    }
                }
            }
            done.push((slot, cpl));
        }
        if !self.ep.is_connected() && !any {
            self.closed = true;
            let why = if self.ep.closed_by_target() {
                "the target closed the queue"
            } else {
                "the queue is closed"
            };
            return Err(HostError::Disconnected(why.into()));
        }
        Ok(any)
    }

    fn finish(&mut self, slot: u16, data: &mut SgList) {
        let Some(s) = self.slots.get_mut(usize::from(slot)) else {
            return;
        };
        if let Some(key) = s.key.take() {
            if let Some(bytes) = self.ep.deregister(key) {
                if s.from_ctrl {
                    data.copy_from_slice(&bytes);
                }
            }
        }
    }

    fn abandon(&mut self, slot: u16) {
        if let Some(key) = self
            .slots
            .get_mut(usize::from(slot))
            .and_then(|s| s.key.take())
        {
            self.ep.deregister(key);
        }
    }

    fn disconnect(&mut self) {
        self.closed = true;
        self.ep.disconnect();
    }
}
