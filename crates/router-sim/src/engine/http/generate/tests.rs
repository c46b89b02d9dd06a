//! The request table of `/generate`: text or ids, single or batched, sampling parameters,
//! request ids and rooms, and which field each refused body names.

use http::StatusCode;
use serde_json::{Value, json};

use super::*;
use crate::engine::http::generation::{Bootstrap, Input};

fn rid() -> String {
    "fresh".to_owned()
}

fn parsed(body: Value) -> Result<(Request, Answer), ApiError> {
    parse(body.to_string().as_bytes(), 256, rid)
}

fn text(s: &str, max_tokens: Option<u64>) -> Prompt {
    Prompt { input: Input::Text(s.to_owned()), max_tokens }
}

fn ids(ids: &[u32], max_tokens: Option<u64>) -> Prompt {
    Prompt { input: Input::Ids(ids.to_vec()), max_tokens }
}

fn answer(stream: bool, batch: bool, rids: &[&str]) -> Answer {
    Answer { stream, batch, rids: rids.iter().map(|r| (*r).to_owned()).collect() }
}

#[test]
fn bodies_become_prompts_limits_and_ids() {
    let cases: Vec<(Value, Request, Answer)> = vec![
        (
            json!({"text": "hi"}),
            Request::new(vec![text("hi", None)], None),
            answer(false, false, &["fresh"]),
        ),
        (
            json!({"text": "hi", "rid": "r", "stream": true,
                "sampling_params": {"max_new_tokens": 4, "temperature": 0, "stop": ["x"], "custom": 1}}),
            Request::new(vec![text("hi", Some(4))], None),
            answer(true, false, &["r"]),
        ),
        (
            json!({"input_ids": [1, 2], "return_logprob": true, "sampling_params": null}),
            Request::new(vec![ids(&[1, 2], None)], None),
            answer(false, false, &["fresh"]),
        ),
        (
            json!({"text": ["a", "b"], "rid": "r", "sampling_params": {"max_new_tokens": 2}}),
            Request::new(vec![text("a", Some(2)), text("b", Some(2))], None),
            answer(false, true, &["r_0", "r_1"]),
        ),
        (
            json!({"input_ids": [[1], [2]], "rid": ["x", "y"], "return_logprob": [true, false],
                "sampling_params": [{"max_new_tokens": 1}, {}]}),
            Request::new(vec![ids(&[1], Some(1)), ids(&[2], None)], None),
            answer(false, true, &["x", "y"]),
        ),
        (
            json!({"text": ["a", "b"], "bootstrap_host": "h", "bootstrap_port": 7, "bootstrap_room": [5, 3]}),
            Request::new(
                vec![text("a", None), text("b", None)],
                Some(Bootstrap { host: "h".into(), port: 7, rooms: vec![5, 3] }),
            ),
            answer(false, true, &["fresh", "fresh"]),
        ),
        (
            json!({"text": "a", "bootstrap_host": "h", "bootstrap_port": 7, "bootstrap_room": 9}),
            Request::new(
                vec![text("a", None)],
                Some(Bootstrap { host: "h".into(), port: 7, rooms: vec![9] }),
            ),
            answer(false, false, &["fresh"]),
        ),
    ];
    for (body, request, answer) in cases {
        assert_eq!(parsed(body.clone()).expect("valid"), (request, answer), "{body}");
    }
}

#[test]
fn bad_bodies_name_their_field() {
    let cases: Vec<(Value, &str)> = vec![
        (json!({}), "give exactly one of text and input_ids"),
        (json!({"text": "a", "input_ids": [1]}), "give exactly one of text and input_ids"),
        (json!({"input_ids": []}), "input_ids must not be empty"),
        (json!({"input_ids": [[1], []]}), "input_ids[1] must not be empty"),
        (json!({"input_ids": [1, 256]}), "input_ids[1] = 256 is out of the vocabulary"),
        (json!({"input_ids": "a"}), "input_ids must be a list of token ids"),
        (json!({"text": []}), "text must not be empty"),
        (json!({"text": [1]}), "text must be a string or a list of strings"),
        (json!({"text": ["a", 1]}), "text mixes types"),
        (
            json!({"text": "a", "sampling_params": {"max_new_tokens": 0}}),
            "sampling_params.max_new_tokens must be an integer of at least 1",
        ),
        (
            json!({"text": "a", "sampling_params": {"max_new_tokens": "4"}}),
            "sampling_params.max_new_tokens must be an integer",
        ),
        (
            json!({"text": ["a", "b"], "sampling_params": [{}, {"max_new_tokens": 0}]}),
            "sampling_params[1].max_new_tokens must be",
        ),
        (
            json!({"text": ["a", "b"], "sampling_params": [{}]}),
            "sampling_params lists 1 objects for 2 prompts",
        ),
        (json!({"text": "a", "sampling_params": [{}]}), "sampling_params must be an object"),
        (
            json!({"text": "a", "sampling_params": {"temperature": -1}}),
            "sampling_params.temperature must be at least 0",
        ),
        (
            json!({"text": "a", "sampling_params": {"temperature": "hot"}}),
            "sampling_params.temperature must be a number",
        ),
        (
            json!({"text": "a", "sampling_params": {"top_p": 0}}),
            "sampling_params.top_p must be in (0, 1]",
        ),
        (
            json!({"text": "a", "sampling_params": {"min_p": 2}}),
            "sampling_params.min_p must be in [0, 1]",
        ),
        (json!({"text": "a", "sampling_params": {"top_k": 0}}), "sampling_params.top_k must be -1"),
        (
            json!({"text": "a", "sampling_params": {"n": 2}}),
            "sampling_params.n > 1 (parallel sampling) is not supported",
        ),
        (json!({"text": "a", "stream": 1}), "stream must be a boolean"),
        (json!({"text": "a", "rid": ["x"]}), "rid must be a string for a single prompt"),
        (json!({"text": ["a", "b"], "rid": ["x"]}), "rid lists 1 ids for 2 prompts"),
        (json!({"text": ["a", "b"], "rid": ["x", "x"]}), "rid \"x\" is given twice"),
        (json!({"text": ["a", "b"], "rid": [1, 2]}), "rid must be a string or a list of strings"),
        (json!({"text": "a", "return_logprob": "yes"}), "return_logprob must be a boolean"),
        (json!({"text": "a", "bootstrap_room": 1}), "go together"),
        (
            json!({"text": ["a", "b", "c"], "bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": [1, 2]}),
            "bootstrap_room lists 2 rooms for 3 runs",
        ),
    ];
    for (body, message) in cases {
        let error = parsed(body.clone()).expect_err("refused");
        assert_eq!(error.status, StatusCode::BAD_REQUEST, "{body}");
        assert!(error.message.contains(message), "{body}: {:?} lacks {message:?}", error.message);
    }
}
