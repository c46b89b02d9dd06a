//! `POST /v1/completions` on a real engine: text, token-id and batched prompts, `n`, `echo`,
//! streaming with usage, cache hits on a repeated prompt, PD over a bootstrap room, and the
//! 400s that name the field at fault.

use http::StatusCode;
use serde_json::{Value, json};

use crate::common::*;

async fn complete(sim: &Sim, body: Value) -> Value {
    let reply = post(sim, "/v1/completions", &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", String::from_utf8_lossy(&reply.body));
    reply.json()
}

fn texts(body: &Value) -> Vec<String> {
    let choices = body["choices"].as_array().expect("choices");
    choices.iter().map(|c| c["text"].as_str().expect("text").to_owned()).collect()
}

#[tokio::test]
async fn string_ids_and_batched_prompts_are_text_completions() {
    let sim = Sim::start(&[]).await;
    let prompt = "Hello, completions!";
    let body = complete(&sim, json!({"model": "m", "prompt": prompt, "max_tokens": 5})).await;
    assert_eq!(body["object"], "text_completion");
    assert!(body["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")));
    assert_eq!(body["model"], "m");
    let choice = &body["choices"][0];
    assert_eq!(
        (choice["index"].as_u64(), choice["finish_reason"].as_str()),
        (Some(0), Some("length"))
    );
    assert_eq!(choice["logprobs"], Value::Null);
    assert_eq!(texts(&body)[0].len(), 5, "one byte per token");
    // Raw text: no chat template around the prompt.
    let usage = &body["usage"];
    assert_eq!(usage["prompt_tokens"], prompt.len() as u64);
    assert_eq!(usage["completion_tokens"], 5);
    assert_eq!(usage["total_tokens"], prompt.len() as u64 + 5);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);

    // The same prompt as token ids is the same prompt: the same answer.
    let by_ids = complete(&sim, json!({"prompt": byte_ids(prompt), "max_tokens": 5})).await;
    assert_eq!(texts(&by_ids), texts(&body));
    assert_eq!(by_ids["usage"]["prompt_tokens"], prompt.len() as u64);

    // The chat template's rendering as ids answers what chat answers.
    let chat_body = chat(&sim, &request("same answer", 7, false)).await.json();
    let rendered =
        complete(&sim, json!({"prompt": chatml_user("same answer"), "max_tokens": 7})).await;
    assert_eq!(texts(&rendered)[0], chat_body["choices"][0]["message"]["content"]);

    // Two prompts, two choices each: index = prompt × n + choice; prompts counted once.
    let (a, b) = ("The first prompt.", "And a second, longer prompt.");
    let batch = complete(&sim, json!({"prompt": [a, b], "n": 2, "max_tokens": 6})).await;
    let choices = batch["choices"].as_array().expect("choices");
    let indices: Vec<u64> = choices.iter().filter_map(|c| c["index"].as_u64()).collect();
    assert_eq!(indices, [0, 1, 2, 3]);
    let batch_texts = texts(&batch);
    assert!(batch_texts.iter().all(|t| t.len() == 6), "{batch_texts:?}");
    assert_ne!(batch_texts[0], batch_texts[1], "the choices of a prompt differ");
    assert_ne!(batch_texts[0], batch_texts[2], "so do the prompts");
    assert_eq!(batch["usage"]["prompt_tokens"], (a.len() + b.len()) as u64);
    assert_eq!(batch["usage"]["completion_tokens"], 24);
    // Lists of token ids are a batch too.
    let ids = complete(&sim, json!({"prompt": [byte_ids(a), byte_ids(b)], "max_tokens": 6})).await;
    assert_eq!(texts(&ids), [batch_texts[0].clone(), batch_texts[2].clone()]);

    // Without a limit the engine's default applies and the answer ends naturally.
    let default = complete(&sim, json!({"prompt": "no limit"})).await;
    assert_eq!(default["usage"]["completion_tokens"], 16);
    assert_eq!(default["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn echo_puts_the_prompt_before_the_answer() {
    let sim = Sim::start(&[]).await;
    let plain = complete(&sim, json!({"prompt": "Echo me: ", "max_tokens": 4})).await;
    let echoed =
        complete(&sim, json!({"prompt": "Echo me: ", "max_tokens": 4, "echo": true})).await;
    assert_eq!(texts(&echoed)[0], format!("Echo me: {}", texts(&plain)[0]));
    assert_eq!(echoed["usage"]["completion_tokens"], 4, "the echo is not output");
    // Token ids echo as their text.
    let ids =
        complete(&sim, json!({"prompt": byte_ids("Echo me: "), "max_tokens": 4, "echo": true}))
            .await;
    assert_eq!(texts(&ids), texts(&echoed));

    // Streamed, the prompt comes with each choice's first token.
    let body = json!({"prompt": ["one ", "two "], "max_tokens": 3, "echo": true, "stream": true});
    let events = post(&sim, "/v1/completions", &body).await.json_events();
    for (index, prompt) in [(0, "one "), (1, "two ")] {
        let mine: Vec<&Value> =
            events.iter().filter(|e| e["choices"][0]["index"] == index).collect();
        assert!(
            mine[0]["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| t.len() == prompt.len() + 1 && t.starts_with(prompt))
        );
    }
}

#[tokio::test]
async fn streamed_completions_send_chunks_a_finish_usage_and_done() {
    let sim = Sim::start(&[]).await;
    let prompt = "Stream a completion";
    let body = json!({"prompt": prompt, "max_tokens": 4, "stream": true,
        "stream_options": {"include_usage": true}});
    let reply = post(&sim, "/v1/completions", &body).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers["content-type"], "text/event-stream");
    let chunks = reply.json_events();
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    assert_eq!(chunks.len(), 4 + 1 + 1, "a chunk per token, the finish chunk, the usage chunk");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text.len(), 4);
    assert!(
        chunks[..4]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null() && c["usage"].is_null())
    );
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[4]["choices"][0]["text"], "");
    let usage = &chunks[5];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], prompt.len() as u64);
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    // Whole or streamed, the same text.
    let whole = complete(&sim, json!({"prompt": prompt, "max_tokens": 4})).await;
    assert_eq!(texts(&whole)[0], text);

    // A batch streams every choice, told apart by index; no usage chunk unless asked.
    let body = json!({"prompt": [[1, 2, 3], [4, 5, 6]], "n": 2, "max_tokens": 3, "stream": true});
    let chunks = post(&sim, "/v1/completions", &body).await.json_events();
    assert!(chunks.iter().all(|c| c.get("usage").is_none()), "{chunks:?}");
    for index in 0..4 {
        let mine: Vec<&Value> =
            chunks.iter().filter(|c| c["choices"][0]["index"] == index).collect();
        let text: String = mine.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
        assert_eq!((mine.len(), text.len()), (3 + 1, 3), "choice {index}");
        assert_eq!(mine[3]["choices"][0]["finish_reason"], "length");
    }
}

#[tokio::test]
async fn a_repeated_prompt_hits_the_cache() {
    let sim = Sim::start(&[]).await;
    let prompt = "A prompt long enough to fill several blocks of sixteen tokens, and then some.";
    let cached = |body: &Value| body["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
    let first = complete(&sim, json!({"prompt": prompt, "max_tokens": 2})).await;
    assert_eq!(cached(&first), 0);
    // Every full block but the one holding the last token is reused, text or ids alike.
    let expected = (prompt.len() as u64 - 1) / 16 * 16;
    let again = complete(&sim, json!({"prompt": prompt, "max_tokens": 2})).await;
    assert_eq!(cached(&again), expected);
    let by_ids = complete(&sim, json!({"prompt": byte_ids(prompt), "max_tokens": 2})).await;
    assert_eq!(cached(&by_ids), expected);
    // Streamed usage reports it too.
    let body = json!({"prompt": prompt, "max_tokens": 2, "stream": true,
        "stream_options": {"include_usage": true}});
    let chunks = post(&sim, "/v1/completions", &body).await.json_events();
    let usage = &chunks.last().expect("a usage chunk")["usage"];
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], expected);
}

#[tokio::test]
async fn prefill_and_decode_meet_on_the_rooms() {
    let prefill = Sim::start(&["--role", "prefill", "--bootstrap-port", "0"]).await;
    let decode = Sim::start(&["--role", "decode", "--bootstrap-timeout-ms", "5000"]).await;
    let port = prefill.port("bootstrap");
    let prompt = "A prompt the prefill engine computes and the decode engine continues.";
    let pd = |room: Value, prompts: Value| {
        json!({"prompt": prompts, "max_tokens": 6, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": port, "bootstrap_room": room})
    };
    for (room, expect_cached) in [(21u64, false), (22, true)] {
        let body = pd(json!(room), json!(prompt));
        let (d, p) = tokio::join!(complete(&decode, body.clone()), async {
            tokio::task::yield_now().await;
            complete(&prefill, body.clone()).await
        });
        assert_eq!(p["usage"]["completion_tokens"], 1, "the prefill side answers one token");
        assert_eq!(d["usage"]["completion_tokens"], 6);
        assert_eq!(d["usage"]["prompt_tokens"], p["usage"]["prompt_tokens"]);
        assert_eq!(d["usage"]["prompt_tokens_details"], p["usage"]["prompt_tokens_details"]);
        let cached = d["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached");
        assert_eq!(cached > 0, expect_cached, "room {room}: cached {cached}");
    }
    // A batch takes one room per prompt: 30 and 31 from a single room number.
    let body = pd(json!(30), json!([prompt, "another prompt"]));
    let (d, p) = tokio::join!(complete(&decode, body.clone()), complete(&prefill, body.clone()));
    assert_eq!(p["usage"]["completion_tokens"], 2);
    assert_eq!(d["usage"]["completion_tokens"], 12);
    assert_eq!(texts(&d).len(), 2);
    // A decode engine without the bootstrap fields refuses.
    let reply = post(&decode, "/v1/completions", &json!({"prompt": "x"})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(reply.error_message().contains("a decode engine needs bootstrap_host"));
}

#[tokio::test]
async fn bad_completions_are_400s_naming_the_field() {
    let tokenizer = router_sim::assets::tokenizer_path();
    let sim = Sim::start(&["--tokenizer", tokenizer.to_str().expect("utf-8 path")]).await;
    let cases = [
        (json!({"prompt": ["text", [1, 2]]}), "prompt mixes types"),
        (json!({"prompt": []}), "prompt must not be empty"),
        (json!({"prompt": [[1], []]}), "prompt[1] must not be empty"),
        (json!({"prompt": [104, 105, 256]}), "prompt[2] = 256 is out of the vocabulary"),
        (json!({"prompt": "x", "max_tokens": 0}), "max_tokens must be an integer of at least 1"),
        (json!({"prompt": "x", "n": 0}), "n must be an integer of at least 1"),
        (json!({"max_tokens": 3}), "prompt is required"),
        (json!({"prompt": "x", "bootstrap_room": 3}), "go together"),
    ];
    for (body, message) in cases {
        let reply = post(&sim, "/v1/completions", &body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(reply.json()["error"]["code"], 400);
        assert!(reply.error_message().contains(message), "{body}: {}", reply.error_message());
    }
    let reply = post(&sim, "/v1/completions", &json!({"model": "other", "prompt": "x"})).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    // A prompt beyond the KV capacity is refused whole.
    let small = Sim::start(&["--kv-capacity-tokens", "64"]).await;
    let reply = post(&small, "/v1/completions", &json!({"prompt": ["ok", "x".repeat(100)]})).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(reply.error_message().contains("does not fit the kv capacity"));
}
