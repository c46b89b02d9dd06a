//! The catalogue of every metric the router exports: its name, kind and `# HELP` text (the
//! meaning column of docs/metrics.md, shortened), and the histogram buckets by metric.

use metrics::{describe_counter, describe_gauge, describe_histogram};

/// Latency buckets in seconds: from sub-millisecond router work to long generations.
pub(super) const LATENCY_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// Buckets of observed minus predicted time to first token, in seconds: 0 is a perfect
/// prediction, negative an overestimate.
pub(super) const ERROR_BUCKETS: &[f64] = &[
    -5.0, -2.0, -1.0, -0.5, -0.25, -0.1, -0.05, -0.025, -0.01, 0.0, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.0, 5.0,
];

/// The one metric measured in [`ERROR_BUCKETS`] (a full name wins over the `_seconds` suffix).
pub(super) const ERROR_METRIC: &str = "router_predicted_ttft_error_seconds";

/// Buckets of observed over predicted time to first token: 1 is a perfect prediction.
pub(super) const RATIO_BUCKETS: &[f64] =
    &[0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0, 8.0];

/// What a metric is, for its `# TYPE` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric the router exports with its kind and its `# HELP` text (the meaning column of
/// docs/metrics.md, shortened), described once at install.
pub(super) const DESCRIPTIONS: &[(&str, Kind, &str)] = &[
    (
        "router_requests_total",
        Kind::Counter,
        "Inference requests answered, by model, bucket and HTTP status.",
    ),
    (
        "router_requests_refused_total",
        Kind::Counter,
        "Requests refused before the inference handler: queue_full, queue_timeout (429) or unauthorized (401).",
    ),
    (
        "router_rate_limited_total",
        Kind::Counter,
        "Requests refused by a client key's rate limit, by key name and limit (requests, tokens).",
    ),
    (
        "router_breaker_state",
        Kind::Gauge,
        "1 for the circuit breaker's current state of an engine (closed, open, half_open), 0 for the one it left.",
    ),
    (
        "router_breaker_transitions_total",
        Kind::Counter,
        "Circuit-breaker transitions, by the state entered.",
    ),
    ("router_queue_depth", Kind::Gauge, "Requests waiting in the admission queue."),
    (
        "router_queue_wait_seconds",
        Kind::Histogram,
        "Time spent in the admission queue, by outcome: admitted or timeout.",
    ),
    (
        "router_request_duration_seconds",
        Kind::Histogram,
        "Time from receiving a request to sending the response head.",
    ),
    (
        "router_selection_seconds",
        Kind::Histogram,
        "Preparation and selection time before dispatch.",
    ),
    (
        "router_upstream_head_seconds",
        Kind::Histogram,
        "Time from receiving a request to the engine's response head.",
    ),
    (
        "router_picks_total",
        Kind::Counter,
        "Engines picked by a policy in a complete selection, by policy, stage and the path taken.",
    ),
    (
        "router_dp_rank_dispatches_total",
        Kind::Counter,
        "Dispatches to a data-parallel rank the router chose, by worker, rank and reason.",
    ),
    (
        "router_predicted_ttft_seconds",
        Kind::Histogram,
        "Streamed requests picked by predicted_ttft: the predicted time to first token.",
    ),
    (
        "router_observed_ttft_seconds",
        Kind::Histogram,
        "Streamed requests picked by predicted_ttft: time from dispatch to the first byte the client received.",
    ),
    (
        "router_predicted_ttft_error_seconds",
        Kind::Histogram,
        "Observed minus predicted time to first token per engine, in seconds: 0 is a perfect prediction.",
    ),
    (
        "router_ttft_observed_over_predicted_ratio",
        Kind::Histogram,
        "Observed over predicted time to first token; 1 is a perfect prediction.",
    ),
    (
        "router_slo_requests_total",
        Kind::Counter,
        "Requests stating an SLO target their model reads, by target (ttft, tps) and whether the serving bucket met it.",
    ),
    (
        "router_admission_rejections_total",
        Kind::Counter,
        "Admission rejections met while selecting, by cap.",
    ),
    (
        "router_bucket_fallbacks_total",
        Kind::Counter,
        "Buckets that could not supply a complete selection, so the next was tried.",
    ),
    (
        "router_kv_events_silent_total",
        Kind::Counter,
        "Times a worker's KV-event subscription heard nothing over many prefill-bearing requests.",
    ),
    (
        "router_prefix_unmatchable_total",
        Kind::Counter,
        "Requests routed without a prefix lookup because they have no exact token ids, by reason (non_text_part, template_error, too_long).",
    ),
    (
        "router_cache_lookups_total",
        Kind::Counter,
        "Prefix lookups of cache_aware and predicted_ttft, by source (local, remote) and outcome.",
    ),
    (
        "router_cache_matched_tokens",
        Kind::Histogram,
        "Longest cached prefix any engine holds for each answered lookup, in tokens.",
    ),
    ("router_engine_inflight", Kind::Gauge, "Router-local in-flight requests per engine."),
    (
        "router_engine_healthy",
        Kind::Gauge,
        "1 when the engine is healthy (probes healthy and circuit not open).",
    ),
    (
        "router_engine_status",
        Kind::Gauge,
        "1 for the status the engine's load reports last stated (unknown, starting, serving, draining), 0 for the others.",
    ),
    ("router_engine_drained", Kind::Gauge, "1 while the operator has drained the engine."),
    ("router_engine_accepting", Kind::Gauge, "1 when the engine is a candidate for new requests."),
    ("router_engine_failures_total", Kind::Counter, "Failed dispatches, by engine and kind."),
    (
        "router_retries_total",
        Kind::Counter,
        "Dispatches retried with a fresh selection, by model and reason.",
    ),
    (
        "router_retry_budget_exhausted_total",
        Kind::Counter,
        "Retries refused because the retry budget was spent.",
    ),
    (
        "router_load_report_state",
        Kind::Gauge,
        "1 for the engine's load-report state (fresh, stale, missing), 0 for the others.",
    ),
    (
        "router_load_report_age_seconds",
        Kind::Gauge,
        "Age of the engine's usable load report, by the router's receipt time.",
    ),
    (
        "router_kv_events",
        Kind::Gauge,
        "KV-event counters per engine: blocks held, gaps, replays, clears, skipped events, last_seq.",
    ),
    ("router_kv_index_nodes", Kind::Gauge, "Radix-tree nodes of the prefix index over all models."),
    ("router_kv_index_bytes", Kind::Gauge, "Approximate heap bytes of the prefix index."),
    (
        "router_segment_cache_entries",
        Kind::Gauge,
        "Prompt pieces whose token ids the model's segment cache holds.",
    ),
    (
        "router_segment_cache_bytes",
        Kind::Gauge,
        "Bytes the model's segment cache holds (prepare.segment_cache_bytes bounds their sum).",
    ),
    (
        "router_segment_cache_lookups_total",
        Kind::Counter,
        "Long prompt pieces looked up in the model's segment cache, by result (hit, miss).",
    ),
    (
        "router_kv_predicted_blocks",
        Kind::Gauge,
        "Unexpired predicted entries (blocks just dispatched, not yet confirmed by the engine).",
    ),
    (
        "router_kv_approximate_blocks",
        Kind::Gauge,
        "Unexpired approximate entries (blocks dispatched to engines without KV events).",
    ),
    (
        "router_epp_streams_total",
        Kind::Counter,
        "Endpoint picker: ext_proc streams opened, by the filter's request body mode.",
    ),
    (
        "router_epp_stream_ends_total",
        Kind::Counter,
        "Endpoint picker: streams ended (closed, reset, abandoned).",
    ),
    ("router_epp_open_streams", Kind::Gauge, "Endpoint picker: streams open now."),
    (
        "router_epp_immediate_responses_total",
        Kind::Counter,
        "Endpoint picker: local replies instead of a pick, by status.",
    ),
    (
        "router_epp_fallback_endpoints",
        Kind::Histogram,
        "Endpoint picker: fallbacks named after each pick.",
    ),
    (
        "router_time_to_first_token_seconds",
        Kind::Histogram,
        "Streams: time from receiving the request to the first data frame passed to the client, by model and engine.",
    ),
    (
        "router_inter_token_latency_seconds",
        Kind::Histogram,
        "Streams: the mean gap between output tokens, one observation per stream, by model and engine.",
    ),
    (
        "router_e2e_latency_seconds",
        Kind::Histogram,
        "Time from receiving the request to the end of its answer, by model and engine.",
    ),
    ("router_prompt_tokens_total", Kind::Counter, "Prompt tokens the engines reported."),
    (
        "router_cached_tokens_total",
        Kind::Counter,
        "Prompt tokens the engines reported served from their prefix cache.",
    ),
    ("router_completion_tokens_total", Kind::Counter, "Generated tokens the engines reported."),
    (
        "router_engine_selections_total",
        Kind::Counter,
        "Times a complete selection chose the engine, by stage.",
    ),
];

/// The `# HELP` text of `name`.
pub(super) fn help(name: &str) -> &'static str {
    DESCRIPTIONS.iter().find(|(n, _, _)| *n == name).map_or("", |(_, _, help)| help)
}

/// Describes every metric to the installed recorder, so each gets its `# HELP` line.
pub(super) fn describe_all() {
    for &(name, kind, help) in DESCRIPTIONS {
        match kind {
            Kind::Counter => describe_counter!(name, help),
            Kind::Gauge => describe_gauge!(name, help),
            Kind::Histogram => describe_histogram!(name, help),
        }
    }
}
