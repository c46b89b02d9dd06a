//! Cache-aware selection and its cache state adapter.
//!
//! - [`CacheSource`] (`source.rs`): the local prefix index or a remote indexer, normalised into
//!   per-worker prefix results ([`CachedPrefixes`]: blocks, tokens, tier), converting blocks to
//!   tokens only through a valid [`BlockSize`]. A confirmed miss ([`PrefixOutcome::Found`] and
//!   empty) and an unavailable backend ([`PrefixOutcome::Unavailable`]) are told apart and
//!   counted apart ([`SourceStats`]); only an invalid query is an error ([`LookupError`]).
//!   [`CacheSources`] hands out one shared source per backend, so policies never duplicate a
//!   remote client or its in-flight limit.
//! - [`PrefixMemo`] (`memo.rs`): one lookup per prepared request per source and block size,
//!   carried by [`RequestTokens`](crate::RequestTokens) across bucket attempts and stages.
//! - `Prefixes` (`prefixes.rs`): the lookups one pick needs, shared by `cache_aware` and
//!   `predicted_ttft`.
//! - [`CacheAwarePolicy`] (`policy.rs`): the selection algorithm of
//!   docs/design/POLICY_REFERENCE.md.

mod memo;
mod policy;
mod prefixes;
mod source;

pub use memo::PrefixMemo;
pub use policy::CacheAwarePolicy;
pub(crate) use prefixes::Prefixes;
pub use source::{
    BlockSize, CacheSource, CacheSources, CachedPrefix, CachedPrefixes, LookupError,
    MATCHED_TOKEN_BOUNDS, MatchedTokens, PrefixOutcome, SourceStats, Unavailable,
};

#[cfg(test)]
pub(crate) mod tests;
