//! Fuzz entry point for the NVMe/TCP host (feature `fuzzing`; always built
//! for this crate's tests): [`fuzz_tcp_host`] connects a host queue
//! ([`Qpair`] over [`TcpQueue`]) to a scripted target on 127.0.0.1, puts
//! four commands in flight and sends the input to the host as the target's
//! byte stream. The commands take the CIDs 0 to 3 on a fresh queue, so
//! seeds can answer them: a 6 KiB read into two buffers (CID 0), a 1 KiB
//! in-capsule write (1), a 12 KiB write by R2T (2), a Flush (3).
//!
//! The host must not panic; every command must end exactly once, with its
//! caller's buffers whole and a write's data unchanged; after the stream
//! (the target closes its end, or the host is told to disconnect) nothing
//! may be outstanding. The first input byte selects the digests the
//! ICResp grants (bits 0-1), a MAXH2CDATA of 64 KiB rather than 4 KiB
//! (bit 2), and whether the target closes after its bytes (bit 3).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::Duration;

use pollux_reactor::mem::{DmaBuf, SgList};

use crate::host::tcp::{TcpHostOptions, TcpQueue};
use crate::host::{Completion, DataDir, Qpair, QueueParams};
use crate::spec::cmd::{IoOpcode, NvmeCmd};
use crate::spec::tcp::{Digests, IcResp, IC_PDU_LEN};

/// Host polls for the stream to go in, and for the commands to end once
/// the host was told to disconnect (a finding past either bound).
const POLLS: usize = 20_000;

/// Host polls, once the stream is in, before the host is told to
/// disconnect: on loopback every byte is in its socket by then.
const SETTLE_POLLS: usize = 500;

/// The commands in flight, by CID: direction, bytes, buffers.
const CMDS: [(DataDir, usize, usize); 4] = [
    (DataDir::FromCtrl, 6144, 2),
    (DataDir::ToCtrl, 1024, 1),
    (DataDir::ToCtrl, 12288, 3),
    (DataDir::None, 0, 0),
];

/// The largest write that goes in the capsule.
const INLINE_LIMIT: u32 = 4096;

/// The byte command `ctx`'s buffers are filled with.
fn fill(ctx: usize) -> u8 {
    0x40 + ctx as u8
}

/// `len` bytes of `fill` in `parts` buffers of uneven sizes (none a
/// multiple of a PDU's data); also the NVMe/TCP host tests' buffers.
pub(crate) fn segments(len: usize, parts: usize, fill: u8) -> SgList {
    let mut l = SgList::new();
    let mut left = len;
    for p in 0..parts {
        let n = if p + 1 == parts {
            left
        } else {
            (len / parts + 37 * p + 11).min(left)
        };
        if n == 0 {
            continue;
        }
        let mut b = DmaBuf::alloc(n).expect("a test buffer");
        b.as_mut_slice().fill(fill);
        l.push(b);
        left -= n;
    }
    assert_eq!(l.total_len(), len);
    l
}

/// Checks one completion against what was submitted; `ended` marks it
/// (`Some(true)`: it succeeded, a read with all of the bytes
/// [`READ_FILL`] the good seeds send).
fn check(c: &Completion, ended: &mut [Option<bool>; 4]) {
    let ctx = usize::try_from(c.ctx).unwrap_or(usize::MAX);
    let Some(&(dir, len, _)) = CMDS.get(ctx) else {
        panic!("a completion for a command never submitted: ctx {}", c.ctx);
    };
    assert!(ended[ctx].is_none(), "command {ctx} ended twice");
    assert_eq!(c.data.total_len(), len, "command {ctx}'s buffers");
    let mut v = vec![0u8; len];
    c.data.copy_to_slice(&mut v);
    if dir == DataDir::ToCtrl {
        assert!(
            v.iter().all(|&b| b == fill(ctx)),
            "write {ctx}'s data changed"
        );
    }
    let good_data = dir != DataDir::FromCtrl || v.iter().all(|&b| b == READ_FILL);
    ended[ctx] = Some(c.result.is_ok() && good_data);
}

/// The byte of the read data the good seeds send.
pub const READ_FILL: u8 = 0x11;

/// Reads and drops what the host sent (its capsules, data, a TermReq),
/// so that its writes never wait on the scripted target.
fn drain(t: &mut TcpStream) {
    let mut sink = [0u8; 16 << 10];
    while let Ok(n) = t.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
}

/// An NVMe/TCP host queue (QID 1, 16 entries, in-capsule writes up to
/// `inline_limit`) connected to a scripted target on 127.0.0.1 whose
/// ICResp grants `digests` and `maxh2cdata`; the target's end of the
/// socket, non-blocking. Also the NVMe/TCP host tests' set-up.
///
/// # Panics
/// When loopback sockets cannot be had or the handshake fails.
pub(crate) fn scripted_target(
    digests: Digests,
    maxh2cdata: u32,
    inline_limit: u32,
) -> (TcpQueue, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("a loopback listener");
    let addr = l.local_addr().expect("its address");
    let target = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut ic = [0u8; IC_PDU_LEN];
        s.read_exact(&mut ic).expect("the host's ICReq");
        let rsp = IcResp {
            pfv: 0,
            cpda: 0,
            digests,
            maxh2cdata,
        };
        s.write_all(&rsp.encode()).expect("ICResp");
        s
    });
    let opts = TcpHostOptions {
        header_digest: digests.header,
        data_digest: digests.data,
        connect_timeout: Duration::from_secs(10),
    };
    let p = QueueParams {
        qid: 1,
        entries: 16,
        cntlid: 1,
        inline_limit,
    };
    let q = TcpQueue::connect(addr, &opts, &p).expect("connect to the scripted target");
    let t = target.join().expect("the scripted target");
    t.set_nonblocking(true).expect("non-blocking");
    assert_eq!(q.digests(), digests, "the digests the ICResp granted");
    (q, t)
}

/// See the module docs.
///
/// # Panics
/// On a finding; also when loopback sockets cannot be had (the
/// environment, not the host).
pub fn fuzz_tcp_host(data: &[u8]) {
    let _ = run(data);
}

/// [`fuzz_tcp_host`]; for each command, whether it succeeded (a read with
/// the good seeds' data).
fn run(data: &[u8]) -> [bool; 4] {
    let Some((&mode, stream)) = data.split_first() else {
        return [false; 4];
    };
    let digests = Digests::from_bits(mode & 3);
    let maxh2cdata = if mode & 4 != 0 { 64 << 10 } else { 4096 };
    let close = mode & 8 != 0;
    let (q, mut t) = scripted_target(digests, maxh2cdata, INLINE_LIMIT);
    let mut qp = Qpair::new(q, 1, 16, Duration::from_secs(30));
    for (ctx, &(dir, len, parts)) in CMDS.iter().enumerate() {
        let opc = match dir {
            DataDir::ToCtrl => IoOpcode::Write,
            DataDir::FromCtrl => IoOpcode::Read,
            DataDir::None => IoOpcode::Flush,
        };
        let mut cmd = NvmeCmd::new(opc.code(), 0);
        cmd.nsid = 1;
        cmd.cdw12 = (len / 512).saturating_sub(1) as u32;
        qp.submit(cmd, dir, segments(len, parts, fill(ctx)), ctx as u64)
            .expect("submit on a fresh queue");
    }
    qp.flush();
    let mut ended = [None; 4];
    let mut on_done = |c: Completion| check(&c, &mut ended);
    // The stream goes in, the host polled meanwhile.
    let mut at = 0;
    for _ in 0..POLLS {
        if at == stream.len() {
            break;
        }
        match t.write(&stream[at..]) {
            Ok(n) => at += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            // The host closed its end: nothing more goes in.
            Err(_) => break,
        }
        drain(&mut t);
        qp.poll(&mut on_done);
    }
    if close {
        // The target's end of the stream (the host's next write must not
        // be a signal: the socket stays open for reading).
        let _ = t.shutdown(Shutdown::Write);
    }
    for _ in 0..SETTLE_POLLS {
        drain(&mut t);
        qp.poll(&mut on_done);
        if qp.outstanding() == 0 || !qp.is_alive() {
            break;
        }
    }
    if qp.outstanding() > 0 {
        assert!(
            !close || !qp.is_alive(),
            "the target closed, and the host still waits"
        );
        qp.disconnect();
    }
    for _ in 0..POLLS {
        qp.poll(&mut on_done);
        if qp.outstanding() == 0 {
            break;
        }
    }
    assert_eq!(qp.outstanding(), 0, "commands left outstanding");
    assert!(
        ended.iter().all(Option::is_some),
        "commands that never ended: {ended:?}"
    );
    drop(qp);
    drop(t);
    ended.map(|e| e == Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::cpl::{NvmeCompletion, NvmeStatus, StatusCodeType};
    use crate::spec::tcp::{
        C2hData, CapsuleResp, PduType, R2t, SendLayout, TermReq, FLAG_LAST_PDU, FLAG_SUCCESS,
        SHORT_HLEN, TERM_REQ_MAX_DATA,
    };
    use crate::tcp_bufs::SendBuf;

    /// A target's PDU laid out for `digests`.
    fn pdu<const N: usize>(
        digests: Digests,
        t: PduType,
        hdr: &[u8; N],
        flags: u8,
        data: &[u8],
    ) -> Vec<u8> {
        let mut sb = SendBuf::new(1024);
        sb.layout = SendLayout::new(digests, 0);
        sb.push_pdu(t, hdr, flags, data.len());
        if !data.is_empty() {
            sb.push_data(data.len(), |o| o.extend_from_slice(data));
        }
        sb.unsent_bytes().to_vec()
    }

    fn resp(d: Digests, cid: u16, status: NvmeStatus) -> Vec<u8> {
        let cqe = NvmeCompletion::new(1, cid, status).encode();
        pdu(d, PduType::CapsuleResp, &CapsuleResp::encode(&cqe), 0, &[])
    }

    /// The well-behaved answer to the four commands: the read's data in
    /// two C2HData PDUs (the last with SUCCESS), R2Ts for the big write,
    /// responses for the rest.
    fn good(d: Digests, maxh2cdata: usize) -> Vec<u8> {
        let mut v = Vec::new();
        let read = [READ_FILL; 6144];
        for (off, last) in [(0usize, false), (4096, true)] {
            let end = if last { 6144 } else { 4096 };
            let h = C2hData {
                cccid: 0,
                datao: off as u32,
                datal: (end - off) as u32,
            };
            let flags = if last {
                FLAG_LAST_PDU | FLAG_SUCCESS
            } else {
                0
            };
            v.extend(pdu(
                d,
                PduType::C2hData,
                &h.encode(),
                flags,
                &read[off..end],
            ));
        }
        v.extend(resp(d, 1, NvmeStatus::SUCCESS));
        let mut off = 0;
        while off < 12288 {
            let n = (12288 - off).min(maxh2cdata);
            let h = R2t {
                cccid: 2,
                ttag: 1,
                r2to: off as u32,
                r2tl: n as u32,
            };
            v.extend(pdu(d, PduType::R2t, &h.encode(), 0, &[]));
            off += n;
        }
        v.extend(resp(d, 2, NvmeStatus::SUCCESS));
        v.extend(resp(d, 3, NvmeStatus::SUCCESS));
        v
    }

    /// The seeds of `fuzz/seeds/nvmf_tcp_host`: for each mode byte, the
    /// good answer; a C2HTermReq; an error status.
    fn seeds() -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for mode in 0..16u8 {
            let d = Digests::from_bits(mode & 3);
            let max = if mode & 4 != 0 { 64 << 10 } else { 4096 };
            let mut v = vec![mode];
            v.extend(good(d, max));
            out.push(v);
        }
        let mut term = [0u8; SHORT_HLEN + TERM_REQ_MAX_DATA];
        let n = TermReq {
            fes: crate::spec::tcp::Fes::InvalidHeaderField.code(),
            fei: 4,
        }
        .encode_into(true, &[0u8; 24], &mut term);
        out.push([&[0u8][..], &term[..n]].concat());
        let mut v = vec![8u8];
        let invalid_field = NvmeStatus::new(StatusCodeType::Generic, 0x02, true);
        v.extend(resp(Digests::default(), 3, invalid_field));
        out.push(v);
        out
    }

    /// Under every mode the good answer completes every command with
    /// success (the read with the target's bytes); the C2HTermReq ends
    /// all four with errors; the error status fails the Flush only (the
    /// others end when the host disconnects).
    #[test]
    fn a_good_answer_completes_every_command() {
        let s = seeds();
        for (mode, g) in s.iter().take(16).enumerate() {
            assert_eq!(run(g), [true; 4], "mode {mode}");
        }
        assert_eq!(run(&s[16]), [false; 4], "C2HTermReq");
        assert_eq!(run(&s[17]), [false; 4], "error status");
    }

    /// The seeds, every single-byte corruption of the first 120 bytes of
    /// two of them, and truncations: no panic, every command ends once.
    #[test]
    fn seeds_and_their_mutations_never_break_the_host() {
        let seeds = seeds();
        let mut inputs = seeds.clone();
        for s in [&seeds[0], &seeds[15]] {
            for i in 1..120.min(s.len()) {
                let mut m = s.clone();
                m[i] ^= 0xA5;
                inputs.push(m);
            }
            for cut in [1, 9, 24, 50, 200, 4200] {
                inputs.push(s[..cut.min(s.len())].to_vec());
            }
        }
        for i in &inputs {
            fuzz_tcp_host(i);
        }
    }

    /// Writes the seeds to `fuzz/seeds/nvmf_tcp_host` (run by hand after
    /// changing them: `cargo test -p pollux-nvmf --lib write_host_seeds --
    /// --ignored`).
    #[test]
    #[ignore = "writes the checked-in seed files"]
    fn write_host_seeds() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/nvmf_tcp_host");
        std::fs::create_dir_all(&dir).unwrap();
        for (i, s) in seeds().iter().enumerate() {
            std::fs::write(dir.join(format!("seed_{i:02}")), s).unwrap();
        }
    }
}
