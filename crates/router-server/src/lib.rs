//! The router: configuration, request preparation, bucket dispatch and operations.
//!
//! Owns the assembly of every other crate into the `router-server` binary: the configuration
//! file and command line, the `AppContext` that starts shared services once and stops them on
//! shutdown, request intake (router-prepare reads and tokenizes the body), serving a prepared
//! request through router-buckets' bucket loop (`serve.rs`), dispatch to a plain engine or a PD
//! pair (`dispatch/`) over the engine clients (`forward/`), the client/engine/admin credentials,
//! slow-client timeouts, health checking and circuit breaking, metrics and the admin API; and
//! the endpoint picker for Envoy-based gateways (`epp/`), which prepares (router-prepare) and
//! selects the same way and lets Envoy forward.
//! Domain errors are mapped to HTTP statuses in one place (`error.rs`).
//!
//! Does not own: selection (router-policies, router-buckets) or state ingestion (the state
//! crates).

pub mod app;
mod auth;
mod chain;
pub mod demo;
mod dispatch;
pub mod epp;
mod error;
mod forward;
mod health;
mod intake;
mod limit;
pub mod logging;
mod metrics;
mod rate_limit;
mod retry;
mod routes;
mod serve;
pub mod server;
pub mod telemetry;

#[cfg(test)]
mod tests;
