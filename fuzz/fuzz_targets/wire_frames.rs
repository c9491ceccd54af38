//! The event-plane frame codec against a reference written from the
//! documented layout: arbitrary bytes never panic, every frame that decodes
//! was exactly the reference's bytes for it and re-encodes to them (and
//! every strict prefix of them only asks for more), and arbitrary frames
//! encode to the reference's bytes and round-trip.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use loadgate::wire::{decode, encode, Ack, Frame, LineWaiting, WireError, MAGIC, MAX_FRAME};
use loadgate::RankLoad;

#[derive(Arbitrary, Debug)]
enum Input {
    /// Bytes off a socket; mostly starting with the magic so frames decode.
    Stream { magic_first: bool, bytes: Vec<u8> },
    /// Frames to encode, concatenate and decode back.
    Frames(Vec<FrameInput>),
}

#[derive(Arbitrary, Debug)]
enum FrameInput {
    Register {
        worker: u64,
        incarnation: u64,
        dp_size: u32,
        model: String,
        http_addr: String,
        pad: u16,
    },
    Load {
        worker: u64,
        incarnation: u64,
        rank: u32,
        seq: u64,
        load: [u32; 5],
    },
    Deregister {
        worker: u64,
        incarnation: u64,
    },
    Challenge {
        nonce: [u8; 32],
    },
    Proof {
        nonce: [u8; 32],
        mac: [u8; 32],
    },
    Welcome {
        mac: [u8; 32],
    },
    FrontendLoad {
        frontend: u64,
        incarnation: u64,
        seq: u64,
        worker: u64,
        worker_incarnation: u64,
        rank: u32,
        load: [u32; 5],
    },
    FrontendBeat {
        frontend: u64,
        incarnation: u64,
        in_flight: u32,
        waiting: u32,
        lines: Vec<(u64, u32)>,
        /// Sometimes enough more lines to pass MAX_FRAME.
        pad: u16,
    },
    FrontendAck {
        frontend: u64,
        incarnation: u64,
        acks: Vec<[u64; 4]>,
        /// Sometimes enough more acks to pass MAX_FRAME.
        pad: u8,
    },
}

fn rank_load([a, b, c, d, e]: [u32; 5]) -> RankLoad {
    RankLoad {
        active_decode_blocks: a,
        kv_total_blocks: b,
        active_prefill_tokens: c,
        max_num_batched_tokens: d,
        waiting_requests: e,
    }
}

impl FrameInput {
    fn frame(self) -> Frame {
        match self {
            FrameInput::Register { worker, incarnation, dp_size, mut model, http_addr, pad } => {
                // Sometimes long enough to hit MAX_FRAME.
                model.extend(std::iter::repeat_n('m', usize::from(pad % 4200)));
                Frame::Register { worker, incarnation, dp_size, model, http_addr }
            }
            FrameInput::Load { worker, incarnation, rank, seq, load } => {
                Frame::Load { worker, incarnation, rank, seq, load: rank_load(load) }
            }
            FrameInput::Deregister { worker, incarnation } => Frame::Deregister { worker, incarnation },
            FrameInput::Challenge { nonce } => Frame::Challenge { nonce },
            FrameInput::Proof { nonce, mac } => Frame::Proof { nonce, mac },
            FrameInput::Welcome { mac } => Frame::Welcome { mac },
            FrameInput::FrontendLoad { frontend, incarnation, seq, worker, worker_incarnation, rank, load } => {
                Frame::FrontendLoad {
                    frontend,
                    incarnation,
                    seq,
                    worker,
                    worker_incarnation,
                    rank,
                    load: rank_load(load),
                }
            }
            FrameInput::FrontendBeat { frontend, incarnation, in_flight, waiting, lines, pad } => {
                let extra = std::iter::repeat_n((7, 1), usize::from(pad % 400));
                let lines = lines.into_iter().chain(extra).map(|(model, waiting)| LineWaiting { model, waiting });
                Frame::FrontendBeat { frontend, incarnation, in_flight, waiting, lines: lines.collect() }
            }
            FrameInput::FrontendAck { frontend, incarnation, acks, pad } => {
                let extra = std::iter::repeat_n([1, 2, 3, 4], usize::from(pad % 160));
                let acks = acks.into_iter().chain(extra);
                let acks = acks.map(|[peer, peer_incarnation, first, seq]| Ack { peer, peer_incarnation, first, seq });
                Frame::FrontendAck { frontend, incarnation, acks: acks.collect() }
            }
        }
    }
}

/// `frame`'s bytes, written by hand from the layout in `wire`'s module docs
/// (big-endian, a 4-byte header): a change of layout made to both the
/// encoder and the decoder round-trips, and only this tells it.
fn reference(frame: &Frame) -> Vec<u8> {
    fn load(out: &mut Vec<u8>, load: &RankLoad) {
        for field in [
            load.active_decode_blocks,
            load.kv_total_blocks,
            load.active_prefill_tokens,
            load.max_num_batched_tokens,
            load.waiting_requests,
        ] {
            out.extend(field.to_be_bytes());
        }
    }
    let mut p = Vec::new();
    let kind = match frame {
        Frame::Register { worker, incarnation, dp_size, model, http_addr } => {
            p.extend(worker.to_be_bytes());
            p.extend(incarnation.to_be_bytes());
            p.extend(dp_size.to_be_bytes());
            for text in [model, http_addr] {
                p.extend((text.len() as u16).to_be_bytes());
                p.extend(text.as_bytes());
            }
            1
        }
        Frame::Load { worker, incarnation, rank, seq, load: l } => {
            p.extend(worker.to_be_bytes());
            p.extend(incarnation.to_be_bytes());
            p.extend(rank.to_be_bytes());
            p.extend(seq.to_be_bytes());
            load(&mut p, l);
            2
        }
        Frame::Deregister { worker, incarnation } => {
            p.extend(worker.to_be_bytes());
            p.extend(incarnation.to_be_bytes());
            3
        }
        Frame::Challenge { nonce } => {
            p.extend(nonce);
            4
        }
        Frame::Proof { nonce, mac } => {
            p.extend(nonce);
            p.extend(mac);
            5
        }
        Frame::Welcome { mac } => {
            p.extend(mac);
            6
        }
        Frame::FrontendLoad { frontend, incarnation, seq, worker, worker_incarnation, rank, load: l } => {
            for n in [frontend, incarnation, seq, worker, worker_incarnation] {
                p.extend(n.to_be_bytes());
            }
            p.extend(rank.to_be_bytes());
            load(&mut p, l);
            7
        }
        Frame::FrontendBeat { frontend, incarnation, in_flight, waiting, lines } => {
            p.extend(frontend.to_be_bytes());
            p.extend(incarnation.to_be_bytes());
            p.extend(in_flight.to_be_bytes());
            p.extend(waiting.to_be_bytes());
            for line in lines {
                p.extend(line.model.to_be_bytes());
                p.extend(line.waiting.to_be_bytes());
            }
            8
        }
        Frame::FrontendAck { frontend, incarnation, acks } => {
            p.extend(frontend.to_be_bytes());
            p.extend(incarnation.to_be_bytes());
            for ack in acks {
                for n in [ack.peer, ack.peer_incarnation, ack.first, ack.seq] {
                    p.extend(n.to_be_bytes());
                }
            }
            9
        }
    };
    let mut out = vec![MAGIC, kind];
    out.extend((p.len() as u16).to_be_bytes());
    out.extend(p);
    out
}

/// The encoded size of `frame`, from the reference.
fn encoded_len(frame: &Frame) -> usize {
    reference(frame).len()
}

/// Decodes `bytes` frame by frame, checking each against its re-encoding.
fn decode_stream(bytes: &[u8]) -> (Vec<Frame>, Result<(), WireError>, usize) {
    let mut buf = BytesMut::from(bytes);
    let mut frames = Vec::new();
    let mut offset = 0;
    loop {
        let before = buf.len();
        match decode(&mut buf) {
            Ok(Some(frame)) => {
                let used = before - buf.len();
                let consumed = &bytes[offset..offset + used];
                assert_eq!(&bytes[offset + used..], &buf[..], "decode consumed from the middle");
                let mut again = BytesMut::new();
                encode(&frame, &mut again).expect("a decoded frame encodes");
                assert_eq!(&again[..], consumed, "{frame:?} re-encodes differently");
                assert_eq!(consumed, &reference(&frame)[..], "{frame:?} decoded from other bytes than the layout's");
                assert!(used <= MAX_FRAME);
                if frames.is_empty() {
                    // A strict prefix of a frame only asks for more (the
                    // header cuts, then a spread of the payload cuts).
                    let cuts = (0..used.min(16)).chain((16..used).step_by(97)).chain([used - 1]);
                    for cut in cuts {
                        let mut prefix = BytesMut::from(&consumed[..cut]);
                        assert_eq!(decode(&mut prefix), Ok(None), "prefix of {cut} bytes of {frame:?}");
                        assert_eq!(prefix.len(), cut, "a prefix was consumed");
                    }
                }
                offset += used;
                frames.push(frame);
            }
            Ok(None) => {
                assert_eq!(&buf[..], &bytes[offset..], "Ok(None) consumed bytes");
                assert!(buf.len() < MAX_FRAME, "{} bytes buffered without a frame", buf.len());
                return (frames, Ok(()), buf.len());
            }
            Err(e) => {
                match e {
                    // Another format version is told apart from garbage.
                    WireError::BadMagic(b) => assert_ne!(b & 0xF0, MAGIC & 0xF0),
                    WireError::UnsupportedVersion(v) => assert_ne!(0xB0 | v, MAGIC),
                    _ => {}
                }
                return (frames, Err(e), buf.len());
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) else { return };
    match input {
        Input::Stream { magic_first, mut bytes } => {
            if magic_first {
                bytes.insert(0, MAGIC);
            }
            let _ = decode_stream(&bytes);
        }
        Input::Frames(inputs) => {
            let mut wire = BytesMut::new();
            let mut sent = Vec::new();
            for input in inputs {
                let frame = input.frame();
                let before = wire.len();
                match encode(&frame, &mut wire) {
                    Ok(()) => {
                        assert_eq!(&wire[before..], &reference(&frame)[..], "{frame:?} encoded off the layout");
                        sent.push(frame);
                    }
                    Err(WireError::Oversized(n)) => {
                        assert_eq!(n, encoded_len(&frame));
                        assert!(n > MAX_FRAME);
                        assert_eq!(wire.len(), before, "an oversized frame wrote bytes");
                    }
                    Err(e) => panic!("encode failed with {e:?}"),
                }
            }
            let (received, end, rest) = decode_stream(&wire);
            assert_eq!(end, Ok(()));
            assert_eq!(rest, 0);
            assert_eq!(received, sent);
        }
    }
});
