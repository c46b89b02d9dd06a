//! `Prefixes`: what the prefix lookups of one pick established, for every policy that reads a
//! [`CacheSource`] (`cache_aware`, `predicted_ttft`).

use std::sync::Arc;

use router_workers::Worker;

use super::source::{BlockSize, CacheSource, CachedPrefixes, PrefixOutcome, Unavailable};
use crate::{HeldPrefix, PickError, PickRequest};

/// The cached prefixes of one request on a group's candidates, per block size, and whether
/// some lookup could not be answered.
#[derive(Default)]
pub(crate) struct Prefixes {
    found: Vec<(BlockSize, Arc<CachedPrefixes>)>,
    pub(crate) unavailable: Option<Unavailable>,
}

impl Prefixes {
    /// The lookups a pick over `engines` needs, through the request's memo: one per distinct
    /// block size of the candidates ([`BlockSize::of`]). Nothing is looked up when the input
    /// is shorter than `min_hit` tokens (nothing could hit). A request without token ids, or a
    /// backend that cannot answer, is *unavailable*.
    pub(crate) async fn look_up(
        source: &Arc<CacheSource>,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
        min_hit: u64,
    ) -> Result<Self, PickError> {
        let mut out = Self::default();
        let mut sizes: Vec<BlockSize> = Vec::new();
        for size in engines.iter().map(|e| BlockSize::of(e)) {
            if !sizes.contains(&size) {
                sizes.push(size);
            }
        }
        if sizes.is_empty() || request.input_tokens < min_hit.max(1) {
            return Ok(out);
        }
        let Some(tokens) = request.tokens else {
            out.unavailable = Some(Unavailable::NoTokens);
            return Ok(out);
        };
        for size in sizes {
            let outcome = tokens
                .memo()
                .lookup(source, request.model, tokens, size)
                .await
                .map_err(|error| PickError::Lookup(Arc::new(error)))?;
            match outcome {
                PrefixOutcome::Found(prefixes) => out.found.push((size, prefixes)),
                PrefixOutcome::Unavailable(why) => {
                    out.unavailable.get_or_insert(why);
                }
            }
        }
        Ok(out)
    }

    /// Leading tokens `worker` holds (0 without a lookup for it).
    pub(crate) fn matched(&self, worker: &Worker) -> u64 {
        self.held(worker).map_or(0, |held| held.tokens)
    }

    /// The prefix `worker` holds and the rank holding it, if it holds any.
    pub(crate) fn held(&self, worker: &Worker) -> Option<HeldPrefix> {
        let block_size = BlockSize::of(worker);
        self.found
            .iter()
            .find(|(size, _)| *size == block_size)
            .and_then(|(_, prefixes)| prefixes.get(worker.id()))
            .filter(|p| p.tokens > 0)
            .map(|p| HeldPrefix { rank: p.rank, tokens: p.tokens })
    }
}
