//! The engine's API key (`--api-key`): compared in constant time, never printed.

use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use subtle::{Choice, ConstantTimeEq};

/// The bearer token every `/v1/` and `/generate` request must carry when configured
/// (`--api-key`).
///
/// Its `Debug` prints `<redacted>`, so a config holding one can be logged; there is no
/// `Display` and no accessor, so the key itself never leaves this type. Clones share the key.
#[derive(Clone)]
pub struct ApiKey(Arc<str>);

impl ApiKey {
    /// Wraps `key`.
    pub fn new(key: impl Into<String>) -> Self {
        Self(Arc::from(key.into()))
    }

    /// Whether the key is the empty string (which the engine refuses).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `candidate` is this key. The time taken depends on `candidate`'s length only:
    /// neither where the two differ nor the key's length can be told from it.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        let key = self.0.as_bytes();
        if key.is_empty() {
            return candidate.is_empty();
        }
        let mut equal: Choice = key.len().ct_eq(&candidate.len());
        for (i, byte) in candidate.iter().enumerate() {
            equal &= key[i % key.len()].ct_eq(byte);
        }
        equal.into()
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl PartialEq for ApiKey {
    fn eq(&self, other: &Self) -> bool {
        self.matches(other.0.as_bytes())
    }
}

impl Eq for ApiKey {}

impl FromStr for ApiKey {
    type Err = Infallible;

    fn from_str(key: &str) -> Result<Self, Self::Err> {
        Ok(Self::new(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_exact_key() {
        let key = ApiKey::new("s3cret");
        assert!(key.matches(b"s3cret"));
        for wrong in [&b""[..], b"s3cre", b"s3cret!", b"S3cret", b"s3cres", b"s3crets3cret"] {
            assert!(!key.matches(wrong), "{:?} accepted", String::from_utf8_lossy(wrong));
        }
        assert!(ApiKey::new("").matches(b""));
        assert!(!ApiKey::new("").matches(b"x"));
    }

    #[test]
    fn debug_never_shows_the_key() {
        let key = ApiKey::new("s3cret");
        assert_eq!(format!("{key:?}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(key)), "Some(<redacted>)");
    }
}
