//! Fuzz target `tokenize`: a prompt tokenized piece by piece, and again from the segment
//! cache, gives the ids of the whole-prompt encoding (`prepare.segment_cache_bytes: 0`).
//!
//! The tokenizer is GPT-2's byte-level BPE with the ChatML markers as added tokens
//! (router-sim's), so that the input's pieces meet added tokens anywhere. The first byte's low
//! bit says whether the tokenizer's special tokens are added; the rest is the prompt (input
//! that is not UTF-8 is skipped: a prompt is text). Beyond "never panics": the ids agree, the
//! first time and from the cache.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use router_prepare::Tokenization;

/// GPT-2's tokenizer, with a segment cache of `cache_bytes`.
fn load(cache_bytes: u64) -> Tokenization {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/router-sim/assets/gpt2/tokenizer.json");
    match Tokenization::load(&path, None) {
        Ok(tokenizer) => tokenizer.with_segment_cache_bytes(cache_bytes),
        Err(err) => panic!("loading {}: {err}", path.display()),
    }
}

fuzz_target!(|data: &[u8]| {
    static WHOLE: OnceLock<Tokenization> = OnceLock::new();
    static PIECES: OnceLock<Tokenization> = OnceLock::new();
    let whole = WHOLE.get_or_init(|| load(0));
    let pieces = PIECES.get_or_init(|| load(1 << 20));
    assert!(pieces.whole_reason().is_none(), "GPT-2's pieces encode alone");
    let Some((&flags, text)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(text) else { return };
    let special = flags & 1 == 1;
    let expected = whole.encode_text(text, special).expect("the whole prompt encodes");
    for _ in 0..2 {
        let ids = pieces.encode_text(text, special).expect("the pieces encode");
        assert_eq!(ids, expected, "{text:?}, special tokens {special}");
    }
});
