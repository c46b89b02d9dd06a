//! Parsing and validating the three inference requests: OpenAI chat completions, OpenAI
//! (legacy) completions and SGLang's native `/generate`.
//!
//! The body is read once ([`super::fields`]: serde_json's parser, whose nesting cap makes
//! hostile nesting an error, not a stack overflow), then the fields the router relies on or
//! that an engine would reject are checked, each error naming its field. The body itself is
//! forwarded as the client sent it.

use serde_json::{Map, Value};

use super::fields::{self, BodyFields, MessageProblem, Messages, PromptField, PromptProblem};

/// A request that failed validation: a 400 naming what is wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{message}")]
pub struct InvalidRequest {
    /// What is wrong, naming the field.
    pub message: String,
    /// The offending parameter, when there is one.
    pub param: Option<String>,
}

impl InvalidRequest {
    /// `'{param}' {what}`, naming `param`.
    pub fn field(param: &str, what: impl std::fmt::Display) -> Self {
        Self { message: format!("'{param}' {what}"), param: Some(param.to_owned()) }
    }

    /// A body that is no JSON value.
    pub fn not_json(error: serde_json::Error) -> Self {
        Self { message: format!("request body is not valid JSON: {error}"), param: None }
    }
}

/// The API a request came in through; the engine is asked through the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// SGLang's `POST /generate`.
    Generate,
    /// `POST /v1/embeddings`, passed through.
    Embeddings,
    /// `POST /v1/rerank`, passed through.
    Rerank,
    /// `POST /v1/score`, passed through.
    Score,
    /// `POST /v1/tokenize`, passed through.
    Tokenize,
    /// `POST /v1/detokenize`, passed through.
    Detokenize,
}

impl Endpoint {
    /// Every endpoint, each served at its [`Endpoint::path`].
    pub const ALL: [Endpoint; 8] = [
        Endpoint::Chat,
        Endpoint::Completions,
        Endpoint::Generate,
        Endpoint::Embeddings,
        Endpoint::Rerank,
        Endpoint::Score,
        Endpoint::Tokenize,
        Endpoint::Detokenize,
    ];

    /// The path of this API, on the router and on the engine.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Generate => "/generate",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Rerank => "/v1/rerank",
            Endpoint::Score => "/v1/score",
            Endpoint::Tokenize => "/v1/tokenize",
            Endpoint::Detokenize => "/v1/detokenize",
        }
    }

    /// The endpoint served at `path`.
    pub fn at(path: &str) -> Option<Endpoint> {
        Endpoint::ALL.into_iter().find(|endpoint| endpoint.path() == path)
    }

    /// Whether the engines generate tokens for it (chat, completions, `/generate`), and so a
    /// PD pair serves it; the other endpoints go to one engine as they are.
    pub fn generates(self) -> bool {
        matches!(self, Endpoint::Chat | Endpoint::Completions | Endpoint::Generate)
    }
}

/// What the model is asked to continue.
#[derive(Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Chat messages (the body's validated `messages`), rendered by the chat template.
    Messages,
    /// Raw text prompts, tokenized without a template.
    Texts(Vec<String>),
    /// Token-id prompts, used as given.
    Ids(Vec<Vec<u32>>),
    /// A passed-through request: its size is estimated from its text, nothing is tokenized.
    Opaque,
}

/// The fields of an inference request the router reads.
#[derive(Debug)]
pub struct InferenceRequest {
    /// The API it came in through.
    pub endpoint: Endpoint,
    /// The body's top-level fields, as far as the router reads them.
    pub body: BodyFields,
    /// `model`; `/generate` and the passed-through endpoints may leave it out.
    pub model: Option<String>,
    /// `stream`, false when absent.
    pub stream: bool,
    /// The output bound of each sequence: `max_completion_tokens`, else `max_tokens`
    /// (`sampling_params.max_new_tokens` for `/generate`).
    pub max_output_tokens: Option<u64>,
    /// The prompts.
    pub prompt: Prompt,
    /// The number of prompts when the request is a batch (a list of prompts), else `None`.
    pub batch: Option<usize>,
    /// Sequences generated: prompts times `n`.
    pub sequences: u64,
    /// The data-parallel rank the client asked for in `data_parallel_rank` (SGLang's field).
    pub client_rank: Option<u32>,
}

impl InferenceRequest {
    /// How many bootstrap rooms a PD pair needs as a list: one per prompt of a `/generate`
    /// batch (SGLang's batch requests take lists); `None` for one room, from which an engine
    /// numbers the runs of a multi-prompt completion itself.
    pub fn bootstrap_rooms(&self) -> Option<usize> {
        self.batch.filter(|_| self.endpoint == Endpoint::Generate)
    }

    /// `messages`, when present (validated to be a non-empty list of messages for chat).
    pub fn messages(&self) -> Option<&Messages> {
        self.body.messages()
    }
}

/// A field of a request object: of the body, or of an object inside it (`sampling_params`).
/// Request objects hold a handful of keys, and serde_json's ordered map (`preserve_order`,
/// which the chat template needs) hashes every lookup with SipHash: comparing a few short
/// keys is several times cheaper. Keys are unique (a repeated key's last value replaces the
/// first), so the scan finds what `get` would.
trait Field {
    fn field(&self, name: &str) -> Option<&Value>;
}

impl Field for BodyFields {
    fn field(&self, name: &str) -> Option<&Value> {
        self.get(name)
    }
}

/// Objects up to this many keys are scanned rather than hashed into.
const SCANNED_KEYS: usize = 16;

impl Field for Map<String, Value> {
    fn field(&self, name: &str) -> Option<&Value> {
        if self.len() <= SCANNED_KEYS {
            self.iter().find_map(|(key, value)| (key == name).then_some(value))
        } else {
            self.get(name)
        }
    }
}

/// Upper bound accepted for `max_tokens`; anything larger is a client error, not a budget.
const MAX_OUTPUT_TOKENS: u64 = 1 << 24;

/// Parses and validates a body of `endpoint`; a batch may hold at most `max_batch` prompts.
pub fn parse_request(
    endpoint: Endpoint,
    body: &[u8],
    max_batch: usize,
) -> Result<InferenceRequest, InvalidRequest> {
    let read = fields::read(body, max_batch).map_err(InvalidRequest::not_json)?;
    let Some(mut body) = read else {
        return Err(InvalidRequest {
            message: "request body must be a JSON object".to_owned(),
            param: None,
        });
    };
    if let Some(field) = body.oversized() {
        return Err(InvalidRequest::field(field, "holds more values than the router reads"));
    }
    // A request that names no model goes to the router's default model (`AppContext`).
    let model = match body.field("model") {
        Some(Value::String(model)) if !model.is_empty() => Some(model.clone()),
        Some(Value::String(_)) => return Err(InvalidRequest::field("model", "must not be empty")),
        None | Some(Value::Null) => None,
        Some(_) => return Err(InvalidRequest::field("model", "must be a string")),
    };
    let stream = match body.field("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(stream)) => *stream,
        Some(_) => return Err(InvalidRequest::field("stream", "must be a boolean")),
    };
    let (prompt, batch, max_output_tokens, n) = match endpoint {
        Endpoint::Chat => {
            validate_messages(body.messages())?;
            let (max_output_tokens, n) = openai_sampling(&body)?;
            (Prompt::Messages, None, max_output_tokens, n)
        }
        Endpoint::Completions => {
            let (prompt, batch) = match body.take_prompt("prompt") {
                None | Some(PromptField::Null) => {
                    return Err(InvalidRequest::field("prompt", "is required"));
                }
                Some(prompt) => prompts("prompt", prompt, Shapes::Any, max_batch)?,
            };
            optional_bool(&body, "echo")?;
            let (max_output_tokens, n) = openai_sampling(&body)?;
            (prompt, batch, max_output_tokens, n)
        }
        Endpoint::Generate => {
            let mut present = |field| body.take_prompt(field).filter(|p| *p != PromptField::Null);
            let (prompt, batch) = match (present("text"), present("input_ids")) {
                (Some(text), None) => prompts("text", text, Shapes::Text, max_batch)?,
                (None, Some(ids)) => prompts("input_ids", ids, Shapes::Ids, max_batch)?,
                (Some(_), Some(_)) => {
                    return Err(InvalidRequest::field("text", "and 'input_ids' are exclusive"));
                }
                (None, None) => {
                    return Err(InvalidRequest::field("text", "or 'input_ids' is required"));
                }
            };
            for field in ["rid", "return_logprob"] {
                per_item(&body, field, batch)?;
            }
            let (max_output_tokens, n) = generate_sampling(&body, batch)?;
            (prompt, batch, max_output_tokens, n)
        }
        _ => (Prompt::Opaque, None, None, 1),
    };
    let sequences = batch.unwrap_or(1) as u64 * n;
    let client_rank = data_parallel_rank(&body)?;
    Ok(InferenceRequest {
        endpoint,
        body,
        model,
        stream,
        max_output_tokens,
        prompt,
        batch,
        sequences,
        client_rank,
    })
}

/// `data_parallel_rank`: absent, null, or a rank number.
fn data_parallel_rank(body: &BodyFields) -> Result<Option<u32>, InvalidRequest> {
    const FIELD: &str = "data_parallel_rank";
    match body.field(FIELD) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .and_then(|rank| u32::try_from(rank).ok())
            .map(Some)
            .ok_or_else(|| InvalidRequest::field(FIELD, "must be a non-negative integer")),
    }
}

/// The OpenAI sampling fields of chat and completions: the output bound and `n`.
fn openai_sampling(body: &BodyFields) -> Result<(Option<u64>, u64), InvalidRequest> {
    if let Some(options) = body.field("stream_options")
        && !options.is_null()
        && !options.is_object()
    {
        return Err(InvalidRequest::field("stream_options", "must be an object"));
    }
    let max_tokens = optional_count(body, "max_tokens")?;
    let max_completion_tokens = optional_count(body, "max_completion_tokens")?;
    optional_range(body, "temperature", 0.0, 2.0)?;
    optional_range(body, "top_p", 0.0, 1.0)?;
    optional_range(body, "min_p", 0.0, 1.0)?;
    optional_range(body, "presence_penalty", -2.0, 2.0)?;
    optional_range(body, "frequency_penalty", -2.0, 2.0)?;
    // vLLM takes any positive, finite repetition penalty.
    optional_range(body, "repetition_penalty", f64::MIN_POSITIVE, f64::MAX)
        .map_err(|_| InvalidRequest::field("repetition_penalty", "must be a number above 0"))?;
    let n = sample_count(body, "n")?;
    top_k_and_stop(body, "")?;
    Ok((max_completion_tokens.or(max_tokens), n))
}

/// SGLang's `sampling_params` (one object, or for a batch one per prompt): the output bound
/// (the largest, unknown if any prompt leaves it open) and `n`.
fn generate_sampling(
    body: &BodyFields,
    batch: Option<usize>,
) -> Result<(Option<u64>, u64), InvalidRequest> {
    const FIELD: &str = "sampling_params";
    match (body.field(FIELD), batch) {
        (None | Some(Value::Null), _) => Ok((None, 1)),
        (Some(Value::Object(params)), _) => sampling_params(params, FIELD),
        (Some(Value::Array(items)), Some(len)) if items.len() == len => {
            let mut bound = Some(0);
            let mut n = 1;
            for (i, item) in items.iter().enumerate() {
                let at = format!("{FIELD}[{i}]");
                let Value::Object(params) = item else {
                    return Err(InvalidRequest::field(&at, "must be an object"));
                };
                let (max_new_tokens, item_n) = sampling_params(params, &at)?;
                bound = bound.zip(max_new_tokens).map(|(a, b)| a.max(b));
                n = n.max(item_n);
            }
            Ok((bound, n))
        }
        (Some(Value::Array(_)), Some(len)) => Err(InvalidRequest::field(
            FIELD,
            format!("must hold one object per prompt, {len} for this batch"),
        )),
        _ => {
            Err(InvalidRequest::field(FIELD, "must be an object (or, for a batch, one per prompt)"))
        }
    }
}

/// One `sampling_params` object, reported at `prefix`.
fn sampling_params(
    params: &Map<String, Value>,
    prefix: &str,
) -> Result<(Option<u64>, u64), InvalidRequest> {
    let at = |field: &str| format!("{prefix}.{field}");
    let max_new_tokens =
        optional_count(params, "max_new_tokens").map_err(|e| renamed(e, &at("max_new_tokens")))?;
    for (field, min, max) in [
        ("temperature", 0.0, f64::MAX),
        ("top_p", f64::MIN_POSITIVE, 1.0),
        ("min_p", 0.0, 1.0),
        ("presence_penalty", -2.0, 2.0),
        ("frequency_penalty", -2.0, 2.0),
        ("repetition_penalty", 0.0, 2.0),
    ] {
        optional_range(params, field, min, max).map_err(|e| renamed(e, &at(field)))?;
    }
    let n = sample_count(params, "n").map_err(|e| renamed(e, &at("n")))?;
    top_k_and_stop(params, &format!("{prefix}."))?;
    Ok((max_new_tokens, n))
}

/// `error`, reported at `path` (a field inside an object).
fn renamed(error: InvalidRequest, path: &str) -> InvalidRequest {
    let field = error.param.clone().unwrap_or_default();
    InvalidRequest {
        message: error.message.replacen(&format!("'{field}'"), &format!("'{path}'"), 1),
        param: Some(path.to_owned()),
    }
}

/// `n` (at least 1, 1 when absent). How many an engine generates at most is its own limit
/// (vLLM's `VLLM_MAX_N_SEQUENCES`, 16384 by default): the router checks only what no engine
/// takes.
fn sample_count(body: &impl Field, field: &str) -> Result<u64, InvalidRequest> {
    match optional_count(body, field)? {
        None => Ok(1),
        Some(0) => Err(InvalidRequest::field(field, "must be at least 1, got 0")),
        Some(n) => Ok(n),
    }
}

/// `top_k` (an integer of at least -1: -1 and 0 turn it off) and `stop` (a string or a list
/// of strings; how many an engine takes is its own limit, vLLM's `VLLM_MAX_STOP_STRINGS`),
/// under `prefix` for errors.
fn top_k_and_stop(body: &impl Field, prefix: &str) -> Result<(), InvalidRequest> {
    if let Some(top_k) = body.field("top_k").filter(|v| !v.is_null()) {
        match top_k.as_i64() {
            Some(k) if k >= -1 => {}
            _ => {
                let field = format!("{prefix}top_k");
                return Err(InvalidRequest::field(
                    &field,
                    "must be an integer of at least -1 (-1 and 0 turn it off)",
                ));
            }
        }
    }
    if let Some(stop) = body.field("stop") {
        let ok = match stop {
            Value::Null | Value::String(_) => true,
            Value::Array(items) => items.iter().all(Value::is_string),
            _ => false,
        };
        if !ok {
            let field = format!("{prefix}stop");
            return Err(InvalidRequest::field(&field, "must be a string or a list of strings"));
        }
    }
    Ok(())
}

/// The prompt forms a field accepts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shapes {
    /// Text or token ids, single or batched (`prompt`).
    Any,
    /// A string or a list of strings (`text`).
    Text,
    /// A list of token ids or a list of such lists (`input_ids`).
    Ids,
}

impl Shapes {
    fn describe(self) -> &'static str {
        match self {
            Shapes::Any => {
                "must be a string, a list of strings, a list of token ids or a list of lists of \
                 token ids"
            }
            Shapes::Text => "must be a string or a list of strings",
            Shapes::Ids => "must be a list of token ids or a list of lists of token ids",
        }
    }
}

/// A prompt field in one of its accepted `shapes`; the batch size when it is a list of
/// prompts. The body was read with the batch limit `max_batch`: a batch kept is within it.
fn prompts(
    field: &str,
    prompt: PromptField,
    shapes: Shapes,
    max_batch: usize,
) -> Result<(Prompt, Option<usize>), InvalidRequest> {
    let (text, ids) = (shapes != Shapes::Ids, shapes != Shapes::Text);
    match prompt {
        PromptField::Text(one) if text => Ok((Prompt::Texts(vec![one]), None)),
        PromptField::Empty => Err(InvalidRequest::field(field, "must not be empty")),
        PromptField::Texts(texts) if text => {
            let batch = Some(texts.len());
            Ok((Prompt::Texts(texts), batch))
        }
        PromptField::Ids(one) if ids => Ok((Prompt::Ids(vec![one]), None)),
        PromptField::IdLists(lists) if ids => {
            let batch = Some(lists.len());
            Ok((Prompt::Ids(lists), batch))
        }
        PromptField::Invalid { problem, .. } => Err(match problem {
            PromptProblem::NotAnId if ids => InvalidRequest::field(
                field,
                "must hold token ids: non-negative integers below 2^32",
            ),
            PromptProblem::EmptyList(i) if ids => {
                InvalidRequest::field(&format!("{field}[{i}]"), "must not be empty")
            }
            PromptProblem::TooMany { prompts, ids: of_ids }
                if (of_ids && ids) || (!of_ids && text) =>
            {
                InvalidRequest::field(
                    field,
                    format!("holds {prompts} prompts, more than the batch limit of {max_batch}"),
                )
            }
            _ => InvalidRequest::field(field, shapes.describe()),
        }),
        _ => Err(InvalidRequest::field(field, shapes.describe())),
    }
}

/// A per-item field of `/generate` (`rid`, `return_logprob`): a scalar, or for a batch a list
/// of one value per prompt.
fn per_item(body: &BodyFields, field: &str, batch: Option<usize>) -> Result<(), InvalidRequest> {
    match (body.field(field), batch) {
        (Some(Value::Array(items)), Some(len)) if items.len() != len => Err(InvalidRequest::field(
            field,
            format!("holds {} values for a batch of {len} prompts", items.len()),
        )),
        (Some(Value::Array(_)), None) => {
            Err(InvalidRequest::field(field, "may be a list only for a batch of prompts"))
        }
        _ => Ok(()),
    }
}

fn optional_bool(body: &BodyFields, field: &str) -> Result<(), InvalidRequest> {
    match body.field(field) {
        None | Some(Value::Null | Value::Bool(_)) => Ok(()),
        Some(_) => Err(InvalidRequest::field(field, "must be a boolean")),
    }
}

/// `messages` of a chat request: a non-empty list of messages.
fn validate_messages(messages: Option<&Messages>) -> Result<(), InvalidRequest> {
    match messages {
        None => Err(InvalidRequest::field("messages", "is required")),
        Some(Messages { count: None, .. }) => {
            Err(InvalidRequest::field("messages", "must be an array"))
        }
        Some(Messages { count: Some(0), .. }) => {
            Err(InvalidRequest::field("messages", "must not be empty"))
        }
        Some(Messages { problem: Some((i, problem)), .. }) => Err(match problem {
            MessageProblem::NotAnObject => {
                InvalidRequest::field(&format!("messages[{i}]"), "must be an object")
            }
            MessageProblem::Role => {
                InvalidRequest::field(&format!("messages[{i}].role"), "must be a string")
            }
            MessageProblem::Content => InvalidRequest::field(
                &format!("messages[{i}].content"),
                "must be a string, an array of parts or null",
            ),
        }),
        Some(_) => Ok(()),
    }
}

/// A non-negative integer field, when present and not null.
fn optional_count(body: &impl Field, field: &str) -> Result<Option<u64>, InvalidRequest> {
    match body.field(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => match value.as_u64() {
            Some(n) if n <= MAX_OUTPUT_TOKENS => Ok(Some(n)),
            Some(n) => Err(InvalidRequest::field(
                field,
                format!("must be at most {MAX_OUTPUT_TOKENS}, got {n}"),
            )),
            None => Err(InvalidRequest::field(field, "must be a non-negative integer")),
        },
    }
}

fn optional_range(
    body: &impl Field,
    field: &str,
    min: f64,
    max: f64,
) -> Result<(), InvalidRequest> {
    match body.field(field) {
        None | Some(Value::Null) => Ok(()),
        Some(value) => match value.as_f64() {
            Some(x) if (min..=max).contains(&x) => Ok(()),
            Some(x) => Err(InvalidRequest::field(
                field,
                format!("must be between {min} and {max}, got {x}"),
            )),
            None => Err(InvalidRequest::field(field, "must be a number")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> InvalidRequest {
        parse_request(Endpoint::Chat, body.as_bytes(), 4).expect_err(body)
    }

    #[test]
    fn accepts_a_plain_request() {
        let req = parse_request(
            Endpoint::Chat,
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#,
            4,
        )
        .expect("valid");
        assert_eq!(req.model.as_deref(), Some("m"));
        assert!(!req.stream);
        assert_eq!(req.max_output_tokens, Some(8));
        assert_eq!(req.messages().and_then(|messages| messages.count), Some(1));
    }

    #[test]
    fn a_field_is_found_alike_in_small_and_large_objects_and_a_repeated_key_keeps_its_last_value() {
        // Scanned (few keys) and hashed into (more than SCANNED_KEYS): the same answers.
        let padding: String = (0..SCANNED_KEYS).map(|i| format!(r#","pad{i}":{i}"#)).collect();
        for extra in ["", padding.as_str()] {
            let body = format!(
                r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],
                    "stream":"no","stream":true,"max_tokens":8{extra}}}"#
            );
            let req = parse_request(Endpoint::Chat, body.as_bytes(), 4).expect("valid");
            assert!(req.stream, "the last `stream` counts ({} more keys)", extra.len());
            assert_eq!(req.max_output_tokens, Some(8));
            // An object inside the body (`sampling_params`) is a map, scanned or hashed into.
            let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&body) else {
                panic!("an object: {body}");
            };
            assert_eq!(map.field("absent"), None);
            assert_eq!(map.field("stream"), Some(&Value::Bool(true)));
            assert_eq!(map.field("max_tokens"), map.get("max_tokens"));
        }
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let req = parse_request(
            Endpoint::Chat,
            br#"{"model":"m","messages":[{"role":"user","content":"x"}],
                "max_tokens":8,"max_completion_tokens":3,"stream":true}"#,
            4,
        )
        .expect("valid");
        assert_eq!(req.max_output_tokens, Some(3));
        assert!(req.stream);
    }

    #[test]
    fn a_request_may_name_no_model() {
        for (endpoint, body) in [
            (Endpoint::Chat, r#"{"messages":[{"role":"user","content":"x"}]}"#),
            (Endpoint::Completions, r#"{"prompt":"x","model":null}"#),
            (Endpoint::Generate, r#"{"text":"x"}"#),
        ] {
            let req = parse_request(endpoint, body.as_bytes(), 4).expect("valid");
            assert_eq!(req.model, None, "{body}");
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        let m = r#""model":"m","messages":[{"role":"user","content":"x"}]"#;
        let cases = [
            ("{", None),
            ("[]", None),
            (r#"{"model":"m","messages":[]} trailing"#, None),
            (r#"{"model":"","messages":[{"role":"user","content":"x"}]}"#, Some("model")),
            (r#"{"model":"m"}"#, Some("messages")),
            (r#"{"model":"m","messages":"hi"}"#, Some("messages")),
            (r#"{"model":"m","messages":[]}"#, Some("messages")),
            (r#"{"model":"m","messages":[1]}"#, Some("messages[0]")),
            (r#"{"model":"m","messages":[{"content":"x"}]}"#, Some("messages[0].role")),
            (
                r#"{"model":"m","messages":[{"role":"user","content":5}]}"#,
                Some("messages[0].content"),
            ),
            (&format!(r#"{{{m},"stream":"yes"}}"#), Some("stream")),
            (&format!(r#"{{{m},"n":-1}}"#), Some("n")),
            (&format!(r#"{{{m},"n":0}}"#), Some("n")),
            (&format!(r#"{{{m},"max_tokens":1e12}}"#), Some("max_tokens")),
            (&format!(r#"{{{m},"max_tokens":1000000000000}}"#), Some("max_tokens")),
            (&format!(r#"{{{m},"temperature":3}}"#), Some("temperature")),
            (&format!(r#"{{{m},"top_p":-0.1}}"#), Some("top_p")),
            (&format!(r#"{{{m},"top_k":-2}}"#), Some("top_k")),
            (&format!(r#"{{{m},"stop":[1]}}"#), Some("stop")),
            (&format!(r#"{{{m},"stream_options":true}}"#), Some("stream_options")),
        ];
        for (body, param) in cases {
            let error = err(body);
            assert_eq!(error.param.as_deref(), param, "{body}: {error}");
            if let Some(param) = param {
                assert!(error.message.contains(param), "{body}: {error}");
            }
        }
    }

    #[test]
    fn hostile_json_is_an_error_not_a_crash() {
        let deep = "[".repeat(100_000);
        assert!(err(&deep).message.contains("not valid JSON"));
        assert!(err(r#"{"model":"m","messages":[],"x":1e999}"#).message.contains("not valid JSON"));
    }

    fn parsed(endpoint: Endpoint, body: &str) -> InferenceRequest {
        parse_request(endpoint, body.as_bytes(), 4).expect(body)
    }

    #[test]
    fn completion_prompts_in_every_shape() {
        let texts = |t: &[&str]| Prompt::Texts(t.iter().map(|s| (*s).to_owned()).collect());
        #[rustfmt::skip]
        let cases = [
            (r#""prompt":"hi""#, texts(&["hi"]), None),
            (r#""prompt":["a","b"]"#, texts(&["a", "b"]), Some(2)),
            (r#""prompt":[1,2,3]"#, Prompt::Ids(vec![vec![1, 2, 3]]), None),
            (r#""prompt":[[1],[2,3]]"#, Prompt::Ids(vec![vec![1], vec![2, 3]]), Some(2)),
        ];
        for (fields, prompt, batch) in cases {
            let body = format!(r#"{{"model":"m",{fields},"max_tokens":5,"n":2}}"#);
            let req = parsed(Endpoint::Completions, &body);
            assert_eq!(req.prompt, prompt, "{body}");
            assert_eq!(req.batch, batch, "{body}");
            assert_eq!(req.max_output_tokens, Some(5));
            assert_eq!(req.sequences, 2 * batch.unwrap_or(1) as u64, "{body}");
        }
    }

    #[test]
    fn generate_takes_text_or_ids_and_its_sampling_params() {
        let req = parsed(
            Endpoint::Generate,
            r#"{"text":["a","b"],"sampling_params":{"max_new_tokens":7,"n":3},"rid":["x","y"],"stream":true}"#,
        );
        assert_eq!(req.model, None, "/generate may name no model");
        assert_eq!((req.batch, req.max_output_tokens, req.sequences), (Some(2), Some(7), 6));
        assert!(req.stream);
        let req = parsed(Endpoint::Generate, r#"{"input_ids":[5,6],"model":"m"}"#);
        assert_eq!(req.prompt, Prompt::Ids(vec![vec![5, 6]]));
        assert_eq!(
            (req.batch, req.max_output_tokens, req.model.as_deref()),
            (None, None, Some("m"))
        );
        let req = parsed(
            Endpoint::Generate,
            r#"{"text":["a","b"],"sampling_params":[{"max_new_tokens":4},{"max_new_tokens":9}]}"#,
        );
        assert_eq!(req.max_output_tokens, Some(9), "the largest bound of the batch");
        assert_eq!(req.client_rank, None);
        let req = parsed(Endpoint::Generate, r#"{"text":"a","data_parallel_rank":3}"#);
        assert_eq!(req.client_rank, Some(3));
        assert_eq!(Endpoint::Generate.path(), "/generate");
        assert_eq!(Endpoint::Completions.path(), "/v1/completions");
    }

    #[test]
    fn each_bad_prompt_is_named() {
        #[rustfmt::skip]
        let cases = [
            (Endpoint::Completions, r#"{"model":"m"}"#, "prompt"),
            (Endpoint::Completions, r#"{"prompt":"x","model":[]}"#, "model"),
            (Endpoint::Completions, r#"{"model":"m","prompt":[]}"#, "prompt"),
            (Endpoint::Completions, r#"{"model":"m","prompt":["a",1]}"#, "prompt"),
            (Endpoint::Completions, r#"{"model":"m","prompt":[1,"a"]}"#, "prompt"),
            (Endpoint::Completions, r#"{"model":"m","prompt":[[1],[]]}"#, "prompt[1]"),
            (Endpoint::Completions, r#"{"model":"m","prompt":[-1]}"#, "prompt"),
            (Endpoint::Completions, r#"{"model":"m","prompt":[4294967296]}"#, "prompt"),
            (Endpoint::Completions, r#"{"model":"m","prompt":{"a":1}}"#, "prompt"),
            (Endpoint::Completions, r#"{"model":"m","prompt":["a","b","c","d","e"]}"#, "prompt"),
            (Endpoint::Completions, r#"{"model":"m","prompt":"x","echo":1}"#, "echo"),
            (Endpoint::Completions, r#"{"model":"m","prompt":"x","temperature":9}"#, "temperature"),
            (Endpoint::Generate, r#"{}"#, "text"),
            (Endpoint::Generate, r#"{"text":"a","input_ids":[1]}"#, "text"),
            (Endpoint::Generate, r#"{"input_ids":[]}"#, "input_ids"),
            (Endpoint::Generate, r#"{"input_ids":["a"]}"#, "input_ids"),
            (Endpoint::Generate, r#"{"text":[1,2]}"#, "text"),
            (Endpoint::Generate, r#"{"text":"a","sampling_params":[]}"#, "sampling_params"),
            (Endpoint::Generate, r#"{"text":"a","sampling_params":{"max_new_tokens":-1}}"#, "sampling_params.max_new_tokens"),
            (Endpoint::Generate, r#"{"text":"a","sampling_params":{"top_p":0}}"#, "sampling_params.top_p"),
            (Endpoint::Generate, r#"{"text":"a","sampling_params":{"top_k":-2}}"#, "sampling_params.top_k"),
            (Endpoint::Generate, r#"{"text":["a","b"],"rid":["x"]}"#, "rid"),
            (Endpoint::Generate, r#"{"text":"a","rid":["x"]}"#, "rid"),
            (Endpoint::Generate, r#"{"text":"a","model":5}"#, "model"),
            (Endpoint::Generate, r#"{"text":["a","b"],"sampling_params":[{}]}"#, "sampling_params"),
            (Endpoint::Generate, r#"{"text":["a","b"],"sampling_params":[{},{"top_k":-2}]}"#, "sampling_params[1].top_k"),
            (Endpoint::Generate, r#"{"text":"a","data_parallel_rank":-1}"#, "data_parallel_rank"),
            (Endpoint::Completions, r#"{"model":"m","prompt":"x","data_parallel_rank":"0"}"#, "data_parallel_rank"),
            (Endpoint::Chat, r#"{"model":"m","messages":[{"role":"user","content":"x"}],"data_parallel_rank":1.5}"#, "data_parallel_rank"),
        ];
        for (endpoint, body, param) in cases {
            let error = parse_request(endpoint, body.as_bytes(), 4).expect_err(body);
            assert_eq!(error.param.as_deref(), Some(param), "{body}: {error}");
            assert!(error.message.contains(&format!("'{param}'")), "{body}: {error}");
        }
    }

    #[test]
    fn every_checked_field_says_what_is_wrong_with_it() {
        let m = r#""model":"m","messages":[{"role":"user","content":"x"}]"#;
        let with = |extra: &str| format!("{{{m},{extra}}}");
        let seventeen = vec!["\"s\""; 17].join(",");
        #[rustfmt::skip]
        let cases: Vec<(&str, String, &str)> = vec![
            ("an empty model", r#"{"model":"","messages":[{"role":"user"}]}"#.into(), "'model' must not be empty"),
            ("a model that is no string", r#"{"model":7,"messages":[{"role":"user"}]}"#.into(), "'model' must be a string"),
            ("a second message that is no object", r#"{"model":"m","messages":[{"role":"user"},"x"]}"#.into(),
                "'messages[1]' must be an object"),
            ("a role that is no string", r#"{"model":"m","messages":[{"role":1}]}"#.into(), "'messages[0].role' must be a string"),
            ("a negative max_completion_tokens", with(r#""max_completion_tokens":-1"#), "'max_completion_tokens' must be a non-negative integer"),
            ("one token over the output cap", with(r#""max_tokens":16777217"#), "'max_tokens' must be at most 16777216, got 16777217"),
            ("a temperature that is no number", with(r#""temperature":"hot""#), "'temperature' must be a number"),
            ("min_p above 1", with(r#""min_p":1.5"#), "'min_p' must be between 0 and 1, got 1.5"),
            ("presence_penalty below -2", with(r#""presence_penalty":-3"#), "'presence_penalty' must be between -2 and 2"),
            ("frequency_penalty above 2", with(r#""frequency_penalty":2.5"#), "'frequency_penalty' must be between -2 and 2"),
            ("a negative repetition_penalty", with(r#""repetition_penalty":-0.1"#), "'repetition_penalty' must be a number above 0"),
            ("a zero repetition_penalty", with(r#""repetition_penalty":0"#), "'repetition_penalty' must be a number above 0"),
            ("n of 0", with(r#""n":0"#), "'n' must be at least 1, got 0"),
            ("top_k -2", with(r#""top_k":-2"#), "'top_k' must be an integer of at least -1"),
            ("a fractional top_k", with(r#""top_k":1.5"#), "'top_k' must be an integer of at least -1"),
            ("a stop string that is no string", with(r#""stop":["a",1]"#), "'stop' must be a string or a list of strings"),
            ("a stop object", with(r#""stop":{"a":1}"#), "'stop' must be a string"),
        ];
        for (name, body, message) in cases {
            let error = err(&body);
            assert!(error.message.starts_with(message), "{name}: {error}");
        }
        #[rustfmt::skip]
        let accepted: Vec<(&str, String)> = vec![
            ("the output cap itself", with(r#""max_tokens":16777216"#)),
            ("n at its lower bound", with(r#""n":1"#)),
            ("n of a thousand (the engine has its own limit)", with(r#""n":1000"#)),
            ("top_k -1 (off)", with(r#""top_k":-1"#)),
            ("top_k 0 (off, as vLLM prefers)", with(r#""top_k":0"#)),
            ("top_k 1", with(r#""top_k":1"#)),
            ("temperature, top_p and min_p at a bound", with(r#""temperature":0,"top_p":1,"min_p":0"#)),
            ("penalties at their bounds", with(r#""presence_penalty":-2,"frequency_penalty":2,"repetition_penalty":2"#)),
            ("a repetition penalty above 2, as vLLM takes", with(r#""repetition_penalty":2.5"#)),
            ("seventeen stop strings (the engine has its own limit)", with(&format!(r#""stop":[{seventeen}]"#))),
            ("one stop string", with(r#""stop":"\n""#)),
            ("nulls for every optional field", with(
                r#""stream":null,"stream_options":null,"max_tokens":null,"temperature":null,"n":null,"top_k":null,"stop":null"#)),
            ("stream options", with(r#""stream":true,"stream_options":{"include_usage":true}"#)),
            ("null and array contents", r#"{"model":"m","messages":[{"role":"assistant","content":null},
                {"role":"user","content":[{"type":"text","text":"x"}]}]}"#.into()),
            ("fields the router does not read", with(r#""tools":[],"seed":1,"logprobs":true"#)),
        ];
        for (name, body) in accepted {
            let parsed = parse_request(Endpoint::Chat, body.as_bytes(), 4);
            assert!(parsed.is_ok(), "{name}: {:?}", parsed.err());
        }
    }
}
