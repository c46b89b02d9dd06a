//! Tokenizing long chat prompts with GPT-2's BPE (router-sim's, 50k merges): a fresh prompt of
//! 1k to 128k tokens encoded whole (`prepare.segment_cache_bytes: 0`) and piece by piece, and
//! the next turn of a conversation whose earlier turns were tokenized before.
//!
//! `cargo bench -p router-prepare --bench tokenize` (a few minutes).
#![expect(missing_docs, reason = "criterion_group! generates an undocumented pub fn")]

use std::cell::Cell;
use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use router_prepare::{DEFAULT_SEGMENT_CACHE_BYTES, Tokenization};
use router_test_support::prompts::message;

/// A ChatML conversation of `turns` messages of about 1k tokens each, as a template renders it.
fn conversation(seed: u64, turns: usize) -> String {
    let mut text = String::new();
    for turn in 0..turns {
        let role = if turn % 2 == 0 { "user" } else { "assistant" };
        text += &format!("<|im_start|>{role}\n{}<|im_end|>\n", message(seed, turn));
    }
    text + "<|im_start|>assistant\n"
}

fn tokenization(cache_bytes: u64) -> Tokenization {
    let tokenizer = router_sim::assets::gpt2::tokenizer_path();
    Tokenization::load(&tokenizer, None)
        .expect("GPT-2's tokenizer")
        .with_segment_cache_bytes(cache_bytes)
}

fn tokenize(c: &mut Criterion) {
    let whole = tokenization(0);
    let pieces = tokenization(DEFAULT_SEGMENT_CACHE_BYTES);
    let seed = Cell::new(0_u64);
    let next_seed = || {
        seed.set(seed.get() + 1);
        seed.get()
    };
    let mut group = c.benchmark_group("tokenize");
    group.sample_size(10).warm_up_time(Duration::from_secs(1));
    for turns in [1, 8, 32, 128] {
        group.measurement_time(Duration::from_secs(2 + turns as u64 / 8));
        let fresh = || conversation(next_seed(), turns);
        group.bench_function(format!("fresh_{turns}k/whole"), |b| {
            b.iter_batched(
                fresh,
                |text| black_box(whole.encode_text(&text, false)),
                BatchSize::LargeInput,
            )
        });
        group.bench_function(format!("fresh_{turns}k/pieces"), |b| {
            b.iter_batched(
                fresh,
                |text| black_box(pieces.encode_text(&text, false)),
                BatchSize::LargeInput,
            )
        });
        // The next turn: the conversation one message shorter was tokenized before.
        let next_turn = || {
            let seed = next_seed();
            let before = conversation(seed, turns.saturating_sub(1).max(1));
            pieces.encode_text(&before, false).expect("encoded");
            conversation(seed, turns.max(2))
        };
        group.bench_function(format!("next_turn_{turns}k/pieces"), |b| {
            b.iter_batched(
                next_turn,
                |text| black_box(pieces.encode_text(&text, false)),
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, tokenize);
criterion_main!(benches);
