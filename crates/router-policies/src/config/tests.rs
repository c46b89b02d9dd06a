//! Policy configuration: reading every field with its path, refusing what does not apply,
//! validation of ranges and combinations, and construction over the shared handles.

use router_workers::Stage;

use super::*;
use crate::BindingScope;

fn yaml(text: &str) -> Result<PolicyConfig, String> {
    serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
}

fn json(text: &str) -> Result<PolicyConfig, String> {
    serde_json::from_str(text).map_err(|e| e.to_string())
}

#[test]
fn every_type_name_parses_with_default_admission() {
    for policy in PolicyType::ALL {
        let config = yaml(&format!("type: {policy}")).expect("every type name parses");
        assert_eq!(config.policy_type(), policy);
        assert!(config.admission.is_unlimited());
        assert_eq!(PolicyType::from_name(policy.as_str()), Some(policy));
    }
}

#[test]
fn only_prefix_reading_types_have_a_prefix_provider() {
    use CachePrefixProvider::{Indexer, RadixTree};
    for (text, provider) in [
        ("type: cache_aware", Some(RadixTree)),
        ("type: predicted_ttft", Some(RadixTree)),
        (
            "{type: cache_aware, cache_prefix_provider: indexer, kv_indexer_endpoint: \"h:1\"}",
            Some(Indexer),
        ),
        (
            "{type: predicted_ttft, cache_prefix_provider: indexer, kv_indexer_endpoint: \"h:1\"}",
            Some(Indexer),
        ),
        ("type: round_robin", None),
        ("type: power_of_two", None),
        ("type: load_based", None),
        ("type: session_aware", None),
        ("type: sticky", None),
        ("type: random", None),
    ] {
        assert_eq!(yaml(text).expect(text).prefix_provider(), provider, "{text}");
    }
}

#[test]
fn cache_aware_defaults_are_the_reference_ones() {
    let config = yaml("type: cache_aware").expect("valid");
    let PolicySettings::CacheAware(settings) = config.kind else { panic!("{config:?}") };
    assert_eq!(settings.cache_prefix_provider, CachePrefixProvider::RadixTree);
    assert_eq!(settings.cache_affinity_min_matched_tokens, 1024);
    assert_eq!(settings.cache_affinity_min_matched_ratio, None);
    assert_eq!(settings.cache_candidate_min_workers, 8);
    assert_eq!(settings.cache_candidate_ratio, 0.05);
    assert_eq!(settings.cache_candidate_max_workers, 32);
    assert_eq!(settings.cache_switch_margin_tokens, 1024);
    assert_eq!(settings.worker_queue_limit, None);
    assert_eq!(settings.saturation_queue_floor, None);
    assert_eq!(settings.pressure_abs_threshold_tokens, 1024);
    assert_eq!(settings.pressure_rel_threshold, 1.5);
    assert_eq!(settings.pressure_abs_threshold_ms, None);
    assert_eq!(settings.min_load_choices, 2);
    assert!(settings.kv_indexer_endpoint.is_empty());
    assert_eq!(settings.kv_indexer_query_timeout_ms, 100);
    assert_eq!(settings.kv_indexer_query_max_inflight, 32);
    assert_eq!(*settings, CacheAwareSettings::default());
}

#[test]
fn sticky_fallback_defaults_to_round_robin_and_takes_the_four_choices() {
    let config = yaml("type: sticky").expect("valid");
    assert_eq!(config.kind, PolicySettings::Sticky(StickySettings::default()));
    assert_eq!(StickySettings::default().fallback, StickyFallback::RoundRobin);
    for (name, fallback) in [
        ("round_robin", StickyFallback::RoundRobin),
        ("random", StickyFallback::Random),
        ("power_of_two", StickyFallback::PowerOfTwo),
        ("load_based", StickyFallback::LoadBased),
    ] {
        let config = yaml(&format!("{{type: sticky, fallback: {name}}}")).expect(name);
        let expected =
            StickySettings { fallback, scope: BindingScope::Bucket, ..Default::default() };
        assert_eq!(config.kind, PolicySettings::Sticky(expected));
    }
    let err = yaml("{type: sticky, fallback: cache_aware}").expect_err("not a fallback");
    assert!(err.contains("fallback: unknown variant `cache_aware`"), "{err}");
}

#[test]
fn session_and_sticky_bind_per_bucket_unless_scope_is_model() {
    let session = |text: &str| yaml(text).map(|c| c.kind);
    assert_eq!(
        session("type: session_aware"),
        Ok(PolicySettings::SessionAware(SessionAwareSettings {
            scope: BindingScope::Bucket,
            ..Default::default()
        }))
    );
    for (name, scope) in [("bucket", BindingScope::Bucket), ("model", BindingScope::Model)] {
        assert_eq!(
            session(&format!("{{type: session_aware, scope: {name}}}")),
            Ok(PolicySettings::SessionAware(SessionAwareSettings { scope, ..Default::default() })),
            "{name}"
        );
        let sticky = yaml(&format!("{{type: sticky, fallback: random, scope: {name}}}"))
            .expect("valid sticky");
        let expected =
            StickySettings { fallback: StickyFallback::Random, scope, ..Default::default() };
        assert_eq!(sticky.kind, PolicySettings::Sticky(expected), "{name}");
    }
    let err = yaml("{type: session_aware, scope: global}").expect_err("not a scope");
    assert!(err.contains("scope: unknown variant `global`"), "{err}");
    assert!(err.contains("expected `bucket` or `model`"), "the choices are named: {err}");
    let err = yaml("{type: power_of_two, scope: model}").expect_err("not an affinity policy");
    assert!(err.contains("policy.scope does not apply to policy type power_of_two"), "{err}");
    let err = yaml("{type: session_aware, scope: model, scope: bucket}").expect_err("twice");
    assert!(err.contains("duplicate field policy.scope"), "{err}");

    // The scope reaches the built policy.
    let handles = crate::tests::fixtures::Fleet::empty(Stage::Plain).handles();
    for (text, scope) in [
        ("{type: session_aware, scope: model}", BindingScope::Model),
        ("{type: sticky, scope: model}", BindingScope::Model),
        ("{type: sticky}", BindingScope::Bucket),
    ] {
        let policy = yaml(text).expect("valid").build(&handles).expect("built");
        let built = format!("{policy:?}");
        assert!(built.contains(&format!("scope: {scope:?}")), "{text}: {built}");
    }
}

#[test]
fn tuning_and_admission_are_read() {
    let config = yaml(
        "type: cache_aware
admission: {max_running_requests: 64, max_kv_tokens: 1048576}
cache_prefix_provider: indexer
kv_indexer_endpoint: [\"http://10.0.0.9:50051\", \"http://10.0.0.10:50051\"]
cache_affinity_min_matched_ratio: 0.25
worker_queue_limit: 8
saturation_queue_floor: 4
min_load_choices: 3
pressure_abs_threshold_ms: 50
",
    )
    .expect("valid");
    assert_eq!(config.admission.max_running_requests, Some(64));
    assert_eq!(config.admission.max_kv_tokens, Some(1_048_576));
    assert_eq!(config.admission.max_inflight_requests, None);
    let PolicySettings::CacheAware(settings) = config.kind else { panic!("{config:?}") };
    assert_eq!(settings.cache_prefix_provider, CachePrefixProvider::Indexer);
    assert_eq!(settings.kv_indexer_endpoint.len(), 2);
    assert_eq!(settings.cache_affinity_min_matched_ratio, Some(0.25));
    assert_eq!(settings.worker_queue_limit, Some(8));
    assert_eq!(settings.saturation_queue_floor, Some(4));
    assert_eq!(settings.min_load_choices, 3);
    assert_eq!(settings.pressure_abs_threshold_ms, Some(50.0));

    let single =
        yaml("{type: cache_aware, cache_prefix_provider: indexer, kv_indexer_endpoint: \"h:1\"}")
            .expect("one address");
    let PolicySettings::CacheAware(settings) = single.kind else { panic!("{single:?}") };
    assert_eq!(settings.kv_indexer_endpoint, vec!["h:1".to_owned()]);
}

/// Each rejected configuration, with a fragment its message must contain.
#[test]
fn rejections_name_the_field_path() {
    let cases: &[(&str, &str)] = &[
        // Settings of another type.
        (
            "{type: round_robin, min_load_choices: 3}",
            "policy.min_load_choices does not apply to policy type round_robin",
        ),
        (
            "{type: power_of_two, cache_switch_margin_tokens: 1}",
            "policy.cache_switch_margin_tokens does not apply to policy type power_of_two",
        ),
        (
            "{type: load_based, fallback: random}",
            "policy.fallback does not apply to policy type load_based",
        ),
        // Pressure-guard tuning applies to cache-aware only; session-only use is rejected.
        (
            "{type: session_aware, pressure_abs_threshold_tokens: 10}",
            "policy.pressure_abs_threshold_tokens does not apply to policy type session_aware",
        ),
        (
            "{type: cache_aware, fallback: random}",
            "policy.fallback does not apply to policy type cache_aware",
        ),
        // Unknown fields, here and inside admission.
        ("{type: random, weight: 3}", "unknown field policy.weight"),
        ("{type: random, admission: {max_running: 3}}", "admission: unknown field `max_running`"),
        // Wrong value types (the format names the path of errors inside values).
        ("{type: cache_aware, min_load_choices: two}", "min_load_choices: invalid type"),
        (
            "{type: cache_aware, cache_prefix_provider: redis}",
            "cache_prefix_provider: unknown variant `redis`",
        ),
        ("{type: random, admission: {max_kv_tokens: -1}}", "admission.max_kv_tokens: invalid type"),
        // Missing or unknown type.
        ("{admission: {max_running_requests: 1}}", "policy.type is required"),
        ("{type: fastest}", "unknown policy type \"fastest\""),
        // Ranges and combinations.
        (
            "{type: cache_aware, cache_affinity_min_matched_ratio: 1.5}",
            "policy.cache_affinity_min_matched_ratio: must be between 0 and 1, got 1.5",
        ),
        ("{type: cache_aware, cache_candidate_ratio: -0.1}", "policy.cache_candidate_ratio"),
        (
            "{type: cache_aware, cache_candidate_min_workers: 40}",
            "policy.cache_candidate_min_workers: 40 exceeds cache_candidate_max_workers 32",
        ),
        (
            "{type: cache_aware, cache_candidate_max_workers: 0, cache_candidate_min_workers: 0}",
            "policy.cache_candidate_max_workers: must be at least 1",
        ),
        (
            "{type: cache_aware, worker_queue_limit: 4, saturation_queue_floor: 5}",
            "policy.saturation_queue_floor: 5 exceeds worker_queue_limit 4",
        ),
        (
            "{type: cache_aware, saturation_queue_floor: 5}",
            "policy.saturation_queue_floor: 5 needs worker_queue_limit",
        ),
        (
            "{type: cache_aware, pressure_rel_threshold: 1.0}",
            "policy.pressure_rel_threshold: must be a finite number above 1, got 1",
        ),
        ("{type: cache_aware, pressure_rel_threshold: .nan}", "policy.pressure_rel_threshold"),
        ("{type: cache_aware, pressure_abs_threshold_ms: -1}", "policy.pressure_abs_threshold_ms"),
        ("{type: cache_aware, min_load_choices: 0}", "policy.min_load_choices: must be at least 1"),
        (
            "{type: cache_aware, cache_prefix_provider: indexer}",
            "policy.kv_indexer_endpoint: is required when cache_prefix_provider is indexer",
        ),
        (
            "{type: cache_aware, cache_prefix_provider: indexer, kv_indexer_endpoint: [\" \"]}",
            "policy.kv_indexer_endpoint: empty address",
        ),
        (
            "{type: cache_aware, kv_indexer_endpoint: \"h:1\"}",
            "policy.kv_indexer_endpoint: applies only when cache_prefix_provider is indexer",
        ),
        (
            "{type: cache_aware, cache_prefix_provider: indexer, kv_indexer_endpoint: h, kv_indexer_query_timeout_ms: 0}",
            "policy.kv_indexer_query_timeout_ms",
        ),
        (
            "{type: cache_aware, cache_prefix_provider: indexer, kv_indexer_endpoint: h, kv_indexer_query_max_inflight: 0}",
            "policy.kv_indexer_query_max_inflight",
        ),
    ];
    for (text, expected) in cases {
        let err = yaml(text).expect_err(text);
        assert!(err.contains(expected), "{text}: {err:?} lacks {expected:?}");
    }
}

#[test]
fn removed_policy_names_say_what_replaces_them() {
    let cases = [
        ("fused_score", "cache_aware"),
        ("score_policy", "cache_aware"),
        ("legacy_host_affinity", "power_of_two"),
        ("bucket", "models[].buckets"),
        ("consistent_hashing", "sticky"),
    ];
    for (name, replacement) in cases {
        let err = yaml(&format!("type: {name}")).expect_err(name);
        assert!(err.contains(&format!("policy type \"{name}\" was removed")), "{err}");
        assert!(err.contains(replacement), "{name}: {err}");
        assert!(removed_policy_type(name).is_some_and(|r| r.contains(replacement)));
    }
    assert_eq!(removed_policy_type("round_robin"), None);
}

#[test]
fn removed_options_say_what_replaces_them() {
    let cases = [
        (
            "{type: cache_aware, fuse_weights: [1, 2]}",
            "policy.fuse_weights was removed",
            "cache_aware",
        ),
        ("{type: power_of_two, stable_pair: true}", "policy.stable_pair was removed", "one bucket"),
        (
            "{type: session_aware, affinity_mode: soft}",
            "policy.affinity_mode was removed",
            "admitted-binding reuse",
        ),
        (
            "{type: random, filter: overloaded}",
            "policy.filter was removed",
            "admission.max_inflight_requests",
        ),
        (
            "{type: cache_aware, prefix_cache_min_share: 0.5}",
            "policy.prefix_cache_min_share was removed",
            "not equivalent",
        ),
        (
            "{type: random, max_in_flight: 8}",
            "policy.max_in_flight was removed",
            "admission.max_inflight_requests",
        ),
    ];
    for (text, removed, replacement) in cases {
        let err = yaml(text).expect_err(text);
        assert!(err.contains(removed), "{text}: {err}");
        assert!(err.contains(replacement), "{text}: {err}");
    }
    assert_eq!(removed_setting("min_load_choices"), None);
}

#[test]
fn duplicate_fields_are_rejected() {
    for text in [
        r#"{"type": "random", "type": "round_robin"}"#,
        r#"{"type": "random", "admission": {}, "admission": {}}"#,
        r#"{"type": "cache_aware", "min_load_choices": 2, "min_load_choices": 3}"#,
    ] {
        let err = json(text).expect_err(text);
        assert!(err.contains("duplicate field policy."), "{text}: {err}");
    }
}

#[test]
fn errors_inside_a_larger_document_carry_its_path() {
    #[derive(Debug, serde::Deserialize)]
    struct Group {
        #[expect(dead_code, reason = "only the error is inspected")]
        policy: PolicyConfig,
    }
    let err = serde_yaml_ng::from_str::<Vec<Group>>(
        "[{policy: {type: round_robin}}, {policy: {type: random, min_load_choices: 3}}]",
    )
    .expect_err("not applicable")
    .to_string();
    assert!(
        err.contains("[1].policy: policy.min_load_choices does not apply to policy type random"),
        "{err}"
    );
    let err = serde_yaml_ng::from_str::<Vec<Group>>(
        "[{policy: {type: random, admission: {max_running: 3}}}]",
    )
    .expect_err("unknown admission field")
    .to_string();
    assert!(err.contains("[0].policy.admission: unknown field `max_running`"), "{err}");
}

#[test]
fn json_is_accepted_too() {
    let config = json(r#"{"type": "power_of_two", "admission": {"max_inflight_requests": 64}}"#)
        .expect("valid");
    assert_eq!(config.policy_type(), PolicyType::PowerOfTwo);
    assert_eq!(config.admission.max_inflight_requests, Some(64));
    let err = json(r#"["power_of_two"]"#).expect_err("not a map");
    assert!(err.contains("a policy map"), "{err}");
}

#[test]
fn programmatic_configs_are_validated_too() {
    let settings =
        CacheAwareSettings { pressure_rel_threshold: 0.5, ..CacheAwareSettings::default() };
    let config = PolicyConfig::new(PolicySettings::CacheAware(Box::new(settings)));
    let err = config.validate().expect_err("rel threshold below 1");
    assert!(
        matches!(err, ConfigError::InvalidValue { ref field, .. } if field == "policy.pressure_rel_threshold")
    );
}

#[test]
fn prefix_policies_are_not_for_decode() {
    for policy in PolicyType::ALL {
        assert!(policy.supports_stage(Stage::Plain));
        assert!(policy.supports_stage(Stage::Prefill));
        let prefix = matches!(policy, PolicyType::CacheAware | PolicyType::PredictedTtft);
        assert_eq!(policy.supports_stage(Stage::Decode), !prefix);
        assert_eq!(policy.reads_prefixes(), prefix);
    }
}

#[test]
fn predicted_ttft_reads_its_settings_and_the_shared_source_fields() {
    let config: PolicyConfig = serde_yaml_ng::from_str(
        "{type: predicted_ttft, default_prefill_tokens_per_sec: 20000, near_tie_ratio: 0.1, near_tie_ms: 2, recompute_weight: 8, waiting_weight: 0.5, cache_prefix_provider: indexer, kv_indexer_endpoint: 'http://127.0.0.1:9'}",
    )
    .expect("valid");
    let PolicySettings::PredictedTtft(settings) = &config.kind else { panic!("{config:?}") };
    assert_eq!(settings.default_prefill_tokens_per_sec, 20_000.0);
    assert_eq!((settings.near_tie_ratio, settings.near_tie_ms), (0.1, 2.0));
    assert_eq!((settings.recompute_weight, settings.waiting_weight), (8.0, 0.5));
    assert_eq!(settings.cache_prefix_provider, CachePrefixProvider::Indexer);
    assert_eq!(settings.kv_indexer_endpoint, ["http://127.0.0.1:9"]);
    let err =
        serde_yaml_ng::from_str::<PolicyConfig>("{type: predicted_ttft, min_load_choices: 2}")
            .expect_err("a cache_aware setting");
    assert!(
        err.to_string()
            .contains("policy.min_load_choices does not apply to policy type predicted_ttft"),
        "{err}"
    );
    let err = serde_yaml_ng::from_str::<PolicyConfig>("{type: predicted_ttft, near_tie_ratio: 2}")
        .expect_err("out of range");
    assert!(err.to_string().contains("policy.near_tie_ratio"), "{err}");
    let err = serde_yaml_ng::from_str::<PolicyConfig>("{type: cache_aware, waiting_weight: 1}")
        .expect_err("a predicted_ttft setting");
    assert!(
        err.to_string().contains("policy.waiting_weight does not apply to policy type cache_aware"),
        "{err}"
    );
}
