//! Fuzz target `prepare`: request preparation, from a client's body to a prepared request.
//!
//! The first byte chooses the endpoint (low three bits: chat, completions, `/generate`, then
//! the passed-through ones), whether the model has a tokenizer (bit 3: router-sim's small
//! tokenizer and chat template, so templating and tokenizing run too), and whether a session
//! key and an `x-data-parallel-rank` header come with it (bits 4 and 5: the header's text
//! follows up to the first newline); the rest is the body. Beyond "never panics": the prepared
//! model is the body's
//! `model`, the forwarded body is the client's bytes unless a router-owned field had to be
//! removed (and then it is the same JSON without it), token counts agree with the ids, and the
//! peak is at least the input.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use router_prepare::{Endpoint, Prompt, ROUTER_OWNED_FIELDS as ROUTER_OWNED, Tokenization};
use serde_json::Value;

/// The batch limit of the default configuration.
const MAX_BATCH: usize = 16;

fn tokenizer() -> &'static Tokenization {
    static TOKENIZER: OnceLock<Tokenization> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../crates/router-sim/assets/tokenizer.json");
        match Tokenization::load(&path, None) {
            Ok(tokenizer) => tokenizer,
            Err(err) => panic!("loading {}: {err}", path.display()),
        }
    })
}

/// What preparation made of a body, with what validation read of it.
struct Prepared {
    model: Option<String>,
    body: Bytes,
    input_tokens: u64,
    expected_peak_tokens: Option<u64>,
    max_output_tokens: Option<u64>,
    sequences: u64,
    tokens: Option<Vec<u32>>,
    client_ids: Option<Vec<Vec<u32>>>,
    keys: (Option<String>, Option<String>),
    client_rank: Option<u32>,
}

/// Prepares `body` for `endpoint` as the HTTP front does, `rank_header` as the
/// `x-data-parallel-rank` header; the error is the client-facing message.
fn prepare(
    endpoint: Endpoint,
    body: &[u8],
    tokenizer: Option<&Tokenization>,
    session: Option<&str>,
    rank_header: Option<&[u8]>,
) -> Result<Prepared, String> {
    let request =
        router_prepare::parse_request(endpoint, body, MAX_BATCH).map_err(|err| err.message)?;
    let header = match rank_header.map(http::HeaderValue::from_bytes) {
        Some(Ok(value)) => Some(value),
        Some(Err(_)) => return Err("not a header value".to_owned()),
        None => None,
    };
    let client_rank = router_prepare::client_rank(request.client_rank, header.as_ref())
        .map_err(|err| err.message)?;
    let client_ids = match &request.prompt {
        Prompt::Ids(ids) => Some(ids.clone()),
        Prompt::Messages | Prompt::Texts(_) | Prompt::Opaque => None,
    };
    let (model, max_output_tokens, sequences) =
        (request.model.clone(), request.max_output_tokens, request.sequences);
    let prepared =
        router_prepare::prepare(Bytes::copy_from_slice(body), request, tokenizer, session, None)
            .map_err(|err| err.to_string())?;
    Ok(Prepared {
        model,
        body: prepared.body,
        input_tokens: prepared.input_tokens,
        expected_peak_tokens: prepared.expected_peak_tokens,
        max_output_tokens,
        sequences,
        tokens: prepared.tokens.map(|t| t.ids().to_vec()),
        client_ids,
        keys: (prepared.session_key, prepared.routing_key),
        client_rank: client_rank.map(|r| r.rank),
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, mut body)) = data.split_first() else { return };
    let endpoint = Endpoint::ALL[usize::from(flags & 0b111) % Endpoint::ALL.len()];
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
    let Ok(prepared) = prepare(endpoint, body, tokenizer, session, rank_header) else { return };
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
