//! Renders every conversation of `testdata/goldens.json` with every template under
//! `testdata/templates/` and compares with what transformers rendered (`testdata/generate.py`):
//! the exact text, or the same `raise_exception` message, or an error where transformers failed.

use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use router_chat_template::{ChatTemplate, Conversation, TemplateError};
use serde_json::Value;

/// Cases where transformers fails and we render, each with the reason. Jinja2 raises on
/// `for x in none`; minijinja iterates none as an empty sequence, with no setting to change it.
/// Only error cases may be listed: such a request renders here and fails in the engine.
const RENDERS_WHERE_TRANSFORMERS_FAILS: [(&str, &str); 1] =
    [("llama-3.2-11b-vision-instruct", "tool_call_null_content")];

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata")
}

fn conversation(input: &Value) -> Conversation {
    let mut conversation = Conversation::new(&input["messages"])
        .add_generation_prompt(input["add_generation_prompt"].as_bool().expect("a bool"));
    if let Some(tools) = input.get("tools") {
        conversation = conversation.tools(tools);
    }
    if let Some(Value::Object(kwargs)) = input.get("kwargs") {
        for (name, value) in kwargs {
            conversation = conversation.kwarg(name.clone(), value);
        }
    }
    conversation
}

#[test]
fn renders_match_transformers() {
    let text = std::fs::read_to_string(testdata().join("goldens.json")).expect("goldens.json");
    let goldens: Value = serde_json::from_str(&text).expect("json");
    let now = UNIX_EPOCH + Duration::from_secs(goldens["now_unix"].as_u64().expect("now_unix"));
    let conversations = goldens["conversations"].as_object().expect("conversations");
    let renders = goldens["renders"].as_object().expect("renders");

    let mut on_disk: Vec<String> = std::fs::read_dir(testdata().join("templates"))
        .expect("templates")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| !name.ends_with(".md"))
        .collect();
    on_disk.sort();
    let mut rendered: Vec<String> = renders.keys().cloned().collect();
    rendered.sort();
    assert_eq!(on_disk, rendered, "every template has goldens: run testdata/generate.py");

    let mut failures = Vec::new();
    let mut checked = 0;
    let mut known = 0;
    for (template_name, cases) in renders {
        let template = ChatTemplate::from_dir(&testdata().join("templates").join(template_name))
            .unwrap_or_else(|err| panic!("{template_name}: {err:?}"))
            .with_clock(move || now);
        for (case, expected) in cases.as_object().expect("cases") {
            checked += 1;
            let got = template.render_conversation(&conversation(&conversations[case]));
            let what = format!("{template_name} / {case}");
            match (expected.get("text").and_then(Value::as_str), got) {
                (Some(want), Ok(got)) if want == got => {}
                (Some(want), Ok(got)) => failures.push(format!(
                    "{what}: text differs\n--- transformers\n{want}\n--- ours\n{got}"
                )),
                (Some(_), Err(err)) => failures.push(format!("{what}: failed: {:#}", chain(&err))),
                (None, Ok(_))
                    if RENDERS_WHERE_TRANSFORMERS_FAILS
                        .contains(&(template_name.as_str(), case.as_str())) =>
                {
                    known += 1;
                }
                (None, Ok(got)) => failures.push(format!(
                    "{what}: transformers failed ({}), we rendered\n{got}",
                    expected["message"]
                )),
                (None, Err(err)) => {
                    let raised = expected["raised"].as_bool().expect("raised");
                    match &err {
                        TemplateError::Raised { message, .. }
                            if raised && Some(message.as_str()) == expected["message"].as_str() => {
                        }
                        _ if !raised && !matches!(err, TemplateError::Raised { .. }) => {}
                        _ => failures.push(format!(
                            "{what}: transformers raised {expected}, we: {}",
                            chain(&err)
                        )),
                    }
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} cases");
    assert_eq!(
        known,
        RENDERS_WHERE_TRANSFORMERS_FAILS.len(),
        "a known divergence is gone: drop it"
    );
    assert!(
        failures.is_empty(),
        "{} of {checked} differ:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
