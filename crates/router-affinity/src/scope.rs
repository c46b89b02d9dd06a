//! The scope of a binding: (model, bucket id, stage, key), encoded so no two scopes collide.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::Arc;

use router_workers::{ModelId, Stage};

/// Longest accepted key, in bytes. Keys come from client headers; the cap bounds the memory a
/// full store can hold (`max_entries` times this, plus per-entry overhead).
pub const MAX_KEY_BYTES: usize = 256;

/// Why a key cannot name a binding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// The key is empty or only whitespace. Empty keys never create bindings: policies treat
    /// the request as keyless.
    #[error("affinity key is empty")]
    EmptyKey,
    /// The key is longer than [`MAX_KEY_BYTES`].
    #[error("affinity key of {len} bytes exceeds the limit of {max} bytes")]
    KeyTooLong {
        /// Length of the offending key, in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// Where a binding applies: one key (a session id or a routing key) within one model, bucket
/// and stage.
///
/// The four parts are encoded into one string, each part written as its byte length, a colon
/// and its bytes (`5:llama|5:short|7:prefill|3:abc`). Because every part carries its length,
/// the encoding is injective: `("a:b", "c")` and `("a", "b:c")` give different scopes however
/// the parts are split. Equality and hashing use only this encoding, so a lookup hashes one
/// string. Cloning is cheap.
#[derive(Clone)]
pub struct Scope {
    encoded: Arc<str>,
    stage: Stage,
    model: Range<usize>,
    bucket: Range<usize>,
    key: Range<usize>,
}

impl Scope {
    /// The scope of `key` within `model`, bucket `bucket` and `stage`.
    ///
    /// Fails on an empty (or whitespace-only) key and on a key longer than [`MAX_KEY_BYTES`].
    pub fn new(model: &ModelId, bucket: &str, stage: Stage, key: &str) -> Result<Self, ScopeError> {
        if key.trim().is_empty() {
            return Err(ScopeError::EmptyKey);
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(ScopeError::KeyTooLong { len: key.len(), max: MAX_KEY_BYTES });
        }
        let mut encoded = String::with_capacity(
            model.as_str().len() + bucket.len() + key.len() + stage.as_str().len() + 16,
        );
        let model = push_part(&mut encoded, model.as_str());
        encoded.push('|');
        let bucket = push_part(&mut encoded, bucket);
        encoded.push('|');
        push_part(&mut encoded, stage.as_str());
        encoded.push('|');
        let key = push_part(&mut encoded, key);
        Ok(Self { encoded: Arc::from(encoded), stage, model, bucket, key })
    }

    /// The model part.
    pub fn model(&self) -> &str {
        &self.encoded[self.model.clone()]
    }

    /// The bucket id part.
    pub fn bucket(&self) -> &str {
        &self.encoded[self.bucket.clone()]
    }

    /// The stage part.
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// The key part.
    pub fn key(&self) -> &str {
        &self.encoded[self.key.clone()]
    }

    /// The length-prefixed encoding that identifies this scope.
    pub fn as_str(&self) -> &str {
        &self.encoded
    }
}

/// Appends `len:part` and returns where `part` lies in `out`.
fn push_part(out: &mut String, part: &str) -> Range<usize> {
    use std::fmt::Write as _;
    // Writing to a String cannot fail.
    let _ = write!(out, "{}:", part.len());
    let start = out.len();
    out.push_str(part);
    start..out.len()
}

impl PartialEq for Scope {
    fn eq(&self, other: &Self) -> bool {
        self.encoded == other.encoded
    }
}

impl Eq for Scope {}

impl Hash for Scope {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.encoded.hash(state);
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("model", &self.model())
            .field("bucket", &self.bucket())
            .field("stage", &self.stage)
            .field("key", &self.key())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scope(model: &str, bucket: &str, stage: Stage, key: &str) -> Scope {
        Scope::new(&ModelId::new(model), bucket, stage, key).expect("valid scope")
    }

    #[test]
    fn separators_inside_parts_do_not_collide() {
        // The same characters split differently between neighbouring parts.
        let pairs = [
            (scope("a:b", "c", Stage::Plain, "k"), scope("a", "b:c", Stage::Plain, "k")),
            (scope("m", "a|b", Stage::Plain, "c"), scope("m", "a", Stage::Plain, "b|c")),
            (scope("m", "b", Stage::Plain, "1:x"), scope("m", "b1:", Stage::Plain, "x")),
            (scope("m|1:b", "c", Stage::Plain, "k"), scope("m", "b|1:c", Stage::Plain, "k")),
        ];
        for (left, right) in pairs {
            assert_ne!(left, right, "{left:?} and {right:?} must be different scopes");
            assert_ne!(left.as_str(), right.as_str());
        }
    }

    #[test]
    fn stage_is_part_of_the_scope() {
        assert_ne!(scope("m", "b", Stage::Prefill, "k"), scope("m", "b", Stage::Decode, "k"));
    }

    #[test]
    fn parts_round_trip_through_accessors() {
        let s = scope("llama:8b", "short|ctx", Stage::Decode, "sess:42");
        assert_eq!(
            (s.model(), s.bucket(), s.stage(), s.key()),
            ("llama:8b", "short|ctx", Stage::Decode, "sess:42")
        );
        assert_eq!(s.as_str(), "8:llama:8b|9:short|ctx|6:decode|7:sess:42");
    }

    #[test]
    fn empty_and_oversized_keys_are_refused() {
        let model = ModelId::new("m");
        assert_eq!(Scope::new(&model, "b", Stage::Plain, ""), Err(ScopeError::EmptyKey));
        assert_eq!(Scope::new(&model, "b", Stage::Plain, " \t"), Err(ScopeError::EmptyKey));
        let long = "x".repeat(MAX_KEY_BYTES + 1);
        assert_eq!(
            Scope::new(&model, "b", Stage::Plain, &long),
            Err(ScopeError::KeyTooLong { len: MAX_KEY_BYTES + 1, max: MAX_KEY_BYTES })
        );
        assert!(Scope::new(&model, "b", Stage::Plain, &long[1..]).is_ok());
    }

    fn stage() -> impl Strategy<Value = Stage> {
        prop_oneof![Just(Stage::Plain), Just(Stage::Prefill), Just(Stage::Decode)]
    }

    // Small alphabets of separator-like characters make collisions as likely as possible.
    fn part() -> impl Strategy<Value = String> {
        "[a1:|]{0,4}"
    }

    fn key() -> impl Strategy<Value = String> {
        "[a1:|]{1,4}"
    }

    proptest! {
        #[test]
        fn scopes_are_equal_exactly_when_their_parts_are(
            a in (part(), part(), stage(), key()),
            b in (part(), part(), stage(), key()),
        ) {
            let sa = scope(&a.0, &a.1, a.2, &a.3);
            let sb = scope(&b.0, &b.1, b.2, &b.3);
            prop_assert_eq!(sa == sb, a == b);
            prop_assert_eq!((sa.model(), sa.bucket(), sa.stage(), sa.key()),
                (a.0.as_str(), a.1.as_str(), a.2, a.3.as_str()));
        }
    }
}
