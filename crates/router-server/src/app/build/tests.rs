//! Building the routing objects from a configuration: every problem is reported with the path
//! of the field it is about, and what builds is what the file says.

use std::time::Duration;

use router_config::*;
use router_workers::WorkerId;

use crate::app::AppContext;

fn tokenizer() -> String {
    router_sim::assets::tokenizer_path().display().to_string()
}

/// A one-model configuration: `workers` and `groups` are YAML flow text, `model_extra` more
/// keys of the model (`tokenizer: ...`), `top` more top-level sections.
fn one_model(top: &str, model_extra: &str, workers: &str, groups: &str) -> String {
    format!(
        "{top}\nmodels:\n  - id: m\n    {model_extra}\n    workers: {workers}\n    buckets:\n      \
         - {{id: all, groups: {groups}}}\n"
    )
}

fn build(yaml: &str) -> Result<AppContext, Vec<Problem>> {
    let config = ConfigFile::parse(yaml).unwrap_or_else(|err| panic!("{err}\n{yaml}"));
    AppContext::build(&config)
}

const PLAIN_KV: &str = r#"[{id: a, url: "http://127.0.0.1:1", kv_events: {endpoint: "tcp://127.0.0.1:5557"}}, {id: b, url: "http://127.0.0.1:2"}]"#;
const PLAIN_NO_KV: &str =
    r#"[{id: a, url: "http://127.0.0.1:1"}, {id: b, url: "http://127.0.0.1:2"}]"#;
const PLAIN_BLOCK_SIZE: &str =
    r#"[{id: a, url: "http://127.0.0.1:1", block_size: 32}, {id: b, url: "http://127.0.0.1:2"}]"#;
const INDEXER: &str = r#"kv_indexer_endpoint: "127.0.0.1:50060""#;

/// A named configuration, with the problem it must report (path, message fragment) or none.
type Case = (&'static str, String, Option<(&'static str, &'static str)>);

/// Each configuration with the problem it must report, or none.
#[test]
fn prefix_reading_groups_need_a_tokenizer_and_a_cache_to_see() {
    let tok = format!("tokenizer: \"{}\"", tokenizer());
    let path = "models[0].buckets[0].groups.plain.policy";
    let plain = |policy: &str| format!("{{plain: {{policy: {policy}}}}}");
    let cases: Vec<Case> = vec![
        (
            "KV events without a tokenizer",
            one_model("", "", PLAIN_KV, &plain("{type: cache_aware}")),
            Some((path, "no tokenizer: set models[0].tokenizer")),
        ),
        (
            "predicted_ttft reading KV events without a tokenizer",
            one_model("", "", PLAIN_KV, &plain("{type: predicted_ttft}")),
            Some((path, "predicted_ttft looks up the token ids")),
        ),
        (
            "no KV events and no tokenizer: approximate mode on prompt text",
            one_model("", "", PLAIN_NO_KV, &plain("{type: cache_aware}")),
            None,
        ),
        (
            "no KV events: approximate mode on token ids",
            one_model("", &tok, PLAIN_NO_KV, &plain("{type: predicted_ttft}")),
            None,
        ),
        (
            "a block size alone does not feed the local index",
            one_model("", &tok, PLAIN_BLOCK_SIZE, &plain("{type: cache_aware}")),
            Some((path, "a block size alone feeds nothing")),
        ),
        (
            "one worker of two with KV events is enough",
            one_model("", &tok, PLAIN_KV, &plain("{type: cache_aware}")),
            None,
        ),
        (
            "a group filled through the admin API is not judged",
            one_model("", &tok, "[]", &plain("{type: cache_aware}")),
            None,
        ),
        (
            "a remote indexer without any block size",
            one_model(
                "",
                &tok,
                PLAIN_NO_KV,
                &plain(&format!(
                    "{{type: cache_aware, cache_prefix_provider: indexer, {INDEXER}}}"
                )),
            ),
            Some((path, "give the workers block_size")),
        ),
        (
            "a remote indexer with a block size needs no KV events",
            one_model(
                "",
                &tok,
                PLAIN_BLOCK_SIZE,
                &plain(&format!(
                    "{{type: predicted_ttft, cache_prefix_provider: indexer, {INDEXER}}}"
                )),
            ),
            None,
        ),
        (
            "the events of a worker outside the group do not count",
            format!(
                "models:\n  - id: m\n    {tok}\n    workers:\n      \
                 - {{id: P1, url: \"http://127.0.0.1:1\", role: prefill, block_size: 16}}\n      \
                 - {{id: P2, url: \"http://127.0.0.1:2\", role: prefill, kv_events: {{endpoint: \"tcp://127.0.0.1:5557\"}}}}\n      \
                 - {{id: D1, url: \"http://127.0.0.1:3\", role: decode}}\n    buckets:\n      \
                 - {{id: a, groups: {{pd: {{prefill: {{worker_ids: [P2], policy: {{type: cache_aware}}}}, decode: {{}}}}}}}}\n      \
                 - {{id: b, groups: {{pd: {{prefill: {{worker_ids: [P1], policy: {{type: cache_aware}}}}, decode: {{}}}}}}}}\n"
            ),
            Some(("models[0].buckets[1].groups.pd.prefill.policy", "a block size alone")),
        ),
        (
            "load-only policies need neither",
            one_model("", "", PLAIN_NO_KV, &plain("{type: power_of_two}")),
            None,
        ),
    ];
    for (name, yaml, expect) in cases {
        match (build(&yaml), expect) {
            (Ok(_), None) => {}
            (Err(problems), Some((path, fragment))) => assert!(
                problems.iter().any(|p| p.path == path && p.message.contains(fragment)),
                "{name}: expected {path}: ...{fragment}..., got {problems:?}"
            ),
            (Ok(_), Some(expected)) => panic!("{name}: built, expected {expected:?}"),
            (Err(problems), None) => panic!("{name}: {problems:?}"),
        }
    }
}

#[test]
fn settings_out_of_range_name_their_key() {
    let workers = PLAIN_NO_KV;
    let groups = "{plain: {}}";
    let two_models = format!(
        "kv: {{max_index_nodes: 1}}\nmodels:\n  - {{id: m, workers: [], buckets: [{{id: a, groups: {groups}}}]}}\n  \
         - {{id: n, workers: [], buckets: [{{id: a, groups: {groups}}}]}}\n"
    );
    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "no index nodes",
            one_model("kv: {max_index_nodes: 0}", "", workers, groups),
            "kv.max_index_nodes",
            "0 is below the 1 configured models",
        ),
        ("fewer nodes than models", two_models, "kv.max_index_nodes", "split between"),
        (
            "more nodes per model than a tree can address",
            one_model("kv: {max_index_nodes: 10000000000}", "", workers, groups),
            "kv.max_index_nodes",
            "exceeds 4294967293 nodes per model",
        ),
        (
            "a kv message limit too small for any batch",
            one_model("kv: {max_message_bytes: 100}", "", workers, groups),
            "kv.max_message_bytes",
            "100 is below the minimum of 1024",
        ),
        (
            "fewer kv frames than a replay reply has",
            one_model("kv: {max_frames_per_message: 3}", "", workers, groups),
            "kv.max_frames_per_message",
            "3 is below 4",
        ),
        (
            "a zero session idle timeout",
            one_model("", "affinity: {session_idle_timeout_secs: 0}", workers, groups),
            "models[0].affinity.session_idle_timeout_secs",
            "at least 1",
        ),
        (
            "a zero sticky idle timeout",
            one_model("", "affinity: {sticky_idle_timeout_secs: 0}", workers, groups),
            "models[0].affinity.sticky_idle_timeout_secs",
            "at least 1",
        ),
        (
            "a zero shared idle timeout",
            one_model("", "affinity: {idle_timeout_secs: 0}", workers, groups),
            "models[0].affinity.idle_timeout_secs",
            "at least 1",
        ),
        (
            "an affinity header that is no header name",
            one_model("", "affinity: {session_id_header: \"x session\"}", workers, groups),
            "models[0].affinity.session_id_header",
            "is not a header name",
        ),
        (
            "an empty affinity header",
            one_model("", "affinity: {routing_key_header: \"\"}", workers, groups),
            "models[0].affinity.routing_key_header",
            "is not a header name",
        ),
        (
            "a worker's block size against its events'",
            one_model(
                "",
                "",
                r#"[{id: a, url: "http://127.0.0.1:1", block_size: 32, kv_events: {endpoint: "tcp://127.0.0.1:5557", block_size: 16}}]"#,
                groups,
            ),
            "models[0].workers[0]",
            "block_size 32 differs from kv_events.block_size 16",
        ),
    ];
    for (name, yaml, path, fragment) in cases {
        let problems = build(&yaml).err().unwrap_or_else(|| panic!("{name}: built"));
        assert!(
            problems.iter().any(|p| p.path == path && p.message.contains(fragment)),
            "{name}: expected {path}: ...{fragment}..., got {problems:?}"
        );
    }
}

#[test]
fn session_and_sticky_bindings_expire_on_their_own_timeouts() {
    let idle = |affinity: &str| {
        let yaml = one_model("", affinity, PLAIN_NO_KV, "{plain: {}}");
        let ctx = build(&yaml).expect("builds");
        let model = ctx.models().next().expect("one model");
        (model.sessions.config().idle_timeout, model.routing_keys.config().idle_timeout)
    };
    let secs = Duration::from_secs;
    assert_eq!(idle(""), (secs(600), secs(600)), "both default to idle_timeout_secs");
    assert_eq!(idle("affinity: {idle_timeout_secs: 30}"), (secs(30), secs(30)));
    assert_eq!(
        idle("affinity: {idle_timeout_secs: 30, session_idle_timeout_secs: 3600}"),
        (secs(3600), secs(30))
    );
    assert_eq!(
        idle("affinity: {session_idle_timeout_secs: 3600, sticky_idle_timeout_secs: 86400}"),
        (secs(3600), secs(86400))
    );
}

#[test]
fn only_a_deployment_whose_prefix_lookups_all_go_remote_has_no_local_index() {
    let tok = format!("tokenizer: \"{}\"", tokenizer());
    let remote = format!("{{type: cache_aware, cache_prefix_provider: indexer, {INDEXER}}}");
    for (name, groups, local) in [
        ("load only", "{plain: {policy: {type: power_of_two}}}".to_owned(), true),
        ("local prefix lookups", "{plain: {policy: {type: cache_aware}}}".to_owned(), true),
        ("remote prefix lookups", format!("{{plain: {{policy: {remote}}}}}"), false),
    ] {
        let yaml = one_model("", &tok, PLAIN_KV, &groups);
        let config = ConfigFile::parse(&yaml).expect("parses");
        assert_eq!(keeps_local_index(&config), local, "{name}");
        let ctx = AppContext::build(&config).unwrap_or_else(|p| panic!("{name}: {p:?}"));
        assert_eq!(ctx.kv_index().is_some(), local, "{name}");
    }
    // A remote group beside a local one keeps the local index for the latter.
    let yaml = format!(
        "models:\n  - id: m\n    {tok}\n    workers: {PLAIN_KV}\n    buckets:\n      \
         - {{id: a, limits: {{max: 100}}, groups: {{plain: {{policy: {remote}}}}}}}\n      \
         - {{id: b, groups: {{plain: {{policy: {{type: cache_aware}}}}}}}}\n"
    );
    assert!(keeps_local_index(&ConfigFile::parse(&yaml).expect("parses")));
}

#[test]
fn the_index_bound_is_split_between_the_configured_models() {
    let yaml = "kv: {max_index_nodes: 1000}\nmodels:\n  - {id: m, buckets: [{id: a, groups: {plain: {}}}]}\n  \
                - {id: n, buckets: [{id: a, groups: {plain: {}}}]}\n  \
                - {id: o, buckets: [{id: a, groups: {plain: {}}}]}\n";
    let index = ConfigFile::parse(yaml).expect("parses").kv_index();
    assert_eq!((index.max_nodes, index.models, index.max_nodes_per_model()), (1000, 3, 333));
}

/// A PD model with prefill P1 (rack a) and P2 (rack b), decode D1 (rack a), and one bucket
/// whose `groups.pd` has `pd_extra` keys.
fn pd_model(pd_extra: &str) -> String {
    format!(
        "models:\n  - id: m\n    workers:\n      \
         - {{id: P1, url: \"http://127.0.0.1:1\", role: prefill, labels: {{rack: a}}}}\n      \
         - {{id: P2, url: \"http://127.0.0.1:2\", role: prefill, labels: {{rack: b}}}}\n      \
         - {{id: D1, url: \"http://127.0.0.1:3\", role: decode, labels: {{rack: a}}}}\n    \
         buckets:\n      - {{id: pd, groups: {{pd: {{prefill: {{}}, decode: {{}}{pd_extra}}}}}}}\n"
    )
}

#[test]
fn labels_take_strings_only_and_say_where() {
    for (value, found) in
        [("8", "integer `8`"), ("true", "boolean `true`"), ("~", "unit"), ("[a]", "sequence")]
    {
        let yaml =
            pd_model("").replace("labels: {rack: b}", &format!("labels: {{rack: b, tp: {value}}}"));
        let err = ConfigFile::parse(&yaml).expect_err(value);
        assert!(
            err.starts_with("models[0].workers[1].labels.tp: invalid type: "),
            "{value}: {err}"
        );
        assert!(err.contains(found) && err.contains("expected a string"), "{value}: {err}");
    }
    let quoted = pd_model("").replace("labels: {rack: b}", "labels: {rack: b, tp: \"8\"}");
    let ctx = build(&quoted).expect("builds");
    let p2 = ctx.registry().get(&WorkerId::new("P2").expect("id")).expect("P2");
    assert_eq!((p2.label("rack"), p2.label("tp")), (Some("b"), Some("8")));

    let unnamed = pd_model("").replace("labels: {rack: b}", "labels: {\"\": b}");
    let problems = build(&unnamed).expect_err("an empty name");
    assert!(
        problems.iter().any(|p| p.path == "models[0].workers[1]"
            && p.message.contains("label names must not be empty")),
        "{problems:?}"
    );
}

#[test]
fn pair_on_is_read_checked_and_shown_with_its_warnings() {
    let ctx = build(&pd_model(", pair_on: [rack]")).expect("a warning is no error");
    let bucket = &ctx.models().next().expect("m").resolver.buckets()[0];
    let pair_on = bucket.groups().pair_on().expect("a pd bucket");
    assert_eq!(pair_on.labels(), ["rack"]);
    let warnings: Vec<String> =
        pairing_warnings(ctx.models(), ctx.registry()).iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        ["bucket pd: prefill engine P2 has no decode engine with the same pair_on labels, so it \
          is never selected there"]
    );
    let shown = summary(ctx.models(), ctx.registry());
    assert!(shown.contains(", pair_on [rack]\n"), "{shown}");
    assert!(shown.contains(&format!("warning: {}\n", warnings[0])), "{shown}");

    let nobody = build(&pd_model(", pair_on: [zone]")).expect("builds");
    let warnings = pairing_warnings(nobody.models(), nobody.registry());
    assert!(
        warnings[0].to_string().contains("no worker has the pair_on label \"zone\""),
        "{warnings:?}"
    );
    assert_eq!(warnings.len(), 3, "the label, then P1 and P2: {warnings:?}");

    let unconstrained = build(&pd_model("")).expect("builds");
    assert!(pairing_warnings(unconstrained.models(), unconstrained.registry()).is_empty());
    assert!(!summary(unconstrained.models(), unconstrained.registry()).contains("pair_on"));

    for (pair_on, path, fragment) in [
        ("[rack, \"\"]", "models[0].buckets[0].groups.pd.pair_on[1]", "must not be empty"),
        (
            "[rack, tp, rack]",
            "models[0].buckets[0].groups.pd.pair_on[2]",
            "\"rack\" is listed twice",
        ),
    ] {
        let problems = build(&pd_model(&format!(", pair_on: {pair_on}"))).expect_err(pair_on);
        assert!(
            problems.iter().any(|p| p.path == path && p.message.contains(fragment)),
            "{pair_on}: {problems:?}"
        );
    }
    let plain = one_model("", "", PLAIN_NO_KV, "{plain: {pair_on: [rack]}}");
    let err = ConfigFile::parse(&plain).expect_err("pair_on belongs to groups.pd");
    assert!(err.contains("unknown field `pair_on`"), "{err}");
}

/// The parse error of a one-model configuration whose bucket has `bucket_extra` keys and whose
/// model has `model_extra`.
fn slo_parse_error(model_extra: &str, bucket_extra: &str) -> String {
    let yaml = format!(
        "models:\n  - id: m\n    {model_extra}\n    workers: {PLAIN_NO_KV}\n    buckets:\n      \
         - {{id: all, {bucket_extra}groups: {{plain: {{}}}}}}\n"
    );
    match ConfigFile::parse(&yaml) {
        Ok(_) => panic!("parsed: {yaml}"),
        Err(err) => err,
    }
}

#[test]
fn slo_keys_refuse_unknown_preferences_and_unusable_estimates_by_path() {
    #[rustfmt::skip]
    let cases: [(&str, &str, &str); 14] = [
        ("ttft_slo: fastest", "", "models[0].ttft_slo: unknown SLO preference \"fastest\" (expected disabled, slo_first or best_effort)"),
        ("tps_slo: on", "", "models[0].tps_slo: unknown SLO preference \"on\""),
        ("ttft_slo: [slo_first]", "", "models[0].ttft_slo: invalid type: sequence, expected disabled, slo_first or best_effort"),
        ("", "ttft_ms: 0, ", "models[0].buckets[0].ttft_ms: must be a positive integer of milliseconds or live, got 0"),
        ("", "ttft_ms: -5, ", "models[0].buckets[0].ttft_ms: must be a positive integer of milliseconds or live, got -5"),
        ("", "ttft_ms: 1.5, ", "models[0].buckets[0].ttft_ms: must be a positive integer of milliseconds or live, got 1.5"),
        ("", "ttft_ms: soon, ", "models[0].buckets[0].ttft_ms: must be a positive integer of milliseconds or live, got \"soon\""),
        ("", "ttft_ms: .inf, ", "models[0].buckets[0].ttft_ms: must be"),
        ("", "tokens_per_second: 0, ", "models[0].buckets[0].tokens_per_second: must be a finite number of tokens per second above 0, or live, got 0"),
        ("", "tokens_per_second: -2.5, ", "models[0].buckets[0].tokens_per_second: must be a finite number of tokens per second above 0, or live, got -2.5"),
        ("", "tokens_per_second: .nan, ", "models[0].buckets[0].tokens_per_second: must be a finite number of tokens per second above 0, or live, got NaN"),
        ("", "tokens_per_second: .inf, ", "models[0].buckets[0].tokens_per_second: must be a finite number of tokens per second above 0, or live, got inf"),
        ("", "tokens_per_second: Live, ", "models[0].buckets[0].tokens_per_second: must be"),
        ("", "tokens_per_second: [1], ", "models[0].buckets[0].tokens_per_second: invalid type"),
    ];
    for (model_extra, bucket_extra, expected) in cases {
        let err = slo_parse_error(model_extra, bucket_extra);
        assert!(err.starts_with(expected), "{model_extra}{bucket_extra}: {err}");
    }
}

#[test]
fn slo_keys_build_the_resolver_and_check_config_prints_them() {
    let yaml = format!(
        "models:\n  - id: m\n    ttft_slo: slo_first\n    tps_slo: best_effort\n    \
         workers: {PLAIN_NO_KV}\n    buckets:\n      \
         - {{id: fast, limits: {{max: 100}}, ttft_ms: 50, tokens_per_second: 12.5, groups: {{plain: {{}}}}}}\n      \
         - {{id: live, limits: {{max: 1000}}, ttft_ms: live, tokens_per_second: live, groups: {{plain: {{}}}}}}\n      \
         - {{id: none, ttft_ms: null, groups: {{plain: {{}}}}}}\n"
    );
    let ctx = build(&yaml).expect("builds");
    let model = ctx.models().next().expect("one model");
    let slo = model.resolver.slo();
    assert_eq!((slo.ttft.as_str(), slo.tps.as_str()), ("slo_first", "best_effort"));
    let printed = summary(ctx.models(), ctx.registry());
    for line in [
        "model m: 2 workers, tokenizer none (size estimate), ttft_slo slo_first, tps_slo best_effort",
        "  bucket fast (rank 0, input 0..=100, context unbounded, ttft_ms 50, tokens_per_second 12.5): plain [all] round_robin",
        "  bucket live (rank 0, input 0..=1000, context unbounded, ttft_ms live, tokens_per_second live): plain [all] round_robin",
        "  bucket none (rank 0, input 0..=unbounded, context unbounded, ttft_ms unset, tokens_per_second unset): plain [all] round_robin",
    ] {
        assert!(printed.lines().any(|l| l == line), "{line:?} missing from\n{printed}");
    }

    // Without preferences the summary shows only what a bucket declares.
    let plain = one_model("", "", PLAIN_NO_KV, "{plain: {}}");
    let ctx = build(&plain).expect("builds");
    let printed = summary(ctx.models(), ctx.registry());
    assert!(printed.contains("ttft_slo disabled, tps_slo disabled"), "{printed}");
    assert!(
        printed.contains("  bucket all (rank 0, input 0..=unbounded, context unbounded): plain"),
        "{printed}"
    );
}

/// A `discovery` section (YAML flow mapping) over a one-model configuration with `buckets`.
fn discovering(discovery: &str, models: &str) -> String {
    format!("discovery: {discovery}\nmodels:\n{models}")
}

const PLAIN_MODEL: &str = "  - id: m\n    buckets: [{id: all, groups: {plain: {}}}]\n";
const PD_MODEL: &str =
    "  - id: pd\n    buckets: [{id: all, groups: {pd: {prefill: {}, decode: {}}}}]\n";

#[test]
fn the_discovery_section_is_checked_with_the_path_of_each_problem() {
    let two = format!("{PLAIN_MODEL}{PD_MODEL}");
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("a plain selector", discovering("{selector: app=sglang}", PLAIN_MODEL), None),
        ("named ports and engine endpoints",
            discovering("{selector: app=sglang, port: http, kv_events: {port: kv}, load_reporter_port: 50051}", PLAIN_MODEL), None),
        ("pd selectors for a pd model",
            discovering("{prefill_selector: role=prefill, decode_selector: role=decode}", PD_MODEL), None),
        ("a model label over several models",
            discovering("{selector: app=sglang, prefill_selector: r=p, decode_selector: r=d, model_label: sglang.ai/model}", &two), None),
        ("no selector", discovering("{namespace: x}", PLAIN_MODEL),
            Some(("discovery", "needs selector"))),
        ("a selector that does not parse", discovering("{selector: \"app in (a\"}", PLAIN_MODEL),
            Some(("discovery.selector", "label selector \"app in (a\""))),
        ("prefill without decode", discovering("{prefill_selector: r=p}", PD_MODEL),
            Some(("discovery.decode_selector", "needed with prefill_selector"))),
        ("a plain selector for a pd model", discovering("{selector: app=x}", PD_MODEL),
            Some(("discovery.selector", "pd buckets"))),
        ("pd selectors for a plain model",
            discovering("{prefill_selector: r=p, decode_selector: r=d}", PLAIN_MODEL),
            Some(("discovery.prefill_selector", "plain buckets"))),
        ("both kinds for one model",
            discovering("{selector: a=b, prefill_selector: r=p, decode_selector: r=d}", PLAIN_MODEL),
            Some(("discovery.selector", "plain and PD engines"))),
        ("which of several models", discovering("{selector: a=b}", &two),
            Some(("discovery.model", "required: this router serves 2 models (m, pd)"))),
        ("a model not configured", discovering("{selector: a=b, model: x}", PLAIN_MODEL),
            Some(("discovery.model", "\"x\" is not a configured model (m)"))),
        ("model and model_label", discovering("{selector: a=b, model: m, model_label: k}", PLAIN_MODEL),
            Some(("discovery.model_label", "exclusive"))),
        ("a model label that is no label key", discovering("{selector: a=b, model_label: \"a=b\"}", PLAIN_MODEL),
            Some(("discovery.model_label", "not a label key"))),
        ("port 0", discovering("{selector: a=b, port: 0}", PLAIN_MODEL),
            Some(("discovery.port", "from 1 to 65535"))),
        ("a bad API server URL", discovering("{selector: a=b, api_server: \"ftp://x\"}", PLAIN_MODEL),
            Some(("discovery.api_server", "scheme must be http or https"))),
        ("no backoff", discovering("{selector: a=b, backoff_initial_ms: 0}", PLAIN_MODEL),
            Some(("discovery.backoff_initial_ms", "at least 1"))),
        ("dp_size 0", discovering("{selector: a=b, dp_size: 0}", PLAIN_MODEL),
            Some(("discovery.dp_size", "at least 1"))),
    ];
    for (name, yaml, expected) in cases {
        match (build(&yaml), expected) {
            (Ok(ctx), None) => assert!(ctx.discovery().is_some(), "{name}"),
            (Ok(_), Some(expected)) => panic!("{name}: expected {expected:?}"),
            (Err(problems), None) => panic!("{name}: {problems:?}"),
            (Err(problems), Some((path, fragment))) => assert!(
                problems.iter().any(|p| p.path == path && p.message.contains(fragment)),
                "{name}: {problems:?}"
            ),
        }
    }
    // A cache-reading group of discovered engines: their KV events, or approximate mode; a
    // block size alone feeds no local index.
    let tok = format!("tokenizer: \"{}\"", tokenizer());
    let cache_model = |extra: &str| {
        format!(
            "  - id: m\n    {tok}\n    buckets: [{{id: all, groups: {{plain: {{policy: {{type: cache_aware}}}}}}}}]\n{extra}"
        )
    };
    let sized = build(&discovering("{selector: a=b, block_size: 16}", &cache_model("")));
    let sized = sized.err().unwrap_or_default();
    assert!(
        sized.iter().any(|p| p.path == "models[0].buckets[0].groups.plain.policy"
            && p.message.contains("discovery.kv_events")),
        "{sized:?}"
    );
    for ok in ["{selector: a=b, kv_events: {port: kv}}", "{selector: a=b}"] {
        let seeing = build(&discovering(ok, &cache_model("")));
        assert!(seeing.is_ok(), "{ok}: {:?}", seeing.err());
    }

    let unknown = ConfigFile::parse(&discovering("{selector: a=b, selectors: x}", PLAIN_MODEL));
    assert!(unknown.expect_err("unknown key").contains("discovery"), "unknown keys are errors");
}

#[test]
fn the_telemetry_section_is_off_by_default_and_checked() {
    let plain = "{plain: {policy: {type: round_robin}}}";
    let config = ConfigFile::parse(&one_model("", "", PLAIN_NO_KV, plain)).expect("parses");
    assert_eq!(config.telemetry.otlp_endpoint, None, "no export unless asked");
    assert_eq!(config.telemetry.sample_ratio, 1.0);
    let good = "telemetry: {otlp_endpoint: \"http://127.0.0.1:4317\", sample_ratio: 0.25, service_name: r1}";
    let config = ConfigFile::parse(&one_model(good, "", PLAIN_NO_KV, plain)).expect("parses");
    assert_eq!(config.telemetry.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4317"));
    assert_eq!(
        (config.telemetry.sample_ratio, config.telemetry.service_name.as_str()),
        (0.25, "r1")
    );
    assert!(build(&one_model(good, "", PLAIN_NO_KV, plain)).is_ok());
    let bad = "telemetry: {otlp_endpoint: \"collector:4317\", sample_ratio: 2}";
    let Err(problems) = build(&one_model(bad, "", PLAIN_NO_KV, plain)) else {
        panic!("a bad telemetry section is refused")
    };
    let paths: Vec<String> = problems.iter().map(|p| p.path.clone()).collect();
    assert!(paths.contains(&"telemetry.sample_ratio".to_owned()), "{paths:?}");
    assert!(paths.contains(&"telemetry.otlp_endpoint".to_owned()), "{paths:?}");
    let unknown = "telemetry: {endpoint: \"http://127.0.0.1:4317\"}";
    assert!(ConfigFile::parse(&one_model(unknown, "", PLAIN_NO_KV, plain)).is_err());
}

#[test]
fn the_listener_logging_and_header_keys_are_checked_by_name() {
    let groups = "{plain: {policy: {type: round_robin}}}";
    let with = |server: &str| one_model(&format!("server: {server}"), "", PLAIN_NO_KV, groups);
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("every new key", with("{metrics_host: 0.0.0.0, metrics_port: 9100, log_level: debug, \
            request_id_headers: [x-correlation-id], cors_allowed_origins: [\"https://ui.example:8443\"], \
            retry: {backoff_multiplier: 1.5, max_backoff_ms: 500, jitter_factor: 0.1}}"), None),
        ("any origin", with("{cors_allowed_origins: [\"*\"]}"), None),
        ("a metrics host without a port", with("{metrics_host: 0.0.0.0}"),
            Some(("server.metrics_host", "needs server.metrics_port"))),
        ("a header name with a space", with("{request_id_headers: [\"x id\"]}"),
            Some(("server.request_id_headers[0]", "not a lowercase header name"))),
        ("an uppercase header name", with("{request_id_headers: [X-Id]}"),
            Some(("server.request_id_headers[0]", "lowercase"))),
        ("no request id header", with("{request_id_headers: []}"),
            Some(("server.request_id_headers", "at least one"))),
        ("an origin with a path", with("{cors_allowed_origins: [\"https://a.example/app\"]}"),
            Some(("server.cors_allowed_origins[0]", "not an origin"))),
        ("an origin without a scheme", with("{cors_allowed_origins: [a.example]}"),
            Some(("server.cors_allowed_origins[0]", "not an origin"))),
        ("any origin among others", with("{cors_allowed_origins: [\"*\", \"https://a.example\"]}"),
            Some(("server.cors_allowed_origins", "list it alone"))),
        ("a shrinking backoff", with("{retry: {backoff_multiplier: 0.5}}"),
            Some(("server.retry.backoff_multiplier", "[1, 10]"))),
    ];
    for (name, yaml, expected) in cases {
        match (build(&yaml), expected) {
            (Ok(ctx), None) => assert_eq!(ctx.server().retry.max_retries, 2, "{name}"),
            (Ok(_), Some(expected)) => panic!("{name}: expected {expected:?}"),
            (Err(problems), None) => panic!("{name}: {problems:?}"),
            (Err(problems), Some((path, fragment))) => assert!(
                problems.iter().any(|p| p.path == path && p.message.contains(fragment)),
                "{name}: {problems:?}"
            ),
        }
    }
}

#[test]
fn rate_limits_and_named_keys_are_read_from_the_server_section() {
    use router_config::{Rate, RateLimitSection};
    let groups = "{plain: {policy: {type: round_robin}}}";
    let yaml = one_model(
        "server: {rate_limit: {requests_per_second: 0.5, tokens_per_second: 1000, tokens_burst: 4000}, \
         api_keys: [plain-key, {key: team-key, name: team-a, rate_limit: {requests_per_second: 1, burst: 3}}, \
         {key: open-key, name: internal, rate_limit: {}}]}",
        "",
        PLAIN_NO_KV,
        groups,
    );
    let ctx = build(&yaml).unwrap_or_else(|problems| panic!("{problems:?}"));
    let server = ctx.server();
    let rate = |r| Some(Rate::new(r).expect("a rate"));
    let burst = |n| std::num::NonZeroU64::new(n);
    let default = RateLimitSection {
        requests_per_second: rate(0.5),
        burst: None,
        tokens_per_second: rate(1000.0),
        tokens_burst: burst(4000),
    };
    assert_eq!(server.rate_limit, Some(default));
    let keys: Vec<_> =
        server.api_keys.iter().map(|k| (k.key.expose(), k.name.as_deref(), k.rate_limit)).collect();
    let team =
        RateLimitSection { requests_per_second: rate(1.0), burst: burst(3), ..Default::default() };
    assert_eq!(
        keys,
        [
            ("plain-key", None, None),
            ("team-key", Some("team-a"), Some(team)),
            ("open-key", Some("internal"), Some(RateLimitSection::default())),
        ]
    );
    assert!(ctx.credentials().client_keys.accepts("team-key"));
    // Off by default.
    let plain = build(&one_model("", "", PLAIN_NO_KV, groups)).expect("builds");
    assert_eq!(plain.server().rate_limit, None);
}

#[test]
fn unusable_rate_limits_name_their_path() {
    let groups = "{plain: {policy: {type: round_robin}}}";
    let with = |server: &str| one_model(&format!("server: {server}"), "", PLAIN_NO_KV, groups);
    #[rustfmt::skip]
    let parse_errors = [
        ("a zero rate", with("{rate_limit: {requests_per_second: 0}}"),
            "server.rate_limit.requests_per_second", "must be a finite number above 0, got 0"),
        ("a negative rate", with("{rate_limit: {tokens_per_second: -5}}"),
            "server.rate_limit.tokens_per_second", "must be a finite number above 0, got -5"),
        ("a NaN rate", with("{rate_limit: {tokens_per_second: .nan}}"),
            "server.rate_limit.tokens_per_second", "got NaN"),
        ("an infinite rate", with("{rate_limit: {requests_per_second: .inf}}"),
            "server.rate_limit.requests_per_second", "got inf"),
        ("a zero burst", with("{rate_limit: {requests_per_second: 1, burst: 0}}"),
            "server.rate_limit.burst", "nonzero"),
        ("a key's own zero rate", with("{api_keys: [{key: k, rate_limit: {requests_per_second: 0}}]}"),
            "server.api_keys[0].rate_limit.requests_per_second", "above 0"),
        ("an unknown limit", with("{rate_limit: {requests_per_minute: 60}}"),
            "server.rate_limit", "unknown field `requests_per_minute`"),
        ("an unknown key field", with("{api_keys: [{key: k, label: x}]}"),
            "server.api_keys[0]", "unknown field `label`"),
        ("a key entry without its key", with("{api_keys: [{name: x}]}"),
            "server.api_keys[0]", "missing field `key`"),
        ("an empty key", with("{api_keys: [\"\"]}"),
            "server.api_keys[0]", "must not be empty"),
    ];
    for (name, yaml, path, fragment) in parse_errors {
        let err = ConfigFile::parse(&yaml).err().unwrap_or_else(|| panic!("{name}: parsed"));
        assert!(err.starts_with(path) && err.contains(fragment), "{name}: {err}");
    }
    // A refused rate is named once, by its own path.
    let err = ConfigFile::parse("server:\n  rate_limit:\n    tokens_per_second: -2\n");
    assert_eq!(
        err.err().as_deref(),
        Some(
            "server.rate_limit.tokens_per_second: must be a finite number above 0, got -2 at line 3 \
             column 24"
        )
    );
    #[rustfmt::skip]
    let problems = [
        ("a burst without its rate", with("{rate_limit: {burst: 2, tokens_per_second: 5}}"),
            "server.rate_limit.burst", "needs requests_per_second"),
        ("a token burst without its rate", with("{api_keys: [{key: k, rate_limit: {tokens_burst: 2}}]}"),
            "server.api_keys[0].rate_limit.tokens_burst", "needs tokens_per_second"),
        ("an empty name", with("{api_keys: [{key: k, name: \" \"}]}"),
            "server.api_keys[0].name", "must not be empty"),
        ("a name given twice", with("{api_keys: [{key: k1, name: a}, {key: k2, name: a}]}"),
            "server.api_keys[1].name", "duplicate key name \"a\""),
    ];
    for (name, yaml, path, fragment) in problems {
        let problems = build(&yaml).err().unwrap_or_else(|| panic!("{name}: built"));
        assert!(
            problems.iter().any(|p| p.path == path && p.message.contains(fragment)),
            "{name}: {problems:?}"
        );
    }
}

#[test]
fn requests_are_tokenized_only_where_something_reads_their_tokens() {
    let tok = format!("tokenizer: \"{}\"", tokenizer());
    let needs = |server: &str, bucket: &str, policy: &str| {
        let yaml = format!(
            "{server}models:\n  - id: m\n    {tok}\n    workers: {PLAIN_NO_KV}\n    buckets:\n      \
             - {{id: a, {bucket}groups: {{plain: {{policy: {{type: {policy}}}}}}}}}\n"
        );
        let ctx = build(&yaml).unwrap_or_else(|problems| panic!("{yaml}: {problems:?}"));
        ctx.model("m").expect("m").needs_tokens
    };
    assert!(!needs("", "", "round_robin"), "nothing reads them");
    assert!(!needs("", "", "power_of_two"));
    assert!(needs("", "", "cache_aware"), "cached prefixes are token blocks");
    assert!(needs("", "limits: {max: 4096}, ", "round_robin"), "a length bound");
    assert!(needs("", "max_context_tokens: 8192, ", "round_robin"));
    assert!(needs("", "ttft_ms: 500, ", "round_robin"), "an SLO estimate");
    let limited = "server: {rate_limit: {tokens_per_second: 1000}}\n";
    assert!(needs(limited, "", "round_robin"), "a token rate limit");
}

#[test]
fn a_quick_start_reads_cached_prefixes_from_its_own_dispatches() {
    for (line, stage) in [
        ("--worker-urls http://a:1 --policy cache_aware", "plain"),
        ("--worker-urls http://a:1 --policy predicted_ttft", "plain"),
        (
            "--pd-disaggregation --prefill http://p:1 --decode http://d:1 \
             --prefill-policy cache_aware",
            "prefill",
        ),
    ] {
        let args = std::iter::once("router-server").chain(line.split_whitespace());
        let cli = <Cli as clap::Parser>::try_parse_from(args).expect(line);
        let config = cli.serve.quick_start_config().expect(line);
        AppContext::build(&config).unwrap_or_else(|problems| panic!("{line}: {problems:?}"));
        let groups = &config.models[0].buckets[0].groups;
        let group = match stage {
            "plain" => groups.plain.as_ref().expect("plain"),
            _ => &groups.pd.as_ref().expect("pd").prefill,
        };
        assert!(group.policy.prefix_provider().is_some(), "{line}");
    }
}

/// An engine CA bundle that cannot be used is a problem at its key (router-engine-client's
/// tests hold each unusable bundle to its error).
#[test]
fn an_unusable_engine_ca_bundle_is_a_problem_at_its_key() {
    let path = std::env::temp_dir().join(format!("router-empty-ca-{}.pem", std::process::id()));
    std::fs::write(&path, "").expect("write");
    let yaml = format!(
        "server: {{engine_ca_file: \"{}\"}}\nmodels:\n  \
         - {{id: m, buckets: [{{id: a, groups: {{plain: {{}}}}}}]}}\n",
        path.display()
    );
    let Err(problems) = build(&yaml) else { panic!("an empty bundle is refused") };
    let _ = std::fs::remove_file(&path);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].path, "server.engine_ca_file");
    assert!(problems[0].message.ends_with("holds no usable CA certificate"), "{problems:?}");
}

#[test]
fn prompt_pieces_are_cached_unless_the_segment_cache_has_no_bytes() {
    let tok = format!("tokenizer: \"{}\"", tokenizer());
    let whole_reason = |top: &str| {
        let yaml = one_model(top, &tok, PLAIN_NO_KV, "{plain: {policy: {type: cache_aware}}}");
        let ctx = build(&yaml).unwrap_or_else(|problems| panic!("{yaml}: {problems:?}"));
        let model = ctx.model("m").expect("m");
        model.tokenization.as_ref().expect("a tokenizer").whole_reason()
    };
    assert_eq!(whole_reason(""), None, "on by default");
    assert_eq!(
        whole_reason("prepare: {segment_cache_bytes: 0}"),
        Some(router_prepare::WholeReason::NoCache)
    );
    let err = ConfigFile::parse("prepare: {segment_cache: 1}\n").expect_err("an unknown key");
    assert!(err.contains("segment_cache"), "{err}");
}
