//! The field readers: prompt forms and their refusals, bootstrap rooms per run, the run bound.

use serde_json::{Value, json};

use super::*;

fn text(s: &str) -> Input {
    Input::Text(s.to_owned())
}

fn ids(ids: &[u32]) -> Input {
    Input::Ids(ids.to_vec())
}

#[test]
fn prompts_take_every_form_a_field_allows() {
    let cases: Vec<(Value, Forms, Vec<Input>, bool)> = vec![
        (json!("hi"), Forms::Any, vec![text("hi")], false),
        (json!(["a", "b"]), Forms::Any, vec![text("a"), text("b")], true),
        (json!([1, 2, 255]), Forms::Any, vec![ids(&[1, 2, 255])], false),
        (json!([[1], [2, 3]]), Forms::Any, vec![ids(&[1]), ids(&[2, 3])], true),
        (json!("hi"), Forms::Text, vec![text("hi")], false),
        (json!(["a"]), Forms::Text, vec![text("a")], true),
        (json!([7]), Forms::Ids, vec![ids(&[7])], false),
        (json!([[7]]), Forms::Ids, vec![ids(&[7])], true),
    ];
    for (value, forms, inputs, batch) in cases {
        let parsed = prompts(&value, "prompt", forms, 256).expect("valid prompt");
        assert_eq!(parsed, (inputs, batch), "{value}");
    }
}

#[test]
fn prompts_refuse_with_the_field_named() {
    let cases: Vec<(Value, Forms, &str)> = vec![
        (json!([]), Forms::Any, "prompt must not be empty"),
        (json!(""), Forms::Any, "prompt must not be empty"),
        (json!(["a", ""]), Forms::Any, "prompt[1] must not be empty"),
        (json!([[1], []]), Forms::Any, "prompt[1] must not be empty"),
        (json!(["a", 1]), Forms::Any, "prompt mixes types"),
        (json!([1, [2]]), Forms::Any, "prompt mixes types"),
        (json!([[1], "a"]), Forms::Any, "prompt mixes types"),
        (json!([1, 256]), Forms::Any, "prompt[1] = 256 is out of the vocabulary"),
        (json!([[1], [2, 300]]), Forms::Any, "prompt[1][1] = 300 is out of the vocabulary"),
        (json!([1, -1]), Forms::Any, "prompt[1] must be a token id"),
        (json!([1.5]), Forms::Any, "prompt[0] must be a token id"),
        (json!([[1, "a"]]), Forms::Any, "prompt[0][1] must be a token id"),
        (json!(5), Forms::Any, "prompt must be a string, a list of strings, a list of token ids"),
        (json!({}), Forms::Any, "prompt must be a string"),
        (json!([true]), Forms::Any, "prompt must be a string"),
        (json!([1, 2]), Forms::Text, "prompt must be a string or a list of strings"),
        (json!("hi"), Forms::Ids, "prompt must be a list of token ids"),
        (json!(["a"]), Forms::Ids, "prompt must be a list of token ids"),
    ];
    for (value, forms, message) in cases {
        let error = prompts(&value, "prompt", forms, 256).expect_err("refused");
        assert_eq!(error.status, http::StatusCode::BAD_REQUEST);
        assert!(error.message.contains(message), "{value}: {:?} lacks {message:?}", error.message);
    }
}

fn bootstrap_of(body: Value, runs: usize) -> Result<Option<Bootstrap>, ApiError> {
    let map = body.as_object().expect("object").clone();
    bootstrap(Fields::top(&map), runs)
}

#[test]
fn bootstrap_rooms_are_one_per_run() {
    let fields =
        |room: Value| json!({"bootstrap_host": "h", "bootstrap_port": 9, "bootstrap_room": room});
    let rooms = |room, runs| bootstrap_of(fields(room), runs).expect("valid").expect("some").rooms;
    assert_eq!(rooms(json!(7), 1), [7]);
    assert_eq!(rooms(json!(7), 3), [7, 8, 9], "a single room expands as SGLang does");
    assert_eq!(rooms(json!([4, 2]), 2), [4, 2]);
    assert_eq!(bootstrap_of(json!({}), 2).expect("valid"), None);
    let host = bootstrap_of(fields(json!(1)), 1).expect("valid").expect("some");
    assert_eq!((host.host.as_str(), host.port), ("h", 9));

    let refusals: Vec<(Value, usize, &str)> = vec![
        (fields(json!([1])), 2, "bootstrap_room lists 1 rooms for 2 runs"),
        (fields(json!("x")), 1, "bootstrap_room must be a room number"),
        (fields(json!([1, "x"])), 2, "bootstrap_room must be a room number"),
        (fields(json!(u64::MAX)), 2, "bootstrap_room must be a room number"),
        (json!({"bootstrap_room": 1}), 1, "go together"),
        (json!({"bootstrap_host": "h", "bootstrap_port": 1}), 1, "go together"),
        (
            json!({"bootstrap_host": 1, "bootstrap_port": 1, "bootstrap_room": 1}),
            1,
            "bootstrap_host must be a string",
        ),
        (
            json!({"bootstrap_host": "h", "bootstrap_port": 70000, "bootstrap_room": 1}),
            1,
            "bootstrap_port must be a port number",
        ),
    ];
    for (body, runs, message) in refusals {
        let error = bootstrap_of(body.clone(), runs).expect_err("refused");
        assert!(error.message.contains(message), "{body}: {:?} lacks {message:?}", error.message);
    }
}

#[test]
fn runs_are_bounded_and_limits_at_least_one() {
    assert_eq!(runs(3, 2).expect("fits"), 6);
    assert!(runs(2, MAX_RUNS).is_err());
    assert!(runs(1, u64::MAX).is_err());
    let map =
        json!({"a": 0, "b": 3, "c": null, "d": "x", "e": -2}).as_object().expect("object").clone();
    let fields = Fields::top(&map);
    assert_eq!(fields.limit("b").expect("valid"), Some(3));
    assert_eq!(fields.limit("c").expect("null is absent"), None);
    assert_eq!(fields.limit("missing").expect("absent"), None);
    for name in ["a", "d", "e"] {
        let error = fields.limit(name).expect_err("refused");
        assert_eq!(error.message, format!("{name} must be an integer of at least 1"));
    }
}
