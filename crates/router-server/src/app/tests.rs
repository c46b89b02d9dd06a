//! The context's own rules: a model is found by its name, else by the wildcard; a dispatch
//! counts the prefill work its policy expected (none for decode) and predicts the blocks of a
//! tokenized request on an engine with a block size; an engine that leaves the registry is
//! forgotten, so one added later under its id starts from zero.

use std::sync::Arc;
use std::time::Instant;

use router_policies::{Pick, PickReason, RequestTokens};
use router_workers::{ModelId, Stage, Worker, WorkerId};
use tokio_util::sync::CancellationToken;

use super::forget_removed;
use crate::tests::context;

fn model_yaml(id: &str, worker: &str) -> String {
    format!(
        "  - id: \"{id}\"\n    workers: [{worker}]\n    \
         buckets: [{{id: all, groups: {{plain: {{}}}}}}]\n"
    )
}

#[test]
fn a_model_is_found_by_its_name_else_by_the_wildcard() {
    let ctx = context(&format!("models:\n{}{}", model_yaml("m", ""), model_yaml("*", "")));
    let found = |name: &str| ctx.model(name).map(|m| m.id.to_string());
    assert_eq!(found("m").as_deref(), Some("m"));
    assert_eq!(found("anything else").as_deref(), Some("*"));
    let ctx = context(&format!("models:\n{}", model_yaml("m", "")));
    assert!(ctx.model("anything else").is_none(), "no wildcard, no model");
}

/// One row: the worker and stage of a dispatch, the policy's uncached tokens, the request's
/// token ids, then the work counted in flight and the blocks predicted.
type Row<'t> =
    (&'static str, &'static str, Stage, Option<u64>, Option<&'t RequestTokens>, u64, u64);

#[test]
fn a_dispatch_counts_the_expected_work_and_predicts_tokenized_blocks() {
    let workers = concat!(
        r#"{id: sized, url: "http://127.0.0.1:1", block_size: 16}, "#,
        r#"{id: unsized, url: "http://127.0.0.1:2"}"#
    );
    let model = ModelId::new("m");
    let tokens = RequestTokens::new((0..64).collect());
    #[rustfmt::skip]
    let cases: [Row<'_>; 5] = [
        ("the policy looked: its uncached tokens", "sized", Stage::Plain, Some(30), None, 30, 0),
        ("no look: the whole input", "sized", Stage::Prefill, None, None, 100, 0),
        ("decode: no prefill work and no prediction", "sized", Stage::Decode, Some(30), Some(&tokens), 0, 0),
        ("a tokenized request: its four blocks predicted", "sized", Stage::Plain, None, Some(&tokens), 100, 4),
        ("no block size and no policy reading prefixes: nothing remembered", "unsized", Stage::Plain, None, Some(&tokens), 100, 0),
    ];
    for (name, worker, stage, uncached, tokens, work, predicted) in cases {
        let ctx = context(&format!("models:\n{}", model_yaml("m", workers)));
        let id = WorkerId::new(worker).expect("id");
        let worker = ctx.registry().get(&id).expect("registered");
        let mut pick = Pick::new(worker, PickReason::OnlyCandidate);
        pick.uncached_tokens = uncached;
        let guard = ctx.dispatched(&model, &pick, stage, None, 100, tokens);
        assert_eq!(ctx.inflight().count_stage(&id, stage), 1, "{name}");
        assert_eq!(ctx.inflight().inflight_tokens(&id), work, "{name}");
        let blocks = ctx.predictions().expect("on by default").blocks(Instant::now()).predicted;
        assert_eq!(blocks, predicted, "{name}");
        drop(guard);
        assert_eq!(
            (ctx.inflight().count(&id), ctx.inflight().inflight_tokens(&id)),
            (0, 0),
            "{name}"
        );
    }
}

#[tokio::test]
async fn an_engine_that_leaves_is_forgotten_and_returns_from_zero() {
    let worker = r#"{id: e1, url: "http://127.0.0.1:1"}"#;
    let ctx = context(&format!("models:\n{}", model_yaml("m", worker)));
    let cancel = CancellationToken::new();
    let forgetting = tokio::spawn(forget_removed(
        Arc::clone(ctx.registry()),
        ctx.load().clone(),
        cancel.clone(),
    ));
    // Let it start following the registry.
    tokio::task::yield_now().await;

    let id = WorkerId::new("e1").expect("id");
    let old = ctx.registry().get(&id).expect("registered");
    let held = ctx.dispatched(
        &ModelId::new("m"),
        &Pick::new(old, PickReason::OnlyCandidate),
        Stage::Plain,
        None,
        10,
        None,
    );
    assert_eq!(ctx.inflight().count(&id), 1);
    ctx.registry().remove(&id).expect("removed");
    for _ in 0..10 {
        if ctx.inflight().count(&id) == 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(ctx.inflight().count(&id), 0, "forgotten once removed");

    let again = Worker::plain("e1", "http://127.0.0.1:1", &ModelId::new("m")).expect("worker");
    let again = ctx.registry().add(again).expect("added");
    drop(held);
    assert_eq!(ctx.inflight().count(&id), 0, "the old guard counted into the forgotten counter");
    let _new = ctx.dispatched(
        &ModelId::new("m"),
        &Pick::new(again, PickReason::OnlyCandidate),
        Stage::Plain,
        None,
        10,
        None,
    );
    assert_eq!(ctx.inflight().count(&id), 1);

    cancel.cancel();
    forgetting.await.expect("it stops when cancelled");
}
