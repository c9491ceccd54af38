//! [`Simulator`]: a simulated continuous-batching inference engine (an
//! inference "mocker"); "engine" elsewhere in the server means a real one.
//!
//! Each data-parallel rank owns a KV cache of `kv_total_blocks` blocks of
//! `block_size` tokens and runs one step every `decode_step`:
//!
//! 1. every running sequence whose prompt is prefilled produces one token
//!    (each costs one token of the step budget `max_num_batched_tokens`);
//! 2. the rest of the budget (further bounded by `prefill_tokens_per_s`) goes
//!    to prefill: first to admitted sequences still prefilling (chunked
//!    prefill), then to waiting requests, admitted in arrival order while their
//!    prompt fits in the free blocks. A sequence whose prefill completes
//!    produces its first token in the same step.
//!
//! A sequence holds `ceil((prompt + generated) / block_size)` blocks. When a
//! token needs a block and none is free, the youngest running sequence is
//! preempted (its blocks freed, recomputed later from the front of the
//! waiting line), as vLLM does. A request whose token receiver is dropped
//! (client gone) is removed and its blocks freed at the next step.
//!
//! [`Rank`] is the synchronous state machine (unit-tested without a clock);
//! [`Simulator`] runs one tokio task per rank and reports each rank's
//! [`RankLoad`] to a [`LoadSink`] whenever it changes.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use loadgate::RankLoad;

/// The simulator's physics.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// Data-parallel ranks, each with its own KV cache and batch.
    pub dp_size: u32,
    /// KV-cache blocks per rank.
    pub kv_total_blocks: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Tokens (decode + prefill) one step may process.
    pub max_num_batched_tokens: u32,
    /// Wall time of one engine step.
    pub decode_step: Duration,
    /// Optional bound on prefill speed, tokens per second per rank.
    pub prefill_tokens_per_s: Option<u32>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            dp_size: 1,
            kv_total_blocks: 1024,
            block_size: 16,
            max_num_batched_tokens: 2048,
            decode_step: Duration::from_millis(10),
            prefill_tokens_per_s: None,
        }
    }
}

/// Receives a rank's latest load (rank index, load) whenever it changes.
pub type LoadSink = Arc<dyn Fn(u32, RankLoad) + Send + Sync>;

/// The stream of a request's generated tokens: their indices `0, 1, ..`;
/// the channel closes when the request has produced `max_tokens` tokens.
pub type TokenStream = mpsc::UnboundedReceiver<u32>;

/// A request the engine can never serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimError {
    /// Prompt plus output need more KV blocks than a rank has.
    ContextTooLong {
        /// Tokens the request needs (prompt + max tokens).
        tokens: u64,
        /// Tokens one rank's KV cache holds.
        capacity: u64,
    },
    /// The engine has stopped.
    Stopped,
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::ContextTooLong { tokens, capacity } => {
                write!(f, "prompt plus max_tokens is {tokens} tokens, more than the KV cache holds ({capacity})")
            }
            SimError::Stopped => f.write_str("the engine has stopped"),
        }
    }
}

impl std::error::Error for SimError {}

/// One request on its way through a rank.
#[derive(Debug)]
pub struct Sequence {
    prompt: u32,
    max_tokens: u32,
    generated: u32,
    /// Tokens whose KV is computed (prefill progress; reset by preemption).
    computed: u32,
    /// KV blocks held (0 while waiting).
    blocks: u32,
    tokens: mpsc::UnboundedSender<u32>,
}

impl Sequence {
    /// A request for `max_tokens` tokens after a prompt of `prompt` tokens,
    /// streaming token indices into `tokens`.
    pub fn new(prompt: u32, max_tokens: u32, tokens: mpsc::UnboundedSender<u32>) -> Self {
        Sequence { prompt, max_tokens: max_tokens.max(1), generated: 0, computed: 0, blocks: 0, tokens }
    }

    /// Tokens to (re)compute before the next token can be produced.
    fn context(&self) -> u32 {
        self.prompt + self.generated
    }

    fn prefilling(&self) -> bool {
        self.computed < self.context()
    }
}

/// What one [`Rank::step`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepOutcome {
    /// Tokens produced (decode and first tokens).
    pub tokens: u32,
    /// Prompt tokens prefilled.
    pub prefilled: u32,
    /// Requests that produced their last token.
    pub finished: u32,
    /// Requests removed because their receiver was gone.
    pub cancelled: u32,
    /// Sequences preempted to free blocks.
    pub preempted: u32,
}

impl StepOutcome {
    /// Requests that left the rank (finished or cancelled).
    pub fn ended(&self) -> u32 {
        self.finished + self.cancelled
    }
}

/// One data-parallel rank: its KV cache, running batch and waiting line.
#[derive(Debug)]
pub struct Rank {
    kv_total_blocks: u32,
    block_size: u32,
    max_num_batched_tokens: u32,
    /// Prefill tokens the rate bound allows per step (`None`: unbounded).
    prefill_per_step: Option<f64>,
    prefill_credit: f64,
    free_blocks: u32,
    /// Admitted sequences, oldest first.
    running: Vec<Sequence>,
    waiting: VecDeque<Sequence>,
}

impl Rank {
    /// An empty rank with the physics of `config`.
    pub fn new(config: &SimConfig) -> Self {
        let prefill_per_step =
            config.prefill_tokens_per_s.map(|rate| f64::from(rate) * config.decode_step.as_secs_f64());
        Rank {
            kv_total_blocks: config.kv_total_blocks,
            block_size: config.block_size.max(1),
            max_num_batched_tokens: config.max_num_batched_tokens.max(1),
            prefill_per_step,
            prefill_credit: 0.0,
            free_blocks: config.kv_total_blocks,
            running: Vec::new(),
            waiting: VecDeque::new(),
        }
    }

    /// Queues a request; it is admitted by a later [`step`](Self::step).
    pub fn submit(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    /// No request running or waiting.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Requests running (admitted, holding blocks).
    #[cfg(test)]
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Requests waiting for blocks or budget.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// KV blocks free now.
    #[cfg(test)]
    pub fn free_blocks(&self) -> u32 {
        self.free_blocks
    }

    /// The load this rank reports.
    pub fn load(&self) -> RankLoad {
        let waiting: u64 = self.waiting.iter().map(|s| u64::from(s.context())).sum();
        let prefilling: u64 = self.running.iter().map(|s| u64::from(s.context() - s.computed)).sum();
        RankLoad {
            active_decode_blocks: self.kv_total_blocks - self.free_blocks,
            kv_total_blocks: self.kv_total_blocks,
            active_prefill_tokens: u32::try_from(waiting + prefilling).unwrap_or(u32::MAX),
            max_num_batched_tokens: self.max_num_batched_tokens,
            // The rank's own queue: requests waiting for KV blocks or budget.
            waiting_requests: u32::try_from(self.waiting.len()).unwrap_or(u32::MAX),
        }
    }

    fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_size)
    }

    /// Runs one engine step.
    pub fn step(&mut self) -> StepOutcome {
        let mut out = StepOutcome::default();
        self.remove_cancelled(&mut out);
        let mut budget = self.max_num_batched_tokens;

        // Decode: every prefilled running sequence produces one token.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            if self.running[i].prefilling() {
                i += 1;
                continue;
            }
            budget -= 1;
            if self.produce(i, &mut out) {
                i += 1;
            }
        }

        // Prefill: the rest of the budget, bounded by the prefill rate.
        let mut prefill_budget = match self.prefill_per_step {
            Some(per_step) => {
                self.prefill_credit = (self.prefill_credit + per_step).min(per_step + f64::from(budget));
                budget.min(self.prefill_credit as u32)
            }
            None => budget,
        };
        let before = prefill_budget;
        let mut i = 0;
        loop {
            if i == self.running.len() {
                // Admit the oldest waiting request if its context fits (not
                // after a preemption: the cache is already short).
                let Some(next) = self.waiting.front() else { break };
                let need = self.blocks_for(next.context());
                if prefill_budget == 0 || need > self.free_blocks || out.preempted > 0 {
                    break;
                }
                let mut seq = self.waiting.pop_front().expect("front exists");
                self.free_blocks -= need;
                seq.blocks = need;
                seq.computed = 0;
                self.running.push(seq);
            }
            if prefill_budget == 0 {
                break;
            }
            let seq = &mut self.running[i];
            if !seq.prefilling() {
                i += 1;
                continue;
            }
            let chunk = prefill_budget.min(seq.context() - seq.computed);
            seq.computed += chunk;
            prefill_budget -= chunk;
            out.prefilled += chunk;
            if self.running[i].prefilling() || self.produce(i, &mut out) {
                i += 1;
            }
        }
        if self.prefill_per_step.is_some() {
            self.prefill_credit -= f64::from(before - prefill_budget);
        }
        out
    }

    /// Sequence `i` produces its next token, growing its blocks (preempting
    /// the youngest sequences if needed). Returns whether sequence `i` is
    /// still at index `i` (false: it finished, was cancelled or preempted).
    fn produce(&mut self, i: usize, out: &mut StepOutcome) -> bool {
        loop {
            let seq = &self.running[i];
            let need = self.blocks_for(seq.context() + 1) - seq.blocks;
            if need <= self.free_blocks {
                self.free_blocks -= need;
                self.running[i].blocks += need;
                break;
            }
            let youngest = self.running.len() - 1;
            self.preempt(youngest);
            out.preempted += 1;
            if youngest == i {
                return false;
            }
        }
        let seq = &mut self.running[i];
        let index = seq.generated;
        seq.generated += 1;
        seq.computed = seq.context();
        out.tokens += 1;
        if seq.tokens.send(index).is_err() {
            out.cancelled += 1;
            self.finish(i);
            return false;
        }
        if seq.generated >= seq.max_tokens {
            out.finished += 1;
            self.finish(i);
            return false;
        }
        true
    }

    fn finish(&mut self, i: usize) {
        let seq = self.running.remove(i);
        self.free_blocks += seq.blocks;
    }

    fn preempt(&mut self, i: usize) {
        let mut seq = self.running.remove(i);
        self.free_blocks += seq.blocks;
        seq.blocks = 0;
        seq.computed = 0;
        self.waiting.push_front(seq);
    }

    fn remove_cancelled(&mut self, out: &mut StepOutcome) {
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.tokens.is_closed());
        out.cancelled += (before - self.waiting.len()) as u32;
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].tokens.is_closed() {
                out.cancelled += 1;
                self.finish(i);
            } else {
                i += 1;
            }
        }
    }
}

struct RankHandle {
    inbox: mpsc::UnboundedSender<Sequence>,
    /// Requests submitted and not yet ended.
    outstanding: Arc<AtomicUsize>,
}

/// The running engine: one tokio task per rank; dropping it stops them once
/// their requests have ended.
pub struct Simulator {
    config: SimConfig,
    ranks: Vec<RankHandle>,
}

impl fmt::Debug for Simulator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Simulator").field("config", &self.config).finish()
    }
}

impl Simulator {
    /// Starts the rank tasks on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn start(config: SimConfig, sink: LoadSink) -> Simulator {
        let ranks = (0..config.dp_size.max(1))
            .map(|rank| {
                let (inbox, rx) = mpsc::unbounded_channel();
                let outstanding = Arc::new(AtomicUsize::new(0));
                let state = Rank::new(&config);
                tokio::spawn(run_rank(rank, state, rx, config.decode_step, sink.clone(), outstanding.clone()));
                RankHandle { inbox, outstanding }
            })
            .collect();
        Simulator { config, ranks }
    }

    /// Whether a request of `prompt_tokens` and `max_tokens` could ever fit
    /// in a rank's KV cache (checked before it takes a place in the
    /// worker's cap: one that never fits is refused, not queued).
    ///
    /// # Errors
    ///
    /// [`SimError::ContextTooLong`].
    pub fn fits(&self, prompt_tokens: u32, max_tokens: u32) -> Result<(), SimError> {
        let tokens = u64::from(prompt_tokens) + u64::from(max_tokens.max(1));
        let capacity = u64::from(self.config.kv_total_blocks) * u64::from(self.config.block_size.max(1));
        match tokens > capacity {
            true => Err(SimError::ContextTooLong { tokens, capacity }),
            false => Ok(()),
        }
    }

    /// Submits a request to the least loaded rank; its tokens arrive on the
    /// returned stream. Dropping the stream cancels the request.
    ///
    /// # Errors
    ///
    /// [`SimError::ContextTooLong`] when the request could never fit in a
    /// rank's KV cache; [`SimError::Stopped`] when the engine is gone.
    pub fn submit(&self, prompt_tokens: u32, max_tokens: u32) -> Result<TokenStream, SimError> {
        self.fits(prompt_tokens, max_tokens)?;
        // Relaxed: a load estimate for rank choice; exactness is not needed.
        let rank = self.ranks.iter().min_by_key(|r| r.outstanding.load(Ordering::Relaxed)).expect("at least one rank");
        let (tx, rx) = mpsc::unbounded_channel();
        rank.outstanding.fetch_add(1, Ordering::Relaxed);
        if rank.inbox.send(Sequence::new(prompt_tokens, max_tokens, tx)).is_err() {
            rank.outstanding.fetch_sub(1, Ordering::Relaxed);
            return Err(SimError::Stopped);
        }
        Ok(rx)
    }
}

/// A rank's step loop: sleeps while idle, otherwise steps every `step`.
async fn run_rank(
    rank: u32,
    mut state: Rank,
    mut inbox: mpsc::UnboundedReceiver<Sequence>,
    step: Duration,
    sink: LoadSink,
    outstanding: Arc<AtomicUsize>,
) {
    let mut last = state.load();
    sink(rank, last);
    let mut next = tokio::time::Instant::now();
    loop {
        if state.is_idle() {
            let Some(seq) = inbox.recv().await else { return };
            state.submit(seq);
            next = tokio::time::Instant::now();
        }
        while let Ok(seq) = inbox.try_recv() {
            state.submit(seq);
        }
        let load = state.load();
        if load != last {
            last = load;
            sink(rank, load);
        }
        // The step's work takes `step` of wall time; its tokens appear at the end.
        next += step;
        let now = tokio::time::Instant::now();
        if next < now {
            next = now;
        }
        tokio::time::sleep_until(next).await;
        while let Ok(seq) = inbox.try_recv() {
            state.submit(seq);
        }
        let outcome = state.step();
        // Relaxed: see `Simulator::submit`.
        outstanding.fetch_sub(outcome.ended() as usize, Ordering::Relaxed);
        let load = state.load();
        if load != last {
            last = load;
            sink(rank, load);
        }
    }
}

#[cfg(test)]
mod tests;
