//! Local block hashing: the key that stored blocks and request tokens are matched on.
//!
//! The router cannot recompute engine hashes (vLLM hashes pickled tuples with a per-process
//! seed), so it hashes token ids itself, the same way for events and for requests:
//!
//! ```text
//! root        = salt root (see `root`)
//! hash(block) = xxh3_64_with_seed(le_u32(token) for each token of the block,
//!                                 seed = hash(parent block), or root for the first block)
//! ```
//!
//! Because every block hash is seeded with its parent's hash, a block's hash identifies its whole
//! prefix. Only full blocks are hashed; a trailing partial block is ignored. This function is
//! part of the router's stable behaviour: changing it invalidates nothing persistent, but every
//! router and remote indexer sharing an index must agree on it.

use xxhash_rust::xxh3::xxh3_64_with_seed;

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

/// The first 128 bytes of XXH3's default secret, as little-endian words.
const SECRET: [u64; 16] = [
    0xbe4b_a423_396c_feb8,
    0x1cad_21f7_2c81_017c,
    0xdb97_9083_e96d_d4de,
    0x1f67_b3b7_a4a4_4072,
    0x78e5_c0cc_4ee6_79cb,
    0x2172_ffcc_7dd0_5a82,
    0x8e24_43f7_7446_08b8,
    0x4c26_3a81_e690_35e0,
    0xcb00_c391_bb52_283c,
    0xa32e_531b_8b65_d088,
    0x4ef9_0da2_9748_6471,
    0xd8ac_dea9_46ef_1938,
    0x3f34_9ce3_3f76_faa8,
    0x1d4f_0bc7_c7bb_dcf9,
    0x3159_b4cd_4be0_518a,
    0x6473_78d9_c97e_9fc8,
];

const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;

/// The little-endian u64 at byte `offset` (a multiple of 4) of the tokens' bytes.
fn word(tokens: &[u32], offset: usize) -> u64 {
    let i = offset / 4;
    u64::from(tokens[i]) | (u64::from(tokens[i + 1]) << 32)
}

fn mix16(tokens: &[u32], offset: usize, secret: usize, seed: u64) -> u64 {
    let lo = word(tokens, offset) ^ SECRET[secret].wrapping_add(seed);
    let hi = word(tokens, offset + 8) ^ SECRET[secret + 1].wrapping_sub(seed);
    let product = u128::from(lo) * u128::from(hi);
    (product as u64) ^ ((product >> 64) as u64)
}

/// `xxh3_64_with_seed` of the little-endian bytes of 5 to 32 tokens (17 to 128 bytes),
/// computed from the tokens in place instead of from a copy. It is XXH3's 17-128 byte path
/// word for word; a test checks it against the library for every length.
fn xxh3_17_to_128(tokens: &[u32], seed: u64) -> u64 {
    let len = tokens.len() * 4;
    let mut acc = (len as u64).wrapping_mul(PRIME64_1);
    if len > 32 {
        if len > 64 {
            if len > 96 {
                acc = acc.wrapping_add(mix16(tokens, 48, 12, seed));
                acc = acc.wrapping_add(mix16(tokens, len - 64, 14, seed));
            }
            acc = acc.wrapping_add(mix16(tokens, 32, 8, seed));
            acc = acc.wrapping_add(mix16(tokens, len - 48, 10, seed));
        }
        acc = acc.wrapping_add(mix16(tokens, 16, 4, seed));
        acc = acc.wrapping_add(mix16(tokens, len - 32, 6, seed));
    }
    acc = acc.wrapping_add(mix16(tokens, 0, 0, seed));
    acc = acc.wrapping_add(mix16(tokens, len - 16, 2, seed));
    acc ^= acc >> 37;
    acc = acc.wrapping_mul(0x1656_6791_9E37_79F9);
    acc ^ (acc >> 32)
}

/// Blocks of up to this many tokens are hashed from a buffer inside the [`Hasher`].
const INLINE_TOKENS: usize = 64;

/// Reusable scratch space for hashing, so a chain of blocks costs no allocation per block.
#[derive(Debug)]
pub struct Hasher {
    inline: [u8; 4 * INLINE_TOKENS],
    buf: Vec<u8>,
}

impl Default for Hasher {
    fn default() -> Self {
        Self { inline: [0; 4 * INLINE_TOKENS], buf: Vec::new() }
    }
}

fn fill(buf: &mut [u8], block: &[u32]) {
    for (dst, token) in buf.chunks_exact_mut(4).zip(block) {
        dst.copy_from_slice(&token.to_le_bytes());
    }
}

impl Hasher {
    /// A hasher with an empty scratch buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// The hash of one block whose parent block (or chain root) hashes to `parent`.
    pub fn chain(&mut self, parent: u64, block: &[u32]) -> u64 {
        if (5..=32).contains(&block.len()) {
            return xxh3_17_to_128(block, parent);
        }
        let len = 4 * block.len();
        if block.len() <= INLINE_TOKENS {
            let buf = &mut self.inline[..len];
            fill(buf, block);
            xxh3_64_with_seed(buf, parent)
        } else {
            self.buf.resize(len, 0);
            fill(&mut self.buf, block);
            xxh3_64_with_seed(&self.buf, parent)
        }
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
        let first = [1u32.to_le_bytes(), 2u32.to_le_bytes()].concat();
        assert_eq!(hashes[0], xxh3_64_with_seed(&first, ROOT));
        let second = [3u32.to_le_bytes(), 4u32.to_le_bytes()].concat();
        assert_eq!(hashes[1], xxh3_64_with_seed(&second, hashes[0]));
        // Cross-checked with the Python `xxhash` package (xxh3_64_intdigest).
        assert_eq!(hashes, vec![0x8199_8696_5e3d_f7cd, 0xf092_458b_9302_6655]);
    }

    #[test]
    fn long_blocks_hash_like_short_ones() {
        let tokens: Vec<u32> = (0..300).collect();
        let hashes = block_hashes(&tokens, 100, None);
        let manual: Vec<u8> = tokens[..100].iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(hashes[0], xxh3_64_with_seed(&manual, ROOT));
        let mut hasher = Hasher::new();
        assert_eq!(hasher.chain(7, &tokens[..64]), hasher.chain(7, &tokens[..64]));
        assert_ne!(hasher.chain(7, &tokens[..65]), hasher.chain(7, &tokens[..64]));
    }

    #[test]
    fn salt_changes_every_block_and_empty_salt_is_none() {
        let tokens: Vec<u32> = (0..64).collect();
        let plain = block_hashes(&tokens, 16, None);
        let lora = block_hashes(&tokens, 16, Some("adapter"));
        let salted =
            salted_block_hashes(&tokens, 16, Salt { lora_name: None, cache_salt: Some("adapter") });
        assert_eq!(plain.len(), 4);
        assert!(plain.iter().zip(&lora).all(|(a, b)| a != b));
        assert_ne!(lora, salted, "a LoRA name and a cache salt of the same text differ");
        assert_eq!(block_hashes(&tokens, 16, Some("")), plain);
        assert!(block_hashes(&tokens, 0, None).is_empty());
    }

    proptest! {
        #[test]
        fn the_in_place_path_matches_the_xxh3_library(
            tokens in proptest::collection::vec(any::<u32>(), 1..80),
            seed in any::<u64>(),
        ) {
            let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
            prop_assert_eq!(Hasher::new().chain(seed, &tokens), xxh3_64_with_seed(&bytes, seed));
        }

        #[test]
        fn a_block_hash_depends_on_its_whole_prefix(
            tokens in proptest::collection::vec(any::<u32>(), 8..64),
            flip in 0usize..8,
        ) {
            let base = block_hashes(&tokens, 4, None);
            let mut changed = tokens;
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
            let mut longer_tokens = tokens;
            longer_tokens.extend(extra);
            let longer = block_hashes(&longer_tokens, 8, None);
            prop_assert_eq!(&longer[..short.len()], &short[..]);
        }
    }
}
