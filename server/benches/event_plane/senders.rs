//! The simulated workers: one event connection each, in today's wire
//! format (`loadgate::wire`, no secret), and one sender thread that writes
//! Load frames to all of them, many frames per write, round-robin.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use loadgate::wire::{self, Frame};
use loadgate::RankLoad;

use crate::frontend::MODEL;

/// Every worker's incarnation.
const INCARNATION: u64 = 1;
/// KV blocks per rank; the threshold (0.5) splits them.
const KV_TOTAL: u32 = 1000;
/// Active blocks of a free report (plus up to 63) and of a busy one.
const FREE_BLOCKS: u32 = 100;
const BUSY_BLOCKS: u32 = 900;
/// Bytes of one Load frame, and where its fields sit (header of 4, then
/// worker 8, incarnation 8, rank 4, seq 8, active_decode_blocks 4, …).
pub const LOAD_LEN: usize = 52;
const WORKER_AT: usize = 4;
const SEQ_AT: usize = 24;
const BLOCKS_AT: usize = 32;

/// One simulated worker's connection.
pub struct Conn {
    pub stream: TcpStream,
    pub worker: u64,
    seq: u64,
    busy: bool,
    /// The tail of a batch the socket did not take whole.
    pub leftover: Vec<u8>,
    /// Closed (and why).
    pub closed: Option<String>,
}

/// How the connections are opened.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Connections per batch (0: one loop, no pause).
    pub batch: usize,
    /// Pause between batches.
    pub pause: Duration,
}

/// Opens `n` connections to `addr` and sends each a Register, in one loop
/// (or paced); stops at `deadline`. Returns the connections and the
/// failed connects by error.
pub fn open(addr: SocketAddr, n: usize, pace: Pace, deadline: Instant) -> (Vec<Conn>, BTreeMap<String, usize>) {
    let mut conns = Vec::with_capacity(n);
    let mut failed = BTreeMap::new();
    let mut frame = BytesMut::new();
    for i in 0..n {
        if Instant::now() >= deadline {
            *failed.entry("not tried: the connect phase's deadline passed".to_owned()).or_default() += n - i;
            break;
        }
        if pace.batch > 0 && i > 0 && i % pace.batch == 0 {
            std::thread::sleep(pace.pause);
        }
        let worker = i as u64 + 1;
        let register = Frame::Register {
            worker,
            incarnation: INCARNATION,
            dp_size: 1,
            model: MODEL.to_owned(),
            http_addr: "127.0.0.1:9".to_owned(),
        };
        frame.clear();
        wire::encode(&register, &mut frame).expect("a Register fits a frame");
        let connected = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).and_then(|mut stream| {
            stream.set_nodelay(true)?;
            stream.set_write_timeout(Some(Duration::from_secs(5)))?;
            stream.write_all(&frame)?;
            Ok(stream)
        });
        match connected {
            Ok(stream) => conns.push(Conn { stream, worker, seq: 0, busy: false, leftover: Vec::new(), closed: None }),
            Err(e) => *failed.entry(e.to_string()).or_default() += 1,
        }
    }
    (conns, failed)
}

/// Looks at every connection without blocking: still open, or closed (the
/// frontend's EOF, or the socket's error: ETIMEDOUT, ECONNRESET, …).
/// Returns the count open and the closed ones by reason.
pub fn check(conns: &mut [Conn]) -> (usize, BTreeMap<String, usize>) {
    let mut closed = BTreeMap::<String, usize>::new();
    let mut open = 0;
    for conn in conns.iter_mut().filter(|c| c.closed.is_none()) {
        let reason = match (conn.stream.set_nonblocking(true), conn.stream.take_error()) {
            (Err(e), _) | (_, Err(e)) | (_, Ok(Some(e))) => Some(e.to_string()),
            (Ok(()), Ok(None)) => match conn.stream.peek(&mut [0u8; 1]) {
                Ok(0) => Some("closed by the frontend (EOF)".to_owned()),
                Ok(_) => Some("the frontend sent something (a refusal)".to_owned()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => None,
                Err(e) => Some(e.to_string()),
            },
        };
        match reason {
            Some(reason) => {
                *closed.entry(reason.clone()).or_default() += 1;
                conn.closed = Some(reason);
            }
            None => open += 1,
        }
    }
    (open, closed)
}

/// What the sender did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sent {
    /// Bytes handed to the kernel.
    pub bytes: u64,
    /// Frames written (whole or in part) that flipped their worker's busy bit.
    pub flips: u64,
    /// Writes, and writes that found a full socket.
    pub writes: u64,
    pub full: u64,
}

impl Sent {
    /// Load frames handed to the kernel whole.
    pub fn frames(&self) -> u64 {
        self.bytes / LOAD_LEN as u64
    }
}

/// Writes Load frames to every open connection, `per_write` frames per
/// write, round-robin, until `stop` or `deadline`; `flip_permille` of
/// the frames move their worker across the threshold.
pub fn send(conns: &mut [Conn], per_write: usize, flip_permille: u32, stop: &AtomicBool, deadline: Instant) -> Sent {
    let template = {
        let load = RankLoad { kv_total_blocks: KV_TOTAL, ..RankLoad::default() };
        let frame = Frame::Load { worker: 0, incarnation: INCARNATION, rank: 0, seq: 0, load };
        let mut buf = BytesMut::new();
        wire::encode(&frame, &mut buf).expect("a Load fits a frame");
        assert_eq!(buf.len(), LOAD_LEN, "the Load layout this sender patches");
        buf.to_vec()
    };
    check_layout(&template);
    for conn in conns.iter_mut().filter(|c| c.closed.is_none()) {
        if let Err(e) = conn.stream.set_nonblocking(true) {
            conn.closed = Some(e.to_string());
        }
    }
    let mut sent = Sent::default();
    let mut batch = vec![0u8; per_write * LOAD_LEN];
    let mut credit = 0u32;
    'rounds: loop {
        let mut progressed = false;
        for (i, conn) in conns.iter_mut().enumerate() {
            // Relaxed: a flag polled on its own; the deadline bounds it anyway.
            if i % 64 == 0 && (stop.load(Ordering::Relaxed) || Instant::now() >= deadline) {
                break 'rounds;
            }
            if conn.closed.is_some() {
                continue;
            }
            if !conn.leftover.is_empty() {
                match conn.stream.write(&conn.leftover) {
                    Ok(n) => {
                        sent.bytes += n as u64;
                        conn.leftover.drain(..n);
                        progressed = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => sent.full += 1,
                    Err(e) => conn.closed = Some(e.to_string()),
                }
                sent.writes += 1;
                continue;
            }
            let mut flips = 0;
            for frame in batch.chunks_exact_mut(LOAD_LEN) {
                conn.seq += 1;
                credit += flip_permille;
                if credit >= 1000 {
                    credit -= 1000;
                    conn.busy = !conn.busy;
                    flips += 1;
                }
                let blocks = if conn.busy { BUSY_BLOCKS } else { FREE_BLOCKS } + (conn.seq % 64) as u32;
                frame.copy_from_slice(&template);
                frame[WORKER_AT..WORKER_AT + 8].copy_from_slice(&conn.worker.to_be_bytes());
                frame[SEQ_AT..SEQ_AT + 8].copy_from_slice(&conn.seq.to_be_bytes());
                frame[BLOCKS_AT..BLOCKS_AT + 4].copy_from_slice(&blocks.to_be_bytes());
            }
            sent.writes += 1;
            match conn.stream.write(&batch) {
                Ok(n) => {
                    sent.bytes += n as u64;
                    sent.flips += flips;
                    if n < batch.len() {
                        conn.leftover.extend_from_slice(&batch[n..]);
                    }
                    progressed = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Not sent: these seqs are skipped (a gap is fine, the
                    // next frame is still newer), and the flips undone.
                    sent.full += 1;
                    if flips % 2 == 1 {
                        conn.busy = !conn.busy;
                    }
                }
                Err(e) => conn.closed = Some(e.to_string()),
            }
        }
        if !progressed {
            // Every socket full: let the frontend read.
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    sent
}

/// One Load frame of `worker`, numbered `seq`, busy or free.
pub fn load_frame(worker: u64, seq: u64, busy: bool) -> [u8; LOAD_LEN] {
    let blocks = if busy { BUSY_BLOCKS } else { FREE_BLOCKS } + (seq % 64) as u32;
    let load = RankLoad { active_decode_blocks: blocks, kv_total_blocks: KV_TOTAL, ..RankLoad::default() };
    let frame = Frame::Load { worker, incarnation: INCARNATION, rank: 0, seq, load };
    let mut buf = BytesMut::with_capacity(LOAD_LEN);
    wire::encode(&frame, &mut buf).expect("a Load fits a frame");
    buf[..].try_into().expect("a Load frame is LOAD_LEN bytes")
}

/// The template patched as [`send`] patches it decodes to the frame meant.
fn check_layout(template: &[u8]) {
    let mut frame = template.to_vec();
    frame[WORKER_AT..WORKER_AT + 8].copy_from_slice(&7u64.to_be_bytes());
    frame[SEQ_AT..SEQ_AT + 8].copy_from_slice(&9u64.to_be_bytes());
    frame[BLOCKS_AT..BLOCKS_AT + 4].copy_from_slice(&BUSY_BLOCKS.to_be_bytes());
    let load = RankLoad { active_decode_blocks: BUSY_BLOCKS, kv_total_blocks: KV_TOTAL, ..RankLoad::default() };
    let expected = Frame::Load { worker: 7, incarnation: INCARNATION, rank: 0, seq: 9, load };
    let mut buf = BytesMut::from(&frame[..]);
    assert_eq!(wire::decode(&mut buf), Ok(Some(expected)), "the Load layout changed: update the offsets");
}
