//! A reader of the Prometheus text exposition format (version 0.0.4, what `prometheus_client`
//! serves at `/metrics`), for the few series a load source needs.
//!
//! The body is read line by line (`\n`, with an optional `\r` before it). Blank lines and
//! comments (`# HELP`, `# TYPE`, `# EOF`, anything after `#`) are skipped; so is every sample
//! line whose metric name the caller does not want, after reading its name only, whatever
//! follows (histogram buckets, counters, other exporters' series: never parsed, never a
//! reason to refuse the body). A wanted line is read strictly:
//!
//! ```text
//! name [ "{" label="value" { "," label="value" } [","] "}" ] value [ timestamp ]
//! ```
//!
//! with blanks (spaces, tabs) allowed between tokens and needed between the name and the
//! value when there are no labels, and between the value and the timestamp, as Prometheus
//! reads it; label values unescaped (`\\`, `\"`,
//! `\n`; any other escape is kept as written, as Prometheus does); the value any float Rust
//! reads, `NaN`, `+Inf` and `-Inf` included (judging it is the caller's business); the
//! timestamp an integer, dropped. A wanted line that does not fit refuses the whole body, with
//! its line number. Nothing here panics or allocates more than the wanted lines need.

use std::borrow::Cow;

/// One sample line: metric name, labels (values unescaped) and value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PromSample<'a> {
    pub(crate) name: &'a str,
    pub(crate) labels: Vec<(&'a str, Cow<'a, str>)>,
    pub(crate) value: f64,
}

impl PromSample<'_> {
    /// The value of the label `name`, when the sample has it.
    pub(crate) fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_ref())
    }
}

/// A wanted sample line of a Prometheus text body that does not fit the format.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {problem} in {near:?}")]
pub struct PrometheusError {
    /// The line, counting from 1.
    pub line: usize,
    /// What is wrong.
    pub problem: &'static str,
    /// The start of the offending line, at most [`PrometheusError::NEAR`] bytes.
    pub near: String,
}

impl PrometheusError {
    /// Most bytes of the offending line an error quotes.
    pub const NEAR: usize = 80;

    fn new(line: usize, text: &[u8], problem: &'static str) -> Self {
        let end = text.len().min(Self::NEAR);
        Self { line, problem, near: String::from_utf8_lossy(&text[..end]).into_owned() }
    }
}

/// The samples of the metrics `wanted` accepts, in body order.
pub(crate) fn parse<'a>(
    body: &'a [u8],
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<PromSample<'a>>, PrometheusError> {
    let mut samples = Vec::new();
    let mut rest = body;
    let mut line_no = 0usize;
    while !rest.is_empty() {
        line_no += 1;
        let (line, next) = match memchr::memchr(b'\n', rest) {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        rest = next;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let line = trim_blanks_start(line);
        if line.is_empty() || line[0] == b'#' {
            continue;
        }
        let name_len = line.iter().position(|b| !is_name_byte(*b)).unwrap_or(line.len());
        let name = &line[..name_len];
        // Names are ASCII, so this never fails; a name starting with a digit is nobody's.
        let Ok(name) = std::str::from_utf8(name) else { continue };
        if name.is_empty() || name.as_bytes()[0].is_ascii_digit() || !wanted(name) {
            continue;
        }
        samples.push(
            sample(name, &line[name_len..])
                .map_err(|problem| PrometheusError::new(line_no, line, problem))?,
        );
    }
    Ok(samples)
}

/// The rest of a wanted line after its name.
fn sample<'a>(name: &'a str, after_name: &'a [u8]) -> Result<PromSample<'a>, &'static str> {
    let text = std::str::from_utf8(after_name).map_err(|_| "invalid UTF-8")?;
    let mut cursor = Cursor { text, at: 0 };
    let blank = cursor.skip_blanks();
    let labels = if cursor.eat(b'{') {
        let labels = labels(&mut cursor)?;
        cursor.skip_blanks();
        labels
    } else if blank {
        Vec::new()
    } else {
        return Err("no blank before the value");
    };
    if cursor.done() {
        return Err("no value");
    }
    let value = cursor.token();
    let value = parse_float(value).ok_or("bad value")?;
    if cursor.skip_blanks() && !cursor.done() {
        let timestamp = cursor.token();
        timestamp.parse::<i64>().map_err(|_| "bad timestamp")?;
        cursor.skip_blanks();
    }
    if !cursor.done() {
        return Err("text after the sample");
    }
    Ok(PromSample { name, labels, value })
}

/// The labels after `{`, through the closing `}`.
fn labels<'a>(cursor: &mut Cursor<'a>) -> Result<Vec<(&'a str, Cow<'a, str>)>, &'static str> {
    let mut labels: Vec<(&'a str, Cow<'a, str>)> = Vec::new();
    loop {
        cursor.skip_blanks();
        if cursor.eat(b'}') {
            return Ok(labels);
        }
        let name = cursor.label_name().ok_or("bad label name")?;
        cursor.skip_blanks();
        if !cursor.eat(b'=') {
            return Err("no `=` after a label name");
        }
        cursor.skip_blanks();
        if !cursor.eat(b'"') {
            return Err("label value not quoted");
        }
        let value = cursor.label_value().ok_or("unterminated label value")?;
        if labels.iter().any(|(n, _)| *n == name) {
            return Err("duplicate label");
        }
        labels.push((name, value));
        cursor.skip_blanks();
        if cursor.eat(b',') {
            continue;
        }
        if cursor.eat(b'}') {
            return Ok(labels);
        }
        return Err("no `,` or `}` after a label");
    }
}

/// A position in the text of one line.
struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn done(&self) -> bool {
        self.at >= self.text.len()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let ate = self.peek() == Some(byte);
        self.at += usize::from(ate);
        ate
    }

    /// Skips spaces and tabs; returns whether there were any.
    fn skip_blanks(&mut self) -> bool {
        let start = self.at;
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
        self.at > start
    }

    /// Everything up to the next blank or the end.
    fn token(&mut self) -> &'a str {
        let rest = &self.text[self.at..];
        let len = rest.find([' ', '\t']).unwrap_or(rest.len());
        self.at += len;
        &rest[..len]
    }

    /// `[a-zA-Z_][a-zA-Z0-9_]*`.
    fn label_name(&mut self) -> Option<&'a str> {
        let rest = &self.text[self.at..];
        let len = rest
            .bytes()
            .position(|b| !(b.is_ascii_alphanumeric() || b == b'_'))
            .unwrap_or(rest.len());
        if len == 0 || rest.as_bytes()[0].is_ascii_digit() {
            return None;
        }
        self.at += len;
        Some(&rest[..len])
    }

    /// A label value after its opening quote, through the closing one, unescaped.
    fn label_value(&mut self) -> Option<Cow<'a, str>> {
        let rest = &self.text[self.at..];
        let bytes = rest.as_bytes();
        let mut owned: Option<String> = None;
        let mut copied = 0;
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'"' => {
                    self.at += i + 1;
                    return Some(match owned {
                        None => Cow::Borrowed(&rest[..i]),
                        Some(mut value) => {
                            value.push_str(&rest[copied..i]);
                            Cow::Owned(value)
                        }
                    });
                }
                b'\\' => {
                    let escaped = *bytes.get(i + 1)?;
                    let value = owned.get_or_insert_with(String::new);
                    value.push_str(&rest[copied..i]);
                    match escaped {
                        b'\\' => value.push('\\'),
                        b'"' => value.push('"'),
                        b'n' => value.push('\n'),
                        // Kept as written; a multi-byte character after the backslash is
                        // copied whole below.
                        _ => {
                            value.push('\\');
                            copied = i + 1;
                            i += 1;
                            continue;
                        }
                    }
                    i += 2;
                    copied = i;
                }
                _ => i += 1,
            }
        }
        None
    }
}

/// Bytes of a metric name: `[a-zA-Z0-9_:]` (the first one no digit, checked apart).
fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

fn trim_blanks_start(line: &[u8]) -> &[u8] {
    let start = line.iter().position(|b| !matches!(b, b' ' | b'\t')).unwrap_or(line.len());
    &line[start..]
}

/// A sample value: a decimal float, `NaN`, `+Inf`, `-Inf` (any case, as Go reads them).
fn parse_float(text: &str) -> Option<f64> {
    if text.is_empty() {
        return None;
    }
    text.parse::<f64>().ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn all(body: &str) -> Result<Vec<PromSample<'_>>, PrometheusError> {
        parse(body.as_bytes(), |name| name.starts_with("want"))
    }

    /// A sample as owned values, to compare.
    type Owned = (String, Vec<(String, String)>, f64);
    /// A wanted line and the sample it holds: name, labels, value.
    type Case<'a> = (&'a str, (&'a str, &'a [(&'a str, &'a str)], f64));

    fn owned(samples: &[PromSample<'_>]) -> Vec<Owned> {
        samples
            .iter()
            .map(|s| {
                let labels =
                    s.labels.iter().map(|(n, v)| ((*n).to_owned(), v.to_string())).collect();
                (s.name.to_owned(), labels, s.value)
            })
            .collect()
    }

    fn one(name: &str, labels: &[(&str, &str)], value: f64) -> Owned {
        let labels = labels.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
        (name.to_owned(), labels, value)
    }

    #[test]
    fn reads_wanted_lines_in_every_legal_shape() {
        let cases: &[Case<'_>] = &[
            ("want 1", ("want", &[], 1.0)),
            ("want 1 1712345678901", ("want", &[], 1.0)),
            ("want -3 -5", ("want", &[], -3.0)),
            ("  want\t2.5e3  ", ("want", &[], 2500.0)),
            ("want{} 7", ("want", &[], 7.0)),
            ("want{a=\"x\"} 7", ("want", &[("a", "x")], 7.0)),
            ("want{a=\"x\"}7", ("want", &[("a", "x")], 7.0)),
            ("want { a = \"x\" , b=\"\" , } 7", ("want", &[("a", "x"), ("b", "")], 7.0)),
            ("want{a=\"x\",b=\"y\",} 7", ("want", &[("a", "x"), ("b", "y")], 7.0)),
            (r#"want{a="q\"uo\\te\nd"} 1"#, ("want", &[("a", "q\"uo\\te\nd")], 1.0)),
            (r#"want{a="keep \t and \é"} 1"#, ("want", &[("a", "keep \\t and \\é")], 1.0)),
            (r#"want{a="}, {b=\"c\"} 9"} 1"#, ("want", &[("a", "}, {b=\"c\"} 9")], 1.0)),
            ("want{a=\"ünïcödé\"} 1", ("want", &[("a", "ünïcödé")], 1.0)),
            ("want:colon_name{engine=\"0\"} 3.0", ("want:colon_name", &[("engine", "0")], 3.0)),
            ("want 1.0\r", ("want", &[], 1.0)),
            ("want +Inf", ("want", &[], f64::INFINITY)),
            ("want -Inf", ("want", &[], f64::NEG_INFINITY)),
            ("want 1e-3", ("want", &[], 0.001)),
            ("want .5", ("want", &[], 0.5)),
        ];
        for (line, (name, labels, value)) in cases {
            let got = all(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            assert_eq!(owned(&got), vec![one(name, labels, *value)], "{line:?}");
        }
        let nan = all("want NaN").expect("NaN is a value");
        assert!(nan[0].value.is_nan());
    }

    #[test]
    fn refuses_wanted_lines_that_do_not_fit() {
        let cases = [
            ("want", "no blank before the value"),
            ("want ", "no value"),
            ("want{a=\"x\"}", "no value"),
            ("want{a=\"x\"}  ", "no value"),
            ("want-x 1", "no blank before the value"),
            ("want abc", "bad value"),
            ("want 1 2.5", "bad timestamp"),
            ("want 1 2 3", "text after the sample"),
            ("want{a=x} 1", "label value not quoted"),
            ("want{a=\"x} 1", "unterminated label value"),
            ("want{a=\"x\\\"} 1", "unterminated label value"),
            ("want{a=\"x\\", "unterminated label value"),
            ("want{a=\"x\" b=\"y\"} 1", "no `,` or `}` after a label"),
            ("want{a} 1", "no `=` after a label name"),
            ("want{1a=\"x\"} 1", "bad label name"),
            ("want{,} 1", "bad label name"),
            ("want{a=\"x\",a=\"y\"} 1", "duplicate label"),
            ("want{a=\"x\"", "no `,` or `}` after a label"),
        ];
        for (line, problem) in cases {
            let body = format!("# HELP want a gauge\n# TYPE want gauge\n{line}\n");
            let err = all(&body).expect_err(line);
            assert_eq!((err.line, err.problem), (3, problem), "{line:?}: {err}");
            assert!(err.to_string().starts_with("line 3: "), "{err}");
        }
        let err = parse(b"want{a=\"\xff\"} 1", |_| true).expect_err("latin-1");
        assert_eq!(err.problem, "invalid UTF-8");
    }

    #[test]
    fn skips_comments_blank_lines_and_unwanted_series_whatever_they_hold() {
        let body: &[u8] = b"# HELP want_g A gauge.\n\
                    # TYPE want_g gauge\n\
                    \n\
                    other_bucket{le=\"+Inf\",model_name=\"m\"} 12.0\n\
                    other garbage that is no sample at all\n\
                    <html><body>not found</body></html>\n\
                    9digits_first 1\n\
                    \xff\xfe binary\n\
                    want_g{engine=\"1\"} 4.0 1712345678901\r\n\
                    # EOF\n\
                    want_g{engine=\"0\"} 2.0";
        let got = parse(body, |n| n == "want_g").expect("valid");
        assert_eq!(
            owned(&got),
            vec![one("want_g", &[("engine", "1")], 4.0), one("want_g", &[("engine", "0")], 2.0)]
        );
        assert_eq!(got[0].label("engine"), Some("1"));
        assert_eq!(got[0].label("model_name"), None);
    }

    #[test]
    fn quotes_at_most_the_start_of_a_long_line() {
        let line = format!("want{{a=\"{}", "x".repeat(1000));
        let err = all(&line).expect_err("unterminated");
        assert_eq!(err.near.len(), PrometheusError::NEAR);
    }

    /// A label value as `prometheus_client` escapes it.
    fn escape(value: &str) -> String {
        value.replace('\\', "\\\\").replace('\n', "\\n").replace('"', "\\\"")
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_are_refused_without_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&body, |_| true);
            let _ = parse(&body, |name| name.starts_with('v'));
        }

        #[test]
        fn lines_made_of_sample_like_pieces_never_panic(
            pieces in proptest::collection::vec(
                prop::sample::select(vec![
                    "want", "{", "}", "a", "=", "\"", "\\", ",", " ", "\t", "\n", "\r", "1", "-",
                    "+Inf", "NaN", "e", ".", "#", "é", "x",
                ]),
                0..64,
            )
        ) {
            let body: String = pieces.concat();
            let _ = all(&body);
        }

        #[test]
        fn escaped_label_values_read_back_exactly(
            values in proptest::collection::vec(any::<String>(), 1..4),
            value in any::<f64>(),
            timestamp in proptest::option::of(any::<i64>()),
        ) {
            let labels: Vec<String> = values
                .iter()
                .enumerate()
                .map(|(i, v)| format!("l{i}=\"{}\"", escape(v)))
                .collect();
            let timestamp = timestamp.map(|t| format!(" {t}")).unwrap_or_default();
            let line = format!("want{{{}}} {value:?}{timestamp}\n", labels.join(","));
            let got = all(&line).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(got.len(), 1);
            let read: Vec<String> = got[0].labels.iter().map(|(_, v)| v.to_string()).collect();
            prop_assert_eq!(read, values);
            prop_assert!(got[0].value == value || (value.is_nan() && got[0].value.is_nan()));
        }
    }
}
