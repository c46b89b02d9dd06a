//! The scope of a binding: (model, bucket id, stage, key), or model-wide (model, stage, key),
//! encoded so no two scopes collide.

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
/// and stage ([`Scope::new`]), or within one model and stage whatever the bucket
/// ([`Scope::model_wide`]).
///
/// The parts are encoded into one string, each part written as its byte length, a colon and
/// its bytes (`5:llama|5:short|7:prefill|3:abc`); a model-wide scope has `*` in place of the
/// bucket part (`5:llama|*|7:prefill|3:abc`), which no length-prefixed part can equal. Because
/// every part carries its length, the encoding is injective: `("a:b", "c")` and `("a", "b:c")`
/// give different scopes however the parts are split, and a model-wide scope never equals a
/// bucket's. Equality and hashing use only this encoding, so a lookup hashes one string.
/// Cloning is cheap.
#[derive(Clone)]
pub struct Scope {
    encoded: Arc<str>,
    stage: Stage,
    model: Range<usize>,
    /// `None` for a model-wide scope.
    bucket: Option<Range<usize>>,
    key: Range<usize>,
}

impl Scope {
    /// The scope of `key` within `model`, bucket `bucket` and `stage`.
    ///
    /// Fails on an empty (or whitespace-only) key and on a key longer than [`MAX_KEY_BYTES`].
    pub fn new(model: &ModelId, bucket: &str, stage: Stage, key: &str) -> Result<Self, ScopeError> {
        Self::encode(model, Some(bucket), stage, key)
    }

    /// The scope of `key` within `model` and `stage`, shared by every bucket of the model: a
    /// binding here follows the key across buckets. Never equal to a bucket's scope.
    ///
    /// Fails as [`Scope::new`] does.
    pub fn model_wide(model: &ModelId, stage: Stage, key: &str) -> Result<Self, ScopeError> {
        Self::encode(model, None, stage, key)
    }

    fn encode(
        model: &ModelId,
        bucket: Option<&str>,
        stage: Stage,
        key: &str,
    ) -> Result<Self, ScopeError> {
        if key.trim().is_empty() {
            return Err(ScopeError::EmptyKey);
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(ScopeError::KeyTooLong { len: key.len(), max: MAX_KEY_BYTES });
        }
        let mut encoded = String::with_capacity(
            model.as_str().len()
                + bucket.map_or(0, str::len)
                + key.len()
                + stage.as_str().len()
                + 16,
        );
        let model = push_part(&mut encoded, model.as_str());
        encoded.push('|');
        let bucket = match bucket {
            Some(bucket) => Some(push_part(&mut encoded, bucket)),
            None => {
                encoded.push(MODEL_WIDE);
                None
            }
        };
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

    /// The bucket id part; `None` for a model-wide scope.
    pub fn bucket(&self) -> Option<&str> {
        self.bucket.as_ref().map(|bucket| &self.encoded[bucket.clone()])
    }

    /// Whether the scope spans every bucket of its model ([`Scope::model_wide`]).
    pub fn is_model_wide(&self) -> bool {
        self.bucket.is_none()
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

/// What a model-wide scope has in place of the bucket part: no `len:part` starts with it.
const MODEL_WIDE: char = '*';

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
            ("llama:8b", Some("short|ctx"), Stage::Decode, "sess:42")
        );
        assert_eq!(s.as_str(), "8:llama:8b|9:short|ctx|6:decode|7:sess:42");
        assert!(!s.is_model_wide());

        let wide = Scope::model_wide(&ModelId::new("llama:8b"), Stage::Decode, "sess:42")
            .expect("valid scope");
        assert_eq!(
            (wide.model(), wide.bucket(), wide.stage(), wide.key()),
            ("llama:8b", None, Stage::Decode, "sess:42")
        );
        assert_eq!(wide.as_str(), "8:llama:8b|*|6:decode|7:sess:42");
        assert!(wide.is_model_wide());
    }

    #[test]
    fn a_model_wide_scope_is_no_buckets_scope() {
        let model = ModelId::new("m");
        let wide = Scope::model_wide(&model, Stage::Plain, "k").expect("valid scope");
        // Not even a bucket whose id is the marker, or empty.
        for bucket in ["*", "", "0:", "1:*"] {
            assert_ne!(wide, scope("m", bucket, Stage::Plain, "k"), "bucket {bucket:?}");
        }
        assert_ne!(wide, Scope::model_wide(&model, Stage::Decode, "k").expect("valid"));
        assert_ne!(wide, Scope::model_wide(&ModelId::new("m2"), Stage::Plain, "k").expect("ok"));
        assert_eq!(wide, Scope::model_wide(&model, Stage::Plain, "k").expect("valid scope"));
        assert_eq!(Scope::model_wide(&model, Stage::Plain, " "), Err(ScopeError::EmptyKey));
        let long = "x".repeat(MAX_KEY_BYTES + 1);
        assert!(matches!(
            Scope::model_wide(&model, Stage::Plain, &long),
            Err(ScopeError::KeyTooLong { .. })
        ));
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
        "[a1:|*]{0,4}"
    }

    fn key() -> impl Strategy<Value = String> {
        "[a1:|]{1,4}"
    }

    /// A bucket scope, or a model-wide one for `None`.
    fn any_scope(model: &str, bucket: Option<&str>, stage: Stage, key: &str) -> Scope {
        let model = ModelId::new(model);
        match bucket {
            Some(bucket) => Scope::new(&model, bucket, stage, key),
            None => Scope::model_wide(&model, stage, key),
        }
        .expect("valid scope")
    }

    proptest! {
        #[test]
        fn scopes_are_equal_exactly_when_their_parts_are(
            a in (part(), proptest::option::of(part()), stage(), key()),
            b in (part(), proptest::option::of(part()), stage(), key()),
        ) {
            let sa = any_scope(&a.0, a.1.as_deref(), a.2, &a.3);
            let sb = any_scope(&b.0, b.1.as_deref(), b.2, &b.3);
            prop_assert_eq!(sa == sb, a == b);
            prop_assert_eq!((sa.model(), sa.bucket(), sa.stage(), sa.key()),
                (a.0.as_str(), a.1.as_deref(), a.2, a.3.as_str()));
        }
    }
}
