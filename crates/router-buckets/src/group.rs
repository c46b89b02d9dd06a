//! Engine groups: a stage, a membership and an attached policy.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use router_policies::{Pick, PickError, Policy};
use router_workers::{ModelId, Stage, Worker, WorkerId, WorkerRegistry};

use crate::BucketRequest;
use crate::error::{GroupError, MembershipError};

/// One stage's engines inside a bucket, and the policy that chooses among them.
///
/// The group references workers by id; the live workers come from the [`WorkerRegistry`] on
/// every pick, so health, model and role are always current. The policy instance is shared by
/// every request that reaches this group (its round-robin cursor, say, is per group).
pub struct EngineGroup {
    stage: Stage,
    /// `worker_ids` as configured, in configuration order; `None` = every engine.
    members: Option<Vec<WorkerId>>,
    /// The same ids, sorted, for lookups.
    sorted: Option<Vec<WorkerId>>,
    policy: Arc<dyn Policy>,
}

impl fmt::Debug for EngineGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineGroup")
            .field("stage", &self.stage)
            .field("members", &self.members)
            .field("policy", &self.policy.name())
            .finish()
    }
}

impl EngineGroup {
    /// A group of `stage` engines.
    ///
    /// `membership`: `None` takes every accepting engine of the requested model and stage;
    /// `Some(ids)` only those ids (an empty list means no engine at all). Fails when `policy`
    /// does not support `stage` or an id is listed twice.
    pub fn new(
        stage: Stage,
        membership: Option<Vec<WorkerId>>,
        policy: Arc<dyn Policy>,
    ) -> Result<Self, GroupError> {
        if !policy.supports_stage(stage) {
            return Err(GroupError::UnsupportedStage { policy: policy.name(), stage });
        }
        let sorted = match &membership {
            None => None,
            Some(ids) => {
                let mut sorted = ids.clone();
                sorted.sort();
                if let Some(pair) = sorted.windows(2).find(|pair| pair[0] == pair[1]) {
                    return Err(GroupError::DuplicateMember { worker: pair[0].clone() });
                }
                Some(sorted)
            }
        };
        Ok(Self { stage, members: membership, sorted, policy })
    }

    /// A group taking every accepting engine of the model and `stage`.
    pub fn catch_all(stage: Stage, policy: Arc<dyn Policy>) -> Result<Self, GroupError> {
        Self::new(stage, None, policy)
    }

    /// The stage this group selects for.
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// The configured `worker_ids`, in configuration order; `None` means every engine.
    pub fn members(&self) -> Option<&[WorkerId]> {
        self.members.as_deref()
    }

    /// The attached policy.
    pub fn policy(&self) -> &Arc<dyn Policy> {
        &self.policy
    }

    /// Whether `id` is a member (always, for a catch-all group).
    pub fn admits(&self, id: &WorkerId) -> bool {
        self.sorted.as_ref().is_none_or(|sorted| sorted.binary_search(id).is_ok())
    }

    /// The candidates a pick for `model` would be given now: workers of `model` and this
    /// group's stage that accept new requests (healthy, not drained by the operator, not
    /// reporting starting or draining: [`Worker::accepts_new_requests`]) and are members,
    /// sorted by id.
    pub fn candidates(&self, workers: &WorkerRegistry, model: &ModelId) -> Vec<Arc<Worker>> {
        let mut candidates = workers.accepting(model, self.stage);
        if self.sorted.is_some() {
            candidates.retain(|worker| self.admits(worker.id()));
        }
        candidates
    }

    /// The candidates for `request`: [`EngineGroup::candidates`] within its subset and
    /// without the engines it excludes.
    fn candidates_for(
        &self,
        workers: &WorkerRegistry,
        request: &BucketRequest<'_>,
    ) -> Vec<Arc<Worker>> {
        let mut candidates = self.candidates(workers, request.model);
        request.narrow(&mut candidates);
        candidates
    }

    /// Picks one engine for `request` in bucket `bucket`.
    ///
    /// Builds the candidates (see [`EngineGroup::candidates`], within the request's subset
    /// when it has one); with none, answers
    /// [`PickError::NoCandidates`] without invoking the policy. Otherwise invokes the policy
    /// with a [`router_policies::PickRequest`] of this group's stage and checks the answer
    /// against the exact candidate set: an engine that is not one of the very `Arc<Worker>`
    /// values offered (another worker, or a replaced incarnation with the same id) is
    /// [`PickError::OutsideCandidates`].
    pub async fn pick(
        &self,
        workers: &WorkerRegistry,
        bucket: &str,
        request: &BucketRequest<'_>,
    ) -> Result<Pick, PickError> {
        self.pick_among(self.candidates(workers, request.model), bucket, request).await
    }

    /// [`EngineGroup::pick`] among `candidates`: this group's candidates narrowed further by
    /// the bucket (a PD pairing constraint), still sorted by id, and here by the request's own
    /// limits (its subset, the engines it excludes).
    pub(crate) async fn pick_among(
        &self,
        mut candidates: Vec<Arc<Worker>>,
        bucket: &str,
        request: &BucketRequest<'_>,
    ) -> Result<Pick, PickError> {
        request.narrow(&mut candidates);
        if candidates.is_empty() {
            return Err(PickError::NoCandidates { stage: self.stage });
        }
        let pick_request = request.pick_request(bucket, self.stage);
        let pick = self.policy.pick(&candidates, &pick_request).await?;
        if !is_candidate(&candidates, &pick.worker) {
            return Err(PickError::OutsideCandidates { worker: pick.worker.id().clone() });
        }
        Ok(pick)
    }

    /// A fallback to name after the engines `named` (the pick, then earlier fallbacks), for a
    /// proxy that retries on its own: the policy's [`Policy::pick_fallback`] over this
    /// request's candidates less `named`, asked as for a request without session or routing
    /// key so that no binding is read or moved. Checked against that exact candidate set like
    /// [`EngineGroup::pick`]; none left is [`PickError::NoCandidates`].
    pub async fn pick_fallback(
        &self,
        workers: &WorkerRegistry,
        bucket: &str,
        request: &BucketRequest<'_>,
        named: &[WorkerId],
    ) -> Result<Pick, PickError> {
        let mut candidates = self.candidates_for(workers, request);
        candidates.retain(|worker| !named.contains(worker.id()));
        if candidates.is_empty() {
            return Err(PickError::NoCandidates { stage: self.stage });
        }
        let keyless = BucketRequest { session_key: None, routing_key: None, ..*request };
        let pick_request = keyless.pick_request(bucket, self.stage);
        let pick = self.policy.pick_fallback(&candidates, &pick_request).await?;
        if !is_candidate(&candidates, &pick.worker) {
            return Err(PickError::OutsideCandidates { worker: pick.worker.id().clone() });
        }
        Ok(pick)
    }

    /// Reports every `worker_ids` entry naming an unknown worker or one of another role.
    /// `workers` are the model's configured workers and their roles.
    pub fn check_membership(
        &self,
        bucket: &str,
        workers: &HashMap<WorkerId, Stage>,
    ) -> Vec<MembershipError> {
        let Some(members) = &self.members else {
            return Vec::new();
        };
        members
            .iter()
            .enumerate()
            .filter_map(|(position, worker)| match workers.get(worker) {
                None => Some(MembershipError::UnknownWorker {
                    bucket: bucket.to_owned(),
                    stage: self.stage,
                    position,
                    worker: worker.clone(),
                }),
                Some(&role) if role != self.stage => Some(MembershipError::WrongRole {
                    bucket: bucket.to_owned(),
                    stage: self.stage,
                    position,
                    worker: worker.clone(),
                    role,
                }),
                Some(_) => None,
            })
            .collect()
    }
}

/// Whether `picked` is one of `candidates` (sorted by id, ids unique) — the same allocation,
/// not merely the same id.
fn is_candidate(candidates: &[Arc<Worker>], picked: &Arc<Worker>) -> bool {
    candidates
        .binary_search_by(|candidate| candidate.id().cmp(picked.id()))
        .is_ok_and(|index| Arc::ptr_eq(&candidates[index], picked))
}
