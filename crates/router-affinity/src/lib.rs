//! Affinity state: session and routing-key bindings to engines.
//!
//! Owns the `AffinityStore`: scoped assignments, compare-and-set updates, idle expiry through an
//! explicit sweep entry point, and invalidation of a departed worker's bindings.
//!
//! Does not own: when to reuse or replace a binding (the session-aware and sticky policies), or
//! the task that drives the sweep (router-server).
