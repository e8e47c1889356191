//! The NVMe-oF side of a `pollux-perf` job: one namespace behind a core's
//! I/O queue pairs, I/Os spread over them round-robin.

use pollux_nvmf::host::{HostTransport, IoError, Qpair, SubmitErrorKind};
use pollux_reactor::mem::SgList;

use super::job::{Done, JobQueues, Outcome, Refused};

/// Namespace `nsid` behind `qps`.
pub struct NvmfQueues<T: HostTransport> {
    qps: Vec<Qpair<T::Queue>>,
    nsid: u32,
    next_qp: usize,
}

impl<T: HostTransport> NvmfQueues<T> {
    /// I/O to namespace `nsid` over `qps`.
    pub fn new(qps: Vec<Qpair<T::Queue>>, nsid: u32) -> Self {
        NvmfQueues {
            qps,
            nsid,
            next_qp: 0,
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
        let n = self.qps.len();
        for k in 0..n {
            let qi = (self.next_qp + k) % n;
            let qp = &mut self.qps[qi];
            let res = if read {
                qp.read(self.nsid, lba, blocks, data, ctx)
            } else {
                qp.write(self.nsid, lba, blocks, data, ctx)
            };
            match res {
                Ok(()) => {
                    self.next_qp = (qi + 1) % n;
                    return Ok(());
                }
                Err(e) => {
                    data = e.data;
                    let fatal = match e.kind {
                        SubmitErrorKind::Busy => continue,
                        SubmitErrorKind::Dead => Some(
                            qp.dead_reason()
                                .map_or_else(|| "queue dead".to_string(), |d| d.to_string()),
                        ),
                        SubmitErrorKind::Invalid(err) => Some(err.to_string()),
                    };
                    return Err(Refused {
                        buf: data.pop(),
                        fatal,
                    });
                }
            }
        }
        Err(Refused {
            buf: data.pop(),
            fatal: None,
        })
    }

    fn reap(&mut self, out: &mut Vec<Done>) -> usize {
        let first = out.len();
        let mut work = 0;
        let mut lost = false;
        for qp in &mut self.qps {
            work += qp.poll(&mut |c| {
                let mut data = c.data;
                let outcome = match c.result {
                    Ok(_) => Outcome::Good,
                    Err(e @ (IoError::Aborted | IoError::TimedOut)) => {
                        lost = true;
                        Outcome::Lost(e.to_string())
                    }
                    Err(_) => Outcome::Failed,
                };
                out.push(Done {
                    ctx: c.ctx,
                    buf: data.pop(),
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
