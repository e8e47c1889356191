//! Test helpers shared by the NVMe/TCP send queues' unit tests (target and
//! host): a socket that takes a few bytes per write and then would block,
//! and patterned buffer lists.

use std::io::{ErrorKind, IoSlice, Write};

use pollux_reactor::mem::{DmaBuf, SgList};

/// Takes at most `per_call` bytes per write, then would block once.
#[derive(Debug)]
pub(crate) struct Trickle {
    /// Everything written so far.
    pub(crate) out: Vec<u8>,
    per_call: usize,
    took: bool,
    /// Writes that took bytes.
    pub(crate) writes: usize,
    /// The most slices one write was given.
    pub(crate) max_slices: usize,
}

impl Trickle {
    /// A socket taking `per_call` bytes per write.
    pub(crate) fn new(per_call: usize) -> Self {
        Self {
            out: Vec::new(),
            per_call,
            took: false,
            writes: 0,
            max_slices: 0,
        }
    }
}

impl Write for Trickle {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.write_vectored(&[IoSlice::new(b)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        if self.took {
            self.took = false;
            return Err(ErrorKind::WouldBlock.into());
        }
        self.took = true;
        self.writes += 1;
        self.max_slices = self.max_slices.max(bufs.len());
        let mut n = 0;
        for b in bufs {
            let m = b.len().min(self.per_call - n);
            self.out.extend_from_slice(&b[..m]);
            n += m;
            if n == self.per_call {
                break;
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `parts` buffers of `len` bytes, a pattern per slot (`seed` tells two
/// tests' patterns apart).
pub(crate) fn data(seed: usize, slot: usize, parts: usize, len: usize) -> SgList {
    let mut l = SgList::new();
    for p in 0..parts {
        let mut b = DmaBuf::alloc(len).expect("buffer");
        for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
            *x = (slot * seed + p * 7 + i) as u8;
        }
        l.push(b);
    }
    l
}

/// The bytes of a list, concatenated.
pub(crate) fn flat(l: &SgList) -> Vec<u8> {
    l.iter().flat_map(|b| b.as_slice().to_vec()).collect()
}
