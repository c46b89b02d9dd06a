//! Reading the JSON bodies of `/v1/completions` and `/generate` field by field, so that every
//! 400 names the field at fault (`prompt[2][0]`, `sampling_params.max_new_tokens`): typed
//! scalars, prompts given as text or token ids (single or batched, ids checked against the
//! vocabulary), and the PD bootstrap fields with a room per run.

use serde_json::{Map, Value};

use super::error::ApiError;
use super::generation::{Bootstrap, Input};

/// A JSON object and the path that names its fields in errors.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fields<'a> {
    map: &'a Map<String, Value>,
    path: &'a str,
}

fn bad(message: String) -> ApiError {
    ApiError::bad_request(message)
}

/// The request body as a JSON object.
pub(crate) fn body(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(bad("invalid request body: not a JSON object".to_owned())),
        Err(e) => Err(bad(format!("invalid request body: {e}"))),
    }
}

impl<'a> Fields<'a> {
    /// The fields of a request body.
    pub(crate) fn top(map: &'a Map<String, Value>) -> Self {
        Self { map, path: "" }
    }

    /// `value` as an object named `path`.
    pub(crate) fn of(value: &'a Value, path: &'a str) -> Result<Self, ApiError> {
        match value {
            Value::Object(map) => Ok(Self { map, path }),
            _ => Err(bad(format!("{path} must be an object"))),
        }
    }

    /// The full name of field `name`.
    pub(crate) fn name(&self, name: &str) -> String {
        if self.path.is_empty() { name.to_owned() } else { format!("{}.{name}", self.path) }
    }

    /// Field `name`, absent when missing or `null`.
    pub(crate) fn get(&self, name: &str) -> Option<&'a Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    pub(crate) fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.get(name)
            .map(|v| {
                v.as_bool().ok_or_else(|| bad(format!("{} must be a boolean", self.name(name))))
            })
            .transpose()
    }

    pub(crate) fn str(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        self.get(name)
            .map(|v| v.as_str().ok_or_else(|| bad(format!("{} must be a string", self.name(name)))))
            .transpose()
    }

    pub(crate) fn u64(&self, name: &str) -> Result<Option<u64>, ApiError> {
        self.get(name)
            .map(|v| {
                v.as_u64().ok_or_else(|| {
                    bad(format!("{} must be a non-negative integer", self.name(name)))
                })
            })
            .transpose()
    }

    pub(crate) fn f64(&self, name: &str) -> Result<Option<f64>, ApiError> {
        self.get(name)
            .map(|v| v.as_f64().ok_or_else(|| bad(format!("{} must be a number", self.name(name)))))
            .transpose()
    }

    /// An output limit: absent, or an integer of at least 1.
    pub(crate) fn limit(&self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.get(name).map(Value::as_i64) {
            None => Ok(None),
            Some(Some(n)) if n >= 1 => Ok(Some(n as u64)),
            Some(_) => Err(bad(format!("{} must be an integer of at least 1", self.name(name)))),
        }
    }
}

/// Which prompt forms a field takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Forms {
    /// A string or a list of strings.
    Text,
    /// A list of token ids or a list of lists of them.
    Ids,
    /// Any of the four (OpenAI's `prompt`).
    Any,
}

impl Forms {
    fn describe(self) -> &'static str {
        match self {
            Forms::Text => "a string or a list of strings",
            Forms::Ids => "a list of token ids or a list of lists of token ids",
            Forms::Any => {
                "a string, a list of strings, a list of token ids or a list of lists of token ids"
            }
        }
    }
}

/// Prompts given in `value` (field `field`): one for a string or a flat list of ids, one per
/// element for a list of strings or of id lists; `true` for the batch forms. Empty prompts,
/// empty lists, mixed lists and ids of `vocab_size` or more are refused.
pub(crate) fn prompts(
    value: &Value,
    field: &str,
    forms: Forms,
    vocab_size: usize,
) -> Result<(Vec<Input>, bool), ApiError> {
    let wrong = || bad(format!("{field} must be {}", forms.describe()));
    let text_ok = forms != Forms::Ids;
    let ids_ok = forms != Forms::Text;
    match value {
        Value::String(text) if text_ok => Ok((vec![text_prompt(text, field)?], false)),
        Value::Array(items) if items.is_empty() => Err(bad(format!("{field} must not be empty"))),
        Value::Array(items) => {
            let all = |f: fn(&Value) -> bool| items.iter().all(f);
            if text_ok && all(Value::is_string) {
                let prompts = items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        text_prompt(v.as_str().unwrap_or_default(), &format!("{field}[{i}]"))
                    })
                    .collect::<Result<_, _>>()?;
                Ok((prompts, true))
            } else if ids_ok && all(Value::is_number) {
                Ok((vec![Input::Ids(token_ids(items, field, vocab_size)?)], false))
            } else if ids_ok && all(Value::is_array) {
                let prompts = items
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let ids = v.as_array().map(Vec::as_slice).unwrap_or_default();
                        token_ids(ids, &format!("{field}[{i}]"), vocab_size).map(Input::Ids)
                    })
                    .collect::<Result<_, _>>()?;
                Ok((prompts, true))
            } else if [Value::is_string, Value::is_number, Value::is_array]
                .iter()
                .filter(|kind| items.iter().any(kind))
                .count()
                > 1
            {
                Err(bad(format!("{field} mixes types: it must be {}", forms.describe())))
            } else {
                Err(wrong())
            }
        }
        _ => Err(wrong()),
    }
}

fn text_prompt(text: &str, field: &str) -> Result<Input, ApiError> {
    if text.is_empty() {
        return Err(bad(format!("{field} must not be empty")));
    }
    Ok(Input::Text(text.to_owned()))
}

/// A non-empty list of token ids below `vocab_size`.
fn token_ids(items: &[Value], field: &str, vocab_size: usize) -> Result<Vec<u32>, ApiError> {
    if items.is_empty() {
        return Err(bad(format!("{field} must not be empty")));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v.as_u64() {
            Some(id) if id < vocab_size as u64 => Ok(id as u32),
            Some(id) => Err(bad(format!(
                "{field}[{i}] = {id} is out of the vocabulary (token ids are below {vocab_size})"
            ))),
            None => Err(bad(format!("{field}[{i}] must be a token id (an integer from 0)"))),
        })
        .collect()
}

/// Most runs (prompts × choices) one request may ask for.
pub(crate) const MAX_RUNS: u64 = 1024;

/// The runs of `prompts` prompts with `n` choices each, at most [`MAX_RUNS`].
pub(crate) fn runs(prompts: usize, n: u64) -> Result<usize, ApiError> {
    match (prompts as u64).checked_mul(n) {
        Some(runs) if runs <= MAX_RUNS => Ok(runs as usize),
        _ => Err(bad(format!(
            "{prompts} prompts with n = {n} choices each make more than {MAX_RUNS} runs"
        ))),
    }
}

/// The PD bootstrap fields, all three or none. `bootstrap_room` is one room per run, or a
/// single room from which run `k` takes `room + k` (SGLang's expansion of a batch).
pub(crate) fn bootstrap(fields: Fields<'_>, runs: usize) -> Result<Option<Bootstrap>, ApiError> {
    let host = fields.str("bootstrap_host")?;
    let port = fields
        .u64("bootstrap_port")?
        .map(|port| {
            u16::try_from(port).map_err(|_| bad("bootstrap_port must be a port number".into()))
        })
        .transpose()?;
    let room = fields.get("bootstrap_room");
    let (host, port, room) = match (host, port, room) {
        (Some(host), Some(port), Some(room)) => (host, port, room),
        (None, None, None) => return Ok(None),
        _ => {
            return Err(bad(
                "bootstrap_host, bootstrap_port and bootstrap_room go together".to_owned()
            ));
        }
    };
    let room_error = || bad("bootstrap_room must be a room number or a list of them".to_owned());
    let rooms = match room {
        Value::Array(rooms) => {
            if rooms.len() != runs {
                return Err(bad(format!(
                    "bootstrap_room lists {} rooms for {runs} runs (one per prompt and choice)",
                    rooms.len()
                )));
            }
            rooms.iter().map(|r| r.as_u64().ok_or_else(room_error)).collect::<Result<_, _>>()?
        }
        room => {
            let first = room.as_u64().ok_or_else(room_error)?;
            (0..runs as u64)
                .map(|k| first.checked_add(k).ok_or_else(room_error))
                .collect::<Result<_, _>>()?
        }
    };
    Ok(Some(Bootstrap { host: host.to_owned(), port, rooms }))
}

#[cfg(test)]
mod tests;
