//! Request preparation, once per request, for every inference endpoint, and the token counts
//! of answers: parse and validate a body (read in bounded memory: `fields`), render the chat
//! template (chat) or take the prompt as text or token ids (completions, `/generate`),
//! tokenize (or estimate), compute the expected peak, and read the affinity keys and the
//! data-parallel rank a client asked for; read the `usage` an engine reports ([`usage`]).
//! Token ids a client sends are used for routing as they are, tokenizer or not.
//!
//! Pure: bytes and a model's tokenizer in, values out; no I/O, no HTTP server, no metrics. The
//! HTTP doors and the endpoint picker of router-server use it alike, and the fuzz targets
//! reach it directly.

mod edit;
mod encode;
mod fields;
pub mod usage;
mod validate;
mod words;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use encode::Encoder;
use router_buckets::{BucketRequest, SloTargets};
use router_policies::RequestTokens;
use router_workers::{DpRoute, EngineKind, ModelId, WorkerId};
use serde_json::Value;

pub use edit::edit_members;
pub use encode::{DEFAULT_SEGMENT_CACHE_BYTES, SegmentCacheStats, WholeReason};
pub use fields::members as body_members;
pub use router_chat_template::{ChatTemplate, EngineRules, TemplateError, Unrenderable};
pub use validate::{Endpoint, InferenceRequest, InvalidRequest, Prompt, parse_request};

/// Fields that only the router may set; a client's values are removed before forwarding.
pub const ROUTER_OWNED_FIELDS: [&str; 3] = ["bootstrap_host", "bootstrap_port", "bootstrap_room"];

/// A model's tokenizer and chat template, loaded once at startup, and whose rules turn a chat
/// request into the template's input (the engines' differ: `router_chat_template`'s request
/// module). Prompt text longer than `max_bytes` is not tokenized: the tokenizers crate holds
/// tens of bytes per byte of text while it encodes, and no context window takes such a prompt.
pub struct Tokenization {
    /// The tokenizer, encoding piece by piece with a cache where that is exact.
    encoder: Encoder,
    template: ChatTemplate,
    /// The model's configured engine, for its workers that name none.
    engine: Option<EngineKind>,
    /// Whether chat requests render by SGLang's rules (else vLLM's): the engine the model's
    /// workers run ([`Tokenization::follow_engines`]).
    sglang_rules: AtomicBool,
    max_bytes: usize,
}

/// Why a prompt has no exact token ids: it cannot be rendered exactly, or it is longer than
/// the router tokenizes.
#[derive(Debug)]
pub enum Inexact {
    /// The chat template cannot render it exactly.
    Unrenderable(Unrenderable),
    /// Its text is longer than `server.max_tokenized_prompt_bytes`, or its messages hold more
    /// values than the router builds for a body of its size.
    TooLong,
}

impl Inexact {
    /// The reason as a `router_prefix_unmatchable_total` label: `non_text_part`,
    /// `template_error` or `too_long`.
    pub fn reason(&self) -> &'static str {
        match self {
            Inexact::Unrenderable(unrenderable) => unrenderable.reason(),
            Inexact::TooLong => "too_long",
        }
    }
}

impl std::fmt::Debug for Tokenization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenization").finish_non_exhaustive()
    }
}

/// Why a tokenizer could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// The tokenizer file could not be loaded.
    #[error("loading tokenizer {path}")]
    Load {
        /// The file.
        path: String,
        /// The tokenizers crate's error.
        #[source]
        source: tokenizers::Error,
    },
    /// The chat template could not be loaded or rendered.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// Encoding failed.
    #[error("tokenizing the rendered prompt")]
    Encode(#[source] tokenizers::Error),
}

impl Tokenization {
    /// Loads `tokenizer.json` and the chat template: `chat_template` when given, else the one
    /// in the `tokenizer_config.json` beside the tokenizer.
    pub fn load(tokenizer: &Path, chat_template: Option<&Path>) -> Result<Self, TokenizeError> {
        let loaded = tokenizers::Tokenizer::from_file(tokenizer).map_err(|source| {
            TokenizeError::Load { path: tokenizer.display().to_string(), source }
        })?;
        let config = tokenizer.with_file_name("tokenizer_config.json");
        let template = match chat_template {
            Some(path) => ChatTemplate::from_file(path, config.exists().then_some(&*config))?,
            None => ChatTemplate::from_tokenizer_config(&config)?,
        };
        Ok(Self {
            encoder: Encoder::new(loaded, DEFAULT_SEGMENT_CACHE_BYTES),
            template,
            engine: None,
            sglang_rules: AtomicBool::new(false),
            max_bytes: 4 << 20,
        })
    }

    /// The same, for a model whose workers run `engine` unless they say otherwise; rendering
    /// chat requests by its rules until [`Tokenization::follow_engines`] learns better.
    pub fn with_engine(self, engine: Option<EngineKind>) -> Self {
        let sglang = AtomicBool::new(engine == Some(EngineKind::Sglang));
        Self { engine, sglang_rules: sglang, ..self }
    }

    /// The rules chat requests are rendered by now.
    pub fn rules(&self) -> EngineRules {
        if self.sglang_rules.load(Ordering::Relaxed) {
            EngineRules::Sglang
        } else {
            EngineRules::Vllm
        }
    }

    /// The model's configured engine.
    pub fn engine(&self) -> Option<EngineKind> {
        self.engine
    }

    /// Renders by the engine the model's workers run, given each worker's (`None` when
    /// unknown), as [`engine_to_follow`] chooses (vLLM's rules when it names
    /// none). The rules it now renders by, and whether the known engines disagree.
    pub fn follow_engines(
        &self,
        engines: impl IntoIterator<Item = Option<EngineKind>>,
    ) -> (EngineRules, bool) {
        let (engine, mixed) = engine_to_follow(self.engine, engines);
        self.sglang_rules.store(engine == Some(EngineKind::Sglang), Ordering::Relaxed);
        (self.rules(), mixed)
    }

    /// The same, keeping the token ids of prompt pieces in at most `bytes` of memory
    /// (`prepare.segment_cache_bytes`; 0: every prompt encoded whole).
    pub fn with_segment_cache_bytes(self, bytes: u64) -> Self {
        Self { encoder: self.encoder.with_cache_bytes(bytes), ..self }
    }

    /// Why prompts are encoded whole rather than piece by piece from the segment cache, or
    /// `None` when they are not.
    pub fn whole_reason(&self) -> Option<WholeReason> {
        self.encoder.whole_reason()
    }

    /// The segment cache's contents and lookups, when prompts are encoded piece by piece.
    pub fn segment_cache_stats(&self) -> Option<SegmentCacheStats> {
        self.encoder.cache_stats()
    }

    /// The same, tokenizing prompt text of at most `max_bytes` bytes.
    pub fn with_max_tokenized_bytes(self, max_bytes: usize) -> Self {
        Self { max_bytes, ..self }
    }

    /// Renders and tokenizes the messages of `body`, a chat request [`parse_request`]
    /// accepted, as the model's engines do; `Ok(Err(_))` when no exact rendering exists or
    /// its text is too long. Messages whose text alone is too long, or whose values would
    /// take more than the node budget of the body's size (`fields`), are not rendered.
    pub fn encode_messages(
        &self,
        body: &[u8],
        messages_text: usize,
    ) -> Result<Result<Vec<u32>, Inexact>, PrepareError> {
        if messages_text > self.max_bytes {
            return Ok(Err(Inexact::TooLong));
        }
        let fields = fields::members(body, &router_chat_template::REQUEST_FIELDS);
        let Some(body) = fields.map_err(InvalidRequest::not_json)? else {
            return Ok(Err(Inexact::TooLong));
        };
        let rendered = match self.template.render_request(&body, self.rules()) {
            Ok(rendered) => rendered,
            Err(unrenderable) => return Ok(Err(Inexact::Unrenderable(unrenderable))),
        };
        drop(body);
        if rendered.text.len() > self.max_bytes {
            return Ok(Err(Inexact::TooLong));
        }
        let ids = self
            .encoder
            .encode(&rendered.text, rendered.add_special_tokens)
            .map_err(TokenizeError::Encode)?;
        Ok(Ok(ids))
    }

    /// Tokenizes a raw text prompt as the engines do for completions and `/generate` text:
    /// with the tokenizer's special tokens unless the request says `add_special_tokens: false`;
    /// `Ok(None)` when it is too long to tokenize.
    pub fn encode_text(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Option<Vec<u32>>, TokenizeError> {
        if text.len() > self.max_bytes {
            return Ok(None);
        }
        let ids = self.encoder.encode(text, add_special_tokens).map_err(TokenizeError::Encode)?;
        Ok(Some(ids))
    }
}

/// The engine a model renders by, given its configured one and each of its workers' (`None`
/// when unknown): the one all known workers run, else (none known, or several) the configured
/// one; and whether the known ones disagree.
pub fn engine_to_follow(
    configured: Option<EngineKind>,
    engines: impl IntoIterator<Item = Option<EngineKind>>,
) -> (Option<EngineKind>, bool) {
    let mut known = engines.into_iter().flatten();
    let first = known.next();
    let mixed = first.is_some_and(|first| known.any(|kind| kind != first));
    (if mixed { configured } else { first.or(configured) }, mixed)
}

/// Where a request's prompt token count came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenSource {
    /// Token ids: the client's, or the model's tokenizer's.
    Exact,
    /// The size estimate: no tokenizer, or a request with no exact rendering.
    Estimated,
}

impl TokenSource {
    /// As `x-router-prompt-tokens-source` says it.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenSource::Exact => "exact",
            TokenSource::Estimated => "estimated",
        }
    }
}

/// Everything the router needs about one request, computed once and shared by every bucket
/// attempt and the dispatch.
#[derive(Debug)]
pub struct PreparedRequest {
    /// The validated request.
    pub request: InferenceRequest,
    /// The body to forward: the client's bytes, or a re-serialisation without router-owned
    /// fields when the client set any.
    pub body: Bytes,
    /// Prompt tokens, exact when tokenized.
    pub input_tokens: u64,
    /// Whether `input_tokens` is exact.
    pub token_source: TokenSource,
    /// Why a request routes without a prefix lookup although its model has a tokenizer
    /// (`non_text_part`, `template_error`: no exact rendering; `too_long`: longer than the
    /// router tokenizes).
    pub unmatchable: Option<&'static str>,
    /// Input plus requested output, when the output is bounded.
    pub expected_peak_tokens: Option<u64>,
    /// The (first) prompt's token ids: given by the client, or from the model's tokenizer.
    pub tokens: Option<Arc<RequestTokens>>,
    /// Session key from the configured header.
    pub session_key: Option<String>,
    /// Routing key from the configured header.
    pub routing_key: Option<String>,
    /// The data-parallel rank the client asked for, and how ([`client_rank`]).
    pub client_rank: Option<ClientRank>,
    /// The SLO targets of the request's headers that its model reads (none until the handler
    /// sets them).
    pub slo: SloTargets,
}

impl PreparedRequest {
    /// The facts the bucket loop selects `model`'s engines by, sent to none of `excluded`;
    /// no subset.
    pub fn bucket_request<'a>(
        &'a self,
        model: &'a ModelId,
        excluded: &'a [WorkerId],
    ) -> BucketRequest<'a> {
        BucketRequest {
            model,
            input_tokens: self.input_tokens,
            expected_peak_tokens: self.expected_peak_tokens,
            tokens: self.tokens.as_deref(),
            session_key: self.session_key.as_deref(),
            routing_key: self.routing_key.as_deref(),
            slo: self.slo,
            excluded,
            subset: None,
        }
    }
}

/// A data-parallel rank a client asked for: in SGLang's `data_parallel_rank` body field or
/// vLLM's `X-data-parallel-rank` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientRank {
    /// The rank.
    pub rank: u32,
    /// Where the client said it; an engine that picks its own rank gets it the same way.
    pub via: DpRoute,
}

/// The header vLLM reads the data-parallel rank from.
pub const DP_RANK_HEADER: &str = "x-data-parallel-rank";
/// [`DP_RANK_HEADER`] as a header name, parsed once.
pub const DP_RANK: http::HeaderName = http::HeaderName::from_static(DP_RANK_HEADER);

/// The rank a client asked for in the body (`body_rank`, already validated) or the
/// [`DP_RANK_HEADER`] header (a non-negative integer, else 400); both may be given only if
/// they agree.
pub fn client_rank(
    body_rank: Option<u32>,
    header: Option<&http::HeaderValue>,
) -> Result<Option<ClientRank>, InvalidRequest> {
    let header_rank = header
        .map(|value| {
            value.to_str().ok().and_then(|v| v.trim().parse::<u32>().ok()).ok_or_else(|| {
                InvalidRequest {
                    message: format!("header {DP_RANK_HEADER} must be a non-negative integer"),
                    param: Some(DP_RANK_HEADER.to_owned()),
                }
            })
        })
        .transpose()?;
    match (body_rank, header_rank) {
        (Some(body), Some(header)) if body != header => Err(InvalidRequest {
            message: format!(
                "data_parallel_rank {body} and header {DP_RANK_HEADER} {header} disagree"
            ),
            param: Some("data_parallel_rank".to_owned()),
        }),
        (Some(rank), _) => Ok(Some(ClientRank { rank, via: DpRoute::Body })),
        (None, Some(rank)) => Ok(Some(ClientRank { rank, via: DpRoute::Header })),
        (None, None) => Ok(None),
    }
}

/// Why a request could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The client's request is invalid (400).
    #[error(transparent)]
    Invalid(#[from] InvalidRequest),
    /// The chat template or tokenizer failed on this request (400: the template rejected it).
    #[error(transparent)]
    Tokenize(#[from] TokenizeError),
}

/// Prepares a parsed request: `session` and `routing` are the affinity keys from their headers.
///
/// A batch counts the tokens of all its prompts; prefix lookups use the first one's.
pub fn prepare(
    raw: Bytes,
    mut request: InferenceRequest,
    tokenization: Option<&Tokenization>,
    session_key: Option<&str>,
    routing_key: Option<&str>,
) -> Result<PreparedRequest, PrepareError> {
    let lengths_and_first = |ids: Vec<Vec<u32>>| {
        let total = ids.iter().map(|ids| ids.len() as u64).sum::<u64>();
        (total, ids.into_iter().next().map(|first| Arc::new(RequestTokens::new(first))))
    };
    let mut unmatchable = None;
    let exact = match (&mut request.prompt, tokenization) {
        // The ids move to the routing tokens: a long prompt is held once.
        (Prompt::Ids(ids), _) => Some(lengths_and_first(std::mem::take(ids))),
        (Prompt::Messages, Some(tokenization)) => {
            let text = request.messages().map_or(0, |messages| messages.text);
            match tokenization.encode_messages(&raw, text)? {
                Ok(ids) => Some(lengths_and_first(vec![ids])),
                // The engine renders it (or refuses it); the router routes on its size alone.
                Err(inexact) => {
                    unmatchable = Some(inexact.reason());
                    None
                }
            }
        }
        (Prompt::Texts(texts), Some(tokenization)) => {
            let specials = request.body.get("add_special_tokens").and_then(Value::as_bool);
            let ids = texts
                .iter()
                .map(|text| tokenization.encode_text(text, specials.unwrap_or(true)))
                .collect::<Result<Option<Vec<_>>, _>>()?;
            if ids.is_none() {
                unmatchable = Some(Inexact::TooLong.reason());
            }
            ids.map(lengths_and_first)
        }
        // Text without a tokenizer, or a passed-through body.
        _ => None,
    };
    let (input_tokens, tokens, token_source) = match exact {
        Some((total, tokens)) => (total, tokens, TokenSource::Exact),
        None => (estimate_tokens(&request), None, TokenSource::Estimated),
    };
    let expected_peak_tokens = match request.max_output_tokens {
        Some(output) => Some(
            output
                .checked_mul(request.sequences)
                .and_then(|output| input_tokens.checked_add(output))
                .ok_or_else(|| InvalidRequest {
                    message: "input plus max_tokens overflows".to_owned(),
                    param: Some("max_tokens".to_owned()),
                })?,
        ),
        None => None,
    };
    let body = if ROUTER_OWNED_FIELDS.iter().any(|f| request.body.has(f)) {
        edit_members(&raw, &ROUTER_OWNED_FIELDS, &[]).map_err(InvalidRequest::not_json)?
    } else {
        raw
    };
    let non_empty = |key: Option<&str>| key.filter(|k| !k.is_empty()).map(str::to_owned);
    Ok(PreparedRequest {
        body,
        input_tokens,
        token_source,
        unmatchable,
        expected_peak_tokens,
        tokens,
        session_key: non_empty(session_key),
        routing_key: non_empty(routing_key),
        client_rank: None,
        slo: SloTargets::NONE,
        request,
    })
}

/// Routing ids for a request of a model that reads cached prefixes but has no tokenizer
/// (approximate mode, as sglang-router matches prompt text): the first prompt's text, or each
/// chat message's role and text content followed by a newline, made ids by
/// [`RequestTokens::from_text`]. `None` for a passed-through body, or messages holding more
/// values than the router builds for a body of their size.
pub fn text_tokens(prepared: &PreparedRequest) -> Option<Arc<RequestTokens>> {
    let text = match &prepared.request.prompt {
        Prompt::Texts(texts) => texts.first()?.as_bytes().to_vec(),
        Prompt::Messages => {
            let members = fields::members(&prepared.body, &["messages"]).ok()??;
            let mut text = Vec::new();
            for message in members.get("messages")?.as_array()? {
                let role = message.get("role").and_then(Value::as_str).unwrap_or_default();
                text.extend_from_slice(role.as_bytes());
                text.push(b'\n');
                match message.get("content") {
                    Some(Value::String(content)) => text.extend_from_slice(content.as_bytes()),
                    Some(Value::Array(parts)) => {
                        for part in parts.iter().filter_map(|p| p.get("text")?.as_str()) {
                            text.extend_from_slice(part.as_bytes());
                        }
                    }
                    _ => {}
                }
                text.push(b'\n');
            }
            text
        }
        Prompt::Ids(_) | Prompt::Opaque => return None,
    };
    Some(Arc::new(RequestTokens::from_text(&text)))
}

/// A size estimate without a tokenizer: about four bytes of text per token, plus a few tokens
/// of template framing per chat message.
fn estimate_tokens(request: &InferenceRequest) -> u64 {
    let estimate = match &request.prompt {
        Prompt::Messages => request.messages().map_or(0, |messages| {
            messages.text.div_ceil(4) + 4 * messages.count.unwrap_or_default()
        }),
        Prompt::Texts(texts) => texts.iter().map(|text| text.len().div_ceil(4)).sum(),
        Prompt::Ids(ids) => ids.iter().map(Vec::len).sum(),
        Prompt::Opaque => request.body.text_len().div_ceil(4),
    };
    estimate.max(1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_follows_the_engine_its_known_workers_agree_on() {
        use EngineKind::{Sglang, Vllm};
        let cases = [
            (None, vec![], (None, false)),
            (None, vec![None, Some(Sglang), Some(Sglang)], (Some(Sglang), false)),
            (Some(Vllm), vec![Some(Sglang)], (Some(Sglang), false)),
            (Some(Sglang), vec![None, None], (Some(Sglang), false)),
            (None, vec![Some(Vllm), None, Some(Sglang)], (None, true)),
            (Some(Sglang), vec![Some(Vllm), Some(Sglang)], (Some(Sglang), true)),
        ];
        for (configured, engines, expected) in cases {
            assert_eq!(
                engine_to_follow(configured, engines.clone()),
                expected,
                "{configured:?} {engines:?}"
            );
        }
    }

    #[test]
    fn a_clients_rank_comes_from_the_body_or_the_header_and_both_must_agree() {
        let header = |v: &'static str| http::HeaderValue::from_static(v);
        let ranked = |rank, via| Ok(Some(ClientRank { rank, via }));
        assert_eq!(client_rank(None, None), Ok(None));
        assert_eq!(client_rank(Some(2), None), ranked(2, DpRoute::Body));
        assert_eq!(client_rank(None, Some(&header(" 3 "))), ranked(3, DpRoute::Header));
        assert_eq!(client_rank(Some(1), Some(&header("1"))), ranked(1, DpRoute::Body));
        let param = |r: Result<Option<ClientRank>, InvalidRequest>| r.expect_err("invalid").param;
        assert_eq!(
            param(client_rank(Some(1), Some(&header("2")))).as_deref(),
            Some("data_parallel_rank")
        );
        for bad in ["-1", "one", "", "4294967296"] {
            let got = param(client_rank(None, Some(&header(bad))));
            assert_eq!(got.as_deref(), Some(DP_RANK_HEADER), "{bad:?}");
        }
    }

    fn chat(body: &str) -> (Bytes, InferenceRequest) {
        let raw = Bytes::from(body.to_owned());
        let chat = parse_request(Endpoint::Chat, &raw, 4).expect("valid");
        (raw, chat)
    }

    #[test]
    fn text_without_a_tokenizer_routes_on_its_bytes() {
        let chat = |body: &str| {
            let raw = Bytes::from(body.to_owned());
            let request = parse_request(Endpoint::Chat, &raw, 8).expect("valid");
            prepare(raw, request, None, None, None).expect("prepared")
        };
        // "user\n" and "\n" frame the ten bytes: four ids exactly.
        let plain = chat(r#"{"model":"m","messages":[{"role":"user","content":"abcdefghij"}]}"#);
        let parts = chat(
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"abcde"},
            {"type":"text","text":"fghij"}]}]}"#,
        );
        let ids = |p: &PreparedRequest| text_tokens(p).expect("text ids").ids().to_vec();
        assert_eq!(ids(&plain), ids(&parts), "content parts read as the text they hold");
        assert_eq!(ids(&plain).len(), 4);
        assert_eq!(plain.token_source, TokenSource::Estimated, "the count stays an estimate");
        let longer = chat(
            r#"{"model":"m","messages":[{"role":"user","content":"abcdefghij"},
            {"role":"assistant","content":null,"tool_calls":[]},{"role":"user","content":"x"}]}"#,
        );
        assert!(ids(&longer).starts_with(&ids(&plain)), "a longer conversation extends it");
        let raw = Bytes::from_static(br#"{"model":"m","prompt":[1,2,3]}"#);
        let request = parse_request(Endpoint::Completions, &raw, 8).expect("valid");
        let ids_prompt = prepare(raw, request, None, None, None).expect("prepared");
        assert!(text_tokens(&ids_prompt).is_none(), "token ids are already exact");
    }

    #[test]
    fn estimate_and_peak_without_tokenizer() {
        let (raw, chat) = chat(
            r#"{"model":"m","messages":[{"role":"user","content":"abcdefgh"}],"max_tokens":10}"#,
        );
        let prepared = prepare(raw.clone(), chat, None, Some("s1"), Some("")).expect("prepared");
        // "user" and "abcdefgh": 12 bytes, 3 tokens, plus 4 of framing.
        assert_eq!(prepared.input_tokens, 3 + 4);
        assert_eq!(prepared.expected_peak_tokens, Some(17));
        assert_eq!(prepared.session_key.as_deref(), Some("s1"));
        assert_eq!(prepared.routing_key, None, "empty keys never become keys");
        assert_eq!(prepared.body, raw, "an untouched body is forwarded byte for byte");
        assert!(prepared.tokens.is_none());
    }

    #[test]
    fn client_token_ids_route_without_a_tokenizer_and_a_batch_counts_every_prompt() {
        let body = r#"{"input_ids":[[1,2,3],[4,5]],"sampling_params":{"max_new_tokens":10,"n":2}}"#;
        let raw = Bytes::from(body);
        let request = parse_request(Endpoint::Generate, &raw, 4).expect("valid");
        let prepared = prepare(raw, request, None, None, None).expect("prepared");
        assert_eq!(prepared.input_tokens, 5, "both prompts, exactly");
        assert_eq!(prepared.expected_peak_tokens, Some(5 + 10 * 2 * 2), "two prompts, n = 2");
        let tokens = prepared.tokens.expect("the client's ids, for prefix lookups");
        assert_eq!(tokens.ids(), [1, 2, 3], "a batch looks up its first prompt");

        let raw = Bytes::from(r#"{"model":"m","prompt":["abcdefgh","abcd"]}"#);
        let request = parse_request(Endpoint::Completions, &raw, 4).expect("valid");
        let prepared = prepare(raw, request, None, None, None).expect("prepared");
        assert_eq!((prepared.input_tokens, prepared.expected_peak_tokens), (3, None));
        assert!(prepared.tokens.is_none(), "text without a tokenizer is only estimated");
    }

    #[test]
    fn client_bootstrap_fields_are_stripped() {
        let (raw, chat) = chat(
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"bootstrap_room":7,"bootstrap_host":"evil"}"#,
        );
        let prepared = prepare(raw, chat, None, None, None).expect("prepared");
        let forwarded: Value = serde_json::from_slice(&prepared.body).expect("json");
        assert!(forwarded.get("bootstrap_room").is_none());
        assert!(forwarded.get("bootstrap_host").is_none());
        assert_eq!(forwarded["model"], "m");
    }

    #[test]
    fn the_estimate_counts_every_string_of_the_messages_and_their_framing() {
        let message = |json: &str| format!(r#"{{"model":"m","messages":[{json}]}}"#);
        #[rustfmt::skip]
        let cases = [
            // (4 + 8) bytes: 3 tokens, and 4 of framing.
            ("text content", message(r#"{"role":"user","content":"abcdefgh"}"#), 7),
            ("null content: the role alone", message(r#"{"role":"user","content":null}"#), 1 + 4),
            // "user", "text" and "abcd": 12 bytes.
            ("content parts", message(r#"{"role":"user","content":[{"type":"text","text":"abcd"}]}"#), 3 + 4),
            // "tool", "x" and "abc": 8 bytes; the number counts nothing.
            ("other fields", message(r#"{"role":"tool","content":"x","tool_call_id":"abc","n":12345}"#), 2 + 4),
            // 8 + 13 bytes: 6 tokens, and 4 of framing each.
            ("two messages", message(r#"{"role":"user","content":"abcd"},{"role":"assistant","content":"abcd"}"#), 6 + 8),
        ];
        for (name, body, tokens) in cases {
            let (raw, chat) = chat(&body);
            let prepared = prepare(raw, chat, None, None, None).expect("prepared");
            assert_eq!(prepared.input_tokens, tokens, "{name}");
            assert_eq!(prepared.expected_peak_tokens, None, "{name}: the output is unbounded");
        }
    }

    #[test]
    fn the_peak_adds_the_output_budget_max_completion_tokens_first() {
        let peak = |extra: &str| {
            let body = format!(
                r#"{{"model":"m","messages":[{{"role":"user","content":"abcdefgh"}}]{extra}}}"#
            );
            let (raw, chat) = chat(&body);
            prepare(raw, chat, None, None, None).expect("prepared").expected_peak_tokens
        };
        assert_eq!(peak(""), None);
        assert_eq!(peak(r#","max_tokens":100"#), Some(107));
        assert_eq!(peak(r#","max_tokens":100,"max_completion_tokens":5"#), Some(12));
        assert_eq!(peak(r#","max_tokens":null"#), None);
    }

    #[test]
    fn only_router_owned_fields_are_stripped() {
        let (raw, chat) = chat(
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"bootstrap_port":1,"lora_path":"a","seed":3}"#,
        );
        let prepared = prepare(raw, chat, None, None, None).expect("prepared");
        let forwarded: Value = serde_json::from_slice(&prepared.body).expect("json");
        let mut fields: Vec<&str> =
            forwarded.as_object().expect("object").keys().map(String::as_str).collect();
        fields.sort_unstable();
        assert_eq!(fields, ["lora_path", "messages", "model", "seed"]);
        assert_eq!(forwarded["messages"][0]["content"], "x");
        assert!(prepared.request.body.has("bootstrap_port"), "the parsed request is the client's");
    }

    /// Found by the `prepare` fuzz target: serde_json's default float parser is off by one ulp
    /// on long numbers, so a body re-serialised without the router-owned fields forwarded
    /// 4.444444444444445e122 for the client's 123-digit integer (4.4444444444444445e122).
    #[test]
    fn stripping_router_owned_fields_keeps_every_number_exact() {
        let (raw, chat) = chat(
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"bootstrap_room":1,"x":444444444444444444444444444444444444444444444444444444444444444444444444444444444444444444444444444444444444444444444444447,"y":0.1,"z":1e-300}"#,
        );
        let prepared = prepare(raw, chat, None, None, None).expect("prepared");
        let forwarded: Value = serde_json::from_slice(&prepared.body).expect("json");
        assert_eq!(forwarded["x"].as_f64(), Some(4.4444444444444445e122));
        assert_eq!(forwarded["y"].as_f64(), Some(0.1));
        assert_eq!(forwarded["z"].as_f64(), Some(1e-300));
    }

    /// A scratch directory of this test process.
    fn scratch(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("router-prepare-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    }

    #[test]
    fn with_a_tokenizer_the_rendered_prompt_is_counted_exactly() {
        let tokenizer = router_sim::assets::tokenizer_path();
        let body =
            r#"{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":10}"#;

        // The sim's tokenizer has one token per byte: the template's framing counts too.
        let chatml =
            Tokenization::load(&tokenizer, None).expect("the sim's tokenizer and template");
        let (raw, request) = chat(body);
        let prepared = prepare(raw, request, Some(&chatml), None, None).expect("prepared");
        let tokens = prepared.tokens.as_ref().expect("token ids");
        assert_eq!(prepared.input_tokens, tokens.ids().len() as u64);
        assert!(prepared.input_tokens > 5, "framing counted: {}", prepared.input_tokens);
        assert_eq!(prepared.expected_peak_tokens, Some(prepared.input_tokens + 10));

        // A configured template is the one rendered.
        let dir = scratch("template");
        let template = dir.join("bare.jinja");
        std::fs::write(&template, "{% for m in messages %}{{ m['content'] }}{% endfor %}")
            .expect("written");
        let bare = Tokenization::load(&tokenizer, Some(&template)).expect("loaded");
        let (raw, request) = chat(body);
        let prepared = prepare(raw, request, Some(&bare), None, None).expect("prepared");
        let ids = prepared.tokens.as_ref().expect("token ids").ids().to_vec();
        assert_eq!(ids, "hello".bytes().map(u32::from).collect::<Vec<_>>());

        // A template that refuses the request leaves it to the engine, which renders (and
        // refuses) it itself: the router routes on the size estimate and says why.
        let refusing = dir.join("refusing.jinja");
        std::fs::write(&refusing, "{{ raise_exception('no user messages here') }}")
            .expect("written");
        let refusing = Tokenization::load(&tokenizer, Some(&refusing)).expect("loaded");
        let (raw, request) = chat(body);
        let prepared = prepare(raw, request, Some(&refusing), None, None).expect("prepared");
        assert_eq!(prepared.unmatchable, Some("template_error"));
        assert_eq!(prepared.token_source, TokenSource::Estimated);
        assert!(prepared.tokens.is_none(), "no ids: no prefix lookup");

        // So does a part no text-only rendering holds.
        let image = r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is it"},{"type":"image_url","image_url":{"url":"data:,"}}]}]}"#;
        let (raw, request) = chat(image);
        let prepared = prepare(raw, request, Some(&chatml), None, None).expect("prepared");
        assert_eq!(prepared.unmatchable, Some("non_text_part"));
        assert_eq!(prepared.token_source, TokenSource::Estimated);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_tokenizer_that_cannot_load_names_its_file() {
        let missing = std::path::Path::new("/nonexistent/tokenizer.json");
        let err = Tokenization::load(missing, None).expect_err("no such file");
        assert!(matches!(err, TokenizeError::Load { .. }), "{err:?}");
        assert_eq!(err.to_string(), "loading tokenizer /nonexistent/tokenizer.json");

        // A tokenizer without a template beside it, and none configured.
        let dir = scratch("no-template");
        let alone = dir.join("tokenizer.json");
        std::fs::copy(router_sim::assets::tokenizer_path(), &alone).expect("copied");
        let err = Tokenization::load(&alone, None).expect_err("no chat template");
        assert!(matches!(err, TokenizeError::Template(_)), "{err:?}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
