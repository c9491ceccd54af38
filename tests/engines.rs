//! The engine load mappers on real exposition text (`tests/fixtures/engines/`,
//! each file naming its source on its first lines) and on the mapping rules.

use loadgate::engines::{
    self, EngineError, EngineKind, EngineSnapshot, RankSample, FRACTION_BLOCKS, MAX_DOCUMENT_BYTES, MAX_RANKS,
};
use loadgate::RankLoad;

/// A fixture's text; a JSON fixture loses its leading `//` source lines.
fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/engines/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    if name.ends_with(".json") {
        return text.lines().skip_while(|line| line.starts_with("//")).collect::<Vec<_>>().join("\n");
    }
    text
}

/// One rank's expected sample.
fn rank(active: u32, total: u32, waiting: u32, running: u32) -> RankSample {
    RankSample {
        load: RankLoad {
            active_decode_blocks: active,
            kv_total_blocks: total,
            waiting_requests: waiting,
            ..Default::default()
        },
        running_requests: running,
    }
}

fn ranks(snapshot: Result<EngineSnapshot, EngineError>) -> Vec<RankSample> {
    snapshot.unwrap().ranks
}

/// The document without the lines of family `name` (samples, HELP, TYPE).
fn without(text: &str, name: &str) -> String {
    text.lines()
        .filter(|line| {
            let line = line.strip_prefix("# HELP ").or_else(|| line.strip_prefix("# TYPE ")).unwrap_or(line);
            !(line.starts_with(name) && matches!(line.as_bytes().get(name.len()), Some(b'{' | b' ')))
        })
        .map(|line| format!("{line}\n"))
        .collect()
}

// --- vLLM ---------------------------------------------------------------

#[test]
fn vllm_two_engines_with_cache_config_info() {
    let text = fixture("vllm-v1-dp2.txt");
    assert!(text.len() > 50_000, "the realistic document, histograms included");
    // 0.6425 * 27891 = 17919.97; 0.0812 * 27891 = 2264.75.
    assert_eq!(ranks(engines::vllm(&text)), [rank(17920, 27891, 3, 7), rank(2265, 27891, 0, 2)]);
}

#[test]
fn vllm_before_the_rename_reads_gpu_cache_usage_perc() {
    let text = without(&fixture("vllm-v1-dp2.txt"), "vllm:kv_cache_usage_perc");
    assert!(text.contains("vllm:gpu_cache_usage_perc{"));
    assert_eq!(ranks(engines::vllm(&text)), [rank(17920, 27891, 3, 7), rank(2265, 27891, 0, 2)]);
}

#[test]
fn vllm_prefers_kv_cache_usage_perc_over_the_old_name() {
    let text = fixture("vllm-v1-dp2.txt").replace(
        "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.6425",
        "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.99",
    );
    assert_eq!(ranks(engines::vllm(&text))[0], rank(17920, 27891, 3, 7));
}

#[test]
fn vllm_without_cache_config_info_gives_the_fraction_in_parts_per_billion() {
    let text = without(&fixture("vllm-v1-dp2.txt"), "vllm:cache_config_info");
    assert_eq!(
        ranks(engines::vllm(&text)),
        [rank(642_500_000, FRACTION_BLOCKS, 3, 7), rank(81_200_000, FRACTION_BLOCKS, 0, 2)]
    );
}

#[test]
fn vllm_docs_example_has_no_kv_metric_and_no_engine_label() {
    // Its histogram has no +Inf bucket and `...` lines: neither is read.
    assert_eq!(ranks(engines::vllm(&fixture("vllm-docs-design-metrics.txt"))), [rank(0, 0, 0, 8)]);
}

#[test]
fn vllm_cache_config_info_per_engine_or_for_all() {
    let loads = "vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.5\n\
                 vllm:kv_cache_usage_perc{engine=\"2\"} 0.5\n";
    let per_engine = format!(
        "{loads}vllm:cache_config_info{{engine=\"0\",num_gpu_blocks=\"100\"}} 1.0\n\
         vllm:cache_config_info{{engine=\"2\",num_gpu_blocks=\"None\"}} 1.0\n"
    );
    assert_eq!(
        ranks(engines::vllm(&per_engine)),
        [rank(50, 100, 0, 0), rank(500_000_000, FRACTION_BLOCKS, 0, 0), rank(500_000_000, FRACTION_BLOCKS, 0, 0)],
        "engine 1 has none; engine 2's `None` is no block count"
    );
    let for_all = format!("{loads}vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"7\"}} 1.0\n");
    assert_eq!(ranks(engines::vllm(&for_all)), [rank(4, 7, 0, 0); 3], "3.5 rounds up");
    let empty_engine = format!("{loads}vllm:cache_config_info{{engine=\"\",num_gpu_blocks=\"10\"}} 1.0\n");
    assert_eq!(ranks(engines::vllm(&empty_engine)), [rank(5, 10, 0, 0); 3], "an empty label is no label");
}

#[test]
fn vllm_ranks_follow_the_engine_number_not_the_text() {
    let text = "vllm:num_requests_running{engine=\"10\"} 1\nvllm:num_requests_running{engine=\"2\"} 2\n\
                vllm:num_requests_waiting{engine=\"2\"} 5\n";
    let expected = [rank(0, 0, 5, 2), rank(0, 0, 0, 1)];
    assert_eq!(ranks(engines::vllm(text)), expected, "engine 10 after engine 2, not before it as text");
    let bad = engines::vllm("vllm:num_requests_running{engine=\"x\"} 1\n").unwrap_err();
    assert!(matches!(&bad, EngineError::Exposition(m) if m.contains("engine")), "{bad}");
    let signed = engines::vllm("vllm:num_requests_running{engine=\"+1\"} 1\n");
    assert!(matches!(signed, Err(EngineError::Exposition(_))), "{signed:?}");
}

#[test]
fn vllm_counts_round_and_saturate_and_fractions_clamp() {
    let text = "vllm:num_requests_running 2.5\nvllm:num_requests_waiting 1e12\nvllm:kv_cache_usage_perc 1.5\n";
    assert_eq!(ranks(engines::vllm(text)), [rank(FRACTION_BLOCKS, FRACTION_BLOCKS, u32::MAX, 3)]);
    let text = "vllm:num_requests_running 2.4999\nvllm:kv_cache_usage_perc -0.0\n";
    assert_eq!(ranks(engines::vllm(text)), [rank(0, FRACTION_BLOCKS, 0, 2)]);
}

#[test]
fn invalid_values_name_the_metric() {
    for (text, metric) in [
        ("vllm:num_requests_running NaN\n", "vllm:num_requests_running"),
        ("vllm:num_requests_waiting -1\n", "vllm:num_requests_waiting"),
        ("vllm:kv_cache_usage_perc +Inf\n", "vllm:kv_cache_usage_perc"),
        ("vllm:gpu_cache_usage_perc -Inf\n", "vllm:gpu_cache_usage_perc"),
    ] {
        match engines::vllm(text) {
            Err(EngineError::InvalidValue { metric: m, value }) => {
                assert_eq!(m, metric);
                assert!(!(value.is_finite() && value >= 0.0));
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    assert!(matches!(engines::sglang("sglang:token_usage NaN\n"), Err(EngineError::InvalidValue { .. })));
    let err = engines::llamacpp("llamacpp:requests_deferred -2\n", "[]").unwrap_err();
    assert_eq!(err, EngineError::InvalidValue { metric: "llamacpp:requests_deferred", value: -2.0 });
}

/// A rank number no series names is no rank of the engine: vLLM behind an
/// external balancer labels its one rank by its global number. Filled in as
/// idle ranks, the gaps would keep a saturated worker free (busy means every
/// rank busy).
#[test]
fn a_rank_gap_is_no_rank() {
    let text = "vllm:num_requests_waiting{engine=\"2\"} 7\nvllm:num_requests_waiting{engine=\"0\"} 1\n";
    let snapshot = engines::vllm(text).expect("two ranks and a gap");
    let waiting: Vec<u32> = snapshot.ranks.iter().map(|r| r.load.waiting_requests).collect();
    assert_eq!(waiting, [1, 7], "ranks 0 and 2, in order, and nothing for rank 1");
    let alone = "vllm:num_requests_waiting{engine=\"3\"} 50\nvllm:kv_cache_usage_perc{engine=\"3\"} 0.99\n";
    let snapshot = engines::vllm(alone).expect("rank 3 alone");
    assert_eq!(snapshot.ranks.len(), 1, "one rank, the engine's");
    assert_eq!(snapshot.ranks[0].load.waiting_requests, 50);
}

#[test]
fn too_many_ranks_are_refused() {
    let at_limit: String = (0..MAX_RANKS).map(|i| format!("vllm:num_requests_running{{engine=\"{i}\"}} 1\n")).collect();
    assert_eq!(ranks(engines::vllm(&at_limit)).len(), MAX_RANKS);
    let over = format!("{at_limit}vllm:num_requests_running{{engine=\"{MAX_RANKS}\"}} 1\n");
    assert_eq!(engines::vllm(&over), Err(EngineError::TooManyRanks { limit: MAX_RANKS }));
}

#[test]
fn a_broken_line_of_a_load_family_is_an_exposition_error() {
    let err = engines::vllm("vllm:num_requests_running{engine=\"0\" 1\n").unwrap_err();
    let EngineError::Exposition(message) = &err else { panic!("{err:?}") };
    assert!(message.starts_with("vllm:num_requests_running: "), "{message}");
    assert!(!err.to_string().contains('\n'), "one line: {err}");
    // Broken lines of other families are not read.
    let text = "garbage {{{\nvllm:num_requests_running_total{ 7\nvllm:num_requests_running 1\n";
    assert_eq!(ranks(engines::vllm(text)), [rank(0, 0, 0, 1)]);
}

#[test]
fn crlf_lines_and_a_family_split_in_two_blocks_still_read() {
    let text = "# TYPE vllm:num_requests_running gauge\r\nvllm:num_requests_running{engine=\"0\"} 1\r\n\
                other_metric 5\r\nvllm:num_requests_running{engine=\"1\"} 2\r\n";
    assert_eq!(ranks(engines::vllm(text)), [rank(0, 0, 0, 1), rank(0, 0, 0, 2)]);
}

// --- SGLang ---------------------------------------------------------------

#[test]
fn sglang_docs_example() {
    let text = fixture("sglang-docs-production-metrics.txt");
    assert_eq!(ranks(engines::sglang(&text)), [rank(280_000_000, FRACTION_BLOCKS, 2826, 162)]);
}

#[test]
fn sglang_two_dp_ranks_of_two_tp_ranks_take_the_max() {
    let text = fixture("sglang-dp2-tp2.txt");
    assert_eq!(
        ranks(engines::sglang(&text)),
        [rank(420_000_000, FRACTION_BLOCKS, 5, 12), rank(900_000_000, FRACTION_BLOCKS, 1, 30)]
    );
}

// --- llama.cpp ------------------------------------------------------------

#[test]
fn llamacpp_idle_and_saturated_captures() {
    for (metrics, slots, expected) in [
        ("llamacpp-tiny-idle-metrics.txt", "llamacpp-tiny-idle-slots.json", rank(0, 2048, 0, 0)),
        // Four processing slots of 512 (holding 64 + 49 + 40 + 64 tokens):
        // each holds its whole context, so no KV is left for a new request.
        ("llamacpp-tiny-sat-metrics.txt", "llamacpp-tiny-sat-slots.json", rank(2048, 2048, 12, 4)),
        ("llamacpp-small-sat-metrics.txt", "llamacpp-small-sat-slots.json", rank(2048, 2048, 8, 4)),
        // Idle slots keep their last n_prompt_tokens (75): not counted.
        ("llamacpp-small-idle-metrics.txt", "llamacpp-small-idle-slots.json", rank(0, 2048, 0, 0)),
    ] {
        let snapshot = engines::llamacpp(&fixture(metrics), &fixture(slots));
        assert_eq!(ranks(snapshot), [expected], "{metrics}");
    }
}

#[test]
fn llamacpp_unified_kv_counts_each_slot_context() {
    // With --kv-unified every slot reports the whole context (2048): the sum
    // counts it once per slot. Documented, not corrected.
    let snapshot = engines::llamacpp(
        &fixture("llamacpp-tiny-idle-metrics.txt"),
        &fixture("llamacpp-tiny-idle-kv-unified-slots.json"),
    );
    assert_eq!(ranks(snapshot), [rank(0, 4 * 2048, 0, 0)]);
}

#[test]
fn llamacpp_slots_errors() {
    let metrics = fixture("llamacpp-tiny-idle-metrics.txt");
    for slots in [
        "{\"error\":{\"code\":501,\"message\":\"This server does not support slots endpoint.\"}}",
        "[{\"id\":0,\"is_processing\":false}]",
        "[{\"id\":0,\"n_ctx\":-1,\"is_processing\":false}]",
        "[",
        "",
    ] {
        assert!(matches!(engines::llamacpp(&metrics, slots), Err(EngineError::Slots(_))), "{slots}");
    }
    // One slot of three processing: a third of the context held, whatever
    // its tokens (here none reported at all).
    let slots = "[{\"id\":0,\"n_ctx\":512,\"is_processing\":true},{\"id\":1,\"n_ctx\":512,\"is_processing\":false},\
                 {\"id\":2,\"n_ctx\":512,\"is_processing\":false,\"n_prompt_tokens\":75}]";
    assert_eq!(ranks(engines::llamacpp(&metrics, slots)), [rank(512, 1536, 0, 0)]);
    let huge = "[{\"n_ctx\":9999999999,\"is_processing\":true,\"n_prompt_tokens\":9999999999},\
                {\"n_ctx\":1,\"is_processing\":true,\"n_prompt_tokens\":1}]";
    assert_eq!(ranks(engines::llamacpp(&metrics, huge)), [rank(u32::MAX, u32::MAX, 0, 0)], "saturates");
    assert_eq!(ranks(engines::llamacpp(&metrics, "[]")), [rank(0, 0, 0, 0)], "no slots: KV unknown");
}

#[test]
fn llamacpp_ahead_counts_a_slot_near_its_output_limit_free() {
    // The saturated capture: four slots of 512, each 5 tokens from its
    // limit (n_remain 5), 8 requests deferred.
    let (metrics, slots) = (fixture("llamacpp-small-sat-metrics.txt"), fixture("llamacpp-small-sat-slots.json"));
    let ahead = |n| ranks(engines::llamacpp_ahead(&metrics, &slots, n));
    assert_eq!(ahead(0), [rank(2048, 2048, 8, 4)], "0: as without");
    assert_eq!(ahead(4), [rank(2048, 2048, 8, 4)], "5 left is not within 4");
    assert_eq!(ahead(5), [rank(0, 2048, 8, 0)], "within 5: every slot ending; the deferred still wait");
    assert_eq!(ranks(engines::snapshot_ahead(EngineKind::LlamaCpp, &metrics, Some(&slots), 5)), [rank(0, 2048, 8, 0)]);
    // One slot each: ending, ending at 0, no limit (-1), no next_token,
    // a next_token of another shape, idle with n_remain 0.
    let metrics = "llamacpp:requests_processing 5\nllamacpp:requests_deferred 0\n";
    let slots = r#"[{"n_ctx":512,"is_processing":true,"next_token":[{"n_remain":3}]},
        {"n_ctx":512,"is_processing":true,"next_token":[{"n_remain":0}]},
        {"n_ctx":512,"is_processing":true,"next_token":[{"n_remain":-1}]},
        {"n_ctx":512,"is_processing":true},
        {"n_ctx":512,"is_processing":true,"next_token":{"n_remain":"2"}},
        {"n_ctx":512,"is_processing":false,"next_token":[{"n_remain":0}]}]"#;
    assert_eq!(ranks(engines::llamacpp_ahead(metrics, slots, 8)), [rank(3 * 512, 6 * 512, 0, 3)]);
    assert_eq!(ranks(engines::llamacpp(metrics, slots)), [rank(5 * 512, 6 * 512, 0, 5)]);
    assert_eq!(
        ranks(engines::llamacpp_ahead("llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n", slots, 8)),
        [rank(3 * 512, 6 * 512, 0, 0)],
        "running saturates at 0 when /metrics saw fewer than /slots ends"
    );
}

/// `next_token` is read for `[0].n_remain` alone, as a JSON tree would
/// give it: later entries, other keys and other shapes are skipped, a
/// repeated `n_remain` counts by its last, a non-integer is no limit known.
#[test]
fn llamacpp_reads_only_the_first_n_remain_of_next_token() {
    let metrics = "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n";
    let ending = |next_token: &str| {
        let slots = format!(r#"[{{"n_ctx":512,"is_processing":true,"next_token":{next_token}}}]"#);
        let snapshot = engines::llamacpp_ahead(metrics, &slots, 8).unwrap_or_else(|e| panic!("{next_token}: {e}"));
        snapshot.ranks[0].load.active_decode_blocks == 0
    };
    for yes in [
        r#"[{"n_remain":3}]"#,
        r#"[{"has_next_token":true,"n_remain":8,"x":[{"n_remain":-1}]}]"#,
        r#"[{"n_remain":-1,"n_remain":2}]"#,
        r#"[{"n_remain":2},{"n_remain":-1},[1,[2]],"x",null]"#,
    ] {
        assert!(ending(yes), "{yes}");
    }
    for no in [
        "null",
        "[]",
        "7",
        r#""n_remain""#,
        r#"{"n_remain":2}"#,
        r#"{"0":{"n_remain":2}}"#,
        r#"[[{"n_remain":2}]]"#,
        r#"[{"n_remain":2.0}]"#,
        r#"[{"n_remain":"2"}]"#,
        r#"[{"n_remain":9}]"#,
        r#"[{"n_remain":18446744073709551615}]"#,
        r#"[{"n_remain":2,"n_remain":null}]"#,
        r#"[{"next":{"n_remain":2}}]"#,
    ] {
        assert!(!ending(no), "{no}");
    }
}

// --- all kinds ----------------------------------------------------------------

#[test]
fn the_wrong_kind_or_endpoint_has_no_load_metrics() {
    let vllm = fixture("vllm-v1-dp2.txt");
    let sglang = fixture("sglang-docs-production-metrics.txt");
    let llamacpp = fixture("llamacpp-tiny-sat-metrics.txt");
    let slots = fixture("llamacpp-tiny-sat-slots.json");
    assert_eq!(engines::vllm(&sglang), Err(EngineError::NoLoadMetrics));
    assert_eq!(engines::vllm(&llamacpp), Err(EngineError::NoLoadMetrics));
    assert_eq!(engines::sglang(&vllm), Err(EngineError::NoLoadMetrics));
    assert_eq!(engines::llamacpp(&vllm, &slots), Err(EngineError::NoLoadMetrics));
    assert_eq!(engines::vllm(""), Err(EngineError::NoLoadMetrics));
    assert_eq!(engines::vllm("<html>404</html>"), Err(EngineError::NoLoadMetrics));
    // HELP and TYPE without a sample are no metric either.
    let described = "# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n";
    assert_eq!(engines::vllm(described), Err(EngineError::NoLoadMetrics));
    // Only cache_config_info: no load.
    assert_eq!(engines::vllm("vllm:cache_config_info{num_gpu_blocks=\"9\"} 1\n"), Err(EngineError::NoLoadMetrics));
}

#[test]
fn documents_over_the_limit_are_refused() {
    let big = format!("vllm:num_requests_running 1\n{}", "#".repeat(MAX_DOCUMENT_BYTES));
    let too_large = EngineError::TooLarge { bytes: big.len(), limit: MAX_DOCUMENT_BYTES };
    assert_eq!(engines::vllm(&big), Err(too_large.clone()));
    assert_eq!(engines::sglang(&big), Err(too_large.clone()));
    assert_eq!(engines::llamacpp(&big, "[]"), Err(too_large.clone()));
    assert_eq!(engines::llamacpp("llamacpp:requests_processing 1\n", &big), Err(too_large));
    let at_limit = format!("vllm:num_requests_running 1\n{}", "#".repeat(MAX_DOCUMENT_BYTES - 28));
    assert_eq!(at_limit.len(), MAX_DOCUMENT_BYTES);
    assert_eq!(ranks(engines::vllm(&at_limit)), [rank(0, 0, 0, 1)]);
}

#[test]
fn snapshot_dispatches_by_kind() {
    let vllm = fixture("vllm-v1-dp2.txt");
    assert_eq!(engines::snapshot(EngineKind::Vllm, &vllm, Some("ignored")), engines::vllm(&vllm));
    let sglang = fixture("sglang-dp2-tp2.txt");
    assert_eq!(engines::snapshot(EngineKind::Sglang, &sglang, None), engines::sglang(&sglang));
    let metrics = fixture("llamacpp-tiny-sat-metrics.txt");
    let slots = fixture("llamacpp-tiny-sat-slots.json");
    assert_eq!(engines::snapshot(EngineKind::LlamaCpp, &metrics, Some(&slots)), engines::llamacpp(&metrics, &slots));
    assert_eq!(engines::snapshot(EngineKind::LlamaCpp, &metrics, None), Err(EngineError::MissingSlots));
}

#[test]
fn engine_kinds_parse_and_print() {
    for (text, kind) in [
        ("vllm", EngineKind::Vllm),
        ("VLLM", EngineKind::Vllm),
        ("SGLang", EngineKind::Sglang),
        ("llamacpp", EngineKind::LlamaCpp),
        ("llama.cpp", EngineKind::LlamaCpp),
        ("Llama-CPP", EngineKind::LlamaCpp),
    ] {
        assert_eq!(text.parse::<EngineKind>(), Ok(kind), "{text}");
    }
    for kind in EngineKind::ALL {
        assert_eq!(kind.to_string(), kind.name());
        assert_eq!(kind.name().parse::<EngineKind>(), Ok(kind));
        assert_eq!(kind.needs_slots(), kind == EngineKind::LlamaCpp);
    }
    assert_eq!(EngineKind::ALL.map(EngineKind::name), ["vllm", "sglang", "llamacpp"]);
    let err = "tgi".parse::<EngineKind>().unwrap_err().to_string();
    assert!(err.contains("tgi") && err.contains("vllm, sglang or llamacpp"), "{err}");
    assert!(" vllm".parse::<EngineKind>().is_err());
}

#[test]
fn errors_display_on_one_line() {
    for err in [
        EngineError::TooLarge { bytes: 9, limit: 8 },
        EngineError::Exposition("x: y".into()),
        EngineError::NoLoadMetrics,
        EngineError::InvalidValue { metric: "vllm:num_requests_running", value: f64::NAN },
        EngineError::TooManyRanks { limit: MAX_RANKS },
        EngineError::Slots("expected an array".into()),
        EngineError::MissingSlots,
    ] {
        let text = err.to_string();
        assert!(!text.is_empty() && !text.contains('\n'), "{text}");
    }
}
