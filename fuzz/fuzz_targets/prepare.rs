//! Fuzz target `prepare`: request preparation, from a client's body to a prepared request.
//!
//! The first byte chooses the endpoint (low three bits: chat, completions, `/generate`, then
//! the passed-through ones), whether the model has a tokenizer (bit 3: router-sim's small
//! tokenizer and chat template, so templating and tokenizing run too), and whether a session
//! key and an `x-data-parallel-rank` header come with it (bits 4 and 5: the header's text
//! follows up to the first newline); the rest is the body. Beyond "never panics": the scan of
//! a body's common shape reads what serde_json reads, the prepared model is the body's
//! `model`, the forwarded body is the client's bytes unless a router-owned field had to be
//! removed (and then it is the same JSON without it), token counts agree with the ids, and the
//! peak is at least the input.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use router_server::fuzzing::{self, Tokenizer};
use serde_json::Value;

/// Fields only the router may set (router-server's `ROUTER_OWNED_FIELDS`).
const ROUTER_OWNED: [&str; 3] = ["bootstrap_host", "bootstrap_port", "bootstrap_room"];
/// The batch limit of the default configuration.
const MAX_BATCH: usize = 16;

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../crates/router-sim/assets/tokenizer.json");
        match Tokenizer::load(&path) {
            Ok(tokenizer) => tokenizer,
            Err(err) => panic!("loading {}: {err}", path.display()),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, mut body)) = data.split_first() else { return };
    let endpoint = usize::from(flags & 0b111);
    let tokenizer = (flags & 0b1000 != 0).then(tokenizer);
    let session = (flags & 0b1_0000 != 0).then_some("session-1");
    let rank_header = if flags & 0b10_0000 != 0 {
        let end = body.iter().position(|b| *b == b'\n').unwrap_or(body.len());
        let header = &body[..end];
        body = body.get(end + 1..).unwrap_or_default();
        Some(header)
    } else {
        None
    };
    assert!(fuzzing::body_scan_agrees(body), "the body scan and serde_json read it differently");
    let Ok(prepared) =
        fuzzing::prepare(endpoint, body, MAX_BATCH, tokenizer, (session, None), rank_header)
    else {
        return;
    };
    let Ok(Value::Object(parsed)) = serde_json::from_slice::<Value>(body) else {
        panic!("a body that is not a JSON object was prepared");
    };
    // The model routed by is the one the client named.
    match parsed.get("model") {
        Some(Value::String(model)) => assert_eq!(prepared.model.as_deref(), Some(model.as_str())),
        _ => assert_eq!(prepared.model, None, "a model the body does not name"),
    }
    // The forwarded body: the client's bytes, or the same JSON without router-owned fields.
    if ROUTER_OWNED.iter().any(|f| parsed.contains_key(*f)) {
        let Ok(Value::Object(forwarded)) = serde_json::from_slice::<Value>(&prepared.body) else {
            panic!("the cleaned body is not a JSON object");
        };
        let mut expected = parsed.clone();
        for field in ROUTER_OWNED {
            expected.remove(field);
        }
        assert_eq!(forwarded, expected, "cleaning changed more than the router-owned fields");
    } else {
        assert_eq!(&prepared.body[..], body, "an untouched body was not forwarded as sent");
    }
    // Token counts.
    if let Some(ids) = &prepared.client_ids {
        let total: u64 = ids.iter().map(|ids| ids.len() as u64).sum();
        assert_eq!(prepared.input_tokens, total, "the client's ids are counted exactly");
        assert_eq!(prepared.tokens.as_ref(), ids.first(), "lookups use the first prompt");
    }
    if let Some(tokens) = &prepared.tokens {
        assert!(tokens.len() as u64 <= prepared.input_tokens, "first prompt longer than all");
    }
    match (prepared.max_output_tokens, prepared.expected_peak_tokens) {
        (Some(output), Some(peak)) => {
            assert_eq!(
                Some(peak),
                output
                    .checked_mul(prepared.sequences)
                    .and_then(|o| o.checked_add(prepared.input_tokens))
            );
        }
        (None, None) => {}
        (output, peak) => panic!("output bound {output:?} but peak {peak:?}"),
    }
    assert!(prepared.sequences >= 1, "no sequence to generate");
    assert_eq!(prepared.keys.0.as_deref(), session, "the session key is the header's");
    assert_eq!(prepared.keys.1, None);
    if let (Some(rank), Some(Value::Number(body_rank))) =
        (prepared.client_rank, parsed.get("data_parallel_rank"))
    {
        assert_eq!(body_rank.as_u64(), Some(u64::from(rank)), "the body's rank was changed");
    }
});
