//! Per-key rate limits (`server.rate_limit`, or an `api_keys` entry's own `rate_limit`):
//! requests per second and tokens per second of each client key, each a token bucket
//! ([`TokenBucket`]). Over a limit is a 429 `rate_limited` with `Retry-After` (the seconds
//! until the bucket holds enough again), as nginx's `limit_req` and the incumbent routers
//! answer.
//!
//! The request limit is checked on the request's head, before the admission queue, so a
//! limited request never takes a queue place; so is an empty token bucket. The token cost
//! (prompt tokens plus `max_tokens` / `max_completion_tokens`, [`TokenCharge`]) is known once
//! the body is prepared and is charged then, at admission; it is not refunded against the
//! usage the engine reports. A request costing more than the key's token bucket holds is a 400
//! saying so: waiting would never let it through.
//!
//! State is one mutex per configured key (and one for the anonymous clients of an open API),
//! made at startup: clients cannot create entries, and no lock is shared between keys.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::metrics;
use bucket::{Shortfall, TokenBucket};
use router_config::RateLimitSection;

/// Which limit refused a request: the `limit` label of `router_rate_limited_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Limit {
    /// Requests per second.
    Requests,
    /// Tokens per second.
    Tokens,
}

impl Limit {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Limit::Requests => "requests",
            Limit::Tokens => "tokens",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Limit::Requests => "requests-per-second",
            Limit::Tokens => "tokens-per-second",
        })
    }
}

/// Whose limit it is: a client key by its name (never the key), or the clients of an open API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Client {
    /// A configured key: its `name`, else `api_keys[i]` (or `ROUTER_API_KEY`).
    Key(Arc<str>),
    /// Every client when no key is configured.
    Anonymous,
}

impl Client {
    /// The `key` label of `router_rate_limited_total`.
    pub(crate) fn label(&self) -> &str {
        match self {
            Client::Key(name) => name,
            Client::Anonymous => "anonymous",
        }
    }
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Client::Key(name) => write!(f, "API key {name}"),
            Client::Anonymous => f.write_str("the anonymous clients"),
        }
    }
}

/// The buckets of one key.
#[derive(Debug)]
pub(crate) struct KeyLimiter {
    client: Client,
    /// Whether there is a token bucket (fixed at startup, read without the lock).
    limits_tokens: bool,
    buckets: Mutex<Buckets>,
}

#[derive(Debug)]
struct Buckets {
    requests: Option<TokenBucket>,
    tokens: Option<TokenBucket>,
}

impl KeyLimiter {
    /// `limits` for `client`, `None` when they limit nothing.
    fn new(client: Client, limits: &RateLimitSection, now: Instant) -> Option<Self> {
        let bucket = |(rate, size)| TokenBucket::full(rate, size, now);
        let buckets = Buckets {
            requests: limits.requests().map(bucket),
            tokens: limits.tokens().map(bucket),
        };
        let limits_tokens = buckets.tokens.is_some();
        (buckets.requests.is_some() || limits_tokens).then(|| Self {
            client,
            limits_tokens,
            buckets: Mutex::new(buckets),
        })
    }

    /// Lets one request's head through at `now`, taking a request token; refused when the
    /// request bucket or the token bucket is empty (taking nothing then).
    fn admit(&self, now: Instant) -> Result<(), Refusal> {
        let mut buckets = self.buckets.lock();
        if let Some(tokens) = &mut buckets.tokens
            && let Err(shortfall) = tokens.check(1.0, now)
        {
            return Err(self.refusal(Limit::Tokens, 1, shortfall));
        }
        if let Some(requests) = &mut buckets.requests
            && let Err(shortfall) = requests.take(1.0, now)
        {
            return Err(self.refusal(Limit::Requests, 1, shortfall));
        }
        Ok(())
    }

    /// Charges `cost` tokens at `now`, or refuses (charging nothing).
    fn charge(&self, cost: u64, now: Instant) -> Result<(), Refusal> {
        let mut buckets = self.buckets.lock();
        let Some(tokens) = &mut buckets.tokens else { return Ok(()) };
        tokens
            .take(cost as f64, now)
            .map_err(|shortfall| self.refusal(Limit::Tokens, cost, shortfall))
    }

    fn refusal(&self, limit: Limit, cost: u64, shortfall: Shortfall) -> Refusal {
        let client = self.client.clone();
        match shortfall {
            Shortfall::Wait { secs } => Refusal::Limited { client, limit, retry_after_secs: secs },
            Shortfall::Oversized { capacity } => {
                Refusal::OverTokenBurst { client, tokens: cost, burst: capacity as u64 }
            }
        }
    }
}

/// The limiters of every client key, by the key's place in the credentials, and of the
/// anonymous clients.
#[derive(Debug, Default)]
pub(crate) struct RateLimits {
    keys: Vec<Option<Arc<KeyLimiter>>>,
    anonymous: Option<Arc<KeyLimiter>>,
}

impl RateLimits {
    /// An open API's limits: `limits` shared by every client.
    pub(crate) fn anonymous(limits: &RateLimitSection) -> Self {
        let anonymous = KeyLimiter::new(Client::Anonymous, limits, Instant::now()).map(Arc::new);
        Self { keys: Vec::new(), anonymous }
    }

    /// The limits of each client key, in the order of the credentials: its name and limits.
    pub(crate) fn per_key<'a>(
        keys: impl IntoIterator<Item = (String, &'a RateLimitSection)>,
    ) -> Self {
        let now = Instant::now();
        let keys = keys
            .into_iter()
            .map(|(name, limits)| {
                KeyLimiter::new(Client::Key(name.into()), limits, now).map(Arc::new)
            })
            .collect();
        Self { keys, anonymous: None }
    }

    /// Whether any client has a limit (else the middleware is left out of the routes).
    pub(crate) fn limits_anyone(&self) -> bool {
        self.anonymous.is_some() || self.keys.iter().any(Option::is_some)
    }

    /// The limiter of the client that presented the key at place `key` of the credentials
    /// (none: no key was needed).
    pub(crate) fn of(&self, key: Option<usize>) -> Option<&Arc<KeyLimiter>> {
        match key {
            Some(place) => self.keys.get(place)?.as_ref(),
            None => self.anonymous.as_ref(),
        }
    }
}

impl KeyLimiter {
    /// Lets one request's head through now ([`KeyLimiter::admit`]); a refusal is counted.
    pub(crate) fn admit_now(&self) -> Result<(), Refusal> {
        self.admit(Instant::now()).inspect_err(count)
    }

    /// Whether the key has a token limit: its requests then carry a [`TokenCharge`].
    pub(crate) fn limits_tokens(&self) -> bool {
        self.limits_tokens
    }
}

/// The limiter a prepared request's tokens are charged to, put in the request's extensions
/// when its key has a token limit.
#[derive(Clone, Debug)]
pub(crate) struct TokenCharge(pub(crate) Arc<KeyLimiter>);

impl TokenCharge {
    /// Charges `tokens` now; a refusal is counted.
    pub(crate) fn charge(&self, tokens: u64) -> Result<(), Refusal> {
        self.0.charge(tokens, Instant::now()).inspect_err(count)
    }
}

/// A request over its key's rate limits.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// Over a limit: a 429 with `Retry-After`.
    #[error("{client} is over its {limit} rate limit; retry after {retry_after_secs} s")]
    Limited {
        /// Whose limit.
        client: Client,
        /// Which.
        limit: Limit,
        /// Seconds until the limit lets the request through, rounded up.
        retry_after_secs: u64,
    },
    /// The request costs more tokens than the key's token bucket ever holds: no wait helps.
    #[error(
        "the request needs {tokens} tokens (prompt plus max_tokens) but {client} may spend at \
         most {burst} at once (its tokens_burst); lower max_tokens or shorten the prompt"
    )]
    OverTokenBurst {
        /// Whose limit.
        client: Client,
        /// The request's cost.
        tokens: u64,
        /// The bucket's size.
        burst: u64,
    },
}

/// Counts a refusal in `router_rate_limited_total`.
fn count(refusal: &Refusal) {
    let (client, limit) = match refusal {
        Refusal::Limited { client, limit, .. } => (client, *limit),
        Refusal::OverTokenBurst { client, .. } => (client, Limit::Tokens),
    };
    metrics::rate_limited(client.label(), limit.label());
}

mod bucket;

#[cfg(test)]
mod tests;
