//! Affinity store throughput: lookups and binds from one thread and under contention from two.
//!
//! Two-thread cases time both threads doing `iters` operations each on one shared store and
//! report the slower thread, so the figure is time per operation per thread with the other
//! thread hammering the same lock. Run with `cargo bench -p router-affinity --bench store`.

#![expect(missing_docs, reason = "criterion_group! generates an undocumented public function")]

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use router_affinity::{AffinityConfig, AffinityStore, Binding, Scope};
use router_workers::{ModelId, Stage, Worker};

const KEYS: usize = 10_000;

fn workers(n: usize) -> Vec<Arc<Worker>> {
    let model = ModelId::new("bench-model");
    (0..n)
        .map(|i| {
            let url = format!("http://10.0.0.{i}:8000");
            Arc::new(Worker::plain(&format!("engine-{i}"), &url, &model).expect("valid worker"))
        })
        .collect()
}

fn scopes(n: usize) -> Vec<Scope> {
    let model = ModelId::new("bench-model");
    (0..n)
        .map(|i| {
            let key = format!("session-{i:08x}-0000-4000-8000-000000000000");
            Scope::new(&model, "short-context", Stage::Plain, &key).expect("valid scope")
        })
        .collect()
}

fn store(max_entries: usize) -> AffinityStore {
    AffinityStore::new(AffinityConfig { max_entries, ..AffinityConfig::default() })
        .expect("valid config")
}

/// Runs `op(thread, i)` for `i in 0..iters` on two threads at once; returns the slower time.
fn on_two_threads(iters: u64, op: &(impl Fn(usize, u64) + Sync)) -> Duration {
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|thread| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    for i in 0..iters {
                        op(thread, i);
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("bench thread")).max().unwrap_or_default()
    })
}

/// The session policy's path: look the key up, and bind it when absent.
fn get_or_bind(store: &AffinityStore, scope: &Scope, worker: &Worker) -> Binding {
    match store.get(scope) {
        Some(bound) => bound,
        None => match store.bind(scope, Binding::of(worker)) {
            Ok(()) => Binding::of(worker),
            Err(winner) => winner,
        },
    }
}

fn bench(c: &mut Criterion) {
    let workers = workers(16);
    let scopes = scopes(KEYS);
    let full = store(KEYS * 2);
    for (i, scope) in scopes.iter().enumerate() {
        full.bind(scope, Binding::of(&workers[i % workers.len()])).expect("fresh key");
    }
    // Keys in a scrambled order, different for each thread.
    let key = |thread: usize, i: u64| {
        let mixed = (i ^ ((thread as u64) << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        &scopes[mixed as usize % KEYS]
    };

    let mut group = c.benchmark_group("affinity");
    group.sample_size(20).warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));

    group.bench_function("scope_new", |b| {
        let model = ModelId::new("bench-model");
        b.iter(|| Scope::new(&model, "short-context", Stage::Plain, black_box("session-1234")))
    });

    group.bench_function("get_hit/1_thread", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            black_box(full.get(key(0, i)))
        })
    });

    group.bench_function("get_hit/2_threads", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, &|thread, i| {
                black_box(full.get(key(thread, i)));
            })
        })
    });

    // Both threads bind keys that are already bound: each call loses and returns the winner.
    group.bench_function("bind_conflict/2_threads", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, &|thread, i| {
                let _ = black_box(full.bind(key(thread, i), Binding::of(&workers[thread])));
            })
        })
    });

    // A store capped at half the key space, with keys drawn in scrambled order: about half the
    // lookups miss, and every miss binds and evicts the least recently used entry.
    let capped = store(KEYS / 2);
    group.bench_function("get_or_bind_at_cap/2_threads", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, &|thread, i| {
                black_box(get_or_bind(&capped, key(thread, i), &workers[thread]));
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
