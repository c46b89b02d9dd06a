//! Worker labels: the operator's free-form string facts about an engine (`rack: r1`,
//! `transfer: mooncake`, `tp: "8"`), which PD buckets pair on.
//!
//! Values must be strings in the configuration and the admin API alike: a YAML `tp: 8` or a
//! JSON `{"tp": 8}` is refused (with the field path, added by the caller's deserializer), so that
//! `8`, `08` and `8.0` can never silently compare equal or unequal.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

/// A worker's labels, sorted by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct WorkerLabels(BTreeMap<String, String>);

impl WorkerLabels {
    /// No labels.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of label `name`, if the worker has it.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Every label, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(name, value)| (name.as_str(), value.as_str()))
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for WorkerLabels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Self {
        Self(pairs.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
    }
}

impl<'de> Deserialize<'de> for WorkerLabels {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(LabelsVisitor)
    }
}

struct LabelsVisitor;

impl<'de> Visitor<'de> for LabelsVisitor {
    type Value = WorkerLabels;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of label names to string values")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut labels = BTreeMap::new();
        while let Some(Strict(name)) = map.next_key::<Strict>()? {
            let Strict(value) = map.next_value::<Strict>()?;
            if labels.insert(name.clone(), value).is_some() {
                return Err(de::Error::custom(format_args!("label {name:?} is given twice")));
            }
        }
        Ok(WorkerLabels(labels))
    }
}

/// A label name or value: a string and nothing else (no number, boolean, null or list).
struct Strict(String);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // `deserialize_any`, not `deserialize_string`: YAML would hand a plain `8` or `true` to
        // a string visitor as text, which is exactly what is refused here.
        deserializer.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl Visitor<'_> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string (quote numbers and booleans: \"8\")")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Self::Value, E> {
        Ok(Strict(value.to_owned()))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Self::Value, E> {
        Ok(Strict(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_values_are_taken_in_name_order() {
        let labels: WorkerLabels =
            serde_json::from_str(r#"{"rack": "r1", "tp": "8", "empty": ""}"#).expect("strings");
        let pairs: Vec<_> = labels.iter().collect();
        assert_eq!(pairs, [("empty", ""), ("rack", "r1"), ("tp", "8")]);
        assert_eq!((labels.get("rack"), labels.get("zone")), (Some("r1"), None));
        assert_eq!(
            serde_json::to_string(&labels).expect("ser"),
            r#"{"empty":"","rack":"r1","tp":"8"}"#
        );
    }

    #[test]
    fn anything_but_a_string_value_is_refused() {
        for value in ["8", "8.5", "true", "null", r#"["a"]"#, r#"{"a": "b"}"#] {
            let json = format!(r#"{{"rack": {value}}}"#);
            let err = serde_json::from_str::<WorkerLabels>(&json).expect_err(&json).to_string();
            assert!(err.contains("expected a string"), "{json}: {err}");
        }
        let err = serde_json::from_str::<WorkerLabels>(r#"["rack"]"#).expect_err("a list");
        assert!(err.to_string().contains("a map of label names"), "{err}");
    }

    #[test]
    fn a_repeated_name_is_refused() {
        let err = serde_json::from_str::<WorkerLabels>(r#"{"rack": "a", "rack": "b"}"#)
            .expect_err("twice");
        assert!(err.to_string().contains("\"rack\" is given twice"), "{err}");
    }
}
