//! `PrefixMemo`: one prefix lookup per prepared request, per source and block size.

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use router_workers::ModelId;
use tokio::sync::OnceCell;

use super::source::{BlockSize, CacheSource, LookupError, PrefixOutcome};
use crate::RequestTokens;

struct Entry {
    /// Held (not just its address), so the key can never be reused by another source.
    source: Arc<CacheSource>,
    block_size: BlockSize,
    outcome: Arc<OnceCell<PrefixOutcome>>,
}

/// The prefix lookups of one prepared request, shared by every bucket attempt and stage.
///
/// It rides inside [`RequestTokens`], so it lives exactly as long as the
/// prepared request. Entries are keyed by the `Arc<CacheSource>` (its identity, so different
/// indexes or indexers never share an entry) and the block size the tokens were hashed with.
/// Hits, confirmed misses and unavailable backends are all remembered: a request whose
/// indexer timed out in its first bucket does not wait for it again in the next. Concurrent
/// callers of the same entry wait for the one lookup in progress. An invalid query (an error)
/// is not remembered.
///
/// What the memo shares is the lookup only: each pick still restricts the prefixes to its own
/// candidates, reads its own load snapshot and runs its own admission.
#[derive(Default)]
pub struct PrefixMemo {
    entries: Mutex<Vec<Entry>>,
}

impl fmt::Debug for PrefixMemo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefixMemo").field("entries", &self.len()).finish()
    }
}

impl PrefixMemo {
    /// Entries (distinct source and block size pairs asked for).
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether nothing was looked up yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The outcome for `source` and `block_size`, looking `tokens` (whose memo this is) up on
    /// the first call only, with their block hashes hashed once per block size.
    pub(crate) async fn lookup(
        &self,
        source: &Arc<CacheSource>,
        model: &ModelId,
        tokens: &RequestTokens,
        block_size: BlockSize,
    ) -> Result<PrefixOutcome, LookupError> {
        let cell = {
            let mut entries = self.entries.lock();
            let found = entries
                .iter()
                .find(|e| Arc::ptr_eq(&e.source, source) && e.block_size == block_size);
            match found {
                Some(entry) => Arc::clone(&entry.outcome),
                None => {
                    let outcome = Arc::new(OnceCell::new());
                    entries.push(Entry {
                        source: Arc::clone(source),
                        block_size,
                        outcome: Arc::clone(&outcome),
                    });
                    outcome
                }
            }
        };
        cell.get_or_try_init(|| async {
            let hashes = tokens.block_hashes(block_size);
            source.lookup_hashes(model, &hashes, tokens.ids().len() as u64, block_size).await
        })
        .await
        .cloned()
    }
}
