//! The counts of one JSON answer, read where engines put them: OpenAI-compatible servers end
//! their answer with `usage` and SGLang's `/generate` with `meta_info`, so that last member is
//! found by a search for its key and read field by field; the members before it are not
//! parsed. Whenever the answer is shaped otherwise (its counts elsewhere, both kinds or one
//! spelled twice anywhere in it, a batch), the caller parses it whole. On a well-formed answer
//! the two agree (the usage tests' `reads_what_serde_reads` property holds them to it); on a
//! malformed one the counts of an intact last member are still read, the bytes passing to the
//! client unchanged either way.

use memchr::memmem::Finder;

use super::{META_KEY, USAGE_KEY, Usage};
use crate::words;

/// Containers nested deeper than this are refused, as serde_json refuses them.
const MAX_DEPTH: u32 = 128;

/// The counts of the answer `text` when they are its last member: `Some(None)` when that
/// member says there are none, `None` when the answer is not shaped so (parse it whole).
pub(super) fn of_last_member(text: &[u8]) -> Option<Option<Usage>> {
    // The one counts key of the answer, spelled once: with both kinds, or one given twice, the
    // whole answer decides which counts stand (or that it is refused). Forward searches only:
    // memchr's are vectorised, its reverse ones are not.
    let once = |key: &Finder<'_>, at: usize| {
        let after = at + key.needle().len();
        key.find(&text[after..]).is_none().then_some(at)
    };
    let (at, openai) = match (USAGE_KEY.find(text), META_KEY.find(text)) {
        (Some(usage), None) => (once(&USAGE_KEY, usage)?, true),
        (None, Some(meta)) => (once(&META_KEY, meta)?, false),
        _ => return None,
    };
    // A key opens its member: after the object's `{` or the previous member's `,`. A quote
    // after either is no string's content (that would be escaped), so this is a key.
    let before = text[..at].trim_ascii_end();
    if !matches!(before.last(), Some(b',' | b'{')) {
        return None;
    }
    let mut scan = Scan { text, at };
    let (_, escaped) = scan.string()?;
    debug_assert!(!escaped, "the searched keys hold no escape");
    scan.expect(b':')?;
    let counts = scan.count_object(openai)?;
    // Its object is the answer: what follows is its closing brace alone.
    scan.expect(b'}')?;
    scan.blank();
    if scan.at != text.len() || !text.trim_ascii_start().starts_with(b"{") {
        return None;
    }
    Some(counts)
}

/// A cursor over JSON text. Every method returns `None` on text that is not JSON where it
/// looks.
struct Scan<'t> {
    text: &'t [u8],
    at: usize,
}

/// Which count a member of a counts object names.
#[derive(Clone, Copy)]
enum Count {
    Prompt,
    Completion,
    Cached,
    /// `prompt_tokens_details`, the object holding OpenAI's `cached_tokens`.
    Details,
}

impl<'t> Scan<'t> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    /// Skips JSON whitespace.
    fn blank(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// Skips blanks, then takes `byte`.
    fn expect(&mut self, byte: u8) -> Option<()> {
        self.blank();
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// Skips blanks; whether the next byte is `close` (then taken), as an empty container
    /// ends.
    fn closes(&mut self, close: u8) -> Option<bool> {
        self.blank();
        let closes = self.peek()? == close;
        self.at += usize::from(closes);
        Some(closes)
    }

    /// After a member: `,` (false, another follows) or `close` (true, taken).
    fn closes_after_member(&mut self, close: u8) -> Option<bool> {
        self.blank();
        match self.peek()? {
            b',' => {
                self.at += 1;
                Some(false)
            }
            byte if byte == close => {
                self.at += 1;
                Some(true)
            }
            _ => None,
        }
    }

    /// A string's raw contents (escapes left as they are), the cursor on its opening quote,
    /// and whether it holds an escape.
    fn string(&mut self) -> Option<(&'t [u8], bool)> {
        let text = self.text;
        self.blank();
        if self.peek()? != b'"' {
            return None;
        }
        let start = self.at + 1;
        let mut at = start;
        let mut escaped = false;
        loop {
            at += special(text.get(at..)?)?;
            if text[at] == b'"' {
                self.at = at + 1;
                return Some((&text[start..at], escaped));
            }
            escaped = true;
            at += 2;
        }
    }

    /// An object key, compared with `names`: the index of the one it spells.
    fn key(&mut self, names: &[&str]) -> Option<Option<usize>> {
        let (raw, escaped) = self.string()?;
        let found = if escaped {
            // An escape may spell a name (`"\u0075sage"`): unescaped, as serde reads it.
            let quoted = &self.text[self.at - raw.len() - 2..self.at];
            let key = serde_json::from_slice::<String>(quoted).ok()?;
            names.iter().position(|name| key == *name)
        } else {
            names.iter().position(|name| raw == name.as_bytes())
        };
        self.expect(b':')?;
        Some(found)
    }

    /// `null`, or a counts object: OpenAI's `usage` (with `prompt_tokens_details`) when
    /// `openai`, else SGLang's `meta_info` (with `cached_tokens` at the top).
    fn count_object(&mut self, openai: bool) -> Option<Option<Usage>> {
        let names: &[&str] = if openai {
            &["prompt_tokens", "completion_tokens", "prompt_tokens_details"]
        } else {
            &["prompt_tokens", "completion_tokens", "cached_tokens"]
        };
        let counts = if openai {
            [Count::Prompt, Count::Completion, Count::Details]
        } else {
            [Count::Prompt, Count::Completion, Count::Cached]
        };
        if self.null()? {
            return Some(None);
        }
        let mut usage = Usage::default();
        let mut seen = [false; 3];
        self.expect(b'{')?;
        if !self.closes(b'}')? {
            loop {
                match self.key(names)? {
                    Some(field) => {
                        if std::mem::replace(&mut seen[field], true) {
                            return None;
                        }
                        match counts[field] {
                            Count::Prompt => usage.prompt = self.count()?,
                            Count::Completion => usage.completion = self.count()?,
                            Count::Cached => usage.cached = self.count()?,
                            Count::Details => usage.cached = self.details()?,
                        }
                    }
                    None => self.skip_value()?,
                }
                if self.closes_after_member(b'}')? {
                    break;
                }
            }
        }
        Some(Some(usage))
    }

    /// `prompt_tokens_details`: `null` or an object with `cached_tokens`; the cached count.
    fn details(&mut self) -> Option<u64> {
        if self.null()? {
            return Some(0);
        }
        let mut cached = None;
        self.expect(b'{')?;
        if !self.closes(b'}')? {
            loop {
                match self.key(&["cached_tokens"])? {
                    Some(_) if cached.is_some() => return None,
                    Some(_) => cached = Some(self.count()?),
                    None => self.skip_value()?,
                }
                if self.closes_after_member(b'}')? {
                    break;
                }
            }
        }
        Some(cached.unwrap_or(0))
    }

    /// Whether the next value is `null` (then taken).
    fn null(&mut self) -> Option<bool> {
        self.blank();
        let null = self.text[self.at..].starts_with(b"null");
        self.at += if null { 4 } else { 0 };
        Some(null)
    }

    /// A count: `null` (0) or an integer that fits in 64 bits; a fraction, an exponent, a sign
    /// or anything else is not a count.
    fn count(&mut self) -> Option<u64> {
        if self.null()? {
            return Some(0);
        }
        let digits = self.text[self.at..].iter().take_while(|b| b.is_ascii_digit()).count();
        let number = &self.text[self.at..self.at + digits];
        if digits == 0 || (digits > 1 && number[0] == b'0') {
            return None;
        }
        self.at += digits;
        if let Some(b'.' | b'e' | b'E') = self.peek() {
            return None;
        }
        number.iter().try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
    }

    /// Skips one value of any kind, its brackets matched.
    fn skip_value(&mut self) -> Option<()> {
        self.blank();
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' | b'[' => self.skip_container(),
            _ => self.skip_scalar(),
        }
    }

    /// Skips a number or a literal (`true`, `false`, `null`).
    fn skip_scalar(&mut self) -> Option<()> {
        let rest = &self.text[self.at..];
        let len = match rest.first()? {
            b't' if rest.starts_with(b"true") => 4,
            b'f' if rest.starts_with(b"false") => 5,
            b'n' if rest.starts_with(b"null") => 4,
            b'-' | b'0'..=b'9' => rest
                .iter()
                .take_while(|b| matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                .count(),
            _ => return None,
        };
        self.at += len;
        Some(())
    }

    /// Skips an object or an array, every bracket inside matched with its opener.
    fn skip_container(&mut self) -> Option<()> {
        // The open brackets, one bit each (set for `{`), innermost in the lowest bit.
        let (mut open, mut depth) = (0u128, 0u32);
        loop {
            match self.peek()? {
                b'"' => {
                    self.string()?;
                    continue;
                }
                byte @ (b'{' | b'[') => {
                    if depth == MAX_DEPTH {
                        return None;
                    }
                    open = open << 1 | u128::from(byte == b'{');
                    depth += 1;
                }
                byte @ (b'}' | b']') => {
                    if depth == 0 || (open & 1 == 1) != (byte == b'}') {
                        return None;
                    }
                    open >>= 1;
                    depth -= 1;
                    if depth == 0 {
                        self.at += 1;
                        return Some(());
                    }
                }
                _ => {}
            }
            self.at += 1;
        }
    }
}

/// Where the first quote or backslash of `text` is: keys and short values are looked at a
/// word (8 bytes) at a time, the rest of a long string by memchr's vectorised search (which
/// costs more than a short string to start).
fn special(text: &[u8]) -> Option<usize> {
    const BY_WORD: usize = 32;
    let head = &text[..text.len().min(BY_WORD)];
    let specials = |word| words::equal(word, b'"') | words::equal(word, b'\\');
    if let Some(at) = words::first(head, specials) {
        return Some(at);
    }
    if text.len() > BY_WORD {
        return memchr::memchr2(b'"', b'\\', &text[BY_WORD..]).map(|at| at + BY_WORD);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::special;

    #[test]
    fn the_first_quote_or_backslash_is_found_at_every_place_and_length() {
        for len in 0..80 {
            for place in 0..=len {
                for special_byte in [b'"', b'\\'] {
                    // Bytes around the searched ones that a word-wise search could mistake.
                    let mut text: Vec<u8> =
                        (0..len).map(|i| [b'a', 0x01, 0x21, 0x5d][i % 4]).collect();
                    if place < len {
                        text[place] = special_byte;
                        // A later one never wins over the first.
                        if place + 1 < len {
                            text[place + 1] = b'"';
                        }
                    }
                    let expected = text.iter().position(|&b| b == b'"' || b == b'\\');
                    assert_eq!(special(&text), expected, "{len} bytes, at {place}");
                }
            }
        }
    }
}
