//! The table of [`super`]: every flag of the three incumbents, with the routers that have it
//! (`S` sglang-router, `M` smg, `V` vllm-router), the values it takes and what this router does
//! with it. Reasons several flags share are named once.

use super::{IncumbentFlag, SGLANG_ROUTER as S, SMG as M, Treatment, VLLM_ROUTER as V, Values};

const AUTH_IDP: &str = "clients authenticate with the keys of `server.api_keys` \
    (`--api-key`), the admin API with `server.admin_token` (`--admin-token`); there is no OIDC, \
    JWT or tenant layer: put an authenticating proxy in front";

const DISCOVERY_FILE: &str = "engines are listed in a configuration file (`models[].workers`) \
    or discovered as Kubernetes pods (`--service-discovery`)";

const EPD: &str = "encode/prefill/decode disaggregation is not implemented: serve multimodal \
    engines as plain `--worker-urls`, or prefill/decode pairs with `--pd-disaggregation`";

const IGW: &str = "serving several models needs no mode: a configuration file lists \
    `models[]`, and discovery reads each pod's model from `discovery.model_label`";

const LEAST_LOAD: &str = "it tunes smg's `least_load`; here `least_load` is `load_based`, \
    which reads the engines' reported load";

const MESH: &str = "replicas share no state over a mesh: run several replicas behind one \
    Service; each learns the engines' caches from their KV events, and sessions agree by \
    rendezvous hashing (docs/configuration.md, Several router replicas)";

const MM: &str = "media is passed through to the engines, which fetch and preprocess it; the \
    router fetches nothing";

const NO_EFFECT_LOAD: &str = "the router polls engines' load only where a policy reads it, at \
    `load.report_interval_ms`";

const OVERLOAD: &str = "engines are left out by group admission in a configuration file \
    (`policy.admission`: `max_running_requests`, `max_waiting_requests`, `max_kv_tokens`) and \
    by their breakers, not by a global overload rule";

const PARSER: &str = "the router passes answers through as the engines produce them: launch \
    the engines with their own `--reasoning-parser` / `--tool-call-parser`";

const PD_VLLM: &str = "prefill/decode pairs speak SGLang's bootstrap protocol only; vLLM's \
    KV-transfer handshake is not implemented: serve vLLM engines as plain `--worker-urls`";

const PREFIX_HASH: &str = "it tunes smg's `prefix_hash`, which is refused here (see \
    `--policy`)";

const PRIORITY: &str = "requests are ordered by SLO (`x-sgl-ttft-slo-ms`, buckets in a \
    configuration file), not by priority classes";

const RL: &str = "there is no RL control plane: send engine control calls to the engines \
    themselves";

const SMG_CACHE: &str = "it tunes smg's cache-aware internals; this router's `cache_aware` \
    and `predicted_ttft` are tuned with `--policy-arg KEY=VALUE` (docs/configuration.md, \
    policy)";

const STARTUP: &str = "the router does not wait for engines at startup: each is picked once \
    healthy, and health probes (`--health-check-interval-secs`) bring late ones in";

const STORAGE: &str = "the router keeps no conversation or response store: the engines serve \
    stateful APIs (`/v1/responses` is forwarded to them) and hold what they store";

const TOKCACHE: &str = "the router tokenizes only to match cached prefixes and keeps no \
    tokenizer cache to size";

const VLLM_KV: &str = "it tunes vllm-router's `kv_aware`, which is `cache_aware` here, tuned \
    with `--policy-arg KEY=VALUE`";

const WASM: &str = "there are no WebAssembly plugins: put request middleware in a proxy in \
    front (Envoy, with `router-server epp` as its endpoint picker)";

const WORKER_STALE: &str = "a stale load report reads as missing after `load.stale_after_ms`, \
    and a silent engine is cut by `server.engine_idle_timeout_secs`";

/// `"--name" ROUTERS VALUES Treatment(reason);` rows, kept one flag to a row or two.
macro_rules! flags {
    ($($name:literal $($router:ident)|+, $values:ident, $treatment:ident($why:expr);)*) => {
        &[$(IncumbentFlag {
            name: $name,
            routers: 0 $(| $router)+,
            values: Values::$values,
            treatment: Treatment::$treatment($why),
        },)*]
    };
}

/// Every flag, in name order.
#[rustfmt::skip]
pub(crate) static FLAGS: &[IncumbentFlag] = flags! {
    "-V" S | M, None, Honoured("this router's version");
    "--api-key" S | M | V, One, Honoured("`server.api_keys: [KEY]`, and `server.engine_api_key` \
        unless the file sets it");
    "--assignment-mode" S | M, One, Refused("new routing keys are placed by the `sticky` \
        policy's `new_binding` (`fallback`, or `rendezvous` for replicas that agree without \
        sharing state): `--policy-arg new_binding=rendezvous`");
    "--backend" S | M, One, Honoured("`sglang` or `vllm`: `models[].engine` (the chat rules the \
        router renders by); other backends (`openai`, `anthropic`, `tokenspeed`) are refused: \
        the router speaks to SGLang and vLLM engines");
    "--balance-abs-threshold" S | M | V, One, Refused("`cache_aware`'s pressure guard compares \
        the engines' waiting tokens (or queue time), not request counts: `--policy-arg \
        pressure_abs_threshold_tokens=N` (or `pressure_abs_threshold_ms=MS`), or `power_of_two` \
        / `load_based`");
    "--balance-rel-threshold" S | M | V, One, Refused("`cache_aware`'s pressure guard compares \
        the engines' waiting tokens (or queue time), not request counts: `--policy-arg \
        pressure_rel_threshold=R`, or `power_of_two` / `load_based`");
    "--balance-token-usage-threshold" M, One, Ignored(SMG_CACHE);
    "--block-size" M, One, Ignored("block sizes come from each engine's KV events or its \
        advertised `page_size`; an engine without either is matched on 16-token blocks of the \
        router's own dispatches (approximate mode)");
    "--bucket-adjust-interval-secs" S | M, One, Ignored("there is no `bucket` policy to adjust: \
        length classes are `models[].buckets[]` with fixed limits in a configuration file");
    "--ca-cert-paths" S | M, Many, Honoured("`server.engine_ca_file` (one PEM bundle: \
        concatenate several files into one)");
    "--cache-boundaries" M, One, Ignored(SMG_CACHE);
    "--cache-index" M, One, Ignored(SMG_CACHE);
    "--cache-match-threshold" M, One, Honoured("as `--cache-threshold`");
    "--cache-threshold" S | M | V, One, Honoured("`cache_affinity_min_matched_ratio` of the \
        quick start's `cache_aware` group (a hit needs that share of the prompt cached)");
    "--cache-ttl-secs" M, One, Honoured("`kv.approximate_ttl_secs`: how long a dispatch counts \
        as cached on an engine without KV events");
    "--cb-failure-threshold" S | M | V, One, Honoured("`health.breaker_failures` (consecutive \
        failures)");
    "--cb-success-threshold" S | M | V, One, Honoured("`health.breaker_successes`");
    "--cb-timeout-duration-secs" S | M | V, One, Honoured("`health.breaker_open_secs`");
    "--cb-window-duration-secs" S | M | V, One, Refused("the breaker counts consecutive \
        failures, not failures within a window: `--cb-failure-threshold` \
        (`health.breaker_failures`)");
    "--chat-template" S | M, One, Honoured("`models[].chat_template` of the quick start's model \
        (needs `--tokenizer`)");
    "--client-cert-path" S | M, One, Refused("the router presents no client certificate to \
        engines: reach `https://` engines with `server.engine_ca_file`, or terminate mutual TLS \
        in a sidecar");
    "--client-key-path" S | M, One, Refused("the router presents no client certificate to \
        engines: reach `https://` engines with `server.engine_ca_file`, or terminate mutual TLS \
        in a sidecar");
    "--control-plane-api-keys" S | M, Many, Refused(AUTH_IDP);
    "--control-plane-audit-enabled" S | M, None, Refused("admin calls are logged with the \
        request id, not audited apart: the admin API is guarded by `server.admin_token`");
    "--cors-allowed-origins" S | M | V, Many, Honoured("`server.cors_allowed_origins`");
    "--decode" S | M | V, One, Honoured("a decode engine of the quick start's prefill/decode \
        bucket");
    "--decode-policy" S | M | V, One, Honoured("the decode group's policy (names as for \
        `--policy`)");
    "--decode-selector" S | M | V, Many, Honoured("`discovery.decode_selector`");
    "--disable-circuit-breaker" S | M | V, None, Honoured("`health.breaker_failures: 0`");
    "--disable-health-check" S | M, None, Ignored("the router does not wait for engines at \
        startup, and its runtime probes (`health.*`) are what take a dead engine out: they stay \
        on");
    "--disable-load-monitoring" M, None, Ignored(NO_EFFECT_LOAD);
    "--disable-retries" S | M | V, None, Honoured("`server.retry.max_retries: 0`");
    "--disable-tokenizer-autoload" M, None, Ignored("the router loads no tokenizer unless given \
        one (`--tokenizer`, `models[].tokenizer`)");
    "--disable-worker-overload-protection" M, None, Ignored(OVERLOAD);
    "--discovery-check-interval-secs" M, One, Refused(DISCOVERY_FILE);
    "--discovery-file" M, One, Refused(DISCOVERY_FILE);
    "--discovery-provider" M, One, Refused("Kubernetes discovery is `--service-discovery` (or \
        `discovery` in a configuration file); a file of workers is a configuration file's \
        `models[].workers`");
    "--dp-aware" S | M, None, Honoured("`models[].workers[].dp_route: body` with each engine's \
        `dp_size` read from its `/get_server_info` at startup");
    "--dp-minimum-tokens-scheduler" M, None, Ignored("with `--dp-aware` the router already sends \
        each request to the data-parallel rank with the least work (its own in-flight tokens \
        and the rank's reported load)");
    "--enable-igw" S | M | V, None, Refused(IGW);
    "--enable-mesh" M, None, Refused(MESH);
    "--enable-program-scheduling" V, None, Refused("there is no program-level scheduling: \
        multi-turn programs keep their cache through `session_aware` (a session header) or \
        `cache_aware`");
    "--enable-rl" M, None, Refused(RL);
    "--enable-trace" S | M, None, Honoured("OpenTelemetry spans: `telemetry.otlp_endpoint` \
        (`--otlp-traces-endpoint`, else `http://localhost:4317`)");
    "--enable-wasm" M, None, Refused(WASM);
    "--encode" M, Many, Refused(EPD);
    "--encode-policy" M, One, Refused(EPD);
    "--encode-selector" M, Many, Refused(EPD);
    "--epd-disaggregation" M, None, Refused(EPD);
    "--eviction-interval-secs" S | M | V, One, Ignored("approximate entries expire after \
        `kv.approximate_ttl_secs` and are held within `kv.approximate_max_blocks` at every \
        insert: there is no periodic eviction to schedule");
    "-h" S | M | V, None, Honoured("this router's help");
    "--header-read-timeout-secs" M, One, Honoured("`server.header_read_timeout_secs`");
    "--health-check-endpoint" S | M | V, One, Honoured("`health.endpoint`");
    "--health-check-interval-secs" S | M | V, One, Honoured("`health.interval_secs`");
    "--health-check-port" M, One, Refused("the probes (`/health`, `/readiness`) are served on \
        the router's own port (`--port`), `/metrics` also on `--prometheus-port`: point the \
        probes there");
    "--health-check-timeout-secs" S | M | V, One, Honoured("`health.timeout_secs`");
    "--health-failure-threshold" S | M | V, One, Honoured("`health.unhealthy_after`");
    "--health-success-threshold" S | M | V, One, Honoured("`health.healthy_after`");
    "--help" S | M | V, None, Honoured("this router's help");
    "--history-backend" S | M, One, Refused(STORAGE);
    "--history-memory-max-items" M, One, Refused(STORAGE);
    "--history-memory-max-responses" M, One, Refused(STORAGE);
    "--history-memory-retention-secs" M, One, Refused(STORAGE);
    "--host" S | M | V, One, Honoured("`server.host`");
    "--idle-connection-timeout-secs" M, One, Ignored("an idle keep-alive connection is closed by \
        `server.header_read_timeout_secs` (`--header-read-timeout-secs`), which bounds every \
        wait for a request head");
    "--intra-node-data-parallel-size" V, One, Honoured("`models[].workers[].dp_size: N` with \
        `dp_route: header` (vLLM's `X-data-parallel-rank`) on every quick-start engine");
    "--jemalloc-prof-dir" M, One, Ignored("the router runs on mimalloc and serves no heap \
        profiles");
    "--job-queue-capacity" M, One, Ignored("workers added through the admin API are registered \
        at once; there is no job queue to size");
    "--job-queue-concurrency" M, One, Ignored("workers added through the admin API are \
        registered at once; there is no job queue to size");
    "--jwt-audience" S | M, One, Refused(AUTH_IDP);
    "--jwt-issuer" S | M, One, Refused(AUTH_IDP);
    "--jwt-jwks-uri" S | M, One, Refused(AUTH_IDP);
    "--jwt-role-mapping" S | M, Many, Refused(AUTH_IDP);
    "--kv-aware-session-affinity-ttl-secs" V, One, Refused("sessions are bound by \
        `session_aware` with a session header, in a configuration file \
        (`affinity.session_id_header`, `affinity.session_idle_timeout_secs`)");
    "--kv-connector" V, One, Refused(PD_VLLM);
    "--kv-connector-annotation" M, One, Refused(PD_VLLM);
    "--kv-engine-id-annotation" M, One, Refused(PD_VLLM);
    "--kv-event-block-size" V, One, Honoured("`kv_events.block_size` of the engines given \
        `--kv-event-source`");
    "--kv-event-model" V, One, Ignored("the quick start serves one model (`--model`), whose \
        engines' events these are");
    "--kv-event-replay-source" V, One, Honoured("`URL=ENDPOINT`: `kv_events.replay_endpoint` of \
        the quick-start engine at URL");
    "--kv-event-source" V, One, Honoured("`URL=ENDPOINT`: `kv_events.endpoint` of the \
        quick-start engine at URL (ranks publish at ENDPOINT's port + rank)");
    "--kv-index" M, One, Ignored(SMG_CACHE);
    "--kv-penalty-disk" V, One, Ignored(VLLM_KV);
    "--kv-penalty-external" V, One, Ignored(VLLM_KV);
    "--kv-penalty-host" V, One, Ignored(VLLM_KV);
    "--least-load-default-throughput" M, One, Ignored(LEAST_LOAD);
    "--least-load-kv-pressure-weight" M, One, Ignored(LEAST_LOAD);
    "--least-load-max-waiting-requests" M, One, Ignored(LEAST_LOAD);
    "--least-load-mean-prefill-tokens" M, One, Ignored(LEAST_LOAD);
    "--load-monitor-interval" M, One, Honoured("`load.report_interval_ms` (seconds times 1000)");
    "--log-dir" S | M | V, One, Honoured("`server.log_dir`");
    "--log-json" M, None, Honoured("`server.log_json`");
    "--log-level" S | M | V, One, Honoured("`server.log_level` (`warning` is `warn`, `critical` \
        is `error`)");
    "--log-mm-timing" M, None, Ignored(MM);
    "--max-background-responses" M, One, Refused(STORAGE);
    "--max-buffered-request-bytes" M, One, Ignored("every request body is read whole before \
        routing, within `server.max_body_bytes` (`--max-payload-size`) and \
        `server.max_inflight_body_bytes`");
    "--max-concurrent-requests" S | M | V, One, Honoured("`server.max_concurrent_requests` \
        (`-1`: no bound)");
    "--max-idle-secs" S | M, One, Honoured("`affinity.sticky_idle_timeout_secs` of the quick \
        start's model: routing-key bindings unused this long expire");
    "--max-payload-size" S | M | V, One, Honoured("`server.max_body_bytes`");
    "--max-tree-size" S | M | V, One, Honoured("`kv.approximate_max_blocks`: the size counted in \
        tokens, 16 to a block");
    "--mcp-config-path" S | M, One, Refused("the router runs no MCP tools: agents call their \
        tools themselves");
    "--mesh-advertise-host" M, One, Refused(MESH);
    "--mesh-host" M, One, Refused(MESH);
    "--mesh-peer-urls" M, Many, Refused(MESH);
    "--mesh-port" M, One, Refused(MESH);
    "--mesh-server-name" M, One, Refused(MESH);
    "--mesh-tls-ca-cert" M, One, Refused(MESH);
    "--mesh-tls-cert" M, One, Refused(MESH);
    "--mesh-tls-key" M, One, Refused(MESH);
    "--mini-lb" S | V, None, Refused("the mini load balancer is sglang's test harness for \
        prefill/decode: `--pd-disaggregation` with `--prefill` and `--decode` is the real thing");
    "--mm-allow-private-media-hosts" M, None, Ignored(MM);
    "--mm-allowed-media-domains" M, One, Ignored(MM);
    "--mm-per-request-image-limit" M, One, Ignored(MM);
    "--mm-pixel-cache-mb" M, One, Ignored(MM);
    "--mm-pixel-rdma" M, None, Ignored(MM);
    "--mm-processing" M, One, Ignored(MM);
    "--model" M, One, Honoured("the model name the quick start serves (`models[].id`; default \
        `*`, any name)");
    "--model-alias" M, One, Refused("a model answers to one name: serve it under the name \
        clients send (`--model NAME`, or `models[].id`)");
    "--model-id-from" M, One, Refused("discovered pods name their model by the label of \
        `discovery.model_label`, in a configuration file");
    "--model-path" S | M, One, Honoured("`models[].tokenizer`: the `tokenizer.json` in that \
        local directory (the router downloads nothing)");
    "--multimodal-max-inflight-bytes" M, One, Ignored(MM);
    "--multimodal-shm-min-bytes" M, One, Ignored(MM);
    "--multimodal-tensor-transport" M, One, Ignored(MM);
    "--no-remove-unhealthy-workers" M, None, Ignored("unhealthy engines are never removed: they \
        leave selection while their probes fail and come back when they pass");
    "--no-worker-auto-recovery" M, None, Ignored("unhealthy engines are never removed: they \
        leave selection while their probes fail and come back when they pass");
    "--oracle-connect-descriptor" S | M, One, Refused(STORAGE);
    "--oracle-external-auth" M, None, Refused(STORAGE);
    "--oracle-password" S | M, One, Refused(STORAGE);
    "--oracle-pool-max" S | M, One, Refused(STORAGE);
    "--oracle-pool-min" S | M, One, Refused(STORAGE);
    "--oracle-pool-timeout-secs" S | M, One, Refused(STORAGE);
    "--oracle-tns-alias" S | M, One, Refused(STORAGE);
    "--oracle-username" S | M, One, Refused(STORAGE);
    "--oracle-wallet-path" S | M, One, Refused(STORAGE);
    "--otlp-traces-endpoint" S | M, One, Honoured("`telemetry.otlp_endpoint` (`HOST:PORT` is \
        `http://HOST:PORT`)");
    "--overlap-decay" M, One, Ignored(SMG_CACHE);
    "--overload-token-usage-threshold" M, One, Ignored(OVERLOAD);
    "--parser" M, One, Ignored(PARSER);
    "--pd-admission-wait-secs" M, One, Ignored("a prefill/decode pair is admitted by its groups' \
        `policy.admission` in a configuration file; a request waits only in the router's queue \
        (`--queue-timeout-secs`)");
    "--pd-disaggregation" S | M, None, Honoured("a prefill/decode bucket of `--prefill` and \
        `--decode` engines");
    "--pd-kv-events" V, One, Refused("static KV-event sources of prefill engines are `kv_events` \
        of those workers in a configuration file (vLLM prefill/decode pairs are not supported)");
    "--policy" S | M | V, One, Honoured("the quick start's group policy: `round_robin`, \
        `random`, `power_of_two`, `cache_aware` as named; `least_load` is `load_based`; \
        `kv_aware` is `cache_aware`; `consistent_hash`, `consistent_hashing` and `manual` are \
        `sticky` (key from `x-routing-key`); `passthrough` is `round_robin`; `prefix_hash`, \
        `bucket`, `rendezvous_hash` and `sticky_least_loaded` are refused with their \
        replacement");
    "--port" S | M | V, One, Honoured("`server.port`");
    "--postgres-db-url" S | M, One, Refused(STORAGE);
    "--postgres-op-timeout-secs" M, One, Refused(STORAGE);
    "--postgres-pool-max" S | M, One, Refused(STORAGE);
    "--power-of-two-load-metric" M, One, Ignored("`power_of_two` compares the engines' reported \
        waiting work (or the router's in-flight count where no report is fresh)");
    "--prefill" S | M | V, Many, Honoured("`URL [BOOTSTRAP_PORT|none]`: a prefill engine of the \
        quick start's prefill/decode bucket");
    "--prefill-max-inflight-requests-per-worker" M, One, Ignored(OVERLOAD);
    "--prefill-policy" S | M | V, One, Honoured("the prefill group's policy (names as for \
        `--policy`)");
    "--prefill-queue-size" M, One, Ignored("requests wait in one queue, before routing: \
        `--queue-size`");
    "--prefill-queue-timeout-secs" M, One, Ignored("requests wait in one queue, before routing: \
        `--queue-timeout-secs`");
    "--prefill-selector" S | M | V, Many, Honoured("`discovery.prefill_selector`");
    "--prefix-hash-balance-abs-threshold" M, One, Ignored(PREFIX_HASH);
    "--prefix-hash-load-factor" M, One, Ignored(PREFIX_HASH);
    "--prefix-token-count" M, One, Ignored(PREFIX_HASH);
    "--priority-scheduler-config" M, One, Refused(PRIORITY);
    "--priority-scheduler-default-max-class" M, One, Refused(PRIORITY);
    "--priority-scheduler-enabled" M, None, Refused(PRIORITY);
    "--priority-scheduler-tenant-metric-top-n" M, One, Refused(PRIORITY);
    "--program-scheduling-config-json" V, One, Refused("there is no program-level scheduling: \
        multi-turn programs keep their cache through `session_aware` (a session header) or \
        `cache_aware`");
    "--prometheus-duration-buckets" S | M, Many, Ignored("the router's histograms have fixed \
        buckets (docs/metrics.md)");
    "--prometheus-host" S | M | V, One, Honoured("`server.metrics_host` (alone: port 29000)");
    "--prometheus-port" S | M | V, One, Honoured("`server.metrics_port`: a separate listener \
        serving `/metrics`");
    "--queue-size" S | M | V, One, Honoured("`server.queue_size`");
    "--queue-timeout-secs" S | M | V, One, Honoured("`server.queue_timeout_secs`");
    "--rate-limit-tokens-per-second" S | M | V, One, Refused("sglang-router's is one bucket \
        shared by every client, sized by its concurrency limit; this router bounds concurrency \
        with `--max-concurrent-requests` and limits each client key's requests and tokens per \
        second in a configuration file (`server.rate_limit`)");
    "--rdma-listen-ip" M, One, Ignored(MM);
    "--rdma-slot-ttl-s" M, One, Ignored(MM);
    "--reasoning-parser" S | M, One, Ignored(PARSER);
    "--redis-op-timeout-secs" M, One, Refused(STORAGE);
    "--redis-pool-max" S | M, One, Refused(STORAGE);
    "--redis-retention-days" S | M, One, Refused(STORAGE);
    "--redis-url" S | M, One, Refused(STORAGE);
    "--remove-unhealthy-workers" M, None, Ignored("unhealthy engines are never removed: they \
        leave selection while their probes fail and come back when they pass");
    "--request-id-headers" S | M | V, Many, Honoured("`server.request_id_headers` (lowercased)");
    "--request-timeout-secs" S | M | V, One, Honoured("`server.request_timeout_secs`: waiting \
        for an engine's response head");
    "--retry-backoff-multiplier" S | M | V, One, Honoured("`server.retry.backoff_multiplier`");
    "--retry-initial-backoff-ms" S | M | V, One, Honoured("`server.retry.backoff_ms`");
    "--retry-jitter-factor" S | M | V, One, Honoured("`server.retry.jitter_factor`");
    "--retry-max-backoff-ms" S | M | V, One, Honoured("`server.retry.max_backoff_ms`");
    "--retry-max-retries" S | M | V, One, Honoured("`server.retry.max_retries: N-1` \
        (sglang-router counts the first attempt)");
    "--rl-control-timeout-secs" M, One, Refused(RL);
    "--rl-fanout-concurrency" M, One, Refused(RL);
    "--router-selector" M, Many, Refused(MESH);
    "--router-temperature" V, One, Ignored(VLLM_KV);
    "--routing-key-headers" M, Many, Honoured("`affinity.routing_key_header` of the quick \
        start's model: the first header named (one header is read)");
    "--routing-key-override" M, None, Refused("sticky routing is a policy here, not an override \
        of every policy: `--policy consistent_hash` (`sticky`, keyed by `x-routing-key`), or \
        `session_aware` with a session header in a configuration file");
    "--schema-config" M, One, Refused(STORAGE);
    "--selection-accounting-ttl-ms" M, One, Honoured("`kv.predicted_ttl_ms`: how long a dispatch \
        counts as cached before the engine's KV events confirm it");
    "--selection-policy" M, One, Ignored(SMG_CACHE);
    "--selection-temperature" M, One, Ignored(SMG_CACHE);
    "--selector" S | M | V, Many, Honoured("`discovery.selector`");
    "--service-discovery" S | M | V, None, Honoured("`discovery` (Kubernetes pods)");
    "--service-discovery-namespace" S | M | V, One, Honoured("`discovery.namespace`");
    "--service-discovery-port" S | M | V, One, Honoured("`discovery.port`");
    "--shutdown-grace-period-secs" S | M, One, Honoured("`server.shutdown_drain_secs`");
    "--spill-abs-threshold" M, One, Refused("`cache_aware`'s pressure guard compares the \
        engines' waiting tokens (or queue time), not request counts: `--policy-arg \
        pressure_abs_threshold_tokens=N` (or `pressure_abs_threshold_ms=MS`), or `power_of_two` \
        / `load_based`");
    "--spill-rel-threshold" M, One, Refused("`cache_aware`'s pressure guard compares the \
        engines' waiting tokens (or queue time), not request counts: `--policy-arg \
        pressure_rel_threshold=R`, or `power_of_two` / `load_based`");
    "--sse-keepalive-secs" M, One, Ignored("streams are passed through as the engines send them; \
        the router adds no keep-alive frames (a silent engine is cut by \
        `server.engine_idle_timeout_secs`)");
    "--sticky-key-idle-secs" M, One, Honoured("as `--max-idle-secs`");
    "--sticky-sessions" M, None, Refused("sticky routing is a policy here, not an override of \
        every policy: `--policy consistent_hash` (`sticky`, keyed by `x-routing-key`), or \
        `session_aware` with a session header in a configuration file");
    "--storage-context-headers" M, Many, Refused(STORAGE);
    "--storage-hook-wasm-path" M, One, Refused(WASM);
    "--stream-body-stall-timeout-secs" M, One, Ignored("a client's body must arrive within \
        `server.body_read_timeout_secs`, and a stalled reader is cut by \
        `server.client_write_timeout_secs`");
    "--tenant-api-key" M, One, Refused(AUTH_IDP);
    "--tenant-header-name" M, One, Refused(AUTH_IDP);
    "--tenant-rate-limit-config" M, One, Refused("rate limits are per client key, in a \
        configuration file (`server.rate_limit`)");
    "--tenant-rate-limit-enabled" M, None, Refused("rate limits are per client key, in a \
        configuration file (`server.rate_limit`)");
    "--tls-cert-path" S | M, One, Refused("the router serves plain HTTP: terminate TLS in front \
        of it (an ingress, Envoy, a sidecar)");
    "--tls-key-path" S | M, One, Refused("the router serves plain HTTP: terminate TLS in front \
        of it (an ingress, Envoy, a sidecar)");
    "--tokenizer-cache-enable-l0" S | M, None, Ignored(TOKCACHE);
    "--tokenizer-cache-enable-l1" S | M, None, Ignored(TOKCACHE);
    "--tokenizer-cache-l0-max-entries" S | M, One, Ignored(TOKCACHE);
    "--tokenizer-cache-l0-max-memory" M, One, Ignored(TOKCACHE);
    "--tokenizer-cache-l1-max-memory" S | M, One, Ignored(TOKCACHE);
    "--tokenizer-path" S | M, One, Honoured("`models[].tokenizer`: that `tokenizer.json`, or the \
        one in that directory");
    "--tool-call-parser" S | M, One, Ignored(PARSER);
    "--trust-tenant-header" M, None, Refused(AUTH_IDP);
    "--upstream-http2" M, None, Honoured("`server.upstream_http2`");
    "--upstream-pool-idle-timeout-secs" M, One, Ignored("pooled engine connections are kept \
        while the engine keeps them; a request on a connection the engine closed is retried on \
        a new one");
    "--version" S | M, None, Honoured("this router's version");
    "--version-verbose" S | M, None, Honoured("as `--version`");
    "--vllm-discovery-address" V, One, Refused(PD_VLLM);
    "--vllm-pd-disaggregation" V, None, Refused(PD_VLLM);
    "--wasm-middleware" V, One, Refused(WASM);
    "--wasm-middleware-route" V, One, Refused(WASM);
    "--wasm-middleware-sha256" V, One, Refused(WASM);
    "--worker-auto-recovery" M, None, Ignored("unhealthy engines are never removed: they leave \
        selection while their probes fail and come back when they pass");
    "--worker-overload-protection" M, None, Ignored(OVERLOAD);
    "--worker-overload-shed" M, None, Ignored(OVERLOAD);
    "--worker-overload-token-usage" M, One, Ignored(OVERLOAD);
    "--worker-overload-waiting-requests" M, One, Ignored(OVERLOAD);
    "--worker-stale-secs" M, One, Ignored(WORKER_STALE);
    "--worker-stall-secs" M, One, Ignored(WORKER_STALE);
    "--worker-startup-check-interval" S | M | V, One, Ignored(STARTUP);
    "--worker-startup-delay" M, One, Ignored(STARTUP);
    "--worker-startup-timeout-secs" S | M | V, One, Ignored(STARTUP);
    "--worker-urls" S | M | V, Many, Honoured("the quick start's plain engines");
    "--worker-warmup-blocks" M, One, Ignored(SMG_CACHE);
    "--worker-warmup-divert-every" M, One, Ignored(SMG_CACHE);
    "--worker-warmup-secs" M, One, Ignored(SMG_CACHE);
    "--worker-warmup-share" M, One, Ignored(SMG_CACHE);
    "--worker-warmup-thin-ratio" M, One, Ignored(SMG_CACHE);
    "--worker-wedge-secs" M, One, Ignored(WORKER_STALE);
    "--zmq-engine-count" M, One, Refused("engines are reached over HTTP (`--worker-urls`), not \
        over `ipc://` sockets");
};
