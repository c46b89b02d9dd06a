//! Which request heads the own loop serves and which it leaves to hyper, the fields it keeps,
//! and a head read alike however it arrives.

use bytes::BytesMut;
use http::HeaderName;
use http::header::CONTENT_LENGTH;
use proptest::prelude::*;

use super::{Parsed, head_ends, parse_request_head};

/// The fields the parses below keep: two of those an inference request is read for.
fn kept() -> [HeaderName; 2] {
    [CONTENT_LENGTH, HeaderName::from_static("x-request-id")]
}

/// The paths these tests route: three inference endpoints.
fn route(path: &str) -> Option<&'static str> {
    ["/v1/chat/completions", "/v1/completions", "/generate"].into_iter().find(|p| *p == path)
}

fn parse(buf: &mut BytesMut) -> Parsed<&'static str> {
    parse_request_head(buf, 8192, &kept(), route)
}

fn parsed(head: &str) -> Parsed<&'static str> {
    parse(&mut BytesMut::from(head))
}

#[test]
fn a_post_to_an_inference_endpoint_framed_by_a_length_is_served_here() {
    let head = "POST /v1/chat/completions?trace=1 HTTP/1.1\r\nHost: r\r\nContent-Length: 12\r\n\
                x-request-id: abc\r\nConnection: keep-alive, close\r\n\r\n{\"model\":1}";
    let mut buf = BytesMut::from(head);
    let Parsed::Ours(request) = parse(&mut buf) else { panic!("not served") };
    assert_eq!(request.route, "/v1/chat/completions");
    assert_eq!(request.length, 12);
    assert!(request.close);
    assert_eq!(request.headers.get("x-request-id").expect("kept"), "abc");
    assert_eq!(request.headers.get(CONTENT_LENGTH).expect("kept"), "12");
    assert_eq!(request.headers.len(), 2, "Host and Connection are read past, not kept");
    assert_eq!(&buf[..], b"{\"model\":1}", "the head is taken off, the body left");

    let Parsed::Ours(bare) = parsed("POST /generate HTTP/1.1\r\n\r\n") else { panic!() };
    assert_eq!((bare.length, bare.close), (0, false));
}

#[test]
fn every_other_request_is_left_to_hyper_untouched() {
    let others = [
        "GET /v1/chat/completions HTTP/1.1\r\n\r\n",
        "POST /health HTTP/1.1\r\n\r\n",
        "POST /v1/chat/completions HTTP/1.0\r\ncontent-length: 2\r\n\r\n",
        "POST http://r/v1/chat/completions HTTP/1.1\r\n\r\n",
        "POST /v1/chat/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
        "POST /v1/chat/completions HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n",
        "POST /v1/chat/completions HTTP/1.1\r\nupgrade: websocket\r\n\r\n",
        "POST /v1/chat/completions HTTP/1.1\r\nconnection: Upgrade\r\n\r\n",
        "POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2x\r\n\r\n",
        "POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n",
        "POST /v1/chat/completions HTTP/1.1\r\nbad header\r\n\r\n",
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        // Found by the client_head fuzz target: a query byte httparse passes and hyper refuses.
        "POST /v1/chat/completions?x=\"1 HTTP/1.1\r\ncontent-length: 0\r\n\r\n",
        // Found by the client_head fuzz target: a list of equal lengths, which hyper refuses
        // in a request (an answer may carry one).
        "POST /generate HTTP/1.1\r\nH: r\r\nContent-Length: 5, 5\r\nConnection: close\r\n\r\n",
    ];
    for head in others {
        let mut buf = BytesMut::from(head);
        assert!(matches!(parse(&mut buf), Parsed::Theirs), "{head}");
        assert_eq!(&buf[..], head.as_bytes(), "the bytes stay for hyper");
    }
    // Two equal lengths are one length.
    let twice = "POST /generate HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n";
    assert!(matches!(parsed(twice), Parsed::Ours(request) if request.length == 2));
}

#[test]
fn a_head_is_partial_until_it_ends_and_too_large_past_the_limit() {
    assert!(matches!(parsed("POST /v1/completions HTTP/1.1\r\nhost: r\r\n"), Parsed::Partial));
    let long = format!("POST /v1/completions HTTP/1.1\r\nx-pad: {}", "p".repeat(9000));
    assert!(matches!(parsed(&long), Parsed::Theirs), "hyper answers 431");
    let whole = format!("{long}\r\n\r\n");
    assert!(matches!(parsed(&whole), Parsed::Theirs));
}

#[test]
fn a_head_ends_at_its_blank_line_wherever_the_read_split_it() {
    assert!(!head_ends(b"POST / HTTP/1.1\r\nA: b\r\n", 0));
    assert!(head_ends(b"POST / HTTP/1.1\r\nA: b\r\n\r\n", 20), "the end straddles the seen part");
    assert!(head_ends(b"POST / HTTP/1.1\nA: b\n\n", 19));
}

/// What a parse made of a head, comparable: the route, kept fields, length and close, and
/// the bytes left behind.
fn outcome(parsed: Parsed<&'static str>, rest: &[u8]) -> String {
    match parsed {
        Parsed::Partial => "partial".to_owned(),
        Parsed::Theirs => format!("theirs, {} bytes left", rest.len()),
        Parsed::Ours(r) => {
            format!("{} {:?} {} {} | {:?}", r.route, r.headers, r.length, r.close, rest)
        }
    }
}

/// Reads `bytes` as the loop does when they arrive in `piece`-byte reads: parsed once a read
/// brings a head's end (or passes the limit), as `Connection::next_request` does; what
/// arrives after the parse joins the buffer, as the body does.
fn arriving(bytes: &[u8], piece: usize) -> String {
    let mut buf = BytesMut::new();
    let mut scanned: Option<usize> = None;
    let mut pieces = bytes.chunks(piece.max(1));
    while let Some(more) = pieces.next() {
        buf.extend_from_slice(more);
        if scanned.is_none_or(|from| buf.len() >= 8192 || head_ends(&buf, from)) {
            match parse(&mut buf) {
                Parsed::Partial => scanned = Some(buf.len()),
                done => {
                    pieces.for_each(|rest| buf.extend_from_slice(rest));
                    return outcome(done, &buf);
                }
            }
        }
    }
    let last = parse(&mut buf);
    outcome(last, &buf)
}

proptest! {
    /// A head, with or without a body behind it, is read alike whole and in pieces of any size.
    #[test]
    fn a_head_is_read_alike_whole_and_in_pieces(
        path in prop::sample::select(vec!["/v1/chat/completions", "/generate", "/health"]),
        fields in prop::collection::vec(
            (prop::sample::select(vec![
                "content-length", "x-request-id", "connection", "host", "transfer-encoding",
                "x-pad",
            ]),
            "[ -~]{0,12}"),
            0..6,
        ),
        bare_lf in any::<bool>(),
        body in "[a-z]{0,20}",
        piece in 1usize..40,
    ) {
        let end = if bare_lf { "\n" } else { "\r\n" };
        let mut head = format!("POST {path} HTTP/1.1{end}");
        for (name, value) in &fields {
            head.push_str(&format!("{name}: {value}{end}"));
        }
        head.push_str(end);
        head.push_str(&body);
        let mut whole = BytesMut::from(head.as_bytes());
        let at_once = parse(&mut whole);
        prop_assert_eq!(arriving(head.as_bytes(), piece), outcome(at_once, &whole));
    }
}
