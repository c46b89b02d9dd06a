//! Tests of the affinity rules through both policies, over a real `AffinityStore`, real load
//! state and, for invalidation, a real `WorkerRegistry`.
//!
//! - `rules`: one table row per binding rule, run for every deterministic fallback flavor;
//! - `model_scope`: the same for model-wide bindings (`scope: model`), and a key crossing
//!   buckets;
//! - `races`: lost compare-and-sets, made deterministic by a competing writer that moves just
//!   before each of the policy's writes, plus real concurrent picks;
//! - `lifecycle`: construction from configuration, separate stores, expiry with paused time,
//!   invalidation on worker removal, and a property test of the invariants.

mod fixture;
mod lifecycle;
mod model_scope;
mod races;
mod rules;
