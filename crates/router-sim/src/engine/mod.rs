//! The simulated engine: one [`serve`] call is one engine (an OpenAI and SGLang HTTP server,
//! optionally behind an API key and over TLS, a prefix cache with a timing model per
//! data-parallel rank, KV events over ZeroMQ, a PD bootstrap server for prefill engines, fault
//! injection, and the `/sim/` controls that make it report draining on demand), running until
//! its cancellation token fires or a `die_after` fault ends it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), router_sim::engine::EngineError> {
//! use router_sim::engine::{EngineConfig, serve};
//! let cancel = tokio_util::sync::CancellationToken::new();
//! let mut config = EngineConfig::new("sim-model");
//! config.kv_events = Some("tcp://127.0.0.1:0".into());
//! let engine = serve(config, cancel.clone()).await?;
//! println!("{} publishes on {:?}", engine.url(), engine.kv_events_endpoint());
//! cancel.cancel();
//! engine.wait().await;
//! # Ok(())
//! # }
//! ```

mod api_key;
mod bootstrap;
pub(crate) mod cache;
mod config;
pub mod events;
mod faults;
mod http;
mod load;
mod output;
mod reporter;
mod scheduler;
mod tls;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use router_workers::Stage;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use api_key::ApiKey;
pub use config::EngineConfig;
pub use events::{KvEvent, KvFormat, UnknownKvFormat};
pub use faults::Faults;
pub use load::{LoadSnapshot, RankLoad};
pub use scheduler::{LoadSource, SubmitError};
pub use tls::TlsError;

use crate::tokens::{PrepareError, Preprocessor};

/// How long a dying engine keeps its sockets after the last answered request, so that the
/// answer's bytes leave the process; new requests are not served meanwhile.
const DEATH_GRACE: Duration = Duration::from_millis(100);

/// The preprocessor of the tokenizer at `path`, loaded once per process while an engine uses
/// it: engines started side by side in one process (the demo's) share it instead of each
/// parsing the file (a third of a second for GPT-2's vocabulary).
fn loaded(path: &Path) -> Result<Arc<Preprocessor>, EngineError> {
    static LOADED: LazyLock<Mutex<HashMap<PathBuf, Weak<Preprocessor>>>> =
        LazyLock::new(Mutex::default);
    let mut loaded = LOADED.lock();
    if let Some(shared) = loaded.get(path).and_then(Weak::upgrade) {
        return Ok(shared);
    }
    let preprocessor =
        Arc::new(Preprocessor::from_tokenizer_file(path).map_err(EngineError::Tokenizer)?);
    loaded.retain(|_, weak| weak.strong_count() > 0);
    loaded.insert(path.to_owned(), Arc::downgrade(&preprocessor));
    Ok(preprocessor)
}

/// Why an engine could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A configuration value is unusable.
    #[error("invalid {flag}: {reason}")]
    Config {
        /// The flag (or field) at fault.
        flag: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// A TCP listener could not be bound.
    #[error("cannot bind {what} on {addr}")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The address tried.
        addr: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A ZeroMQ socket could not be bound.
    #[error("cannot bind {what} socket on {endpoint}")]
    ZmqBind {
        /// Which socket.
        what: &'static str,
        /// The endpoint tried.
        endpoint: String,
        /// The ZeroMQ error.
        #[source]
        source: zeromq::ZmqError,
    },
    /// The tokenizer or chat template could not be loaded.
    #[error("cannot load the tokenizer")]
    Tokenizer(#[source] PrepareError),
    /// The TLS certificate or key (`--tls-cert`, `--tls-key`) could not be used.
    #[error("cannot set up TLS")]
    Tls(#[source] TlsError),
}

/// How an engine ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Its cancellation token fired.
    Stopped,
    /// The `die_after` fault ended it after this many answered requests.
    Died {
        /// Generation requests answered before dying.
        answered: u64,
    },
}

/// A started engine: its bound addresses, a load handle, and a way to wait for its end.
#[derive(Debug)]
pub struct RunningEngine {
    http_addr: SocketAddr,
    /// `https` with TLS, else `http`.
    scheme: &'static str,
    kv_events: Option<String>,
    kv_replay: Option<String>,
    bootstrap_addr: Option<SocketAddr>,
    load_reporter_addr: Option<SocketAddr>,
    loads: LoadSource,
    stop: CancellationToken,
    tracker: TaskTracker,
    died: Arc<AtomicBool>,
    engine: Arc<http::Engine>,
}

impl RunningEngine {
    /// The bound HTTP address (the actual port when 0 was asked).
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// `http://HOST:PORT` of the OpenAI server, `https://HOST:PORT` with TLS.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.http_addr)
    }

    /// The bound KV-event PUB endpoint, `tcp://HOST:PORT`.
    pub fn kv_events_endpoint(&self) -> Option<&str> {
        self.kv_events.as_deref()
    }

    /// The bound KV replay ROUTER endpoint, `tcp://HOST:PORT`.
    pub fn kv_replay_endpoint(&self) -> Option<&str> {
        self.kv_replay.as_deref()
    }

    /// The bound bootstrap address of a prefill engine.
    pub fn bootstrap_addr(&self) -> Option<SocketAddr> {
        self.bootstrap_addr
    }

    /// The bound address of the gRPC load reporter (`--load-reporter`).
    pub fn load_reporter_addr(&self) -> Option<SocketAddr> {
        self.load_reporter_addr
    }

    /// A handle taking load snapshots of this engine.
    pub fn load_source(&self) -> LoadSource {
        self.loads.clone()
    }

    /// The lines the binary prints once the engine is ready, in order: `kv events on
    /// tcp://...`, `kv replay on tcp://...`, `bootstrap on http://...`, `load reporter on
    /// HOST:PORT` (each only when configured), and last `listening on http://...` (`https://`
    /// with TLS).
    pub fn ready_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(endpoint) = &self.kv_events {
            lines.push(format!("kv events on {endpoint}"));
        }
        if let Some(endpoint) = &self.kv_replay {
            lines.push(format!("kv replay on {endpoint}"));
        }
        if let Some(addr) = self.bootstrap_addr {
            lines.push(format!("bootstrap on http://{addr}"));
        }
        if let Some(addr) = self.load_reporter_addr {
            lines.push(format!("load reporter on {addr}"));
        }
        lines.push(format!("listening on {}", self.url()));
        lines
    }

    /// Stops the engine (as its cancellation token would).
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Waits until every task of the engine has ended.
    pub async fn wait(self) -> Exit {
        self.tracker.wait().await;
        if self.died.load(Ordering::SeqCst) {
            Exit::Died { answered: self.engine.faults.answered_count() }
        } else {
            Exit::Stopped
        }
    }
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, EngineError> {
    TcpListener::bind(addr).await.map_err(|source| EngineError::Bind {
        what,
        addr: addr.to_string(),
        source,
    })
}

/// Starts an engine. Everything is bound when this returns; the engine runs until `cancel`
/// fires (or a `die_after` fault), and [`RunningEngine::wait`] tells which.
pub async fn serve(
    config: EngineConfig,
    cancel: CancellationToken,
) -> Result<RunningEngine, EngineError> {
    config.validate()?;
    // The API key prints as `<redacted>`.
    tracing::debug!(?config, "engine starting");
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key).map_err(EngineError::Tls)?),
        _ => None,
    };
    let preprocessor = match &config.tokenizer {
        Some(path) => loaded(path)?,
        None => Arc::new(Preprocessor::builtin()),
    };
    let stop = cancel.child_token();
    let tracker = TaskTracker::new();
    let caching = config.role != Stage::Decode;

    let (publishers, endpoints) = if config.kv_events.is_some() || config.kv_replay.is_some() {
        let options = events::PublisherOptions {
            events: config.kv_events.clone(),
            replay: config.kv_replay.clone(),
            format: config.kv_format,
            topic: config.kv_topic.clone(),
            block_size: config.block_size as u32,
            ring: config.kv_replay_buffer,
            enabled: !config.faults.no_kv_events,
            dp_rank: 0,
        };
        let (publishers, endpoints) =
            events::start_ranks(options, config.dp_size, stop.clone(), &tracker).await?;
        (publishers.into_iter().map(Some).collect(), endpoints)
    } else {
        (vec![None; config.dp_size], events::BoundEndpoints::default())
    };

    let timing = scheduler::Timing {
        prefill_tokens_per_sec: config.prefill_tokens_per_sec,
        decode_tokens_per_sec: config.decode_tokens_per_sec,
    };
    let schedulers = publishers
        .into_iter()
        .zip(0u32..)
        .map(|(publisher, rank)| {
            let scheduler = Arc::new(scheduler::Scheduler::new(
                rank,
                config.block_size,
                config.kv_capacity_tokens,
                config.max_running,
                caching,
                timing,
                publisher,
            ));
            tracker.spawn(Arc::clone(&scheduler).run(stop.clone()));
            scheduler
        })
        .collect();
    let ranks = Arc::new(scheduler::Ranks::new(schedulers));

    let mut config = config;
    // Advertise the bound endpoints (the configured ports may be 0).
    config.kv_events.clone_from(&endpoints.events);
    config.kv_replay.clone_from(&endpoints.replay);
    let mut rooms = None;
    let mut bootstrap_addr = None;
    if let (Stage::Prefill, Some(port)) = (config.role, config.bootstrap_port) {
        let listener = bind("bootstrap server", SocketAddr::new(config.host, port)).await?;
        bootstrap_addr = listener.local_addr().ok();
        // Report the bound port (the configured one may be 0).
        config.bootstrap_port = bootstrap_addr.map(|addr| addr.port());
        let room_registry = Arc::new(bootstrap::Rooms::default());
        let router = bootstrap::router(Arc::clone(&room_registry));
        tracker.spawn(http::accept_loop(listener, router, None, stop.clone(), tracker.clone()));
        rooms = Some(room_registry);
    }

    let reporter_listener = match config.load_reporter {
        Some(addr) => {
            let listener = bind("load reporter", addr).await?;
            let bound = listener.local_addr().map_err(|source| EngineError::Bind {
                what: "load reporter",
                addr: addr.to_string(),
                source,
            })?;
            Some((listener, bound))
        }
        None => None,
    };

    let listener = bind("http server", SocketAddr::new(config.host, config.port)).await?;
    let http_addr = listener.local_addr().map_err(|source| EngineError::Bind {
        what: "http server",
        addr: format!("{}:{}", config.host, config.port),
        source,
    })?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let bootstrap_client = (config.role == Stage::Decode)
        .then(|| bootstrap::BootstrapClient::new(config.bootstrap_timeout));
    let draining = Arc::new(AtomicBool::new(false));
    let engine = Arc::new(http::Engine::new(
        config,
        preprocessor,
        Arc::clone(&ranks),
        rooms,
        bootstrap_client,
        stop.clone(),
        Arc::clone(&draining),
    ));
    tracker.spawn(http::accept_loop(
        listener,
        http::router(Arc::clone(&engine)),
        tls,
        stop.clone(),
        tracker.clone(),
    ));

    let loads =
        LoadSource::new(ranks).hiding_prefill_counters(engine.faults.hides_prefill_counters());
    let load_reporter_addr = reporter_listener.map(|(listener, addr)| {
        let dying = engine.faults.dying().clone();
        reporter::start(listener, addr, loads.clone(), dying, draining, stop.clone(), &tracker);
        addr
    });

    let died = Arc::new(AtomicBool::new(false));
    {
        let (stop, died, dying) = (stop.clone(), Arc::clone(&died), engine.faults.dying().clone());
        tracker.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = dying.cancelled() => {
                    died.store(true, Ordering::SeqCst);
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = tokio::time::sleep(DEATH_GRACE) => stop.cancel(),
                    }
                }
            }
        });
    }
    tracker.close();
    Ok(RunningEngine {
        http_addr,
        scheme,
        kv_events: endpoints.events,
        kv_replay: endpoints.replay,
        bootstrap_addr,
        load_reporter_addr,
        loads,
        stop,
        tracker,
        died,
        engine,
    })
}
