//! The binding rules the session-aware and sticky policies share (docs/design/POLICY_DESIGN.md
//! §5 and §6 "Affinity state"). The two policies differ only in the header that names the
//! binding, the store they keep bindings in, and the fallback they run.
//!
//! For a request with a key, within the scope (model, bucket id, stage, key):
//! 1. A live binding whose engine is one of the candidates, in the same incarnation
//!    ([`Binding::find_in`]), is reused whatever the engines' pressure, if the owning policy's
//!    admission accepts it ([`PickReason::AffinityReused`]). If admission rejects it, the pick
//!    is [`PickError::AdmissionRejected`]: the binding is kept and no other engine is tried.
//! 2. A missing binding, or one to an engine outside the candidates, runs the fallback (built
//!    with default admission) once; the owning policy checks the engine it returns, and only an
//!    admitted engine is bound, with compare-and-set ([`PickReason::AffinityBound`]).
//! 3. When the compare-and-set finds that another pick moved first, the binding it made is
//!    taken through rule 1 again (candidate and admission) before it is returned; a winner
//!    outside the candidates is replaced. After [`MAX_BIND_ATTEMPTS`] lost compare-and-sets the
//!    pick gives up with [`PickError::NoCandidates`] (a selection miss).
//! 4. A request without a key, or with an empty one, gets the fallback's engine, checked by the
//!    owning policy, and creates no binding ([`PickReason::AffinityKeyless`]). A key longer
//!    than [`router_affinity::MAX_KEY_BYTES`] is [`PickError::InvalidKey`].
//!
//! A binding records placement, not dispatch: picking never touches in-flight accounting.
//!
//! With [`BindingScope::Model`] (`scope: model`) the scope is (model, stage, key): one binding
//! follows the key across the model's buckets. Bucket-first still rules: the bound engine is
//! used only when it is a candidate of the bucket being tried *and* admitted there. Otherwise
//! (another bucket's engine, or one this bucket's admission rejects) the pick runs as for a new
//! key (rule 2), and the binding moves only to an engine that is admitted. A rejected pick
//! keeps the binding, and the bucket loop moves on. So where bucket scope answers
//! [`PickError::AdmissionRejected`] for a rejected bound engine (the next bucket has bindings
//! of its own), model scope chooses another engine of this bucket first: the next bucket would
//! move the one binding anyway, and farther from the bucket the request prefers.

use std::sync::Arc;

use router_affinity::{AffinityStore, Binding, Scope, ScopeError};
use router_workers::Worker;

use crate::rendezvous::RendezvousPlacement;
use crate::{AdmissionCheck, Pick, PickError, PickReason, PickRequest, Policy};

/// How many compare-and-sets one pick may lose to other picks before it gives up. Each lost
/// one hands back the binding that won, so two rounds settle any race between picks that see
/// the same candidates; the bound only matters when concurrent picks see different candidate
/// sets of one group and keep replacing each other's bindings.
pub const MAX_BIND_ATTEMPTS: usize = 4;

/// How far a binding reaches: `scope` of `session_aware` and `sticky`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum BindingScope {
    /// One binding per (model, bucket, stage, key): a key that moves to another bucket is
    /// placed afresh there, and keeps its binding in the first for when it comes back.
    #[default]
    Bucket,
    /// One binding per (model, stage, key), shared by every bucket: a key keeps its engine
    /// across buckets while that engine is a candidate of the bucket being tried.
    Model,
}

impl BindingScope {
    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            BindingScope::Bucket => "bucket",
            BindingScope::Model => "model",
        }
    }

    /// The scope of `key` for a pick of `request`.
    fn of(self, request: &PickRequest<'_>, key: &str) -> Result<Scope, ScopeError> {
        match self {
            BindingScope::Bucket => Scope::new(request.model, request.bucket, request.stage, key),
            BindingScope::Model => Scope::model_wide(request.model, request.stage, key),
        }
    }
}

impl std::fmt::Display for BindingScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which request key names the binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// `PickRequest::session_key` (session-aware).
    Session,
    /// `PickRequest::routing_key` (sticky).
    RoutingKey,
}

impl KeySource {
    pub(crate) fn key<'r>(self, request: &PickRequest<'r>) -> Option<&'r str> {
        match self {
            KeySource::Session => request.session_key,
            KeySource::RoutingKey => request.routing_key,
        }
    }
}

impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeySource::Session => "session key",
            KeySource::RoutingKey => "routing key",
        })
    }
}

/// Compare-and-set access to bindings: the [`AffinityStore`] (the only implementation outside
/// tests, where a wrapper around a real store interleaves a competing writer deterministically).
pub(crate) trait Bindings: Send + Sync {
    /// See [`AffinityStore::get`].
    fn get(&self, scope: &Scope) -> Option<Binding>;
    /// See [`AffinityStore::bind`].
    fn bind(&self, scope: &Scope, binding: Binding) -> Result<(), Binding>;
    /// See [`AffinityStore::replace`].
    fn replace(
        &self,
        scope: &Scope,
        expected: &Binding,
        new: Binding,
    ) -> Result<(), Option<Binding>>;
}

impl Bindings for AffinityStore {
    fn get(&self, scope: &Scope) -> Option<Binding> {
        AffinityStore::get(self, scope)
    }

    fn bind(&self, scope: &Scope, binding: Binding) -> Result<(), Binding> {
        AffinityStore::bind(self, scope, binding)
    }

    fn replace(
        &self,
        scope: &Scope,
        expected: &Binding,
        new: Binding,
    ) -> Result<(), Option<Binding>> {
        AffinityStore::replace(self, scope, expected, new)
    }
}

/// How an affinity policy places a key it has no usable binding for: `new_binding` of
/// `session_aware` and `sticky`.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum NewBinding {
    /// The policy's fallback chooses (power-of-two for `session_aware`, the configured
    /// `fallback` for `sticky`): each router replica draws for itself, so replicas that see
    /// one key may bind it to different engines.
    #[default]
    Fallback,
    /// The admitted candidate of highest rendezvous weight for (key, engine id) under the
    /// load bound (see `rendezvous.rs`): replicas that share nothing agree on the engine.
    /// Requests without a key still go to the fallback.
    Rendezvous,
}

impl NewBinding {
    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            NewBinding::Fallback => "fallback",
            NewBinding::Rendezvous => "rendezvous",
        }
    }
}

/// The shared algorithm: where the key comes from, how far its binding reaches, the fallback,
/// how new keys are placed (`None`: by the fallback), and the owning policy's admission
/// (`None` admits every engine).
#[derive(Debug)]
pub(crate) struct Affinity {
    pub(crate) key: KeySource,
    pub(crate) scope: BindingScope,
    pub(crate) fallback: Arc<dyn Policy>,
    pub(crate) rendezvous: Option<RendezvousPlacement>,
    pub(crate) admission: Option<AdmissionCheck>,
}

impl Affinity {
    pub(crate) fn new(key: KeySource, fallback: Arc<dyn Policy>) -> Self {
        Self { key, scope: BindingScope::Bucket, fallback, rendezvous: None, admission: None }
    }

    pub(crate) fn new_binding(&self) -> NewBinding {
        match self.rendezvous {
            Some(_) => NewBinding::Rendezvous,
            None => NewBinding::Fallback,
        }
    }

    /// The engine a key without a usable binding goes to: the rendezvous choice among the
    /// admitted candidates (an error naming the highest-weight engine's rejection when none
    /// is admitted), or the fallback's admitted engine.
    async fn new_key_choice(
        &self,
        key: &str,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
    ) -> Result<Arc<Worker>, PickError> {
        let Some(rendezvous) = &self.rendezvous else {
            return self.fallback_choice(engines, request, false).await;
        };
        match rendezvous.choose(key, engines, |engine| self.admit(engine).is_ok()) {
            Some(engine) => Ok(Arc::clone(engine)),
            None => {
                let order = crate::rendezvous::rendezvous_order(key, engines);
                if let Some(&top) = order.first() {
                    self.admit(&engines[top])?;
                }
                Err(PickError::NoCandidates { stage: request.stage })
            }
        }
    }

    /// Picks one of `engines` for `request`, reading and updating bindings in `store`.
    pub(crate) async fn pick<S>(
        &self,
        store: &S,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError>
    where
        S: Bindings + ?Sized,
    {
        if engines.is_empty() {
            return Err(PickError::NoCandidates { stage: request.stage });
        }
        let key = self.key.key(request);
        let scope = match key.map(|key| self.scope.of(request, key)) {
            None | Some(Err(ScopeError::EmptyKey)) => {
                let worker = self.fallback_choice(engines, request, false).await?;
                return Ok(Pick::new(worker, PickReason::AffinityKeyless));
            }
            Some(Err(error)) => return Err(PickError::InvalidKey { key: self.key, error }),
            Some(Ok(scope)) => scope,
        };

        let mut current = store.get(&scope);
        let mut choice: Option<Arc<Worker>> = None;
        for _ in 0..MAX_BIND_ATTEMPTS {
            if let Some(bound) = current.as_ref().and_then(|binding| binding.find_in(engines)) {
                // The existing binding, or the one a concurrent pick made first: reused only if
                // admitted. A rejection keeps the binding; with bucket scope no other engine is
                // tried, with model scope this bucket picks as for a new key.
                match self.admit(bound) {
                    Ok(()) => return Ok(Pick::new(Arc::clone(bound), PickReason::AffinityReused)),
                    Err(rejected) if self.scope == BindingScope::Bucket => return Err(rejected),
                    Err(_) => {}
                }
            }
            // Missing, bound outside the candidates, or (model scope) not admitted here: the
            // fallback's admitted engine, chosen once per pick however many compare-and-sets
            // it takes. The binding moves only if that engine is admitted.
            let worker = match &choice {
                Some(worker) => Arc::clone(worker),
                None => {
                    let worker = self.new_key_choice(scope.key(), engines, request).await?;
                    choice = Some(Arc::clone(&worker));
                    worker
                }
            };
            let binding = Binding::of(&worker);
            let swapped = match &current {
                None => store.bind(&scope, binding).map_err(Some),
                Some(stale) => store.replace(&scope, stale, binding),
            };
            match swapped {
                Ok(()) => return Ok(Pick::new(worker, PickReason::AffinityBound)),
                Err(actual) => current = actual,
            }
        }
        Err(PickError::NoCandidates { stage: request.stage })
    }

    /// A fallback engine to name after a pick ([`crate::Policy::pick_fallback`]): the
    /// fallback policy's choice as for a request without a key, so no binding is read or
    /// made, and the fallback's own state is left alone.
    pub(crate) async fn pick_fallback(
        &self,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        if engines.is_empty() {
            return Err(PickError::NoCandidates { stage: request.stage });
        }
        let worker = self.fallback_choice(engines, request, true).await?;
        Ok(Pick::new(worker, PickReason::AffinityKeyless))
    }

    /// The fallback's engine, resolved to the candidate it names and admitted by the owning
    /// policy; asked with [`crate::Policy::pick_fallback`] when `for_fallback`.
    async fn fallback_choice(
        &self,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
        for_fallback: bool,
    ) -> Result<Arc<Worker>, PickError> {
        // The fallback reads its own state; this policy checks its own admission on the
        // engine it returns.
        let pick = if for_fallback {
            self.fallback.pick_fallback(engines, request).await?
        } else {
            self.fallback.pick(engines, request).await?
        };
        let Some(worker) = Binding::of(&pick.worker).find_in(engines) else {
            return Err(PickError::OutsideCandidates { worker: pick.worker.id().clone() });
        };
        self.admit(worker)?;
        Ok(Arc::clone(worker))
    }

    fn admit(&self, worker: &Worker) -> Result<(), PickError> {
        match &self.admission {
            Some(admission) => admission.check(worker),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
