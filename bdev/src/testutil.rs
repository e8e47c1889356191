//! Helpers shared by the unit tests: a completion recorder and buffers.

use std::cell::RefCell;
use std::rc::Rc;

use pollux_reactor::{mem::DmaBuf, CoreId, Reactor};

use crate::io::{CompletedIo, IoCompletion, OwnedIo, SgList};

/// Records every completion it gets, with the core it ran on.
#[derive(Default)]
pub(crate) struct Recorder {
    pub(crate) done: RefCell<Vec<(Option<CoreId>, OwnedIo)>>,
}

impl IoCompletion for Recorder {
    fn complete(&self, io: CompletedIo<'_>) {
        let core = Reactor::current().map(|r| r.core());
        self.done.borrow_mut().push((core, io.into_owned()));
    }
}

impl Recorder {
    pub(crate) fn new() -> (Rc<Recorder>, Rc<dyn IoCompletion>) {
        let r = Rc::new(Recorder::default());
        let cb: Rc<dyn IoCompletion> = r.clone();
        (r, cb)
    }

    pub(crate) fn len(&self) -> usize {
        self.done.borrow().len()
    }

    /// Takes the completions recorded so far.
    pub(crate) fn take(&self) -> Vec<(Option<CoreId>, OwnedIo)> {
        std::mem::take(&mut *self.done.borrow_mut())
    }

    /// Takes the only completion recorded so far.
    pub(crate) fn one(&self) -> OwnedIo {
        let mut v = self.take();
        assert_eq!(v.len(), 1, "expected exactly one completion");
        v.remove(0).1
    }
}

/// A buffer of `len` bytes filled with `fill`.
pub(crate) fn buf(len: usize, fill: u8) -> DmaBuf {
    let mut b = DmaBuf::alloc(len).unwrap();
    b.as_mut_slice().fill(fill);
    b
}

/// A scatter-gather list with segments of the given lengths, each filled with `fill`.
pub(crate) fn sg(lens: &[usize], fill: u8) -> SgList {
    lens.iter().map(|&l| buf(l, fill)).collect()
}

/// A scatter-gather list carrying `data`, split into segments of the given lengths.
pub(crate) fn sg_with(data: &[u8], lens: &[usize]) -> SgList {
    assert_eq!(lens.iter().sum::<usize>(), data.len());
    let mut l = sg(lens, 0);
    assert_eq!(l.copy_from_slice(data), data.len());
    l
}

/// The bytes of a list, concatenated.
pub(crate) fn bytes_of(l: &SgList) -> Vec<u8> {
    let mut v = vec![0u8; l.total_len()];
    l.copy_to_slice(&mut v);
    v
}

/// Deterministic pseudo-random bytes.
pub(crate) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
