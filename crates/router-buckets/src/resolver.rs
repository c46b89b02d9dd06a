//! A model's buckets: length-first resolution, SLO-aware ordering and the bucket loop.

use std::collections::{HashMap, HashSet};

use router_policies::{Pick, Rejection};
use router_workers::{ModelId, Stage, WorkerId, WorkerRegistry};

use crate::error::{
    MembershipError, ResolveError, ResolverBuildError, SelectError, StagePickError,
};
use crate::slo::{SloPreferences, SloVerdict};
use crate::{Bucket, BucketPick, BucketRequest, EngineGroup};

/// A model's bucket collection, ordered once at construction.
#[derive(Debug)]
pub struct BucketResolver {
    model: ModelId,
    /// In configuration order.
    buckets: Vec<Bucket>,
    /// Indexes into `buckets` in resolution order.
    order: Vec<usize>,
    /// How requests' SLO targets reorder the compatible buckets.
    slo: SloPreferences,
}

impl BucketResolver {
    /// Builds `model`'s resolver. Fails on no buckets, a repeated bucket id, or a mix of plain
    /// and PD buckets (a model is served by one kind of engine only).
    pub fn new(model: ModelId, buckets: Vec<Bucket>) -> Result<Self, ResolverBuildError> {
        if buckets.is_empty() {
            return Err(ResolverBuildError::NoBuckets { model });
        }
        let mut seen = HashSet::with_capacity(buckets.len());
        for bucket in &buckets {
            if !seen.insert(bucket.id()) {
                return Err(ResolverBuildError::DuplicateId { model, id: bucket.id().to_owned() });
            }
        }
        let plain = buckets.iter().find(|b| !b.groups().is_pd());
        let pd = buckets.iter().find(|b| b.groups().is_pd());
        if let (Some(plain), Some(pd)) = (plain, pd) {
            return Err(ResolverBuildError::MixedKinds {
                model,
                plain: plain.id().to_owned(),
                pd: pd.id().to_owned(),
            });
        }
        let mut order: Vec<usize> = (0..buckets.len()).collect();
        // Ids are unique, so the key is a total order and the result does not depend on the
        // configuration order.
        order.sort_by(|&a, &b| buckets[a].order_key().cmp(&buckets[b].order_key()));
        Ok(Self { model, buckets, order, slo: SloPreferences::default() })
    }

    /// This resolver with the model's SLO preferences (default: both disabled).
    pub fn with_slo(mut self, preferences: SloPreferences) -> Self {
        self.slo = preferences;
        self
    }

    /// The model's SLO preferences.
    pub fn slo(&self) -> SloPreferences {
        self.slo
    }

    /// The model.
    pub fn model(&self) -> &ModelId {
        &self.model
    }

    /// The buckets, in configuration order.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// Every bucket that fits the request, in the order to try them.
    ///
    /// A bucket fits when `input_tokens` lies in its inclusive limits and its context capacity
    /// holds `expected_peak_tokens` when known, else `input_tokens`. The order is ascending input
    /// capacity (the lesser of `limits.max` and the context capacity; unbounded last), then
    /// rank, then id. An empty list means no bucket matches the request's length.
    ///
    /// Fails when a known expected peak is below the input.
    pub fn resolve(
        &self,
        input_tokens: u64,
        expected_peak_tokens: Option<u64>,
    ) -> Result<Vec<&Bucket>, ResolveError> {
        Ok(self.compatible(input_tokens, expected_peak_tokens)?.collect())
    }

    /// [`Self::resolve`]'s buckets as they are found, for a caller that collects them its own way.
    fn compatible(
        &self,
        input_tokens: u64,
        expected_peak_tokens: Option<u64>,
    ) -> Result<impl Iterator<Item = &Bucket>, ResolveError> {
        if let Some(peak) = expected_peak_tokens
            && peak < input_tokens
        {
            return Err(ResolveError::InvalidSignal { input_tokens, expected_peak_tokens: peak });
        }
        Ok(self
            .order
            .iter()
            .map(|&index| &self.buckets[index])
            .filter(move |bucket| bucket.fits(input_tokens, expected_peak_tokens)))
    }

    /// The buckets to try for `request`, in order, each with how it stood against the
    /// request's SLO targets (docs/design/SLO.md, "Ordering").
    ///
    /// The compatible buckets of [`Self::resolve`] keep their length order unless the request
    /// states a target whose preference is enabled. Then each such target adds a tier to a
    /// bucket (under `slo_first` when it does not meet the target, under `best_effort` when it
    /// does), and buckets are sorted by their tiers, fewer first, stably: equal tiers keep the
    /// capacity, rank and id order. Estimates are read once per call: declared ones as
    /// configured, live ones from the engines' load now ([`Bucket::slo_estimates`]).
    pub async fn order(
        &self,
        workers: &WorkerRegistry,
        request: &BucketRequest<'_>,
    ) -> Result<Vec<OrderedBucket<'_>>, ResolveError> {
        let compatible = self.compatible(request.input_tokens, request.expected_peak_tokens)?;
        let active = self.slo.active(request.slo);
        if active.is_empty() {
            // Collected once, straight into the order: no list of buckets before it.
            let unranked = |bucket| OrderedBucket { bucket, slo: SloVerdict::default() };
            return Ok(compatible.map(unranked).collect());
        }
        let mut ranked = Vec::new();
        for bucket in compatible {
            let estimates = bucket.slo_estimates(workers, request, active).await;
            let (tiers, slo) = self.slo.judge(active, estimates);
            ranked.push((tiers, OrderedBucket { bucket, slo }));
        }
        ranked.sort_by_key(|(tiers, _)| *tiers);
        Ok(ranked.into_iter().map(|(_, ordered)| ordered).collect())
    }

    /// The whole bucket loop for one request: orders its buckets ([`Self::order`]), then asks
    /// each in order for a complete selection until one succeeds.
    ///
    /// Missing candidates and admission rejection move on to the next bucket, where every
    /// engine is selected again (a failed PD attempt contributes nothing to a later pair). Any
    /// other failure stops at once. After the last bucket: the accumulated admission rejections
    /// if there were any, else the last stage that had no candidates. Success and failure both
    /// carry the buckets passed over on the way, for the caller's metrics.
    pub async fn select(
        &self,
        workers: &WorkerRegistry,
        request: &BucketRequest<'_>,
    ) -> Result<Selection<'_>, SelectFailure<'_>> {
        let unselected = |error| SelectFailure { error, skipped: Vec::new() };
        if *request.model != self.model {
            return Err(unselected(SelectError::WrongModel {
                resolver: self.model.clone(),
                request: request.model.clone(),
            }));
        }
        let buckets =
            self.order(workers, request).await.map_err(|error| unselected(error.into()))?;
        let mut skipped: Vec<Skipped<'_>> = Vec::new();
        for OrderedBucket { bucket, slo } in buckets {
            match bucket.pick_engines(workers, request).await {
                Ok(pick) => return Ok(Selection { bucket, pick, skipped, slo }),
                Err(error) if error.advances_bucket() => skipped.push(Skipped { bucket, error }),
                Err(error) => {
                    let error = SelectError::Stopped { bucket: bucket.id().to_owned(), error };
                    return Err(SelectFailure { error, skipped });
                }
            }
        }
        Err(SelectFailure { error: exhausted(request, &skipped), skipped })
    }

    /// Whether some bucket has candidates in each of its groups for this model now. For
    /// readiness.
    pub fn has_candidates(&self, workers: &WorkerRegistry) -> bool {
        self.buckets.iter().any(|bucket| bucket.has_candidates(workers, &self.model))
    }

    /// Reports every `worker_ids` entry, in every bucket, naming an unknown worker or one of
    /// another role. `workers` are the model's configured workers and their roles.
    pub fn check_membership(&self, workers: &HashMap<WorkerId, Stage>) -> Vec<MembershipError> {
        self.buckets.iter().flat_map(|bucket| bucket.check_membership(workers)).collect()
    }
}

/// The error once every resolved bucket failed with an advancing error.
fn exhausted(request: &BucketRequest<'_>, skipped: &[Skipped<'_>]) -> SelectError {
    let Some(last) = skipped.last() else {
        return SelectError::NoMatchingBucket {
            input_tokens: request.input_tokens,
            expected_peak_tokens: request.expected_peak_tokens,
        };
    };
    let rejections: Vec<Rejection> =
        skipped.iter().flat_map(|s| s.error.error.rejections()).cloned().collect();
    if rejections.is_empty() {
        SelectError::NoCandidates { stage: last.error.stage }
    } else {
        SelectError::NoAdmissibleEngine { rejections }
    }
}

/// A complete selection and how it was reached.
#[derive(Debug)]
pub struct Selection<'r> {
    /// The bucket that supplied it.
    pub bucket: &'r Bucket,
    /// The engines.
    pub pick: BucketPick,
    /// The buckets tried before, in order, with why each was passed over.
    pub skipped: Vec<Skipped<'r>>,
    /// How the chosen bucket stood against the request's SLO targets when the order was made.
    pub slo: SloVerdict,
}

/// A bucket to try, with how it stood against the request's SLO targets.
#[derive(Debug)]
pub struct OrderedBucket<'r> {
    /// The bucket.
    pub bucket: &'r Bucket,
    /// A check for each stated target whose preference is enabled.
    pub slo: SloVerdict,
}

impl Selection<'_> {
    /// Each pick with the group that made it: the plain one, or prefill then decode.
    pub fn picks(&self) -> impl Iterator<Item = (&EngineGroup, &Pick)> {
        self.bucket.groups().iter().zip(self.pick.iter().map(|(_, pick)| pick))
    }
}

/// No complete selection: why, and the buckets passed over before the loop ended.
#[derive(Debug)]
pub struct SelectFailure<'r> {
    /// Why the loop ended without a selection.
    pub error: SelectError,
    /// The buckets tried and passed over, in order (with [`SelectError::Stopped`], those
    /// before the bucket that stopped routing).
    pub skipped: Vec<Skipped<'r>>,
}

/// A bucket passed over by the bucket loop.
#[derive(Debug)]
pub struct Skipped<'r> {
    /// The bucket.
    pub bucket: &'r Bucket,
    /// Why (always an error that advances the loop).
    pub error: StagePickError,
}
