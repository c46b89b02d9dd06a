//! Fuzz target `config`: the configuration file parser and the build that validates it.
//!
//! The input is a configuration file's text (YAML, or JSON as YAML), given to
//! `ConfigFile::parse`; what parses is built as `check-config` does (`build_models`,
//! `build_discovery`) with fresh state, unless it names a file to read (a tokenizer, a chat
//! template, a CA file), so that a run never reads what the input points at. Beyond "never
//! panics": errors have a message and every problem a path; a build that succeeds has one
//! runtime per configured model, in order, and registers only workers of configured models.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use router_config::{ConfigFile, build_discovery, build_models, keeps_local_index};
use router_policies::{LoadHandles, PolicyHandles};
use router_state_load::{EngineReportedLoadTable, Inflight, ManualClock, TableConfig};
use router_workers::WorkerRegistry;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let config = match ConfigFile::parse(text) {
        Ok(config) => config,
        Err(message) => {
            assert!(!message.is_empty(), "a parse error without a message");
            return;
        }
    };
    let _ = keeps_local_index(&config);
    let index = config.kv_index();
    assert!(index.max_nodes_per_model() <= config.kv.max_index_nodes);
    let names_a_file = config.server.engine_ca_file.is_some()
        || config.models.iter().any(|m| m.tokenizer.is_some() || m.chat_template.is_some());
    if names_a_file {
        return;
    }
    if let Err(problems) = build_discovery(&config, None) {
        assert!(!problems.is_empty(), "a failed discovery build without a problem");
        assert!(problems.iter().all(|p| !p.path.is_empty()), "a problem without a path");
    }
    let clock = Arc::new(ManualClock::new());
    let table = Arc::new(EngineReportedLoadTable::new(TableConfig::default(), clock.clone()));
    let handles = PolicyHandles::new(LoadHandles::new(table, Arc::new(Inflight::new(clock))));
    let registry = WorkerRegistry::new();
    match build_models(&config, &registry, &handles, None) {
        Ok(runtimes) => {
            let built: Vec<&str> = runtimes.iter().map(|m| m.id.as_str()).collect();
            let configured: Vec<&str> = config.models.iter().map(|m| m.id.as_str()).collect();
            assert_eq!(built, configured, "runtimes differ from the configured models");
            for worker in registry.workers() {
                assert!(
                    worker.models().iter().all(|m| configured.contains(&m.as_str())),
                    "worker {} serves a model that is not configured",
                    worker.id()
                );
            }
        }
        Err(problems) => {
            assert!(!problems.is_empty(), "a failed build without a problem");
            assert!(problems.iter().all(|p| !p.path.is_empty()), "a problem without a path");
        }
    }
});
