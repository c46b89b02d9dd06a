//! Workers: the engines the router sends requests to.
//!
//! Owns the identity of an engine ([`WorkerId`]), the models it serves ([`ModelId`]), its
//! [`Stage`] (plain, prefill or decode), its engine-side endpoints (KV events, load reporter,
//! PD bootstrap port), where it came from ([`WorkerOrigin`]), its [`WorkerLabels`], its live
//! state (health, the operator's drain, the [`EngineStatus`] its load reports last stated,
//! which together decide [`Worker::accepts_new_requests`]), and the [`WorkerRegistry`] with
//! its change feed.
//!
//! Does not own: load or KV-cache observations (router-state-load, router-state-kv), health
//! probing (router-server drives it and calls [`WorkerRegistry::set_health`]), reading the
//! reports (router-state-load calls [`WorkerRegistry::set_reported_status`]), or selection.

mod error;
mod labels;
mod origin;
mod registry;
mod status;
mod worker;

pub use error::WorkerError;
pub use labels::WorkerLabels;
pub use origin::{DiscoveredPod, WorkerOrigin};
pub use registry::{ModelKind, RegistryEvent, WorkerRegistry};
pub use status::EngineStatus;
pub use worker::{
    ApiKey, DEFAULT_BLOCK_SIZE, DpRoute, EngineKind, KvEventsSpec, LoadPollFormat, LoadPollSpec,
    ModelId, Stage, Worker, WorkerId, WorkerSpec, id_header, validate_url,
};

#[cfg(test)]
mod tests;
