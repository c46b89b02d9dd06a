//! `--demo`: an embedded simulated fleet behind the router, so a newcomer can curl it with
//! nothing else installed.
//!
//! Two models, because a model is served by plain engines or by PD pairs, never both:
//! `demo` on four plain engines, and `demo-pd` on one prefill and one decode engine, each with
//! `PD_DP_SIZE` data-parallel ranks whose rank the router chooses (`dp_route: body`). Every
//! engine is a real router-sim engine in this process, on its own loopback ports, publishing KV
//! events over ZeroMQ and streaming load reports over gRPC like a real one. Plain and prefill
//! groups run [`RECOMMENDED_POLICY`], the policy that won the load sweep of
//! `docs/benchmarks.md`.

use std::path::{Path, PathBuf};

use router_sim::engine::{EngineConfig, RunningEngine, serve};
use router_workers::{DpRoute, KvEventsSpec, Stage, WorkerSpec};
use tokio_util::sync::CancellationToken;

use router_config::{
    BucketConfig, ConfigFile, GroupConfig, GroupsConfig, ModelConfig, PdGroupsConfig,
};

/// Plain engines of the `demo` model.
const PLAIN_ENGINES: usize = 4;

/// Data-parallel ranks of each engine of the `demo-pd` pair.
const PD_DP_SIZE: usize = 2;

/// The policy of the plain and prefill groups: the lowest mean and tail time to first token of
/// every policy under load (`cargo xtask bench --only quality`).
pub const RECOMMENDED_POLICY: &str = "predicted_ttft";

/// The running fleet; dropping it does not stop the engines, [`DemoFleet::stop`] does.
pub struct DemoFleet {
    engines: Vec<RunningEngine>,
    cancel: CancellationToken,
    /// The demo's `tokenizer.json`, written out for clients that tokenize prompts themselves.
    tokenizer: PathBuf,
}

impl DemoFleet {
    /// The demo's `tokenizer.json` (with its `tokenizer_config.json` beside it), for clients.
    pub fn tokenizer(&self) -> &Path {
        &self.tokenizer
    }

    /// Stops every engine.
    pub fn stop(&self) {
        self.cancel.cancel();
        for engine in &self.engines {
            engine.stop();
        }
    }
}

/// Why the demo could not start.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A simulated engine did not start.
    #[error("starting simulated engine {index}")]
    Engine {
        /// Which engine.
        index: usize,
        /// Why.
        #[source]
        source: router_sim::engine::EngineError,
    },
    /// The demo's own policy settings were refused.
    #[error("demo policy configuration")]
    Policy(#[source] serde_json::Error),
    /// The embedded tokenizer could not be written out.
    #[error("writing the demo's tokenizer to {}", dir.display())]
    Tokenizer {
        /// Where.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Where the demo writes its tokenizer: one place per user's temporary directory, so that a
/// client's `--tokenizer` path stays the same from one run to the next.
pub fn tokenizer_dir() -> PathBuf {
    std::env::temp_dir().join("router-demo")
}

fn engine_config(role: Stage, tokenizer: &Path) -> EngineConfig {
    let mut config = EngineConfig::new("demo");
    config.role = role;
    config.tokenizer = Some(tokenizer.to_owned());
    // Fast enough that a curl answers at once, slow enough that load and caching show.
    config.prefill_tokens_per_sec = 50_000.0;
    config.decode_tokens_per_sec = 200.0;
    config.kv_capacity_tokens = 32_768;
    config.kv_events = Some("tcp://127.0.0.1:0".to_owned());
    config.kv_replay = Some("tcp://127.0.0.1:0".to_owned());
    config.load_reporter = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    if role == Stage::Prefill {
        config.bootstrap_port = Some(0);
    }
    if role.is_pd() {
        config.model = "demo-pd".to_owned();
        config.dp_size = PD_DP_SIZE;
    }
    config
}

fn worker(id: String, engine: &RunningEngine, role: Stage, block_size: u32) -> WorkerSpec {
    WorkerSpec {
        bootstrap_port: engine.bootstrap_addr().map(|a| a.port()),
        kv_events: engine.kv_events_endpoint().map(|endpoint| KvEventsSpec {
            replay_endpoint: engine.kv_replay_endpoint().map(str::to_owned),
            block_size: Some(block_size),
            ..KvEventsSpec::new(endpoint)
        }),
        load_reporter: engine.load_reporter_addr().map(|addr| addr.to_string()),
        ..WorkerSpec::new(id, engine.url(), role)
    }
}

fn group(policy: &str) -> Result<GroupConfig, DemoError> {
    let mut spec = serde_json::json!({"type": policy});
    if policy == "cache_aware" {
        // Demo prompts are short: a shared prefix of a few blocks already counts as a hit.
        spec["cache_affinity_min_matched_tokens"] = 64.into();
    }
    let policy = serde_json::from_value(spec).map_err(DemoError::Policy)?;
    Ok(GroupConfig { worker_ids: None, policy })
}

/// Starts the engines and returns the router configuration that fronts them.
pub async fn start(port: u16) -> Result<(DemoFleet, ConfigFile), DemoError> {
    // Out of the binary, not the source tree: the demo runs wherever the binary is copied.
    let dir = tokenizer_dir();
    let tokenizer = router_sim::assets::gpt2::write_to(&dir)
        .map_err(|source| DemoError::Tokenizer { dir: dir.clone(), source })?;
    let cancel = CancellationToken::new();
    let mut engines = Vec::new();
    let roles: Vec<Stage> = std::iter::repeat_n(Stage::Plain, PLAIN_ENGINES)
        .chain([Stage::Prefill, Stage::Decode])
        .collect();
    for (index, role) in roles.iter().enumerate() {
        let config = engine_config(*role, &tokenizer);
        let engine = serve(config, cancel.child_token())
            .await
            .map_err(|source| DemoError::Engine { index, source })?;
        engines.push(engine);
    }
    let block_size = 16;
    let plain_workers = engines[..PLAIN_ENGINES]
        .iter()
        .enumerate()
        .map(|(i, e)| worker(format!("engine-{}", i + 1), e, Stage::Plain, block_size))
        .collect();
    let data_parallel = |spec: WorkerSpec| WorkerSpec {
        dp_size: PD_DP_SIZE as u32,
        dp_route: Some(DpRoute::Body),
        ..spec
    };
    let pd_workers = vec![
        data_parallel(worker(
            "prefill-1".into(),
            &engines[PLAIN_ENGINES],
            Stage::Prefill,
            block_size,
        )),
        data_parallel(worker(
            "decode-1".into(),
            &engines[PLAIN_ENGINES + 1],
            Stage::Decode,
            block_size,
        )),
    ];
    let mut config = ConfigFile::default();
    config.server.port = port;
    // Clients that name no model (SGLang's bench_serving, say) chat with the plain one.
    config.server.default_model = Some("demo".into());
    let model_tokenizer = Some(tokenizer.clone());
    config.models.push(ModelConfig {
        id: "demo".into(),
        tokenizer: model_tokenizer.clone(),
        chat_template: None,
        engine: Default::default(),
        affinity: Default::default(),
        ttft_slo: Default::default(),
        tps_slo: Default::default(),
        workers: plain_workers,
        buckets: vec![BucketConfig::default_for(GroupsConfig {
            plain: Some(group(RECOMMENDED_POLICY)?),
            pd: None,
        })],
    });
    config.models.push(ModelConfig {
        id: "demo-pd".into(),
        tokenizer: model_tokenizer,
        chat_template: None,
        engine: Default::default(),
        affinity: Default::default(),
        ttft_slo: Default::default(),
        tps_slo: Default::default(),
        workers: pd_workers,
        buckets: vec![BucketConfig {
            id: "pd".into(),
            rank: 0,
            limits: Default::default(),
            max_context_tokens: None,
            ttft_ms: None,
            tokens_per_second: None,
            groups: GroupsConfig {
                plain: None,
                pd: Some(PdGroupsConfig {
                    prefill: group(RECOMMENDED_POLICY)?,
                    decode: group("power_of_two")?,
                    pair_on: Vec::new(),
                }),
            },
        }],
    });
    Ok((DemoFleet { engines, cancel, tokenizer }, config))
}

/// The banner printed once the demo router listens; `tokenizer` is the fleet's.
pub fn banner(addr: std::net::SocketAddr, tokenizer: &Path) -> String {
    format!(
        "router listening on http://{addr}\n\
         demo fleet: model `demo` on {PLAIN_ENGINES} plain engines, model `demo-pd` on a \
         prefill/decode pair of {PD_DP_SIZE} data-parallel ranks each (all simulated), selected \
         by {RECOMMENDED_POLICY}\n\
         tokenizer (for clients that build prompts of a set length): {}\n\
         try:\n  curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' \
         -d '{{\"model\": \"demo\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}]}}'\n  \
         curl -s http://{addr}/v1/completions -H 'content-type: application/json' \
         -d '{{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 8}}'\n  \
         curl -s http://{addr}/generate -H 'content-type: application/json' \
         -d '{{\"model\": \"demo-pd\", \"text\": \"Hello\", \"sampling_params\": {{\"max_new_tokens\": 8}}}}'\n",
        tokenizer.display()
    )
}

#[cfg(test)]
mod tests;
