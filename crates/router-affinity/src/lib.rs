//! Affinity state: session and routing-key bindings to engines.
//!
//! Owns the [`AffinityStore`]: scoped assignments, compare-and-set updates, idle expiry through
//! an explicit sweep entry point, a bounded size with a defined eviction order, and
//! invalidation of a departed worker's bindings ([`follow_registry`]).
//!
//! Does not own: when to reuse or replace a binding (the session-aware and sticky policies in
//! router-policies), or spawning the background tasks (router-server spawns [`run_sweeper`]
//! and [`follow_registry`] and cancels them on shutdown; nothing here spawns).
//!
//! # Scopes
//! A binding applies to one [`Scope`]: (model, bucket id, stage, key), where the key is the
//! value of the session or routing-key header, or, for a policy configured with `scope: model`,
//! (model, stage, key) whatever the bucket ([`Scope::model_wide`]). The parts are
//! length-prefixed into one string, so no two different tuples share a scope (`("a:b", "c")`
//! and `("a", "b:c")` stay apart, and a model-wide scope never equals a bucket's).
//! Empty keys are refused ([`ScopeError::EmptyKey`]): a keyless request never creates a
//! binding. Keys longer than [`MAX_KEY_BYTES`] are refused too.
//!
//! Session and sticky policies have their own idle timeouts, so each uses its own store;
//! sharing one would also let a session id and an equal routing key share a binding.
//!
//! # Bindings
//! A [`Binding`] records the engine's [`WorkerId`](router_workers::WorkerId) and its
//! [`incarnation`](router_workers::Worker::incarnation). [`Binding::find_in`] resolves it
//! against the group's current candidates: a binding to an engine outside them, or to an
//! earlier incarnation of a replaced engine, finds nothing and so never wins.
//!
//! # Compare-and-set
//! - [`AffinityStore::get`] returns the live binding and refreshes its last use.
//! - [`AffinityStore::bind`] is bind-if-absent: `Ok(())` when this call created the binding,
//!   `Err(existing)` when someone else won first. Concurrent first assignments therefore
//!   converge on one binding; every loser gets the winner back and must check it (candidate,
//!   admission) before returning it.
//! - [`AffinityStore::replace`] swaps the binding only if it still equals the expected one,
//!   returning the actual current binding (or `None`) otherwise.
//!
//! A policy reconciles conflicts with a bounded retry, creating or replacing a binding only
//! after admission passed, and never rewriting a binding because admission rejected it:
//!
//! ```
//! use std::sync::Arc;
//! use router_affinity::{AffinityConfig, AffinityStore, Binding, Scope};
//! use router_workers::{ModelId, Stage, Worker};
//!
//! /// The bound engine when it is a candidate and admitted, else `fallback` once admitted.
//! fn pick<'a>(
//!     store: &AffinityStore,
//!     scope: &Scope,
//!     candidates: &'a [Arc<Worker>],
//!     fallback: &'a Arc<Worker>,
//!     admit: impl Fn(&Worker) -> bool,
//! ) -> Option<&'a Arc<Worker>> {
//!     let mut current = store.get(scope);
//!     for _ in 0..3 {
//!         if let Some(bound) = current.as_ref().and_then(|b| b.find_in(candidates)) {
//!             return admit(bound).then_some(bound); // a rejection keeps the binding
//!         }
//!         if !admit(fallback) {
//!             return None;
//!         }
//!         let swapped = match &current {
//!             None => store.bind(scope, Binding::of(fallback)).map_err(Some),
//!             Some(stale) => store.replace(scope, stale, Binding::of(fallback)),
//!         };
//!         match swapped {
//!             Ok(()) => return Some(fallback),
//!             Err(actual) => current = actual, // someone else moved first: check theirs
//!         }
//!     }
//!     None
//! }
//!
//! let model = ModelId::new("llama");
//! let a = Arc::new(Worker::plain("a", "http://10.0.0.1:8000", &model)?);
//! let b = Arc::new(Worker::plain("b", "http://10.0.0.2:8000", &model)?);
//! let candidates = [a.clone(), b.clone()];
//! let store = AffinityStore::new(AffinityConfig::default())?;
//! let scope = Scope::new(&model, "short", Stage::Plain, "session-1")?;
//!
//! // First turn: the fallback's engine is admitted and bound.
//! assert!(Arc::ptr_eq(pick(&store, &scope, &candidates, &a, |_| true).unwrap(), &a));
//! // Later turns reuse it whatever the fallback would say.
//! assert!(Arc::ptr_eq(pick(&store, &scope, &candidates, &b, |_| true).unwrap(), &a));
//! // Rejected: no engine, and the binding stays.
//! assert!(pick(&store, &scope, &candidates, &b, |w| w.id() != a.id()).is_none());
//! assert_eq!(store.get(&scope), Some(Binding::of(&a)));
//! // `a` left the group: the binding cannot win and is moved to the admitted fallback.
//! assert!(Arc::ptr_eq(pick(&store, &scope, &[b.clone()], &b, |_| true).unwrap(), &b));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Expiry
//! A binding not used for [`AffinityConfig::idle_timeout`] (default
//! [`DEFAULT_IDLE_TIMEOUT`], 600 s) is expired. Use means `get`, `bind` or `replace` on its
//! scope, including a `bind` or `replace` that lost. Lookups treat an expired binding as
//! absent at once; [`AffinityStore::sweep`]`(now)` frees the memory of all of them and is the
//! explicit entry point [`run_sweeper`] calls every [`AffinityConfig::sweep_interval`]
//! (default [`DEFAULT_SWEEP_INTERVAL`], 60 s). Time is [`tokio::time::Instant`], read under the
//! store's lock, so `tokio::time::pause` and `advance` drive expiry in tests.
//!
//! # Eviction order
//! The store holds at most [`AffinityConfig::max_entries`] bindings (default
//! [`DEFAULT_MAX_ENTRIES`]). Inserting a new binding into a full store first removes the
//! **least recently used** binding: the one whose last `get`, `bind` or `replace` is the
//! oldest. The order is exact (one list across the whole store), not sampled.
//!
//! # Invalidation
//! [`follow_registry`] removes the bindings of an engine when the registry reports it removed
//! (by incarnation, so bindings already made to its replacement survive), and resynchronises
//! if it falls behind. [`AffinityStore::invalidate_worker`] removes every binding to an id.
//!
//! # Concurrency and cost
//! One table behind one `parking_lot` mutex: each operation is a hash lookup plus O(1) list
//! moves, and nothing awaits under the lock. Worker invalidation scans the table (a rare
//! event); sweeps visit only expired entries and release the lock between batches.

mod binding;
mod config;
mod scope;
mod store;
mod table;
mod tasks;

pub use binding::Binding;
pub use config::{
    AffinityConfig, ConfigError, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_ENTRIES, DEFAULT_SWEEP_INTERVAL,
};
pub use scope::{MAX_KEY_BYTES, Scope, ScopeError};
pub use store::{AffinityStore, Stats};
pub use tasks::{follow_registry, run_sweeper};

#[cfg(test)]
mod tests;
