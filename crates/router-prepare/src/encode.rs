//! Token ids of a text, exactly as the tokenizers crate's `encode_fast` gives them, without an
//! `Encoding` (no token strings kept, no offsets, words or masks), and with the ids of each long
//! piece between added tokens kept in a bounded cache, so that a prompt repeating the previous
//! turn's text pays for its new pieces only.
//!
//! Why pieces are exact: the tokenizers crate splits a text on its added tokens first (the
//! `<|im_end|>`, `<|eot_id|>` and header markers a chat template writes around each message),
//! then normalizes, pre-tokenizes and encodes each piece between them on its own, and only
//! then adds the post-processor's special tokens. A piece's ids therefore depend on its text
//! alone, unless a component reads where the piece stands in the whole text (a Metaspace
//! pre-tokenizer that prepends only at the start, `prepend_scheme: first`), is random (BPE
//! dropout), or the whole encoding is cut or padded afterwards (truncation, padding). Such a
//! tokenizer is encoded whole, as `encode_fast` does. Any other is checked when it is loaded,
//! on probe texts built from its own added tokens, against `encode_fast`; one that disagrees
//! anywhere is encoded whole too. Where the tokenizer has no normalizer and its added tokens
//! are plain (none strips the spaces beside it, stands only as a word, or matches normalized
//! text), the added tokens are found directly, leftmost-longest as the crate finds them,
//! without the normalized copy of the text (an alignment per byte) its own split builds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aho_corasick::{AhoCorasick, MatchKind};
use quick_cache::Weighter;
use quick_cache::sync::Cache;
use tokenizers::{
    Model, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, Tokenizer,
};
use xxhash_rust::xxh3::xxh3_128;

/// The segment cache's size unless `prepare.segment_cache_bytes` says otherwise.
pub const DEFAULT_SEGMENT_CACHE_BYTES: u64 = 64 << 20;

/// Pieces shorter than this are encoded every time: looking one up would cost about what
/// encoding it does.
const MIN_CACHED_BYTES: usize = 256;

/// Bytes a cache entry costs beyond its ids (key, reference count, the cache's own slot).
const ENTRY_OVERHEAD: u64 = 64;

/// How a tokenizer's texts are turned into ids.
pub(crate) struct Encoder {
    tokenizer: Tokenizer,
    /// Piece by piece, or why whole texts go through `encode_fast`.
    pieces: Result<Pieces, WholeReason>,
}

/// Encoding piece by piece.
struct Pieces {
    /// How a text is split on the tokenizer's added tokens.
    split: Split,
    /// The ids of long pieces, by the 128-bit hash of their normalized text.
    cache: Cache<u128, Arc<[u32]>, IdsWeight>,
    /// The bytes it may hold.
    budget: u64,
    /// The special tokens the post-processor puts before and after a text's ids when asked
    /// to add them (a BOS, say).
    before: Vec<u32>,
    after: Vec<u32>,
    /// Long pieces found in the cache, and not.
    hits: AtomicU64,
    misses: AtomicU64,
}

/// What the segment cache holds and how often it was asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentCacheStats {
    /// Pieces whose ids it holds.
    pub entries: u64,
    /// Bytes they take, as the cache weighs them.
    pub bytes: u64,
    /// Long pieces whose ids came from it.
    pub hits: u64,
    /// Long pieces encoded (and then kept).
    pub misses: u64,
}

/// How a text is split into pieces on the tokenizer's added tokens.
enum Split {
    /// By the tokenizer itself (`extract_and_normalize`), which normalizes each piece too.
    Tokenizer,
    /// The added tokens found directly, leftmost-longest as the tokenizer finds them: the same
    /// pieces without a normalized copy of the text (an alignment per byte). Taken only when the
    /// tokenizer has no normalizer and no added token strips the spaces beside it, must stand
    /// as a word of its own, or is matched on normalized text.
    Direct {
        added: AhoCorasick,
        /// Each pattern's token id.
        added_ids: Vec<u32>,
    },
}

impl Split {
    fn of(tokenizer: &Tokenizer) -> Self {
        let added = tokenizer.get_added_tokens_decoder();
        let plain =
            added.values().all(|t| !t.single_word && !t.lstrip && !t.rstrip && !t.normalized);
        if tokenizer.get_normalizer().is_some() || tokenizer.get_encode_special_tokens() || !plain {
            return Split::Tokenizer;
        }
        let (added_ids, contents): (Vec<u32>, Vec<String>) =
            added.into_iter().map(|(id, token)| (id, token.content)).unzip();
        match AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(&contents) {
            Ok(added) => Split::Direct { added, added_ids },
            Err(_) => Split::Tokenizer,
        }
    }
}

/// A segment cache holding at most `bytes`.
fn cache(bytes: u64) -> Cache<u128, Arc<[u32]>, IdsWeight> {
    let estimated_items = usize::try_from(bytes / 4096).unwrap_or(1 << 16).max(16);
    Cache::with_weighter(estimated_items, bytes, IdsWeight)
}

/// A cache entry's size in bytes.
#[derive(Clone)]
struct IdsWeight;

impl Weighter<u128, Arc<[u32]>> for IdsWeight {
    fn weight(&self, _: &u128, ids: &Arc<[u32]>) -> u64 {
        ENTRY_OVERHEAD + 4 * ids.len() as u64
    }
}

/// Why a tokenizer is encoded whole rather than by pieces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WholeReason {
    /// `prepare.segment_cache_bytes` is 0.
    NoCache,
    /// A component depends on the piece's place in the text, is random, or the encoding is
    /// truncated or padded.
    PositionDependent,
    /// The probe texts encode differently piece by piece.
    ProbeMismatch,
}

impl Encoder {
    /// Encodes with `tokenizer`, piece by piece with a cache of `cache_bytes` where that is
    /// proven to give `encode_fast`'s ids.
    pub(crate) fn new(tokenizer: Tokenizer, cache_bytes: u64) -> Self {
        let pieces = if cache_bytes == 0 {
            Err(WholeReason::NoCache)
        } else if !encodes_pieces_alone(&tokenizer) {
            Err(WholeReason::PositionDependent)
        } else if let Some((before, after)) = special_tokens_around(&tokenizer) {
            let (hits, misses) = (AtomicU64::new(0), AtomicU64::new(0));
            let split = Split::of(&tokenizer);
            let cache = cache(cache_bytes);
            Ok(Pieces { split, cache, budget: cache_bytes, before, after, hits, misses })
        } else {
            Err(WholeReason::ProbeMismatch)
        };
        let mut encoder = Self { tokenizer, pieces };
        if encoder.pieces.is_ok() && !encoder.agrees_on_probes() {
            encoder.pieces = Err(WholeReason::ProbeMismatch);
        }
        encoder
    }

    /// The same encoder with a segment cache of `cache_bytes` (0: whole texts): what was proven
    /// of the tokenizer stands, and the cache is new unless it already has that size.
    pub(crate) fn with_cache_bytes(self, cache_bytes: u64) -> Self {
        let Self { tokenizer, pieces } = self;
        let pieces = match pieces {
            Ok(_) | Err(WholeReason::NoCache) if cache_bytes == 0 => Err(WholeReason::NoCache),
            Ok(pieces) if pieces.budget == cache_bytes => Ok(pieces),
            Ok(pieces) => {
                let (hits, misses) = (AtomicU64::new(0), AtomicU64::new(0));
                Ok(Pieces {
                    cache: cache(cache_bytes),
                    budget: cache_bytes,
                    hits,
                    misses,
                    ..pieces
                })
            }
            Err(WholeReason::NoCache) => return Self::new(tokenizer, cache_bytes),
            Err(reason) => Err(reason),
        };
        Self { tokenizer, pieces }
    }

    /// Why texts are encoded whole, or `None` when they are encoded by pieces.
    pub(crate) fn whole_reason(&self) -> Option<WholeReason> {
        self.pieces.as_ref().err().copied()
    }

    /// The segment cache's contents and lookups since it was built (the probe texts' among
    /// them), when texts are encoded by pieces.
    pub(crate) fn cache_stats(&self) -> Option<SegmentCacheStats> {
        let pieces = self.pieces.as_ref().ok()?;
        Some(SegmentCacheStats {
            entries: pieces.cache.len() as u64,
            bytes: pieces.cache.weight(),
            hits: pieces.hits.load(Ordering::Relaxed),
            misses: pieces.misses.load(Ordering::Relaxed),
        })
    }

    /// `text`'s ids, with the post-processor's special tokens when `add_special_tokens`: what
    /// `encode_fast(text, add_special_tokens)` gives.
    pub(crate) fn encode(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, tokenizers::Error> {
        match &self.pieces {
            Ok(pieces) => self.encode_pieces(pieces, text, add_special_tokens),
            Err(_) => Ok(self.tokenizer.encode_fast(text, add_special_tokens)?.get_ids().to_vec()),
        }
    }

    fn encode_pieces(
        &self,
        pieces: &Pieces,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, tokenizers::Error> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 8);
        if add_special_tokens {
            ids.extend_from_slice(&pieces.before);
        }
        match &pieces.split {
            Split::Direct { added, added_ids } => {
                let mut from = 0;
                for found in added.find_iter(text) {
                    self.encode_cached(pieces, &text[from..found.start()], &mut ids)?;
                    ids.push(added_ids[found.pattern().as_usize()]);
                    from = found.end();
                }
                self.encode_cached(pieces, &text[from..], &mut ids)?;
            }
            Split::Tokenizer => {
                let tokenizer = &self.tokenizer;
                let split = tokenizer
                    .get_added_vocabulary()
                    .extract_and_normalize(tokenizer.get_normalizer(), text);
                for (piece, _, added) in
                    split.get_splits(OffsetReferential::Original, OffsetType::None)
                {
                    match added {
                        Some(tokens) => ids.extend(tokens.iter().map(|token| token.id)),
                        None => self.encode_cached(pieces, piece, &mut ids)?,
                    }
                }
            }
        }
        if add_special_tokens {
            ids.extend_from_slice(&pieces.after);
        }
        Ok(ids)
    }

    /// Appends the ids of one piece without added tokens: from the cache when it is long and
    /// was seen before, else encoded (and kept when long).
    fn encode_cached(
        &self,
        pieces: &Pieces,
        piece: &str,
        ids: &mut Vec<u32>,
    ) -> Result<(), tokenizers::Error> {
        if piece.len() < MIN_CACHED_BYTES {
            return self.encode_piece(piece, ids);
        }
        let key = xxh3_128(piece.as_bytes());
        if let Some(cached) = pieces.cache.get(&key) {
            pieces.hits.fetch_add(1, Ordering::Relaxed);
            ids.extend_from_slice(&cached);
        } else {
            pieces.misses.fetch_add(1, Ordering::Relaxed);
            let start = ids.len();
            self.encode_piece(piece, ids)?;
            pieces.cache.insert(key, Arc::from(&ids[start..]));
        }
        Ok(())
    }

    /// Appends the ids of one normalized piece without added tokens: pre-tokenized, then each
    /// pre-token encoded by the model, as the tokenizers crate does within a text.
    fn encode_piece(&self, piece: &str, ids: &mut Vec<u32>) -> Result<(), tokenizers::Error> {
        let tokenizer = &self.tokenizer;
        let mut words = PreTokenizedString::from(piece);
        if let Some(pre_tokenizer) = tokenizer.get_pre_tokenizer() {
            pre_tokenizer.pre_tokenize(&mut words)?;
        }
        let model = tokenizer.get_model();
        words.tokenize(|word| model.tokenize(word.get()))?;
        let splits = words.get_splits(OffsetReferential::Original, OffsetType::None);
        ids.extend(splits.iter().flat_map(|(_, _, tokens)| tokens.iter().flatten()).map(|t| t.id));
        Ok(())
    }

    /// Whether the probe texts (each added token at the start, the end, between text and
    /// beside another, long and short pieces, with and without special tokens) encode to
    /// `encode_fast`'s ids, twice over (the second time from the cache).
    fn agrees_on_probes(&self) -> bool {
        let probes = probe_texts(&self.tokenizer);
        (0..2).all(|_| {
            probes.iter().all(|text| {
                [false, true].into_iter().all(|special| {
                    let whole = self.tokenizer.encode_fast(text.as_str(), special);
                    let pieces = self.encode(text, special);
                    matches!((whole, pieces), (Ok(whole), Ok(pieces)) if whole.get_ids() == pieces)
                })
            })
        })
    }
}

/// Whether each piece between added tokens encodes alone: no component reads the piece's
/// place in the text or draws at random, and nothing cuts or pads the whole encoding. Read
/// from the components' own serialization, which names every setting.
fn encodes_pieces_alone(tokenizer: &Tokenizer) -> bool {
    if tokenizer.get_truncation().is_some() || tokenizer.get_padding().is_some() {
        return false;
    }
    let pre_tokenizer = serde_json::to_string(&tokenizer.get_pre_tokenizer()).unwrap_or_default();
    let model = match serde_json::to_value(tokenizer.get_model()) {
        Ok(model) => model,
        Err(_) => return false,
    };
    let dropout = model.get("dropout").is_some_and(|d| !d.is_null());
    !pre_tokenizer.contains(r#""prepend_scheme":"first""#) && !dropout
}

/// The ids the post-processor puts before and after a text's when special tokens are added:
/// found around a probe text's own ids, `None` when they are not around them.
fn special_tokens_around(tokenizer: &Tokenizer) -> Option<(Vec<u32>, Vec<u32>)> {
    const PROBE: &str = "Hello world";
    let plain = tokenizer.encode_fast(PROBE, false).ok()?;
    let full = tokenizer.encode_fast(PROBE, true).ok()?;
    let (plain, full) = (plain.get_ids(), full.get_ids());
    let at = (0..=full.len().checked_sub(plain.len())?)
        .find(|&at| &full[at..at + plain.len()] == plain)?;
    Some((full[..at].to_vec(), full[at + plain.len()..].to_vec()))
}

/// Texts that exercise every way a piece meets an added token: a few of the tokenizer's added
/// tokens at the start, at the end, between words, beside each other and around whitespace,
/// and pieces short and long enough to be cached.
fn probe_texts(tokenizer: &Tokenizer) -> Vec<String> {
    let mut added: Vec<String> =
        tokenizer.get_added_tokens_decoder().into_values().map(|token| token.content).collect();
    added.sort();
    added.truncate(32);
    let long = "The quick brown fox, 12345 times: jumps over the lazy dog!\n\n  Tabs\tand  \
                spaces; unicode é 你好 🙂. "
        .repeat(8);
    let mut probes = vec![
        String::new(),
        " ".to_owned(),
        "a".to_owned(),
        "Hello, world!".to_owned(),
        "  leading and trailing  ".to_owned(),
        "line\nbreaks\r\n\n and 3.14159 numbers 2024".to_owned(),
        long.clone(),
    ];
    for token in &added {
        probes.push(token.clone());
        probes.push(format!("{token}user\n\n{long}{token}\n{token}{token} assistant "));
        probes.push(format!(" {token} {token}\n{long}"));
    }
    probes
}

#[cfg(test)]
mod tests;
