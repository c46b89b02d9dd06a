//! Why a bucket, group or resolver could not be built, a request could not be resolved, or a
//! selection failed.
//!
//! Construction errors name the offending value; router-server prefixes the field path.

use router_policies::{PickError, Rejection};
use router_workers::{ModelId, Stage, WorkerId};

/// An engine group that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// The attached policy cannot serve this group's stage (cache-aware on decode, say).
    #[error("policy {policy} does not support the {stage} stage")]
    UnsupportedStage {
        /// The policy's configuration name.
        policy: &'static str,
        /// The group's stage.
        stage: Stage,
    },
    /// `worker_ids` lists one worker twice.
    #[error("worker {worker} is listed twice in worker_ids")]
    DuplicateMember {
        /// The repeated worker.
        worker: WorkerId,
    },
}

/// A bucket that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BucketError {
    /// Bucket ids must be non-empty.
    #[error("bucket id must not be empty")]
    EmptyId,
    /// `limits.min` above `limits.max`.
    #[error("bucket {id}: limits.min {min} is greater than limits.max {max}")]
    InvertedRange {
        /// The bucket.
        id: String,
        /// The lower bound.
        min: u64,
        /// The upper bound.
        max: u64,
    },
    /// `max_context_tokens: 0` fits no request.
    #[error("bucket {id}: max_context_tokens must be at least 1")]
    ZeroContext {
        /// The bucket.
        id: String,
    },
    /// A context capacity below the smallest accepted input fits no request.
    #[error(
        "bucket {id}: max_context_tokens {context} is below limits.min {min}, so no request fits"
    )]
    ContextBelowMin {
        /// The bucket.
        id: String,
        /// The context capacity.
        context: u64,
        /// The lower input bound.
        min: u64,
    },
    /// A `live` SLO estimate with nothing to estimate it from.
    #[error("bucket {id}: a live SLO estimate needs an estimator")]
    LiveWithoutEstimator {
        /// The bucket.
        id: String,
    },
    /// A group was built for another stage than the slot it fills (a decode group as
    /// `prefill`, a prefill group as `plain`, ...).
    #[error("bucket {id}: the {slot} slot holds a {group} group")]
    GroupInWrongSlot {
        /// The bucket.
        id: String,
        /// The slot: `plain`, `prefill` or `decode`.
        slot: Stage,
        /// The stage the group was built for.
        group: Stage,
    },
}

/// A `pair_on` list that cannot be used. The message leaves the position to the field path
/// (`...groups.pd.pair_on[1]`), which [`PairOnError::position`] gives.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PairOnError {
    /// A label name is empty.
    #[error("label names must not be empty")]
    EmptyLabel {
        /// Index in `pair_on`.
        position: usize,
    },
    /// A label is listed twice.
    #[error("label {label:?} is listed twice")]
    DuplicateLabel {
        /// Index of the repetition in `pair_on`.
        position: usize,
        /// The label.
        label: String,
    },
}

impl PairOnError {
    /// The index in `pair_on` of the offending entry.
    pub fn position(&self) -> usize {
        match self {
            PairOnError::EmptyLabel { position } | PairOnError::DuplicateLabel { position, .. } => {
                *position
            }
        }
    }
}

/// A model's bucket collection that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolverBuildError {
    /// A model needs at least one bucket.
    #[error("model {model} has no buckets")]
    NoBuckets {
        /// The model.
        model: ModelId,
    },
    /// Two buckets share an id.
    #[error("model {model}: duplicate bucket id {id}")]
    DuplicateId {
        /// The model.
        model: ModelId,
        /// The repeated id.
        id: String,
    },
    /// A model is served by plain engines or by PD engines, never both, so one of these
    /// buckets could never select anything.
    #[error("model {model}: bucket {plain} is plain but bucket {pd} is prefill/decode")]
    MixedKinds {
        /// The model.
        model: ModelId,
        /// A plain bucket.
        plain: String,
        /// A PD bucket.
        pd: String,
    },
}

/// A request whose length signals cannot be resolved to buckets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// The expected peak (input plus requested output) is below the input itself.
    #[error("expected peak of {expected_peak_tokens} tokens is below the input of {input_tokens}")]
    InvalidSignal {
        /// The input length.
        input_tokens: u64,
        /// The expected peak.
        expected_peak_tokens: u64,
    },
}

/// A group's `worker_ids` names a worker it can never select.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MembershipError {
    /// No configured worker has this id.
    #[error("bucket {bucket}: {stage} worker_ids[{position}] names unknown worker {worker}")]
    UnknownWorker {
        /// The bucket.
        bucket: String,
        /// The group's stage.
        stage: Stage,
        /// Index in the group's `worker_ids`.
        position: usize,
        /// The unknown id.
        worker: WorkerId,
    },
    /// The worker exists but serves another role.
    #[error("bucket {bucket}: {stage} worker_ids[{position}] names {worker}, a {role} worker")]
    WrongRole {
        /// The bucket.
        bucket: String,
        /// The group's stage.
        stage: Stage,
        /// Index in the group's `worker_ids`.
        position: usize,
        /// The worker.
        worker: WorkerId,
        /// The worker's configured role.
        role: Stage,
    },
}

/// A failed group pick, with the stage it failed at.
///
/// The bucket loop advances to the next bucket when [`StagePickError::advances_bucket`] holds,
/// and reports the last unavailable stage when every bucket failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{stage} selection failed")]
pub struct StagePickError {
    /// The stage whose group failed.
    pub stage: Stage,
    /// The policy's (or the group's) answer.
    #[source]
    pub error: PickError,
}

impl StagePickError {
    /// Whether the bucket loop should try the next bucket (missing candidates or admission
    /// rejection) rather than stop routing.
    pub fn advances_bucket(&self) -> bool {
        self.error.advances_bucket()
    }
}

/// Why [`crate::BucketResolver::select`] found no complete selection.
///
/// router-server's `error.rs` maps each variant to one HTTP answer: `NoMatchingBucket` 400,
/// `NoAdmissibleEngine` and `NoCandidates` 503, `Stopped` by the policy's error (400 for a
/// client's unusable key, else 500), the rest 500.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SelectError {
    /// The length signals are invalid.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// No bucket accepts this request length.
    #[error("no bucket accepts {input_tokens} input tokens with expected peak {}", peak(*expected_peak_tokens))]
    NoMatchingBucket {
        /// The input length.
        input_tokens: u64,
        /// The expected peak, when known.
        expected_peak_tokens: Option<u64>,
    },
    /// Every compatible bucket failed and at least one failure was an admission rejection;
    /// these are all rejections met, in order.
    #[error("no admissible engine in any compatible bucket: {}", join(rejections))]
    NoAdmissibleEngine {
        /// Every rejection met, in bucket order.
        rejections: Vec<Rejection>,
    },
    /// Every compatible bucket failed for want of candidates; `stage` is the last stage that
    /// had none.
    #[error("no candidates for {stage} in any compatible bucket")]
    NoCandidates {
        /// The last unavailable stage.
        stage: Stage,
    },
    /// A pick failed in a way that stops routing (invalid signal or configuration, or a pick
    /// outside the candidates).
    #[error("bucket {bucket}: routing stopped")]
    Stopped {
        /// The bucket being tried.
        bucket: String,
        /// The failure.
        #[source]
        error: StagePickError,
    },
    /// The request names another model than the resolver's (a caller bug).
    #[error("request for model {request} given to the resolver of model {resolver}")]
    WrongModel {
        /// The resolver's model.
        resolver: ModelId,
        /// The request's model.
        request: ModelId,
    },
}

fn peak(expected_peak_tokens: Option<u64>) -> String {
    expected_peak_tokens.map_or_else(|| "unknown".to_owned(), |p| p.to_string())
}

fn join(rejections: &[Rejection]) -> String {
    rejections.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}
