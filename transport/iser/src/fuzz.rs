//! Fuzz entry points: each takes arbitrary bytes and must never panic.
//! A unit test runs them over thousands of seeded random and mutated
//! inputs; a `cargo fuzz` target can call them directly.

use std::cell::Cell;

use crate::pdu::{IserCmHdr, IserHeader, Pdu, ISER_HDR_LEN};
use crate::scsi::{Disk, DiskInfo};
use crate::session::{LoginEnv, LoginStatus, LoginTargetInfo, TargetLimits, TargetLogin};

/// Parse `data` as iSER header + PDU; whatever parses must re-encode to a
/// PDU that parses to the same header.
pub fn fuzz_pdu(data: &[u8]) {
    let _ = IserCmHdr::parse(data);
    if let Ok(h) = IserHeader::parse(data) {
        let again = IserHeader::parse(&h.encode());
        assert_eq!(again, Ok(h), "iSER header round trip");
    }
    for body in [data, data.get(ISER_HDR_LEN..).unwrap_or(&[])] {
        if let Ok(p) = Pdu::parse(body) {
            let raw = p.bhs.encode((p.ahs.len() / 4) as u8, p.data.len() as u32);
            let mut v = raw.to_vec();
            v.extend_from_slice(p.ahs);
            v.extend_from_slice(p.data);
            let q = Pdu::parse(&v).map(|q| q.bhs);
            assert_eq!(q, Ok(p.bhs), "PDU round trip");
        }
    }
}

fn fuzz_disk() -> Disk {
    let info = pollux_bdev::BdevInfo::new("fz", "Fuzz disk", 512, 4096)
        .and_then(|i| i.with_metadata(8, true, pollux_bdev::PiType::Type1));
    match info {
        Ok(i) => Disk::new(DiskInfo::from_bdev(&i, true, true, 65536)),
        Err(_) => unreachable!("static geometry is valid"),
    }
}

/// Execute `data` as a CDB (first 16 bytes) with the rest as data-out.
pub fn fuzz_cdb(data: &[u8]) {
    let d = fuzz_disk();
    let (cdb, rest) = data.split_at(data.len().min(16));
    let mut out = [0u8; 512];
    if let Ok(crate::scsi::Action::NeedData(_)) = d.exec(cdb, &mut out) {
        let _ = d.exec_with_data(cdb, rest);
    }
    let _ = crate::scsi::commands::unmap::parse(rest, u32::MAX);
    let mut v = [0u8; 4 * 520];
    let n = rest.len().min(v.len());
    v[..n].copy_from_slice(&rest[..n]);
    crate::scsi::pi::spread(&mut v, 512, n / 520);
    crate::scsi::pi::strip(&mut v, 512, n / 520);
}

struct FuzzEnv(Cell<u16>);

impl LoginEnv for FuzzEnv {
    fn authorize(&self, _i: &str, t: Option<&str>) -> Result<LoginTargetInfo, LoginStatus> {
        if t.is_some_and(|t| t.len() % 2 == 1) {
            return Err(LoginStatus::NOT_FOUND);
        }
        Ok(LoginTargetInfo {
            tpgt: 1,
            alias: None,
            limits: TargetLimits::default(),
        })
    }
    fn new_tsih(&self) -> u16 {
        self.0.set(self.0.get().wrapping_add(1).max(1));
        self.0.get()
    }
}

/// Run `data` through key=value parsing and a login: the first bytes pick
/// the login flags, the rest is split into up to three login PDUs' text.
pub fn fuzz_login_text(data: &[u8]) {
    let _ = crate::pdu::text::parse_text(data);
    let env = FuzzEnv(Cell::new(0));
    let mut login = TargetLogin::new(1);
    let mut out = Vec::new();
    let flags = data.first().copied().unwrap_or(0);
    let rest = data.get(1..).unwrap_or(&[]);
    let third = rest.len() / 3;
    for (i, chunk) in [&rest[..third], &rest[third..2 * third], &rest[2 * third..]]
        .into_iter()
        .enumerate()
    {
        let mut bhs = [0u8; 48];
        bhs[0] = 0x43;
        bhs[1] = flags.rotate_left(i as u32 * 2);
        let Ok(crate::pdu::Bhs::LoginReq(req)) = crate::pdu::Bhs::parse(&bhs).map(|(_, b)| b)
        else {
            continue;
        };
        let _ = crate::session::SessionParams::default();
        let (_, step) = login.on_request(&req, chunk, &env, &mut out);
        if !matches!(step, crate::session::LoginStep::Continue) {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
        let mut v = seed.to_vec();
        for _ in 0..1 + rng.below(6) {
            match rng.below(5) {
                0 if !v.is_empty() => {
                    let i = rng.below(v.len());
                    v[i] ^= 1 << rng.below(8);
                }
                1 if !v.is_empty() => {
                    let i = rng.below(v.len());
                    v[i] = rng.next() as u8;
                }
                2 => v.truncate(rng.below(v.len() + 1)),
                3 => v.extend((0..rng.below(16)).map(|_| rng.next() as u8)),
                _ if !v.is_empty() => {
                    let i = rng.below(v.len());
                    v[i] = [0, 0xFF, 0x80, 0x7F, 1][rng.below(5)];
                }
                _ => {}
            }
        }
        v
    }

    fn seeds_pdu() -> Vec<Vec<u8>> {
        use crate::pdu::*;
        let mut s = Vec::new();
        let mut cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read: false,
            write: true,
            attr: TaskAttr::Simple,
            lun: Lun::from_index(0),
            itt: 1,
            edtl: 8,
            cmd_sn: 1,
            exp_stat_sn: 1,
            cdb: [0; 16],
        };
        cmd.cdb[0] = 0x2A;
        let mut v = IserHeader::PLAIN.encode().to_vec();
        v.extend_from_slice(&Bhs::ScsiCmd(cmd).encode(0, 8));
        v.extend_from_slice(&[1; 8]);
        s.push(v);
        let mut t = Vec::new();
        text::push_pair(&mut t, "SendTargets", "All");
        let tp = TextPdu {
            final_: true,
            itt: 3,
            ttt: RESERVED_TAG,
            ..Default::default()
        };
        let mut v = Bhs::TextReq(tp).encode(0, t.len() as u32).to_vec();
        v.extend_from_slice(&t);
        s.push(v);
        s.push(Bhs::ScsiRsp(ScsiResponse::default()).encode(0, 0).to_vec());
        s
    }

    #[test]
    fn fuzzers_never_panic_on_seeded_inputs() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let pdus = seeds_pdu();
        let cdbs: Vec<Vec<u8>> = vec![
            vec![0x12, 1, 0x83, 0, 0xFF, 0],
            vec![0x28, 0x20, 0, 0, 0, 1, 0, 0, 8, 0],
            [
                vec![0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0, 0, 0, 0, 0, 0, 0],
                vec![
                    0, 22, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0, 0,
                ],
            ]
            .concat(),
            vec![0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0],
            vec![0x1A, 0, 0x3F, 0, 0xFF, 0],
        ];
        let mut text = vec![0x87];
        crate::pdu::text::push_pair(&mut text, "InitiatorName", "iqn.x");
        crate::pdu::text::push_pair(&mut text, "TargetName", "iqn.yy");
        crate::session::SessionParams::initiator_offer(&mut text, 8192, 65536, 8192);
        for i in 0..4000 {
            let raw: Vec<u8> = (0..rng.below(120)).map(|_| rng.next() as u8).collect();
            fuzz_pdu(&raw);
            fuzz_cdb(&raw);
            fuzz_login_text(&raw);
            let p = mutate(&mut rng, &pdus[i % pdus.len()]);
            fuzz_pdu(&p);
            let c = mutate(&mut rng, &cdbs[i % cdbs.len()]);
            fuzz_cdb(&c);
            let t = mutate(&mut rng, &text);
            fuzz_login_text(&t);
        }
    }

    /// cargo-fuzz finding (iscsi_pdu): a Login Request without T whose
    /// NSG bits were set did not survive an encode/parse round trip.
    #[test]
    fn login_nsg_without_transit_round_trips() {
        let mut bhs = [0u8; 48];
        bhs[0] = 0x43;
        bhs[1] = 0x07; // T=0, C=0, CSG=1, NSG=3 (ignored without T)
        bhs[13] = 2;
        fuzz_pdu(&bhs);
    }
}
