//! Label selectors in Kubernetes' text syntax (`app=sglang,tier in (gpu,tpu),!canary`), parsed
//! and checked before anything is sent, so that a selector the API server would reject is a
//! configuration error naming it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use kube::core::{Expression, Selector, SelectorExt};

/// A parsed label selector: what the watch sends as `labelSelector`, and what the router
/// matches pods against itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelSelector {
    selector: Selector,
}

/// Why a selector does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("label selector {selector:?}: {reason}")]
pub struct SelectorError {
    /// The selector as given.
    pub selector: String,
    /// What is wrong with it.
    pub reason: String,
}

impl LabelSelector {
    /// Parses `text`: comma-separated requirements `key=value`, `key==value`, `key!=value`,
    /// `key in (v1,v2)`, `key notin (v1,v2)`, `key` (exists) and `!key` (absent). Keys are
    /// qualified names (an optional DNS-subdomain prefix and `/`, then at most 63 of
    /// `[A-Za-z0-9_.-]` starting and ending alphanumeric); values are empty or the same
    /// characters. An empty selector, which would select every pod of the namespace, is
    /// refused.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let fail = |reason: String| SelectorError { selector: text.to_owned(), reason };
        let mut expressions = Vec::new();
        for requirement in split_requirements(text).map_err(|r| fail(r.to_owned()))? {
            expressions.push(parse_requirement(requirement).map_err(fail)?);
        }
        if expressions.is_empty() {
            return Err(fail("an empty selector would select every pod of the namespace".into()));
        }
        Ok(Self { selector: expressions.into_iter().collect() })
    }

    /// Whether a pod with `labels` is selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.matches(labels)
    }

    /// The selector as kube sends it.
    pub fn selector(&self) -> &Selector {
        &self.selector
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.selector.fmt(f)
    }
}

/// Splits at the commas outside parentheses.
fn split_requirements(text: &str) -> Result<Vec<&str>, &'static str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0u32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' if depth == 0 => depth = 1,
            '(' => return Err("nested parentheses"),
            ')' if depth == 1 => depth = 0,
            ')' => return Err("a ')' without its '('"),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a '(' without its ')'");
    }
    parts.push(&text[start..]);
    if parts.len() == 1 && parts[0].trim().is_empty() {
        return Ok(Vec::new());
    }
    if parts.iter().any(|p| p.trim().is_empty()) {
        return Err("an empty requirement between commas");
    }
    Ok(parts)
}

fn parse_requirement(text: &str) -> Result<Expression, String> {
    let text = text.trim();
    if let Some((key, values)) = split_set(text, "notin")? {
        return Ok(Expression::NotIn(key, values));
    }
    if let Some((key, values)) = split_set(text, "in")? {
        return Ok(Expression::In(key, values));
    }
    if let Some((key, value)) = text.split_once("!=") {
        return Ok(Expression::NotEqual(check_key(key)?, check_value(value)?));
    }
    if let Some((key, value)) = text.split_once("==").or_else(|| text.split_once('=')) {
        return Ok(Expression::Equal(check_key(key)?, check_value(value)?));
    }
    if let Some(key) = text.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(check_key(key)?));
    }
    Ok(Expression::Exists(check_key(text)?))
}

/// `key op (v1, v2)` when `text` has that shape.
fn split_set(text: &str, op: &str) -> Result<Option<(String, BTreeSet<String>)>, String> {
    let Some(open) = text.find('(') else { return Ok(None) };
    let head = text[..open].trim_end();
    let Some(key) = head.strip_suffix(op).filter(|k| k.ends_with(char::is_whitespace)) else {
        return Ok(None);
    };
    let Some(inner) = text[open + 1..].trim_end().strip_suffix(')') else {
        return Err(format!("{text:?}: expected ')' at the end"));
    };
    let values: BTreeSet<String> = inner.split(',').map(check_value).collect::<Result<_, _>>()?;
    if inner.trim().is_empty() {
        return Err(format!("{text:?}: a set needs at least one value"));
    }
    Ok(Some((check_key(key)?, values)))
}

fn check_key(key: &str) -> Result<String, String> {
    let key = key.trim();
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let valid_label = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(valid_label) {
            return Err(format!("key {key:?}: the prefix must be a DNS subdomain"));
        }
    }
    if name.is_empty() {
        return Err(format!("key {key:?} is empty"));
    }
    check_name(name).map_err(|why| format!("key {key:?}: {why}"))?;
    Ok(key.to_owned())
}

fn check_value(value: &str) -> Result<String, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(String::new());
    }
    check_name(value).map_err(|why| format!("value {value:?}: {why}"))?;
    Ok(value.to_owned())
}

/// At most 63 characters of `[A-Za-z0-9_.-]`, starting and ending alphanumeric.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.len() > 63 {
        return Err("longer than 63 characters");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
        return Err("only letters, digits, '-', '_' and '.' are allowed");
    }
    let alnum = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    if !alnum(name.bytes().next()) || !alnum(name.bytes().last()) {
        return Err("must start and end with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn selectors_parse_to_what_kubernetes_means_by_them() {
        let pod = labels(&[("app", "sglang"), ("sglang.ai/role", "prefill"), ("tier", "gpu")]);
        // (selector, its canonical form, whether it selects the pod)
        for (text, canonical, selects) in [
            ("app=sglang", "app=sglang", true),
            (" app == sglang , tier=gpu ", "app=sglang,tier=gpu", true),
            ("sglang.ai/role=prefill", "sglang.ai/role=prefill", true),
            ("app!=sglang", "app!=sglang", false),
            ("tier in (gpu, tpu)", "tier in (gpu,tpu)", true),
            ("tier notin (gpu)", "tier notin (gpu)", false),
            ("app,!canary", "app,!canary", true),
            ("canary", "canary", false),
            ("app=", "app=", false),
            ("app=sglang,tier in (cpu)", "app=sglang,tier in (cpu)", false),
        ] {
            let selector = LabelSelector::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(selector.to_string(), canonical, "{text}");
            assert_eq!(selector.matches(&pod), selects, "{text}");
        }
    }

    #[test]
    fn a_selector_the_api_server_would_reject_is_an_error_naming_it() {
        for (text, mention) in [
            ("", "empty selector"),
            ("  ", "empty selector"),
            ("app=sglang,", "empty requirement"),
            ("tier in (gpu", "'('"),
            ("tier in gpu)", "')'"),
            ("tier in ()", "at least one value"),
            ("app=sg lang", "only letters"),
            ("-app=x", "start and end"),
            ("Bad_Prefix/app=x", "DNS subdomain"),
            ("/app=x", "DNS subdomain"),
            ("app=x=y", "only letters"),
            (&format!("app={}", "v".repeat(64)), "63"),
        ] {
            let err = LabelSelector::parse(text).expect_err(text);
            assert_eq!(err.selector, text);
            assert!(err.to_string().contains(mention), "{text}: {err}");
        }
    }
}
