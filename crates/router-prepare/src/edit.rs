//! Rewriting a body's top-level members without building it: the members the router keeps go
//! out as the client wrote them (each one's text borrowed from the body, never parsed into a
//! value), those it removes are left out, those it sets are written after them. The cost is
//! a copy of the body and one entry per top-level member, whatever the body holds.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

/// `body`, a JSON object, without its members named in `remove` and with `set` written after
/// the rest (a member of the same name the body holds is removed). Every other member keeps
/// its text, number digits and key order, repeats included.
pub fn edit_members(
    body: &[u8],
    remove: &[&str],
    set: &[(&str, Value)],
) -> Result<Bytes, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let members = deserializer.deserialize_map(Members)?;
    deserializer.end()?;
    let dropped = |key: &str| remove.contains(&key) || set.iter().any(|(name, _)| *name == key);
    let mut out = Vec::with_capacity(body.len() + 64 * set.len());
    out.push(b'{');
    for (key, value) in members.iter().filter(|(key, _)| !dropped(key)) {
        member(&mut out, key, |out| out.extend_from_slice(value.get().as_bytes()))?;
    }
    for (key, value) in set {
        member(&mut out, key, |out| {
            serde_json::to_writer(out, value).expect("a JSON value writes to a buffer");
        })?;
    }
    out.push(b'}');
    Ok(Bytes::from(out))
}

/// Appends `"key":value` to `out`, after a comma unless it is the first member.
fn member(
    out: &mut Vec<u8>,
    key: &str,
    value: impl FnOnce(&mut Vec<u8>),
) -> Result<(), serde_json::Error> {
    if out.len() > 1 {
        out.push(b',');
    }
    serde_json::to_writer(&mut *out, key)?;
    out.push(b':');
    value(out);
    Ok(())
}

/// An object's members, each key with its value's text.
struct Members;

impl<'de> Visitor<'de> for Members {
    type Value = Vec<(Cow<'de, str>, &'de RawValue)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::new();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            members.push((key, map.next_value::<&'de RawValue>()?));
        }
        Ok(members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edited(body: &str, remove: &[&str], set: &[(&str, Value)]) -> String {
        let edited = edit_members(body.as_bytes(), remove, set).expect("a JSON object");
        String::from_utf8(edited.to_vec()).expect("UTF-8")
    }

    #[test]
    fn kept_members_keep_their_text_and_set_ones_come_last() {
        let body = r#"{ "a" : 1.50, "bootstrap_room":7, "b\u0041":[1, 2],"c":{"d":"\u00e9"} }"#;
        assert_eq!(
            edited(body, &["bootstrap_room"], &[("rank", Value::from(3))]),
            r#"{"a":1.50,"bA":[1, 2],"c":{"d":"\u00e9"},"rank":3}"#
        );
    }

    #[test]
    fn a_set_member_replaces_every_one_of_its_name_and_repeats_of_others_stay() {
        let body = r#"{"x":1,"room":1,"x":2,"room":2}"#;
        assert_eq!(edited(body, &[], &[("room", Value::from(9))]), r#"{"x":1,"x":2,"room":9}"#);
        assert_eq!(edited(r#"{"room":1}"#, &["room"], &[]), "{}");
    }

    #[test]
    fn what_is_no_object_is_an_error() {
        for body in ["[1]", "{\"a\":}", "{} x", ""] {
            assert!(edit_members(body.as_bytes(), &[], &[]).is_err(), "{body}");
        }
    }
}
