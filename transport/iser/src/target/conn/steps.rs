//! Medium commands that take several bdev operations, all on the task's
//! one buffer (no allocation): VERIFY (BYTCHK 0: read and check; 1: read
//! and compare with the data-out), WRITE AND VERIFY with BYTCHK 1 (write,
//! read back, compare), COMPARE AND WRITE (read, compare, write; under its
//! LU's gate) and WRITE SAME with a pattern (the pattern block repeated
//! over chunks of the range).
//!
//! The data-out (or the WRITE SAME pattern) first moves to the tail of
//! the buffer ("stashed"); reads and writes use its head. Each bdev
//! completion comes back here with the next step.

use pollux_bdev::SgList;

use super::{Connection, TaskState};
use crate::scsi::disk::{BlockOp, PiMode};
use crate::scsi::pi;
use crate::scsi::sense::Sense;
use crate::target::ops::ConnOps;

/// Offset of the first byte where `a` and `b` differ.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

impl Connection {
    /// Run the next step of task `idx`'s multi-step command (the first
    /// when nothing ran yet), or answer it.
    pub(super) fn advance(&mut self, idx: u16, ops: &mut dyn ConnOps) {
        let t = &mut self.tasks[usize::from(idx)];
        let (Some(io), Some(l)) = (t.io, t.lun) else {
            return self.respond(idx, ops);
        };
        if io.op == BlockOp::CompareAndWrite && io.fua && t.step == 2 {
            // Compared equal and written: FUA flushes the range first.
            return self.flush_for_fua(idx, l, io, 3, ops);
        }
        let info = &self.luns[l].disk.info;
        let bs = info.block_size as usize;
        let bbs = info.buf_block_size as usize;
        let n = io.blocks as usize;
        let Some(buf) = t.buf.as_mut() else {
            t.result = Err(Sense::INTERNAL_FAILURE);
            return self.respond(idx, ops);
        };
        let cap = buf.capacity();
        let _ = buf.set_len(cap);
        let b = buf.as_mut_slice();
        // What the last read brought, as plain blocks.
        if t.step > 0 && !t.last.0 && io.pi == PiMode::Strip {
            pi::strip(b, bs, t.last.2);
        }
        let step = t.step;
        t.step = step.saturating_add(1);
        // The next bdev operation: (write, LBA, blocks).
        let next = match (io.op, step) {
            (BlockOp::VerifyMedium, 0) => Some((false, io.lba, n)),
            (BlockOp::Compare, 0) | (BlockOp::CompareAndWrite, 0) => {
                let len = io.wire_len(info) as usize;
                b.copy_within(..len, cap - len);
                Some((false, io.lba, n))
            }
            (BlockOp::WriteCompare, 0) => {
                b.copy_within(..n * bs, cap - n * bs);
                Some((true, io.lba, n))
            }
            (BlockOp::WriteCompare, 1) => Some((false, io.lba, n)),
            (BlockOp::Compare, 1) | (BlockOp::WriteCompare, 2) | (BlockOp::CompareAndWrite, 1) => {
                let len = n * bs;
                let stash = if io.op == BlockOp::CompareAndWrite {
                    cap - 2 * len
                } else {
                    cap - len
                };
                if let Some(off) = first_difference(&b[..len], &b[stash..stash + len]) {
                    t.result = Err(Sense::MISCOMPARE.with_info(off as u64));
                    None
                } else if io.op == BlockOp::CompareAndWrite {
                    b.copy_within(stash + len..stash + 2 * len, 0);
                    Some((true, io.lba, n))
                } else {
                    None
                }
            }
            (BlockOp::WriteSame { lbdata }, _) => {
                if step == 0 {
                    b.copy_within(..bs, cap - bs);
                    t.done = 0;
                } else {
                    t.done += t.last.2 as u64;
                }
                let left = io.blocks - t.done;
                let room = ((cap - bs) / bbs).min(info.max_transfer_blocks as usize);
                let k = usize::try_from(left).unwrap_or(usize::MAX).min(room);
                if k == 0 {
                    None
                } else {
                    let lba = io.lba + t.done;
                    let (head, pattern) = b.split_at_mut(cap - bs);
                    for (i, blk) in head[..k * bs].chunks_exact_mut(bs).enumerate() {
                        blk.copy_from_slice(pattern);
                        if lbdata {
                            blk[..4].copy_from_slice(&((lba + i as u64) as u32).to_be_bytes());
                        }
                    }
                    Some((true, lba, k))
                }
            }
            // Verified, written, or compared equal: done.
            _ => None,
        };
        let Some((write, lba, k)) = next else {
            return self.respond(idx, ops);
        };
        t.last = (write, lba, k);
        if write && io.pi == PiMode::Strip {
            pi::spread(b, bs, k);
        }
        let _ = buf.set_len(k * bbs);
        let Some(buf) = t.buf.take() else {
            return self.respond(idx, ops);
        };
        let lun = &self.luns[l];
        let pi_action = pi::action(io.pi, lun.disk.info.pi_type, lba, write, io.tags);
        let ty = if write {
            pollux_bdev::IoType::Write
        } else {
            pollux_bdev::IoType::Read
        };
        t.state = TaskState::Bdev;
        let ctx = u64::from(idx);
        let bufs = SgList::from_buf(buf);
        let submitted = match pi_action {
            Some(a) => lun.ch.submit_with_pi(
                ty,
                lba,
                k as u64,
                bufs,
                SgList::new(),
                Some(a),
                &self.cb,
                ctx,
            ),
            None => lun.ch.submit(ty, lba, k as u64, bufs, &self.cb, ctx),
        };
        if let Err(mut rej) = submitted {
            t.buf = rej.bufs.pop();
            t.result = Err(Sense::INTERNAL_FAILURE);
            self.respond(idx, ops);
        }
    }
}
