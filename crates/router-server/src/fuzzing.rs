//! The narrow entry the fuzz targets in `fuzz/` use to reach request preparation and the
//! engine connections' HTTP/1.1 decoding, which are otherwise crate-private: parse and
//! validate a client body for one endpoint, read the data-parallel rank header, and prepare it
//! (estimate, or template and tokenize with a model's tokenizer); check that a body's two
//! readings agree; decode an engine's answer as its connection reads it; read a client's
//! request head as the router's own HTTP/1.1 loop reads it. Hidden from the
//! documentation and not an API: it exposes plain values only, so the crate's own types stay
//! private.

use std::path::Path;

use bytes::Bytes;

use crate::prepare::{self, Endpoint, Prompt, Tokenization};

/// The endpoints a body can be prepared for, in the order of `Endpoint::ALL` (chat, completions,
/// `/generate`, then the passed-through ones).
pub const ENDPOINTS: usize = Endpoint::ALL.len();

/// A model's tokenizer and chat template, loaded once.
#[derive(Debug)]
pub struct Tokenizer(Tokenization);

impl Tokenizer {
    /// Loads `tokenizer.json` and the chat template of the `tokenizer_config.json` beside it.
    pub fn load(tokenizer: &Path) -> Result<Self, String> {
        Tokenization::load(tokenizer, None).map(Self).map_err(|err| format!("{err:#}"))
    }
}

/// What preparation made of a body, as plain values.
#[derive(Debug)]
pub struct Prepared {
    /// The validated `model`.
    pub model: Option<String>,
    /// The body to forward.
    pub body: Bytes,
    /// Prompt tokens, exact when tokenized or given as ids.
    pub input_tokens: u64,
    /// Input plus requested output, when the output is bounded.
    pub expected_peak_tokens: Option<u64>,
    /// The output bound of each sequence.
    pub max_output_tokens: Option<u64>,
    /// Sequences generated.
    pub sequences: u64,
    /// The first prompt's token ids, when known.
    pub tokens: Option<Vec<u32>>,
    /// The token-id prompts the client gave, when it gave ids.
    pub client_ids: Option<Vec<Vec<u32>>>,
    /// Session and routing keys.
    pub keys: (Option<String>, Option<String>),
    /// The data-parallel rank the client asked for.
    pub client_rank: Option<u32>,
}

/// Prepares `body` for the endpoint `ALL[endpoint % ENDPOINTS]` as the HTTP front does, with
/// `rank_header` as the `x-data-parallel-rank` header when given; the error is the
/// client-facing message.
pub fn prepare(
    endpoint: usize,
    body: &[u8],
    max_batch: usize,
    tokenizer: Option<&Tokenizer>,
    keys: (Option<&str>, Option<&str>),
    rank_header: Option<&[u8]>,
) -> Result<Prepared, String> {
    let endpoint = Endpoint::ALL[endpoint % ENDPOINTS];
    let request = prepare::parse_request(endpoint, body, max_batch).map_err(|err| err.message)?;
    let header = match rank_header.map(http::HeaderValue::from_bytes) {
        Some(Ok(value)) => Some(value),
        Some(Err(_)) => return Err("not a header value".to_owned()),
        None => None,
    };
    let client_rank =
        prepare::client_rank(request.client_rank, header.as_ref()).map_err(|err| err.message)?;
    let client_ids = match &request.prompt {
        Prompt::Ids(ids) => Some(ids.clone()),
        Prompt::Messages | Prompt::Texts(_) | Prompt::Opaque => None,
    };
    let (model, max_output_tokens, sequences) =
        (request.model.clone(), request.max_output_tokens, request.sequences);
    let prepared = prepare::prepare(
        Bytes::copy_from_slice(body),
        request,
        tokenizer.map(|t| &t.0),
        keys.0,
        keys.1,
    )
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

/// An engine's HTTP/1.1 answer decoded from `bytes` arriving `piece` bytes at a time, as an
/// engine connection reads it: the status and the body, or why the answer was refused.
pub fn engine_answer(bytes: &[u8], piece: usize) -> Result<(u16, Vec<u8>), String> {
    crate::forward::decode_answer(bytes, piece)
        .map(|(status, body)| (status.as_u16(), body))
        .map_err(|err| err.to_string())
}

/// The request the router's own HTTP/1.1 loop serves itself from the start of a client
/// connection that sent `bytes` (heads of at most `max_bytes`): its endpoint's path and its
/// Content-Length; `None` when the loop leaves the connection to hyper or the head is not
/// whole. Whatever it serves, hyper must read as the same request.
pub fn client_head(bytes: &[u8], max_bytes: usize) -> Option<(String, u64)> {
    crate::server::served_here(bytes, max_bytes)
}

/// Whether the scan of a request body's common shape, when it reads `body`, reads the same
/// fields as serde_json.
pub fn body_scan_agrees(body: &[u8]) -> bool {
    crate::prepare::body_scan_agrees(body)
}
