//! Fixtures: a real worker registry, and scripted test doubles of the `Policy` trait.

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

use futures::future::BoxFuture;
use router_buckets::{
    Bucket, BucketGroups, BucketRequest, BucketResolver, BucketSlo, BucketSpec, EngineGroup,
    PairOn, SloTargets, TokenLimits,
};
use router_policies::{
    KeySource, Limit, Pick, PickError, PickReason, PickRequest, Policy, Rejection, RequestTokens,
    ScopeError,
};
use router_workers::{ModelId, Stage, Worker, WorkerId, WorkerLabels, WorkerRegistry, WorkerSpec};

pub(crate) fn model() -> ModelId {
    ModelId::new("llama")
}

pub(crate) fn id(id: &str) -> WorkerId {
    WorkerId::new(id).expect("non-empty id")
}

pub(crate) fn ids(list: &[&str]) -> Vec<WorkerId> {
    list.iter().map(|i| id(i)).collect()
}

pub(crate) fn worker(id: &str, stage: Stage, model: &ModelId) -> Worker {
    Worker::with_stage(
        id,
        &format!("http://{}.engines.local:30000", id.to_lowercase()),
        model,
        stage,
    )
    .expect("valid worker")
}

/// A registry of `llama` workers.
pub(crate) fn fleet(workers: &[(&str, Stage)]) -> WorkerRegistry {
    let registry = WorkerRegistry::new();
    for &(name, stage) in workers {
        registry.add(worker(name, stage, &model())).expect("add worker");
    }
    registry
}

pub(crate) fn request<'a>(
    model: &'a ModelId,
    input_tokens: u64,
    peak: Option<u64>,
) -> BucketRequest<'a> {
    BucketRequest {
        model,
        input_tokens,
        expected_peak_tokens: peak,
        tokens: None,
        session_key: None,
        routing_key: None,
        slo: SloTargets::NONE,
        excluded: &[],
        subset: None,
    }
}

pub(crate) fn names<'a>(workers: impl IntoIterator<Item = &'a Arc<Worker>>) -> Vec<String> {
    workers.into_iter().map(|w| w.id().to_string()).collect()
}

/// What one call of a scripted policy was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub bucket: String,
    pub stage: Stage,
    pub candidates: Vec<String>,
    pub input_tokens: u64,
    pub expected_peak_tokens: Option<u64>,
    pub tokens: Option<Vec<u32>>,
    pub session_key: Option<String>,
    pub routing_key: Option<String>,
}

type Script = dyn Fn(&[Arc<Worker>]) -> Result<Pick, PickError> + Send + Sync;

/// A test double of `Policy` that answers by a script and records what it was given.
pub(crate) struct Scripted {
    name: &'static str,
    stages: Vec<Stage>,
    script: Box<Script>,
    calls: Mutex<Vec<Seen>>,
}

impl fmt::Debug for Scripted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scripted").field("name", &self.name).finish()
    }
}

impl Scripted {
    fn new(
        name: &'static str,
        script: impl Fn(&[Arc<Worker>]) -> Result<Pick, PickError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name,
            stages: vec![Stage::Plain, Stage::Prefill, Stage::Decode],
            script: Box::new(script),
            calls: Mutex::new(Vec::new()),
        }
    }

    /// Picks candidate `index`; `NoCandidates` when there are fewer.
    pub(crate) fn nth(index: usize) -> Arc<Self> {
        Arc::new(Self::new("nth", move |engines| match engines.get(index) {
            Some(w) => Ok(Pick::new(Arc::clone(w), PickReason::RoundRobin)),
            None => Err(PickError::NoCandidates { stage: engines[0].stage() }),
        }))
    }

    /// Picks the first candidate.
    pub(crate) fn first() -> Arc<Self> {
        Self::nth(0)
    }

    /// Admission rejects the first candidate at its running-requests cap.
    pub(crate) fn reject() -> Arc<Self> {
        Arc::new(Self::new("reject", |engines| {
            Err(PickError::AdmissionRejected(rejection(engines[0].id().as_str())))
        }))
    }

    /// Always fails with `error`.
    pub(crate) fn fail(error: PickError) -> Arc<Self> {
        Arc::new(Self::new("fail", move |_| Err(error.clone())))
    }

    /// Always answers `worker`, whatever the candidates.
    pub(crate) fn returning(worker: Arc<Worker>) -> Arc<Self> {
        Arc::new(Self::new("returning", move |_| {
            Ok(Pick::new(Arc::clone(&worker), PickReason::Random))
        }))
    }

    /// Picks the first candidate and supports only `stages`.
    pub(crate) fn first_for(name: &'static str, stages: &[Stage]) -> Arc<Self> {
        let mut policy = Self::new(name, |engines| {
            Ok(Pick::new(Arc::clone(&engines[0]), PickReason::RoundRobin))
        });
        policy.stages = stages.to_vec();
        Arc::new(policy)
    }

    /// Every call so far.
    pub(crate) fn calls(&self) -> Vec<Seen> {
        self.calls.lock().clone()
    }
}

pub(crate) fn rejection(worker: &str) -> Rejection {
    Rejection { worker: id(worker), limit: Limit::RunningRequests, value: 64, cap: 64 }
}

/// A client's session key too long to name a binding: stops routing.
pub(crate) fn too_long_key() -> PickError {
    PickError::InvalidKey {
        key: KeySource::Session,
        error: ScopeError::KeyTooLong { len: 300, max: 256 },
    }
}

/// A policy asked for a stage it does not serve: stops routing.
pub(crate) fn unsupported_stage() -> PickError {
    PickError::UnsupportedStage { policy: "scripted", stage: Stage::Decode }
}

impl Policy for Scripted {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Worker>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        self.calls.lock().push(Seen {
            bucket: request.bucket.to_owned(),
            stage: request.stage,
            candidates: names(engines),
            input_tokens: request.input_tokens,
            expected_peak_tokens: request.expected_peak_tokens,
            tokens: request.tokens.map(|t| t.ids().to_vec()),
            session_key: request.session_key.map(str::to_owned),
            routing_key: request.routing_key.map(str::to_owned),
        });
        let answer = (self.script)(engines);
        Box::pin(async move { answer })
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn supports_stage(&self, stage: Stage) -> bool {
        self.stages.contains(&stage)
    }
}

pub(crate) fn group(stage: Stage, members: Option<&[&str]>, policy: &Arc<Scripted>) -> EngineGroup {
    EngineGroup::new(stage, members.map(ids), Arc::clone(policy) as Arc<dyn Policy>)
        .expect("valid group")
}

pub(crate) fn limits(min: u64, max: Option<u64>) -> TokenLimits {
    TokenLimits { min, max }
}

/// A bucket; panics if invalid.
pub(crate) fn bucket(
    id: &str,
    rank: u32,
    limits: TokenLimits,
    max_context_tokens: Option<u64>,
    groups: BucketGroups,
) -> Bucket {
    Bucket::new(BucketSpec {
        id: id.into(),
        rank,
        limits,
        max_context_tokens,
        groups,
        slo: BucketSlo::NONE,
        live: None,
    })
    .expect("valid bucket")
}

/// A plain, catch-all bucket with a first-candidate policy.
pub(crate) fn plain_bucket(
    id: &str,
    rank: u32,
    limits: TokenLimits,
    context: Option<u64>,
) -> Bucket {
    bucket(
        id,
        rank,
        limits,
        context,
        BucketGroups::Plain(group(Stage::Plain, None, &Scripted::first())),
    )
}

pub(crate) fn pd(
    prefill: (Option<&[&str]>, &Arc<Scripted>),
    decode: (Option<&[&str]>, &Arc<Scripted>),
) -> BucketGroups {
    BucketGroups::Pd {
        prefill: group(Stage::Prefill, prefill.0, prefill.1),
        decode: group(Stage::Decode, decode.0, decode.1),
        pair_on: PairOn::none(),
    }
}

/// [`pd`] pairing on `labels`.
pub(crate) fn pd_paired(
    prefill: (Option<&[&str]>, &Arc<Scripted>),
    decode: (Option<&[&str]>, &Arc<Scripted>),
    labels: &[&str],
) -> BucketGroups {
    let pair_on = labels.iter().map(|l| (*l).to_owned()).collect();
    BucketGroups::Pd {
        prefill: group(Stage::Prefill, prefill.0, prefill.1),
        decode: group(Stage::Decode, decode.0, decode.1),
        pair_on: PairOn::new(pair_on).expect("valid pair_on"),
    }
}

/// A `llama` worker with labels.
pub(crate) fn labelled(id: &str, stage: Stage, labels: &[(&str, &str)]) -> Worker {
    let spec = WorkerSpec {
        model: Some(model().to_string()),
        labels: labels.iter().copied().collect::<WorkerLabels>(),
        ..WorkerSpec::new(id, format!("http://{}.engines.local:30000", id.to_lowercase()), stage)
    };
    Worker::from_spec(&spec, vec![model()]).expect("valid worker")
}

pub(crate) fn resolver(buckets: Vec<Bucket>) -> BucketResolver {
    BucketResolver::new(model(), buckets).expect("valid resolver")
}

pub(crate) fn resolved_ids(
    resolver: &BucketResolver,
    input: u64,
    peak: Option<u64>,
) -> Vec<String> {
    resolver.resolve(input, peak).expect("valid signal").iter().map(|b| b.id().to_owned()).collect()
}

pub(crate) fn tokens(ids: &[u32]) -> RequestTokens {
    RequestTokens::new(ids.to_vec())
}
