//! Local block hashing: the key that stored blocks and request tokens are matched on.
//!
//! The router cannot recompute engine hashes (vLLM hashes pickled tuples with a per-process
//! seed), so it hashes token ids itself, the same way for events and for requests:
//!
//! ```text
//! root        = salt root (see `root`)
//! hash(block) = xxh3_64(seed 0, le_u64(hash(parent block) or root) ++ le_u32(token) for each token)
//! ```
//!
//! Because every block hash covers its parent's hash, a block's hash identifies its whole
//! prefix. Only full blocks are hashed; a trailing partial block is ignored. This function is
//! part of the router's stable behaviour: changing it invalidates nothing persistent, but every
//! router and remote indexer sharing an index must agree on it.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Root of every hash chain without a salt (`"kv-route"` in ASCII).
pub const ROOT: u64 = 0x6b76_2d72_6f75_7465;

/// What besides token ids identifies a block's content: the LoRA adapter and the cache salt.
///
/// Empty strings count as absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Salt<'a> {
    /// Name of the LoRA adapter the tokens were run through.
    pub lora_name: Option<&'a str>,
    /// A per-tenant cache salt (vLLM/SGLang `cache_salt`).
    pub cache_salt: Option<&'a str>,
}

impl<'a> Salt<'a> {
    /// A salt of just a LoRA name (or nothing).
    pub fn lora(lora_name: Option<&'a str>) -> Self {
        Self { lora_name, cache_salt: None }
    }
}

/// The value the first block of a chain is hashed against, mixing in the salt.
///
/// `ROOT` without a salt; `xxh3_64(lora, seed = ROOT)` with a LoRA name; the cache salt is
/// mixed in after that as `xxh3_64(salt, seed = previous ^ 0x73616c74)`.
pub fn root(salt: Salt<'_>) -> u64 {
    let mut root = ROOT;
    if let Some(lora) = salt.lora_name.filter(|s| !s.is_empty()) {
        root = xxh3_64_with_seed(lora.as_bytes(), root);
    }
    if let Some(cache_salt) = salt.cache_salt.filter(|s| !s.is_empty()) {
        root = xxh3_64_with_seed(cache_salt.as_bytes(), root ^ 0x7361_6c74);
    }
    root
}

/// Reusable scratch space for hashing, so a chain of blocks costs no allocation per block.
#[derive(Debug, Default)]
pub struct Hasher {
    buf: Vec<u8>,
}

impl Hasher {
    /// A hasher with an empty scratch buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// The hash of one block whose parent block (or chain root) hashes to `parent`.
    pub fn chain(&mut self, parent: u64, block: &[u32]) -> u64 {
        self.buf.clear();
        self.buf.reserve(8 + 4 * block.len());
        self.buf.extend_from_slice(&parent.to_le_bytes());
        for token in block {
            self.buf.extend_from_slice(&token.to_le_bytes());
        }
        xxh3_64(&self.buf)
    }

    /// Appends the hashes of every full block of `tokens` to `out`, chained from `root`.
    pub fn extend(&mut self, root: u64, tokens: &[u32], block_size: u32, out: &mut Vec<u64>) {
        let Ok(size) = usize::try_from(block_size) else { return };
        if size == 0 {
            return;
        }
        out.reserve(tokens.len() / size);
        let mut parent = root;
        for block in tokens.chunks_exact(size) {
            parent = self.chain(parent, block);
            out.push(parent);
        }
    }
}

/// The local hash of every full block of `tokens`, with an optional LoRA name as the salt.
///
/// A `block_size` of zero yields no blocks.
pub fn block_hashes(tokens: &[u32], block_size: u32, salt: Option<&str>) -> Vec<u64> {
    salted_block_hashes(tokens, block_size, Salt::lora(salt))
}

/// The local hash of every full block of `tokens` under a LoRA name and cache salt.
pub fn salted_block_hashes(tokens: &[u32], block_size: u32, salt: Salt<'_>) -> Vec<u64> {
    let mut out = Vec::new();
    Hasher::new().extend(root(salt), tokens, block_size, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn known_values_stay_stable() {
        // Pinned so an accidental change to the documented function fails loudly.
        let hashes = block_hashes(&[1, 2, 3, 4, 5], 2, None);
        assert_eq!(hashes.len(), 2, "the partial third block is ignored");
        let mut manual = Vec::new();
        manual.extend_from_slice(&ROOT.to_le_bytes());
        manual.extend_from_slice(&1u32.to_le_bytes());
        manual.extend_from_slice(&2u32.to_le_bytes());
        assert_eq!(hashes[0], xxh3_64(&manual));
        let mut second = hashes[0].to_le_bytes().to_vec();
        second.extend_from_slice(&3u32.to_le_bytes());
        second.extend_from_slice(&4u32.to_le_bytes());
        assert_eq!(hashes[1], xxh3_64(&second));
        // Cross-checked with the Python `xxhash` package (xxh3_64_intdigest).
        assert_eq!(hashes, vec![0x608e_dcbf_9aa6_9d13, 0xfedd_5fc8_9118_db01]);
    }

    #[test]
    fn salt_changes_every_block_and_empty_salt_is_none() {
        let tokens: Vec<u32> = (0..64).collect();
        let plain = block_hashes(&tokens, 16, None);
        let lora = block_hashes(&tokens, 16, Some("adapter"));
        let salted = salted_block_hashes(
            &tokens,
            16,
            Salt { lora_name: None, cache_salt: Some("adapter") },
        );
        assert_eq!(plain.len(), 4);
        assert!(plain.iter().zip(&lora).all(|(a, b)| a != b));
        assert_ne!(lora, salted, "a LoRA name and a cache salt of the same text differ");
        assert_eq!(block_hashes(&tokens, 16, Some("")), plain);
        assert!(block_hashes(&tokens, 0, None).is_empty());
    }

    proptest! {
        #[test]
        fn a_block_hash_depends_on_its_whole_prefix(
            tokens in proptest::collection::vec(any::<u32>(), 8..64),
            flip in 0usize..8,
        ) {
            let base = block_hashes(&tokens, 4, None);
            let mut changed = tokens.clone();
            changed[flip] ^= 1;
            let other = block_hashes(&changed, 4, None);
            let first_changed = flip / 4;
            prop_assert_eq!(&base[..first_changed], &other[..first_changed]);
            for i in first_changed..base.len() {
                prop_assert_ne!(base[i], other[i]);
            }
        }

        #[test]
        fn extending_a_prefix_keeps_its_hashes(
            tokens in proptest::collection::vec(any::<u32>(), 0..80),
            extra in proptest::collection::vec(any::<u32>(), 0..40),
        ) {
            let short = block_hashes(&tokens, 8, None);
            let mut longer_tokens = tokens.clone();
            longer_tokens.extend(extra);
            let longer = block_hashes(&longer_tokens, 8, None);
            prop_assert_eq!(&longer[..short.len()], &short[..]);
        }
    }
}
