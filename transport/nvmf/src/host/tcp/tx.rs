//! The send side of one NVMe/TCP host queue: the shared [`SegQueue`]
//! keyed by slot. PDU headers, digests and small payloads go into its
//! send buffer; a payload of [`BY_REF_MIN`] bytes or more (in-capsule
//! data, H2CData) stays in the caller's buffers, lent by the core per slot
//! ([`SlotBufs`]), and is followed by a mark of its slot, so the queue
//! hears when the command's buffers are no longer referred to.

use pollux_reactor::mem::SgList;

use super::super::transport::SlotBufs;
pub(super) use crate::tcp_tx::BY_REF_MIN;
use crate::tcp_tx::{SegQueue, SegSource};

/// What a host queue has to send, in order; marks name slots.
pub(super) type TxQueue = SegQueue<u16>;

/// Queued write data is read from the slots the core lends.
impl SegSource<u16> for dyn SlotBufs + '_ {
    fn seg_bufs(&self, slot: u16) -> Option<&SgList> {
        self.bufs(slot)
    }
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind;

    use pollux_reactor::mem::SgList;

    use super::{SlotBufs, TxQueue};
    use crate::spec::tcp::PduType;
    use crate::tcp_test_io::{data, flat, Trickle};
    use crate::tcp_tx::MAX_IOV;

    /// Slots' buffers.
    struct Slots(Vec<Option<SgList>>);

    impl SlotBufs for Slots {
        fn bufs(&self, slot: u16) -> Option<&SgList> {
            self.0.get(usize::from(slot))?.as_ref()
        }

        fn bufs_mut(&mut self, slot: u16) -> Option<&mut SgList> {
            self.0.get_mut(usize::from(slot))?.as_mut()
        }
    }

    #[test]
    fn a_payload_over_more_buffers_than_one_writev_takes_goes_out_whole() {
        let slots = Slots(vec![Some(data(29, 0, 40, 512))]);
        let all = flat(slots.0[0].as_ref().expect("data"));
        let mut q = TxQueue::new(1024, 1);
        q.push_pdu(PduType::H2cData, &[0u8; 24], 0, all.len());
        let mut want = q.buf.unsent_bytes().to_vec();
        q.push_ref(0, slots.0[0].as_ref().expect("data"), 0, all.len());
        q.mark(0);
        want.extend_from_slice(&all);
        let mut sock = Trickle::new(usize::MAX / 2);
        let mut named = 0;
        while !q.is_empty() {
            q.flush(&mut sock, &slots as &dyn SlotBufs, &mut |_| named += 1)
                .expect("flush");
        }
        assert!(sock.out == want);
        assert_eq!(named, 1);
        assert!(sock.max_slices <= MAX_IOV);
    }

    #[test]
    fn a_slot_whose_buffers_are_not_lent_is_an_error_not_a_short_stream() {
        let held = data(29, 0, 1, 4096);
        let mut q = TxQueue::new(1024, 1);
        q.push_ref(0, &held, 0, 4096);
        let mut sock = Trickle::new(100_000);
        let e = q
            .flush(&mut sock, &Slots(vec![None]) as &dyn SlotBufs, &mut |_| {})
            .expect_err("not lent");
        assert_eq!(e.kind(), ErrorKind::InvalidData);
        assert!(sock.out.is_empty());
        q.discard(&mut |_| {});
        assert!(q.is_empty());
    }
}
