//! Session-aware: keep a conversation on the engine it started on, while that engine is a
//! candidate and admitted.

use std::sync::Arc;

use futures::future::BoxFuture;
use router_affinity::AffinityStore;
use router_workers::Worker;

use crate::affinity::{Affinity, KeySource};
use crate::rendezvous::RendezvousPlacement;
use crate::{
    AdmissionCheck, BindingScope, LoadHandles, NewBinding, Pick, PickError, PickRequest, Policy,
    PowerOfTwoPolicy, RendezvousLoad,
};

/// Binds each session (the session header's key) to an engine, per (model, bucket id, stage,
/// key), or per (model, stage, key) with [`BindingScope::Model`], and reuses an admitted
/// binding regardless of pressure.
///
/// - A binding whose engine is a candidate (same incarnation) and passes this policy's
///   admission is reused ([`crate::PickReason::AffinityReused`]); if admission rejects it the
///   pick is [`PickError::AdmissionRejected`], the binding is kept, and no other engine is tried.
/// - A new session, or one bound outside the candidates, goes to power-of-two built with
///   default admission, or with [`Self::with_rendezvous`] to the admitted candidate of highest
///   rendezvous weight under the load bound; this policy checks the engine before binding it
///   ([`crate::PickReason::AffinityBound`]). A concurrent pick that bound the session first
///   wins, and its engine is checked the same way before it is returned.
/// - A request without a session key goes to power-of-two, checked by this policy, and creates
///   no binding ([`crate::PickReason::AffinityKeyless`]).
/// - With [`BindingScope::Model`] a bound engine this group's admission rejects is passed over
///   like one outside the candidates (the module documentation of `affinity.rs` says why).
///
/// The caller owns the store: its idle timeout, its sweeper and its registry follower
/// (`router_affinity::run_sweeper`, `router_affinity::follow_registry`). Use a store for
/// sessions only; sticky policies keep routing keys in another one.
#[derive(Debug)]
pub struct SessionAwarePolicy {
    store: Arc<AffinityStore>,
    load: LoadHandles,
    affinity: Affinity,
}

impl SessionAwarePolicy {
    /// Session affinity over `store`, with power-of-two over `load` as the fallback, admitting
    /// every engine.
    pub fn new(store: Arc<AffinityStore>, load: LoadHandles) -> Self {
        let fallback = Arc::new(PowerOfTwoPolicy::new(load.clone()));
        Self { store, load, affinity: Affinity::new(KeySource::Session, fallback) }
    }

    /// Samples the power-of-two fallback from a generator seeded with `seed`, for reproducible
    /// runs.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.affinity.fallback = Arc::new(PowerOfTwoPolicy::new(self.load.clone()).with_seed(seed));
        self
    }

    /// Checks reused, concurrently bound and fallback engines with `admission`.
    pub fn with_admission(mut self, admission: AdmissionCheck) -> Self {
        self.affinity.admission = Some(admission);
        self
    }

    /// Places new sessions by rendezvous hashing (`new_binding: rendezvous`) under the load
    /// `bound`, instead of power-of-two; keyless requests still go to power-of-two.
    pub fn with_rendezvous(mut self, bound: RendezvousLoad) -> Self {
        self.affinity.rendezvous = Some(RendezvousPlacement { bound, load: self.load.clone() });
        self
    }

    /// How new sessions are placed.
    pub fn new_binding(&self) -> NewBinding {
        self.affinity.new_binding()
    }

    /// Binds sessions per bucket (the default) or for the whole model.
    pub fn with_scope(mut self, scope: BindingScope) -> Self {
        self.affinity.scope = scope;
        self
    }

    /// How far a binding reaches.
    pub fn scope(&self) -> BindingScope {
        self.affinity.scope
    }

    /// The session store this policy reads and binds.
    pub fn store(&self) -> &Arc<AffinityStore> {
        &self.store
    }
}

impl Policy for SessionAwarePolicy {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Worker>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        Box::pin(self.affinity.pick(self.store.as_ref(), engines, request))
    }

    fn pick_fallback<'a>(
        &'a self,
        engines: &'a [Arc<Worker>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        Box::pin(self.affinity.pick_fallback(engines, request))
    }

    fn name(&self) -> &'static str {
        "session_aware"
    }
}
