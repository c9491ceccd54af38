//! `loadgate::engines` (vLLM, SGLang, llama.cpp) against a reference model:
//! structured documents (arbitrary ranks, values, label order, labels that
//! need escaping, HELP/TYPE lines, timestamps, noise families and garbage
//! lines between the families, slots) rendered to text, mapped, and compared
//! with what the reference computes from the structure; the same documents
//! with bytes overwritten, and arbitrary bytes, must never panic, and what
//! they map to is sane.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use loadgate::engines::{self, EngineError, EngineKind, EngineSnapshot, FRACTION_BLOCKS, MAX_RANKS};

#[derive(Arbitrary, Debug)]
enum Input {
    Doc(Doc),
    /// A rendered document with some bytes overwritten.
    Mutated(Doc, Vec<(u16, u8)>),
    Raw(u8, Vec<u8>, Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Doc {
    kind: u8,
    families: Vec<FamilyIn>,
    cache_config: Option<CacheConfigIn>,
    noise: Vec<Noise>,
    slots: Vec<SlotIn>,
    /// `snapshot_ahead`'s tokens: a llama.cpp slot this near its limit is free.
    ahead: u8,
}

#[derive(Arbitrary, Debug)]
struct FamilyIn {
    which: u8,
    help: Option<String>,
    /// 0: no TYPE line, 1: gauge, 2: untyped; odd `help_first`: HELP first.
    type_line: u8,
    help_first: bool,
    rank_label: bool,
    extra_label: bool,
    rank_first: bool,
    series: Vec<SeriesIn>,
}

#[derive(Arbitrary, Debug)]
struct SeriesIn {
    rank: Option<u8>,
    extra: u8,
    value: Value,
    timestamp: Option<u32>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Value {
    Count(u32),
    CountText(u64),
    Unit(u32),
    Half(u16),
    Bits(u64),
    Nan,
    PosInf,
    NegInf,
    Negative(u16),
}

#[derive(Arbitrary, Debug)]
struct CacheConfigIn {
    rank_label: bool,
    blocks_label: bool,
    series: Vec<(Option<u8>, Blocks)>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Blocks {
    Valid(u32),
    Small(u8),
    NoneText,
    Signed(u16),
    Big(u64),
}

#[derive(Arbitrary, Debug)]
enum Noise {
    Gauge(u8, u32),
    Histogram(u8, bool),
    Garbage(u8),
    Comment(String),
}

#[derive(Arbitrary, Debug)]
struct SlotIn {
    n_ctx: Ctx,
    is_processing: bool,
    n_prompt_tokens: Option<Ctx>,
    params: bool,
    /// `next_token[0].n_remain` (-1: no limit).
    n_remain: Option<i16>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Ctx {
    Small(u16),
    Big(u64),
}

impl Ctx {
    fn get(self) -> u64 {
        match self {
            Ctx::Small(v) => u64::from(v),
            Ctx::Big(v) => v,
        }
    }
}

/// The kind's load families (in the order the mapper reads them, the
/// first two of vLLM being the KV alternatives), its rank label and the
/// name of an extra label.
fn layout(kind: EngineKind) -> (&'static [&'static str], &'static str, bool, &'static str) {
    match kind {
        EngineKind::Vllm => (
            &[
                "vllm:kv_cache_usage_perc",
                "vllm:gpu_cache_usage_perc",
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
            ],
            "engine",
            true,
            "model_name",
        ),
        EngineKind::Sglang => {
            (&["sglang:token_usage", "sglang:num_running_reqs", "sglang:num_queue_reqs"], "dp_rank", true, "tp_rank")
        }
        // llama.cpp has no rank label: a label of that name is ignored.
        EngineKind::LlamaCpp => {
            (&["llamacpp:requests_processing", "llamacpp:requests_deferred"], "slot", false, "model")
        }
    }
}

const NOISE_NAMES: [&str; 14] = [
    "vllm:num_requests_running_total",
    "vllm:num_requests_waiting_by_reason",
    "vllm:kv_cache_usage_perc_x",
    "vllm:cache_config_info_2",
    "vllm:num_requests_runningx",
    "vllm_num_requests_running",
    "sglang:token_usage2",
    "sglang:num_running_reqs_offline_batch",
    "sglang:num_queue_reqs_total",
    "llamacpp:requests_processing_total",
    "llamacpp:requests_deferred:x",
    "vllm:time_to_first_token_seconds",
    "process_cpu_seconds_total",
    "python_gc_objects_collected_total",
];

/// Lines that are not valid exposition but belong to no load family.
const GARBAGE: [&str; 8] = [
    "}{ not a line\n",
    "...\n",
    "vllm:num_requests_running-broken 1\n",
    "vllm:num_requests_running\n",
    "sglang:token_usage=0.5\n",
    "llamacpp:requests_deferred/2 1\n",
    "\n",
    "#TYPE vllm:num_requests_running gauge\n",
];

impl Value {
    /// The text and the f64 the parser must read from it.
    fn render(self) -> (String, f64) {
        let float = |v: f64| (format!("{v:?}"), v);
        match self {
            Value::Count(n) => float(f64::from(n)),
            Value::CountText(n) => (n.to_string(), n.to_string().parse().unwrap()),
            Value::Unit(u) => float(f64::from(u) / f64::from(u32::MAX)),
            Value::Half(h) => float(f64::from(h) + 0.5),
            Value::Bits(bits) => {
                let v = f64::from_bits(bits);
                if v.is_nan() {
                    ("NaN".into(), v)
                } else if v.is_infinite() {
                    ((if v > 0.0 { "+Inf" } else { "-Inf" }).into(), v)
                } else {
                    float(v)
                }
            }
            Value::Nan => ("NaN".into(), f64::NAN),
            Value::PosInf => ("+Inf".into(), f64::INFINITY),
            Value::NegInf => ("-Inf".into(), f64::NEG_INFINITY),
            Value::Negative(n) => float(-(f64::from(n) + 1.0) / 7.0),
        }
    }
}

impl Blocks {
    fn render(self) -> (String, Option<u32>) {
        match self {
            Blocks::Valid(n) => (n.to_string(), (n > 0).then_some(n)),
            Blocks::Small(n) => (n.to_string(), (n > 0).then_some(u32::from(n))),
            Blocks::NoneText => ("None".into(), None),
            Blocks::Signed(n) => (format!("+{n}"), None),
            Blocks::Big(n) => (n.to_string(), u32::try_from(n).ok().filter(|&n| n > 0)),
        }
    }
}

/// A label value as the exposition writes it.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// What the reference expects.
#[derive(Debug, PartialEq)]
enum Expected {
    Load(Vec<(u32, u32, u32, u32)>),
    NoLoadMetrics,
    InvalidValue(&'static str, f64),
    Slots,
}

#[derive(Default, Debug, Clone, Copy)]
struct Readings {
    fraction: Option<f64>,
    running: u32,
    waiting: u32,
}

/// `value * 1e9` rounded half away from zero from the exact decimal expansion.
fn reference_ppb(value: f64) -> u64 {
    let text = format!("{:.1100}", value.abs());
    let (int, frac) = text.split_once('.').unwrap();
    let int: u64 = int.parse().unwrap();
    let billionths: u64 = frac[..9].parse().unwrap();
    int * 1_000_000_000 + billionths + u64::from(frac.as_bytes()[9] >= b'5')
}

/// `fraction * total` rounded half away from zero, exactly: fraction = m / 2^k
/// found by doubling (exact in binary floating point).
fn reference_scaled(fraction: f64, total: u32) -> u32 {
    let (mut v, mut k) = (fraction.abs(), 0u32);
    while v.fract() != 0.0 {
        v *= 2.0;
        k += 1;
    }
    if k >= 100 {
        return 0;
    }
    let num = v as u128 * u128::from(total);
    let den = 1u128 << k;
    u32::try_from((2 * num + den) / (2 * den)).unwrap()
}

fn valid(v: f64) -> bool {
    v.is_finite() && v >= 0.0
}

/// Renders `doc` for its kind and computes the reference's answer.
fn render(doc: &Doc) -> (EngineKind, String, String, Expected) {
    let kind = EngineKind::ALL[usize::from(doc.kind) % 3];
    let (names, rank_name, ranked, extra_name) = layout(kind);
    let mut text = String::new();
    let mut noise = doc.noise.iter();
    let emit_noise = |text: &mut String, noise: Option<&Noise>| {
        let Some(noise) = noise else { return };
        match noise {
            Noise::Gauge(n, v) => {
                text.push_str(&format!("{}{{a=\"1\"}} {v}\n", NOISE_NAMES[usize::from(*n) % NOISE_NAMES.len()]))
            }
            Noise::Histogram(n, with_inf) => {
                let name = NOISE_NAMES[usize::from(*n) % NOISE_NAMES.len()];
                text.push_str(&format!("# TYPE {name} histogram\n{name}_bucket{{le=\"0.5\"}} 3\n"));
                if *with_inf {
                    text.push_str(&format!("{name}_bucket{{le=\"+Inf\"}} 2\n"));
                    // not cumulative: invalid
                }
                text.push_str(&format!("{name}_count 2\n{name}_sum 0.7\n"));
            }
            Noise::Garbage(g) => text.push_str(GARBAGE[usize::from(*g) % GARBAGE.len()]),
            Noise::Comment(c) => text.push_str(&format!("# {}\n", c.replace(['\n', '\r'], " "))),
        }
    };

    // Per family (by index in `names`): the values in document order, with ranks.
    let mut seen = vec![false; names.len()];
    let mut values: Vec<Vec<(u32, f64)>> = vec![Vec::new(); names.len()];
    for family in &doc.families {
        let index = usize::from(family.which) % names.len();
        if seen[index] {
            continue;
        }
        seen[index] = true;
        emit_noise(&mut text, noise.next());
        let name = names[index];
        let help = family.help.as_ref().map(|h| format!("# HELP {name} {}\n", h.replace(['\n', '\r'], " ")));
        let kind_line = match family.type_line % 3 {
            1 => Some(format!("# TYPE {name} gauge\n")),
            2 => Some(format!("# TYPE {name} untyped\n")),
            _ => None,
        };
        if family.help_first {
            text.extend(help.clone());
            text.extend(kind_line);
        } else {
            text.extend(kind_line);
            text.extend(help);
        }
        let mut label_sets = Vec::new();
        for series in &family.series {
            let rank_text = match series.rank {
                Some(r) => r.to_string(),
                None => String::new(),
            };
            let extra_text = format!("v{}\"\\\n{}", series.extra % 4, series.extra / 64);
            let key = (family.rank_label.then(|| rank_text.clone()), family.extra_label.then(|| extra_text.clone()));
            if label_sets.contains(&key) {
                continue;
            }
            label_sets.push(key);
            let mut labels = Vec::new();
            if family.rank_label {
                labels.push(format!("{rank_name}=\"{rank_text}\""));
            }
            if family.extra_label {
                labels.push(format!("{extra_name}=\"{}\"", escape(&extra_text)));
            }
            if family.rank_first {
                labels.reverse();
            }
            let (value_text, value) = series.value.render();
            let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
            let timestamp = series.timestamp.map(|t| format!(" {t}")).unwrap_or_default();
            text.push_str(&format!("{name}{labels} {value_text}{timestamp}\n"));
            let rank = if ranked && family.rank_label { u32::from(series.rank.unwrap_or(0)) } else { 0 };
            values[index].push((rank, value));
        }
    }

    // vLLM's cache_config_info.
    let mut all_blocks: Option<u32> = None;
    let mut rank_blocks: BTreeMap<u32, u32> = BTreeMap::new();
    if let (EngineKind::Vllm, Some(config)) = (kind, &doc.cache_config) {
        emit_noise(&mut text, noise.next());
        text.push_str("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n");
        text.push_str("# TYPE vllm:cache_config_info gauge\n");
        let mut label_sets = Vec::new();
        for (rank, blocks) in &config.series {
            let rank_text = rank.map(|r| r.to_string()).unwrap_or_default();
            let (blocks_text, blocks) = blocks.render();
            let key = (config.rank_label.then(|| rank_text.clone()), config.blocks_label.then(|| blocks_text.clone()));
            if label_sets.contains(&key) {
                continue;
            }
            label_sets.push(key);
            let mut labels = vec!["block_size=\"16\"".to_string()];
            if config.rank_label {
                labels.push(format!("engine=\"{rank_text}\""));
            }
            if config.blocks_label {
                labels.push(format!("num_gpu_blocks=\"{blocks_text}\""));
            }
            text.push_str(&format!("vllm:cache_config_info{{{}}} 1.0\n", labels.join(",")));
            let Some(blocks) = blocks.filter(|_| config.blocks_label) else { continue };
            match rank.filter(|_| config.rank_label) {
                Some(r) => {
                    let entry = rank_blocks.entry(u32::from(r)).or_insert(blocks);
                    *entry = (*entry).max(blocks);
                }
                None => all_blocks = all_blocks.max(Some(blocks)),
            }
        }
    }
    for rest in noise {
        emit_noise(&mut text, Some(rest));
    }

    // Slots.
    let slot_values: Vec<serde_json::Value> = doc
        .slots
        .iter()
        .enumerate()
        .map(|(id, slot)| {
            let mut object = serde_json::json!({"id": id, "n_ctx": slot.n_ctx.get(), "speculative": false,
                                                "is_processing": slot.is_processing});
            if let Some(tokens) = slot.n_prompt_tokens {
                object["n_prompt_tokens"] = tokens.get().into();
            }
            if slot.params {
                object["params"] = serde_json::json!({"n_predict": 64, "samplers": ["top_k", "min_p"]});
                object["next_token"] = serde_json::json!([{"has_next_token": true, "n_decoded": 4}]);
            }
            if let Some(remain) = slot.n_remain {
                object["next_token"] = serde_json::json!([{"has_next_token": true, "n_remain": remain}]);
            }
            object
        })
        .collect();
    let slots = serde_json::Value::Array(slot_values).to_string();

    // The reference.
    let expected = 'expected: {
        if values.iter().all(Vec::is_empty) {
            break 'expected Expected::NoLoadMetrics;
        }
        // (family index, what it feeds): vLLM reads the KV fraction from its
        // first family, else from the old name.
        let order: Vec<(usize, u8)> = match kind {
            EngineKind::Vllm => vec![(if values[0].is_empty() { 1 } else { 0 }, 0), (2, 1), (3, 2)],
            EngineKind::Sglang => vec![(0, 0), (1, 1), (2, 2)],
            EngineKind::LlamaCpp => vec![(0, 1), (1, 2)],
        };
        let mut ranks: BTreeMap<u32, Readings> = BTreeMap::new();
        for &(index, feeds) in &order {
            for &(rank, value) in &values[index] {
                if !valid(value) {
                    break 'expected Expected::InvalidValue(names[index], value);
                }
                let readings = ranks.entry(rank).or_default();
                match feeds {
                    0 => readings.fraction = Some(readings.fraction.unwrap_or(0.0).max(value.min(1.0))),
                    1 => readings.running = readings.running.max(value.round() as u32),
                    _ => readings.waiting = readings.waiting.max(value.round() as u32),
                }
            }
        }
        if kind == EngineKind::LlamaCpp {
            // A processing slot holds its whole context, whatever its tokens,
            // unless it is within `ahead` tokens of its limit.
            let (mut active, mut total, mut ending) = (0u64, 0u64, 0u32);
            for slot in &doc.slots {
                let context = slot.n_ctx.get().min(u64::from(u32::MAX));
                total = total.saturating_add(context);
                let near = slot.n_remain.is_some_and(|n| n >= 0 && n as u64 <= u64::from(doc.ahead));
                if slot.is_processing && doc.ahead > 0 && near {
                    ending += 1;
                } else if slot.is_processing {
                    active = active.saturating_add(context);
                }
            }
            let r = ranks[&0];
            let cap = |v: u64| v.min(u64::from(u32::MAX)) as u32;
            let running = r.running.saturating_sub(ending);
            break 'expected Expected::Load(vec![(cap(active), cap(total), r.waiting, running)]);
        }
        // The ranks named, ascending, without gaps (none: one unknown rank).
        if ranks.is_empty() {
            ranks.insert(0, Readings::default());
        }
        Expected::Load(
            ranks
                .iter()
                .map(|(&rank, &r)| {
                    let blocks = rank_blocks.get(&rank).copied().or(all_blocks);
                    let (active, total) = match (r.fraction, blocks) {
                        (None, _) => (0, 0),
                        (Some(f), Some(b)) => (reference_scaled(f, b), b),
                        (Some(f), None) => (reference_ppb(f) as u32, FRACTION_BLOCKS),
                    };
                    (active, total, r.waiting, r.running)
                })
                .collect(),
        )
    };
    (kind, text, slots, expected)
}

fn got(result: &Result<EngineSnapshot, EngineError>) -> Expected {
    match result {
        Ok(snapshot) => Expected::Load(
            snapshot
                .ranks
                .iter()
                .map(|r| {
                    (r.load.active_decode_blocks, r.load.kv_total_blocks, r.load.waiting_requests, r.running_requests)
                })
                .collect(),
        ),
        Err(EngineError::NoLoadMetrics) => Expected::NoLoadMetrics,
        Err(EngineError::InvalidValue { metric, value }) => Expected::InvalidValue(metric, *value),
        Err(EngineError::Slots(_)) => Expected::Slots,
        Err(other) => panic!("an error the reference does not expect: {other}"),
    }
}

/// What any Ok must satisfy, whatever the input.
fn sane(kind: EngineKind, result: &Result<EngineSnapshot, EngineError>) {
    if let Err(err) = result {
        assert!(!err.to_string().contains('\n'), "one line: {err}");
        return;
    }
    let snapshot = result.as_ref().unwrap();
    assert!(!snapshot.ranks.is_empty() && snapshot.ranks.len() <= MAX_RANKS);
    for rank in &snapshot.ranks {
        let load = rank.load;
        assert_eq!((load.active_prefill_tokens, load.max_num_batched_tokens), (0, 0));
        if kind != EngineKind::LlamaCpp {
            assert!(load.active_decode_blocks <= load.kv_total_blocks, "{load:?}");
        }
    }
}

fuzz_target!(|input: Input| {
    match input {
        Input::Doc(doc) => {
            let (kind, metrics, slots, expected) = render(&doc);
            let result = engines::snapshot_ahead(kind, &metrics, Some(&slots), u32::from(doc.ahead));
            sane(kind, &result);
            let actual = got(&result);
            match (&actual, &expected) {
                // NaN is not equal to itself: compare the bits.
                (Expected::InvalidValue(m1, v1), Expected::InvalidValue(m2, v2)) => {
                    assert!(m1 == m2 && (v1.to_bits() == v2.to_bits() || (v1.is_nan() && v2.is_nan())), "{metrics}")
                }
                _ => assert_eq!(actual, expected, "{kind}:\n{metrics}\n{slots}"),
            }
        }
        Input::Mutated(doc, edits) => {
            let (kind, metrics, slots, _) = render(&doc);
            let mut bytes = metrics.into_bytes();
            for (at, byte) in edits {
                if !bytes.is_empty() {
                    let at = usize::from(at) % bytes.len();
                    bytes[at] = byte;
                }
            }
            let metrics = String::from_utf8_lossy(&bytes);
            let result = engines::snapshot(kind, &metrics, Some(&slots));
            sane(kind, &result);
        }
        Input::Raw(kind, metrics, slots) => {
            let kind = EngineKind::ALL[usize::from(kind) % 3];
            let (metrics, slots) = (String::from_utf8_lossy(&metrics), String::from_utf8_lossy(&slots));
            let result = engines::snapshot(kind, &metrics, Some(&slots));
            sane(kind, &result);
        }
    }
});
