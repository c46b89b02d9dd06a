//! The token counts an engine reports with its answer: OpenAI's `usage` (`prompt_tokens`,
//! `completion_tokens`, `prompt_tokens_details.cached_tokens`) or SGLang's `/generate`
//! `meta_info` (`prompt_tokens`, `completion_tokens`, `cached_tokens`). A whole answer is read
//! once it is complete (a batched `/generate` answer, an array, is summed); a stream's counts
//! are those of its last event that carries any (the final usage chunk of an OpenAI stream
//! asked for with `stream_options.include_usage`, the last chunk of a `/generate` stream),
//! found in the stream's tail once it has ended.

mod scan;

use std::borrow::Cow;
use std::sync::LazyLock;

use memchr::memmem::Finder;
use serde::Deserialize;
use smallvec::SmallVec;

/// Tokens of one answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt: u64,
    /// Prompt tokens served from the engine's prefix cache.
    pub cached: u64,
    /// Generated tokens.
    pub completion: u64,
}

/// A batch's counts added up, saturating: an engine's absurd counts never wrap.
impl std::ops::Add for Usage {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            prompt: self.prompt.saturating_add(other.prompt),
            cached: self.cached.saturating_add(other.cached),
            completion: self.completion.saturating_add(other.completion),
        }
    }
}

/// The counts of a whole JSON answer, if it reports any: read in its last member where they
/// usually are (the `scan` module), else from the answer parsed whole.
pub fn of_answer(body: &[u8]) -> Option<Usage> {
    scan::of_last_member(body).unwrap_or_else(|| parsed(body))
}

/// The counts of a whole JSON answer parsed with serde: an object, or an array of objects
/// whose counts add up (a batched `/generate`).
fn parsed(body: &[u8]) -> Option<Usage> {
    let start = body.iter().position(|b| !b.is_ascii_whitespace())?;
    if body[start] == b'[' {
        let all: Vec<Reported> = serde_json::from_slice(body).ok()?;
        all.into_iter().filter_map(Reported::usage).reduce(|a, b| a + b)
    } else {
        serde_json::from_slice::<Reported>(body).ok()?.usage()
    }
}

/// The fields of an answer (or a stream's chunk) that carry counts; the rest is skipped.
#[derive(Deserialize)]
struct Reported {
    #[serde(default)]
    usage: Option<OpenAiUsage>,
    #[serde(default)]
    meta_info: Option<MetaInfo>,
}

#[derive(Deserialize)]
struct OpenAiUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct MetaInfo {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl Reported {
    fn usage(self) -> Option<Usage> {
        if let Some(usage) = self.usage {
            let cached = usage.prompt_tokens_details.and_then(|d| d.cached_tokens);
            return Some(Usage {
                prompt: usage.prompt_tokens.unwrap_or(0),
                cached: cached.unwrap_or(0),
                completion: usage.completion_tokens.unwrap_or(0),
            });
        }
        let meta = self.meta_info?;
        Some(Usage {
            prompt: meta.prompt_tokens.unwrap_or(0),
            cached: meta.cached_tokens.unwrap_or(0),
            completion: meta.completion_tokens.unwrap_or(0),
        })
    }
}

/// The searchers for the two keys that carry counts, quoted, built once (building one costs
/// more than a search of a chunk): shared by the stream's pre-check ([`may_report`]) and the
/// reading of an answer's last member ([`scan`]).
static USAGE_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"usage\""));
static META_KEY: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"meta_info\""));

/// Most events, from the end, searched for counts in a stream's tail.
const TAIL_EVENTS: usize = 8;

/// The counts of the last event that carries any among the SSE events of `tail` (the
/// stream's last frames, oldest first; the first event may be cut off and is then skipped).
/// Only the last events are read: most streams end their last frame with their counts, so that
/// frame is tried alone before the frames are joined (a coalesced frame may hold the whole
/// stream).
pub fn of_stream_tail(tail: &[&[u8]]) -> Option<Usage> {
    let [.., last] = tail else { return None };
    let (usage, read) = of_last_events(last);
    // The last frame alone held all the events to read: joining it to the frames before it
    // would read the same last events again.
    if usage.is_some() || read == TAIL_EVENTS || tail.len() < 2 {
        return usage;
    }
    of_last_events(&tail.concat()).0
}

/// The counts of the last of the final [`TAIL_EVENTS`] events of `text` that carries any,
/// and how many events were read.
fn of_last_events(text: &[u8]) -> (Option<Usage>, usize) {
    let events: Events<'_> = events_from_end(text).take(TAIL_EVENTS).collect();
    // Most tails carry no counts. When each event is one line, each one's data is a piece of
    // the span the events cover, so one search of that span answers for all of them (data
    // joined from several lines could join a key split across them: those are read one by one).
    if let Some(&(oldest, _)) = events.last()
        && events.iter().all(|(_, event)| memchr::memchr(b'\n', event.trim_ascii()).is_none())
        && !may_report(&text[oldest..])
    {
        return (None, events.len());
    }
    of_each(&events)
}

/// Events of a stream's tail, last first, each with where it starts.
type Events<'t> = SmallVec<[(usize, &'t [u8]); TAIL_EVENTS]>;

/// The counts of the first of `events` that carries any, and how many were read.
fn of_each(events: &Events<'_>) -> (Option<Usage>, usize) {
    let mut read = 0;
    let usage = events.iter().find_map(|(_, event)| {
        read += 1;
        let data = data_of(event);
        if data.is_empty() || *data == *b"[DONE]" || !may_report(&data) {
            return None;
        }
        of_answer(&data)
    });
    (usage, read)
}

/// The values of the `data:` lines of an SSE `event`, joined: borrowed from the event when it
/// has one such line, as an engine's events do. Lines are found by a vectorised search for
/// newlines; splitting at each byte was most of the instructions a stream's tail cost.
fn data_of(event: &[u8]) -> Cow<'_, [u8]> {
    let mut data = Cow::Borrowed(&b""[..]);
    let mut rest = event;
    while !rest.is_empty() {
        let (line, next) = match memchr::memchr(b'\n', rest) {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => (rest, &b""[..]),
        };
        rest = next;
        let Some(value) = line.strip_prefix(b"data:") else { continue };
        let value = value.trim_ascii_start();
        if data.is_empty() {
            data = Cow::Borrowed(value);
        } else {
            data.to_mut().extend_from_slice(value);
        }
    }
    data
}

/// Whether the JSON `data` may carry counts: a `"usage"` or `"meta_info"` key with a value
/// other than `null`. A stream's chunks mostly carry none (or `"usage":null`), and parsing
/// the last events for nothing was a fifth of the router's instructions for a stream of 64
/// events that asked for no counts.
/// Conservative, so that skipping never changes an answer: any occurrence not followed by
/// `:null`, and any `\u` escape (which could spell a key), counts as a maybe.
fn may_report(data: &[u8]) -> bool {
    /// The searchers, built once: building one costs more than a search of a chunk.
    static ESCAPE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\\u"));
    if ESCAPE.find(data).is_some() {
        return true;
    }
    [&*USAGE_KEY, &*META_KEY].into_iter().any(|key| {
        key.find_iter(data).any(|at| {
            let after = data[at + key.needle().len()..].trim_ascii_start();
            let value = after.strip_prefix(b":").map(<[u8]>::trim_ascii_start);
            !value.is_some_and(|value| value.starts_with(b"null"))
        })
    })
}

/// The non-blank SSE events of `text` (separated by blank lines), last first, each with
/// where it starts.
fn events_from_end(text: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let mut end = text.len();
    std::iter::from_fn(move || {
        while end > 0 {
            let rest = &text[..end];
            let start = last_blank_line(rest).map_or(0, |at| at + 2);
            end = start.saturating_sub(2);
            let event = &rest[start..];
            if !event.trim_ascii().is_empty() {
                return Some((start, event));
            }
        }
        None
    })
}

/// Where the last `\n\n` of `text` starts (found by a vectorised search for newlines).
fn last_blank_line(text: &[u8]) -> Option<usize> {
    let mut end = text.len();
    while let Some(at) = memchr::memrchr(b'\n', &text[..end]) {
        if at > 0 && text[at - 1] == b'\n' {
            return Some(at - 1);
        }
        end = at;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_answers_report_openai_usage_or_sglang_meta_info() {
        let openai = br#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        assert_eq!(of_answer(openai), Some(Usage { prompt: 10, cached: 4, completion: 3 }));
        let no_details =
            br#"{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":null}}"#;
        assert_eq!(of_answer(no_details), Some(Usage { prompt: 5, cached: 0, completion: 1 }));
        let generate = br#"{"text":"hi","meta_info":{"prompt_tokens":7,"completion_tokens":2,"cached_tokens":6}}"#;
        assert_eq!(of_answer(generate), Some(Usage { prompt: 7, cached: 6, completion: 2 }));
        let batch = br#" [{"meta_info":{"prompt_tokens":7,"completion_tokens":2}},{"meta_info":{"prompt_tokens":3,"completion_tokens":1,"cached_tokens":1}}]"#;
        assert_eq!(of_answer(batch), Some(Usage { prompt: 10, cached: 1, completion: 3 }));
        assert_eq!(of_answer(br#"{"choices":[]}"#), None);
        assert_eq!(of_answer(b"not json"), None);
        assert_eq!(of_answer(b""), None);
    }

    #[test]
    fn only_events_that_may_carry_counts_are_parsed_and_skipping_never_loses_any() {
        // (event data, whether it may carry counts)
        let cases: [(&[u8], bool); 12] = [
            (br#"{"choices":[{"delta":{"content":"a"}}]}"#, false),
            (br#"{"choices":[],"usage":null}"#, false),
            (br#"{"usage" : null, "meta_info":null}"#, false),
            (br#"{"choices":[{"delta":{"content":"the \"usage\": 5"}}]}"#, false),
            (br#"{"usage":{"prompt_tokens":1}}"#, true),
            (br#"{"usage":{}}"#, true),
            (br#"{"usage"  :  {"completion_tokens":2}}"#, true),
            (br#"{"text":"a","meta_info":{"prompt_tokens":3}}"#, true),
            (br#"{"\u0075sage":{"prompt_tokens":1}}"#, true),
            (br#"{"content":"usage","usage":null}"#, true), // a string "usage": a maybe
            (br#"{"x":["usage"],"usage":null}"#, true),
            (br#"{"usage":nul"#, true), // not null: parsed (and refused)
        ];
        for (data, may) in cases {
            let text = String::from_utf8_lossy(data);
            assert_eq!(may_report(data), may, "{text}");
            let counts = serde_json::from_slice::<Reported>(data).ok().and_then(Reported::usage);
            assert!(may || counts.is_none(), "skipped {text}, which carries {counts:?}");
        }
    }

    #[test]
    fn a_streams_counts_are_its_last_reporting_events() {
        let chunk = br#"data: {"choices":[{"delta":{"content":"a"}}],"usage":null}

"#;
        let usage = br#"data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":8}}}

data: [DONE]

"#;
        let expected = Some(Usage { prompt: 9, cached: 8, completion: 4 });
        assert_eq!(of_stream_tail(&[chunk, usage]), expected);
        // The usage chunk and [DONE] in frames of their own, an event cut across two frames.
        let (head, rest) = usage.split_at(20);
        assert_eq!(of_stream_tail(&[head, rest]), expected);
        assert_eq!(of_stream_tail(&[chunk, b"data: [DONE]\n\n"]), None, "no usage asked for");
        let generate = br#"data: {"text":"a","meta_info":{"prompt_tokens":3,"completion_tokens":1,"cached_tokens":0}}

data: {"text":"ab","meta_info":{"prompt_tokens":3,"completion_tokens":2,"cached_tokens":0}}

data: [DONE]

"#;
        let last = Some(Usage { prompt: 3, cached: 0, completion: 2 });
        assert_eq!(of_stream_tail(&[generate]), last);
        assert_eq!(of_stream_tail(&[]), None);
    }

    #[test]
    fn only_a_streams_last_events_are_read() {
        let content = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n".repeat(100);
        let counts = "data: {\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":100}}\n\n";
        // One coalesced frame holding the whole stream.
        let whole = format!("{counts}{content}{counts}data: [DONE]\n\n");
        let expected = Some(Usage { prompt: 2, cached: 0, completion: 100 });
        assert_eq!(of_stream_tail(&[b"", whole.as_bytes()]), expected);
        // Counts further back than the last events are not looked for.
        let early = format!("{counts}{content}data: [DONE]\n\n");
        assert_eq!(of_stream_tail(&[early.as_bytes()]), None);
        // Blank lines around events and a lone frame without a separator.
        assert_eq!(of_stream_tail(&[b"\n\n\n", counts.trim_end().as_bytes()]), expected);
        // Counts in the frame before a last frame of a few events are found; before a last
        // frame of more events than are read, they are as far back as in one frame.
        let few = "data: {\"choices\":[]}\n\ndata: [DONE]\n\n";
        assert_eq!(of_stream_tail(&[counts.as_bytes(), few.as_bytes()]), expected);
        let many = format!("{content}data: [DONE]\n\n");
        assert_eq!(of_stream_tail(&[counts.as_bytes(), many.as_bytes()]), None);
    }

    #[test]
    fn the_last_blank_line_is_found_from_the_end() {
        let cases: [(&[u8], Option<usize>); 6] = [
            (b"", None),
            (b"\n", None),
            (b"a\nb\nc", None),
            (b"\n\n", Some(0)),
            (b"a\n\nb\n\n", Some(4)),
            (b"a\n\n\nb", Some(2)),
        ];
        for (text, at) in cases {
            assert_eq!(last_blank_line(text), at, "{:?}", String::from_utf8_lossy(text));
            let naive = text.windows(2).rposition(|w| w == b"\n\n");
            assert_eq!(at, naive, "as a byte-by-byte search finds");
        }
    }

    /// JSON values that an answer's members may hold, keys and strings chosen to meet the
    /// scanner's hard cases: the counts' own names at every depth, quotes, backslashes and
    /// brackets inside strings, and counts of every type.
    fn json() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (0u64..200).prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            r#"[a-z"\\{}\[\]:, ]{0,12}|usage|\\u0075sage"#.prop_map(Value::String),
        ];
        let keys = r"usage|meta_info|prompt_tokens|completion_tokens|cached_tokens|prompt_tokens_details|choices|u\\sage|[a-z]{1,3}";
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::vec((keys, inner), 0..6)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    /// `object` with any counts object given as an array made `null`: serde's derived readers
    /// take an array as the object's fields in order (`"usage":[1,2]`); the scanner, like the
    /// engines, does not.
    fn without_count_sequences(mut object: serde_json::Value) -> serde_json::Value {
        use serde_json::Value;
        for key in ["usage", "meta_info"] {
            if let Some(counts @ Value::Array(_)) = object.get_mut(key) {
                *counts = Value::Null;
            }
        }
        if let Some(details @ Value::Array(_)) =
            object.get_mut("usage").and_then(|usage| usage.get_mut("prompt_tokens_details"))
        {
            *details = Value::Null;
        }
        object
    }

    /// Events a stream's tail may hold: content, counts (null, real, escaped, cut off), a key
    /// split across two data lines, a key whose line is followed by a comment `: null`,
    /// comments, other fields, the end.
    const TAIL_PIECES: [&str; 12] = [
        r#"data: {"choices":[{"delta":{"content":"a"}}]}"#,
        r#"data: {"choices":[],"usage":null}"#,
        r#"data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}"#,
        r#"data: {"text":"a","meta_info":{"prompt_tokens":3,"completion_tokens":1}}"#,
        r#"data: {"\u0075sage":{"prompt_tokens":1}}"#,
        "data: {\"us\ndata: age\":{\"prompt_tokens\":5}}",
        "data: {\"usage\"\n: null",
        r#"data: {"usage""#,
        ": keep-alive",
        "event: error\ndata: {\"error\":\"x\"}",
        "data: [DONE]",
        "data: {\"meta_info\" :\n data: null}",
    ];

    proptest::proptest! {
        /// Searching the span of one-line events at once finds counts wherever reading the
        /// events one by one does.
        #[test]
        fn one_search_of_a_tail_reads_as_its_events_one_by_one(
            pieces in proptest::collection::vec(
                (proptest::sample::select(&TAIL_PIECES[..]), "\n\n|\n\n\n"), 0..12),
            cut: proptest::sample::Index,
        ) {
            let text: String = pieces.iter().map(|(event, blank)| format!("{event}{blank}")).collect();
            let text = &text.as_bytes()[cut.index(text.len() + 1).min(text.len())..];
            let events: Events<'_> = events_from_end(text).take(TAIL_EVENTS).collect();
            proptest::prop_assert_eq!(of_last_events(text), of_each(&events));
        }

        /// An event's data is what joining its `data:` lines, split at each newline, makes:
        /// lines of data, of other fields and comments, blank, with carriage returns.
        #[test]
        fn an_events_data_is_its_data_lines_joined(
            lines in proptest::collection::vec(r"(data: ?|event: |: |id:)?[a-z{}\[\]\r ]{0,6}\r?", 0..6),
            ends_with_newline: bool,
        ) {
            let mut event = lines.join("\n");
            if ends_with_newline {
                event.push('\n');
            }
            let mut joined = Vec::new();
            for line in event.as_bytes().split(|&b| b == b'\n') {
                if let Some(value) = line.strip_prefix(b"data:") {
                    joined.extend_from_slice(value.trim_ascii_start());
                }
            }
            proptest::prop_assert_eq!(&*data_of(event.as_bytes()), &joined[..]);
        }

        /// On any well-formed answer (an object, or an array of them for a batch), written
        /// compactly or with blanks between its tokens, the scanner reads what serde reads;
        /// every cut of one is refused by both.
        #[test]
        fn reads_what_serde_reads(
            members in proptest::collection::vec(
                (r"usage|meta_info|choices|id|[a-z]{1,2}", json()), 0..6),
            batch in proptest::option::of(1usize..4),
            pretty: bool,
            cut: proptest::sample::Index,
        ) {
            let object = serde_json::Value::Object(members.into_iter().collect());
            let object = without_count_sequences(object);
            let answer = match batch {
                Some(len) => serde_json::Value::Array(vec![object; len]),
                None => object,
            };
            let text = if pretty {
                serde_json::to_vec_pretty(&answer)
            } else {
                serde_json::to_vec(&answer)
            }
            .expect("JSON");
            proptest::prop_assert_eq!(of_answer(&text), parsed(&text));
            let cut = &text[..cut.index(text.len())];
            proptest::prop_assert_eq!(of_answer(cut), None);
            proptest::prop_assert_eq!(parsed(cut), None);
        }
    }

    #[test]
    fn counts_are_integers_and_each_field_is_read_once() {
        let usage = |counts: &str| of_answer(format!(r#"{{"usage":{{{counts}}}}}"#).as_bytes());
        let expected = |prompt| Some(Usage { prompt, cached: 0, completion: 0 });
        assert_eq!(usage(r#""prompt_tokens":0"#), expected(0));
        assert_eq!(usage(r#""prompt_tokens": 18446744073709551615 "#), expected(u64::MAX));
        assert_eq!(usage(r#""prompt_tokens":null"#), expected(0));
        for refused in [
            r#""prompt_tokens":18446744073709551616"#,
            r#""prompt_tokens":1.0"#,
            r#""prompt_tokens":1e2"#,
            r#""prompt_tokens":-1"#,
            r#""prompt_tokens":01"#,
            r#""prompt_tokens":"1""#,
            r#""prompt_tokens":1,"prompt_tokens":2"#,
            r#""prompt_tokens_details":{"cached_tokens":1,"cached_tokens":1}"#,
        ] {
            assert_eq!(usage(refused), None, "{refused}");
            assert_eq!(usage(refused), parsed(format!(r#"{{"usage":{{{refused}}}}}"#).as_bytes()));
        }
        // Counts that are not the answer's last member, or not at its top, or an answer with
        // more than one counts key anywhere, are parsed whole.
        let counts = Some(Usage { prompt: 1, cached: 0, completion: 0 });
        #[rustfmt::skip]
        let cases = [
            // (answer, read in its last member, counts)
            (r#"{"id":"x","usage":{"prompt_tokens":1}}"#, true, counts),
            (r#"{"text":"x","meta_info":{"prompt_tokens":1}}"#, true, counts),
            (r#"{"usage":{"prompt_tokens":1},"id":"x"}"#, false, counts),
            (r#"{"choices":[{"usage":{"prompt_tokens":2}}],"usage":{"prompt_tokens":1}}"#, false, counts),
            (r#"{"choices":[{"usage":{"prompt_tokens":1}}]}"#, false, None),
            (r#"{"x":{"usage":{"prompt_tokens":1}}}"#, false, None),
            (r#"{"text":"a\",\"usage\":{}}"}"#, false, None),
            (r#"{"meta_info":{"prompt_tokens":2},"usage":{"prompt_tokens":1}}"#, false, counts),
            (r#"{"meta_info":{"prompt_tokens":1},"usage":null}"#, false, counts),
            (r#"[{"usage":{"prompt_tokens":1}}]"#, false, counts),
        ];
        for (answer, fast, expected) in cases {
            assert_eq!(scan::of_last_member(answer.as_bytes()).is_some(), fast, "{answer}");
            assert_eq!(of_answer(answer.as_bytes()), expected, "{answer}");
            assert_eq!(of_answer(answer.as_bytes()), parsed(answer.as_bytes()), "{answer}");
        }
        // The members before the counts are not parsed: an intact last member is read from a
        // malformed answer; a malformed last member, or anything after it, is refused.
        assert_eq!(of_answer(br#"{"a":[},"usage":{"prompt_tokens":1}}"#), counts);
        for refused in [r#"{"usage":{}} x"#, r#"{"usage":{"prompt_tokens":}}"#, r#""usage":{}}"#] {
            assert_eq!(of_answer(refused.as_bytes()), None, "{refused}");
        }
    }
}
