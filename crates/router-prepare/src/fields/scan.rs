//! The common shape of a request body read without serde: an object whose strings hold no
//! `\u` escape, whose numbers have no exponent, nested a few levels deep. That is a subset of
//! JSON that serde_json reads without fail (no string it refuses, no number out of range, no
//! nesting past its cap), so a body this scan reads is one serde_json reads too, and the scan
//! makes the same [`BodyFields`] of it; anything else (another value at the top, an escape,
//! an exponent, text that is no JSON) is left to serde_json, which decides and says why.
//! The values of the read fields that are more than a plain string, integer or literal are
//! read by the same seeds as serde_json's path, from their own text.
//!
//! A second path for the same input (docs/design/STYLE.md, Fast paths): it is there only
//! because it costs fewer instructions than serde_json's generic walk (a visitor call per
//! value, a check of every key); its share is in docs/benchmarks.md, and the fuzz target
//! `prepare` and a property test check that it reads what serde_json reads.

use serde::de::DeserializeSeed;
use serde_json::Value;

use super::{
    BodyFields, Kind, Member, Messages, PROMPT_FIELDS, PromptField, Reading, Walked,
    message_problem, read_field,
};
use crate::words;

/// Containers nested deeper than this are left to serde_json (whose cap is 128): within it,
/// the depth never decides whether a body is JSON.
const MAX_DEPTH: u32 = 32;

/// Numbers longer than this are left to serde_json: every shorter one without an exponent is
/// finite as a float, so none is out of range.
const MAX_NUMBER: usize = 20;

/// `text`'s fields when it is a JSON object in the scanned subset; `None` otherwise, for
/// serde_json to read.
pub(super) fn read(text: &str, max_batch: usize) -> Option<BodyFields> {
    let mut scan = Scan { text, at: 0, depth: 0 };
    if scan.next()? != b'{' {
        return None;
    }
    scan.enter()?;
    let mut reading = Reading::new(text.len(), max_batch);
    if !scan.closes(b'}')? {
        loop {
            let key = scan.key()?;
            match read_field(key) {
                Some(name) => scan.read_member(name, &mut reading)?,
                None if key == "messages" => reading.fields.messages = Some(scan.messages()?),
                None => reading.fields.text += scan.walk(false)?.text,
            }
            if scan.closes_after_member(b'}')? {
                break;
            }
        }
    }
    scan.blank();
    (scan.at == text.len()).then_some(reading.fields)
}

/// A cursor over JSON text. Every method returns `None` where the text leaves the subset.
struct Scan<'t> {
    text: &'t str,
    at: usize,
    /// Containers open at the cursor.
    depth: u32,
}

/// A string as scanned: its text between the quotes, escapes as written, and its length once
/// unescaped.
struct Scanned<'t> {
    raw: &'t str,
    len: usize,
}

impl Scanned<'_> {
    fn escaped(&self) -> bool {
        self.raw.len() != self.len
    }
}

impl<'t> Scan<'t> {
    fn bytes(&self) -> &'t [u8] {
        self.text.as_bytes()
    }

    /// Skips JSON whitespace.
    fn blank(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes().get(self.at) {
            self.at += 1;
        }
    }

    /// Skips blanks; the next byte, left in place.
    fn next(&mut self) -> Option<u8> {
        self.blank();
        self.bytes().get(self.at).copied()
    }

    /// Skips blanks; whether the next byte is `close` (then taken), as an empty container
    /// ends.
    fn closes(&mut self, close: u8) -> Option<bool> {
        let closes = self.next()? == close;
        if closes {
            self.at += 1;
            self.depth -= 1;
        }
        Some(closes)
    }

    /// After a member or an item: `,` (false, another follows) or `close` (true, taken).
    fn closes_after_member(&mut self, close: u8) -> Option<bool> {
        match self.next()? {
            b',' => {
                self.at += 1;
                Some(false)
            }
            byte if byte == close => {
                self.at += 1;
                self.depth -= 1;
                Some(true)
            }
            _ => None,
        }
    }

    /// Takes the opening bracket at the cursor.
    fn enter(&mut self) -> Option<()> {
        self.at += 1;
        self.depth += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }

    /// A string, the cursor on its opening quote: no control character, escapes of one byte
    /// only (`\u` is left to serde_json).
    fn string(&mut self) -> Option<Scanned<'t>> {
        let bytes = self.bytes();
        let start = self.at + 1;
        let mut at = start;
        let mut escapes = 0;
        loop {
            at += string_stop(&bytes[at..])?;
            match bytes[at] {
                b'"' => break,
                b'\\'
                    if matches!(
                        bytes.get(at + 1)?,
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't'
                    ) =>
                {
                    escapes += 1;
                    at += 2;
                }
                _ => return None,
            }
        }
        self.at = at + 1;
        let raw = self.text.get(start..at)?;
        Some(Scanned { raw, len: raw.len() - escapes })
    }

    /// An object's key and the colon after it; a key with an escape is left to serde_json.
    fn key(&mut self) -> Option<&'t str> {
        if self.next()? != b'"' {
            return None;
        }
        let key = self.string()?;
        if key.escaped() || self.next()? != b':' {
            return None;
        }
        self.at += 1;
        Some(key.raw)
    }

    /// Walks one value, measuring its text; a message's walk also notes the kinds of its
    /// `role` and `content` (a repeated key's last value counts).
    fn walk(&mut self, message: bool) -> Option<Walked> {
        let walked = match self.next()? {
            b'"' => Walked::of(Kind::String, self.string()?.len),
            b'{' => {
                self.enter()?;
                let mut walked = Walked::of(Kind::Object, 0);
                if !self.closes(b'}')? {
                    loop {
                        let key = self.key()?;
                        let value = self.walk(false)?;
                        walked.text += value.text;
                        match key {
                            "role" if message => walked.role = Some(value.kind),
                            "content" if message => walked.content = Some(value.kind),
                            _ => {}
                        }
                        if self.closes_after_member(b'}')? {
                            break;
                        }
                    }
                }
                walked
            }
            b'[' => {
                self.enter()?;
                let mut text = 0;
                if !self.closes(b']')? {
                    loop {
                        text += self.walk(false)?.text;
                        if self.closes_after_member(b']')? {
                            break;
                        }
                    }
                }
                Walked::of(Kind::Array, text)
            }
            b't' => self.literal("true", Kind::Bool)?,
            b'f' => self.literal("false", Kind::Bool)?,
            b'n' => self.literal("null", Kind::Null)?,
            _ => {
                self.number()?;
                Walked::of(Kind::Number, 0)
            }
        };
        Some(walked)
    }

    fn literal(&mut self, word: &str, kind: Kind) -> Option<Walked> {
        self.text[self.at..].starts_with(word).then(|| {
            self.at += word.len();
            Walked::of(kind, 0)
        })
    }

    /// A number without an exponent and at most [`MAX_NUMBER`] bytes long.
    fn number(&mut self) -> Option<()> {
        let rest = &self.bytes()[self.at..];
        let digits = |from: usize| rest[from..].iter().take_while(|b| b.is_ascii_digit()).count();
        let mut len = usize::from(rest.first() == Some(&b'-'));
        len += match rest.get(len)? {
            b'0' => 1,
            b'1'..=b'9' => digits(len),
            _ => return None,
        };
        if rest.get(len) == Some(&b'.') {
            let fraction = digits(len + 1);
            if fraction == 0 {
                return None;
            }
            len += 1 + fraction;
        }
        if matches!(rest.get(len), Some(b'e' | b'E')) || len > MAX_NUMBER {
            return None;
        }
        self.at += len;
        Some(())
    }

    /// A read field's value: a plain string, a non-negative integer or a literal kept here,
    /// anything else read from its own text (which the walk found to be JSON) by the seeds of
    /// serde_json's path.
    fn read_member(&mut self, name: &'static str, reading: &mut Reading) -> Option<()> {
        let start = {
            self.next()?;
            self.at
        };
        let prompt = PROMPT_FIELDS.contains(&name);
        match self.bytes()[start] {
            b'"' => {
                let string = self.string()?;
                if !string.escaped() {
                    let text = string.raw.to_owned();
                    if prompt {
                        reading.prompt(name, PromptField::Text(text));
                    } else {
                        let built = reading.bounded(name).scalar(Value::String(text), string.len);
                        reading.value(name, built);
                    }
                    return Some(());
                }
            }
            b'0'..=b'9' => {
                self.number()?;
                if let (false, Ok(n)) = (prompt, self.text[start..self.at].parse::<u64>()) {
                    reading.value(name, reading.bounded(name).scalar(Value::from(n), 0));
                    return Some(());
                }
            }
            _ => {
                let walked = self.walk(false)?;
                let literal = match walked.kind {
                    Kind::Bool => Value::Bool(self.bytes()[start] == b't'),
                    Kind::Null => Value::Null,
                    _ => return self.read_span(name, start, reading),
                };
                match (prompt, literal) {
                    (true, Value::Null) => reading.prompt(name, PromptField::Null),
                    (true, _) => return self.read_span(name, start, reading),
                    (false, literal) => {
                        reading.value(name, reading.bounded(name).scalar(literal, 0))
                    }
                }
                return Some(());
            }
        }
        self.read_span(name, start, reading)
    }

    /// Reads the value of `name` from `start` to the cursor with serde_json's seeds.
    fn read_span(&self, name: &'static str, start: usize, reading: &mut Reading) -> Option<()> {
        let mut deserializer = serde_json::Deserializer::from_str(&self.text[start..self.at]);
        Member { name, reading }.deserialize(&mut deserializer).ok()?;
        deserializer.end().ok()
    }

    /// `messages`: a list's length, text and first item that is no message, or the text of
    /// any other value.
    fn messages(&mut self) -> Option<Messages> {
        if self.next()? != b'[' {
            let text = self.walk(false)?.text;
            return Some(Messages { count: None, text, problem: None });
        }
        self.enter()?;
        let (mut count, mut text, mut problem) = (0, 0, None);
        if !self.closes(b']')? {
            loop {
                let message = self.walk(true)?;
                if problem.is_none() {
                    problem = message_problem(&message).map(|why| (count, why));
                }
                count += 1;
                text += message.text;
                if self.closes_after_member(b']')? {
                    break;
                }
            }
        }
        Some(Messages { count: Some(count), text, problem })
    }
}

/// Where the first byte of `text` that ends a string's plain run is: a quote, a backslash or a
/// control character (which no JSON string holds), looked at a word (8 bytes) at a time.
fn string_stop(text: &[u8]) -> Option<usize> {
    let stops =
        |word| words::equal(word, b'"') | words::equal(word, b'\\') | words::below(word, 0x20);
    words::first(text, stops)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_stop_is_found_at_every_place_and_length() {
        for len in 0..40 {
            for place in 0..=len {
                for stop in [b'"', b'\\', 0x00, 0x1f] {
                    // Bytes around the stops that a word-wise search could mistake.
                    let mut text: Vec<u8> =
                        (0..len).map(|i| [b'a', 0x20, 0x21, 0x5d, 0x7f, 0xc3][i % 6]).collect();
                    if place < len {
                        text[place] = stop;
                        if place + 1 < len {
                            text[place + 1] = 0x01;
                        }
                    }
                    let expected = text.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20);
                    assert_eq!(string_stop(&text), expected, "{len} bytes, stop {stop} at {place}");
                }
            }
        }
    }
}
