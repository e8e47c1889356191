//! T10 PI on the host side of NVMe-oF, in software: what a host puts on
//! the wire for a namespace formatted with PI, in one of three modes
//! ([`HostPi`]), and the conversions between the caller's memory and the
//! wire's extended blocks. Where an HCA with signature offload would do
//! this in its integrity MR, these functions do the same work on the CPU
//! (the soft provider and rxe have no NVMe-oF integrity path here).
//!
//! | mode | caller's memory | wire | PRINFO |
//! | --- | --- | --- | --- |
//! | [`HostPi::Pract`] | data | data | PRACT + checks: the controller generates, checks and strips |
//! | [`HostPi::Insert`] | data | data ‖ tuple per block | checks: the host generates on writes, checks and strips on reads |
//! | [`HostPi::Dix`] | data, then one tuple per block | data ‖ tuple per block | checks: the caller's tuples are checked and interleaved on writes; the wire's checked and separated on reads |
//!
//! The checks are the guard and (Types 1 and 2) the reference tag, as
//! Linux's host asks; the reference tags start at the LBA (Type 1; Type 2
//! uses the same seed) and are opaque on Type 3. Namespaces whose metadata
//! is larger than the tuple are left to [`Qpair::rw_pi`](super::Qpair::rw_pi)
//! callers.

use std::str::FromStr;

use pollux_pi::{PiError, PiParams, PiType, TUPLE_SIZE};

use super::NsInfo;
use crate::spec::nvm::{prinfo, RwPi};
use crate::OptionValueError;

/// How the host treats a PI namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPi {
    /// No PI in host memory nor on the wire (PRACT).
    Pract,
    /// No PI in host memory; the host inserts and strips it.
    Insert,
    /// PI in host memory after the data (DIX), interleaved on the wire.
    Dix,
}

impl FromStr for HostPi {
    type Err = OptionValueError;
    fn from_str(s: &str) -> Result<Self, OptionValueError> {
        match s {
            "off" | "pract" => Ok(HostPi::Pract),
            "insert" | "both" => Ok(HostPi::Insert),
            "dix" => Ok(HostPi::Dix),
            _ => Err(OptionValueError::HostPi(s.to_owned())),
        }
    }
}

/// One I/O whose PI the transport's signature offload handles
/// ([`HostQueue::queue_cmd_pi`](super::HostQueue::queue_cmd_pi)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PiIo {
    /// [`HostPi::Insert`] or [`HostPi::Dix`].
    pub mode: HostPi,
    /// The namespace's format.
    pub fmt: PiNs,
    /// First LBA.
    pub slba: u64,
    /// Blocks.
    pub nlb: u32,
    /// A write (else a read).
    pub write: bool,
    /// Ask the controller to check the tuples too (PRCHK guard and
    /// reference tag); `false` leaves the checks to the host alone.
    pub target_checks: bool,
}

impl PiIo {
    /// The protection fields of its command.
    pub fn rw_pi(&self) -> RwPi {
        let mut f = self.fmt.rw_pi(self.mode, self.slba);
        if !self.target_checks {
            f.prinfo &= prinfo::PRACT;
        }
        f
    }

    /// Bytes of the caller's data (without tuples).
    pub fn data_len(&self) -> usize {
        self.nlb as usize * self.fmt.block
    }

    /// Bytes on the wire.
    pub fn wire_len(&self) -> usize {
        self.fmt.wire_len(self.mode, self.nlb as usize)
    }

    /// Bytes of the caller's tuples (DIX), else 0.
    pub fn pi_len(&self) -> usize {
        self.fmt.mem_len(self.mode, self.nlb as usize) - self.data_len()
    }

    /// The protection interval (block size).
    pub fn interval(&self) -> u32 {
        self.fmt.block as u32
    }

    /// The first block's reference tag (0 on Type 3).
    pub fn ref_seed(&self) -> u32 {
        self.fmt.pi_type.seed(self.slba)
    }

    /// Whether the reference tag is checked and incremented (Types 1, 2).
    pub fn ref_checked(&self) -> bool {
        self.fmt.pi_type != PiType::Type3
    }
}

/// A namespace's PI format as the host uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PiNs {
    block: usize,
    pi_type: PiType,
}

impl PiNs {
    /// The PI format of `ns`; `None` without PI, or with metadata other
    /// than exactly the tuple (which these conversions do not cover).
    pub fn of(ns: &NsInfo) -> Option<Self> {
        if ns.md_size as usize != TUPLE_SIZE {
            return None;
        }
        let pi_type = PiType::from_number(ns.pi_type)?;
        Some(PiNs {
            block: ns.block_size as usize,
            pi_type,
        })
    }

    /// The protection fields of an I/O at `slba` in `mode`.
    pub fn rw_pi(&self, mode: HostPi, slba: u64) -> RwPi {
        let mut p = prinfo::PRCHK_GUARD;
        if self.pi_type != PiType::Type3 {
            p |= prinfo::PRCHK_REF;
        }
        if mode == HostPi::Pract {
            p |= prinfo::PRACT;
        }
        RwPi {
            prinfo: p,
            ilbrt: self.pi_type.seed(slba),
            lbat: 0,
            lbatm: 0,
        }
    }

    fn params(&self, slba: u64) -> PiParams {
        PiParams::for_lba(self.pi_type, self.block, slba, 0)
    }

    /// Bytes of `nlb` blocks on the wire.
    pub fn wire_len(&self, mode: HostPi, nlb: usize) -> usize {
        match mode {
            HostPi::Pract => nlb * self.block,
            HostPi::Insert | HostPi::Dix => nlb * (self.block + TUPLE_SIZE),
        }
    }

    /// Bytes of `nlb` blocks in the caller's memory.
    pub fn mem_len(&self, mode: HostPi, nlb: usize) -> usize {
        match mode {
            HostPi::Pract | HostPi::Insert => nlb * self.block,
            HostPi::Dix => nlb * (self.block + TUPLE_SIZE),
        }
    }

    /// A write's wire image of `mem` (blocks at `slba`) in `wire`: the
    /// tuples generated (insert), or the caller's checked and interleaved
    /// (DIX). Nothing to do for [`HostPi::Pract`].
    ///
    /// # Errors
    /// The first bad tuple of the caller's (DIX), or a length mismatch.
    pub fn to_wire(
        &self,
        mode: HostPi,
        mem: &[u8],
        wire: &mut [u8],
        slba: u64,
    ) -> Result<(), PiError> {
        let p = self.params(slba);
        match mode {
            HostPi::Pract => Ok(()),
            HostPi::Insert => pollux_pi::insert(mem, wire, &p),
            HostPi::Dix => {
                let n = wire.len() / (self.block + TUPLE_SIZE);
                let (data, pi) = mem.split_at(mem.len().min(n * self.block));
                pollux_pi::verify(pollux_pi::Buffers::Dix { data, pi }, &p)?;
                pollux_pi::interleave(data, pi, wire, self.block)
            }
        }
    }

    /// A read's wire image `wire` (blocks at `slba`) back into `mem`: the
    /// tuples checked, then dropped (insert) or kept after the data (DIX).
    ///
    /// # Errors
    /// The first bad tuple, or a length mismatch (the data are copied
    /// anyway for DIX).
    pub fn from_wire(
        &self,
        mode: HostPi,
        wire: &[u8],
        mem: &mut [u8],
        slba: u64,
    ) -> Result<(), PiError> {
        let p = self.params(slba);
        match mode {
            HostPi::Pract => Ok(()),
            HostPi::Insert => pollux_pi::strip(wire, mem, &p),
            HostPi::Dix => {
                let n = wire.len() / (self.block + TUPLE_SIZE);
                let (data, pi) = mem.split_at_mut(n * self.block);
                pollux_pi::deinterleave(wire, data, pi, self.block)?;
                pollux_pi::verify(pollux_pi::Buffers::Dif(wire), &p)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(pi_type: u8, md: u32) -> NsInfo {
        NsInfo {
            nsid: 1,
            block_size: 512,
            num_blocks: 1024,
            md_size: md,
            pi_type,
            pi_first: false,
        }
    }

    #[test]
    fn formats_and_fields() {
        assert!(PiNs::of(&ns(0, 8)).is_none());
        assert!(PiNs::of(&ns(1, 16)).is_none());
        let t1 = PiNs::of(&ns(1, 8)).unwrap();
        let f = t1.rw_pi(HostPi::Pract, 0x1_0000_0007);
        assert_eq!(
            f.prinfo,
            prinfo::PRACT | prinfo::PRCHK_GUARD | prinfo::PRCHK_REF
        );
        assert_eq!(f.ilbrt, 7);
        let t3 = PiNs::of(&ns(3, 8)).unwrap();
        assert_eq!(t3.rw_pi(HostPi::Insert, 9).prinfo, prinfo::PRCHK_GUARD);
        assert_eq!(
            (t1.wire_len(HostPi::Pract, 2), t1.wire_len(HostPi::Dix, 2)),
            (1024, 1040)
        );
        assert_eq!(
            (t1.mem_len(HostPi::Insert, 2), t1.mem_len(HostPi::Dix, 2)),
            (1024, 1040)
        );
        assert_eq!("off".parse(), Ok(HostPi::Pract));
        assert!("bogus".parse::<HostPi>().is_err());
    }

    #[test]
    fn insert_and_dix_round_trip_and_catch_bad_tuples() {
        let t1 = PiNs::of(&ns(1, 8)).unwrap();
        let data: Vec<u8> = (0..1536).map(|i| (i * 7) as u8).collect();
        let mut wire = vec![0u8; 1560];
        t1.to_wire(HostPi::Insert, &data, &mut wire, 40).unwrap();
        let mut back = vec![0u8; 1536];
        t1.from_wire(HostPi::Insert, &wire, &mut back, 40).unwrap();
        assert_eq!(back, data);
        // Read at another LBA: the ref tags do not match.
        assert!(t1.from_wire(HostPi::Insert, &wire, &mut back, 41).is_err());
        // DIX: the wire's tuples come back after the data and go out again.
        let mut mem = vec![0u8; 1560];
        t1.from_wire(HostPi::Dix, &wire, &mut mem, 40).unwrap();
        assert_eq!(&mem[..1536], &data[..]);
        let mut again = vec![0u8; 1560];
        t1.to_wire(HostPi::Dix, &mem, &mut again, 40).unwrap();
        assert_eq!(again, wire);
        mem[1536 + 8] ^= 1; // block 1's guard
        let e = t1.to_wire(HostPi::Dix, &mem, &mut again, 40).unwrap_err();
        assert_eq!(e.kind, pollux_pi::PiErrorKind::Guard);
    }
}
