//! Prompt text of a known size for the long-prompt benchmarks (router-prepare's `tokenize`,
//! xtask's `--only long`): messages of words, about a thousand GPT-2 tokens each, different for
//! each conversation and turn, so that nothing is cached between them by accident.

/// About a thousand GPT-2 tokens of words: message `turn` of conversation `seed`.
pub fn message(seed: u64, turn: usize) -> String {
    const WORDS: [&str; 16] = [
        "router", "engine", "cache", "prefill", "token", "latency", "batch", "queue", "the", "of",
        "and", "model", "request", "block", "fleet", "decode",
    ];
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (turn as u64 + 1);
    let mut text = format!("Turn {turn} of conversation {seed}: ");
    for _ in 0..760 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text += WORDS[(state % 16) as usize];
        text.push(if state.is_multiple_of(11) { '.' } else { ' ' });
    }
    text
}
