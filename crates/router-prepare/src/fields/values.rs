//! The values of the fields validation reads, built as JSON values within a budget of nodes
//! per body ([`budget`]): a JSON value costs some seventy bytes per node whatever its text, so a
//! field sent as a long list of tiny items would otherwise cost tens of times its body. Past
//! the budget nothing more is built (the rest is only walked, its text measured) and the field
//! is reported as too large. `sampling_params` keeps only the members validation reads; the
//! others (a `logit_bias` of the whole vocabulary, `stop_token_ids`, a JSON schema) are walked.

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::Walk;

/// Nodes built for any body, however small.
const BASE_NODES: usize = 16 * 1024;

/// Body bytes per further node: a node costs about this many bytes, so the values of a body
/// cost at most about its own size beyond the base.
const BYTES_PER_NODE: usize = 64;

/// The nodes the read fields of a body of `len` bytes may build together.
pub(super) fn budget(len: usize) -> usize {
    BASE_NODES + len / BYTES_PER_NODE
}

/// The members of `sampling_params` that validation reads.
pub(super) const SAMPLING_READ: &[&str] = &[
    "max_new_tokens",
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "n",
    "top_k",
    "stop",
];

/// A value as read: built unless the budget ran out, and the length of its text (string
/// values at any depth, members that were only walked included).
#[derive(Debug)]
pub(super) struct Built {
    pub value: Option<Value>,
    pub text: usize,
}

/// Builds a value within the nodes `left`; objects at its level (and at its items' level,
/// for a list) keep only the keys of `keep`, when given.
#[derive(Clone, Copy)]
pub(super) struct Bounded<'b> {
    pub left: &'b Cell<usize>,
    pub keep: Option<&'static [&'static str]>,
}

impl Bounded<'_> {
    /// Takes `nodes` from the budget; once it fails, every later take fails too.
    fn take(&self, nodes: usize) -> bool {
        match self.left.get().checked_sub(nodes) {
            Some(left) => {
                self.left.set(left);
                true
            }
            None => {
                self.left.set(0);
                false
            }
        }
    }

    /// A scalar `value` with `text` bytes of text.
    pub(super) fn scalar(&self, value: Value, text: usize) -> Built {
        Built { value: self.take(1).then_some(value), text }
    }

    fn inner(&self) -> Self {
        Bounded { left: self.left, keep: None }
    }
}

impl<'de> DeserializeSeed<'de> for Bounded<'_> {
    type Value = Built;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Built, D::Error> {
        if self.left.get() == 0 {
            // Past the budget: walked without a single allocation.
            let walked = Walk::ANY.deserialize(deserializer)?;
            return Ok(Built { value: None, text: walked.text });
        }
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Bounded<'_> {
    type Value = Built;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Built, E> {
        Ok(self.scalar(Value::Null, 0))
    }

    fn visit_bool<E>(self, b: bool) -> Result<Built, E> {
        Ok(self.scalar(Value::Bool(b), 0))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Built, E> {
        Ok(self.scalar(Value::from(n), 0))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Built, E> {
        Ok(self.scalar(Value::from(n), 0))
    }

    fn visit_f64<E>(self, x: f64) -> Result<Built, E> {
        Ok(self.scalar(Value::from(x), 0))
    }

    fn visit_str<E>(self, text: &str) -> Result<Built, E> {
        // The budget is taken first: past it, no copy of the text is made.
        let value = self.take(1).then(|| Value::String(text.to_owned()));
        Ok(Built { value, text: text.len() })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Built, A::Error> {
        let mut built = self.take(1).then(Vec::new);
        let mut text = 0;
        while let Some(item) = items.next_element_seed(self)? {
            text += item.text;
            match (&mut built, item.value) {
                (Some(values), Some(value)) => values.push(value),
                _ => built = None,
            }
        }
        Ok(Built { value: built.map(Value::Array), text })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Built, A::Error> {
        let mut built = self.take(1).then(Map::new);
        let mut text = 0;
        while let Some(key) = members.next_key_seed(KeptKey { keep: self.keep })? {
            let Some(key) = key else {
                text += members.next_value_seed(Walk::ANY)?.text;
                continue;
            };
            let value = members.next_value_seed(self.inner())?;
            text += value.text;
            match (&mut built, value.value) {
                (Some(map), Some(value)) if self.take(1) => {
                    map.insert(key, value);
                }
                _ => built = None,
            }
        }
        Ok(Built { value: built.map(Value::Object), text })
    }
}

/// An object's key, when it is to be kept.
struct KeptKey {
    keep: Option<&'static [&'static str]>,
}

impl<'de> DeserializeSeed<'de> for KeptKey {
    type Value = Option<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for KeptKey {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.keep.is_none_or(|keep| keep.contains(&key)).then(|| key.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounded(text: &str, nodes: usize, keep: Option<&'static [&'static str]>) -> Built {
        let left = Cell::new(nodes);
        let mut deserializer = serde_json::Deserializer::from_str(text);
        Bounded { left: &left, keep }.deserialize(&mut deserializer).expect("JSON")
    }

    #[test]
    fn a_value_within_the_budget_is_the_value_serde_builds() {
        let text = r#"{"a":[1,-2,3.5,"x",null,true],"b":{"c":"d"},"a":{"e":[]}}"#;
        let built = bounded(text, 64, None);
        assert_eq!(built.value, Some(serde_json::from_str::<Value>(text).expect("JSON")));
        assert_eq!(built.text, 1 + 1);
    }

    #[test]
    fn past_the_budget_nothing_is_built_and_the_text_is_still_measured() {
        let text = r#"["ab","cd","ef"]"#;
        // The list and its three strings are four nodes.
        assert!(bounded(text, 4, None).value.is_some());
        let over = bounded(text, 3, None);
        assert_eq!((over.value, over.text), (None, 6));
        let left = Cell::new(2);
        let bounded = Bounded { left: &left, keep: None };
        assert!(bounded.scalar(Value::Null, 0).value.is_some());
        assert!(!bounded.take(2), "more than is left");
        assert!(!bounded.take(1), "and nothing after that");
    }

    #[test]
    fn kept_keys_filter_objects_at_the_first_level_and_in_a_list() {
        let keep: &'static [&'static str] = &["n", "stop"];
        let built = bounded(r#"{"n":2,"logit_bias":{"1":5},"stop":{"x":"y"}}"#, 64, Some(keep));
        assert_eq!(built.value, Some(serde_json::json!({"n": 2, "stop": {"x": "y"}})));
        assert_eq!(built.text, 1);
        let built = bounded(r#"[{"n":1,"regex":"abc"},{"top_k":3}]"#, 64, Some(keep));
        assert_eq!(built.value, Some(serde_json::json!([{"n": 1}, {}])));
        assert_eq!(built.text, 3);
    }
}
