//! The quick start: the single-bucket configuration that `--worker-urls` (or
//! `--pd-disaggregation` with `--prefill` and `--decode`, or `--service-discovery`) and the
//! policy, tokenizer and KV-event flags describe without a file.

use std::path::PathBuf;

use router_policies::PolicyConfig;
use router_workers::{DpRoute, Stage, WorkerSpec};
use serde_json::{Map, Value, json};

use super::dropin;
use super::file::{
    BucketConfig, ConfigFile, GroupConfig, GroupsConfig, ModelConfig, PdGroupsConfig,
};

use super::cli::ServeArgs;

/// The in-flight cap `--filter overloaded` applies without `--max-in-flight`.
pub(super) const DEFAULT_OVERLOAD_INFLIGHT: u64 = 256;

impl ServeArgs {
    /// Builds the configuration the quick-start flags describe: one model, one bucket.
    pub fn quick_start_config(&self) -> Result<ConfigFile, String> {
        if let Some(mode) = &self.affinity_mode
            && mode != "strict"
        {
            return Err(format!("--affinity-mode {mode}: only strict exists"));
        }
        let mut inflight_cap = self.max_in_flight;
        for filter in &self.filter {
            match filter.as_str() {
                "overloaded" => {
                    inflight_cap.get_or_insert(DEFAULT_OVERLOAD_INFLIGHT);
                }
                other => return Err(format!("--filter {other}: unknown filter (overloaded)")),
            }
        }
        let group = |policy: Option<&str>| -> Result<GroupConfig, String> {
            let mut map = Map::new();
            map.insert("type".into(), dropin::policy_alias(policy.unwrap_or("round_robin")).into());
            for arg in &self.policy_args {
                let (key, value) = arg
                    .split_once('=')
                    .ok_or_else(|| format!("--policy-arg {arg}: expected KEY=VALUE"))?;
                let value = serde_json::from_str(value).unwrap_or_else(|_| Value::from(value));
                map.insert(key.replace('-', "_"), value);
            }
            if let Some(cap) = inflight_cap {
                map.insert("admission".into(), json!({"max_inflight_requests": cap}));
            }
            if let (Some(ratio), Some("cache_aware")) =
                (self.cache_threshold, map.get("type").and_then(Value::as_str))
            {
                map.insert("cache_affinity_min_matched_ratio".into(), json!(ratio));
            }
            let policy: PolicyConfig = serde_json::from_value(Value::Object(map))
                .map_err(|err| format!("quick-start policy: {err}"))?;
            Ok(GroupConfig { worker_ids: None, policy })
        };
        let mut workers = Vec::new();
        let groups = if self.pd_disaggregation {
            if !self.worker_urls.is_empty() {
                return Err("--worker-urls and --pd-disaggregation exclude each other".into());
            }
            if !self.service_discovery && (self.prefill.is_empty() || self.decode.is_empty()) {
                return Err(
                    "--pd-disaggregation needs at least one --prefill and one --decode, or \
                     --service-discovery"
                        .into(),
                );
            }
            let mut prefill = self.prefill.iter().peekable();
            let mut index = 0;
            while let Some(url) = prefill.next() {
                let bootstrap_port = match prefill.peek().map(|p| p.parse::<u16>()) {
                    Some(Ok(port)) => {
                        prefill.next();
                        Some(port)
                    }
                    // sglang-router's spelling of "no bootstrap port given".
                    _ if prefill.peek().is_some_and(|p| p.eq_ignore_ascii_case("none")) => {
                        prefill.next();
                        None
                    }
                    _ => None,
                };
                index += 1;
                workers.push(spec(format!("prefill-{index}"), url, Stage::Prefill, bootstrap_port));
            }
            for (i, url) in self.decode.iter().enumerate() {
                workers.push(spec(format!("decode-{}", i + 1), url, Stage::Decode, None));
            }
            GroupsConfig {
                plain: None,
                pd: Some(PdGroupsConfig {
                    prefill: match &self.prefill_policy {
                        Some(name) => group(Some(name))?,
                        None => group(self.policy.as_deref())?,
                    },
                    decode: match &self.decode_policy {
                        Some(name) => group(Some(name))?,
                        None => group(self.policy.as_deref())?,
                    },
                    // Quick-start engines are bare URLs: no labels to pair on.
                    pair_on: Vec::new(),
                }),
            }
        } else {
            for (i, url) in self.worker_urls.iter().enumerate() {
                workers.push(spec(format!("worker-{}", i + 1), url, Stage::Plain, None));
            }
            GroupsConfig { plain: Some(group(self.policy.as_deref())?), pd: None }
        };
        if self.dp_aware {
            // dp_size is learned from the engines before serving (`learn_dp_sizes`).
            for worker in &mut workers {
                worker.dp_route = Some(DpRoute::Body);
            }
        }
        if let Some(size) = self.intra_node_data_parallel_size.filter(|&size| size > 1) {
            for worker in &mut workers {
                worker.dp_size = size;
                worker.dp_route = Some(DpRoute::Header);
            }
        }
        self.static_kv_events(&mut workers)?;
        let mut affinity = super::file::AffinitySection::default();
        if let Some(header) = self.routing_key_headers.first() {
            affinity.routing_key_header = header.to_ascii_lowercase();
        }
        affinity.sticky_idle_timeout_secs =
            self.max_idle_secs.or(affinity.sticky_idle_timeout_secs);
        let engine = match self.backend.as_deref() {
            None => None,
            Some("sglang") => Some(router_workers::EngineKind::Sglang),
            Some("vllm") => Some(router_workers::EngineKind::Vllm),
            Some(other) => {
                return Err(format!(
                    "--backend {other}: the router speaks to SGLang and vLLM engines over HTTP \
                     (--backend sglang or vllm)"
                ));
            }
        };
        let tokenizer = match (&self.tokenizer, &self.model_path) {
            (Some(_), Some(_)) => {
                return Err("--tokenizer and --model-path (--tokenizer-path) both name the \
                            tokenizer: give one"
                    .into());
            }
            (Some(file), None) => Some(file.clone()),
            (None, Some(path)) => Some(local_tokenizer(path)?),
            (None, None) => None,
        };
        let mut config = ConfigFile::default();
        config.models.push(ModelConfig {
            id: self.model.clone().unwrap_or_else(|| super::ANY_MODEL.to_owned()),
            tokenizer,
            chat_template: self.chat_template.clone(),
            engine,
            affinity,
            ttft_slo: Default::default(),
            tps_slo: Default::default(),
            workers,
            buckets: vec![BucketConfig::default_for(groups)],
        });
        Ok(config)
    }
}

impl ServeArgs {
    /// `--kv-event-source URL=ENDPOINT` (and its replay and block size): the KV events of the
    /// quick-start engine at URL, as vllm-router's static event sources give them.
    fn static_kv_events(&self, workers: &mut [WorkerSpec]) -> Result<(), String> {
        let pairs = |flag: &str, values: &[String]| -> Result<Vec<(String, String)>, String> {
            values
                .iter()
                .map(|value| match value.split_once('=') {
                    Some((url, endpoint)) if !endpoint.contains(',') => {
                        Ok((url.trim_end_matches('/').to_owned(), endpoint.to_owned()))
                    }
                    Some(_) => Err(format!(
                        "{flag} {value}: one endpoint per engine (data-parallel rank r \
                         publishes at its port + r)"
                    )),
                    None => Err(format!("{flag} {value}: expected URL=ENDPOINT")),
                })
                .collect()
        };
        let sources = pairs("--kv-event-source", &self.kv_event_source)?;
        let replays = pairs("--kv-event-replay-source", &self.kv_event_replay_source)?;
        if sources.is_empty() && self.kv_event_block_size.is_some() {
            return Err("--kv-event-block-size needs --kv-event-source".into());
        }
        fn worker_of<'w>(
            workers: &'w mut [WorkerSpec],
            flag: &str,
            url: &str,
        ) -> Result<&'w mut WorkerSpec, String> {
            let found = workers.iter_mut().find(|w| w.url.trim_end_matches('/') == url);
            found.ok_or_else(|| format!("{flag} {url}=...: no quick-start engine has that URL"))
        }
        for (url, endpoint) in sources {
            let worker = worker_of(workers, "--kv-event-source", &url)?;
            worker.kv_events = Some(router_workers::KvEventsSpec {
                block_size: self.kv_event_block_size,
                ..router_workers::KvEventsSpec::new(endpoint)
            });
        }
        for (url, endpoint) in replays {
            let worker = worker_of(workers, "--kv-event-replay-source", &url)?;
            let Some(kv) = worker.kv_events.as_mut() else {
                return Err(format!(
                    "--kv-event-replay-source {url}=...: the engine has no --kv-event-source"
                ));
            };
            kv.replay_endpoint = Some(endpoint);
        }
        Ok(())
    }
}

/// The `tokenizer.json` that `--model-path` names: the file, or the one in the directory.
fn local_tokenizer(path: &std::path::Path) -> Result<PathBuf, String> {
    let file = if path.is_dir() { path.join("tokenizer.json") } else { path.to_path_buf() };
    if file.is_file() {
        Ok(file)
    } else {
        Err(format!(
            "--model-path {}: no tokenizer.json there; the router downloads nothing: give a \
             local tokenizer.json or its directory",
            path.display()
        ))
    }
}

fn spec(id: String, url: &str, role: Stage, bootstrap_port: Option<u16>) -> WorkerSpec {
    WorkerSpec { bootstrap_port, ..WorkerSpec::new(id, url, role) }
}
