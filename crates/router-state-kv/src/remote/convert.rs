//! Between [`PrefixMatches`] and the `router.kv.v1` messages.

use router_proto::router::kv::v1 as pb;
use router_workers::WorkerId;

use crate::{Medium, PrefixMatch, PrefixMatches};

/// An indexer answer that does not describe a valid lookup result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MalformedResponse {
    /// A match names no valid worker id.
    #[error("match {index} has an invalid worker id {worker_id:?}")]
    WorkerId {
        /// Position of the match in the answer.
        index: usize,
        /// The id given.
        worker_id: String,
    },
    /// A match has an unset or unknown storage tier.
    #[error("match {index} has an unknown tier {tier}")]
    Tier {
        /// Position of the match in the answer.
        index: usize,
        /// The enum value given.
        tier: i32,
    },
    /// A match holds no block, or more blocks than the query has.
    #[error("match {index} claims {blocks} blocks of a {query_blocks}-block query")]
    Blocks {
        /// Position of the match in the answer.
        index: usize,
        /// Blocks claimed.
        blocks: u32,
        /// Blocks in the query.
        query_blocks: u32,
    },
    /// The answer's block count is not the query's.
    #[error("answer counts {got} query blocks, the query has {expected}")]
    QueryBlocks {
        /// Blocks the answer counts.
        got: u32,
        /// Blocks the router asked about, when it knows (hash queries).
        expected: usize,
    },
    /// The same worker appears twice.
    #[error("worker {worker} appears twice")]
    Duplicate {
        /// The repeated worker.
        worker: WorkerId,
    },
}

/// The wire value of a tier.
pub(crate) fn medium_to_proto(medium: Medium) -> pb::Medium {
    match medium {
        Medium::Gpu => pb::Medium::Gpu,
        Medium::CpuPinned => pb::Medium::CpuPinned,
        Medium::Cpu => pb::Medium::Cpu,
        Medium::Disk => pb::Medium::Disk,
        Medium::Storage => pb::Medium::Storage,
        Medium::External => pb::Medium::External,
    }
}

/// The tier of a wire value; `None` for unset or unknown values.
pub(crate) fn medium_from_proto(value: i32) -> Option<Medium> {
    Some(match pb::Medium::try_from(value).ok()? {
        pb::Medium::Unspecified => return None,
        pb::Medium::Gpu => Medium::Gpu,
        pb::Medium::CpuPinned => Medium::CpuPinned,
        pb::Medium::Cpu => Medium::Cpu,
        pb::Medium::Disk => Medium::Disk,
        pb::Medium::Storage => Medium::Storage,
        pb::Medium::External => Medium::External,
    })
}

/// The answer for a lookup result. Counts above `u32::MAX` blocks are clamped (a query that
/// large is refused before lookup).
pub(crate) fn to_proto(matches: &PrefixMatches) -> pb::LookupResponse {
    pb::LookupResponse {
        query_blocks: u32::try_from(matches.query_blocks).unwrap_or(u32::MAX),
        matches: matches
            .matches
            .iter()
            .map(|m| pb::PrefixMatch {
                worker_id: m.worker.as_str().to_owned(),
                dp_rank: m.rank,
                blocks: m.blocks,
                tier: medium_to_proto(m.tier).into(),
            })
            .collect(),
    }
}

/// The lookup result an answer describes, checked: valid worker ids, known tiers, block
/// counts within the query (and, when the caller knows it, the query's own block count), each
/// worker once.
pub(crate) fn from_proto(
    answer: pb::LookupResponse,
    expected_blocks: Option<usize>,
) -> Result<PrefixMatches, MalformedResponse> {
    if let Some(expected) = expected_blocks
        && usize::try_from(answer.query_blocks).ok() != Some(expected)
    {
        return Err(MalformedResponse::QueryBlocks { got: answer.query_blocks, expected });
    }
    let query_blocks = answer.query_blocks;
    let mut matches = Vec::with_capacity(answer.matches.len());
    for (index, m) in answer.matches.into_iter().enumerate() {
        let worker = WorkerId::new(&m.worker_id)
            .map_err(|_| MalformedResponse::WorkerId { index, worker_id: m.worker_id.clone() })?;
        let tier =
            medium_from_proto(m.tier).ok_or(MalformedResponse::Tier { index, tier: m.tier })?;
        if m.blocks == 0 || m.blocks > query_blocks {
            return Err(MalformedResponse::Blocks { index, blocks: m.blocks, query_blocks });
        }
        matches.push(PrefixMatch { worker, rank: m.dp_rank, blocks: m.blocks, tier });
    }
    let mut seen: Vec<&WorkerId> = matches.iter().map(|m| &m.worker).collect();
    seen.sort_unstable();
    if let Some(pair) = seen.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(MalformedResponse::Duplicate { worker: pair[0].clone() });
    }
    Ok(PrefixMatches { query_blocks: query_blocks as usize, matches })
}
