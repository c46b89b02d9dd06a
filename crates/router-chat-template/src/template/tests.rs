//! Loading (config string or list, `chat_template.jinja`, `additional_chat_templates/`), the
//! named-template choice, special tokens and errors; the renders themselves are checked
//! against transformers in `tests/goldens.rs`.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::*;
use crate::ConfigProblem;

const CHATML: &str = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n\
    {{ message['content'] | trim }}<|im_end|>\n{% endfor %}\
    {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn messages() -> Vec<serde_json::Value> {
    vec![
        json!({"role": "system", "content": " be brief "}),
        json!({"role": "user", "content": "héllo"}),
    ]
}

/// A fresh directory, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir()
            .join(format!("router-chat-template-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("temp dir");
        Self(path)
    }

    fn write(&self, file: &str, text: &str) -> PathBuf {
        let path = self.0.join(file);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
        std::fs::write(&path, text).expect("write");
        path
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn render_is_a_serving_engines_render() {
    let template = ChatTemplate::new(CHATML, SpecialTokens::new()).expect("compiles");
    let text = template.render(&messages(), None).expect("renders");
    assert_eq!(
        text,
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhéllo<|im_end|>\n\
         <|im_start|>assistant\n"
    );
    let with_null_tools = template.render(&messages(), Some(&serde_json::Value::Null));
    assert_eq!(with_null_tools.expect("renders"), text, "tools: null is no tools");
}

#[test]
fn python_methods_tojson_special_tokens_and_tools() {
    let source = "{{ bos_token }}{% for m in messages %}{{ m.content.strip().upper() }}|{% endfor %}\
        {{ tools | tojson }}|{{ eos_token is defined }}|{{ pad_token is defined }}";
    let special = SpecialTokens::new().with("bos_token", "<s>").with("eos_token", "</s>");
    let template = ChatTemplate::new(source, special).expect("compiles");
    let tools = json!([{"name": "f", "params": {"z": [1, 2], "ü": null, "a": "x<y"}}]);
    let text = template.render(&messages(), Some(&tools)).expect("renders");
    assert_eq!(
        text,
        r#"<s>BE BRIEF|HÉLLO|[{"name": "f", "params": {"z": [1, 2], "ü": null, "a": "x<y"}}]|True|False"#,
        "key order kept, no HTML escaping, unset tokens undefined"
    );
}

#[test]
fn raise_exception_is_a_typed_rejection() {
    let source =
        "{% if messages | length > 1 %}{{ raise_exception('roles must alternate') }}{% endif %}";
    let template = ChatTemplate::new(source, SpecialTokens::new()).expect("compiles");
    let err = template.render(&messages(), None).expect_err("raises");
    assert!(
        matches!(&err, TemplateError::Raised { message, .. } if message == "roles must alternate"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "the chat template rejects the conversation: roles must alternate");

    let broken =
        ChatTemplate::new("{{ messages[0].content + 1 }}", SpecialTokens::new()).expect("compiles");
    let err = broken.render(&messages(), None).expect_err("type error");
    assert!(matches!(&err, TemplateError::Render { name, .. } if name == DEFAULT), "{err:?}");
    assert!(std::error::Error::source(&err).is_some(), "the cause is kept as a source");

    let err = ChatTemplate::new("{% if %}", SpecialTokens::new()).expect_err("syntax");
    assert!(matches!(&err, TemplateError::Compile { name, .. } if name == DEFAULT), "{err:?}");
}

#[test]
fn named_templates_are_chosen_like_transformers() {
    let template = ChatTemplate::named(
        vec![
            ("tool_use".into(), "TOOLS".into()),
            ("default".into(), "{{ bos_token }}PLAIN".into()),
        ],
        SpecialTokens::new().with("bos_token", "<s>"),
    )
    .expect("compiles");
    assert_eq!(template.render(&messages(), None).expect("renders"), "<s>PLAIN");
    let tools = json!([{"name": "f"}]);
    assert_eq!(template.render(&messages(), Some(&tools)).expect("renders"), "TOOLS");
    assert_eq!(template.render(&messages(), Some(&json!([]))).expect("renders"), "TOOLS");

    let only_tools = ChatTemplate::named(
        vec![("tool_use".into(), "T".into()), ("rag".into(), "R".into())],
        SpecialTokens::new(),
    )
    .expect("compiles");
    assert_eq!(only_tools.render(&messages(), Some(&tools)).expect("renders"), "T");
    let err = only_tools.render(&messages(), None).expect_err("no default");
    assert!(
        matches!(&err, TemplateError::NoDefault { names } if names == &["rag", "tool_use"]),
        "{err:?}"
    );
}

#[test]
fn loads_the_list_form_and_special_tokens_from_tokenizer_config() {
    let dir = Dir::new("list");
    let config = dir.write(
        "tokenizer_config.json",
        &json!({
            "chat_template": [
                {"name": "default", "template": CHATML},
                {"name": "tool_use", "template": "tools: {{ tools | length }}"},
            ],
            "bos_token": {"__type": "AddedToken", "content": "<s>"},
            "eos_token": "</s>",
        })
        .to_string(),
    );
    let template = ChatTemplate::from_tokenizer_config(&config).expect("loads");
    assert_eq!(template.names(), ["default", "tool_use"]);
    assert_eq!(template.special_tokens().get("bos_token"), Some("<s>"));
    assert!(template.render(&messages(), None).expect("renders").ends_with("assistant\n"));
    assert_eq!(template.render(&messages(), Some(&json!([1, 2]))).expect("renders"), "tools: 2");
}

#[test]
fn chat_template_jinja_and_additional_templates_replace_the_config_ones() {
    let dir = Dir::new("jinja");
    dir.write(
        "tokenizer_config.json",
        &json!({"chat_template": "CONFIG", "eos_token": "</s>"}).to_string(),
    );
    assert_eq!(
        ChatTemplate::from_dir(dir.path())
            .expect("loads")
            .render(&messages(), None)
            .expect("renders"),
        "CONFIG"
    );

    dir.write("chat_template.jinja", "FILE {{ eos_token }}\n");
    let template = ChatTemplate::from_dir(dir.path()).expect("loads");
    assert_eq!(template.names(), ["default"]);
    assert_eq!(
        template.render(&messages(), None).expect("renders"),
        "FILE </s>",
        "one trailing newline dropped"
    );

    dir.write("additional_chat_templates/tool_use.jinja", "EXTRA TOOLS");
    let template = ChatTemplate::from_dir(dir.path()).expect("loads");
    assert_eq!(template.names(), ["default", "tool_use"]);
    assert_eq!(template.render(&messages(), Some(&json!([]))).expect("renders"), "EXTRA TOOLS");
}

#[test]
fn a_jinja_file_needs_no_config_and_missing_templates_name_the_directory() {
    let dir = Dir::new("bare");
    let err = ChatTemplate::from_dir(dir.path()).expect_err("nothing there");
    assert!(matches!(&err, TemplateError::NotFound { dir: d } if d == dir.path()), "{err:?}");
    assert!(err.to_string().contains(&dir.path().display().to_string()), "{err}");

    dir.write("tokenizer_config.json", "{}");
    let err = ChatTemplate::from_dir(dir.path()).expect_err("no chat_template");
    assert!(matches!(err, TemplateError::NotFound { .. }), "{err:?}");

    std::fs::remove_file(dir.path().join("tokenizer_config.json")).expect("rm");
    dir.write("chat_template.jinja", "{{ messages[0].content }}!");
    let template = ChatTemplate::from_dir(dir.path()).expect("jinja alone");
    assert_eq!(template.render(&messages(), None).expect("renders"), " be brief !");
}

#[test]
fn bad_configs_are_typed_errors() {
    let dir = Dir::new("bad");
    let config = dir.write("tokenizer_config.json", "{not json");
    let err = ChatTemplate::from_tokenizer_config(&config).expect_err("invalid json");
    assert!(matches!(&err, TemplateError::ParseConfig { path, .. } if *path == config), "{err:?}");

    dir.write("tokenizer_config.json", r#"{"chat_template": 7}"#);
    let err = ChatTemplate::from_tokenizer_config(&config).expect_err("wrong shape");
    assert!(
        matches!(err, TemplateError::InvalidConfig { problem: ConfigProblem::NotStringOrList, .. }),
        "{err:?}"
    );
    dir.write("tokenizer_config.json", r#"{"chat_template": [{"template": "x"}]}"#);
    let err = ChatTemplate::from_tokenizer_config(&config).expect_err("unnamed");
    assert!(
        matches!(err, TemplateError::InvalidConfig { problem: ConfigProblem::UnnamedEntry, .. }),
        "{err:?}"
    );
    dir.write(
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "tool_use", "template": "{% for %}"}]}"#,
    );
    let err = ChatTemplate::from_tokenizer_config(&config).expect_err("does not compile");
    assert!(matches!(&err, TemplateError::Compile { name, .. } if name == "tool_use"), "{err:?}");
}

#[test]
fn from_file_takes_special_tokens_from_a_config() {
    let dir = Dir::new("file");
    let file = dir.write("custom.jinja", "{{ bos_token }}{{ messages | length }}");
    let config = dir.write("tokenizer_config.json", r#"{"bos_token": "<s>"}"#);
    let with = ChatTemplate::from_file(&file, Some(&config)).expect("loads");
    assert_eq!(with.render(&messages(), None).expect("renders"), "<s>2");
    let without = ChatTemplate::from_file(&file, None).expect("loads");
    assert_eq!(without.render(&messages(), None).expect("renders"), "2");
    let err =
        ChatTemplate::from_file(&dir.path().join("missing.jinja"), None).expect_err("missing");
    assert!(matches!(err, TemplateError::Read { .. }), "{err:?}");
}

#[test]
fn kwargs_override_special_tokens_and_documents_are_passed() {
    let source =
        "{{ bos_token }}|{{ date_string }}|{{ documents | length if documents else 'none' }}";
    let template =
        ChatTemplate::new(source, SpecialTokens::new().with("bos_token", "<s>")).expect("compiles");
    let conversation = Conversation::new(&messages())
        .kwarg("bos_token", &"<override>")
        .kwarg("date_string", &"01 Jan 2025")
        .documents(&json!([{"title": "t", "text": "x"}]));
    assert_eq!(
        template.render_conversation(&conversation).expect("renders"),
        "<override>|01 Jan 2025|1"
    );
    let plain = Conversation::new(&messages()).documents(&serde_json::Value::Null);
    assert_eq!(template.render_conversation(&plain).expect("renders"), "<s>||none");
}
