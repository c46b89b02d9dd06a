//! `POST /generate` (SGLang's native API) on a real engine: text and token ids, single and
//! batched, SGLang's output object and stream framing, cache hits, PD rooms per batch item,
//! and the 400s that name the field at fault.

use http::StatusCode;
use serde_json::{Value, json};

use crate::common::*;

async fn generate(sim: &Sim, body: Value) -> Value {
    let reply = post(sim, "/generate", &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", String::from_utf8_lossy(&reply.body));
    reply.json()
}

fn text(output: &Value) -> String {
    output["text"].as_str().expect("text").to_owned()
}

#[tokio::test]
async fn text_and_ids_answer_sglang_outputs() {
    let sim = Sim::start(&[]).await;
    let prompt = "The capital of France is";
    let body = json!({"text": prompt, "rid": "req-1", "sampling_params": {"max_new_tokens": 5,
        "temperature": 0, "top_p": 0.9, "stop": ["\n"], "some_future_knob": true}});
    let out = generate(&sim, body).await;
    let meta = &out["meta_info"];
    assert_eq!(meta["id"], "req-1");
    assert_eq!(meta["finish_reason"], json!({"type": "length", "length": 5}));
    assert_eq!(meta["prompt_tokens"], prompt.len() as u64, "raw text, no chat template");
    assert_eq!(
        (meta["completion_tokens"].as_u64(), meta["cached_tokens"].as_u64()),
        (Some(5), Some(0))
    );
    assert!(meta["e2e_latency"].as_f64().is_some_and(|s| s > 0.0 && s < 10.0), "{meta}");
    assert_eq!(text(&out).len(), 5);
    assert_eq!(out["output_ids"], json!(byte_ids(&text(&out))), "ids and text agree");
    assert!(out.get("index").is_none());

    // The same bytes as input_ids are the same prompt; return_logprob is accepted.
    let by_ids = generate(
        &sim,
        json!({"input_ids": byte_ids(prompt), "return_logprob": true,
        "sampling_params": {"max_new_tokens": 5}}),
    )
    .await;
    assert_eq!(text(&by_ids), text(&out));
    assert_eq!(by_ids["meta_info"]["prompt_tokens"], prompt.len() as u64);
    assert!(by_ids["meta_info"]["id"].as_str().is_some_and(|id| id.len() == 32), "a fresh rid");
    // And /v1/completions answers the same for the same prompt.
    let completion =
        post(&sim, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 5})).await.json();
    assert_eq!(completion["choices"][0]["text"], text(&out));

    // Without max_new_tokens the engine's default applies and the answer ends naturally.
    let default = generate(&sim, json!({"text": "no limit"})).await;
    assert_eq!(default["meta_info"]["completion_tokens"], 16);
    assert_eq!(default["meta_info"]["finish_reason"]["type"], "stop");
}

#[tokio::test]
async fn a_batch_answers_a_list_in_order() {
    let sim = Sim::start(&[]).await;
    let body = json!({"text": ["first prompt", "second prompt"], "rid": "b",
        "sampling_params": [{"max_new_tokens": 2}, {"max_new_tokens": 7}]});
    let outs = generate(&sim, body).await;
    let outs = outs.as_array().expect("a list for a batch");
    assert_eq!(outs.len(), 2);
    let ids: Vec<&str> = outs.iter().filter_map(|o| o["meta_info"]["id"].as_str()).collect();
    assert_eq!(ids, ["b_0", "b_1"]);
    assert_eq!(outs[0]["meta_info"]["completion_tokens"], 2);
    assert_eq!(outs[1]["meta_info"]["completion_tokens"], 7);
    assert_eq!(outs[1]["meta_info"]["prompt_tokens"], "second prompt".len() as u64);

    let body = json!({"input_ids": [byte_ids("first prompt"), byte_ids("second prompt")],
        "rid": ["x", "y"], "sampling_params": {"max_new_tokens": 2}});
    let by_ids = generate(&sim, body).await;
    let by_ids = by_ids.as_array().expect("a list");
    assert_eq!(by_ids[0]["text"], outs[0]["text"]);
    assert_eq!(
        (by_ids[0]["meta_info"]["id"].as_str(), by_ids[1]["meta_info"]["id"].as_str()),
        (Some("x"), Some("y"))
    );
}

#[tokio::test]
async fn a_stream_sends_cumulative_outputs_then_done() {
    let sim = Sim::start(&[]).await;
    let body =
        json!({"text": "Stream it", "stream": true, "sampling_params": {"max_new_tokens": 4}});
    let reply = post(&sim, "/generate", &body).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers["content-type"], "text/event-stream");
    let events = reply.json_events();
    assert_eq!(events.len(), 4, "one event per token (stream interval 1)");
    for (i, event) in events.iter().enumerate() {
        assert_eq!(text(event).len(), i + 1, "the text is cumulative: {event}");
        assert_eq!(event["output_ids"].as_array().map(Vec::len), Some(i + 1));
        assert_eq!(event["meta_info"]["completion_tokens"], i as u64 + 1);
        assert!(event.get("index").is_none());
    }
    assert!(events[..3].iter().all(|e| e["meta_info"]["finish_reason"].is_null()));
    assert!(events[..3].iter().all(|e| e["meta_info"].get("e2e_latency").is_none()));
    let last = &events[3]["meta_info"];
    assert_eq!(last["finish_reason"], json!({"type": "length", "length": 4}));
    assert!(last["e2e_latency"].is_f64());
    let whole =
        generate(&sim, json!({"text": "Stream it", "sampling_params": {"max_new_tokens": 4}}))
            .await;
    assert_eq!(text(&whole), text(&events[3]));

    // A batch's events carry their prompt's index; with a stream interval they come in steps.
    let sim = Sim::start(&["--stream-interval", "3"]).await;
    let body = json!({"input_ids": [[1, 2, 3], [4, 5, 6]], "stream": true,
        "sampling_params": {"max_new_tokens": 7}});
    let events = post(&sim, "/generate", &body).await.json_events();
    for index in 0..2 {
        let mine: Vec<&Value> = events.iter().filter(|e| e["index"] == index).collect();
        let steps: Vec<u64> =
            mine.iter().filter_map(|e| e["meta_info"]["completion_tokens"].as_u64()).collect();
        assert_eq!(steps, [3, 6, 7], "prompt {index}");
        assert_eq!(mine[2]["meta_info"]["finish_reason"]["type"], "length");
    }
}

#[tokio::test]
async fn a_repeated_text_hits_the_cache() {
    let sim = Sim::start(&[]).await;
    let prompt = "A prompt long enough to fill several blocks of sixteen tokens, and then some.";
    let body = json!({"text": prompt, "sampling_params": {"max_new_tokens": 2}});
    assert_eq!(generate(&sim, body.clone()).await["meta_info"]["cached_tokens"], 0);
    let again = generate(&sim, body).await;
    assert_eq!(again["meta_info"]["cached_tokens"], (prompt.len() as u64 - 1) / 16 * 16);
    let streamed =
        json!({"text": prompt, "stream": true, "sampling_params": {"max_new_tokens": 2}});
    let events = post(&sim, "/generate", &streamed).await.json_events();
    assert_eq!(events[0]["meta_info"]["cached_tokens"], (prompt.len() as u64 - 1) / 16 * 16);
}

#[tokio::test]
async fn prefill_and_decode_meet_on_a_room_per_item() {
    let prefill = Sim::start(&["--role", "prefill", "--bootstrap-port", "0"]).await;
    let decode = Sim::start(&["--role", "decode", "--bootstrap-timeout-ms", "5000"]).await;
    let port = prefill.port("bootstrap");
    let prompts = ["A prompt for the first room, long enough for a block.", "and the second"];
    let body = json!({"text": prompts, "sampling_params": {"max_new_tokens": 5},
        "bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": [41, 40]});
    let (d, p) = tokio::join!(generate(&decode, body.clone()), async {
        tokio::task::yield_now().await;
        generate(&prefill, body.clone()).await
    });
    let (d, p) = (d.as_array().expect("list").clone(), p.as_array().expect("list").clone());
    for i in 0..2 {
        assert_eq!(p[i]["meta_info"]["completion_tokens"], 1, "the prefill side answers one token");
        assert_eq!(d[i]["meta_info"]["completion_tokens"], 5);
        assert_eq!(d[i]["meta_info"]["prompt_tokens"], prompts[i].len() as u64);
        assert_eq!(d[i]["meta_info"]["cached_tokens"], p[i]["meta_info"]["cached_tokens"]);
    }
    // The rooms were told apart: room 41 holds the first prompt, so a single prompt whose
    // room is 41 but whose text is the second one conflicts.
    let single = json!({"text": prompts[1], "bootstrap_host": "127.0.0.1", "bootstrap_port": port,
        "bootstrap_room": 41});
    let reply = post(&decode, "/generate", &single).await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{}", reply.error_message());
    // Without the bootstrap fields a decode engine refuses.
    let reply = post(&decode, "/generate", &json!({"text": "x"})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn bad_generate_requests_are_400s_naming_the_field() {
    let sim = Sim::start(&[]).await;
    let cases = [
        (json!({"text": "a", "input_ids": [1]}), "exactly one of text and input_ids"),
        (json!({"sampling_params": {}}), "exactly one of text and input_ids"),
        (json!({"input_ids": []}), "input_ids must not be empty"),
        (json!({"input_ids": [1, 256]}), "input_ids[1] = 256 is out of the vocabulary"),
        (json!({"text": ["a", [1]]}), "text mixes types"),
        (
            json!({"text": "a", "sampling_params": {"max_new_tokens": 0}}),
            "sampling_params.max_new_tokens must be an integer of at least 1",
        ),
        (
            json!({"text": "a", "sampling_params": {"temperature": -0.5}}),
            "sampling_params.temperature",
        ),
        (json!({"text": "a", "sampling_params": {"n": 3}}), "sampling_params.n > 1"),
        (json!({"text": ["a", "b"], "rid": ["same", "same"]}), "rid \"same\" is given twice"),
        (
            json!({"text": ["a", "b"], "bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": [1]}),
            "bootstrap_room lists 1 rooms for 2 runs",
        ),
    ];
    for (body, message) in cases {
        let reply = post(&sim, "/generate", &body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}");
        assert!(reply.error_message().contains(message), "{body}: {}", reply.error_message());
    }
}
