//! The data-parallel rank inside a picked engine: [`choose_rank`].
//!
//! An engine with `dp_size` ranks is several caches and queues behind one address. When its
//! worker sets `dp_route`, the router chooses the rank as it chose the engine, and names it on
//! the request; without it the engine balances its ranks itself, and nothing here runs.
//!
//! The choice is predicted_ttft's cost model, one level down: for prefill work (plain and
//! prefill picks) each rank costs the uncached prefill queued on it (its reported waiting
//! uncached tokens plus what the router sent it since that report and is still in flight, or
//! the router's own in-flight work on it without a native report) plus this request's uncached tokens there (the
//! whole input, except on the rank holding the prefix the policy found). A decode pick costs
//! the requests on each rank (reported plus dispatched since and still in flight, or in
//! flight). The cheapest rank
//! wins; ties go to the rank with fewer requests, then take turns (a starting place that moves
//! on with every choice), so that an idle engine's ranks share new prefixes. The prefill rate is
//! the engine's, shared by its ranks, so costs compare in tokens.

use std::sync::atomic::{AtomicU32, Ordering};

use router_state_load::{Inflight, LoadSnapshot, RankLoad};
use router_workers::{Stage, Worker};

use crate::{LoadHandles, Pick};

/// The rank chosen inside an engine, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankChoice {
    /// The rank, in `0..dp_size`.
    pub rank: u32,
    /// Why it won.
    pub reason: RankReason,
}

/// Why a rank was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RankReason {
    /// The engine has one rank.
    OnlyRank,
    /// The rank holding the request's prefix was the cheapest.
    CachedPrefix,
    /// The least-loaded rank (no prefix held, or its holder was busier than recomputing).
    LeastWork,
    /// The client named it, and the router lets clients choose (`server.allow_client_dp_rank`).
    Client,
}

impl RankReason {
    /// A stable `snake_case` name for metrics labels and response headers.
    pub fn as_str(self) -> &'static str {
        match self {
            RankReason::OnlyRank => "only_rank",
            RankReason::CachedPrefix => "cached_prefix",
            RankReason::LeastWork => "least_work",
            RankReason::Client => "client",
        }
    }
}

/// Where the next choice among equal ranks starts.
static NEXT_TIE: AtomicU32 = AtomicU32::new(0);

/// The rank of `pick`'s engine that serves a request of `input_tokens` prompt tokens for
/// `stage`, or `None` when the engine balances its ranks itself (no `dp_route`).
pub fn choose_rank(
    load: &LoadHandles,
    pick: &Pick,
    stage: Stage,
    input_tokens: u64,
) -> Option<RankChoice> {
    let worker = &pick.worker;
    worker.dp_route()?;
    if worker.dp_size() <= 1 {
        return Some(RankChoice { rank: 0, reason: RankReason::OnlyRank });
    }
    let snapshot = load.table.snapshot();
    let ranks = Ranks { worker, inflight: &load.inflight, snapshot: &snapshot };
    let held = pick.cached_prefix.filter(|held| held.rank < worker.dp_size());
    // Equal ranks take turns, from a place that moves on with every choice.
    let start = NEXT_TIE.fetch_add(1, Ordering::Relaxed) % worker.dp_size();
    let costs = (0..worker.dp_size()).map(|rank| {
        let (queued, requests) = ranks.queued(rank);
        let cost = match stage {
            Stage::Decode => requests,
            Stage::Plain | Stage::Prefill => {
                let cached = held.filter(|h| h.rank == rank).map_or(0, |h| h.tokens);
                queued.saturating_add(input_tokens - cached.min(input_tokens))
            }
        };
        let turn = (rank + worker.dp_size() - start) % worker.dp_size();
        (cost, requests, turn, rank)
    });
    let (_, _, _, rank) = costs.min()?;
    let reason = match held {
        Some(held) if held.rank == rank && stage != Stage::Decode => RankReason::CachedPrefix,
        _ => RankReason::LeastWork,
    };
    Some(RankChoice { rank, reason })
}

/// The load of one engine's ranks, as one pick sees it.
struct Ranks<'a> {
    worker: &'a Worker,
    inflight: &'a Inflight,
    snapshot: &'a LoadSnapshot,
}

impl Ranks<'_> {
    /// `(uncached prefill tokens queued, requests)` on `rank`: the rank's report corrected by
    /// the router's dispatches since, or the router's in-flight requests without a report
    /// (and its in-flight work without a native one).
    fn queued(&self, rank: u32) -> (u64, u64) {
        let id = self.worker.id();
        let inflight = self.inflight.rank_inflight(id, rank);
        let reported =
            self.snapshot.get(id).zip(self.snapshot.ranks(id)).and_then(|(load, ranks)| {
                let r: &RankLoad = ranks.get(usize::try_from(rank).ok()?)?;
                Some((load.captured_at, *r))
            });
        match reported {
            Some((captured_at, r)) => {
                // What was sent since the report and has not come back yet: a dispatch that
                // already finished cannot be queued, whatever the report has yet to say.
                let since = self.inflight.rank_dispatched_since(id, rank, captured_at);
                let requests =
                    r.total_requests().saturating_add(since.requests.min(inflight.requests));
                // Waiting tokens leave out the prefill pass running now, which the router's
                // requests without a first token still cover.
                let tokens = match r.waiting_uncached_tokens {
                    Some(waiting) => waiting
                        .saturating_add(since.tokens.min(inflight.tokens))
                        .max(inflight.tokens),
                    None => inflight.tokens,
                };
                (tokens, requests)
            }
            None => (inflight.tokens, inflight.requests),
        }
    }
}

#[cfg(test)]
mod tests;
