//! Fuzzes the KV-event decoder: any bytes, as a live message payload, must decode or fail
//! cleanly. Run with `cargo +nightly fuzz run decode` from `crates/router-state-kv`; seed the
//! corpus with the golden payloads in `testdata/golden.txt`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use router_state_kv::wire::{DecodeLimits, decode_batch, frames};

fuzz_target!(|data: &[u8]| {
    let limits = DecodeLimits::default();
    if let Ok(batch) = decode_batch(data, &limits) {
        // Anything that decodes stays within the limits.
        assert!(batch.events.len() <= limits.max_events);
    }
    // The same bytes split into frames exercise the framing parsers.
    let parts: Vec<bytes::Bytes> =
        data.splitn(4, |b| *b == 0xff).map(bytes::Bytes::copy_from_slice).collect();
    let _ = frames::parse_live(&parts);
    let _ = frames::parse_replay(&parts);
});
