//! What the block layer does to a buffer in DIX mode (Linux's
//! `write_generate=1 read_verify=1`), for `pollux-perf`'s jobs with
//! `--pi dix`: each buffer holds its data followed by one 8-byte tuple per
//! block; the tuples are generated before a write and verified after a
//! read. The same work per I/O whichever transport then carries them.

use pollux_pi::{Buffers, BuffersMut, PiParams, PiType, TUPLE_SIZE};

/// What the block layer does in DIX mode (`write_generate=1
/// read_verify=1`): tuples generated into the buffer after the data
/// before a write, verified there after a read.
#[derive(Debug, Clone, Copy)]
pub struct Dix {
    block: usize,
    data: usize,
    pi_type: PiType,
}

impl Dix {
    /// Blocks of `block` bytes, `data` bytes per I/O, Type `pi_type` (1–3;
    /// anything else is Type 1).
    pub fn new(block: usize, data: usize, pi_type: u8) -> Self {
        let pi_type = PiType::from_number(pi_type).unwrap_or(PiType::Type1);
        Dix {
            block,
            data,
            pi_type,
        }
    }

    fn params(&self, lba: u64) -> PiParams {
        PiParams::for_lba(self.pi_type, self.block, lba, 0)
    }

    /// Generate the tuples of `buf`'s data written at `lba`.
    pub fn generate(&self, buf: &mut [u8], lba: u64) -> bool {
        let Some(b) = buf.get_mut(..self.data + self.data / self.block * TUPLE_SIZE) else {
            return false;
        };
        let (data, pi) = b.split_at_mut(self.data);
        pollux_pi::generate(BuffersMut::Dix { data, pi }, &self.params(lba)).is_ok()
    }

    /// Verify the tuples of `buf`'s data read at `lba`.
    pub fn verify(&self, buf: &[u8], lba: u64) -> bool {
        let Some(b) = buf.get(..self.data + self.data / self.block * TUPLE_SIZE) else {
            return false;
        };
        let (data, pi) = b.split_at(self.data);
        pollux_pi::verify(Buffers::Dix { data, pi }, &self.params(lba)).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dix_tuples_follow_the_data_and_catch_a_changed_block() {
        for ty in [1u8, 3] {
            let d = Dix::new(512, 4096, ty);
            let mut buf = vec![7u8; 4096 + 64 + 100];
            assert!(d.generate(&mut buf, 77));
            assert!(d.verify(&buf, 77));
            // Type 1's ref tags follow the LBA; Type 3's do not.
            assert_eq!(d.verify(&buf, 78), ty == 3);
            buf[1000] ^= 1;
            assert!(!d.verify(&buf, 77));
            assert!(!d.generate(&mut [0u8; 4096], 0), "no room for the tuples");
        }
    }
}
