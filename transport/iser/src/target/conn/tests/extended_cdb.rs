//! READ(32)/WRITE(32) through the connection (a PI Type 2 LU): bytes
//! 16..32 come in the extended CDB AHS; a 32-byte CDB whose AHS is
//! missing or short is refused (INVALID FIELD IN CDB), not decoded as
//! zero-padded (which read as a transfer of 0 blocks: GOOD, nothing
//! written).

use super::*;
use crate::pdu::ahs::{encode_ahs, AHS_EXTENDED_CDB};
use crate::scsi::cdb::{rw32_cdb, PiTags};

/// The fixture's target with a PI Type 2 LU as LUN 0.
fn type2_fixture() -> Fx {
    let reg = BdevRegistry::new();
    let bdev = reg
        .create("malloc:size=4M,block=512,md=8,md_interleave=true,pi=2,name=t2")
        .expect("type 2 bdev");
    fixture_node(false, small_target(), None, vec![(0, bdev.clone())], bdev)
}

impl Fx {
    /// Send the 32-byte `cdb` with `ext` bytes of it (16.., at most 16) in
    /// an extended CDB AHS, all its data-out immediate; the response.
    fn cmd32(
        &mut self,
        cdb: &[u8; 32],
        ext: usize,
        edtl: u32,
        write: Option<&[u8]>,
    ) -> (ScsiResponse, Option<Sense>, Vec<u8>) {
        let mut c = [0u8; 16];
        c.copy_from_slice(&cdb[..16]);
        self.itt += 1;
        let cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read: write.is_none(),
            write: write.is_some(),
            attr: TaskAttr::Simple,
            lun: Lun::from_index(0),
            itt: self.itt,
            edtl,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: 0,
            cdb: c,
        };
        self.cmd_sn += 1;
        let mut ahs = Vec::new();
        if ext > 0 {
            encode_ahs(AHS_EXTENDED_CDB, &cdb[16..16 + ext], &mut ahs);
        }
        let data = write.unwrap_or(&[]);
        let mut v = Bhs::ScsiCmd(cmd)
            .encode((ahs.len() / 4) as u8, data.len() as u32)
            .to_vec();
        v.extend_from_slice(&ahs);
        v.extend_from_slice(data);
        self.ops.mem.insert(1, vec![0; edtl as usize]);
        let hdr = IserHeader::Control {
            write: None,
            read: write.is_none().then_some(Stag { stag: 1, va: 0 }),
        };
        let before = self.ops.sent.len();
        self.pdu(hdr, &v);
        for _ in 0..10_000 {
            if let Some(Ok(p)) = self.ops.sent.get(before).map(|(p, _)| Pdu::parse(p)) {
                if let Bhs::ScsiRsp(r) = p.bhs {
                    let sense = (p.data.len() > 2)
                        .then(|| Sense::parse(&p.data[2..]))
                        .flatten();
                    return (r, sense, self.ops.mem[&1].clone());
                }
            }
            self.cl.poll_once_all();
            self.conn.poll(&mut self.ops);
        }
        panic!("no response");
    }
}

#[test]
fn a_32_byte_cdb_needs_its_whole_extended_cdb() {
    let mut fx = type2_fixture();
    fx.login(INI, "Normal");
    let tags = PiTags {
        ref_tag: 0x40,
        app_tag: 0,
        app_mask: 0,
    };
    let data = pattern(3, 512);
    let w = rw32_cdb(true, 64, 1, 0, tags);
    let r = rw32_cdb(false, 64, 1, 0, tags);
    // The whole CDB: written and read back.
    let (rsp, s, _) = fx.cmd32(&w, 16, 512, Some(&data));
    assert_eq!((rsp.status, s), (0, None));
    let (rsp, s, d) = fx.cmd32(&r, 16, 512, None);
    assert_eq!((rsp.status, s, d), (0, None, data.clone()));
    // No AHS, or a short one: INVALID FIELD IN CDB, nothing written.
    let other = pattern(9, 512);
    for ext in [0, 8] {
        let (rsp, s, _) = fx.cmd32(&w, ext, 512, Some(&other));
        assert_eq!(rsp.status, sense::CHECK_CONDITION, "AHS of {ext}");
        assert_eq!(s.map(|s| s.code()), Some((5, 0x24, 0)));
        let (rsp, s, _) = fx.cmd32(&r, ext, 512, None);
        assert_eq!(s.map(|s| s.code()), Some((5, 0x24, 0)), "AHS of {ext}");
        assert_eq!(rsp.status, sense::CHECK_CONDITION);
    }
    assert_eq!(fx.cmd32(&r, 16, 512, None).2, data);
}
