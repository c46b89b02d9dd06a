//! The command-line contract: check-config, dropped options rejected with their replacement,
//! and flags that would have no effect refused by name.

use std::process::Command;

use router_e2e::binary;
use router_e2e::tempfile_path::TempPath;

fn run(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(binary("router-server")).args(args).output().expect("runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

const VALID: &str = r#"
models:
  - id: llama
    workers:
      - {id: P1, url: "http://127.0.0.1:30000", role: prefill, bootstrap_port: 8998}
      - {id: D1, url: "http://127.0.0.1:30001", role: decode}
    buckets:
      - id: short-context
        rank: 10
        limits: {min: 0, max: 4096}
        max_context_tokens: 8192
        groups:
          pd:
            prefill: {worker_ids: [P1], policy: {type: power_of_two, admission: {max_running_requests: 64}}}
            decode: {worker_ids: [D1], policy: {type: power_of_two}}
"#;

#[test]
fn check_config_accepts_a_valid_file_with_a_summary() {
    let file = TempPath::write("router.yaml", VALID);
    let (code, stdout, stderr) = run(&["check-config", &file.display()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("short-context"), "{stdout}");
    assert!(stdout.contains("power_of_two"), "{stdout}");
}

#[test]
fn check_config_says_why_a_file_cannot_be_read() {
    let (code, _, stderr) = run(&["check-config", "/nonexistent/router.yaml"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("reading /nonexistent/router.yaml: No such file"), "{stderr}");
}

#[test]
fn check_config_reports_every_problem_with_its_path() {
    let broken = VALID
        .replace("worker_ids: [D1]", "worker_ids: [P1]")
        .replace("max: 4096", "max: 4096}\n        bogus: {x: 1")
        .replace("http://127.0.0.1:30001", "ftp://127.0.0.1:30001");
    let file = TempPath::write("router.yaml", &broken);
    let (code, _, stderr) = run(&["check-config", &file.display()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("bogus"), "unknown field named: {stderr}");

    let roles = VALID.replace("worker_ids: [D1]", "worker_ids: [P1]");
    let file = TempPath::write("router.yaml", &roles);
    let (code, _, stderr) = run(&["check-config", &file.display()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("models[0].buckets[0].groups"), "path named: {stderr}");
    assert!(stderr.contains("P1"), "{stderr}");

    let two = VALID
        .replace("http://127.0.0.1:30001", "ftp://127.0.0.1:30001")
        .replace("rank: 10", "rank: 10\n        max_context_tokens: 0");
    let file = TempPath::write("router.yaml", &two);
    let (code, _, stderr) = run(&["check-config", &file.display()]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("duplicate field") || stderr.contains("max_context_tokens"),
        "{stderr}"
    );
}

#[test]
fn check_config_prints_every_problem_of_a_file_at_its_line_and_column() {
    // Three type errors in three places: each is found, not only the first.
    let typed = "server:\n  port: eighty\nmodels:\n  - id: m\n    workers:\n      \
                 - {id: w1, url: \"http://127.0.0.1:1\", dp_size: many}\n    buckets:\n      \
                 - {id: a, rank: high}\n";
    let file = TempPath::write("router.yaml", typed);
    let (code, _, stderr) = run(&["check-config", &file.display()]);
    assert_eq!(code, 1, "{stderr}");
    let name = file.display();
    for expected in [
        format!("error: {name}:2:3: server.port: invalid type"),
        format!("error: {name}:6:45: models[0].workers[0].dp_size: invalid type"),
        format!("error: {name}:8:17: models[0].buckets[0].rank: invalid type"),
    ] {
        assert!(stderr.contains(&expected), "{expected}\n{stderr}");
    }
    assert!(stderr.contains("3 problem(s)"), "{stderr}");

    // Problems the build finds are placed too: a repeated bucket id where it repeats.
    let built = "models:\n  - id: m\n    workers: [{id: w1, url: \"http://127.0.0.1:1\"}]\n    \
                 buckets:\n      - {id: a, groups: {plain: {}}}\n      \
                 - {id: a, rank: 2, groups: {plain: {}}}\n      \
                 - {id: b, limits: {min: 10, max: 5}, groups: {plain: {}}}\n";
    let file = TempPath::write("router.yaml", built);
    let (code, _, stderr) = run(&["check-config", &file.display()]);
    assert_eq!(code, 1, "{stderr}");
    let name = file.display();
    let repeated =
        format!("error: {name}:6:10: models[0].buckets[1].id: duplicate bucket id \"a\"");
    assert!(stderr.contains(&repeated), "{repeated}\n{stderr}");
    assert!(stderr.contains(&format!("error: {name}:7:")), "the bad limits' line: {stderr}");
    assert!(stderr.contains("2 problem(s)"), "{stderr}");
}

#[test]
fn check_config_rejects_mixed_plain_and_pd_engines() {
    let mixed = VALID.replace("role: decode", "role: plain");
    let file = TempPath::write("router.yaml", &mixed);
    let (code, _, stderr) = run(&["check-config", &file.display()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("mix plain and prefill/decode"), "{stderr}");
}

#[test]
fn dropped_options_name_their_replacement() {
    for (args, replacement) in [
        (vec!["--worker-urls", "http://a:1", "--policy", "fused_score"], "cache_aware"),
        (vec!["--worker-urls", "http://a:1", "--stable-pair"], "same bucket"),
        (vec!["--worker-urls", "http://a:1", "--affinity-mode", "soft"], "strict"),
        (vec!["--worker-urls", "http://a:1", "--filter", "prefix_cache"], "cache_aware"),
    ] {
        let (code, _, stderr) = run(&args);
        assert_ne!(code, 0, "{args:?} must fail");
        assert!(stderr.contains(replacement), "{args:?}: {stderr}");
    }
}

#[test]
fn check_config_accepts_https_engines_and_refuses_credentials_in_urls() {
    let https = VALID.replace("http://127.0.0.1:30001", "https://127.0.0.1:30001");
    let file = TempPath::write("router.yaml", &https);
    let (code, _, stderr) = run(&["check-config", &file.display()]);
    assert_eq!(code, 0, "{stderr}");

    let with_user = VALID.replace("http://127.0.0.1:30001", "https://user:pw@127.0.0.1:30001");
    let file = TempPath::write("router.yaml", &with_user);
    let (code, _, stderr) = run(&["check-config", &file.display()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("models[0].workers[1]"), "{stderr}");
    assert!(!stderr.contains("pw@"), "the password was echoed: {stderr}");
}

#[test]
fn a_quick_start_flag_beside_a_file_or_the_demo_is_an_error_naming_it() {
    let file = TempPath::write("router.yaml", VALID);
    for (args, flag) in [
        (vec!["--config", &file.display(), "--policy", "cache_aware"], "--policy"),
        (vec!["--config", &file.display(), "--max-in-flight", "8"], "--max-in-flight"),
        (vec!["--config", &file.display(), "--filter", "overloaded"], "--filter"),
        (vec!["--config", &file.display(), "--policy-arg", "min_load_choices=3"], "--policy-arg"),
        (vec!["--config", &file.display(), "--tokenizer", "t.json"], "--tokenizer"),
        (vec!["--config", &file.display(), "--model", "llama"], "--model"),
        (vec!["--config", &file.display(), "--worker-urls", "http://127.0.0.1:9"], "--worker-urls"),
        (vec!["--demo", "--policy", "round_robin"], "--policy"),
        (vec!["--demo", "--max-in-flight", "8"], "--max-in-flight"),
        (
            vec!["--worker-urls", "http://127.0.0.1:9", "--decode-policy", "random"],
            "--decode-policy",
        ),
        (vec!["--port", "0", "check-config", &file.display()], "--port"),
    ] {
        let (code, _, stderr) = run(&args);
        assert_eq!(code, 2, "{args:?} must be refused: {stderr}");
        assert!(stderr.contains(&format!("error: {flag} ")), "{args:?} names {flag}: {stderr}");
    }
}

#[test]
fn cache_aware_groups_that_can_see_nothing_are_errors_with_the_path() {
    // The prefill group of bucket 1 runs cache_aware over P1.
    let second = r#"
      - id: long-context
        limits: {min: 4097}
        groups:
          pd:
            prefill: {worker_ids: [P1], policy: {type: cache_aware}}
            decode: {worker_ids: [D1]}
"#;
    let path = "models[0].buckets[1].groups.pd.prefill.policy";
    let p1 = r#"{id: P1, url: "http://127.0.0.1:30000", role: prefill, bootstrap_port: 8998"#;
    for (worker, problem) in [
        // KV events carry token ids, and the model has no tokenizer.
        (
            r#", kv_events: {endpoint: "tcp://127.0.0.1:5557"}}"#,
            "cache_aware looks up the token ids of requests in the engines' KV events",
        ),
        // A block size without events feeds no local index.
        (", block_size: 16}", "a block size alone feeds nothing"),
    ] {
        let yaml = format!("{}{second}", VALID.trim_end()).replacen(
            &format!("{p1}}}"),
            &format!("{p1}{worker}"),
            1,
        );
        let file = TempPath::write("router.yaml", &yaml);
        let (code, _, stderr) = run(&["check-config", &file.display()]);
        assert_eq!(code, 1, "{stderr}");
        assert!(stderr.contains(&format!("{path}: ")), "{stderr}");
        assert!(stderr.contains(problem), "{problem}: {stderr}");
    }
    // Neither: the router pictures P1 from its own dispatches (approximate mode).
    let file = TempPath::write("router.yaml", &format!("{}{second}", VALID.trim_end()));
    let (code, _, stderr) = run(&["check-config", &file.display()]);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn the_architecture_example_validates() {
    let example = r#"
server:
  host: 127.0.0.1
  port: 8080
  admin_token: "s3cret"
  max_body_bytes: 33554432
models:
  - id: llama
    tokenizer: TOKENIZER
    affinity: {session_id_header: x-session-id, routing_key_header: x-routing-key}
    workers:
      - id: P1
        url: http://10.0.0.1:30000
        role: prefill
        bootstrap_port: 8998
        kv_events: {endpoint: "tcp://10.0.0.1:5557", replay_endpoint: "tcp://10.0.0.1:5558", block_size: 16}
        load_reporter: "10.0.0.1:50051"
      - {id: D1, url: "http://10.0.0.2:30000", role: decode}
    buckets:
      - id: short-context
        rank: 10
        limits: {min: 0, max: 4096}
        max_context_tokens: 8192
        groups:
          pd:
            prefill:
              worker_ids: [P1]
              policy: {type: cache_aware, admission: {max_running_requests: 64}}
            decode:
              worker_ids: [D1]
              policy: {type: power_of_two}
"#;
    // The example's `tokenizer.json`, as a file that exists here.
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let file = TempPath::write("router.yaml", &example.replace("TOKENIZER", &tokenizer));
    let (code, stdout, stderr) = run(&["check-config", &file.display()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("cache_aware"), "{stdout}");
}

#[test]
fn a_second_router_on_the_same_port_fails_instead_of_sharing_it() {
    // The first router's listeners use SO_REUSEPORT; a second router of the same user could
    // join them and take half the connections, unless it checks first.
    let first = router_e2e::Router::with_args(&[
        "--worker-urls".to_owned(),
        "http://127.0.0.1:9".to_owned(),
        "--port".to_owned(),
        "0".to_owned(),
        "--worker-threads".to_owned(),
        "2".to_owned(),
    ]);
    let port = first.url.rsplit(':').next().expect("port").to_owned();
    let (code, _, stderr) =
        run(&["--worker-urls", "http://127.0.0.1:9", "--port", &port, "--worker-threads", "2"]);
    assert_ne!(code, 0, "a second router started on port {port}: {stderr}");
    assert!(stderr.contains("listening on 127.0.0.1:"), "{stderr}");
}

#[test]
fn check_config_warns_of_prefill_engines_without_a_partner_and_names_a_bad_label() {
    let paired = VALID
        .replace(
            "role: prefill, bootstrap_port: 8998}",
            "role: prefill, bootstrap_port: 8998, labels: {rack: r1}}",
        )
        .replace("role: decode}", "role: decode, labels: {rack: r2}}")
        .replace("          pd:\n", "          pd:\n            pair_on: [rack]\n");
    let file = TempPath::write("router.yaml", &paired);
    let (code, stdout, stderr) = run(&["check-config", &file.display()]);
    assert_eq!(code, 0, "a warning is no error: {stderr}");
    assert!(stdout.contains("pair_on [rack]"), "{stdout}");
    assert!(
        stdout.contains(
            "warning: bucket short-context: prefill engine P1 has no decode engine with the same \
             pair_on labels, so it is never selected there"
        ),
        "{stdout}"
    );

    let numeric = paired.replace("labels: {rack: r2}", "labels: {rack: r2, tp: 8}");
    let file = TempPath::write("router.yaml", &numeric);
    let (code, _, stderr) = run(&["check-config", &file.display()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(
            "models[0].workers[1].labels.tp: invalid type: integer `8`, expected a string"
        ),
        "{stderr}"
    );
}
