//! Texts encoded piece by piece, and again from the cache, give `encode_fast`'s ids: chat
//! prompts, arbitrary texts around added tokens, a post-processor's BOS; tokenizers whose
//! pieces cannot be proven to encode alone are encoded whole.

use proptest::prelude::*;
use serde_json::{Value, json};
use tokenizers::Tokenizer;

use super::*;

/// GPT-2's byte-level BPE with the ChatML markers as special tokens, changed as `edit` says
/// (its tokenizer.json).
fn gpt2_with(edit: impl FnOnce(&mut Value)) -> Tokenizer {
    let mut json: Value =
        serde_json::from_str(router_sim::assets::gpt2::TOKENIZER_JSON).expect("tokenizer.json");
    edit(&mut json);
    json.to_string().parse().expect("a tokenizer")
}

fn gpt2() -> Tokenizer {
    gpt2_with(|_| {})
}

/// Holds `encoder`'s ids of `text` to `encode_fast`'s, with and without special tokens.
fn assert_agrees(encoder: &Encoder, text: &str) {
    for special in [false, true] {
        let whole = encoder.tokenizer.encode_fast(text, special).expect("encode_fast");
        let ids = encoder.encode(text, special).expect("encode");
        assert_eq!(ids, whole.get_ids(), "{text:?}, special tokens {special}");
    }
}

/// A ChatML conversation of `turns` user and assistant turns, each long enough to be cached.
fn conversation(turns: usize) -> String {
    let mut text = "<|im_start|>system\nYou are a careful assistant.<|im_end|>\n".to_owned();
    for turn in 0..turns {
        let said = format!("Turn {turn}: tell me about the number {turn} and its friends. ");
        text += &format!("<|im_start|>user\n{}<|im_end|>\n", said.repeat(12));
        text += &format!("<|im_start|>assistant\n{}<|im_end|>\n", said.repeat(9));
    }
    text + "<|im_start|>assistant\n"
}

#[test]
fn a_conversation_encodes_by_pieces_to_encode_fasts_ids_and_its_next_turn_from_the_cache() {
    let encoder = Encoder::new(gpt2(), 1 << 20);
    assert_eq!(encoder.whole_reason(), None, "GPT-2's pieces encode alone");
    let Ok(pieces) = &encoder.pieces else { unreachable!() };
    let before = pieces.cache.len();
    assert_agrees(&encoder, &conversation(3));
    let cached = pieces.cache.len();
    assert!(cached >= before + 6, "each long message is cached: {before} -> {cached}");
    // The next turn repeats the three before it: only its new messages are encoded.
    assert_agrees(&encoder, &conversation(4));
    assert_eq!(pieces.cache.len(), cached + 2, "the repeated messages came from the cache");
    let stats = encoder.cache_stats().expect("by pieces");
    assert_eq!((stats.entries, stats.bytes), (pieces.cache.len() as u64, pieces.cache.weight()));
    assert!(stats.hits >= 6 && stats.misses >= stats.entries, "{stats:?}");
}

#[test]
fn added_tokens_are_found_directly_unless_the_tokenizer_must_split_them_itself() {
    let direct = Encoder::new(gpt2(), 1 << 20);
    let Ok(pieces) = &direct.pieces else { unreachable!() };
    assert!(matches!(pieces.split, Split::Direct { .. }), "GPT-2: no normalizer, plain markers");
    let stripping = gpt2_with(|json| json["added_tokens"][1]["lstrip"] = json!(true));
    let normalizing = gpt2_with(|json| json["normalizer"] = json!({"type": "NFC"}));
    for (name, tokenizer) in [("lstrip", stripping), ("normalizer", normalizing)] {
        let encoder = Encoder::new(tokenizer, 1 << 20);
        let Ok(pieces) = &encoder.pieces else { panic!("{name}: {:?}", encoder.whole_reason()) };
        assert!(matches!(pieces.split, Split::Tokenizer), "{name}");
        assert_agrees(&encoder, &conversation(2));
        assert_agrees(&encoder, " <|im_start|>  <|im_end|>\n<|im_start|>user");
    }
}

#[test]
fn a_bounded_cache_stays_within_its_bytes() {
    let encoder = Encoder::new(gpt2(), 4096);
    assert_eq!(encoder.whole_reason(), None);
    for turns in 1..12 {
        assert_agrees(&encoder, &conversation(turns));
    }
    let Ok(pieces) = &encoder.pieces else { unreachable!() };
    assert!(pieces.cache.weight() <= 4096, "{} bytes cached", pieces.cache.weight());
}

#[test]
fn a_post_processors_special_tokens_are_added_around_the_pieces() {
    let tokenizer = gpt2_with(|json| {
        let token = |id: &str| json!({"SpecialToken": {"id": id, "type_id": 0}});
        json["post_processor"] = json!({
            "type": "TemplateProcessing",
            "single": [token("<|endoftext|>"), {"Sequence": {"id": "A", "type_id": 0}},
                       token("<|im_end|>")],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {
                "<|endoftext|>": {"id": "<|endoftext|>", "ids": [50256], "tokens": ["<|endoftext|>"]},
                "<|im_end|>": {"id": "<|im_end|>", "ids": [50258], "tokens": ["<|im_end|>"]},
            },
        });
    });
    let encoder = Encoder::new(tokenizer, 1 << 20);
    assert_eq!(encoder.whole_reason(), None);
    let ids = encoder.encode("Hello there", true).expect("encode");
    assert_eq!((ids.first(), ids.last()), (Some(&50256), Some(&50258)), "{ids:?}");
    assert_agrees(&encoder, &conversation(2));
}

#[test]
fn tokenizers_whose_pieces_may_not_encode_alone_are_encoded_whole() {
    let prepend_at_start = gpt2_with(|json| {
        json["pre_tokenizer"] = json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true});
    });
    let dropout = gpt2_with(|json| json["model"]["dropout"] = json!(0.1));
    let truncated = gpt2_with(|json| {
        json["truncation"] = json!({"direction": "Right", "max_length": 4096, "strategy": "LongestFirst", "stride": 0});
    });
    for (name, tokenizer) in
        [("prepend first", prepend_at_start), ("dropout", dropout), ("truncation", truncated)]
    {
        let encoder = Encoder::new(tokenizer, 1 << 20);
        assert_eq!(encoder.whole_reason(), Some(WholeReason::PositionDependent), "{name}");
        if name != "dropout" {
            assert_agrees(&encoder, &conversation(2));
        }
    }
    let no_cache = Encoder::new(gpt2(), 0);
    assert_eq!(no_cache.whole_reason(), Some(WholeReason::NoCache));
    assert_agrees(&no_cache, &conversation(2));
    // Resized, the proof stands: off, then on again with a cache of its own.
    let resized = Encoder::new(gpt2(), 1 << 20).with_cache_bytes(0);
    assert_eq!(resized.whole_reason(), Some(WholeReason::NoCache));
    let resized = resized.with_cache_bytes(1 << 16);
    assert_eq!(resized.whole_reason(), None);
    assert_agrees(&resized, &conversation(2));
}

/// Pieces of text the property test strings together: the tokenizer's added tokens, words,
/// whitespace of every kind, digits, punctuation, non-Latin scripts and long repeats.
fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("<|im_start|>".to_owned()),
        Just("<|im_end|>".to_owned()),
        Just("<|endoftext|>".to_owned()),
        "[a-zA-Z]{1,12}",
        "[ \t\n\r]{1,4}",
        "[0-9]{1,6}",
        "[.,;:!?'\"()-]{1,3}",
        "[é你好🙂ßж]{1,4}",
        "[a-z ]{20,40}".prop_map(|s| s.repeat(12)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn any_text_encodes_by_pieces_to_encode_fasts_ids(
        fragments in prop::collection::vec(fragment(), 0..24),
    ) {
        static ENCODER: std::sync::OnceLock<Encoder> = std::sync::OnceLock::new();
        let encoder = ENCODER.get_or_init(|| Encoder::new(gpt2(), 1 << 20));
        let text = fragments.concat();
        for special in [false, true] {
            let whole = encoder.tokenizer.encode_fast(text.as_str(), special).expect("encode_fast");
            // Twice: encoded, then from the cache.
            for _ in 0..2 {
                prop_assert_eq!(encoder.encode(&text, special).expect("encode"), whole.get_ids());
            }
        }
    }
}
