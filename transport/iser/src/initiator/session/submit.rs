//! Task submission: admission (CmdSN window, free task slots), the page
//! list, software PI generation, the registration work request and the
//! SCSI Command PDU with its iSER header.

use super::*;

impl<P: Provider> IserInitiator<P> {
    /// READ(16) of `blocks` blocks at `lba` of `lun` into `bufs` (at least
    /// `blocks × block_size` bytes; with [`PiPolicy::Dix`](super::super::PiPolicy::Dix)
    /// 8 more per block, where the tuples are stored), with the session's
    /// PI policy.
    ///
    /// # Errors
    /// [`SubmitError`], which hands the buffers back.
    pub fn read(
        &mut self,
        lun: u16,
        lba: u64,
        blocks: u32,
        bufs: SgList,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        self.block_io(false, lun, lba, blocks, bufs, ctx)
    }

    /// WRITE(16) of `blocks` blocks at `lba` of `lun` from `bufs` (with
    /// [`PiPolicy::Dix`](super::super::PiPolicy::Dix), the data followed by
    /// one tuple per block).
    ///
    /// # Errors
    /// [`SubmitError`], which hands the buffers back.
    pub fn write(
        &mut self,
        lun: u16,
        lba: u64,
        blocks: u32,
        bufs: SgList,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        self.block_io(true, lun, lba, blocks, bufs, ctx)
    }

    pub(super) fn block_io(
        &mut self,
        write: bool,
        lun: u16,
        lba: u64,
        blocks: u32,
        bufs: SgList,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        let Some(g) = self.geometry(lun) else {
            return Err(SubmitError::Invalid("no geometry for the LUN", Some(bufs)));
        };
        let pol = self.opts.pi;
        let wire_pi = g.prot_en
            && if write {
                pol.generates()
            } else {
                pol.verifies()
            };
        let protect = match (wire_pi, write) {
            (false, _) => 0,
            (true, true) => 1,
            (true, false) => {
                if self.opts.target_checks {
                    1
                } else {
                    3
                }
            }
        };
        // PI Type 2 names its reference tags in READ(32)/WRITE(32), seeded
        // with the LBA as Linux's sd does.
        let mut cdb = [0u8; 32];
        if wire_pi && g.pi_type == 2 {
            let tags = PiTags {
                ref_tag: lba as u32,
                app_tag: self.opts.app_tag,
                app_mask: self.opts.app_tag_mask,
            };
            cdb = rw32_cdb(write, lba, blocks, protect, tags);
        } else {
            cdb[..16].copy_from_slice(&rw16_cdb(write, lba, blocks, protect));
        }
        let dir = if write { DataDir::Write } else { DataDir::Read };
        let path = if !wire_pi {
            PiPath::None
        } else if self.offload {
            PiPath::Offload
        } else {
            PiPath::Software
        };
        let shape = PiShape {
            lba,
            block: g.block_size,
            blocks,
            pi_type: g.pi_type,
            app_tag: self.opts.app_tag,
            app_mask: self.opts.app_tag_mask,
            layout: if pol.in_memory() {
                PiLayout::Dix
            } else {
                PiLayout::Insert
            },
        };
        if wire_pi && !matches!(g.pi_type, 1..=3) {
            return Err(SubmitError::Invalid("unknown PI type", Some(bufs)));
        }
        // DIX: the tuples follow the data in the caller's buffers, also
        // when the LU has no PI (they are left alone then).
        if pol.in_memory() && bufs.total_len() < shape.data_len() + blocks as usize * TUPLE {
            return Err(SubmitError::Invalid(
                "DIX: buffers shorter than the data and its tuples",
                Some(bufs),
            ));
        }
        let len = shape.data_len();
        self.submit_inner(lun, &cdb, dir, Some(bufs), len, (path, shape), ctx)
    }

    /// Submit any CDB (up to 16 bytes, or a 32-byte variable-length one):
    /// `len` bytes of data in `dir` through `bufs`. The result arrives
    /// through [`IserInitiator::poll`].
    ///
    /// # Errors
    /// [`SubmitError`], which hands the buffers back.
    pub fn submit(
        &mut self,
        lun: u16,
        cdb: &[u8],
        dir: DataDir,
        bufs: Option<SgList>,
        len: usize,
        ctx: u64,
    ) -> Result<(), SubmitError> {
        // Up to 16 bytes in the BHS; a 32-byte variable-length CDB
        // (READ(32)/WRITE(32)) sends the rest in an extended CDB AHS.
        let long = cdb.len() == 32 && cdb[0] == crate::scsi::cdb::op::VARIABLE_LENGTH;
        if cdb.len() > 16 && !long {
            return Err(SubmitError::Invalid(
                "CDB over 16 bytes (other than a 32-byte variable-length one)",
                bufs,
            ));
        }
        let mut c = [0u8; 32];
        c[..cdb.len()].copy_from_slice(cdb);
        self.submit_inner(lun, &c, dir, bufs, len, (PiPath::None, NO_PI), ctx)
    }

    /// One task: admitted, its data mapped, registered when the target
    /// moves data, and its SCSI Command posted (see the phases below).
    /// `len`: data bytes (PI excluded); `pi`: how PI travels, and its shape.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn submit_inner(
        &mut self,
        lun: u16,
        cdb: &[u8; 32],
        dir: DataDir,
        bufs: Option<SgList>,
        len: usize,
        pi: (PiPath, PiShape),
        ctx: u64,
    ) -> Result<(), SubmitError> {
        let idx = match self.admit(dir, bufs.as_ref(), len) {
            Ok(idx) => idx,
            Err(r) => return Err(r.with(bufs)),
        };
        let i = usize::from(idx);
        let (path, shape) = pi;
        let wire_len = if path == PiPath::None {
            len
        } else {
            shape.wire_len()
        };
        let (pages, sw_error) = match self.page_list(i, pi, dir, bufs.as_ref(), len) {
            Ok(p) => p,
            Err(r) => {
                self.free.push(idx);
                return Err(r.with(bufs));
            }
        };
        let imm = self.immediate_len(dir, path, len, &pages);
        let remote = dir == DataDir::Read || (dir == DataDir::Write && imm < len);
        let pre_key = if self.pre_registered && remote && len > 0 {
            match pages.one_run().and_then(|a| self.rkey_of(a)) {
                Some(r) => Some(r),
                None => {
                    self.free.push(idx);
                    return Err(SubmitError::Invalid(
                        "pre-registered memory: one contiguous buffer per task",
                        bufs,
                    ));
                }
            }
        } else {
            None
        };
        self.tasks[i].start(idx, ctx, dir, pi, sw_error);
        let mut wrs = [SendWr::new(WrId(0), SendOp::Send, &[]); 2];
        let mut n = 0;
        let stag = match pre_key {
            Some(rkey) => {
                let t = &mut self.tasks[i];
                t.key = rkey;
                t.registered = false;
                Some(Stag {
                    stag: rkey,
                    va: pages.sges[0].addr,
                })
            }
            None if remote && len > 0 => {
                let (reg, stag) = self.registration(i, dir, &pages);
                wrs[0] = reg;
                n = 1;
                Some(stag)
            }
            None => None,
        };
        let (off, hdr_len) = self.write_command(i, lun, cdb, dir, stag, imm, wire_len);
        let sges = [
            Sge {
                addr: self.ctrl_addr(off),
                length: hdr_len as u32,
                lkey: self.ctrl_lkey,
            },
            Sge {
                addr: pages.sges[0].addr,
                length: imm as u32,
                lkey: pages.sges[0].lkey,
            },
        ];
        let nsge = if imm > 0 { 2 } else { 1 };
        wrs[n] = SendWr::new(wr(Kind::TaskSend, i), SendOp::Send, &sges[..nsge]).signaled();
        n += 1;
        self.tasks[i].bufs = bufs;
        if let Err(e) = self.qp.post_send(&wrs[..n]) {
            let t = &mut self.tasks[i];
            t.active = false;
            t.registered = false;
            let b = t.bufs.take();
            self.free.push(idx);
            self.fail(InitiatorError::Verbs(format!("post: {e:?}")));
            return Err(SubmitError::Verbs("post failed".into(), b));
        }
        self.sends_in_flight += 1;
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        self.stats.submitted += 1;
        if self.awake.is_none() {
            self.hold_awake();
        }
        Ok(())
    }

    /// Admission: a session in full feature phase, buffers that hold the
    /// transfer, an open CmdSN window, no registration ahead of an
    /// unacknowledged SEND where the provider needs that, a free task.
    fn admit(&mut self, dir: DataDir, bufs: Option<&SgList>, len: usize) -> Result<u16, Refusal> {
        if !self.is_ready() {
            return Err(Refusal::NotReady);
        }
        let have = bufs.map_or(0, SgList::total_len);
        if (dir != DataDir::None && have < len) || len > self.opts.max_io_bytes as usize {
            return Err(Refusal::Invalid(
                "buffers shorter than the transfer or over max_io_bytes",
            ));
        }
        if bufs.is_some_and(|b| b.len() > MAX_SGES) {
            return Err(Refusal::Invalid("too many segments"));
        }
        let registers_behind_a_send =
            self.bind_after_sends && dir != DataDir::None && len > 0 && self.sends_in_flight > 0;
        // Its registration must not run ahead of an unacknowledged SEND.
        let idx = if !sn_le(self.cmd_sn, self.max_cmd_sn) || registers_behind_a_send {
            None
        } else {
            self.free.pop()
        };
        idx.ok_or_else(|| {
            self.stats.busy += 1;
            Refusal::Busy
        })
    }

    /// The task's data as SGEs: the caller's buffers (with offloaded DIX,
    /// their tuples as protection SGEs), or (software PI) its bounce slot,
    /// into which a write's wire image is made first; a DIX write's first
    /// bad tuple comes back with it.
    fn page_list(
        &mut self,
        i: usize,
        pi: (PiPath, PiShape),
        dir: DataDir,
        bufs: Option<&SgList>,
        len: usize,
    ) -> Result<(PageList, Option<PiFailure>), Refusal> {
        let mut pages = PageList {
            sges: [Sge::default(); MAX_SGES],
            n: 0,
            prot: [Sge::default(); MAX_SGES],
            np: 0,
            first_arena: None,
        };
        let (path, shape) = pi;
        let mut failure = None;
        if path == PiPath::Software {
            let wire_len = shape.wire_len();
            let slot = i * self.bounce_slot;
            let Some(b) = self.bounce.as_mut() else {
                return Err(Refusal::Invalid("no bounce buffers"));
            };
            if wire_len > self.bounce_slot {
                return Err(Refusal::Invalid("transfer over the bounce slot"));
            }
            if let (DataDir::Write, Some(src)) = (dir, bufs) {
                failure = pi::generate(src, &mut b.as_mut_slice()[slot..slot + wire_len], &shape);
            }
            let (addr, arena) = (b.addr() + slot, b.arena().clone());
            let lkey = self.lkey_of(&arena, true).map_err(Refusal::Verbs)?;
            pages.push(
                Sge {
                    addr: addr as u64,
                    length: wire_len as u32,
                    lkey,
                },
                arena.id(),
            );
        } else if let Some(sg) = bufs {
            self.map_range(sg, 0, len, &mut pages, false)?;
            if path == PiPath::Offload && shape.layout == PiLayout::Dix {
                self.map_range(sg, len, shape.pi_len(), &mut pages, true)?;
            }
        }
        Ok((pages, failure))
    }

    /// SGEs for bytes `[from, from + len)` of `sg`, appended to the data
    /// (or, `prot`, the protection) SGEs of `pages`.
    fn map_range(
        &mut self,
        sg: &SgList,
        mut from: usize,
        mut left: usize,
        pages: &mut PageList,
        prot: bool,
    ) -> Result<(), Refusal> {
        for b in sg.iter() {
            if left == 0 {
                break;
            }
            if from >= b.len() {
                from -= b.len();
                continue;
            }
            let arena = b.arena().clone();
            let lkey = self.lkey_of(&arena, true).map_err(Refusal::Verbs)?;
            let take = (b.len() - from).min(left);
            let sge = Sge {
                addr: (b.addr() + from) as u64,
                length: take as u32,
                lkey,
            };
            if pages.n + pages.np == MAX_SGES {
                return Err(Refusal::Invalid("too many segments"));
            }
            if prot {
                pages.prot[pages.np] = sge;
                pages.np += 1;
            } else {
                pages.push(sge, arena.id());
            }
            left -= take;
            from = 0;
        }
        Ok(())
    }

    /// Immediate data: plain writes only, from the first buffer, within
    /// the negotiated first burst and send segment.
    fn immediate_len(&self, dir: DataDir, pi: PiPath, len: usize, pages: &PageList) -> usize {
        if dir == DataDir::Write
            && pi == PiPath::None
            && self.opts.immediate_data
            && self.params.immediate_data
        {
            len.min(pages.sges[0].length as usize)
                .min(self.params.first_burst as usize)
                .min(self.params.initiator_send_dsl.min(8192) as usize)
        } else {
            0
        }
    }

    /// The fast-registration (or, with PI offload, integrity) work request
    /// of task `i` over `pages`, with a fresh key, and the STag it gives
    /// the target.
    fn registration<'a>(
        &mut self,
        i: usize,
        dir: DataDir,
        pages: &'a PageList,
    ) -> (SendWr<'a>, Stag) {
        let t = &mut self.tasks[i];
        t.key = match (t.pi, t.imr.as_mut()) {
            (PiPath::Offload, Some((_, k))) => {
                *k = next_key(*k);
                *k
            }
            _ => {
                t.fr_key = next_key(t.fr_key);
                t.fr_key
            }
        };
        let iova = pages.sges[0].addr;
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let op = if t.pi == PiPath::Offload {
            SendOp::RegMrIntegrity {
                key: t.key,
                iova,
                access,
                sig: pi::sig_attrs(dir == DataDir::Write, &t.shape),
                prot: &pages.prot[..pages.np],
            }
        } else {
            SendOp::RegMr {
                key: t.key,
                iova,
                access,
            }
        };
        t.registered = true;
        let stag = Stag {
            stag: t.key,
            va: iova,
        };
        (
            SendWr::new(wr(Kind::Reg, i), op, &pages.sges[..pages.n]),
            stag,
        )
    }

    /// Write task `i`'s iSER header and SCSI Command PDU into its header
    /// slot of the control buffer; returns the slot's offset.
    #[allow(clippy::too_many_arguments)]
    fn write_command(
        &mut self,
        i: usize,
        lun: u16,
        cdb: &[u8; 32],
        dir: DataDir,
        stag: Option<Stag>,
        imm: usize,
        wire_len: usize,
    ) -> (usize, usize) {
        let hdr = match (dir, stag) {
            (DataDir::Read, Some(s)) => IserHeader::Control {
                write: None,
                read: Some(s),
            },
            (DataDir::Write, Some(s)) => IserHeader::Control {
                write: Some(Stag {
                    stag: s.stag,
                    va: s.va + imm as u64,
                }),
                read: None,
            },
            _ => IserHeader::PLAIN,
        };
        let cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read: dir == DataDir::Read,
            write: dir == DataDir::Write,
            attr: TaskAttr::Simple,
            lun: Lun::from_index(lun),
            itt: self.tasks[i].itt,
            edtl: if dir == DataDir::None {
                0
            } else {
                wire_len as u32
            },
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: first_16(cdb),
        };
        // A CDB longer than 16 bytes (READ(32)/WRITE(32)) sends bytes 16..
        // in an extended CDB AHS after the BHS.
        let long = cdb[0] == crate::scsi::cdb::op::VARIABLE_LENGTH;
        let len = ISER_HEADERS_LEN + if long { EXT_CDB_AHS_LEN } else { 0 };
        let off = self.nrecv * RECV_SLOT + i * HDR_SLOT;
        let h = &mut self.ctrl.as_mut_slice()[off..off + len];
        h[..ISER_HDR_LEN].copy_from_slice(&hdr.encode());
        let ahs_words = if long { (EXT_CDB_AHS_LEN / 4) as u8 } else { 0 };
        h[ISER_HDR_LEN..ISER_HEADERS_LEN]
            .copy_from_slice(&Bhs::ScsiCmd(cmd).encode(ahs_words, imm as u32));
        if long {
            let a = &mut h[ISER_HEADERS_LEN..];
            // AHSLength 17 (the reserved byte and 16 CDB bytes), type 1.
            a[..4].copy_from_slice(&[0, 17, crate::pdu::ahs::AHS_EXTENDED_CDB, 0]);
            a[4..].copy_from_slice(&cdb[16..]);
        }
        (off, len)
    }
}

/// Why a task was not admitted or mapped (its buffers go back with the
/// [`SubmitError`]).
enum Refusal {
    NotReady,
    Busy,
    Invalid(&'static str),
    Verbs(String),
}

impl Refusal {
    fn with(self, bufs: Option<SgList>) -> SubmitError {
        match self {
            Refusal::NotReady => SubmitError::NotReady(bufs),
            Refusal::Busy => SubmitError::Busy(bufs),
            Refusal::Invalid(why) => SubmitError::Invalid(why, bufs),
            Refusal::Verbs(e) => SubmitError::Verbs(e, bufs),
        }
    }
}

/// A task's data as work-request SGEs (no allocation: fixed arrays), and
/// the tuples' SGEs of an offloaded DIX task.
struct PageList {
    sges: [Sge; MAX_SGES],
    n: usize,
    prot: [Sge; MAX_SGES],
    np: usize,
    first_arena: Option<ArenaId>,
}

impl PageList {
    fn push(&mut self, sge: Sge, arena: ArenaId) {
        self.first_arena.get_or_insert(arena);
        self.sges[self.n] = sge;
        self.n += 1;
    }

    /// The arena when the SGEs are one contiguous run of one
    /// registration (what a pre-registered arena's rkey can cover).
    fn one_run(&self) -> Option<ArenaId> {
        let s = &self.sges[..self.n];
        let contiguous = s
            .windows(2)
            .all(|w| w[1].lkey == w[0].lkey && w[1].addr == w[0].addr + u64::from(w[0].length));
        self.first_arena.filter(|_| contiguous)
    }
}

/// Bytes of an extended CDB AHS carrying CDB bytes 16..32.
const EXT_CDB_AHS_LEN: usize = 20;

/// The BHS part of a CDB.
fn first_16(cdb: &[u8; 32]) -> [u8; 16] {
    let mut c = [0u8; 16];
    c.copy_from_slice(&cdb[..16]);
    c
}
