//! SLO-aware ordering (docs/design/SLO.md): its worked example as a table, the rules around it
//! (length first, disabled and absent targets, the verdict of the bucket that served), and
//! live estimates from real load state, for plain and PD buckets.

use std::num::NonZeroU64;
use std::sync::Arc;

use router_buckets::{
    Bucket, BucketGroups, BucketRequest, BucketResolver, BucketSlo, BucketSpec, SloEstimate,
    SloPreference, SloPreferences, SloTargets, TokenLimits, TokensPerSecond,
};
use router_policies::{LiveEstimator, LoadHandles};
use router_state_load::{
    EngineReportedLoadTable, Inflight, InflightGuard, ManualClock, RankSample, Report, ReportKind,
    TableConfig,
};
use router_workers::{Stage, WorkerRegistry};

use crate::support::*;

use SloPreference::{BestEffort, Disabled, SloFirst};

fn ttft(ms: u64) -> SloEstimate<NonZeroU64> {
    SloEstimate::Declared(NonZeroU64::new(ms).expect("positive"))
}

fn tps(value: f64) -> SloEstimate<TokensPerSecond> {
    SloEstimate::Declared(TokensPerSecond::new(value).expect("positive"))
}

fn targets(ttft_ms: Option<u64>, tokens_per_second: Option<f64>) -> SloTargets {
    SloTargets {
        ttft_ms: ttft_ms.and_then(NonZeroU64::new),
        tokens_per_second: tokens_per_second.and_then(TokensPerSecond::new),
    }
}

/// A plain catch-all bucket (first-candidate policy) declaring `slo`.
fn slo_bucket(id: &str, rank: u32, max: u64, slo: BucketSlo) -> Bucket {
    Bucket::new(BucketSpec {
        id: id.into(),
        rank,
        limits: limits(0, Some(max)),
        max_context_tokens: None,
        groups: BucketGroups::Plain(group(Stage::Plain, None, &Scripted::first())),
        slo,
        live: None,
    })
    .expect("valid bucket")
}

/// The buckets of SLO.md's example.
fn example(preferences: SloPreferences) -> BucketResolver {
    let slo = |ttft_ms, tokens_per_second| BucketSlo { ttft_ms, tokens_per_second };
    let buckets = vec![
        slo_bucket("both", 9, 100, slo(Some(ttft(50)), Some(tps(100.0)))),
        slo_bucket("ttft", 1, 10, slo(Some(ttft(50)), Some(tps(10.0)))),
        slo_bucket("tps", 2, 10, slo(Some(ttft(100)), Some(tps(100.0)))),
        slo_bucket("neither", 0, 8, slo(Some(ttft(100)), Some(tps(10.0)))),
        slo_bucket("missing", 3, 10, BucketSlo::NONE),
    ];
    BucketResolver::new(model(), buckets).expect("valid resolver").with_slo(preferences)
}

async fn order(
    resolver: &BucketResolver,
    workers: &WorkerRegistry,
    request: &BucketRequest<'_>,
) -> Vec<String> {
    let ordered = resolver.order(workers, request).await.expect("valid signal");
    ordered.iter().map(|o| o.bucket.id().to_owned()).collect()
}

#[tokio::test]
async fn the_worked_example_of_slo_md() {
    #[rustfmt::skip]
    let cases: [(SloPreference, SloPreference, [&str; 5]); 4] = [
        (Disabled, Disabled, ["neither", "ttft", "tps", "missing", "both"]),
        (SloFirst, SloFirst, ["both", "ttft", "tps", "neither", "missing"]),
        (BestEffort, BestEffort, ["neither", "missing", "ttft", "tps", "both"]),
        (SloFirst, BestEffort, ["ttft", "neither", "missing", "both", "tps"]),
    ];
    let workers = fleet(&[("e", Stage::Plain)]);
    let model = model();
    for (ttft_slo, tps_slo, expected) in cases {
        let resolver = example(SloPreferences { ttft: ttft_slo, tps: tps_slo });
        let request =
            BucketRequest { slo: targets(Some(50), Some(100.0)), ..request(&model, 5, None) };
        let case = format!("ttft {ttft_slo}, tps {tps_slo}");
        assert_eq!(order(&resolver, &workers, &request).await, expected, "{case}");
        let selection = resolver.select(&workers, &request).await.expect("selected");
        assert_eq!(selection.bucket.id(), expected[0], "{case}: the first bucket serves");
    }
}

#[tokio::test]
async fn the_verdict_is_the_serving_buckets_for_each_enabled_stated_target() {
    let workers = fleet(&[("e", Stage::Plain)]);
    let model = model();
    let both = example(SloPreferences { ttft: SloFirst, tps: SloFirst });
    let stated = BucketRequest { slo: targets(Some(50), Some(100.0)), ..request(&model, 5, None) };

    // `both` meets both targets.
    let selection = both.select(&workers, &stated).await.expect("selected");
    let (ttft, tps) = (selection.slo.ttft.expect("checked"), selection.slo.tps.expect("checked"));
    assert!(ttft.met && tps.met, "{:?}", selection.slo);
    assert_eq!((ttft.estimate, tps.estimate), (Some(50.0), Some(100.0)));

    // A target nobody meets: the length order, every bucket missing it.
    let impossible = BucketRequest { slo: targets(Some(1), None), ..stated };
    let selection = both.select(&workers, &impossible).await.expect("selected");
    assert_eq!(selection.bucket.id(), "neither");
    assert!(selection.slo.ttft.is_some_and(|c| !c.met && c.target == 1.0));
    assert_eq!(selection.slo.tps, None, "no throughput target stated");

    // Disabled preferences ignore what the request states, and check nothing.
    let off = example(SloPreferences { ttft: Disabled, tps: Disabled });
    let selection = off.select(&workers, &stated).await.expect("selected");
    assert_eq!(selection.bucket.id(), "neither");
    assert_eq!(selection.slo, Default::default());

    // One preference enabled: only its target reorders and is checked.
    let ttft_only = example(SloPreferences { ttft: SloFirst, tps: Disabled });
    let ordered = order(&ttft_only, &workers, &stated).await;
    assert_eq!(ordered, ["ttft", "both", "neither", "tps", "missing"]);
    let selection = ttft_only.select(&workers, &stated).await.expect("selected");
    assert!(selection.slo.ttft.is_some() && selection.slo.tps.is_none());
}

#[tokio::test]
async fn length_still_comes_first() {
    let workers = fleet(&[("e", Stage::Plain)]);
    let model = model();
    let resolver = example(SloPreferences { ttft: SloFirst, tps: SloFirst });
    // Nine tokens do not fit `neither` (max 8): it is never tried, however it ranks.
    let nine = BucketRequest { slo: targets(Some(100), None), ..request(&model, 9, None) };
    assert_eq!(order(&resolver, &workers, &nine).await, ["ttft", "tps", "both", "missing"]);
    // Past every bucket: no bucket, whatever the targets.
    let too_long = BucketRequest { input_tokens: 101, ..nine };
    assert!(order(&resolver, &workers, &too_long).await.is_empty());
}

#[tokio::test]
async fn a_bucket_that_cannot_serve_is_passed_over_in_slo_order() {
    // `both` is first for a tight target but its engine rejects: the next in SLO order serves,
    // and the verdict is that bucket's.
    let workers = fleet(&[("e", Stage::Plain)]);
    let model = model();
    let slo = BucketSlo { ttft_ms: Some(ttft(50)), tokens_per_second: None };
    let rejecting = Bucket::new(BucketSpec {
        id: "both".into(),
        rank: 9,
        limits: limits(0, Some(100)),
        max_context_tokens: None,
        groups: BucketGroups::Plain(group(Stage::Plain, None, &Scripted::reject())),
        slo,
        live: None,
    })
    .expect("valid bucket");
    let buckets = vec![
        rejecting,
        slo_bucket("ttft", 1, 10, slo),
        slo_bucket("slow", 0, 8, BucketSlo { ttft_ms: Some(ttft(900)), ..BucketSlo::NONE }),
    ];
    let resolver = BucketResolver::new(model.clone(), buckets)
        .expect("valid")
        .with_slo(SloPreferences { ttft: SloFirst, tps: Disabled });
    let request = BucketRequest { slo: targets(Some(60), None), ..request(&model, 5, None) };
    assert_eq!(order(&resolver, &workers, &request).await, ["ttft", "both", "slow"]);
    let selection = resolver.select(&workers, &request).await.expect("selected");
    assert_eq!(selection.bucket.id(), "ttft");
    assert!(selection.skipped.is_empty());
    // Without `ttft`, `both` rejects and the slow bucket serves, missing the target.
    let resolver = BucketResolver::new(
        model.clone(),
        vec![
            Bucket::new(BucketSpec {
                id: "both".into(),
                rank: 9,
                limits: limits(0, Some(100)),
                max_context_tokens: None,
                groups: BucketGroups::Plain(group(Stage::Plain, None, &Scripted::reject())),
                slo,
                live: None,
            })
            .expect("valid bucket"),
            slo_bucket("slow", 0, 8, BucketSlo { ttft_ms: Some(ttft(900)), ..BucketSlo::NONE }),
        ],
    )
    .expect("valid")
    .with_slo(SloPreferences { ttft: SloFirst, tps: Disabled });
    let selection = resolver.select(&workers, &request).await.expect("selected");
    assert_eq!(selection.bucket.id(), "slow");
    let skipped: Vec<&str> = selection.skipped.iter().map(|s| s.bucket.id()).collect();
    assert_eq!(skipped, ["both"], "tried first, and rejected");
    assert!(selection.slo.ttft.is_some_and(|c| !c.met && c.estimate == Some(900.0)));
}

/// Real load state for live estimates: a manual clock, the load table and in-flight accounting.
struct Load {
    clock: Arc<ManualClock>,
    table: Arc<EngineReportedLoadTable>,
    inflight: Arc<Inflight>,
    guards: Vec<InflightGuard>,
}

impl Load {
    fn new() -> Self {
        let clock = Arc::new(ManualClock::new());
        let table = Arc::new(EngineReportedLoadTable::new(TableConfig::default(), clock.clone()));
        let inflight = Arc::new(Inflight::new(clock.clone()));
        Self { clock, table, inflight, guards: Vec::new() }
    }

    /// One token per millisecond before any report gives a prefill rate.
    fn estimator(&self) -> Arc<LiveEstimator> {
        let handles = LoadHandles::new(Arc::clone(&self.table), Arc::clone(&self.inflight));
        Arc::new(LiveEstimator::new(handles, None, 1000.0).expect("valid rate"))
    }

    /// Holds a request with `tokens` of prefill work in flight to `worker` until dropped.
    fn busy(&mut self, worker: &str, stage: Stage, tokens: u64) {
        self.guards.push(self.inflight.acquire_work(&id(worker), stage, tokens));
    }

    /// A fresh native report from `worker` (in `workers`): `running` requests generating
    /// `throughput` output tokens per second together.
    fn report(&self, workers: &WorkerRegistry, worker: &str, running: u64, throughput: f64) {
        let worker = workers.get(&id(worker)).expect("registered");
        self.table.register(&worker);
        let rank = RankSample::basic(0, running, 0, 0, 100_000)
            .with_native(0, 0, 64)
            .with_decode_rate(throughput);
        let report = Report::new(worker.id().as_str(), 1, 1, ReportKind::Native, vec![rank]);
        self.table.apply(worker.id(), worker.incarnation(), report).expect("accepted");
        self.clock.advance(std::time::Duration::from_millis(1));
    }
}

fn live_slo() -> BucketSlo {
    BucketSlo { ttft_ms: Some(SloEstimate::Live), tokens_per_second: Some(SloEstimate::Live) }
}

/// A bucket over `members` whose estimates are `slo`, live ones from `live`.
fn member_bucket(
    id: &str,
    max: Option<u64>,
    groups: BucketGroups,
    slo: BucketSlo,
    live: Option<Arc<LiveEstimator>>,
) -> Bucket {
    Bucket::new(BucketSpec {
        id: id.into(),
        rank: 0,
        limits: TokenLimits { min: 0, max },
        max_context_tokens: None,
        groups,
        slo,
        live,
    })
    .expect("valid bucket")
}

#[tokio::test]
async fn a_live_ttft_estimate_moves_tight_targets_off_a_loaded_bucket_until_it_drains() {
    let workers = fleet(&[("a", Stage::Plain), ("b", Stage::Plain), ("c", Stage::Plain)]);
    let mut load = Load::new();
    let live = load.estimator();
    let plain = |members: &[&str]| {
        BucketGroups::Plain(group(Stage::Plain, Some(members), &Scripted::first()))
    };
    let buckets = vec![
        member_bucket("fast", Some(1000), plain(&["a", "b"]), live_slo(), Some(Arc::clone(&live))),
        member_bucket(
            "big",
            None,
            plain(&["c"]),
            BucketSlo { ttft_ms: Some(ttft(400)), ..BucketSlo::NONE },
            None,
        ),
    ];
    let model = model();
    let resolver = BucketResolver::new(model.clone(), buckets)
        .expect("valid")
        .with_slo(SloPreferences { ttft: SloFirst, tps: Disabled });
    let tight = BucketRequest { slo: targets(Some(500), None), ..request(&model, 200, None) };
    let relaxed = BucketRequest { slo: targets(Some(300), None), ..tight };
    let estimate = async |resolver: &BucketResolver| {
        let request = if resolver.slo().ttft == SloFirst { &tight } else { &relaxed };
        let ordered = resolver.order(&workers, request).await.expect("valid");
        let fast = ordered.iter().find(|o| o.bucket.id() == "fast").expect("compatible");
        (ordered[0].bucket.id().to_owned(), fast.slo.ttft.and_then(|c| c.estimate))
    };

    // Idle: 200 uncached tokens at 1 token/ms.
    assert_eq!(estimate(&resolver).await, ("fast".to_owned(), Some(200.0)));
    // `a` is loaded; `b`, the best engine of the bucket, still answers in time.
    load.busy("a", Stage::Plain, 5_000);
    assert_eq!(estimate(&resolver).await, ("fast".to_owned(), Some(200.0)));
    // Both loaded: the bucket's best engine would take 200 + 400 ms, past the target.
    load.busy("b", Stage::Plain, 400);
    assert_eq!(estimate(&resolver).await, ("big".to_owned(), Some(600.0)));
    let selection = resolver.select(&workers, &tight).await.expect("selected");
    assert_eq!(selection.bucket.id(), "big");
    assert!(selection.slo.ttft.is_some_and(|c| c.met && c.estimate == Some(400.0)));
    // A best-effort request (a 300 ms target, which `big` misses) is pushed off a bucket only
    // while that bucket meets its target.
    let best_effort = BucketResolver::new(
        model.clone(),
        vec![
            member_bucket("fast", Some(1000), plain(&["a", "b"]), live_slo(), Some(live)),
            member_bucket(
                "big",
                None,
                plain(&["c"]),
                BucketSlo { ttft_ms: Some(ttft(400)), ..BucketSlo::NONE },
                None,
            ),
        ],
    )
    .expect("valid")
    .with_slo(SloPreferences { ttft: BestEffort, tps: Disabled });
    assert_eq!(estimate(&best_effort).await.0, "fast", "both miss: the length order");
    // Drained: the requests finished.
    load.guards.clear();
    assert_eq!(estimate(&resolver).await, ("fast".to_owned(), Some(200.0)));
    assert_eq!(estimate(&best_effort).await.0, "big", "the drained bucket meets it again");
}

#[tokio::test]
async fn a_pd_buckets_live_estimates_are_its_prefill_ttft_and_its_decode_speed() {
    let workers = fleet(&[
        ("P1", Stage::Prefill),
        ("P2", Stage::Prefill),
        ("D1", Stage::Decode),
        ("D2", Stage::Decode),
    ]);
    let mut load = Load::new();
    let live = load.estimator();
    let (prefill, decode) = (Scripted::first(), Scripted::first());
    let buckets = vec![
        member_bucket(
            "short",
            Some(1000),
            pd((Some(&["P1"]), &prefill), (Some(&["D1"]), &decode)),
            live_slo(),
            Some(Arc::clone(&live)),
        ),
        member_bucket(
            "long",
            None,
            pd((Some(&["P2"]), &prefill), (Some(&["D2"]), &decode)),
            live_slo(),
            Some(live),
        ),
    ];
    let model = model();
    let resolver = BucketResolver::new(model.clone(), buckets)
        .expect("valid")
        .with_slo(SloPreferences { ttft: SloFirst, tps: SloFirst });
    // D1 decodes 4 requests at 200 tokens/s together (50 each); D2 one at 80.
    load.report(&workers, "D1", 4, 200.0);
    load.report(&workers, "D2", 1, 80.0);
    // The time to first token is the prefill group's: D1's own work does not count in it.
    load.busy("D1", Stage::Decode, 50_000);
    load.busy("P2", Stage::Prefill, 100);
    let request =
        BucketRequest { slo: targets(Some(250), Some(60.0)), ..request(&model, 100, None) };
    let ordered = resolver.order(&workers, &request).await.expect("valid");
    let checks: Vec<(String, Option<f64>, Option<f64>)> = ordered
        .iter()
        .map(|o| {
            let (ttft, tps) = (o.slo.ttft.expect("stated"), o.slo.tps.expect("stated"));
            (o.bucket.id().to_owned(), ttft.estimate, tps.estimate)
        })
        .collect();
    assert_eq!(
        checks,
        [
            // Meets both: 200 ms to the first token on P2, 80 tokens/s on D2.
            ("long".to_owned(), Some(200.0), Some(80.0)),
            // 100 ms on P1, but D1 decodes at 50 a request.
            ("short".to_owned(), Some(100.0), Some(50.0)),
        ]
    );
    let selection = resolver.select(&workers, &request).await.expect("selected");
    assert_eq!(selection.bucket.id(), "long");
    let engines: Vec<String> = names(selection.pick.workers());
    assert_eq!(engines, ["P2", "D2"], "both engines from the bucket the order chose");

    // Without decode reports there is no live speed: a throughput target is missed everywhere.
    let unreported = Load::new();
    let resolver = BucketResolver::new(
        model.clone(),
        vec![member_bucket(
            "only",
            None,
            pd((Some(&["P1"]), &prefill), (Some(&["D1"]), &decode)),
            live_slo(),
            Some(unreported.estimator()),
        )],
    )
    .expect("valid")
    .with_slo(SloPreferences { ttft: SloFirst, tps: SloFirst });
    let selection = resolver.select(&workers, &request).await.expect("selected");
    assert!(selection.slo.tps.is_some_and(|c| !c.met && c.estimate.is_none()));
    assert!(selection.slo.ttft.is_some_and(|c| c.met && c.estimate == Some(100.0)));
}

#[test]
fn a_live_estimate_needs_an_estimator() {
    let spec = BucketSpec {
        id: "b".into(),
        rank: 0,
        limits: limits(0, None),
        max_context_tokens: None,
        groups: BucketGroups::Plain(group(Stage::Plain, None, &Scripted::first())),
        slo: BucketSlo { ttft_ms: None, tokens_per_second: Some(SloEstimate::Live) },
        live: None,
    };
    let err = Bucket::new(spec).expect_err("no estimator");
    assert_eq!(err.to_string(), "bucket b: a live SLO estimate needs an estimator");
}
