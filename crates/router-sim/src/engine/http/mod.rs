//! The engine's HTTP face: the generation endpoints (OpenAI chat and legacy completions,
//! SGLang's `/generate`, all over one generation path) and the probes other routers use, behind
//! the `--api-key` check for `/v1/`, served (over TLS with `--tls-cert`) by an accept loop whose
//! connections drop at once when the engine stops (so a dying engine cuts its streams like a
//! killed process would), and the simulator's own controls under `/sim/`.

mod accept;
mod auth;
mod chat;
mod completions;
mod error;
mod fields;
mod generate;
mod generation;
mod info;
mod openai;
mod sim;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;

use super::EngineConfig;
use super::bootstrap::{BootstrapClient, Rooms};
use super::faults::FaultState;
use super::scheduler::Ranks;
use crate::tokens::Preprocessor;

pub(crate) use accept::accept_loop;
pub(crate) use sim::status;

/// Largest request body accepted.
const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// What the handlers share.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) config: EngineConfig,
    pub(crate) preprocessor: Arc<Preprocessor>,
    /// The data-parallel ranks' schedulers.
    pub(crate) ranks: Arc<Ranks>,
    pub(crate) faults: FaultState,
    /// The bootstrap rooms of a prefill engine.
    pub(crate) rooms: Option<Arc<Rooms>>,
    /// The bootstrap client of a decode engine.
    pub(crate) bootstrap: Option<BootstrapClient>,
    pub(crate) next_id: AtomicU64,
    pub(crate) started_unix: u64,
    pub(crate) stop: CancellationToken,
    /// Set by `POST /sim/drain`, cleared by `POST /sim/resume`: the load reporter states
    /// DRAINING (the engine still serves whatever reaches it).
    pub(crate) draining: Arc<AtomicBool>,
    /// Generation requests received (chat, completions, `/generate`), for `GET /sim/state`.
    pub(crate) received: AtomicU64,
    /// The W3C trace context (`traceparent`, `tracestate`) of the last request that carried
    /// one, for `GET /sim/state`.
    pub(crate) trace_context: parking_lot::Mutex<sim::TraceContext>,
}

impl Engine {
    pub(crate) fn new(
        config: EngineConfig,
        preprocessor: Arc<Preprocessor>,
        ranks: Arc<Ranks>,
        rooms: Option<Arc<Rooms>>,
        bootstrap: Option<BootstrapClient>,
        stop: CancellationToken,
        draining: Arc<AtomicBool>,
    ) -> Self {
        let faults = FaultState::new(config.faults.clone(), config.seed);
        Self {
            config,
            preprocessor,
            ranks,
            faults,
            rooms,
            bootstrap,
            next_id: AtomicU64::new(0),
            started_unix: unix_now(),
            stop,
            draining,
            received: AtomicU64::new(0),
            trace_context: parking_lot::Mutex::default(),
        }
    }

    /// Once the engine is dying, requests hang until its connections are dropped, as if the
    /// process were already gone.
    pub(crate) async fn refuse_if_dying(&self) {
        if self.faults.dying().is_cancelled() {
            self.stop.cancelled().await;
            std::future::pending::<()>().await;
        }
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The engine's routes; with an API key configured, every request under `/v1/` (unknown paths
/// included) must carry it.
pub(crate) fn router(engine: Arc<Engine>) -> Router {
    let api_key = engine.config.api_key.clone();
    let routes = Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/generate", post(generate::generate))
        .route("/v1/models", get(info::models))
        .route("/v1/tokenize", post(info::tokenize))
        .route("/v1/detokenize", post(info::detokenize))
        .route("/health", get(info::health))
        .route("/health_generate", get(info::health))
        .route("/get_server_info", get(info::server_info))
        .route("/get_model_info", get(info::model_info))
        .route("/v1/loads", get(info::loads))
        .route("/get_load", get(info::legacy_load))
        .route("/flush_cache", post(info::flush_cache))
        .route("/sim/drain", post(sim::drain))
        .route("/sim/resume", post(sim::resume))
        .route("/sim/state", get(sim::state))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(Arc::clone(&engine), sim::note_trace_context))
        .with_state(engine);
    match api_key {
        Some(key) => routes.layer(middleware::from_fn_with_state(key, auth::require_api_key)),
        None => routes,
    }
}
