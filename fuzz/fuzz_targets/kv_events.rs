//! Fuzz target `kv_events`: the KV-event decoder and the prefix index behind it.
//!
//! The input is one live message payload (a msgpack `EventBatch`, as SGLang and vLLM publish
//! over ZeroMQ). It must decode or fail with an error, never panic or allocate past
//! [`DecodeLimits`]; what decodes is applied to a small prefix index (small enough that
//! eviction runs), which must keep its node bound and its bookkeeping consistent. The same
//! bytes split at `0xff` also feed the ZeroMQ frame parsers. Seeds: the engines' golden
//! payloads (`crates/router-state-kv/testdata/golden.txt`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use router_state_kv::hash::Salt;
use router_state_kv::wire::{DecodeLimits, Event, decode_batch, frames};
use router_state_kv::{IndexConfig, KvIndex};
use router_workers::{ModelId, WorkerId};

/// Nodes the index may hold: small, so that long batches evict.
const MAX_NODES: usize = 64;
/// Limits tighter than the defaults, so that the bounds themselves are reached by the fuzzer.
fn limits() -> DecodeLimits {
    DecodeLimits {
        max_payload_bytes: 1 << 16,
        max_events: 64,
        max_blocks_per_event: 64,
        max_tokens_per_event: 1024,
        max_string_bytes: 64,
        max_depth: 16,
    }
}

fuzz_target!(|data: &[u8]| {
    let limits = limits();
    if let Ok(batch) = decode_batch(data, &limits) {
        assert!(data.len() <= limits.max_payload_bytes, "an oversized payload decoded");
        assert!(batch.events.len() <= limits.max_events, "more events than the limit");
        for event in &batch.events {
            match event {
                Event::Stored(stored) => {
                    assert!(stored.block_hashes.len() <= limits.max_blocks_per_event);
                    assert!(stored.token_ids.len() <= limits.max_tokens_per_event);
                    for text in [&stored.lora_name, &stored.ownership, &stored.session_id]
                        .into_iter()
                        .chain([&stored.cache_salt])
                        .flatten()
                    {
                        assert!(text.len() <= limits.max_string_bytes, "string past the limit");
                    }
                }
                Event::Removed(removed) => {
                    assert!(removed.block_hashes.len() <= limits.max_blocks_per_event);
                }
                Event::AllCleared | Event::Unknown | Event::Invalid { .. } => {}
            }
        }
        apply(&batch.events);
    }
    // The same bytes split into frames exercise the framing parsers.
    let parts: Vec<bytes::Bytes> =
        data.splitn(5, |b| *b == 0xff).map(bytes::Bytes::copy_from_slice).collect();
    if let Ok(frame) = frames::parse_live(&parts) {
        assert_eq!(parts.len(), 3, "a live message is exactly three frames");
        assert_eq!(frame.payload, parts[2]);
    }
    if let Ok(frames::ReplayReply::Batch(frame)) = frames::parse_replay(&parts) {
        assert!(parts[0].is_empty(), "a replay reply starts with the empty delimiter");
        assert_ne!(frame.seq, frames::END_OF_REPLAY, "the end marker is not a batch");
    }
});

/// Applies decoded events to a fresh index as one worker-rank and checks what it reports.
fn apply(events: &[Event]) {
    let model = ModelId::new("m");
    let worker = WorkerId::new("w").expect("a non-empty id");
    let index = KvIndex::new(IndexConfig::new(MAX_NODES, 1));
    let Ok(holder) = index.holder(&model, &worker, 1, 0, 2) else {
        panic!("the first holder of an empty index is refused");
    };
    let report = holder.apply(events);
    assert!(report.events <= events.len() as u64, "more events applied than given");
    let stats = index.stats();
    assert!(stats.nodes <= MAX_NODES as u64, "{} nodes past the bound {MAX_NODES}", stats.nodes);
    assert!(holder.blocks() <= stats.nodes, "the holder holds more blocks than the tree has");
    if matches!(events.last(), Some(Event::AllCleared)) && report.clears > 0 {
        assert_eq!(holder.blocks(), 0, "blocks left after a trailing AllBlocksCleared");
    }
    // A lookup of any stored tokens matches at most what the holder holds.
    for event in events {
        if let Event::Stored(stored) = event {
            let salt = Salt {
                lora_name: stored.lora_name.as_deref(),
                cache_salt: stored.cache_salt.as_deref(),
            };
            let found = index.lookup_tokens(&model, &stored.token_ids, 2, salt);
            let matched = found.blocks(&worker);
            assert!(u64::from(matched) <= holder.blocks(), "a lookup matched unheld blocks");
        }
    }
}
