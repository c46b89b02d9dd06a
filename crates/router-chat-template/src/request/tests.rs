//! The engines' request rules on small templates that print what they receive; the real
//! templates against a real vLLM are in `tests/vllm_goldens.rs`.

use serde_json::{Map, Value as Json, json};

use super::*;
use crate::SpecialTokens;

/// Prints each message's role, its content as the template sees it (`tojson`, so a string and
/// a list differ), and every other field; then tools, documents and the generation prompt.
const PRINTING: &str = "{% for m in messages %}[{{ m.role }}]{{ m.content | tojson }}\
{% for k, v in m.items() %}{% if k not in ['role', 'content'] %} {{ k }}={{ v | tojson }}{% endif %}{% endfor %}{{ NL }}\
{% endfor %}{% if tools %}tools={{ tools | tojson }}{{ NL }}{% endif %}\
{% if documents %}documents={{ documents | tojson }}{{ NL }}{% endif %}\
{% if flavour is defined %}flavour={{ flavour }}{{ NL }}{% endif %}\
{% if add_generation_prompt %}[assistant]{% endif %}";

/// [`PRINTING`] with a loop over parts, which both engines read as "content is a list".
const ITERATING: &str = "{% for message in messages %}[{{ message.role }}]\
{% for part in message['content'] %}<{{ part.text }}>{% endfor %}{{ NL }}{% endfor %}";

/// Every template here prints a newline as `{{ NL }}` (a literal one after a tag is trimmed).
fn template(source: &str) -> ChatTemplate {
    let source = source.replace("{{ NL }}", "{{ '\\n' }}");
    ChatTemplate::new(&source, SpecialTokens::new().with("bos_token", "<s>")).expect("compiles")
}

fn body(value: Json) -> Map<String, Json> {
    value.as_object().expect("an object").clone()
}

/// Renders `value`, and checks that its members outside [`REQUEST_FIELDS`] change nothing.
fn render(source: &str, value: Json, rules: EngineRules) -> Result<RenderedPrompt, Unrenderable> {
    let template = template(source);
    let mut read = body(value.clone());
    read.retain(|key, _| REQUEST_FIELDS.contains(&key.as_str()));
    let rendered = template.render_request(&body(value), rules);
    let without = template.render_request(&read, rules);
    assert_eq!(
        rendered.as_ref().map_err(Unrenderable::reason),
        without.as_ref().map_err(Unrenderable::reason),
        "only the request fields count"
    );
    rendered
}

fn text(source: &str, value: Json, rules: EngineRules) -> String {
    render(source, value, rules).expect("renders").text
}

#[test]
fn text_parts_are_joined_as_each_engine_joins_them() {
    let request = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "one"}, "two", {"type": "input_text", "text": "three"},
        {"type": "text", "text": null}, {"type": "refusal", "refusal": "four"}]}]});
    assert_eq!(
        text(PRINTING, request.clone(), EngineRules::Vllm),
        "[user]\"one\\ntwo\\nthree\\nfour\"\n[assistant]"
    );
    assert_eq!(
        text(PRINTING, request, EngineRules::Sglang),
        "[user]\"one two three four\"\n[assistant]"
    );
}

#[test]
fn a_template_that_iterates_parts_gets_the_parts() {
    let request =
        json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}]});
    assert_eq!(text(ITERATING, request, EngineRules::Vllm), "[user]<a><b>\n");
    let plain = json!({"messages": [{"role": "user", "content": "just text"}]});
    assert_eq!(text(ITERATING, plain, EngineRules::Vllm), "[user]<just text>\n");
}

#[test]
fn null_content_renders_empty_and_tool_call_arguments_become_objects() {
    let request = json!({"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "refusal": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}},
            {"id": "c2", "type": "function", "function": {"name": "bad", "arguments": "not json"}},
            {"id": "c3", "type": "function", "function": {"name": "list", "arguments": "[1]"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]}]});
    let vllm = text(PRINTING, request.clone(), EngineRules::Vllm);
    assert!(vllm.contains("[assistant]\"\" tool_calls=[{\"id\": \"c1\""), "{vllm}");
    assert!(vllm.contains("\"arguments\": {\"city\": \"Paris\", \"days\": 2}"), "{vllm}");
    assert!(vllm.contains("\"name\": \"bad\", \"arguments\": {}"), "invalid JSON is {{}}: {vllm}");
    assert!(vllm.contains("\"name\": \"list\", \"arguments\": {}"), "a list is {{}}: {vllm}");
    assert!(!vllm.contains("refusal"), "vLLM rebuilds messages from known fields: {vllm}");
    assert!(vllm.contains("[tool]\"sunny\" tool_call_id=\"c1\""), "{vllm}");

    // SGLang keeps the client's fields without nulls and refuses arguments that are no object.
    let err = render(PRINTING, request, EngineRules::Sglang).expect_err("bad arguments");
    assert_eq!(err.reason(), "template_error");
    let request = json!({"messages": [
        {"role": "assistant", "content": null, "refusal": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{\"a\": 1}"}}]},
        {"role": "user", "content": "go on"}]});
    let sglang = text(PRINTING, request, EngineRules::Sglang);
    assert!(sglang.starts_with("[assistant]\"\" tool_calls="), "{sglang}");
    assert!(sglang.contains("\"arguments\": {\"a\": 1}"), "{sglang}");
    assert!(!sglang.contains("refusal"), "{sglang}");
}

#[test]
fn non_text_parts_cannot_be_rendered_exactly() {
    let request = json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]});
    for rules in [EngineRules::Vllm, EngineRules::Sglang] {
        let err = render(PRINTING, request.clone(), rules).expect_err("an image");
        assert!(
            matches!(&err, Unrenderable::NonTextPart { message: 1, kind } if kind == "image_url"),
            "{err:?}"
        );
        assert_eq!(err.reason(), "non_text_part");
    }
}

#[test]
fn the_generation_prompt_and_special_tokens_follow_the_request_under_vllm() {
    let messages = json!([{"role": "user", "content": "hi"}]);
    let vllm = |extra: Json| {
        let mut request = json!({"messages": messages});
        request.as_object_mut().expect("object").extend(body(extra));
        render(PRINTING, request, EngineRules::Vllm).expect("renders")
    };
    assert_eq!(vllm(json!({})).text, "[user]\"hi\"\n[assistant]");
    assert!(!vllm(json!({})).add_special_tokens);
    assert_eq!(vllm(json!({"add_generation_prompt": false})).text, "[user]\"hi\"\n");
    assert_eq!(vllm(json!({"add_generation_prompt": null})).text, "[user]\"hi\"\n[assistant]");
    assert!(vllm(json!({"add_special_tokens": true})).add_special_tokens);
    // The request's field wins over chat_template_kwargs.
    let both = json!({"add_generation_prompt": false,
        "chat_template_kwargs": {"add_generation_prompt": true}});
    assert_eq!(vllm(both).text, "[user]\"hi\"\n");

    // SGLang always adds the generation prompt.
    let request = json!({"messages": messages, "add_generation_prompt": false});
    assert_eq!(text(PRINTING, request, EngineRules::Sglang), "[user]\"hi\"\n[assistant]");
}

#[test]
fn chat_template_kwargs_reach_the_template_only_where_it_reads_them_under_vllm() {
    let request = json!({"messages": [{"role": "user", "content": "x"}],
        "chat_template_kwargs": {"flavour": "mint", "unread": 1}});
    let vllm = text(PRINTING, request.clone(), EngineRules::Vllm);
    assert!(vllm.contains("flavour=mint"), "{vllm}");
    let sglang = text(PRINTING, request, EngineRules::Sglang);
    assert!(sglang.contains("flavour=mint"), "{sglang}");

    let refused = json!({"messages": [{"role": "user", "content": "x"}],
        "chat_template_kwargs": {"tokenize": true}});
    assert!(matches!(render(PRINTING, refused, EngineRules::Vllm), Err(Unrenderable::Refused(_))));
}

#[test]
fn tools_and_documents_reach_the_template_as_vllm_dumps_them() {
    let request = json!({"messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}, "extra": 3}}],
        "documents": [{"title": "t", "text": "d"}]});
    let vllm = text(PRINTING, request, EngineRules::Vllm);
    assert!(
        vllm.contains(r#"tools=[{"type": "function", "function": {"name": "f", "description": null, "parameters": {"b": 1, "a": 2}}}]"#),
        "{vllm}"
    );
    assert!(vllm.contains(r#"documents=[{"title": "t", "text": "d"}]"#), "{vllm}");
}

#[test]
fn developer_messages_become_one_system_message_where_the_template_never_names_them() {
    let request = json!({"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "x"},
        {"role": "developer", "content": "use tools"}]});
    assert_eq!(
        text(PRINTING, request.clone(), EngineRules::Vllm),
        "[system]\"be brief\\n\\nuse tools\"\n[user]\"x\"\n[assistant]"
    );
    let naming = format!("{{# 'developer' #}}{PRINTING}");
    let kept = text(&naming, request, EngineRules::Vllm);
    assert!(kept.contains("[developer]\"use tools\" tools=null"), "{kept}");
}

#[test]
fn a_final_assistant_message_is_continued_as_each_engine_continues_it() {
    let source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}\
{% if add_generation_prompt %}<assistant>{% endif %}";
    let request = json!({"messages": [{"role": "user", "content": "count"},
        {"role": "assistant", "content": "one, two,"}],
        "continue_final_message": true, "add_generation_prompt": false});
    assert_eq!(
        text(source, request.clone(), EngineRules::Vllm),
        "<user>count</user><assistant>one, two,"
    );
    assert_eq!(
        text(source, request, EngineRules::Sglang),
        "<user>count</user><assistant>one, two,"
    );

    // vLLM refuses both at once (its default generation prompt included).
    let both = json!({"messages": [{"role": "user", "content": "x"},
        {"role": "assistant", "content": "y"}], "continue_final_message": true});
    assert!(matches!(render(source, both, EngineRules::Vllm), Err(Unrenderable::Refused(_))));

    // Without continuing, SGLang turns a final assistant message into a user message.
    let ending = json!({"messages": [{"role": "user", "content": "x"},
        {"role": "assistant", "content": "y"}]});
    assert_eq!(
        text(source, ending.clone(), EngineRules::Sglang),
        "<user>x</user><user>y</user><assistant>"
    );
    assert_eq!(
        text(source, ending, EngineRules::Vllm),
        "<user>x</user><assistant>y</assistant><assistant>"
    );
}

#[test]
fn a_trimmed_final_message_is_cut_where_its_text_ends() {
    let source =
        "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}";
    let request = json!({"messages": [{"role": "assistant", "content": "partial  "}],
        "continue_final_message": true, "add_generation_prompt": false});
    assert_eq!(text(source, request, EngineRules::Vllm), "<assistant>partial");
}

#[test]
fn claude_codes_billing_header_is_dropped_from_system_prompts_under_vllm() {
    let request = json!({"messages": [{"role": "system", "content": [
        {"type": "text", "text": "x-anthropic-billing-header: cch=123\nYou are Claude Code."},
        {"type": "text", "text": "x-anthropic-billing-header: cch=456"}]},
        {"role": "user", "content": "hi"}]});
    assert_eq!(
        text(PRINTING, request, EngineRules::Vllm),
        "[system]\"You are Claude Code.\"\n[user]\"hi\"\n[assistant]"
    );
}
