//! Index benchmarks: applying stored blocks, looking up a long request, memory per
//! (block, holder), and ingesting a vLLM batch (decoding and applying it).
//!
//! `cargo bench -p router-state-kv --bench index` (about a minute). The apply fleet size can be
//! scaled down with `KV_BENCH_BLOCKS_PER_WORKER` (default 100000).
#![expect(missing_docs, reason = "criterion_group! generates an undocumented pub fn")]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{BatchSize, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use router_state_kv::hash::{Salt, block_hashes};
use router_state_kv::wire::{BlockStored, DecodeLimits, Event, decode_batch};
use router_state_kv::{Holder, IndexConfig, KvIndex};
use router_workers::{ModelId, WorkerId};

const BS: u32 = 16;
const WORKERS: u32 = 64;
const GROUPS: u32 = 8;
const SYSTEM_BLOCKS: u32 = 32;
const DOCS: u32 = 128;
const DOC_BLOCKS: u32 = 64;
const TAIL_BLOCKS: u32 = 64;

/// On-CPU time of the benchmark thread (from `/proc/thread-self/schedstat`), so numbers
/// taken on a shared machine are not inflated by time spent waiting for a core.
struct CpuTime;

static WALL: WallTime = WallTime;

fn on_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse().ok()))
        .expect("/proc/thread-self/schedstat is readable (Linux)")
}

impl Measurement for CpuTime {
    type Intermediate = u64;
    type Value = Duration;

    fn start(&self) -> u64 {
        on_cpu_ns()
    }

    fn end(&self, start: u64) -> Duration {
        Duration::from_nanos(on_cpu_ns().saturating_sub(start))
    }

    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }

    fn zero(&self) -> Duration {
        Duration::ZERO
    }

    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        WALL.formatter()
    }
}

fn model() -> ModelId {
    ModelId::new("bench")
}

/// Deterministic tokens for block `block` of content `stream`.
fn tokens(stream: u64, block: u32) -> impl Iterator<Item = u32> {
    (0..BS).map(move |t| {
        let x = stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(block * BS + t);
        u32::try_from((x ^ (x >> 29)) & 0x1_ffff).expect("masked to 17 bits")
    })
}

/// Builds one event storing `count` blocks of `stream` under `parent`, with engine hashes
/// `first_hash..`.
fn chain(stream: u64, count: u32, parent: Option<u64>, first_hash: u64) -> Event {
    Event::Stored(BlockStored {
        block_hashes: (0..u64::from(count)).map(|i| first_hash + i).collect(),
        parent_block_hash: parent,
        token_ids: (0..count).flat_map(|b| tokens(stream, b)).collect(),
        block_size: Some(i64::from(BS)),
        ..BlockStored::default()
    })
}

/// One worker's engine events: its group's system prompt, the group's shared documents under
/// it, and unique conversation tails under the documents, up to `blocks` blocks.
/// Engine hashes are per worker (distinct seeds), as with vLLM's random per-process seed.
fn worker_events(worker: u32, blocks: u32) -> Vec<Event> {
    let group = worker % GROUPS;
    let base = u64::from(worker) << 40;
    let system = 1_000_000 + u64::from(group);
    let mut events = vec![chain(system, SYSTEM_BLOCKS, None, base)];
    let system_last = base + u64::from(SYSTEM_BLOCKS) - 1;
    let mut held = SYSTEM_BLOCKS;
    let mut doc_seen = vec![false; DOCS as usize];
    let mut next_hash = base + 1_000_000;
    let mut conversation = 0u32;
    while held < blocks {
        let doc = conversation % DOCS;
        let doc_first = base + 100_000 + u64::from(doc) * u64::from(DOC_BLOCKS);
        if !doc_seen[doc as usize] {
            doc_seen[doc as usize] = true;
            let stream = (u64::from(group) << 32) | u64::from(doc);
            events.push(chain(stream, DOC_BLOCKS, Some(system_last), doc_first));
            held += DOC_BLOCKS;
        }
        let doc_last = doc_first + u64::from(DOC_BLOCKS) - 1;
        let tail = TAIL_BLOCKS.min(blocks.saturating_sub(held)).max(1);
        let stream = (u64::from(worker) << 32) | u64::from(conversation) | (1 << 63);
        // A conversation's tail arrives one turn (16 blocks) at a time.
        let mut parent = doc_last;
        let mut done = 0;
        while done < tail {
            let turn = (tail - done).min(16);
            let Event::Stored(mut stored) = chain(stream, done + turn, Some(parent), next_hash)
            else {
                unreachable!("chain builds a store")
            };
            let skip = (done * BS) as usize;
            stored.token_ids.drain(..skip);
            stored.block_hashes.drain(..done as usize);
            parent = *stored.block_hashes.last().expect("non-empty turn");
            events.push(Event::Stored(stored));
            done += turn;
        }
        next_hash += u64::from(tail) + 1;
        held += tail;
        conversation += 1;
    }
    events
}

fn blocks_per_worker() -> u32 {
    std::env::var("KV_BENCH_BLOCKS_PER_WORKER").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000)
}

fn holder(index: &KvIndex, worker: u32) -> Holder {
    let id = WorkerId::new(format!("w{worker}")).expect("id");
    index.holder(&model(), &id, 1, 0, BS).expect("register")
}

/// Applies every worker's events into a fresh index; returns (apply time, stored blocks).
fn fill(index: &KvIndex, blocks: u32) -> (Duration, u64) {
    let cpu = CpuTime;
    let mut elapsed = Duration::ZERO;
    let mut stored = 0;
    for worker in 0..WORKERS {
        let events = worker_events(worker, blocks);
        let holder = holder(index, worker);
        let start = cpu.start();
        for batch in events.chunks(4) {
            stored += holder.apply(batch).stored;
        }
        elapsed += cpu.end(start);
    }
    (elapsed, stored)
}

fn apply(c: &mut Criterion<CpuTime>) {
    let blocks = blocks_per_worker();
    let config = IndexConfig::new(1 << 24, 1);
    let probe = KvIndex::new(config.clone());
    let (_, stored) = fill(&probe, blocks);
    let stats = probe.stats();
    eprintln!(
        "apply fleet: {WORKERS} workers x {blocks} blocks: {stored} stored blocks, {} nodes, \
         {} (block, holder) pairs, {} bytes = {:.1} bytes per (block, holder)",
        stats.nodes,
        stats.block_holders,
        stats.bytes,
        stats.bytes as f64 / stats.block_holders as f64,
    );
    drop(probe);
    let mut group = c.benchmark_group("apply");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(20));
    group.throughput(Throughput::Elements(stored));
    group.bench_function(format!("{WORKERS}x{blocks}_blocks"), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let index = KvIndex::new(config.clone());
                total += fill(&index, blocks).0;
            }
            total
        });
    });
    group.finish();
}

/// 64 workers on one long request: all share the first 128 blocks, worker `w` holds
/// `128 + 6 w` leading blocks (so the holder set changes 64 times along the path), plus
/// unrelated blocks of their own.
fn lookup_fixture() -> (Arc<KvIndex>, Vec<u32>) {
    let index = Arc::new(KvIndex::default());
    let request: Vec<u32> = (0..512).flat_map(|b| tokens(7, b)).collect();
    for worker in 0..WORKERS {
        let holder = holder(&index, worker);
        let depth = 128 + 6 * worker;
        let hashes: Vec<u64> = (0..u64::from(depth)).map(|i| (1 << 62) + i).collect();
        let tokens = request[..(depth * BS) as usize].to_vec();
        holder.apply(&[Event::Stored(BlockStored {
            block_hashes: hashes,
            token_ids: tokens,
            block_size: Some(i64::from(BS)),
            ..BlockStored::default()
        })]);
        holder.apply(&worker_events(worker, 4096));
    }
    (index, request)
}

fn lookup(c: &mut Criterion<CpuTime>) {
    let (index, request) = lookup_fixture();
    let hashes = block_hashes(&request, BS, None);
    let result = index.lookup(&model(), &hashes);
    assert_eq!(result.matches.len(), 64);
    assert_eq!(result.matches[0].blocks, 128 + 6 * 63);
    let mut group = c.benchmark_group("lookup");
    // CPU time advances in scheduler ticks: flat sampling keeps every sample ~200 ms long.
    group
        .sample_size(20)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(4));
    group.bench_function("8192_tokens_64_workers_with_hashing", |b| {
        b.iter(|| index.lookup_tokens(&model(), black_box(&request), BS, Salt::default()));
    });
    group.bench_function("512_blocks_64_workers_hashes_given", |b| {
        b.iter(|| index.lookup(&model(), black_box(&hashes)));
    });
    group.bench_function("hash_8192_tokens", |b| {
        b.iter(|| block_hashes(black_box(&request), BS, None));
    });
    group.finish();
}

/// A vLLM batch (map form, as vLLM 0.33 sends it) of `events` events, each storing 64 new
/// blocks (a 1k-token turn) of content `stream` under the previous event's last block.
fn vllm_payload(stream: u64, events: u32) -> Vec<u8> {
    use rmpv::Value;
    let text = |s: &str| Value::from(s);
    let mut list = Vec::new();
    let first = stream << 20;
    for event in 0..events {
        let hashes: Vec<Value> =
            (0..64).map(|i| Value::from(first + u64::from(event * 64 + i))).collect();
        let tokens: Vec<Value> =
            (0..64).flat_map(|b| tokens(stream, event * 64 + b)).map(Value::from).collect();
        let parent =
            if event == 0 { Value::Nil } else { Value::from(first + u64::from(event * 64) - 1) };
        list.push(Value::Map(vec![
            (text("type"), text("BlockStored")),
            (text("block_hashes"), Value::Array(hashes)),
            (text("parent_block_hash"), parent),
            (text("token_ids"), Value::Array(tokens)),
            (text("block_size"), Value::from(BS)),
            (text("lora_id"), Value::Nil),
            (text("medium"), text("GPU")),
            (text("lora_name"), Value::Nil),
            (text("extra_keys"), Value::Array(vec![Value::Nil; 64])),
            (text("group_idx"), Value::from(0)),
        ]));
    }
    let batch = Value::Array(vec![Value::F64(1.0), Value::Array(list), Value::from(0)]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).expect("encode");
    out
}

/// KV-event ingestion as a subscription does it: a vLLM batch of 16 events of 64 new blocks
/// each decoded, then applied, per block; decoding and applying apart.
fn ingest(c: &mut Criterion<CpuTime>) {
    const EVENTS: u32 = 16;
    let index = KvIndex::new(IndexConfig::new(1 << 24, 1));
    let holder = holder(&index, 0);
    let limits = DecodeLimits::default();
    let stream = std::cell::Cell::new(1_u64);
    let next = || {
        stream.set(stream.get() + 1);
        vllm_payload(stream.get(), EVENTS)
    };
    let mut group = c.benchmark_group("ingest");
    group.sample_size(20).measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(u64::from(EVENTS) * 64));
    group.bench_function("decode_and_apply_16x64_blocks", |b| {
        b.iter_batched(
            next,
            |payload| {
                let batch = decode_batch(&payload, &limits).expect("decodes");
                holder.apply(&batch.events)
            },
            BatchSize::LargeInput,
        );
    });
    group.bench_function("decode_16x64_blocks", |b| {
        b.iter_batched(next, |payload| decode_batch(&payload, &limits), BatchSize::LargeInput);
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(CpuTime);
    targets = lookup, apply, ingest
}
criterion_main!(benches);
