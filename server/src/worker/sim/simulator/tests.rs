//! The simulator's ranks stepped by hand, and a running simulator.

use super::*;

fn config(kv_total_blocks: u32, max_num_batched_tokens: u32) -> SimConfig {
    SimConfig { kv_total_blocks, max_num_batched_tokens, block_size: 16, ..SimConfig::default() }
}

fn seq(prompt: u32, max_tokens: u32) -> (Sequence, TokenStream) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Sequence::new(prompt, max_tokens, tx), rx)
}

fn drain(rx: &mut TokenStream) -> Vec<u32> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

#[test]
fn blocks_follow_prompt_plus_generated() {
    let mut rank = Rank::new(&config(100, 1000));
    let (s, mut rx) = seq(30, 5);
    rank.submit(s);
    assert_eq!(rank.load().active_prefill_tokens, 30);
    // Prefill 30 tokens (2 blocks) and produce the first token: 31 tokens, 2 blocks.
    let out = rank.step();
    assert_eq!((out.prefilled, out.tokens), (30, 1));
    assert_eq!(rank.load().active_decode_blocks, 2);
    assert_eq!(rank.load().active_prefill_tokens, 0);
    rank.step(); // 32 tokens: still 2 blocks
    assert_eq!(rank.load().active_decode_blocks, 2);
    rank.step(); // 33 tokens: 3 blocks
    assert_eq!(rank.load().active_decode_blocks, 3);
    rank.step();
    let out = rank.step();
    assert_eq!(out.finished, 1);
    assert_eq!(drain(&mut rx), vec![0, 1, 2, 3, 4]);
    assert!(rx.try_recv().is_err(), "the stream is closed after max_tokens");
    assert_eq!(rank.load().active_decode_blocks, 0);
    assert_eq!(rank.free_blocks(), 100);
    assert!(rank.is_idle());
}

#[test]
fn request_waits_while_blocks_are_full() {
    let mut rank = Rank::new(&config(10, 1000));
    let (a, _ra) = seq(100, 50); // 7 blocks at admission
    let (b, mut rb) = seq(60, 4); // 4 blocks: does not fit in the 3 left
    rank.submit(a);
    rank.submit(b);
    rank.step();
    assert_eq!((rank.running(), rank.waiting()), (1, 1));
    assert_eq!(rank.load().active_prefill_tokens, 60);
    assert!(drain(&mut rb).is_empty());
    drop(_ra); // the first client goes away: its blocks come back
    let out = rank.step();
    assert_eq!(out.cancelled, 1);
    assert_eq!((rank.running(), rank.waiting()), (1, 0));
    assert_eq!(drain(&mut rb), vec![0]);
}

#[test]
fn admission_respects_the_step_budget() {
    let mut rank = Rank::new(&config(1000, 100));
    let mut streams = Vec::new();
    for _ in 0..3 {
        let (s, rx) = seq(40, 10);
        rank.submit(s);
        streams.push(rx);
    }
    // 100 tokens: two full prompts and 20 tokens of the third (chunked).
    let out = rank.step();
    assert_eq!((out.prefilled, out.tokens), (100, 2));
    assert_eq!(rank.running(), 3);
    assert_eq!(rank.load().active_prefill_tokens, 20);
    // Next step: 2 decode tokens, then the last 20 prompt tokens.
    let out = rank.step();
    assert_eq!((out.prefilled, out.tokens), (20, 3));
    assert_eq!(rank.load().active_prefill_tokens, 0);
    assert_eq!(streams.iter_mut().map(|rx| drain(rx).len()).collect::<Vec<_>>(), vec![2, 2, 1]);
}

#[test]
fn prefill_rate_bounds_prefill() {
    let cfg =
        SimConfig { prefill_tokens_per_s: Some(1000), decode_step: Duration::from_millis(10), ..config(1000, 1000) };
    let mut rank = Rank::new(&cfg);
    let (s, _rx) = seq(25, 2);
    rank.submit(s);
    assert_eq!(rank.step().prefilled, 10);
    assert_eq!(rank.step().prefilled, 10);
    let out = rank.step();
    assert_eq!((out.prefilled, out.tokens), (5, 1));
}

#[test]
fn growth_preempts_the_youngest_and_recomputes_it() {
    let mut rank = Rank::new(&config(2, 1000));
    let (a, mut ra) = seq(15, 3); // 1 block, grows to 2 at its second token
    let (b, mut rb) = seq(16, 2); // 1 block, grows to 2 at its first token
    rank.submit(a);
    rank.submit(b);
    // Both admitted (1 block each); b's first token needs a second block:
    // b, the youngest, is preempted.
    let out = rank.step();
    assert_eq!(out.preempted, 1);
    assert_eq!((rank.running(), rank.waiting()), (1, 1));
    assert_eq!(drain(&mut ra), vec![0]);
    rank.step();
    rank.step(); // a finishes
    assert_eq!(drain(&mut ra), vec![1, 2]);
    let mut steps = 0;
    while !rank.is_idle() {
        rank.step();
        steps += 1;
        assert!(steps < 10);
    }
    assert_eq!(drain(&mut rb), vec![0, 1]);
    assert_eq!(rank.free_blocks(), 2);
}

#[test]
fn waiting_request_whose_client_left_is_dropped() {
    let mut rank = Rank::new(&config(1, 1000));
    let (a, _ra) = seq(10, 100);
    let (b, rb) = seq(10, 1);
    rank.submit(a);
    rank.submit(b);
    rank.step();
    assert_eq!(rank.waiting(), 1);
    drop(rb);
    assert_eq!(rank.step().cancelled, 1);
    assert_eq!(rank.waiting(), 0);
    assert_eq!(rank.load().active_prefill_tokens, 0);
}

#[tokio::test]
async fn engine_spreads_requests_over_ranks_and_reports_their_load() {
    let reports = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink: LoadSink = {
        let reports = reports.clone();
        Arc::new(move |rank, load| reports.lock().unwrap().push((rank, load)))
    };
    let cfg = SimConfig { dp_size: 2, decode_step: Duration::from_millis(1), ..config(100, 1000) };
    let engine = Simulator::start(cfg, sink);
    let mut a = engine.submit(16, 3).unwrap();
    let mut b = engine.submit(16, 3).unwrap();
    for rx in [&mut a, &mut b] {
        let mut tokens = Vec::new();
        while let Some(t) = rx.recv().await {
            tokens.push(t);
        }
        assert_eq!(tokens, vec![0, 1, 2]);
    }
    // Each rank ran one request, and each ends reporting an empty cache.
    loop {
        let seen = reports.lock().unwrap().clone();
        let busy = |rank| seen.iter().any(|(r, l): &(u32, RankLoad)| *r == rank && l.active_decode_blocks > 0);
        let last = |rank| seen.iter().rev().find(|(r, _)| *r == rank).map(|(_, l)| l.active_decode_blocks);
        assert!(busy(0) && busy(1), "both ranks ran a request: {seen:?}");
        if last(0) == Some(0) && last(1) == Some(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        engine.submit(1000, 1000).unwrap_err(),
        SimError::ContextTooLong { tokens: 2000, capacity: 1600 },
        "a request that can never fit is refused up front"
    );
}
