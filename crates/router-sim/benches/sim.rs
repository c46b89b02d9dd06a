//! Benchmarks of the simulator's own costs: KV-event encoding, prompt preparation, a whole
//! non-streamed request through an in-process engine (HTTP, scheduling, answer) with
//! simulated time made negligible, and the preparation of a trace replay (text, tokenization
//! and oracles).

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use router_sim::engine::events::encode_batch;
use router_sim::engine::{EngineConfig, KvEvent, KvFormat, serve};
use router_sim::load::{TraceSpec, trace_oracle};
use router_sim::tokens::{ChatMessage, Preprocessor};

fn encoding(c: &mut Criterion) {
    // One prefill's worth of blocks: 64 blocks of 16 tokens.
    let event = KvEvent::Stored {
        hashes: (0..64u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect(),
        parent: Some(42),
        token_ids: (0..1024).collect(),
    };
    let events = [event, KvEvent::Removed { hashes: (0..16).collect() }];
    for format in [KvFormat::Vllm, KvFormat::SglangLegacy] {
        c.bench_function(&format!("encode_batch/{format}/64_blocks"), |b| {
            b.iter(|| encode_batch(format, 1.0, black_box(&events), 16, Some(0)))
        });
    }
}

fn preparation(c: &mut Criterion) {
    let messages = vec![
        ChatMessage::new("system", "You are a helpful assistant. ".repeat(40)),
        ChatMessage::new("user", "Tell me about prefix caches. ".repeat(100)),
    ];
    let builtin = Preprocessor::builtin();
    let shipped = Preprocessor::from_tokenizer_file(&router_sim::assets::tokenizer_path())
        .expect("shipped assets load");
    c.bench_function("prompt_ids/builtin/4k", |b| {
        b.iter(|| builtin.prompt_ids(black_box(&messages)))
    });
    c.bench_function("prompt_ids/tokenizer_file/4k", |b| {
        b.iter(|| shipped.prompt_ids(black_box(&messages)))
    });
}

fn round_trip(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut config = EngineConfig::new("bench");
    config.prefill_tokens_per_sec = 1e12;
    config.decode_tokens_per_sec = 1e12;
    config.kv_events = Some("tcp://127.0.0.1:0".into());
    let engine = runtime.block_on(serve(config, cancel.clone())).expect("engine starts");
    let url = format!("{}/v1/chat/completions", engine.url());
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let body = Bytes::from(
        serde_json::json!({
            "model": "bench",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "A question of about a thousand bytes. ".repeat(25)}],
        })
        .to_string(),
    );
    c.bench_function("engine/non_streamed_request/1k_prompt_16_out", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let request =
                    http::Request::post(&url).body(Full::new(body.clone())).expect("request");
                let response = client.request(request).await.expect("answered");
                assert!(response.status().is_success());
                response.into_body().collect().await.expect("body").to_bytes()
            })
        })
    });
    cancel.cancel();
    runtime.block_on(engine.wait());
}

fn trace(c: &mut Criterion) {
    // 200 Mooncake conversation requests at an eighth of their length: 358k prompt tokens.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/conversation_trace_head200.jsonl");
    let mut spec = TraceSpec::new(path);
    spec.length_scale = 0.125;
    spec.fleet_capacity_tokens = Some(16_384);
    c.bench_function("trace_oracle/conversation_head200/scale_0.125", |b| {
        b.iter(|| trace_oracle(black_box(&spec)).expect("oracle"))
    });
}

/// Private, so that the function `criterion_group!` generates needs no docs.
mod group {
    use super::*;

    criterion_group! {
        name = benches;
        config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
        targets = encoding, preparation, round_trip, trace
    }
}

criterion_main!(group::benches);
