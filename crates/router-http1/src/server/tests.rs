//! The connection driver over an in-memory socket with a handler that echoes: pipelined
//! requests answered in order with only the kept fields, a body that arrives after its head,
//! a hand-over with every byte read so far, `Connection: close`, and the stop.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Response};
use http_body_util::{BodyExt as _, Full};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{Ended, Handler, Limits, RequestBody, serve};

/// Answers a `POST /echo` with its body, prefixed by the kept `x-id` field and the number of
/// header fields it was given.
struct Echo {
    kept: [HeaderName; 1],
}

impl Handler for Echo {
    type Route = ();
    type Body = Full<Bytes>;

    fn route(&self, path: &str) -> Option<()> {
        (path == "/echo").then_some(())
    }

    fn kept(&self) -> &[HeaderName] {
        &self.kept
    }

    async fn call(&self, (): (), headers: HeaderMap, body: RequestBody) -> Response<Full<Bytes>> {
        let declared = body.length();
        let data = body.collect().await.expect("the whole body").to_bytes();
        assert_eq!(data.len() as u64, declared);
        let id = headers.get("x-id").map_or("-", |v| v.to_str().expect("text"));
        let text = format!("{id} {} {}", headers.len(), String::from_utf8_lossy(&data));
        Response::new(Full::new(Bytes::from(text)))
    }
}

const LIMITS: Limits = Limits { header_read: Duration::from_secs(5), max_header_bytes: 8192 };

fn echo() -> Echo {
    Echo { kept: [HeaderName::from_static("x-id")] }
}

/// A client's end of a connection the loop serves with [`Echo`], the stop, and the loop's end.
fn connected() -> (DuplexStream, watch::Sender<bool>, JoinHandle<Ended<DuplexStream>>) {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let (stop, stopped) = watch::channel(false);
    let handler = echo();
    let served = tokio::spawn(async move { serve(server, &handler, LIMITS, stopped).await });
    (client, stop, served)
}

fn post(id: &str, body: &str, extra: &str) -> String {
    format!(
        "POST /echo HTTP/1.1\r\nx-id: {id}\r\nhost: h\r\ncontent-length: {}\r\n{extra}\r\n{body}",
        body.len()
    )
}

/// Reads answers from `client` until `text` holds `n` of them; the bodies, in order.
async fn bodies(client: &mut DuplexStream, n: usize) -> Vec<String> {
    let mut text = String::new();
    let mut bodies = Vec::new();
    while bodies.len() < n {
        let mut buf = [0; 1024];
        let read = client.read(&mut buf).await.expect("read");
        assert!(read > 0, "closed after {bodies:?}");
        text.push_str(std::str::from_utf8(&buf[..read]).expect("text"));
        while let Some(end) = text.find("\r\n\r\n") {
            let head = &text[..end];
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))
                .expect("a length")
                .parse()
                .expect("a number");
            if text.len() < end + 4 + length {
                break;
            }
            assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
            bodies.push(text[end + 4..end + 4 + length].to_owned());
            text.drain(..end + 4 + length);
        }
    }
    bodies
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_and_another_shape_is_handed_over() {
    let (mut client, _stop, served) = connected();
    let other = "GET /health HTTP/1.1\r\nhost: h\r\n\r\n";
    let pipelined =
        format!("{}{}{other}", post("1", "one", ""), post("2", "two", "x-other: y\r\n"));
    client.write_all(pipelined.as_bytes()).await.expect("write");
    assert_eq!(bodies(&mut client, 2).await, ["1 1 one", "2 1 two"], "only x-id is kept");
    let Ended::HandedOver(mut rewound) = served.await.expect("served") else {
        panic!("the GET is not this loop's")
    };
    let mut read = vec![0; other.len()];
    rewound.read_exact(&mut read).await.expect("the bytes read so far come first");
    assert_eq!(read, other.as_bytes());
}

#[tokio::test]
async fn a_body_after_its_head_is_fed_and_close_is_honoured() {
    let (mut client, _stop, served) = connected();
    let request = post("3", "late body", "connection: close\r\n");
    let (head, body) = request.split_at(request.len() - "late body".len());
    client.write_all(head.as_bytes()).await.expect("write");
    tokio::task::yield_now().await;
    client.write_all(body.as_bytes()).await.expect("write");
    assert_eq!(bodies(&mut client, 1).await, ["3 1 late body"]);
    assert!(matches!(served.await.expect("served"), Ended::Closed));
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.expect("closed");
    assert!(rest.is_empty());
}

#[tokio::test]
async fn the_stop_closes_an_idle_connection() {
    let (mut client, stop, served) = connected();
    client.write_all(post("4", "x", "").as_bytes()).await.expect("write");
    assert_eq!(bodies(&mut client, 1).await, ["4 1 x"]);
    stop.send_replace(true);
    assert!(matches!(served.await.expect("served"), Ended::Closed));
}

#[tokio::test(start_paused = true)]
async fn a_head_not_sent_within_the_header_timeout_closes_the_connection() {
    let (mut client, _stop, served) = connected();
    client.write_all(b"POST /echo HTTP/1.1\r\nx-id").await.expect("write");
    // Paused time runs ahead to the header timeout once every task waits.
    assert!(matches!(served.await.expect("served"), Ended::Closed));
}
