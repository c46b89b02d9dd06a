//! Bytes looked for a word (8 bytes) at a time, for the JSON scans of a request body
//! (`fields/scan.rs`) and of an answer's counts (`usage/scan.rs`): each byte of a
//! word that matches is marked at once, and the lowest mark is the first match.

const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);

/// Marks the bytes of `word` below `n` (`n` at most 0x80). A byte of `word` is below `n`
/// where `word - n` borrows into its high bit and `word` had none; a borrow can only mark
/// bytes above a marked one, so the lowest mark is exact.
pub(crate) fn below(word: u64, n: u8) -> u64 {
    word.wrapping_sub(ONES * u64::from(n)) & !word & HIGHS
}

/// Marks the bytes of `word` equal to `byte`, an ASCII byte (the lowest mark exact, as
/// [`below`]'s).
pub(crate) fn equal(word: u64, byte: u8) -> u64 {
    below(word ^ (ONES * u64::from(byte)), 1)
}

/// Where in `text` the first byte is that `marks` flags, looking at it a word at a time
/// (little-endian: the lowest byte first). The last few bytes are padded to a word with 0xFF,
/// which [`below`] never marks, nor [`equal`] for an ASCII byte.
pub(crate) fn first(text: &[u8], marks: impl Fn(u64) -> u64) -> Option<usize> {
    let mut words = text.chunks_exact(8);
    for (i, word) in words.by_ref().enumerate() {
        let marked = marks(u64::from_le_bytes(word.try_into().unwrap_or_default()));
        if marked != 0 {
            return Some(i * 8 + marked.trailing_zeros() as usize / 8);
        }
    }
    let rest = words.remainder();
    let mut last = [0xFF; 8];
    last[..rest.len()].copy_from_slice(rest);
    let marked = marks(u64::from_le_bytes(last));
    (marked != 0).then(|| text.len() - rest.len() + marked.trailing_zeros() as usize / 8)
}
