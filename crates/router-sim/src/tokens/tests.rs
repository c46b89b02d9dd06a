//! The tokenizer and chat template the engine applies: the shipped assets, ChatML rendering,
//! and agreement with the built-in ones (the template helpers are router-chat-template's).

use proptest::prelude::*;

use super::*;

fn shipped() -> Preprocessor {
    Preprocessor::from_tokenizer_file(&crate::assets::tokenizer_path())
        .expect("shipped assets load")
}

#[test]
fn shipped_tokenizer_json_is_the_generated_one() {
    let path = crate::assets::tokenizer_path();
    let generated = byte_level_tokenizer_json();
    if std::env::var_os("ROUTER_SIM_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write asset");
    }
    let on_disk: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("asset exists")).expect("json");
    let expected: serde_json::Value = serde_json::from_str(&generated).expect("json");
    assert_eq!(on_disk, expected, "run with ROUTER_SIM_BLESS=1 to regenerate the asset");
}

#[test]
fn shipped_tokenizer_maps_each_byte_to_its_value() {
    let pre = shipped();
    let text = "héllo <|im_start|>\n\t wörld 🙂 \u{0}";
    let ids = pre.encode(text).expect("encode");
    let bytes: Vec<u32> = text.bytes().map(u32::from).collect();
    assert_eq!(ids, bytes);
    let all: String = (1u8..128).map(char::from).collect();
    assert_eq!(pre.encode(&all).expect("encode"), (1u32..128).collect::<Vec<_>>());
    for id in [b'a', b' ', b'\n', b'<'] {
        assert_eq!(pre.decode_token(u32::from(id)), char::from(id).to_string());
        assert_eq!(Preprocessor::builtin().decode_token(u32::from(id)), char::from(id).to_string());
    }
}

#[test]
fn chatml_rendering_is_exact() {
    let messages = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi")];
    let expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
                    <|im_start|>assistant\n";
    assert_eq!(Preprocessor::builtin().render(&messages).expect("render"), expected);
    assert_eq!(shipped().render(&messages).expect("render"), expected);
}

#[test]
fn missing_template_is_an_error_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("router-sim-notpl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let tokenizer = dir.join("tokenizer.json");
    std::fs::write(&tokenizer, byte_level_tokenizer_json()).expect("write");
    let err = Preprocessor::from_tokenizer_file(&tokenizer).expect_err("no template");
    assert!(
        matches!(
            err,
            PrepareError::Template {
                source: router_chat_template::TemplateError::NotFound { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("tokenizer.json"));
    std::fs::write(dir.join("chat_template.jinja"), "{{ messages[0].content }}!").expect("write");
    let pre = Preprocessor::from_tokenizer_file(&tokenizer).expect("jinja file beside");
    assert_eq!(pre.render(&[ChatMessage::new("user", "x")]).expect("render"), "x!");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

fn message() -> impl Strategy<Value = ChatMessage> {
    (prop::sample::select(vec!["system", "user", "assistant", "tool"]), any::<String>())
        .prop_map(|(role, content)| ChatMessage::new(role, content))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn builtin_and_shipped_assets_agree(messages in prop::collection::vec(message(), 0..5)) {
        let builtin = Preprocessor::builtin();
        let shipped = shipped();
        let a = builtin.prompt_ids(&messages).expect("builtin");
        let b = shipped.prompt_ids(&messages).expect("shipped");
        prop_assert_eq!(a, b);
    }
}
