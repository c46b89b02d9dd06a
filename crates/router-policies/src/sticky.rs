//! Sticky: keep a routing key on the engine it was first given, while that engine is a
//! candidate and admitted.

use std::sync::Arc;

use futures::future::BoxFuture;
use router_affinity::AffinityStore;
use router_workers::Worker;

use crate::affinity::{Affinity, KeySource};
use crate::rendezvous::RendezvousPlacement;
use crate::{
    AdmissionCheck, BindingScope, LoadHandles, NewBinding, Pick, PickError, PickRequest, Policy,
    RendezvousLoad,
};

/// Binds each routing key (the routing-key header's value) to an engine, per (model, bucket
/// id, stage, key) or, with [`BindingScope::Model`], per (model, stage, key), with the same
/// rules as [`crate::SessionAwarePolicy`]; new, missing and
/// out-of-group keys go to the configured fallback (`round_robin` by default, `random`,
/// `power_of_two` or `load_based`; see [`crate::StickyFallback::build`]).
///
/// The fallback is built with default admission: this policy checks the engine it returns
/// before binding (or, without a key, before returning) it. Admission rejection of a bound
/// engine is [`PickError::AdmissionRejected`] and keeps the binding.
///
/// The caller owns the store, as for session-aware selection; use one for routing keys only.
#[derive(Debug)]
pub struct StickyPolicy {
    store: Arc<AffinityStore>,
    affinity: Affinity,
}

impl StickyPolicy {
    /// Routing-key affinity over `store`, with `fallback` for new, missing and out-of-group
    /// keys, admitting every engine.
    pub fn new(store: Arc<AffinityStore>, fallback: Arc<dyn Policy>) -> Self {
        Self { store, affinity: Affinity::new(KeySource::RoutingKey, fallback) }
    }

    /// Checks reused, concurrently bound and fallback engines with `admission`.
    pub fn with_admission(mut self, admission: AdmissionCheck) -> Self {
        self.affinity.admission = Some(admission);
        self
    }

    /// Places new routing keys by rendezvous hashing (`new_binding: rendezvous`) under the load
    /// `bound`, over the in-flight counts of `load`, instead of the fallback; keyless requests
    /// still go to the fallback.
    pub fn with_rendezvous(mut self, load: LoadHandles, bound: RendezvousLoad) -> Self {
        self.affinity.rendezvous = Some(RendezvousPlacement { bound, load });
        self
    }

    /// How new routing keys are placed.
    pub fn new_binding(&self) -> NewBinding {
        self.affinity.new_binding()
    }

    /// Binds routing keys per bucket (the default) or for the whole model.
    pub fn with_scope(mut self, scope: BindingScope) -> Self {
        self.affinity.scope = scope;
        self
    }

    /// How far a binding reaches.
    pub fn scope(&self) -> BindingScope {
        self.affinity.scope
    }

    /// The routing-key store this policy reads and binds.
    pub fn store(&self) -> &Arc<AffinityStore> {
        &self.store
    }

    /// The fallback for new, missing and out-of-group keys.
    pub fn fallback(&self) -> &Arc<dyn Policy> {
        &self.affinity.fallback
    }
}

impl Policy for StickyPolicy {
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
        "sticky"
    }
}
