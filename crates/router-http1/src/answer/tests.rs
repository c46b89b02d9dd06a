//! The wire format alone: request heads as engines read them, answer heads and their framing
//! (including the refusals), and chunked bodies however the bytes are split.

use bytes::BytesMut;
use http::{HeaderName, HeaderValue, StatusCode};
use proptest::prelude::*;

use super::{
    Chunked, Decoded, Framing, MAX_HEAD_BYTES, RequestHead, WireError, chunk_size,
    parse_answer_head,
};

#[test]
fn a_request_head_has_its_line_its_fields_and_its_length() {
    let mut head = RequestHead::new("POST", "/v1/chat/completions?x=1");
    head.field(&http::header::HOST, &HeaderValue::from_static("127.0.0.1:8000"));
    head.decimal_field(&HeaderName::from_static("x-data-parallel-rank"), 0);
    head.decimal_field(&HeaderName::from_static("x-n"), 1_234_567_890_123);
    let head = head.finish(42);
    assert_eq!(
        std::str::from_utf8(&head).expect("text"),
        "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:8000\r\n\
         x-data-parallel-rank: 0\r\nx-n: 1234567890123\r\ncontent-length: 42\r\n\r\n"
    );
    let mut fields = [httparse::EMPTY_HEADER; 8];
    let mut parsed = httparse::Request::new(&mut fields);
    assert_eq!(parsed.parse(&head), Ok(httparse::Status::Complete(head.len())));
    assert_eq!(parsed.path, Some("/v1/chat/completions?x=1"));
}

fn parsed(text: &str) -> Result<Option<super::AnswerHead>, WireError> {
    parse_answer_head(&mut BytesMut::from(text))
}

fn head(text: &str) -> super::AnswerHead {
    parsed(text).expect("a valid head").expect("a whole head")
}

#[test]
fn an_answer_head_is_taken_off_the_buffer_and_the_fields_the_router_reads_kept() {
    let mut buf = BytesMut::from(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-A: 1\r\nX-A: 2\r\n\
         Cache-Control: no-cache\r\nretry-after: 3\r\nContent-Length: 5\r\n\r\nhello",
    );
    let head = parse_answer_head(&mut buf).expect("valid").expect("whole");
    assert_eq!(&buf[..], b"hello");
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.headers["content-type"], "text/event-stream");
    assert_eq!(head.headers["cache-control"], "no-cache");
    assert_eq!(head.headers["retry-after"], "3");
    // Only the fields the router reads or passes on are kept.
    assert!(!head.headers.contains_key("x-a"), "{:?}", head.headers);
    assert!(!head.headers.contains_key("content-length"), "{:?}", head.headers);
    assert_eq!(head.framing, Framing::Length(5));
    assert!(head.reusable);
}

#[test]
fn a_head_that_has_not_all_arrived_asks_for_more_and_leaves_the_buffer() {
    for cut in 1.."HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".len() {
        let text = &"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"[..cut];
        let mut buf = BytesMut::from(text);
        assert!(parse_answer_head(&mut buf).expect("valid so far").is_none(), "{text:?}");
        assert_eq!(&buf[..], text.as_bytes());
    }
}

#[test]
fn framing_follows_rfc_9112() {
    let cases = [
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", Framing::Chunked, true),
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n", Framing::Chunked, true),
        // Transfer-Encoding wins over Content-Length, and the connection is not reused.
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            Framing::Chunked,
            false,
        ),
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", Framing::UntilClose, false),
        ("HTTP/1.1 200 OK\r\n\r\n", Framing::UntilClose, false),
        ("HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n", Framing::Length(0), true),
        ("HTTP/1.1 304 Not Modified\r\n\r\n", Framing::Length(0), true),
        ("HTTP/1.1 100 Continue\r\n\r\n", Framing::Length(0), true),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n",
            Framing::Length(2),
            true,
        ),
        ("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", Framing::Length(2), false),
        (
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive, Close\r\n\r\n",
            Framing::Length(2),
            false,
        ),
    ];
    for (text, framing, reusable) in cases {
        let head = head(text);
        assert_eq!((head.framing, head.reusable), (framing, reusable), "{text:?}");
    }
}

#[test]
fn a_malformed_head_is_refused_with_its_reason() {
    let cases = [
        ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n", "two different"),
        ("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "not a number"),
        ("HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\n", "not a number"),
        // Found attacking the router: accepted where hyper refuses.
        ("HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\n", "not a number"),
        ("HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\n", "not a number"),
        ("HTTP/1.1 200 OK\r\nContent-Length: 5 5\r\n\r\n", "not a number"),
        ("SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.1"),
        ("HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", "not an HTTP/1.1"),
    ];
    for (text, reason) in cases {
        let err = parsed(text).expect_err(text);
        assert!(matches!(err, WireError::Malformed(_)), "{text:?}: {err:?}");
        assert!(err.to_string().contains(reason), "{text:?}: {err}");
    }
    let many: String = (0..101).map(|i| format!("X-{i}: v\r\n")).collect();
    let err = parsed(&format!("HTTP/1.1 200 OK\r\n{many}\r\n")).expect_err("101 fields");
    assert!(err.to_string().contains("more than 100 header fields"), "{err}");
}

#[test]
fn a_head_that_never_ends_is_refused_at_the_limit() {
    let endless = format!("HTTP/1.1 200 OK\r\nX-Long: {}", "a".repeat(MAX_HEAD_BYTES));
    assert!(matches!(parsed(&endless), Err(WireError::HeadTooLarge)));
    let almost = format!("HTTP/1.1 200 OK\r\nX-Long: {}", "a".repeat(MAX_HEAD_BYTES - 100));
    assert!(matches!(parsed(&almost), Ok(None)));
}

/// Decodes `wire` fed in the pieces `cuts` makes: the data, or the error.
fn decode_in_pieces(wire: &[u8], cuts: &[usize]) -> Result<(Vec<u8>, Vec<u8>), WireError> {
    let mut chunked = Chunked::Size;
    let mut buf = BytesMut::new();
    let mut data = Vec::new();
    let mut fed = 0;
    let mut pieces: Vec<usize> = cuts.iter().copied().filter(|&cut| cut < wire.len()).collect();
    pieces.sort_unstable();
    pieces.push(wire.len());
    for end in pieces {
        buf.extend_from_slice(&wire[fed..end.max(fed)]);
        fed = end.max(fed);
        loop {
            match chunked.decode(&mut buf)? {
                Decoded::Data(bytes) => data.extend_from_slice(&bytes),
                Decoded::More => break,
                Decoded::End => return Ok((data, [&buf[..], &wire[fed..]].concat())),
            }
        }
    }
    Err(WireError::Closed("test"))
}

const CHUNKED: &[u8] =
    b"5\r\nhello\r\n7;ext=1\r\n, world\r\n1 \r\n!\r\n0\r\nX-Trailer: t\r\n\r\nNEXT";

/// An answer framed both ways is read by its Transfer-Encoding and its connection never reused
/// (the ambiguity request smuggling lives on); a list of equal lengths is one length.
#[test]
fn an_answer_with_both_framings_closes_its_connection() {
    let both = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n");
    assert_eq!(both.framing, Framing::Chunked);
    assert!(!both.reusable);
    let listed = head("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n");
    assert_eq!((listed.framing, listed.reusable), (Framing::Length(5), true));
}

#[test]
fn a_chunked_body_decodes_to_its_data_and_leaves_what_follows() {
    let (data, rest) = decode_in_pieces(CHUNKED, &[]).expect("valid");
    assert_eq!(data, b"hello, world!");
    assert_eq!(rest, b"NEXT");
}

proptest! {
    #[test]
    fn a_chunked_body_decodes_alike_however_it_is_split(
        cuts in proptest::collection::vec(0..CHUNKED.len(), 0..12),
    ) {
        let (data, rest) = decode_in_pieces(CHUNKED, &cuts).expect("valid");
        prop_assert_eq!(data, b"hello, world!");
        prop_assert_eq!(rest, b"NEXT");
    }
}

proptest! {
    #[test]
    fn chunk_sizes_read_as_hexadecimal_numbers_in_either_case(
        digits in "[0-9a-fA-F]{1,15}",
        extension in "|;name=value| ;x|\t",
    ) {
        let size = u64::from_str_radix(&digits, 16).expect("hexadecimal");
        prop_assert_eq!(chunk_size(format!("{digits}{extension}").as_bytes()).ok(), Some(size));
    }
}

#[test]
fn a_malformed_chunked_body_is_refused_with_its_reason() {
    let long_line = format!("5;{}\r\nhello\r\n0\r\n\r\n", "x".repeat(5000));
    let cases: [(&[u8], &str); 7] = [
        (b"zz\r\nhello\r\n0\r\n\r\n", "not a hexadecimal number"),
        // Found attacking the router: accepted where hyper refuses.
        (b"5\nhello\r\n0\r\n\r\n", "without its CR"),
        (b"5 junk\r\nhello\r\n0\r\n\r\n", "not a hexadecimal number"),
        (b"5\r\nhello!!\r\n0\r\n\r\n", "longer than its size"),
        (b"10000000000000000\r\n", "not a hexadecimal number"),
        (b"5x\r\nhello\r\n0\r\n\r\n", "not a hexadecimal number"),
        (long_line.as_bytes(), "a chunk size line"),
    ];
    for (wire, reason) in cases {
        let err = decode_in_pieces(wire, &[]).expect_err(reason);
        assert!(err.to_string().contains(reason), "{err}");
    }
    let trailers: String = (0..2000).map(|i| format!("X-{i}: trailer\r\n")).collect();
    let err = decode_in_pieces(format!("0\r\n{trailers}\r\n").as_bytes(), &[]).expect_err("big");
    assert!(err.to_string().contains("trailer fields over 16 KiB"), "{err}");
}

#[test]
fn a_head_over_the_limit_is_refused_even_when_it_arrived_whole() {
    let long = format!("HTTP/1.1 200 OK\r\nX-Long: {}\r\n\r\n", "a".repeat(MAX_HEAD_BYTES));
    assert!(matches!(parsed(&long), Err(WireError::HeadTooLarge)));
}

/// What an answer decodes to: its status and body, or the reason it is refused.
type Expected = Result<(u16, &'static str), &'static str>;

#[test]
fn an_answer_decodes_alike_however_it_arrives() {
    let answers: [(&str, Expected); 5] = [
        ("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", Ok((200, "{}"))),
        (
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
             3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\n",
            Ok((200, "abcde")),
        ),
        ("HTTP/1.1 503 Busy\r\n\r\nuntil the end", Ok((503, "until the end"))),
        (
            "HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\ncut",
            Err("before the end of its answer body"),
        ),
        ("HTTP/1.1 101 Switching\r\n\r\n", Err("a protocol switch nobody asked for")),
    ];
    for (answer, expected) in answers {
        for piece in [1, 2, 7, answer.len()] {
            let decoded = super::decode_answer(answer.as_bytes(), piece);
            match (&decoded, expected) {
                (Ok((status, body)), Ok((want_status, want_body))) => {
                    assert_eq!(
                        (status.as_u16(), body.as_slice()),
                        (want_status, want_body.as_bytes())
                    );
                }
                (Err(err), Err(reason)) => assert!(err.to_string().contains(reason), "{err}"),
                _ => panic!("{answer:?} in pieces of {piece}: {decoded:?}"),
            }
        }
    }
}
