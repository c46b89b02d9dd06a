//! Every problem of a file, at its place.

use super::*;

const FILE: &str = r#"server:
  port: "eighty"
models:
  - id: llama
    tokenizer: 7
    workers:
      - {id: w1, url: "http://127.0.0.1:1", dp_size: many}
      - id: w2
        url: "http://127.0.0.1:2"
        colour: blue
    buckets:
      - {id: a, rank: high}
kv: {approximate_ttl_secs: -1}
colours: {}
"#;

#[test]
fn every_type_error_of_a_file_is_found_at_its_place() {
    let located = read(FILE).expect_err("six problems");
    let found: Vec<(usize, usize, &str)> =
        located.iter().map(|l| (l.line, l.column, l.problem.path.as_str())).collect();
    assert_eq!(
        found,
        [
            (2, 3, "server.port"),
            (5, 5, "models[0].tokenizer"),
            (7, 45, "models[0].workers[0].dp_size"),
            (10, 9, "models[0].workers[1].colour"),
            (12, 17, "models[0].buckets[0].rank"),
            (13, 6, "kv.approximate_ttl_secs"),
            (14, 1, "colours"),
        ],
        "{located:#?}"
    );
    assert!(located[3].problem.message.contains("colour"), "{located:#?}");
}

#[test]
fn a_syntax_error_is_at_its_own_place() {
    let located = read("models:\n  - id: [a\n").expect_err("unclosed");
    assert_eq!(located.len(), 1);
    assert_eq!(located[0].line, 3, "{located:?}");
}

#[test]
fn a_path_left_to_its_default_is_placed_at_its_nearest_enclosing_key() {
    let positions = Positions::of(FILE);
    assert_eq!(positions.find("models[0].buckets[0].groups.plain.policy"), (12, 9));
    assert_eq!(positions.find("models[0].workers[1].url"), (9, 9));
    assert_eq!(positions.find("telemetry.otlp_endpoint"), (1, 1), "nothing of it in the file");
}
