//! Deterministic output: filler words seeded by the prompt, tokenized with the engine's
//! tokenizer so that the streamed text and the cached output tokens agree.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::tokens::{PrepareError, Preprocessor};

const WORDS: [&str; 32] = [
    "the",
    "quick",
    "model",
    "answers",
    "with",
    "simulated",
    "tokens",
    "while",
    "routers",
    "measure",
    "cache",
    "hits",
    "and",
    "latency",
    "across",
    "engines",
    "prefix",
    "blocks",
    "stay",
    "warm",
    "for",
    "every",
    "session",
    "that",
    "returns",
    "to",
    "its",
    "engine",
    "so",
    "prefill",
    "work",
    "shrinks",
];

/// A small deterministic generator (SplitMix64).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A seed for a prompt's output (and the prompt's identity for PD rooms).
pub(crate) fn prompt_hash(prompt: &[u32]) -> u64 {
    let bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxh3_64_with_seed(&bytes, 0x4f55_5450_5554)
}

/// Exactly `count` output token ids and the text of each, from ASCII filler words.
pub(crate) fn generate(
    preprocessor: &Preprocessor,
    seed: u64,
    count: usize,
) -> Result<(Vec<u32>, Vec<String>), PrepareError> {
    let mut rng = SplitMix(seed);
    let mut text = String::new();
    let mut target = count.max(1);
    loop {
        while text.len() < target {
            let word = WORDS[(rng.next() % WORDS.len() as u64) as usize];
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(word);
        }
        let mut ids = preprocessor.encode(&text)?;
        if ids.len() >= count {
            ids.truncate(count);
            let pieces = ids.iter().map(|id| preprocessor.decode_token(*id)).collect();
            return Ok((ids, pieces));
        }
        target *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_deterministic_and_exactly_as_long_as_asked() {
        let pre = Preprocessor::builtin();
        let (ids, pieces) = generate(&pre, 42, 37).expect("generates");
        assert_eq!(ids.len(), 37);
        assert_eq!(pieces.concat().len(), 37, "one byte per token");
        assert_eq!(generate(&pre, 42, 37).expect("again").0, ids);
        assert_ne!(generate(&pre, 43, 37).expect("other seed").0, ids);
        let text = pieces.concat();
        assert_eq!(pre.encode(&text).expect("encode"), ids, "text re-tokenizes to the same ids");
    }
}
