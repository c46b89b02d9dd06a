//! Trace replay: reading and scaling traces, prompt text, the oracles, the offered-load time
//! scale and the bounds.

use std::path::PathBuf;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::tokens::render_chatml;

/// A file under a fresh temporary directory, removed (with the directory) on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("router-sim-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }

    fn write(&self, file: &str, text: &str) -> PathBuf {
        let path = self.0.join(file);
        std::fs::write(&path, text).expect("write");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn request(index: usize, input_length: usize, hash_ids: &[u64]) -> TraceRequest {
    TraceRequest {
        index,
        timestamp_ms: 0.0,
        input_length,
        output_length: 1,
        hash_ids: hash_ids.to_vec(),
    }
}

#[test]
fn arrival_times_are_divided_by_the_time_scale() {
    let dir = TempDir::new("trace-times");
    let path = dir.write(
        "t.jsonl",
        &[
            r#"{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}"#,
            r#"{"timestamp": 100, "input_length": 1500, "output_length": 7, "hash_ids": [0, 1, 2]}"#,
            "",
            r#"{"timestamp": 250, "input_length": 600, "output_length": 0, "hash_ids": [0, 3]}"#,
            r#"{"timestamp": 300, "input_length": 10, "output_length": 1, "hash_ids": [9]}"#,
        ]
        .join("\n"),
    );
    let spec = TraceSpec { max_requests: Some(3), ..TraceSpec::new(&path) };
    let requests = read_trace(&spec).expect("reads");
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[1].at(10.0), Duration::from_millis(10), "100 ms / 10");
    assert_eq!(requests[2].at(10.0), Duration::from_millis(25));
    assert_eq!(requests[2].index, 2, "blank lines are not requests");
    assert_eq!(requests[2].output_length, 1, "at least one output token");
    assert_eq!((requests[1].input_length, requests[1].output_length), (1500, 7));

    assert_eq!(
        read_trace(&TraceSpec::new(&path)).expect("reads")[3].at(0.5),
        Duration::from_millis(600)
    );
    let replay =
        Replay::prepare(&TraceSpec { pace: Pace::TimeScale(10.0), ..spec }).expect("prepares");
    assert_eq!(replay.at(2), Duration::from_millis(25), "the replay keeps the given scale");
}

#[test]
fn bad_lines_and_bad_flags_are_named() {
    let dir = TempDir::new("trace-bad");
    let path = dir
        .write("t.jsonl", "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n{oops");
    let err = read_trace(&TraceSpec::new(&path)).expect_err("line 2 is bad");
    assert!(err.to_string().contains(":2"), "{err}");
    let offered = |load: f64| TraceSpec {
        pace: Pace::OfferedLoad(load),
        fleet_capacity_tokens: Some(1024),
        engines: Some(2),
        prefill_tokens_per_sec: Some(1000.0),
        ..TraceSpec::new(&path)
    };
    offered(2.0).validate().expect("2 is the largest offered load");
    for (spec, flag) in [
        (TraceSpec { pace: Pace::TimeScale(0.0), ..TraceSpec::new(&path) }, "--time-scale"),
        (offered(0.0), "--offered-load"),
        (offered(2.5), "--offered-load"),
        (offered(f64::NAN), "--offered-load"),
        (offered(f64::INFINITY), "--offered-load"),
        (TraceSpec { engines: None, ..offered(0.5) }, "--engines"),
        (TraceSpec { prefill_tokens_per_sec: None, ..offered(0.5) }, "--prefill-tokens-per-sec"),
        (TraceSpec { fleet_capacity_tokens: None, ..offered(0.5) }, "--fleet-capacity-tokens"),
        (TraceSpec { engines: Some(0), ..TraceSpec::new(&path) }, "--engines"),
        (
            TraceSpec { prefill_tokens_per_sec: Some(0.0), ..TraceSpec::new(&path) },
            "--prefill-tokens-per-sec",
        ),
        (
            TraceSpec { prefill_tokens_per_sec: Some(f64::NAN), ..TraceSpec::new(&path) },
            "--prefill-tokens-per-sec",
        ),
        (TraceSpec { length_scale: -1.0, ..TraceSpec::new(&path) }, "--trace-length-scale"),
        (TraceSpec { block_tokens: 0, ..TraceSpec::new(&path) }, "--trace-block-tokens"),
        (TraceSpec { engine_block_size: 0, ..TraceSpec::new(&path) }, "--block-size"),
        (
            TraceSpec { fleet_capacity_tokens: Some(8), ..TraceSpec::new(&path) },
            "--fleet-capacity-tokens",
        ),
    ] {
        let err = spec.validate().expect_err(flag);
        assert!(err.to_string().contains(flag), "{err}");
    }
}

#[test]
fn length_scaling_shrinks_blocks_inputs_and_outputs_together() {
    let spec = TraceSpec { length_scale: 0.125, ..TraceSpec::new("unused") };
    assert_eq!(spec.scaled_block_tokens(), 64);
    assert_eq!(spec.scale_length(6758), 845, "ceil(6758 / 8)");
    assert_eq!(spec.scale_length(512), 64);
    assert_eq!(spec.scale_length(513), 65);
    assert_eq!(spec.scale_length(3), 1);
    let tiny = TraceSpec { length_scale: 0.0001, ..TraceSpec::new("unused") };
    assert_eq!(tiny.scaled_block_tokens(), 1, "at least one token per block");
}

proptest! {
    /// A scaled request keeps its number of blocks, so the prefix structure is unchanged.
    #[test]
    fn scaled_lengths_keep_the_number_of_blocks(
        input in 1usize..200_000,
        scale in 0.001f64..2.0,
    ) {
        let spec = TraceSpec { length_scale: scale, ..TraceSpec::new("unused") };
        let block = spec.scaled_block_tokens();
        prop_assert_eq!(spec.scale_length(input).div_ceil(block), input.div_ceil(512));
    }
}

#[test]
fn builtin_prompts_are_the_hash_ids_tokens_in_order_cut_at_the_input() {
    let text = TraceText::new(Preprocessor::builtin(), 512).expect("builtin");
    let (a, b, c) =
        (request(0, 1000, &[0, 1]), request(1, 1500, &[0, 1, 2]), request(2, 700, &[0, 3]));
    let (ia, ib, ic) = (text.content_ids(&a), text.content_ids(&b), text.content_ids(&c));
    assert_eq!((ia.len(), ib.len(), ic.len()), (1000, 1500, 700));
    assert_eq!(ia[..], ib[..1000]);
    assert_eq!(ia[..512], text.block(0)[..]);
    assert_eq!(ic[..512], ia[..512]);
    assert_eq!(ic[512..], text.block(3)[..188]);
    assert_ne!(ia[512..700], ic[512..700]);
    // The text is one byte per token: the engine's tokens exactly.
    let content = text.checked_text(&ia, 0).expect("round trip");
    assert!(content.is_ascii() && content.contains(' '));
    assert_eq!(content.bytes().map(u32::from).collect::<Vec<_>>(), ia);
    let short = text.content_ids(&request(3, 600, &[]));
    assert_eq!(short.len(), 600, "inputs beyond the hash ids are padded");
    assert_ne!(short, text.content_ids(&request(4, 600, &[])), "padding is per request");
}

fn shipped() -> Preprocessor {
    Preprocessor::from_tokenizer_file(&crate::assets::tokenizer_path()).expect("shipped")
}

proptest! {
    /// With the shipped byte-level tokenizer.json (no word tokens: letters are drawn), the
    /// text of any prompt tokenizes back to exactly its tokens.
    #[test]
    fn shipped_tokenizer_text_round_trips(
        ids in prop::collection::vec(0u64..50, 0..6),
        input in 1usize..400,
    ) {
        let text = TraceText::new(shipped(), 64).expect("pool");
        let ids = text.content_ids(&request(0, input, &ids));
        prop_assert_eq!(ids.len(), input);
        let content = text.checked_text(&ids, 0).expect("round trip");
        prop_assert!(content.bytes().all(|b| b.is_ascii_alphabetic()));
    }
}

/// A byte-level BPE tokenizer with real merges for 96 words (`" kalo"`, ...), as `tokenizer.json`
/// in `dir`, with the shipped ChatML template beside it.
fn word_bpe(dir: &TempDir) -> PathBuf {
    let mut tokenizer: serde_json::Value =
        serde_json::from_str(&crate::tokens::byte_level_tokenizer_json()).expect("json");
    let syllables = ["ka", "lo", "mi", "ne", "su", "ta", "vo", "ri"];
    let mut vocab = tokenizer["model"]["vocab"].as_object().expect("vocab").clone();
    let mut merges: Vec<String> = Vec::new();
    let mut add = |left: String, right: String, vocab: &mut serde_json::Map<_, _>| {
        let merged = format!("{left}{right}");
        if !vocab.contains_key(&merged) {
            let id = vocab.len();
            vocab.insert(merged, serde_json::Value::from(id));
            merges.push(format!("{left} {right}"));
        }
    };
    for a in syllables {
        for b in syllables {
            for c in ["", "n"] {
                // "Ġ" + word, merged one character at a time.
                let word: Vec<char> = format!("{a}{b}{c}").chars().collect();
                let mut token = "Ġ".to_owned();
                for ch in word {
                    add(token.clone(), ch.to_string(), &mut vocab);
                    token.push(ch);
                }
            }
        }
    }
    tokenizer["model"]["vocab"] = serde_json::Value::Object(vocab);
    tokenizer["model"]["merges"] = serde_json::json!(merges);
    tokenizer["pre_tokenizer"]["use_regex"] = serde_json::json!(true);
    let config = std::fs::read_to_string(crate::assets::tokenizer_config_path()).expect("config");
    dir.write("tokenizer_config.json", &config);
    dir.write("tokenizer.json", &tokenizer.to_string())
}

#[test]
fn word_tokens_of_a_bpe_vocabulary_make_text_that_round_trips() {
    let dir = TempDir::new("trace-bpe");
    let path = word_bpe(&dir);
    let preprocessor = Preprocessor::from_tokenizer_file(&path).expect("loads");
    let text = TraceText::new(preprocessor, 32).expect("pool");
    let pool = text.pool().expect("a vocabulary pool").to_vec();
    assert!(pool.len() >= text::MIN_WORD_POOL, "word tokens found: {}", pool.len());
    for id in &pool {
        let word = text.text(&[*id]).expect("decodes");
        assert!(word.starts_with(" ") && word.len() >= 2, "{word:?} is a word token");
    }
    let ids = text.content_ids(&request(0, 100, &[7, 8, 9, 10]));
    assert_eq!(ids.len(), 100);
    let content = text.checked_text(&ids, 0).expect("round trip");
    assert_eq!(content.split_whitespace().count(), 100, "one word per token");
    assert_eq!(text.content_ids(&request(1, 32, &[7]))[..], ids[..32], "same id, same tokens");
}

/// The engine prompt of one trace request with the built-in tokenizer.
fn engine_prompt(text: &TraceText, request: &TraceRequest) -> Vec<u32> {
    let content = text.text(&text.content_ids(request)).expect("text");
    render_chatml(&[ChatMessage::new("user", content)]).bytes().map(u32::from).collect()
}

fn write_trace(dir: &TempDir, lines: &[&str]) -> PathBuf {
    dir.write("trace.jsonl", &lines.join("\n"))
}

#[test]
fn the_oracle_counts_engine_blocks_of_the_rendered_prompt() {
    let dir = TempDir::new("trace-oracle");
    let path = write_trace(
        &dir,
        &[
            r#"{"timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [0, 1]}"#,
            r#"{"timestamp": 1, "input_length": 150, "output_length": 2, "hash_ids": [0, 1, 2]}"#,
            r#"{"timestamp": 2, "input_length": 10, "output_length": 2, "hash_ids": [5]}"#,
        ],
    );
    let spec = TraceSpec { block_tokens: 64, ..TraceSpec::new(&path) };
    let replay = Replay::prepare(&spec).expect("prepares");
    let prompts: Vec<Vec<u32>> =
        replay.requests.iter().map(|r| engine_prompt(&replay.text, r)).collect();
    // `<|im_start|>user\n` + content + `<|im_end|>\n<|im_start|>assistant\n`.
    assert_eq!(prompts.iter().map(Vec::len).collect::<Vec<_>>(), [150, 200, 60]);
    let oracle = replay.oracle_over(3);
    assert_eq!(oracle.prompt_tokens, 410);
    // Request 1 shares request 0's framing and whole content (17 + 100 tokens: 7 blocks of
    // 16), although request 0 held only part of hash id 1; request 2 shares nothing but the
    // framing's first block, `<|im_start|>user`, which an id-based count would miss.
    assert_eq!(replay.steps.iter().map(|s| s.hit_tokens).collect::<Vec<_>>(), [0, 112, 16]);
    assert_eq!(oracle.hit_rate(), Some(128.0 / 410.0));
    assert_eq!(oracle.fleet, None);
    // Over the first request only (a run cut short).
    assert_eq!(replay.oracle_over(1).hit_rate(), Some(0.0));
    assert_eq!(replay.oracle_over(0).hit_rate(), None);

    // A fleet cache of 9 blocks keeps request 0's chain (9 blocks) and nothing more.
    let spec = TraceSpec { fleet_capacity_tokens: Some(144), ..spec };
    let replay = Replay::prepare(&spec).expect("prepares");
    let fleet: Vec<_> = replay.steps.iter().map(|s| s.fleet_hit_tokens).collect();
    assert_eq!(fleet, [Some(0), Some(112), Some(16)]);
    // A fleet of 2 blocks keeps request 0's first two blocks: a request's deepest blocks are
    // its least recently touched, so they go first.
    let spec = TraceSpec { fleet_capacity_tokens: Some(32), ..spec };
    let replay = Replay::prepare(&spec).expect("prepares");
    let fleet: Vec<_> = replay.steps.iter().map(|s| s.fleet_hit_tokens).collect();
    assert_eq!(fleet, [Some(0), Some(32), Some(16)]);
}

#[test]
fn an_offered_load_scales_the_replay_after_the_oracles() {
    let dir = TempDir::new("trace-offered");
    let lines = [
        r#"{"timestamp": 1000, "input_length": 100, "output_length": 2, "hash_ids": [0, 1]}"#,
        r#"{"timestamp": 2000, "input_length": 150, "output_length": 2, "hash_ids": [0, 1, 2]}"#,
        r#"{"timestamp": 3000, "input_length": 10, "output_length": 2, "hash_ids": [5]}"#,
    ];
    let path = write_trace(&dir, &lines);
    let spec = TraceSpec {
        block_tokens: 64,
        pace: Pace::OfferedLoad(0.5),
        fleet_capacity_tokens: Some(144),
        engines: Some(2),
        prefill_tokens_per_sec: Some(50.0),
        ..TraceSpec::new(&path)
    };
    let replay = Replay::prepare(&spec).expect("prepares");
    // Prompts of 150, 200 and 60 tokens, of which the fleet oracle (like the unlimited one)
    // misses 150, 88 and 44: 282 tokens over 2 s of trace. At 0.5 of 2 x 50 tokens/s they
    // take 5.64 s, so the replay runs 2 / 5.64 times as fast as the trace.
    let scaled = replay.schedule.scaled.clone().expect("chosen");
    assert_eq!((scaled.uncached_tokens, scaled.span_secs), (282, 2.0));
    let time_scale = replay.schedule.time_scale;
    assert!((time_scale - 2.0 / 5.64).abs() < 1e-12, "{time_scale}");
    assert!(replay.at(2).abs_diff(Duration::from_millis(8460)) < Duration::from_millis(1));
    let report = replay.report_over(3);
    let offered = report.offered_load.expect("every flag given");
    assert!((offered - 0.5).abs() < 1e-9, "{offered}");
    // The unlimited cache's misses at 50 tokens/s: 3000, 1760 and 880 ms.
    let floor = report.ttft_floor_ms.expect("a speed");
    assert_eq!((floor.p50, floor.p90, floor.p99), (1760.0, 3000.0, 3000.0));
    assert!((floor.mean - 5640.0 / 3.0).abs() < 1e-9);
    let fleet = report.oracle.fleet.expect("fleet");
    assert!(fleet.hit_tokens <= fleet.belady_hit_tokens);
    assert!(fleet.belady_hit_tokens <= report.oracle.hit_tokens);
    assert_eq!(replay.report_over(1).offered_load, None, "one request spans no time");

    let same_time: Vec<String> =
        lines.iter().map(|l| l.replace("\"timestamp\": 2000", "\"timestamp\": 1000")).collect();
    let dir = TempDir::new("trace-offered-flat");
    let flat = dir.write("trace.jsonl", &same_time.join("\n"));
    let spec = TraceSpec { path: flat, max_requests: Some(2), ..spec };
    let err = Replay::prepare(&spec).expect_err("no span to scale");
    assert!(err.to_string().contains("--offered-load"), "{err}");
}

#[test]
fn the_oracle_tokenizes_with_the_configured_tokenizer() {
    let dir = TempDir::new("trace-oracle-bpe");
    let tokenizer = word_bpe(&dir);
    let path = write_trace(
        &dir,
        &[
            r#"{"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [0, 1]}"#,
            r#"{"timestamp": 1, "input_length": 40, "output_length": 2, "hash_ids": [0, 1]}"#,
        ],
    );
    let spec =
        TraceSpec { block_tokens: 32, tokenizer: Some(tokenizer.clone()), ..TraceSpec::new(&path) };
    let replay = Replay::prepare(&spec).expect("prepares");
    let preprocessor = Preprocessor::from_tokenizer_file(&tokenizer).expect("loads");
    let content = replay.text.text(&replay.text.content_ids(&replay.requests[0])).expect("text");
    let prompt = preprocessor.prompt_ids(&[ChatMessage::new("user", content)]).expect("ids");
    let oracle = replay.oracle_over(2);
    assert_eq!(oracle.prompt_tokens, 2 * prompt.len() as u64);
    // The same prompt twice: every block but the one holding the last token.
    let reusable = (prompt.len() - 1) / 16 * 16;
    assert_eq!(oracle.hit_tokens, reusable as u64);
}
