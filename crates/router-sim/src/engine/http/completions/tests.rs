//! The request table of `/v1/completions`: what each body becomes (prompts, choices, limits,
//! rooms, answer options) and which field each refused body names.

use http::StatusCode;
use serde_json::{Value, json};

use super::*;
use crate::engine::http::generation::Bootstrap;

fn parsed(body: Value) -> Result<(Request, Answer), ApiError> {
    parse(body.to_string().as_bytes(), "m", 256)
}

fn text(s: &str, max_tokens: Option<u64>) -> Prompt {
    Prompt { input: Input::Text(s.to_owned()), max_tokens }
}

fn ids(ids: &[u32], max_tokens: Option<u64>) -> Prompt {
    Prompt { input: Input::Ids(ids.to_vec()), max_tokens }
}

const PLAIN: Answer = Answer { stream: false, include_usage: false, echo: false };

#[test]
fn bodies_become_prompts_choices_and_options() {
    let cases: Vec<(Value, Request, Answer)> = vec![
        (json!({"prompt": "hi"}), Request::new(vec![text("hi", None)], None), PLAIN),
        (
            json!({"model": "m", "prompt": ["a", "b"], "max_tokens": 3, "n": 2}),
            Request {
                prompts: vec![text("a", Some(3)), text("b", Some(3))],
                n: 2,
                bootstrap: None,
                rank: None,
            },
            PLAIN,
        ),
        (
            json!({"prompt": [1, 2], "max_tokens": null, "echo": true, "stream": true}),
            Request::new(vec![ids(&[1, 2], None)], None),
            Answer { stream: true, include_usage: false, echo: true },
        ),
        (
            json!({"prompt": [[1], [2]], "stream": true, "stream_options": {"include_usage": true}}),
            Request::new(vec![ids(&[1], None), ids(&[2], None)], None),
            Answer { stream: true, include_usage: true, echo: false },
        ),
        (
            // Fields this engine does not model are accepted.
            json!({"prompt": "x", "temperature": 0.2, "logprobs": 2, "suffix": "s", "user": "u"}),
            Request::new(vec![text("x", None)], None),
            PLAIN,
        ),
        (
            json!({"prompt": "x", "data_parallel_rank": 3}),
            Request { rank: Some(3), ..Request::new(vec![text("x", None)], None) },
            PLAIN,
        ),
        (
            json!({"prompt": ["a", "b"], "n": 2, "bootstrap_host": "h", "bootstrap_port": 8,
                "bootstrap_room": 10}),
            Request {
                prompts: vec![text("a", None), text("b", None)],
                n: 2,
                bootstrap: Some(Bootstrap {
                    host: "h".into(),
                    port: 8,
                    rooms: vec![10, 11, 12, 13],
                }),
                rank: None,
            },
            PLAIN,
        ),
    ];
    for (body, request, answer) in cases {
        assert_eq!(parsed(body.clone()).expect("valid"), (request, answer), "{body}");
    }
}

#[test]
fn bad_bodies_name_their_field() {
    let cases: Vec<(&str, StatusCode, &str)> = vec![
        ("{", StatusCode::BAD_REQUEST, "invalid request body"),
        ("[]", StatusCode::BAD_REQUEST, "invalid request body: not a JSON object"),
        (r#"{"max_tokens": 2}"#, StatusCode::BAD_REQUEST, "prompt is required"),
        (r#"{"prompt": null}"#, StatusCode::BAD_REQUEST, "prompt is required"),
        (r#"{"prompt": []}"#, StatusCode::BAD_REQUEST, "prompt must not be empty"),
        (r#"{"prompt": ["a", [1]]}"#, StatusCode::BAD_REQUEST, "prompt mixes types"),
        (
            r#"{"prompt": [1, 999]}"#,
            StatusCode::BAD_REQUEST,
            "prompt[1] = 999 is out of the vocabulary",
        ),
        (
            r#"{"prompt": "x", "max_tokens": 0}"#,
            StatusCode::BAD_REQUEST,
            "max_tokens must be an integer of at least 1",
        ),
        (
            r#"{"prompt": "x", "max_tokens": "3"}"#,
            StatusCode::BAD_REQUEST,
            "max_tokens must be an integer",
        ),
        (
            r#"{"prompt": "x", "n": 0}"#,
            StatusCode::BAD_REQUEST,
            "n must be an integer of at least 1",
        ),
        (r#"{"prompt": "x", "n": 2000}"#, StatusCode::BAD_REQUEST, "more than 1024 runs"),
        (
            r#"{"prompt": "x", "stream": "yes"}"#,
            StatusCode::BAD_REQUEST,
            "stream must be a boolean",
        ),
        (r#"{"prompt": "x", "echo": 1}"#, StatusCode::BAD_REQUEST, "echo must be a boolean"),
        (
            r#"{"prompt": "x", "stream_options": 1}"#,
            StatusCode::BAD_REQUEST,
            "stream_options must be an object",
        ),
        (
            r#"{"prompt": "x", "stream_options": {"include_usage": "y"}}"#,
            StatusCode::BAD_REQUEST,
            "stream_options.include_usage must be a boolean",
        ),
        (r#"{"prompt": "x", "bootstrap_room": 1}"#, StatusCode::BAD_REQUEST, "go together"),
        (
            r#"{"prompt": ["a", "b"], "bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": [1]}"#,
            StatusCode::BAD_REQUEST,
            "bootstrap_room lists 1 rooms for 2 runs",
        ),
        (
            r#"{"prompt": "x", "model": "other"}"#,
            StatusCode::NOT_FOUND,
            "\"other\" is not served here",
        ),
        (r#"{"prompt": "x", "model": 3}"#, StatusCode::BAD_REQUEST, "model must be a string"),
    ];
    for (body, status, message) in cases {
        let error = parse(body.as_bytes(), "m", 256).expect_err("refused");
        assert_eq!(error.status, status, "{body}");
        assert!(error.message.contains(message), "{body}: {:?} lacks {message:?}", error.message);
    }
}
