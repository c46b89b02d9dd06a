//! The router: configuration, request preparation, bucket dispatch and operations.
//!
//! Owns the assembly of every other crate into the `router-server` binary: the configuration
//! file and command line, the `AppContext` that starts shared services once and stops them on
//! shutdown, request preparation (validation, chat template, tokenizer), serving a prepared
//! request through router-buckets' bucket loop ([`serve`]), dispatch to a plain engine or a PD
//! pair ([`dispatch`]) over the engine clients ([`forward`]), the client/engine/admin credentials,
//! slow-client timeouts, health checking and circuit breaking, metrics and the admin API.
//! Domain errors are mapped to HTTP statuses in one place ([`error`]).
//!
//! Does not own: selection (router-policies, router-buckets) or state ingestion (the state
//! crates).

pub mod app;
pub mod auth;
pub mod config;
pub mod demo;
pub mod dispatch;
pub mod error;
pub mod forward;
pub mod health;
pub mod limit;
pub mod logging;
pub mod metrics;
pub mod prepare;
pub mod retry;
pub mod routes;
pub mod serve;
pub mod server;
pub mod tls;
