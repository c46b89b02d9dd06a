//! The prefix index: stores, lookups, removals, clears and tiers per holder, skipped events by
//! reason, the node limit and eviction, chunked batches beside concurrent readers, and
//! proptests against a reference model.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::*;
use crate::hash::block_hashes;
use crate::wire::{BlockRemoved, BlockStored, ExtraKey, Locality, MediumField, SpecKind};

const BS: u32 = 2;

fn model() -> ModelId {
    ModelId::new("m")
}

fn wid(id: &str) -> WorkerId {
    WorkerId::new(id).expect("non-empty id")
}

fn holder(index: &KvIndex, worker: &str, rank: u32) -> Holder {
    index.holder(&model(), &wid(worker), 1, rank, BS).expect("register")
}

/// A store of `tokens` (whole blocks) with engine hashes `hashes`.
fn stored(parent: Option<u64>, hashes: &[u64], tokens: &[u32]) -> Event {
    Event::Stored(BlockStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids: tokens.to_vec(),
        block_size: Some(i64::from(BS)),
        ..BlockStored::default()
    })
}

fn on(event: Event, medium: Medium) -> Event {
    match event {
        Event::Stored(s) => {
            Event::Stored(BlockStored { medium: Some(MediumField::Known(medium)), ..s })
        }
        Event::Removed(r) => {
            Event::Removed(BlockRemoved { medium: Some(MediumField::Known(medium)), ..r })
        }
        other => other,
    }
}

fn removed(hashes: &[u64]) -> Event {
    Event::Removed(BlockRemoved { block_hashes: hashes.to_vec(), ..BlockRemoved::default() })
}

fn matches(index: &KvIndex, tokens: &[u32]) -> Vec<(String, u32, Medium)> {
    index
        .lookup(&model(), &block_hashes(tokens, BS, None))
        .matches
        .into_iter()
        .map(|m| (m.worker.to_string(), m.blocks, m.tier))
        .collect()
}

fn check(index: &KvIndex) {
    index.with_tree(&model(), Tree::check).expect("model exists");
}

#[test]
fn stores_at_the_root_and_under_known_parents_and_looks_up_leading_blocks() {
    let index = KvIndex::default();
    let a = holder(&index, "a", 0);
    let b = holder(&index, "b", 0);
    let report =
        a.apply(&[stored(None, &[10, 11], &[1, 2, 3, 4]), stored(Some(11), &[12], &[5, 6])]);
    assert_eq!((report.events, report.stored), (2, 3));
    b.apply(&[stored(None, &[20], &[1, 2]), stored(Some(20), &[21], &[9, 9])]);
    assert_eq!(
        matches(&index, &[1, 2, 3, 4, 5, 6, 7]),
        vec![("a".into(), 3, Medium::Gpu), ("b".into(), 1, Medium::Gpu)]
    );
    assert_eq!(
        matches(&index, &[1, 2, 9, 9]),
        vec![("b".into(), 2, Medium::Gpu), ("a".into(), 1, Medium::Gpu)]
    );
    assert!(matches(&index, &[2, 1]).is_empty());
    assert!(index.lookup(&ModelId::new("other"), &[1]).is_empty());
    assert_eq!((a.blocks(), b.blocks()), (3, 2));
    let stats = index.stats();
    assert_eq!((stats.nodes, stats.block_holders), (4, 5), "blocks [1,2] are shared");
    check(&index);
}

#[test]
fn a_store_whose_parent_is_unknown_is_skipped_and_counted() {
    let index = KvIndex::default();
    let a = holder(&index, "a", 0);
    let report = a.apply(&[stored(Some(99), &[1], &[1, 2])]);
    assert_eq!(report.skipped.get(SkipReason::UnknownParent), 1);
    assert_eq!(report.stored, 0);
    assert_eq!(index.stats().nodes, 0);
    // Another holder's engine hash is no parent for this one.
    let b = holder(&index, "b", 0);
    b.apply(&[stored(None, &[5], &[1, 2])]);
    let report = a.apply(&[stored(Some(5), &[6], &[3, 4])]);
    assert_eq!(report.skipped.get(SkipReason::UnknownParent), 1);
}

#[test]
fn removal_by_engine_hash_cuts_the_leading_run_and_prunes_empty_nodes() {
    let index = KvIndex::default();
    let a = holder(&index, "a", 0);
    a.apply(&[stored(None, &[1, 2, 3], &[1, 1, 2, 2, 3, 3])]);
    let report = a.apply(&[removed(&[2, 404])]);
    assert_eq!((report.removed, report.unknown_removals), (1, 1));
    assert_eq!(matches(&index, &[1, 1, 2, 2, 3, 3]), vec![("a".into(), 1, Medium::Gpu)]);
    assert_eq!(index.stats().nodes, 3, "the emptied middle node stays while it has a child");
    a.apply(&[removed(&[3])]);
    assert_eq!(index.stats().nodes, 1, "the empty middle node goes with its last child");
    a.apply(&[removed(&[1])]);
    assert_eq!(index.stats().nodes, 0);
    assert_eq!(a.blocks(), 0);
    check(&index);
}

#[test]
fn all_blocks_cleared_and_clear_affect_one_holder_only() {
    let index = KvIndex::default();
    let a = holder(&index, "a", 0);
    let b = holder(&index, "b", 0);
    a.apply(&[stored(None, &[1, 2], &[1, 1, 2, 2])]);
    b.apply(&[stored(None, &[7], &[1, 1])]);
    let report = a.apply(&[Event::AllCleared]);
    assert_eq!(report.clears, 1);
    assert_eq!(matches(&index, &[1, 1, 2, 2]), vec![("b".into(), 1, Medium::Gpu)]);
    assert_eq!(index.stats().nodes, 1);
    assert_eq!(b.clear(), 1);
    assert_eq!(index.stats().nodes, 0);
    check(&index);
}

#[test]
fn removed_workers_are_purged_and_their_handles_refused() {
    let index = KvIndex::default();
    let old = index.holder(&model(), &wid("a"), 1, 0, BS).expect("register");
    old.apply(&[stored(None, &[1], &[1, 1])]);
    let replacement = index.holder(&model(), &wid("a"), 2, 0, BS).expect("register");
    replacement.apply(&[stored(None, &[1], &[5, 5])]);
    assert_eq!(index.remove_incarnation(&wid("a"), 1), 1);
    assert!(!old.is_live());
    let report = old.apply(&[stored(None, &[2], &[2, 2]), Event::AllCleared]);
    assert_eq!(report.skipped.get(SkipReason::StaleHolder), 2);
    assert!(matches(&index, &[1, 1]).is_empty());
    assert_eq!(matches(&index, &[5, 5]), vec![("a".into(), 1, Medium::Gpu)]);
    assert_eq!(index.remove_worker(&wid("a")), 1);
    assert!(matches(&index, &[5, 5]).is_empty());
    assert_eq!(index.stats().nodes, 0);
    // The freed slot is reused with a new generation; the old handle stays dead.
    let fresh = index.holder(&model(), &wid("b"), 1, 0, BS).expect("register");
    fresh.apply(&[stored(None, &[1], &[1, 1])]);
    assert_eq!(old.apply(&[removed(&[1])]).skipped.get(SkipReason::StaleHolder), 1);
    assert_eq!(matches(&index, &[1, 1]), vec![("b".into(), 1, Medium::Gpu)]);
    check(&index);
}

#[test]
fn a_flushed_worker_loses_its_blocks_and_keeps_publishing() {
    let index = KvIndex::default();
    let a = holder(&index, "a", 0);
    let b = holder(&index, "b", 0);
    a.apply(&[stored(None, &[1, 2], &[1, 1, 2, 2])]);
    b.apply(&[stored(None, &[1], &[1, 1])]);
    assert_eq!(index.clear_worker(&wid("a")), 2);
    assert_eq!(matches(&index, &[1, 1, 2, 2]), vec![("b".into(), 1, Medium::Gpu)]);
    assert!(a.is_live(), "the handle stays");
    a.apply(&[stored(None, &[3], &[3, 3])]);
    assert_eq!(matches(&index, &[3, 3]), vec![("a".into(), 1, Medium::Gpu)]);
    check(&index);
}

#[test]
fn tiers_are_tracked_per_block_and_holder() {
    let index = KvIndex::default();
    let a = holder(&index, "a", 0);
    a.apply(&[on(stored(None, &[1, 2], &[1, 1, 2, 2]), Medium::Gpu)]);
    a.apply(&[on(stored(Some(1), &[2], &[2, 2]), Medium::Cpu)]);
    assert_eq!(matches(&index, &[1, 1, 2, 2]), vec![("a".into(), 2, Medium::Gpu)]);
    a.apply(&[on(removed(&[2]), Medium::Gpu)]);
    assert_eq!(matches(&index, &[1, 1, 2, 2]), vec![("a".into(), 2, Medium::Cpu)]);
    a.apply(&[on(removed(&[2]), Medium::Disk)]);
    assert_eq!(matches(&index, &[1, 1, 2, 2]), vec![("a".into(), 2, Medium::Cpu)], "not on disk");
    a.apply(&[on(removed(&[2]), Medium::Cpu)]);
    assert_eq!(matches(&index, &[1, 1, 2, 2]), vec![("a".into(), 1, Medium::Gpu)]);
    check(&index);
}

#[test]
fn ranks_of_one_worker_report_their_best_match() {
    let index = KvIndex::default();
    let r0 = holder(&index, "a", 0);
    let r1 = holder(&index, "a", 1);
    r0.apply(&[stored(None, &[1], &[1, 1])]);
    r1.apply(&[stored(None, &[1, 2], &[1, 1, 2, 2])]);
    let result = index.lookup(&model(), &block_hashes(&[1, 1, 2, 2], BS, None));
    assert_eq!(result.matches.len(), 1);
    assert_eq!((result.matches[0].blocks, result.matches[0].rank), (2, 1));
    assert_eq!(result.blocks(&wid("a")), 2);
    assert_eq!(result.blocks(&wid("zzz")), 0);
    assert_eq!(result.query_blocks, 2);
}

#[test]
fn events_the_router_cannot_use_are_skipped_by_reason() {
    let index = KvIndex::default();
    let a = holder(&index, "a", 0);
    let base = BlockStored {
        block_hashes: vec![1],
        token_ids: vec![1, 1],
        block_size: Some(2),
        ..BlockStored::default()
    };
    let cases = [
        (BlockStored { block_size: Some(16), ..base.clone() }, SkipReason::BlockSizeMismatch),
        (BlockStored { token_ids: vec![1, 1, 1], ..base.clone() }, SkipReason::TokenCountMismatch),
        (
            BlockStored { locality: Some(Locality::Remote), ..base.clone() },
            SkipReason::RemoteLocality,
        ),
        (
            BlockStored { kv_cache_spec_kind: Some(SpecKind::Other), ..base.clone() },
            SkipReason::NotFullAttention,
        ),
        (BlockStored { group_idx: Some(1), ..base.clone() }, SkipReason::OtherGroup),
        (
            BlockStored { medium: Some(MediumField::Unknown), ..base.clone() },
            SkipReason::UnknownMedium,
        ),
        (
            BlockStored { extra_keys: Some(vec![Some(vec![ExtraKey::Other])]), ..base.clone() },
            SkipReason::ExtraKeys,
        ),
    ];
    for (event, reason) in cases {
        let report = a.apply(&[Event::Stored(event)]);
        assert_eq!(report.skipped.get(reason), 1, "{reason}");
        assert_eq!(report.skipped.total(), 1, "{reason}");
    }
    assert_eq!(index.stats().nodes, 0);
    let report =
        a.apply(&[Event::Unknown, Event::Invalid { event: "BlockStored", missing: "token_ids" }]);
    assert_eq!(report.skipped.get(SkipReason::UnknownEventType), 1);
    assert_eq!(report.skipped.get(SkipReason::InvalidEvent), 1);
    // A full-attention group other than 0 is accepted, and its removals apply.
    let report = a.apply(&[Event::Stored(BlockStored {
        group_idx: Some(3),
        kv_cache_spec_kind: Some(SpecKind::Full),
        ..base
    })]);
    assert_eq!(report.stored, 1);
    let report = a.apply(&[Event::Removed(BlockRemoved {
        block_hashes: vec![1],
        group_idx: Some(5),
        ..BlockRemoved::default()
    })]);
    assert_eq!(report.skipped.get(SkipReason::OtherGroup), 1);
    assert_eq!(index.stats().nodes, 1);
}

#[test]
fn blocks_after_foreign_extra_keys_are_not_stored_but_lora_keys_are_fine() {
    let index = KvIndex::default();
    let a = holder(&index, "a", 0);
    let event = BlockStored {
        block_hashes: vec![1, 2, 3],
        token_ids: vec![1, 1, 2, 2, 3, 3],
        block_size: Some(2),
        lora_name: Some("ad".into()),
        extra_keys: Some(vec![
            Some(vec![ExtraKey::Str("ad".into())]),
            Some(vec![ExtraKey::Str("ad".into()), ExtraKey::Str("image-hash".into())]),
            None,
        ]),
        ..BlockStored::default()
    };
    let report = a.apply(&[Event::Stored(event)]);
    assert_eq!(report.stored, 1);
    assert_eq!(report.skipped.get(SkipReason::ExtraKeys), 1);
    let lora = index.lookup(&model(), &block_hashes(&[1, 1, 2, 2], BS, Some("ad")));
    assert_eq!(lora.blocks(&wid("a")), 1);
    assert!(matches(&index, &[1, 1]).is_empty(), "LoRA blocks never match un-salted requests");
}

#[test]
fn the_node_limit_holds_and_eviction_takes_unreferenced_leaves_first() {
    let index = KvIndex::new(IndexConfig::new(4, 1));
    let a = holder(&index, "a", 0);
    let b = holder(&index, "b", 0);
    // A hot chain of 3 blocks, and cold single blocks pushed through the rest of the space.
    a.apply(&[stored(None, &[1, 2, 3], &[1, 1, 2, 2, 3, 3])]);
    for i in 10..40u32 {
        // Keep the chain referenced, as request lookups would.
        assert!(!matches(&index, &[1, 1, 2, 2, 3, 3]).is_empty());
        b.apply(&[stored(None, &[u64::from(i)], &[i, i])]);
        assert!(index.stats().nodes <= 4);
        check(&index);
    }
    assert_eq!(matches(&index, &[1, 1, 2, 2, 3, 3]), vec![("a".into(), 3, Medium::Gpu)]);
    assert!(index.stats().evicted >= 26);
    assert!(b.blocks() <= 1);
    // An evicted block's later removal is harmless, and its children have no parent.
    let report = b.apply(&[removed(&[10]), stored(Some(10), &[99], &[9, 9])]);
    assert_eq!(report.skipped.get(SkipReason::UnknownParent), 1);
    check(&index);
}

#[test]
fn the_node_limit_holds_across_models_and_a_model_beyond_the_split_is_refused() {
    let index = KvIndex::new(IndexConfig::new(6, 2));
    let models = [ModelId::new("m"), ModelId::new("n")];
    let holders: Vec<Holder> =
        models.iter().map(|m| index.holder(m, &wid("a"), 1, 0, BS).expect("register")).collect();
    for i in 0..20u32 {
        for holder in &holders {
            holder.apply(&[stored(None, &[u64::from(i)], &[i, i])]);
        }
        let stats = index.stats();
        assert!(stats.nodes <= 6, "{stats:?}");
        assert!(stats.models.iter().all(|m| m.nodes <= 3), "{stats:?}");
    }
    assert_eq!(index.stats().nodes, 6, "each model keeps its half");
    let err = index.holder(&ModelId::new("o"), &wid("a"), 1, 0, BS).expect_err("a third model");
    assert!(matches!(err, IndexError::TooManyModels { limit: 2, .. }), "{err}");
    index.holder(&models[1], &wid("b"), 1, 0, BS).expect("a known model takes more holders");
}

#[test]
fn a_one_node_index_reports_full_instead_of_evicting_the_parent_it_extends() {
    let index = KvIndex::new(IndexConfig::new(1, 1));
    let a = holder(&index, "a", 0);
    let report = a.apply(&[stored(None, &[1, 2], &[1, 1, 2, 2])]);
    assert_eq!(report.stored, 1);
    assert_eq!(report.skipped.get(SkipReason::IndexFull), 1);
    assert_eq!(matches(&index, &[1, 1, 2, 2]), vec![("a".into(), 1, Medium::Gpu)]);
    check(&index);
}

#[test]
fn a_reused_engine_hash_moves_the_claim() {
    let index = KvIndex::default();
    let a = holder(&index, "a", 0);
    a.apply(&[stored(None, &[1], &[1, 1])]);
    a.apply(&[stored(None, &[1], &[2, 2])]);
    assert!(matches(&index, &[1, 1]).is_empty());
    assert_eq!(matches(&index, &[2, 2]), vec![("a".into(), 1, Medium::Gpu)]);
    assert_eq!(a.blocks(), 1);
    check(&index);
}

#[test]
fn large_batches_are_applied_in_chunks_and_concurrent_readers_progress() {
    let index = std::sync::Arc::new(KvIndex::default());
    let a = holder(&index, "a", 0);
    let n = 20 * WRITE_CHUNK as u32;
    let tokens: Vec<u32> = (0..n * BS).collect();
    let hashes: Vec<u64> = (0..u64::from(n)).collect();
    let reader = {
        let index = std::sync::Arc::clone(&index);
        let tokens = tokens.clone();
        std::thread::spawn(move || {
            let hashes = block_hashes(&tokens, BS, None);
            let mut seen = Vec::new();
            for _ in 0..200 {
                seen.push(index.lookup(&model(), &hashes).blocks(&wid("a")));
            }
            seen
        })
    };
    assert_eq!(a.apply(&[stored(None, &hashes, &tokens)]).stored, u64::from(n));
    let seen = reader.join().expect("reader thread");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "a reader sees a growing prefix, never garbage");
    assert_eq!(matches(&index, &tokens), vec![("a".into(), n, Medium::Gpu)]);
    assert_eq!(a.clear(), u64::from(n));
    check(&index);
}

// ---- Property test against a reference model -------------------------------------------

/// The reference: per holder, engine hash -> (token prefix, tier bits).
type Reference = Vec<HashMap<u64, (Vec<u32>, u8)>>;

const HOLDERS: [(&str, u32); 3] = [("a", 0), ("a", 1), ("b", 0)];

fn engine_hash(holder: usize, prefix: &[u32]) -> u64 {
    let bytes: Vec<u8> = prefix.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxh3_64_with_seed(&bytes, 99) ^ (holder as u64).wrapping_mul(0x9E37_79B9)
}

#[derive(Clone, Debug)]
enum Op {
    Store {
        holder: usize,
        parent: Option<prop::sample::Index>,
        blocks: Vec<[u32; 2]>,
        medium: usize,
    },
    Remove {
        holder: usize,
        which: prop::sample::Index,
        medium: usize,
    },
    Clear {
        holder: usize,
    },
    RemoveWorker,
}

fn op() -> impl Strategy<Value = Op> {
    let block = [0u32..3, 0u32..2];
    prop_oneof![
        6 => (0..3usize, proptest::option::of(any::<prop::sample::Index>()),
              proptest::collection::vec(block, 1..4), 0..3usize)
            .prop_map(|(holder, parent, blocks, medium)| Op::Store { holder, parent, blocks, medium }),
        3 => (0..3usize, any::<prop::sample::Index>(), 0..3usize)
            .prop_map(|(holder, which, medium)| Op::Remove { holder, which, medium }),
        1 => (0..3usize).prop_map(|holder| Op::Clear { holder }),
        1 => Just(Op::RemoveWorker),
    ]
}

const MEDIA: [Medium; 3] = [Medium::Gpu, Medium::Cpu, Medium::Disk];

/// Applies `op` to the index and the reference; returns false when the op was a no-op.
fn run(
    op: &Op,
    index: &KvIndex,
    holders: &mut [Holder],
    reference: &mut Reference,
    incarnation: &mut u64,
) {
    match op {
        Op::Store { holder, parent, blocks, medium } => {
            let held: Vec<(u64, Vec<u32>)> = {
                let mut v: Vec<_> =
                    reference[*holder].iter().map(|(h, (p, _))| (*h, p.clone())).collect();
                v.sort();
                v
            };
            let (parent_hash, mut prefix) = match parent {
                Some(pick) if !held.is_empty() => {
                    let (h, p) = &held[pick.index(held.len())];
                    (Some(*h), p.clone())
                }
                _ => (None, Vec::new()),
            };
            let mut hashes = Vec::new();
            let mut tokens = Vec::new();
            let bit = MEDIA[*medium].bit();
            for block in blocks {
                prefix.extend_from_slice(block);
                tokens.extend_from_slice(block);
                let h = engine_hash(*holder, &prefix);
                hashes.push(h);
                reference[*holder].entry(h).or_insert_with(|| (prefix.clone(), 0)).1 |= bit;
            }
            let report = holders[*holder]
                .apply(&[on(stored(parent_hash, &hashes, &tokens), MEDIA[*medium])]);
            assert_eq!(report.skipped.total(), 0, "{report:?}");
        }
        Op::Remove { holder, which, medium } => {
            let mut held: Vec<u64> = reference[*holder].keys().copied().collect();
            if held.is_empty() {
                return;
            }
            held.sort_unstable();
            let h = held[which.index(held.len())];
            let bit = MEDIA[*medium].bit();
            if let Some(entry) = reference[*holder].get_mut(&h) {
                entry.1 &= !bit;
                if entry.1 == 0 {
                    reference[*holder].remove(&h);
                }
            }
            holders[*holder].apply(&[on(removed(&[h]), MEDIA[*medium])]);
        }
        Op::Clear { holder } => {
            reference[*holder].clear();
            holders[*holder].apply(&[Event::AllCleared]);
        }
        Op::RemoveWorker => {
            index.remove_worker(&wid("a"));
            *incarnation += 1;
            for (slot, (worker, rank)) in HOLDERS.iter().enumerate() {
                if *worker == "a" {
                    reference[slot].clear();
                    holders[slot] = index
                        .holder(&model(), &wid(worker), *incarnation, *rank, BS)
                        .expect("register");
                }
            }
        }
    }
}

/// Per worker: the best (blocks, tier) over its ranks for a query, from the reference.
fn expected(reference: &Reference, query: &[u32]) -> BTreeMap<String, (u32, Medium)> {
    let mut out: BTreeMap<String, (u32, Medium)> = BTreeMap::new();
    for (slot, held) in reference.iter().enumerate() {
        let by_prefix: HashMap<&[u32], u8> =
            held.values().map(|(p, t)| (p.as_slice(), *t)).collect();
        let mut blocks = 0;
        let mut tier = Medium::Gpu;
        while (blocks + 1) * 2 <= query.len() as u32 {
            let Some(bits) = by_prefix.get(&query[..((blocks + 1) * 2) as usize]) else { break };
            tier = tier.max(Medium::ALL[bits.trailing_zeros() as usize]);
            blocks += 1;
        }
        if blocks > 0 {
            let worker = HOLDERS[slot].0.to_string();
            let entry = out.entry(worker).or_insert((0, Medium::Gpu));
            if blocks > entry.0 || (blocks == entry.0 && tier < entry.1) {
                *entry = (blocks, tier);
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_index_agrees_with_a_reference_model(
        ops in proptest::collection::vec(op(), 1..40),
        queries in proptest::collection::vec(proptest::collection::vec(0u32..3, 0..10), 1..8),
    ) {
        let index = KvIndex::default();
        let mut incarnation = 1;
        let mut holders: Vec<Holder> = HOLDERS
            .iter()
            .map(|(w, r)| index.holder(&model(), &wid(w), incarnation, *r, BS).expect("register"))
            .collect();
        let mut reference: Reference = vec![HashMap::new(); HOLDERS.len()];
        for op in &ops {
            run(op, &index, &mut holders, &mut reference, &mut incarnation);
            check(&index);
            for (slot, h) in holders.iter().enumerate() {
                prop_assert_eq!(h.blocks(), reference[slot].len() as u64);
            }
            for query in &queries {
                let got: BTreeMap<String, (u32, Medium)> = index
                    .lookup(&model(), &block_hashes(query, BS, None))
                    .matches
                    .into_iter()
                    .map(|m| (m.worker.to_string(), (m.blocks, m.tier)))
                    .collect();
                prop_assert_eq!(got, expected(&reference, query), "query {:?}", query);
            }
        }
        // Store-then-remove-everything leaves the index empty.
        for h in &holders {
            h.clear();
        }
        prop_assert_eq!(index.stats().nodes, 0);
        prop_assert_eq!(index.stats().block_holders, 0);
    }

    #[test]
    fn under_a_node_limit_the_index_never_claims_more_than_the_engines_hold(
        ops in proptest::collection::vec(op(), 1..60),
        queries in proptest::collection::vec(proptest::collection::vec(0u32..3, 0..10), 1..6),
        limit in 1usize..8,
    ) {
        let index = KvIndex::new(IndexConfig::new(limit, 1));
        let mut incarnation = 1;
        let mut holders: Vec<Holder> = HOLDERS
            .iter()
            .map(|(w, r)| index.holder(&model(), &wid(w), incarnation, *r, BS).expect("register"))
            .collect();
        let mut reference: Reference = vec![HashMap::new(); HOLDERS.len()];
        for op in &ops {
            if let Op::Store { holder, parent, blocks, medium } = op {
                // Stores may be cut short by the limit; mirror only what is known to the index
                // by letting the reference hold them too (the index may know less, never more).
                let _ = (holder, parent, blocks, medium);
            }
            run_lenient(op, &index, &mut holders, &mut reference, &mut incarnation);
            check(&index);
            prop_assert!(index.stats().nodes as usize <= limit);
            for query in &queries {
                let want = expected(&reference, query);
                for m in index.lookup(&model(), &block_hashes(query, BS, None)).matches {
                    let bound = want.get(m.worker.as_str()).map_or(0, |(b, _)| *b);
                    prop_assert!(m.blocks <= bound, "{} claims {} > {}", m.worker, m.blocks, bound);
                }
            }
        }
    }
}

/// Like `run`, but tolerates stores cut short by the node limit.
fn run_lenient(
    op: &Op,
    index: &KvIndex,
    holders: &mut [Holder],
    reference: &mut Reference,
    incarnation: &mut u64,
) {
    match op {
        Op::Store { holder, parent, blocks, medium } => {
            let held: Vec<(u64, Vec<u32>)> = {
                let mut v: Vec<_> =
                    reference[*holder].iter().map(|(h, (p, _))| (*h, p.clone())).collect();
                v.sort();
                v
            };
            let (parent_hash, mut prefix) = match parent {
                Some(pick) if !held.is_empty() => {
                    let (h, p) = &held[pick.index(held.len())];
                    (Some(*h), p.clone())
                }
                _ => (None, Vec::new()),
            };
            let mut hashes = Vec::new();
            let mut tokens = Vec::new();
            for block in blocks {
                prefix.extend_from_slice(block);
                tokens.extend_from_slice(block);
                let h = engine_hash(*holder, &prefix);
                hashes.push(h);
                reference[*holder].entry(h).or_insert_with(|| (prefix.clone(), 0)).1 |=
                    MEDIA[*medium].bit();
            }
            holders[*holder].apply(&[on(stored(parent_hash, &hashes, &tokens), MEDIA[*medium])]);
        }
        other => run(other, index, holders, reference, incarnation),
    }
}
