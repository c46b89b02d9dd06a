//! A request body read in one pass, as far as the router reads it: the prompt fields are read
//! straight into strings and token ids ([`prompt`]), the other top-level fields that
//! validation looks at into JSON values within a budget ([`values`]), `messages` is checked
//! and measured as it is read without being built, and every other member is only walked, its
//! text measured for the size estimate. What is built costs at most a small multiple of the
//! body: nothing in it grows per item by more than a few times the item's own bytes.
//!
//! A body is read here exactly when it parses as a JSON value, by serde_json's parser (nesting
//! cap included) driving the seeds below. The whole body is never built as a
//! `serde_json::Value` (an ordered, hashed map per object, a string per key): the chat
//! template reads the members it renders ([`members`], within the same budget), and a body
//! the router rewrites keeps its other members as text (`super::edit`).

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

mod prompt;
mod values;

pub(crate) use prompt::{PromptField, PromptProblem};

/// Declares the top-level fields parsed into values: [`READ`] lists them, [`read_field`]
/// finds a key among them.
macro_rules! read_fields {
    ($($name:literal),* $(,)?) => {
        /// The top-level fields validation reads (and the router-owned ones, whose presence
        /// decides whether a body is rewritten); `messages` is read apart.
        pub(crate) const READ: &[&str] = &[$($name),*];

        /// `key` as the name in [`READ`], when it is one.
        fn read_field(key: &str) -> Option<&'static str> {
            match key {
                $($name => Some($name),)*
                _ => None,
            }
        }
    };
}

read_fields![
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "n",
    "top_k",
    "stop",
    "echo",
    "prompt",
    "text",
    "input_ids",
    "rid",
    "return_logprob",
    "sampling_params",
    "data_parallel_rank",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "add_special_tokens",
];

/// The read fields whose value is a prompt, read by [`prompt`].
const PROMPT_FIELDS: [&str; 3] = ["prompt", "text", "input_ids"];

/// A request body's top-level members, as the router reads them.
#[derive(Debug, Default, PartialEq)]
pub struct BodyFields {
    /// The [`READ`] fields present but the prompts, in the order sent; a repeated one's last
    /// value counts.
    values: Vec<(&'static str, Value)>,
    /// The prompt fields present, in the order sent; a repeated one's last value counts.
    prompts: Vec<(&'static str, PromptField)>,
    /// `messages`, when present (the last, if repeated).
    messages: Option<Messages>,
    /// The first read field too large to build within the body's budget.
    oversized: Option<&'static str>,
    /// The length of the text (string values, at any depth) of every member but `messages`.
    text: usize,
}

/// `messages` as read: a list's length and its text, and the first message that is not one.
#[derive(Debug, PartialEq)]
pub struct Messages {
    /// How many messages, when `messages` is a list.
    pub count: Option<usize>,
    /// The length of its text: its string values, at any depth.
    pub text: usize,
    /// The first item that is no message (an object whose `role` is a string and whose
    /// `content`, when present, is a string, a list of parts or null): its index, and why.
    pub problem: Option<(usize, MessageProblem)>,
}

/// Why an item of `messages` is no message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageProblem {
    /// It is not an object.
    NotAnObject,
    /// Its `role` is missing or not a string.
    Role,
    /// Its `content` is neither a string, a list of parts nor null.
    Content,
}

impl BodyFields {
    /// The value of the [`READ`] field `name` (not a prompt field).
    pub fn get(&self, name: &str) -> Option<&Value> {
        debug_assert!(READ.contains(&name), "`{name}` is not among the fields read");
        debug_assert!(!PROMPT_FIELDS.contains(&name), "`{name}` is read by `prompt`");
        self.values.iter().rev().find_map(|(field, value)| (*field == name).then_some(value))
    }

    /// Whether the [`READ`] field `name` is present.
    pub fn has(&self, name: &str) -> bool {
        if PROMPT_FIELDS.contains(&name) {
            self.prompt(name).is_some()
        } else {
            self.get(name).is_some()
        }
    }

    /// The prompt field `name` (`prompt`, `text` or `input_ids`), when present.
    pub fn prompt(&self, name: &str) -> Option<&PromptField> {
        debug_assert!(PROMPT_FIELDS.contains(&name), "`{name}` is no prompt field");
        self.prompts.iter().rev().find_map(|(field, value)| (*field == name).then_some(value))
    }

    /// Takes the prompt field `name` out, for a request to own what it holds; its text still
    /// counts in [`BodyFields::text_len`].
    pub fn take_prompt(&mut self, name: &str) -> Option<PromptField> {
        let at = self.prompts.iter().rposition(|(field, _)| *field == name)?;
        Some(std::mem::replace(&mut self.prompts[at].1, PromptField::Null))
    }

    /// `messages`, when present.
    pub fn messages(&self) -> Option<&Messages> {
        self.messages.as_ref()
    }

    /// The first read field too large for the router to build (its values hold more nodes than
    /// a body of this size may), when there is one.
    pub fn oversized(&self) -> Option<&'static str> {
        self.oversized
    }

    /// The length of the body's text: its string values at any depth, keys aside.
    pub fn text_len(&self) -> usize {
        self.text + self.messages.as_ref().map_or(0, |m| m.text)
    }
}

/// The reading of one body: the fields so far, the nodes its values may still build, and how
/// many prompts a batch may hold.
struct Reading {
    fields: BodyFields,
    left: Cell<usize>,
    max_batch: usize,
}

impl Reading {
    fn new(body_len: usize, max_batch: usize) -> Self {
        Reading {
            fields: BodyFields { values: Vec::with_capacity(8), ..BodyFields::default() },
            left: Cell::new(values::budget(body_len)),
            max_batch,
        }
    }

    /// Keeps `prompt`, the value of the prompt field `name`.
    fn prompt(&mut self, name: &'static str, prompt: PromptField) {
        self.fields.text += prompt.text_len();
        self.fields.prompts.push((name, prompt));
    }

    /// Keeps `built`, the value of the read field `name`.
    fn value(&mut self, name: &'static str, built: values::Built) {
        self.fields.text += built.text;
        match built.value {
            Some(value) => self.fields.values.push((name, value)),
            None => {
                self.fields.oversized.get_or_insert(name);
            }
        }
    }

    fn bounded(&self, name: &str) -> values::Bounded<'_> {
        let keep = (name == "sampling_params").then_some(values::SAMPLING_READ);
        values::Bounded { left: &self.left, keep }
    }
}

/// Reads the value of the read field `name` into a [`Reading`].
struct Member<'r> {
    name: &'static str,
    reading: &'r mut Reading,
}

impl<'de> DeserializeSeed<'de> for Member<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        let Member { name, reading } = self;
        if PROMPT_FIELDS.contains(&name) {
            let prompt =
                prompt::ReadPrompt { max_batch: reading.max_batch }.deserialize(deserializer)?;
            reading.prompt(name, prompt);
        } else {
            let built = reading.bounded(name).deserialize(deserializer)?;
            reading.value(name, built);
        }
        Ok(())
    }
}

/// Reads `body`: its fields when it is a JSON object, `None` when it is another JSON value. A
/// batch prompt may hold at most `max_batch` prompts (past them it is read as invalid).
pub(crate) fn read(body: &[u8], max_batch: usize) -> Result<Option<BodyFields>, serde_json::Error> {
    match std::str::from_utf8(body) {
        // UTF-8 checked once, in one pass (read from bytes, serde_json checks each string on
        // its own, keys included, which cost more than the rest of a small body's parse).
        Ok(text) => read_from(serde_json::Deserializer::from_str(text), text.len(), max_batch),
        // No JSON text: read from the bytes, serde_json's error says where it breaks.
        Err(_) => read_from(serde_json::Deserializer::from_slice(body), body.len(), max_batch),
    }
}

/// The members of `body` (a JSON object) named in `names`, as a map built within the node
/// budget of a body of its size (the rest is skipped, not built); `Ok(None)` past the budget.
pub fn members(
    body: &[u8],
    names: &'static [&'static str],
) -> Result<Option<serde_json::Map<String, Value>>, serde_json::Error> {
    let left = Cell::new(values::budget(body.len()));
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let built =
        values::Bounded { left: &left, keep: Some(names) }.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(match built.value {
        Some(Value::Object(map)) => Some(map),
        _ => None,
    })
}

fn read_from<'de, R: serde_json::de::Read<'de>>(
    mut deserializer: serde_json::Deserializer<R>,
    body_len: usize,
    max_batch: usize,
) -> Result<Option<BodyFields>, serde_json::Error> {
    let fields = deserializer.deserialize_any(Body { body_len, max_batch })?;
    deserializer.end()?;
    Ok(fields)
}

/// A visitor's methods for scalars: each returns `$value(kind, text_len)`.
macro_rules! visit_scalars {
    ($value:expr) => {
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(($value)(Kind::Null, 0))
        }

        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(($value)(Kind::Bool, 0))
        }

        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(($value)(Kind::Number, 0))
        }

        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(($value)(Kind::Number, 0))
        }

        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(($value)(Kind::Number, 0))
        }

        fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
            Ok(($value)(Kind::String, text.len()))
        }
    };
}

/// The kinds of JSON value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

/// What walking a value found.
#[derive(Clone, Copy)]
struct Walked {
    kind: Kind,
    /// The length of its string values, at any depth.
    text: usize,
    /// The kinds of its `role` and `content` members, when [`Walk::message`] watched them.
    role: Option<Kind>,
    content: Option<Kind>,
}

impl Walked {
    fn of(kind: Kind, text: usize) -> Self {
        Self { kind, text, role: None, content: None }
    }
}

/// Walks a value without building it, measuring its text; a message's walk also notes the
/// kinds of its `role` and `content` (a repeated key's last value counts, as in a parsed map;
/// the text counts each).
#[derive(Clone, Copy)]
struct Walk {
    message: bool,
}

impl Walk {
    const ANY: Walk = Walk { message: false };
}

impl<'de> DeserializeSeed<'de> for Walk {
    type Value = Walked;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Walked, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk {
    type Value = Walked;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    visit_scalars!(Walked::of);

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Walked, A::Error> {
        let mut text = 0;
        while let Some(item) = items.next_element_seed(Walk::ANY)? {
            text += item.text;
        }
        Ok(Walked::of(Kind::Array, text))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Walked, A::Error> {
        let mut walked = Walked::of(Kind::Object, 0);
        // Keys are read as strings, not skipped: skipping would let escapes a string may not
        // hold (a lone surrogate) through.
        while let Some(key) = members.next_key_seed(Key)? {
            let value = members.next_value_seed(Walk::ANY)?;
            walked.text += value.text;
            match key {
                Some(MessageField::Role) if self.message => walked.role = Some(value.kind),
                Some(MessageField::Content) if self.message => walked.content = Some(value.kind),
                _ => {}
            }
        }
        Ok(walked)
    }
}

/// The members of a message the router checks.
enum MessageField {
    Role,
    Content,
}

/// An object's key, as the message member it names.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Option<MessageField>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for Key {
    type Value = Option<MessageField>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(match key {
            "role" => Some(MessageField::Role),
            "content" => Some(MessageField::Content),
            _ => None,
        })
    }
}

/// Reads `messages`.
struct ReadMessages;

impl ReadMessages {
    fn not_a_list(text: usize) -> Messages {
        Messages { count: None, text, problem: None }
    }
}

impl<'de> DeserializeSeed<'de> for ReadMessages {
    type Value = Messages;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Messages, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ReadMessages {
    type Value = Messages;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    visit_scalars!(|_, text| ReadMessages::not_a_list(text));

    fn visit_map<A: MapAccess<'de>>(self, members: A) -> Result<Messages, A::Error> {
        Ok(Self::not_a_list(Walk::ANY.visit_map(members)?.text))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Messages, A::Error> {
        let (mut count, mut text, mut problem) = (0, 0, None);
        while let Some(message) = items.next_element_seed(Walk { message: true })? {
            if problem.is_none() {
                problem = message_problem(&message).map(|why| (count, why));
            }
            count += 1;
            text += message.text;
        }
        Ok(Messages { count: Some(count), text, problem })
    }
}

/// What is wrong with `message`, if anything.
fn message_problem(message: &Walked) -> Option<MessageProblem> {
    if message.kind != Kind::Object {
        Some(MessageProblem::NotAnObject)
    } else if message.role != Some(Kind::String) {
        Some(MessageProblem::Role)
    } else if let Some(Kind::Bool | Kind::Number | Kind::Object) = message.content {
        Some(MessageProblem::Content)
    } else {
        None
    }
}

/// Reads a body of `body_len` bytes: its members when it is an object.
struct Body {
    body_len: usize,
    max_batch: usize,
}

impl<'de> Visitor<'de> for Body {
    type Value = Option<BodyFields>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    visit_scalars!(|_, _| None);

    fn visit_seq<A: SeqAccess<'de>>(self, items: A) -> Result<Self::Value, A::Error> {
        // Walked all the same: a body too deeply nested is no JSON value at all.
        Walk::ANY.visit_seq(items)?;
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Self::Value, A::Error> {
        let mut reading = Reading::new(self.body_len, self.max_batch);
        while let Some(key) = members.next_key_seed(TopKey)? {
            match key {
                TopField::Read(name) => {
                    members.next_value_seed(Member { name, reading: &mut reading })?
                }
                TopField::Messages => {
                    reading.fields.messages = Some(members.next_value_seed(ReadMessages)?)
                }
                TopField::Other => reading.fields.text += members.next_value_seed(Walk::ANY)?.text,
            }
        }
        Ok(Some(reading.fields))
    }
}

/// A top-level key, as what the router does with its value.
enum TopField {
    Read(&'static str),
    Messages,
    Other,
}

/// Reads a top-level key.
struct TopKey;

impl<'de> DeserializeSeed<'de> for TopKey {
    type Value = TopField;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<TopField, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for TopKey {
    type Value = TopField;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, key: &str) -> Result<TopField, E> {
        Ok(match read_field(key) {
            Some(name) => TopField::Read(name),
            None if key == "messages" => TopField::Messages,
            None => TopField::Other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batch limit of the reads below.
    const BATCH: usize = 4;

    fn fields(body: &str) -> BodyFields {
        read(body.as_bytes(), BATCH).expect("JSON").expect("an object")
    }

    #[test]
    fn a_body_is_read_exactly_when_it_parses_as_json() {
        let deep_member = format!(r#"{{"x":{}1{}}}"#, "[".repeat(127), "]".repeat(127));
        let too_deep = format!(r#"{{"x":{}1{}}}"#, "[".repeat(128), "]".repeat(128));
        let deep_message = format!(
            r#"{{"messages":[{{"role":"u","content":{}1{}}}]}}"#,
            "[".repeat(125),
            "]".repeat(125)
        );
        let too_deep_message = format!(
            r#"{{"messages":[{{"role":"u","content":{}1{}}}]}}"#,
            "[".repeat(126),
            "]".repeat(126)
        );
        let cases = [
            r#"{"model":"m"}"#,
            r#"{"a":1e999}"#,
            r#"{"a":1} x"#,
            r#"{"a":}"#,
            r#"{"a\u0041":"\ud800"}"#,
            r#"{"x":{"\ud800":1}}"#,
            r#"{"x":["\ud800"],"messages":[{"\udc00":0}]}"#,
            "{\"x\":\"\u{1}\"}",
            r#"{"messages":[{"role":"user","content":"x"}],"messages":3}"#,
            r#"[1,{"a":[2]}]"#,
            r#""text""#,
            "",
            &deep_member,
            &too_deep,
            &deep_message,
            &too_deep_message,
        ];
        // Bytes that are no UTF-8 (in a string, after the value), and a byte-order mark.
        let bytes: [&[u8]; 4] =
            [b"{\"a\":\"\xff\"}", b"{\"a\":\"\xc3\"}", b"{\"a\":1}\xff", b"\xef\xbb\xbf{}"];
        for body in cases.iter().map(|body| body.as_bytes()).chain(bytes) {
            let as_value = serde_json::from_slice::<Value>(body);
            let fields = read(body, BATCH);
            let body = String::from_utf8_lossy(body);
            assert_eq!(fields.is_ok(), as_value.is_ok(), "{body}: {:?}", as_value.err());
            if let (Ok(fields), Ok(value)) = (fields, as_value) {
                assert_eq!(fields.is_some(), value.is_object(), "{body}");
            }
        }
    }

    #[test]
    fn read_fields_keep_their_last_value_and_the_text_counts_every_string() {
        let body = fields(
            r#"{"model":"first","stream":false,"model":"m","input":["abc",{"k":"de"}],
                "messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}]}"#,
        );
        assert_eq!(body.get("model"), Some(&Value::from("m")));
        assert_eq!(body.get("stream"), Some(&Value::from(false)));
        assert!(body.has("model") && !body.has("max_tokens"));
        let messages = body.messages().expect("messages");
        assert_eq!(
            (messages.count, messages.text, messages.problem.is_none()),
            (Some(1), 13, true)
        );
        // "first" + "m" + "abc" + "de" + "user" + "text" + "hello".
        assert_eq!(body.text_len(), 5 + 1 + 3 + 2 + 4 + 4 + 5);
    }

    #[test]
    fn each_message_problem_names_the_first_bad_message() {
        use MessageProblem::{Content, NotAnObject, Role};
        let cases = [
            (r#"[{"role":"user"},{"role":"user","content":null}]"#, None),
            (r#"[{"role":"user"},7]"#, Some((1, NotAnObject))),
            (r#"[{"content":"x"}]"#, Some((0, Role))),
            (r#"[{"role":1,"role":"user"}]"#, None),
            (r#"[{"role":"user","role":1}]"#, Some((0, Role))),
            (r#"[{"role":"user","content":{}}]"#, Some((0, Content))),
            (r#"[{"role":"a"},{"role":"b","content":5},{"content":1}]"#, Some((1, Content))),
        ];
        for (messages, problem) in cases {
            let body = fields(&format!(r#"{{"messages":{messages}}}"#));
            assert_eq!(body.messages().expect("messages").problem, problem, "{messages}");
        }
        assert_eq!(fields(r#"{"messages":{"role":"user"}}"#).messages().expect("read").count, None);
        assert_eq!(fields(r#"{"messages":[]}"#).messages().expect("read").count, Some(0));
    }

    #[test]
    fn every_router_owned_field_is_read() {
        for name in super::super::ROUTER_OWNED_FIELDS {
            assert!(READ.contains(&name), "{name}");
        }
    }
}
