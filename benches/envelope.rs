//! Dropping a forged envelope on the NATS plane (`wire::envelope`): what a
//! frontend flooded by a client without the event secret spends per frame.
//! `Openers::open` (the SipHash check first, the HMAC only if it passes)
//! against the HMAC-SHA256 tag alone over the same bytes (what opening cost
//! before the check, and what it still costs an authentic envelope), and an
//! authentic envelope opened whole, in the same run.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, Criterion};
use hmac::{Hmac, Mac};
use loadgate::wire::envelope::{seal, Openers, ENVELOPE_MAGIC};
use loadgate::wire::{Frame, TAG_LEN};
use loadgate::RankLoad;
use sha2::Sha256;

const SECRET: &[u8] = b"an event secret of 32 bytes, say";
const SUBJECT: &str = "loadgate.ev.llama.42";

/// A Load frame sealed as a worker seals it.
fn authentic() -> Vec<u8> {
    let load = RankLoad { active_decode_blocks: 90, kv_total_blocks: 100, ..Default::default() };
    let frame = Frame::Load { worker: 42, incarnation: 1_700_000_000_000_000, rank: 0, seq: 7, load };
    let mut buf = BytesMut::new();
    seal(SECRET, SUBJECT, 1_700_000_000_000, &frame, &mut buf).expect("a small frame");
    buf.to_vec()
}

fn forged_envelope(c: &mut Criterion) {
    let openers = Openers::new(&[SECRET]);
    let real = authentic();
    // The flood test's forgery: the right magic and length, any tag.
    let mut forged = vec![ENVELOPE_MAGIC; real.len()];
    forged[9] = 0xB2;
    // The tag alone, its key prepared once as `Openers` prepares it.
    let mut prepared = Hmac::<Sha256>::new_from_slice(SECRET).expect("any key length");
    prepared.update(b"loadgate-envelope-v2");
    let tag_only = |bytes: &[u8]| {
        let (body, tag) = bytes.split_at(bytes.len() - TAG_LEN);
        let mut mac = prepared.clone();
        mac.update(&(SUBJECT.len() as u16).to_be_bytes());
        mac.update(SUBJECT.as_bytes());
        mac.update(body);
        mac.verify_slice(tag).is_ok()
    };
    assert!(openers.open(SUBJECT, &forged).is_err() && !tag_only(&forged));
    assert!(openers.open(SUBJECT, &real).is_ok() && tag_only(&real));
    let mut group = c.benchmark_group("envelope");
    group.bench_function("forged/check_then_tag", |b| b.iter(|| openers.open(SUBJECT, black_box(&forged))));
    group.bench_function("forged/tag_only", |b| b.iter(|| tag_only(black_box(&forged))));
    group.bench_function("authentic/open", |b| b.iter(|| openers.open(SUBJECT, black_box(&real))));
    group.finish();
}

criterion_group!(benches, forged_envelope);
criterion_main!(benches);
