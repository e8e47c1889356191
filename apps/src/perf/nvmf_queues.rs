//! The NVMe-oF side of a `pollux-perf` job: one namespace behind a core's
//! I/O queue pairs, I/Os spread over them round-robin, and T10 PI on a
//! namespace formatted with it ([`NvmfPi`]).

use pollux_nvmf::host::pi::{HostPi, PiIo, PiNs};
use pollux_nvmf::host::{HostTransport, IoError, Qpair, SubmitErrorKind};
use pollux_reactor::mem::{DmaBuf, SgList};

use super::dix::Dix;
use super::job::{Done, JobQueues, Outcome, Refused};

/// PI of a job on a namespace formatted with it: the mode, the format,
/// and for the modes that put tuples on the wire one wire buffer per job
/// slot (made once) holding the I/O's extended blocks while the job's own
/// buffer waits.
pub struct NvmfPi {
    mode: HostPi,
    fmt: PiNs,
    /// The queue pairs' signature offload makes and checks the wire's
    /// tuples (no wire buffers).
    offload: bool,
    /// DIX: the block layer's generate/verify on the job's buffers.
    dix: Option<Dix>,
    /// Per job slot: its wire buffer when idle.
    wire: Vec<Option<DmaBuf>>,
    /// Per job slot: the job's buffer while its wire buffer is out, and
    /// the I/O's LBA and direction.
    held: Vec<Option<(DmaBuf, u64, bool)>>,
    /// Per job slot: a read in flight's LBA (offloaded DIX).
    read_lba: Vec<Option<u64>>,
    /// Bytes per I/O in the job's buffer and on the wire.
    mem_len: usize,
    wire_len: usize,
}

impl NvmfPi {
    /// `mode` on format `fmt` for I/Os of `blocks` blocks in job slots
    /// `0..slots`; with `offload` the queue pairs' signature offload does
    /// the wire's PI, else `wire` holds one buffer of at least the wire
    /// length per job slot (used by [`HostPi::Insert`] and [`HostPi::Dix`],
    /// empty for PRACT).
    pub fn new(
        mode: HostPi,
        fmt: PiNs,
        (blocks, slots): (usize, usize),
        dix: Option<Dix>,
        offload: bool,
        wire: Vec<DmaBuf>,
    ) -> Self {
        let n = wire.len().max(slots);
        NvmfPi {
            mode,
            fmt,
            offload,
            read_lba: vec![None; n],
            dix,
            wire: wire
                .into_iter()
                .map(Some)
                .chain(std::iter::repeat_with(|| None))
                .take(n)
                .collect(),
            held: (0..n).map(|_| None).collect(),
            mem_len: fmt.mem_len(mode, blocks),
            wire_len: fmt.wire_len(mode, blocks),
        }
    }

    /// The I/O to put on the wire for job slot `ctx`: the job's buffer
    /// itself (PRACT), or the slot's wire buffer with the write's extended
    /// blocks. `Err` hands the job's buffer back with why.
    fn outbound(
        &mut self,
        read: bool,
        lba: u64,
        ctx: u64,
        mut b: DmaBuf,
    ) -> Result<DmaBuf, (DmaBuf, String)> {
        if self.mode == HostPi::Pract {
            return Ok(b);
        }
        if self.offload {
            match (&self.dix, read) {
                (Some(d), false) => {
                    d.generate(b.as_mut_slice(), lba);
                }
                (Some(_), true) => {
                    if let Some(s) = self.read_lba.get_mut(ctx as usize) {
                        *s = Some(lba);
                    }
                }
                _ => {}
            }
            return Ok(b);
        }
        let i = ctx as usize;
        let Some(mut w) = self.wire.get_mut(i).and_then(Option::take) else {
            return Err((b, format!("no wire buffer for slot {ctx}")));
        };
        if let (Some(d), false) = (&self.dix, read) {
            d.generate(b.as_mut_slice(), lba);
        }
        if w.set_len(self.wire_len).is_err() || b.len() < self.mem_len {
            self.wire[i] = Some(w);
            return Err((b, "PI buffers too short".into()));
        }
        if !read {
            let r = self.fmt.to_wire(
                self.mode,
                &b.as_slice()[..self.mem_len],
                w.as_mut_slice(),
                lba,
            );
            if let Err(e) = r {
                self.wire[i] = Some(w);
                return Err((b, format!("PI of the job's write at LBA {lba}: {e}")));
            }
        }
        self.held[i] = Some((b, lba, read));
        Ok(w)
    }

    /// A refused submission of slot `ctx`: the wire buffer back in its
    /// place, the job's buffer returned.
    fn refused(&mut self, ctx: u64, sent: Option<DmaBuf>) -> Option<DmaBuf> {
        if self.mode == HostPi::Pract || self.offload {
            return sent;
        }
        let i = ctx as usize;
        if let Some(s) = self.wire.get_mut(i) {
            *s = sent;
        }
        self.held.get_mut(i)?.take().map(|h| h.0)
    }

    /// A completion of slot `ctx` carrying `back`: the job's buffer, with
    /// a read's data (and, DIX, tuples) taken from the wire after the
    /// checks; `false` when a check failed.
    fn inbound(&mut self, ctx: u64, back: Option<DmaBuf>, ok: bool) -> (Option<DmaBuf>, bool) {
        if self.mode == HostPi::Pract {
            return (back, true);
        }
        if self.offload {
            // The offload checked the wire; DIX reads get the block layer's
            // verify of the tuples it stored.
            let lba = self.read_lba.get_mut(ctx as usize).and_then(Option::take);
            let good = match (&self.dix, lba, &back, ok) {
                (Some(d), Some(lba), Some(b), true) => d.verify(b.as_slice(), lba),
                _ => true,
            };
            return (back, good);
        }
        let i = ctx as usize;
        let Some((mut b, lba, read)) = self.held.get_mut(i).and_then(Option::take) else {
            return (back, true);
        };
        let mut good = true;
        if let Some(w) = back {
            if read && ok {
                good = self
                    .fmt
                    .from_wire(
                        self.mode,
                        w.as_slice(),
                        &mut b.as_mut_slice()[..self.mem_len],
                        lba,
                    )
                    .is_ok();
                if let (true, Some(d)) = (good, &self.dix) {
                    good = d.verify(b.as_slice(), lba);
                }
            }
            if let Some(s) = self.wire.get_mut(i) {
                *s = Some(w);
            }
        }
        (Some(b), good)
    }
}

/// Namespace `nsid` behind `qps`.
pub struct NvmfQueues<T: HostTransport> {
    qps: Vec<Qpair<T::Queue>>,
    nsid: u32,
    next_qp: usize,
    pi: Option<NvmfPi>,
    /// A PI check of the host failed (logged once).
    warned: bool,
}

impl<T: HostTransport> NvmfQueues<T> {
    /// I/O to namespace `nsid` over `qps`, with `pi` on a PI namespace.
    pub fn new(qps: Vec<Qpair<T::Queue>>, nsid: u32, pi: Option<NvmfPi>) -> Self {
        NvmfQueues {
            qps,
            nsid,
            next_qp: 0,
            pi,
            warned: false,
        }
    }

    /// The queue pairs (to replace dead ones, or to tear them down).
    pub fn qpairs_mut(&mut self) -> &mut Vec<Qpair<T::Queue>> {
        &mut self.qps
    }

    fn dead_reason(&self) -> Option<String> {
        self.qps
            .iter()
            .find_map(|q| q.dead_reason().map(|d| d.to_string()))
    }
}

impl<T: HostTransport> JobQueues for NvmfQueues<T> {
    fn submit(
        &mut self,
        read: bool,
        lba: u64,
        blocks: u32,
        mut data: SgList,
        ctx: u64,
    ) -> Result<(), Refused> {
        if let Some(pi) = &mut self.pi {
            let Some(b) = data.pop() else {
                return Err(Refused {
                    buf: None,
                    fatal: Some("no buffer".into()),
                });
            };
            match pi.outbound(read, lba, ctx, b) {
                Ok(w) => data = SgList::from_buf(w),
                Err((b, why)) => {
                    return Err(Refused {
                        buf: Some(b),
                        fatal: Some(why),
                    })
                }
            }
        }
        let n = self.qps.len();
        let mut fatal = None;
        // Round robin from `next_qp` (the queue after the last one used),
        // wrapped here only and without a division: two per I/O otherwise.
        let mut qi = self.next_qp;
        for _ in 0..n {
            if qi >= n {
                qi = 0;
            }
            let qp = &mut self.qps[qi];
            let res = match &self.pi {
                Some(pi) if pi.offload => {
                    let io = PiIo {
                        mode: pi.mode,
                        fmt: pi.fmt,
                        slba: lba,
                        nlb: blocks,
                        write: !read,
                        target_checks: true,
                    };
                    qp.rw_pi_offload(self.nsid, &io, data, ctx)
                }
                Some(pi) => {
                    let f = pi.fmt.rw_pi(pi.mode, lba);
                    qp.rw_pi(!read, self.nsid, lba, blocks, data, &f, ctx)
                }
                None if read => qp.read(self.nsid, lba, blocks, data, ctx),
                None => qp.write(self.nsid, lba, blocks, data, ctx),
            };
            match res {
                Ok(()) => {
                    self.next_qp = qi + 1;
                    return Ok(());
                }
                Err(e) => {
                    data = e.data;
                    fatal = match e.kind {
                        SubmitErrorKind::Busy => {
                            qi += 1;
                            continue;
                        }
                        SubmitErrorKind::Dead => Some(
                            qp.dead_reason()
                                .map_or_else(|| "queue dead".to_string(), |d| d.to_string()),
                        ),
                        SubmitErrorKind::Invalid(err) => Some(err.to_string()),
                    };
                    break;
                }
            }
        }
        let sent = data.pop();
        let buf = match &mut self.pi {
            Some(pi) => pi.refused(ctx, sent),
            None => sent,
        };
        Err(Refused { buf, fatal })
    }

    fn reap(&mut self, out: &mut Vec<Done>) -> usize {
        let first = out.len();
        let mut work = 0;
        let mut lost = false;
        let (pi, warned) = (&mut self.pi, &mut self.warned);
        for qp in &mut self.qps {
            work += qp.poll(&mut |c| {
                let mut data = c.data;
                let mut outcome = match c.result {
                    Ok(_) => Outcome::Good,
                    Err(e @ (IoError::Aborted | IoError::TimedOut)) => {
                        lost = true;
                        Outcome::Lost(e.to_string())
                    }
                    Err(_) => Outcome::Failed,
                };
                let mut buf = data.pop();
                // The one buffer taken: an empty inline list owns nothing
                // (no call into its drop glue per I/O).
                if data.is_empty() && data.is_inline() {
                    std::mem::forget(data);
                }
                if let Some(pi) = pi.as_mut() {
                    let ok = matches!(outcome, Outcome::Good);
                    let (b, good) = pi.inbound(c.ctx, buf, ok);
                    buf = b;
                    if !good {
                        if !*warned {
                            *warned = true;
                            log::warn!("pollux-perf: the host's PI check of a read failed");
                        }
                        outcome = Outcome::Failed;
                    }
                }
                out.push(Done {
                    ctx: c.ctx,
                    buf,
                    outcome,
                });
            });
        }
        if lost {
            // Name the queue's cause (the target went away, a transport
            // error) rather than the command's.
            if let Some(why) = self.dead_reason() {
                for d in &mut out[first..] {
                    if let Outcome::Lost(w) = &mut d.outcome {
                        w.clone_from(&why);
                    }
                }
            }
        }
        work
    }

    fn flush(&mut self) {
        for qp in &mut self.qps {
            qp.flush();
        }
    }

    fn halt(&mut self) {
        for qp in &mut self.qps {
            qp.disconnect();
        }
    }
}
