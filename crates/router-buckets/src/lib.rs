//! Buckets: length-first resolution and complete plain or PD engine selection.
//!
//! Owns [`BucketResolver`], [`Bucket`], [`BucketGroups`], [`EngineGroup`] and their validation.
//! It implements docs/design/POLICY_DESIGN.md §2 and §3:
//!
//! 1. [`BucketResolver::resolve`] keeps the buckets whose inclusive input range contains the
//!    input and whose context capacity holds the expected peak (or the input, when the output
//!    budget is unknown), ordered by input capacity (unbounded last), then rank, then id. It
//!    looks at no worker and no policy.
//! 2. [`Bucket::pick_engines`] asks its one plain group, or its prefill then its decode group,
//!    for an engine, and answers a complete [`BucketPick`] or a [`StagePickError`] that keeps
//!    the failing stage. Both PD engines come from the same bucket, and with a [`PairOn`]
//!    constraint they agree on its labels (a label missing on either side never matches).
//! 3. [`EngineGroup::pick`] takes the workers of the model and stage that accept new requests
//!    (healthy, not drained by the operator, not reporting starting or draining) from the
//!    [`router_workers::WorkerRegistry`], intersects them with its membership (`None` = all,
//!    empty = none), sorts them by id, invokes its policy and rejects an answer outside that
//!    exact candidate set — including a replaced worker that merely shares a candidate's id.
//! 4. [`BucketResolver::order`] reorders the compatible buckets by the request's SLO targets
//!    (docs/design/SLO.md): with a target whose model preference is enabled, each bucket gets a
//!    tier per target (`slo_first`: when it misses it; `best_effort`: when it meets it) from its
//!    declared or live estimates ([`BucketSlo`]), and buckets sort by tiers, then by the length
//!    order. Without one the order is the length order.
//! 5. [`BucketResolver::select`] is the bucket loop over that order: it advances on missing
//!    candidates or admission rejection, stops on anything else, and after the last bucket
//!    reports the accumulated rejections or the last unavailable stage ([`SelectError`]). Its
//!    [`Selection`] says whether the chosen bucket met each target ([`SloVerdict`]).
//!
//! Configuration parsing belongs to router-server; this crate offers validating constructors
//! ([`EngineGroup::new`], [`Bucket::new`], [`BucketResolver::new`]) and
//! [`BucketResolver::check_membership`] for role-compatible `worker_ids`, and
//! [`Bucket::pairing_warnings`] for prefill engines without a possible partner. Their errors
//! name the offending value; the server prefixes the field path.
//!
//! ```
//! # use std::sync::Arc;
//! # use futures::future::BoxFuture;
//! # use router_policies::{Pick, PickError, PickReason, PickRequest, Policy};
//! # use router_workers::{ModelId, Stage, Worker, WorkerRegistry};
//! use router_buckets::{
//!     Bucket, BucketGroups, BucketPick, BucketRequest, BucketResolver, BucketSlo, BucketSpec,
//!     EngineGroup, SloTargets, TokenLimits,
//! };
//! # #[derive(Debug)]
//! # struct First;
//! # impl Policy for First {
//! #     fn pick<'a>(&'a self, engines: &'a [Arc<Worker>], _: &'a PickRequest<'a>)
//! #         -> BoxFuture<'a, Result<Pick, PickError>> {
//! #         Box::pin(async move { Ok(Pick::new(Arc::clone(&engines[0]), PickReason::RoundRobin)) })
//! #     }
//! #     fn name(&self) -> &'static str { "first" }
//! # }
//! let model = ModelId::new("llama");
//! let workers = WorkerRegistry::new();
//! workers.add(Worker::plain("a", "http://10.0.0.1:30000", &model)?)?;
//!
//! let group = EngineGroup::new(Stage::Plain, None, Arc::new(First))?;
//! let bucket = Bucket::new(BucketSpec {
//!     id: "all".into(),
//!     rank: 0,
//!     limits: TokenLimits { min: 0, max: None },
//!     max_context_tokens: Some(32_768),
//!     groups: BucketGroups::Plain(group),
//!     slo: BucketSlo::NONE,
//!     live: None,
//! })?;
//! let resolver = BucketResolver::new(model.clone(), vec![bucket])?;
//!
//! let request = BucketRequest {
//!     model: &model,
//!     input_tokens: 1_000,
//!     expected_peak_tokens: Some(1_500),
//!     tokens: None,
//!     session_key: None,
//!     routing_key: None,
//!     slo: SloTargets::NONE,
//!     excluded: &[],
//!     subset: None,
//! };
//! let selection = futures::executor::block_on(resolver.select(&workers, &request))
//!     .map_err(|failure| failure.error)?;
//! assert_eq!(selection.bucket.id(), "all");
//! assert!(matches!(selection.pick, BucketPick::Plain(ref p) if p.worker.id().as_str() == "a"));
//! let (group, pick) = selection.picks().next().expect("the plain pick");
//! assert_eq!((group.policy().name(), pick.worker.id().as_str()), ("first", "a"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Does not own: policies or their state (router-policies), HTTP, or dispatch (router-server).

mod bucket;
mod error;
mod group;
mod pair;
mod resolver;
mod slo;

pub use bucket::{Bucket, BucketGroups, BucketPick, BucketRequest, BucketSpec, TokenLimits};
pub use error::{
    BucketError, GroupError, MembershipError, PairOnError, ResolveError, ResolverBuildError,
    SelectError, StagePickError,
};
pub use group::EngineGroup;
pub use pair::{PairOn, PairingWarning};
pub use resolver::{BucketResolver, OrderedBucket, SelectFailure, Selection, Skipped};
pub use slo::{
    BucketSlo, SloCheck, SloEstimate, SloEstimates, SloPreference, SloPreferences, SloTargetError,
    SloTargets, SloVerdict, TokensPerSecond, UnknownSloPreference,
};
