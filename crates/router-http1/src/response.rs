//! The server side's answer heads and chunk framing, written as hyper would write them: the
//! status line, the handler's fields, a `Date`, the body's framing (its Content-Length, or
//! chunked transfer coding when its length is not known), and `connection: close` when the
//! connection closes after it.

use std::cell::RefCell;
use std::time::SystemTime;

use http::header::{CONNECTION, CONTENT_LENGTH, DATE};
use http::{HeaderMap, StatusCode};

use crate::text::{content_length, decimal, field};

/// How an answer's body is framed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// A Content-Length.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// No body (204 and 304).
    None,
}

impl Framing {
    /// Whether a body framed so ended where its framing said it would after `written` bytes.
    #[inline]
    pub fn written_whole(self, written: u64) -> bool {
        match self {
            Framing::Length(declared) => written == declared,
            Framing::Chunked | Framing::None => true,
        }
    }
}

/// Writes the head of an answer into `head` (cleared first): the status line, `fields`, the
/// date and the body's framing as hyper would add them (`exact`: the body's length when it is
/// known before it is read), and `connection: close` when `close`.
pub fn write_response_head(
    head: &mut Vec<u8>,
    status: StatusCode,
    fields: &HeaderMap,
    exact: Option<u64>,
    close: bool,
) -> Framing {
    head.clear();
    head.extend_from_slice(b"HTTP/1.1 ");
    head.extend_from_slice(status.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
    head.extend_from_slice(b"\r\n");
    // The fields the framing depends on are noted as they are written, not looked up.
    let (mut dated, mut length, mut connection) = (false, None, false);
    for (name, value) in fields {
        field(head, name.as_str().as_bytes(), value.as_bytes());
        if *name == DATE {
            dated = true;
        } else if *name == CONTENT_LENGTH {
            length = length.or(Some(value));
        } else if *name == CONNECTION {
            connection = true;
        }
    }
    if !dated {
        DATE_NOW.with_borrow_mut(|date| field(head, b"date", date.now()));
    }
    let framing = if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        Framing::None
    } else if let Some(declared) = length.and_then(|v| content_length(v.as_bytes())) {
        Framing::Length(declared)
    } else if let Some(exact) = exact {
        let mut digits = [0; 20];
        field(head, b"content-length", decimal(exact, &mut digits));
        Framing::Length(exact)
    } else {
        field(head, b"transfer-encoding", b"chunked");
        Framing::Chunked
    };
    if close && !connection {
        field(head, b"connection", b"close");
    }
    head.extend_from_slice(b"\r\n");
    framing
}

/// A chunk's size line (`1a2b\r\n`), written on the stack.
#[derive(Default)]
pub struct ChunkSize([u8; 18]);

impl ChunkSize {
    /// The size line of an `n`-byte chunk.
    #[inline]
    pub fn of(&mut self, n: usize) -> &[u8] {
        let mut at = self.0.len() - 2;
        self.0[at..].copy_from_slice(b"\r\n");
        let mut n = n;
        loop {
            at -= 1;
            self.0[at] = b"0123456789abcdef"[n & 0xf];
            n >>= 4;
            if n == 0 {
                return &self.0[at..];
            }
        }
    }
}

/// The `Date` field's value, formatted once a second per thread.
struct DateNow {
    second: u64,
    text: [u8; 29],
}

impl DateNow {
    fn now(&mut self) -> &[u8] {
        let now = SystemTime::now();
        let second = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if second != self.second {
            self.second = second;
            let text = httpdate::fmt_http_date(now);
            if text.len() == self.text.len() {
                self.text.copy_from_slice(text.as_bytes());
            }
        }
        &self.text
    }
}

thread_local! {
    static DATE_NOW: RefCell<DateNow> = const { RefCell::new(DateNow { second: 0, text: [b' '; 29] }) };
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, StatusCode};

    use super::{ChunkSize, Framing, write_response_head};

    #[test]
    fn chunk_sizes_are_written_in_hexadecimal() {
        assert_eq!(ChunkSize::default().of(0), b"0\r\n");
        assert_eq!(ChunkSize::default().of(0x1a2b), b"1a2b\r\n");
        assert_eq!(ChunkSize::default().of(usize::MAX), b"ffffffffffffffff\r\n");
    }

    /// The head as text with its date blanked.
    fn written(
        status: StatusCode,
        fields: &HeaderMap,
        exact: Option<u64>,
        close: bool,
    ) -> (String, Framing) {
        let mut head = Vec::new();
        let framing = write_response_head(&mut head, status, fields, exact, close);
        let text = String::from_utf8(head).expect("text");
        let dated = text.find("date: ").expect("a date");
        let text = format!("{}date: -{}", &text[..dated], &text[dated + 35..]);
        (text, framing)
    }

    #[test]
    fn an_answer_head_frames_its_body_as_hyper_would() {
        let mut fields = HeaderMap::new();
        fields.insert("content-type", HeaderValue::from_static("application/json"));
        let (head, framing) = written(StatusCode::OK, &fields, Some(12), false);
        assert_eq!(
            head,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ndate: -\r\ncontent-length: 12\r\n\r\n"
        );
        assert_eq!(framing, Framing::Length(12));
        let (head, framing) = written(StatusCode::OK, &fields, None, true);
        assert!(
            head.ends_with("transfer-encoding: chunked\r\nconnection: close\r\n\r\n"),
            "{head}"
        );
        assert_eq!(framing, Framing::Chunked);
        let (head, framing) = written(StatusCode::NO_CONTENT, &HeaderMap::new(), Some(0), false);
        assert_eq!(head, "HTTP/1.1 204 No Content\r\ndate: -\r\n\r\n");
        assert_eq!(framing, Framing::None);
        // A handler's own length stands, and is what the body is held to.
        fields.insert("content-length", HeaderValue::from_static("3"));
        assert_eq!(written(StatusCode::OK, &fields, None, false).1, Framing::Length(3));
        assert!(Framing::Length(3).written_whole(3) && !Framing::Length(3).written_whole(2));
    }
}
