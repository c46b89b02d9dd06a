//! A model's engine groups: each group's configuration visited once, whether a model reads
//! token ids, the checks of prefix policies (a cache they can see), and the groups built.

use router_buckets::{BucketGroups, EngineGroup, PairOn, SloPreference};
use router_policies::{CachePrefixProvider, PolicyHandles};
use router_workers::{Stage, WorkerId, WorkerSpec};

use super::{DiscoverySection, GroupConfig, GroupsConfig, ModelConfig, Problems, ServerSection};

/// The groups of a bucket with their paths and stages.
pub(super) fn each_group<'a>(
    bpath: &str,
    groups: &'a GroupsConfig,
) -> impl Iterator<Item = (String, Stage, &'a GroupConfig)> {
    let plain =
        groups.plain.iter().map(move |g| (format!("{bpath}.groups.plain"), Stage::Plain, g));
    let pd = groups.pd.iter().flat_map(move |pd| {
        [
            (format!("{bpath}.groups.pd.prefill"), Stage::Prefill, &pd.prefill),
            (format!("{bpath}.groups.pd.decode"), Stage::Decode, &pd.decode),
        ]
    });
    plain.chain(pd)
}

/// Whether anything reads the token ids or the exact token count of `model`'s requests, so
/// that tokenizing them pays: a policy reading cached prefixes, a bucket bounding input
/// length (`limits`, `max_context_tokens`), an SLO estimate (a bucket's `ttft_ms` or
/// `tokens_per_second`, the model's `ttft_slo` or `tps_slo`), or a rate limit on tokens (the
/// server's or a client key's). Anything else routes on the size estimate.
pub(super) fn needs_tokens(
    model: &ModelConfig,
    server: &ServerSection,
    reads_prefixes: bool,
) -> bool {
    let bounded = model.buckets.iter().any(|b| {
        b.limits.min > 0
            || b.limits.max.is_some()
            || b.max_context_tokens.is_some()
            || b.ttft_ms.is_some()
            || b.tokens_per_second.is_some()
    });
    let slo = [model.ttft_slo, model.tps_slo].iter().any(|p| *p != SloPreference::Disabled);
    let limits_tokens = |limit: Option<&crate::RateLimitSection>| {
        limit.is_some_and(|limit| limit.tokens_per_second.is_some())
    };
    let tokens_limited = limits_tokens(server.rate_limit.as_ref())
        || server.api_keys.iter().any(|key| limits_tokens(key.rate_limit.as_ref()));
    reads_prefixes || bounded || slo || tokens_limited
}

/// What a group whose policy reads cached prefixes (`cache_aware`, `predicted_ttft`) must be
/// able to see, judged over its configured workers (and discovered engines, as members of a
/// group without `worker_ids`, with discovery's `kv_events` and `block_size`):
/// - engines' KV events carry token ids: a group with a publishing member needs the model's
///   tokenizer;
/// - with the local index, a block size alone feeds nothing: a group whose members declare
///   block sizes but none publishes is refused (an engine with neither is pictured from the
///   router's dispatches, approximate mode, which needs no tokenizer);
/// - a remote indexer is asked in blocks of the engines' block size: some member declares one.
///
/// A group with neither configured nor discovered workers (filled through the admin API) is
/// not judged.
pub(super) fn check_prefix_groups(
    model: &ModelConfig,
    discovery: Option<&DiscoverySection>,
    groups: &GroupsConfig,
    bpath: &str,
    problems: &mut Problems,
) {
    for (gpath, stage, group) in each_group(bpath, groups) {
        let Some(provider) = group.policy.prefix_provider() else { continue };
        let members: Vec<&WorkerSpec> = match &group.worker_ids {
            Some(ids) => model.workers.iter().filter(|w| ids.contains(&w.id)).collect(),
            None => model.workers.iter().filter(|w| w.role == stage).collect(),
        };
        let discovered = discovery.filter(|_| group.worker_ids.is_none());
        if members.is_empty() && discovered.is_none() {
            continue;
        }
        let publishes = discovered.is_some_and(|d| d.kv_events.is_some())
            || members.iter().any(|w| w.kv_events.is_some());
        let sized = publishes
            || discovered.is_some_and(|d| d.block_size.is_some())
            || members.iter().any(|w| w.block_size.is_some());
        let policy = group.policy.policy_type();
        let at = format!("{gpath}.policy");
        let (on, discovered_key) = match discovered {
            Some(_) => (" (discovered engines: discovery.", true),
            None => ("", false),
        };
        let also = |key: &str| if discovered_key { format!("{on}{key})") } else { String::new() };
        let mpath = bpath.split(".buckets").next().unwrap_or(bpath);
        if publishes && model.tokenizer.is_none() && provider == CachePrefixProvider::RadixTree {
            problems.push(
                &at,
                format!(
                    "{policy} looks up the token ids of requests in the engines' KV events, but \
                     the model has no tokenizer: set {mpath}.tokenizer (without one, only \
                     engines without KV events are matched, on prompt text)"
                ),
            );
        }
        let message = match provider {
            CachePrefixProvider::RadixTree if sized && !publishes => format!(
                "{policy} reads the local KV index, but no worker of this group publishes KV \
                 events, and a block size alone feeds nothing: give the workers kv_events \
                 {{endpoint: \"tcp://HOST:PORT\"}}{}, or leave out block_size so that the router \
                 pictures them from its own dispatches (approximate mode)",
                also("kv_events")
            ),
            CachePrefixProvider::Indexer if !sized => format!(
                "{policy} asks the remote indexer in blocks of each engine's block size, but no \
                 worker of this group declares one: give the workers block_size{}",
                also("block_size")
            ),
            _ => continue,
        };
        problems.push(at, message);
    }
}

pub(super) fn build_groups(
    path: &str,
    groups: &GroupsConfig,
    handles: &PolicyHandles,
    problems: &mut Problems,
) -> Option<BucketGroups> {
    let group = |gpath: String, stage: Stage, config: &GroupConfig, problems: &mut Problems| {
        let members = match &config.worker_ids {
            None => None,
            Some(ids) => {
                let mut parsed = Vec::new();
                for (i, id) in ids.iter().enumerate() {
                    match WorkerId::new(id) {
                        Ok(id) => parsed.push(id),
                        Err(err) => problems.push(format!("{gpath}.worker_ids[{i}]"), err),
                    }
                }
                Some(parsed)
            }
        };
        let policy = match config.policy.build(handles) {
            Ok(policy) => policy,
            Err(err) => {
                problems.push(format!("{gpath}.policy"), err);
                return None;
            }
        };
        match EngineGroup::new(stage, members, policy) {
            Ok(group) => Some(group),
            Err(err) => {
                problems.push(format!("{gpath}.policy"), err);
                None
            }
        }
    };
    match (&groups.plain, &groups.pd) {
        (Some(plain), None) => group(format!("{path}.groups.plain"), Stage::Plain, plain, problems)
            .map(BucketGroups::Plain),
        (None, Some(pd)) => {
            let prefill =
                group(format!("{path}.groups.pd.prefill"), Stage::Prefill, &pd.prefill, problems);
            let decode =
                group(format!("{path}.groups.pd.decode"), Stage::Decode, &pd.decode, problems);
            let pair_on = match PairOn::new(pd.pair_on.clone()) {
                Ok(pair_on) => pair_on,
                Err(err) => {
                    problems.push(format!("{path}.groups.pd.pair_on[{}]", err.position()), err);
                    return None;
                }
            };
            Some(BucketGroups::Pd { prefill: prefill?, decode: decode?, pair_on })
        }
        _ => {
            problems.push(format!("{path}.groups"), "exactly one of plain or pd is required");
            None
        }
    }
}
