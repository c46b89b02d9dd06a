//! The text of trace prompts: every hash id becomes a deterministic run of tokens (the same id
//! always the same tokens), sent as text that the configured tokenizer turns back into exactly
//! those tokens.
//!
//! - Built-in byte-level tokenizer: ASCII words, one token per byte (so a block is a run of
//!   `block_tokens` bytes of words, the text the session workload uses too).
//! - A `tokenizer.json`: tokens drawn from a pool of the vocabulary's word tokens, those that
//!   decode to ASCII letters carrying their own separator (`" alpha"` in byte-level BPE,
//!   `"▁alpha"` in SentencePiece, any word of a whitespace-split word-level vocabulary) and
//!   that encode back to themselves next to each other; when a vocabulary has too few of them
//!   (a pure byte-level one, like the shipped `assets/tokenizer.json`), single ASCII letters.
//!   The text is the tokenizer's own decoding of the ids, and every prompt is checked to encode
//!   back to exactly its ids before the replay starts.

use std::collections::HashSet;

use super::TraceRequest;
use crate::load::LoadError;
use crate::load::workload::{SplitMix, seed_of, text};
use crate::tokens::Preprocessor;

/// Most word tokens kept in the pool (the first ones in id order).
const MAX_POOL: usize = 4096;
/// Fewer word tokens than this and the pool falls back to single letters.
pub(super) const MIN_WORD_POOL: usize = 64;

/// Seed domain of the tokens of hash ids.
const HASH_ID_DOMAIN: u64 = 3;
/// Seed domain of the padding of requests whose hash ids do not cover their input.
const PADDING_DOMAIN: u64 = 4;

/// Makes the token ids and text of trace prompts for one tokenizer.
#[derive(Debug)]
pub(crate) struct TraceText {
    preprocessor: Preprocessor,
    /// `None` for the built-in byte tokenizer; else the token ids drawn from.
    pool: Option<Vec<u32>>,
    block_tokens: usize,
}

impl TraceText {
    /// Text for `block_tokens` tokens per hash id with `preprocessor`'s tokenizer.
    pub(crate) fn new(preprocessor: Preprocessor, block_tokens: usize) -> Result<Self, LoadError> {
        let pool = match preprocessor.hugging_face() {
            None => None,
            Some(tokenizer) => {
                let pool = word_pool(tokenizer);
                if pool.len() < 2 {
                    return Err(LoadError::NoTraceTokens {
                        tokenizer: preprocessor.source().map(ToOwned::to_owned).unwrap_or_default(),
                    });
                }
                Some(pool)
            }
        };
        Ok(Self { preprocessor, pool, block_tokens })
    }

    /// The tokenizer and chat template the prompts are meant for.
    pub(crate) fn preprocessor(&self) -> &Preprocessor {
        &self.preprocessor
    }

    /// The `n` tokens of `seed`.
    fn run(&self, seed: u64, n: usize) -> Vec<u32> {
        match &self.pool {
            None => text(seed, n).bytes().map(u32::from).collect(),
            Some(pool) => {
                let mut rng = SplitMix(seed);
                (0..n).map(|_| pool[(rng.next() % pool.len() as u64) as usize]).collect()
            }
        }
    }

    /// The token ids drawn from; `None` for the built-in byte tokenizer.
    #[cfg(test)]
    pub(super) fn pool(&self) -> Option<&[u32]> {
        self.pool.as_deref()
    }

    /// The tokens of one hash id.
    pub(crate) fn block(&self, hash_id: u64) -> Vec<u32> {
        self.run(seed_of(&[HASH_ID_DOMAIN, hash_id]), self.block_tokens)
    }

    /// The prompt's tokens: its hash ids' tokens in order, cut at `input_length` (padded with
    /// tokens of its own when the ids do not cover the input).
    pub(crate) fn content_ids(&self, request: &TraceRequest) -> Vec<u32> {
        let mut ids = Vec::with_capacity(request.input_length + self.block_tokens);
        for &hash_id in &request.hash_ids {
            if ids.len() >= request.input_length {
                break;
            }
            ids.extend(self.block(hash_id));
        }
        if ids.len() < request.input_length {
            let seed = seed_of(&[PADDING_DOMAIN, request.index as u64]);
            ids.extend(self.run(seed, request.input_length - ids.len()));
        }
        ids.truncate(request.input_length);
        ids
    }

    /// The text of `ids`, without checking it.
    pub(crate) fn text(&self, ids: &[u32]) -> Result<String, LoadError> {
        self.preprocessor.decode(ids).map_err(LoadError::Tokenizer)
    }

    /// The text of `ids`, checked to tokenize back to exactly `ids` (`request` names the trace
    /// request in the error).
    pub(crate) fn checked_text(&self, ids: &[u32], request: usize) -> Result<String, LoadError> {
        let text = self.text(ids)?;
        let back = self.preprocessor.encode(&text).map_err(LoadError::Tokenizer)?;
        if back != ids {
            let at = back.iter().zip(ids).take_while(|(a, b)| a == b).count();
            return Err(LoadError::TraceText {
                request,
                tokenizer: self.preprocessor.source().map(ToOwned::to_owned).unwrap_or_default(),
                at,
            });
        }
        Ok(text)
    }
}

/// The token ids trace text is drawn from (see the module docs).
fn word_pool(tokenizer: &tokenizers::Tokenizer) -> Vec<u32> {
    let added: HashSet<u32> = tokenizer.get_added_tokens_decoder().keys().copied().collect();
    let encodes_to = |text: &str, ids: &[u32]| {
        tokenizer.encode(text, false).is_ok_and(|encoding| encoding.get_ids() == ids)
    };
    let size = u32::try_from(tokenizer.get_vocab_size(false)).unwrap_or(u32::MAX);
    let (mut words, mut letters) = (Vec::new(), Vec::new());
    for id in (0..size).filter(|id| !added.contains(id)) {
        let Ok(single) = tokenizer.decode(&[id], false) else { continue };
        let word = single.trim_start_matches(' ');
        if word.is_empty() || !word.bytes().all(|b| b.is_ascii_alphabetic()) {
            continue;
        }
        let pair = tokenizer.decode(&[id, id], false).unwrap_or_default();
        if pair.trim_start() == format!("{word} {word}") && encodes_to(&pair, &[id, id]) {
            words.push(id);
            if words.len() >= MAX_POOL {
                break;
            }
        } else if word.len() == 1 && single.len() == 1 && encodes_to(&single, &[id]) {
            letters.push(id);
        }
    }
    if words.len() >= MIN_WORD_POOL { words } else { letters }
}
