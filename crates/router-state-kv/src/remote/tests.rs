//! Conversion and the service's answers, without a transport (the loopback tests in
//! `tests/remote.rs` cover the wire).

use std::sync::Arc;

use router_proto::router::kv::v1 as pb;
use router_proto::router::kv::v1::lookup_request::Query;
use router_workers::{ModelId, WorkerId};
use tonic::Code;

use super::convert::{from_proto, medium_from_proto, medium_to_proto, to_proto};
use super::*;
use crate::hash::{Salt, block_hashes, salted_block_hashes};
use crate::wire::{BlockStored, Event, MediumField};
use crate::{KvIndex, Medium, PrefixMatch, PrefixMatches};

fn wid(id: &str) -> WorkerId {
    WorkerId::new(id).expect("non-empty id")
}

/// "a" holds 3 blocks of 2 tokens on the GPU, "b" the first one on the CPU.
fn index() -> Arc<KvIndex> {
    let index = Arc::new(KvIndex::default());
    let model = ModelId::new("m");
    let store = |worker: &str, hashes: &[u64], tokens: &[u32], medium: Medium| {
        let holder = index.holder(&model, &wid(worker), 1, 0, 2).expect("register");
        holder.apply(&[Event::Stored(BlockStored {
            block_hashes: hashes.to_vec(),
            token_ids: tokens.to_vec(),
            block_size: Some(2),
            medium: Some(MediumField::Known(medium)),
            ..BlockStored::default()
        })]);
    };
    store("a", &[1, 2, 3], &[1, 2, 3, 4, 5, 6], Medium::Gpu);
    store("b", &[9], &[1, 2], Medium::Cpu);
    index
}

fn by_hashes(model: &str, hashes: Vec<u64>) -> pb::LookupRequest {
    pb::LookupRequest {
        model: model.to_owned(),
        query: Some(Query::BlockHashes(pb::BlockHashes { hashes })),
    }
}

fn by_tokens(model: &str, tokens: &[u32], block_size: u32) -> pb::LookupRequest {
    pb::LookupRequest {
        model: model.to_owned(),
        query: Some(Query::Tokens(pb::TokenQuery {
            token_ids: tokens.to_vec(),
            block_size,
            ..pb::TokenQuery::default()
        })),
    }
}

#[test]
fn every_tier_survives_the_wire_and_unset_is_refused() {
    for medium in Medium::ALL {
        assert_eq!(medium_from_proto(medium_to_proto(medium).into()), Some(medium));
    }
    assert_eq!(medium_from_proto(pb::Medium::Unspecified.into()), None);
    assert_eq!(medium_from_proto(99), None);
}

#[test]
fn answers_by_hashes_and_by_tokens_agree_with_the_index() {
    let index = index();
    let service = KvIndexService::new(Arc::clone(&index));
    let tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    let local = index.lookup(&ModelId::new("m"), &block_hashes(&tokens, 2, None));
    assert_eq!(local.matches.len(), 2);

    let hashed = service.answer(by_hashes("m", block_hashes(&tokens, 2, None))).expect("valid");
    assert_eq!(from_proto(hashed, Some(4)).expect("well formed"), local);
    let tokenized = service.answer(by_tokens("m", &tokens, 2)).expect("valid");
    assert_eq!(from_proto(tokenized, Some(4)).expect("well formed"), local);
}

#[test]
fn the_salt_of_a_token_query_reaches_the_hash() {
    let index = Arc::new(KvIndex::default());
    let model = ModelId::new("m");
    let holder = index.holder(&model, &wid("a"), 1, 0, 2).expect("register");
    holder.apply(&[Event::Stored(BlockStored {
        block_hashes: vec![1],
        token_ids: vec![1, 2],
        block_size: Some(2),
        lora_name: Some("ad".to_owned()),
        ..BlockStored::default()
    })]);
    let service = KvIndexService::new(Arc::clone(&index));
    let mut request = by_tokens("m", &[1, 2], 2);
    assert!(service.answer(request.clone()).expect("valid").matches.is_empty(), "unsalted");
    if let Some(Query::Tokens(query)) = &mut request.query {
        query.lora_name = "ad".to_owned();
    }
    let answer = service.answer(request).expect("valid");
    assert_eq!(answer.matches.len(), 1);
    let salted = salted_block_hashes(&[1, 2], 2, Salt::lora(Some("ad")));
    assert_eq!(index.lookup(&model, &salted).blocks(&wid("a")), 1);
}

#[test]
fn unknown_models_and_empty_queries_are_confirmed_misses() {
    let service = KvIndexService::new(index());
    let other = service.answer(by_hashes("other", block_hashes(&[1, 2, 3, 4], 2, None)));
    assert_eq!(other.expect("valid"), pb::LookupResponse { query_blocks: 2, matches: vec![] });
    let empty = service.answer(by_hashes("m", vec![])).expect("valid");
    assert_eq!(empty, pb::LookupResponse { query_blocks: 0, matches: vec![] });
    let short = service.answer(by_tokens("m", &[1], 2)).expect("a partial block is no block");
    assert_eq!(short.query_blocks, 0);
}

#[test]
fn invalid_queries_are_refused_with_invalid_argument() {
    let limits = ServiceLimits { max_query_blocks: 3, max_query_tokens: 6, ..Default::default() };
    let service = KvIndexService::new(index()).with_limits(limits);
    let cases = [
        (by_hashes("", vec![1]), "model is empty"),
        (pb::LookupRequest { model: "m".to_owned(), query: None }, "no query"),
        (by_tokens("m", &[1, 2], 0), "block_size must be at least 1"),
        (by_hashes("m", vec![1, 2, 3, 4]), "4 block hashes exceed the limit of 3"),
        (by_tokens("m", &[1; 7], 2), "7 token ids exceed the limit of 6"),
    ];
    for (request, message) in cases {
        let status = service.answer(request).expect_err(message);
        assert_eq!(status.code(), Code::InvalidArgument, "{message}");
        assert!(status.message().contains(message), "{}", status.message());
    }
    // At the limits exactly: answered.
    assert!(service.answer(by_hashes("m", vec![1, 2, 3])).is_ok());
    assert!(service.answer(by_tokens("m", &[1; 6], 2)).is_ok());
}

fn answer(query_blocks: u32, matches: &[(&str, u32, i32)]) -> pb::LookupResponse {
    pb::LookupResponse {
        query_blocks,
        matches: matches
            .iter()
            .map(|&(worker, blocks, tier)| pb::PrefixMatch {
                worker_id: worker.to_owned(),
                dp_rank: 1,
                blocks,
                tier,
            })
            .collect(),
    }
}

#[test]
fn malformed_answers_are_refused() {
    let gpu = i32::from(pb::Medium::Gpu);
    let cases: [(pb::LookupResponse, Option<usize>, &str); 6] = [
        (answer(2, &[("", 1, gpu)]), None, "invalid worker id"),
        (answer(2, &[("a", 1, 0)]), None, "unknown tier 0"),
        (answer(2, &[("a", 0, gpu)]), None, "claims 0 blocks"),
        (answer(2, &[("a", 3, gpu)]), None, "claims 3 blocks of a 2-block query"),
        (answer(2, &[("a", 1, gpu), ("a", 2, gpu)]), None, "worker a appears twice"),
        (answer(2, &[]), Some(3), "answer counts 2 query blocks, the query has 3"),
    ];
    for (answer, expected, message) in cases {
        let err = from_proto(answer, expected).expect_err(message);
        assert!(err.to_string().contains(message), "{err}");
    }
    let fine = from_proto(answer(2, &[("a", 2, gpu), ("b", 1, gpu)]), Some(2)).expect("valid");
    assert_eq!(
        fine,
        PrefixMatches {
            query_blocks: 2,
            matches: vec![
                PrefixMatch { worker: wid("a"), rank: 1, blocks: 2, tier: Medium::Gpu },
                PrefixMatch { worker: wid("b"), rank: 1, blocks: 1, tier: Medium::Gpu },
            ],
        }
    );
    // And what the service sends always reads back.
    let local = index().lookup(&ModelId::new("m"), &block_hashes(&[1, 2, 3, 4], 2, None));
    assert_eq!(from_proto(to_proto(&local), Some(2)).expect("round trip"), local);
}

#[test]
fn client_configurations_are_checked_without_connecting() {
    let ok = RemoteIndexClient::new(ClientConfig::new(vec!["127.0.0.1:1".into()]))
        .expect("valid without a server");
    assert_eq!(ok.inflight(), 0);
    assert_eq!(ok.config().max_inflight, 32);
    let cases = [
        (ClientConfig::new(vec![]), "no kv indexer endpoint"),
        (ClientConfig::new(vec!["http://[bad".into()]), "invalid kv indexer endpoint"),
        (
            ClientConfig {
                query_timeout: std::time::Duration::ZERO,
                ..ClientConfig::new(vec!["h:1".into()])
            },
            "timeout must be above zero",
        ),
        (ClientConfig { max_inflight: 0, ..ClientConfig::new(vec!["h:1".into()]) }, "at least 1"),
    ];
    for (config, message) in cases {
        let err = RemoteIndexClient::new(config).expect_err(message);
        assert!(err.to_string().contains(message), "{err}");
    }
}

#[test]
fn only_an_invalid_query_is_not_an_unavailable_backend() {
    let status = tonic::Status::invalid_argument("x");
    let invalid = RemoteError::InvalidQuery { endpoint: "e".into(), source: status };
    assert!(!invalid.is_unavailable());
    assert!(RemoteError::Busy { limit: 1 }.is_unavailable());
    assert!(RemoteError::Timeout { after: std::time::Duration::from_millis(1) }.is_unavailable());
}
