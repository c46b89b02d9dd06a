//! Parsing and validating an OpenAI chat completion request.
//!
//! The body is parsed once into a JSON value (serde_json caps nesting depth, so hostile
//! nesting is an error, not a stack overflow), then the fields the router relies on or that an
//! engine would reject are checked, each error naming its field.

use serde_json::{Map, Value};

/// A request that failed validation: a 400 naming what is wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{message}")]
pub(crate) struct InvalidRequest {
    /// What is wrong, naming the field.
    pub message: String,
    /// The offending parameter, when there is one.
    pub param: Option<String>,
}

impl InvalidRequest {
    fn field(param: &str, what: impl std::fmt::Display) -> Self {
        Self { message: format!("'{param}' {what}"), param: Some(param.to_owned()) }
    }
}

/// The fields of a chat request the router reads. The body itself is forwarded unchanged.
#[derive(Debug)]
pub struct ChatRequest {
    /// The whole parsed body.
    pub body: Map<String, Value>,
    /// `model`.
    pub model: String,
    /// `stream`, false when absent.
    pub stream: bool,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_output_tokens: Option<u64>,
}

impl ChatRequest {
    /// `messages` (validated to be a non-empty array of objects).
    pub fn messages(&self) -> &[Value] {
        self.body.get("messages").and_then(Value::as_array).map_or(&[], Vec::as_slice)
    }
}

/// Upper bound accepted for `max_tokens`; anything larger is a client error, not a budget.
const MAX_OUTPUT_TOKENS: u64 = 1 << 24;

/// Parses and validates a chat completion body.
pub(crate) fn parse_chat_request(body: &[u8]) -> Result<ChatRequest, InvalidRequest> {
    let value: Value = serde_json::from_slice(body).map_err(|err| InvalidRequest {
        message: format!("request body is not valid JSON: {err}"),
        param: None,
    })?;
    let Value::Object(body) = value else {
        return Err(InvalidRequest {
            message: "request body must be a JSON object".to_owned(),
            param: None,
        });
    };

    let model = match body.get("model") {
        Some(Value::String(model)) if !model.is_empty() => model.clone(),
        Some(Value::String(_)) => return Err(InvalidRequest::field("model", "must not be empty")),
        Some(_) => return Err(InvalidRequest::field("model", "must be a string")),
        None => return Err(InvalidRequest::field("model", "is required")),
    };
    validate_messages(body.get("messages"))?;

    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(stream)) => *stream,
        Some(_) => return Err(InvalidRequest::field("stream", "must be a boolean")),
    };
    if let Some(options) = body.get("stream_options")
        && !options.is_null()
        && !options.is_object()
    {
        return Err(InvalidRequest::field("stream_options", "must be an object"));
    }

    let max_tokens = optional_count(&body, "max_tokens")?;
    let max_completion_tokens = optional_count(&body, "max_completion_tokens")?;
    optional_range(&body, "temperature", 0.0, 2.0)?;
    optional_range(&body, "top_p", 0.0, 1.0)?;
    optional_range(&body, "min_p", 0.0, 1.0)?;
    optional_range(&body, "presence_penalty", -2.0, 2.0)?;
    optional_range(&body, "frequency_penalty", -2.0, 2.0)?;
    optional_range(&body, "repetition_penalty", 0.0, 2.0)?;
    if let Some(n) = optional_count(&body, "n")?
        && !(1..=128).contains(&n)
    {
        return Err(InvalidRequest::field("n", format!("must be between 1 and 128, got {n}")));
    }
    if let Some(top_k) = body.get("top_k").filter(|v| !v.is_null()) {
        match top_k.as_i64() {
            Some(k) if k == -1 || k >= 1 => {}
            _ => return Err(InvalidRequest::field("top_k", "must be -1 or a positive integer")),
        }
    }
    if let Some(stop) = body.get("stop") {
        let ok = match stop {
            Value::Null | Value::String(_) => true,
            Value::Array(items) => items.len() <= 16 && items.iter().all(Value::is_string),
            _ => false,
        };
        if !ok {
            return Err(InvalidRequest::field("stop", "must be a string or up to 16 strings"));
        }
    }

    Ok(ChatRequest { model, stream, max_output_tokens: max_completion_tokens.or(max_tokens), body })
}

fn validate_messages(messages: Option<&Value>) -> Result<(), InvalidRequest> {
    let messages = match messages {
        Some(Value::Array(messages)) if !messages.is_empty() => messages,
        Some(Value::Array(_)) => {
            return Err(InvalidRequest::field("messages", "must not be empty"));
        }
        Some(_) => return Err(InvalidRequest::field("messages", "must be an array")),
        None => return Err(InvalidRequest::field("messages", "is required")),
    };
    for (i, message) in messages.iter().enumerate() {
        let Some(message) = message.as_object() else {
            return Err(InvalidRequest::field(&format!("messages[{i}]"), "must be an object"));
        };
        match message.get("role") {
            Some(Value::String(_)) => {}
            _ => {
                return Err(InvalidRequest::field(
                    &format!("messages[{i}].role"),
                    "must be a string",
                ));
            }
        }
        match message.get("content") {
            None | Some(Value::Null | Value::String(_) | Value::Array(_)) => {}
            Some(_) => {
                return Err(InvalidRequest::field(
                    &format!("messages[{i}].content"),
                    "must be a string, an array of parts or null",
                ));
            }
        }
    }
    Ok(())
}

/// A non-negative integer field, when present and not null.
fn optional_count(body: &Map<String, Value>, field: &str) -> Result<Option<u64>, InvalidRequest> {
    match body.get(field) {
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
    body: &Map<String, Value>,
    field: &str,
    min: f64,
    max: f64,
) -> Result<(), InvalidRequest> {
    match body.get(field) {
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
        parse_chat_request(body.as_bytes()).expect_err(body)
    }

    #[test]
    fn accepts_a_plain_request() {
        let req = parse_chat_request(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#,
        )
        .expect("valid");
        assert_eq!(req.model, "m");
        assert!(!req.stream);
        assert_eq!(req.max_output_tokens, Some(8));
        assert_eq!(req.messages().len(), 1);
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let req = parse_chat_request(
            br#"{"model":"m","messages":[{"role":"user","content":"x"}],
                "max_tokens":8,"max_completion_tokens":3,"stream":true}"#,
        )
        .expect("valid");
        assert_eq!(req.max_output_tokens, Some(3));
        assert!(req.stream);
    }

    #[test]
    fn each_bad_field_is_named() {
        let m = r#""model":"m","messages":[{"role":"user","content":"x"}]"#;
        let cases = [
            ("{", None),
            ("[]", None),
            (r#"{"model":"m","messages":[]} trailing"#, None),
            (r#"{"messages":[{"role":"user","content":"x"}]}"#, Some("model")),
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
            (&format!(r#"{{{m},"top_k":0}}"#), Some("top_k")),
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

    #[test]
    fn every_checked_field_says_what_is_wrong_with_it() {
        let m = r#""model":"m","messages":[{"role":"user","content":"x"}]"#;
        let with = |extra: &str| format!("{{{m},{extra}}}");
        let sixteen = vec!["\"s\""; 16].join(",");
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
            ("a negative repetition_penalty", with(r#""repetition_penalty":-0.1"#), "'repetition_penalty' must be between 0 and 2"),
            ("n above 128", with(r#""n":129"#), "'n' must be between 1 and 128, got 129"),
            ("top_k -2", with(r#""top_k":-2"#), "'top_k' must be -1 or a positive integer"),
            ("a fractional top_k", with(r#""top_k":1.5"#), "'top_k' must be -1 or a positive integer"),
            ("seventeen stop strings", with(&format!(r#""stop":[{seventeen}]"#)), "'stop' must be a string or up to 16 strings"),
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
            ("n at its upper bound", with(r#""n":128"#)),
            ("top_k -1 (off)", with(r#""top_k":-1"#)),
            ("top_k 1", with(r#""top_k":1"#)),
            ("temperature, top_p and min_p at a bound", with(r#""temperature":0,"top_p":1,"min_p":0"#)),
            ("penalties at their bounds", with(r#""presence_penalty":-2,"frequency_penalty":2,"repetition_penalty":2"#)),
            ("sixteen stop strings", with(&format!(r#""stop":[{sixteen}]"#))),
            ("one stop string", with(r#""stop":"\n""#)),
            ("nulls for every optional field", with(
                r#""stream":null,"stream_options":null,"max_tokens":null,"temperature":null,"n":null,"top_k":null,"stop":null"#)),
            ("stream options", with(r#""stream":true,"stream_options":{"include_usage":true}"#)),
            ("null and array contents", r#"{"model":"m","messages":[{"role":"assistant","content":null},
                {"role":"user","content":[{"type":"text","text":"x"}]}]}"#.into()),
            ("fields the router does not read", with(r#""tools":[],"seed":1,"logprobs":true"#)),
        ];
        for (name, body) in accepted {
            let parsed = parse_chat_request(body.as_bytes());
            assert!(parsed.is_ok(), "{name}: {:?}", parsed.err());
        }
    }
}
