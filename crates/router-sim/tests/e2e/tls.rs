//! `--tls-cert` / `--tls-key`: the HTTP port speaks HTTPS (HTTP/1.1 and h2 by ALPN) with a
//! certificate made here, refuses plain HTTP, and outlives failed handshakes.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::crypto::ring;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::common::*;

/// A self-signed certificate for `localhost` and 127.0.0.1 in a temporary directory, removed
/// on drop.
struct CertFiles {
    dir: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    der: CertificateDer<'static>,
}

impl CertFiles {
    fn new() -> CertFiles {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(names).expect("certificate generated");
        let dir = std::env::temp_dir().join(format!(
            "router-sim-tls-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&cert_path, cert.pem()).expect("cert written");
        std::fs::write(&key_path, signing_key.serialize_pem()).expect("key written");
        CertFiles { dir, cert: cert_path, key: key_path, der: cert.der().clone() }
    }

    async fn start_sim(&self) -> Sim {
        let (cert, key) = (self.cert.to_str().expect("utf-8"), self.key.to_str().expect("utf-8"));
        Sim::start(&["--tls-cert", cert, "--tls-key", key]).await
    }
}

impl Drop for CertFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A client trusting exactly `trusted`, offering `alpn`.
fn connector(trusted: &CertificateDer<'static>, alpn: &[u8]) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    roots.add(trusted.clone()).expect("a valid root");
    let mut config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    TlsConnector::from(Arc::new(config))
}

async fn connect(
    addr: SocketAddr,
    connector: &TlsConnector,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST).into());
    connector.connect(name, tcp).await
}

fn sim_addr(sim: &Sim) -> SocketAddr {
    let url = sim.url();
    let host_port = url.strip_prefix("https://").unwrap_or_else(|| panic!("https url: {url}"));
    host_port.parse().expect("HOST:PORT")
}

fn chat_request(uri: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(request("Hello over TLS", 4, false).to_string())))
        .expect("request")
}

async fn read(response: http::Response<hyper::body::Incoming>) -> (StatusCode, Version, Value) {
    let (status, version) = (response.status(), response.version());
    let body = response.into_body().collect().await.expect("body").to_bytes();
    (status, version, serde_json::from_slice(&body).expect("json body"))
}

/// One chat completion over HTTP/1.1 on `stream`.
async fn chat_http1(stream: TlsStream<TcpStream>) -> (StatusCode, Version, Value) {
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("http/1.1");
    tokio::spawn(connection);
    read(sender.send_request(chat_request("/v1/chat/completions")).await.expect("answered")).await
}

/// One chat completion over HTTP/2 on `stream`.
async fn chat_h2(stream: TlsStream<TcpStream>, addr: SocketAddr) -> (StatusCode, Version, Value) {
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2");
    tokio::spawn(connection);
    let uri = format!("https://{addr}/v1/chat/completions");
    read(sender.send_request(chat_request(&uri)).await.expect("answered")).await
}

fn assert_completion((status, _, body): &(StatusCode, Version, Value)) {
    assert_eq!(*status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["usage"]["completion_tokens"], 4);
}

#[tokio::test]
async fn https_serves_http1_and_h2_chosen_by_alpn() {
    let files = CertFiles::new();
    let sim = files.start_sim().await;
    assert!(sim.url().starts_with("https://127.0.0.1:"), "{}", sim.url());
    let addr = sim_addr(&sim);

    let stream = connect(addr, &connector(&files.der, b"http/1.1")).await.expect("handshake");
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let answer = chat_http1(stream).await;
    assert_eq!(answer.1, Version::HTTP_11);
    assert_completion(&answer);

    let stream = connect(addr, &connector(&files.der, b"h2")).await.expect("handshake");
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let answer = chat_h2(stream, addr).await;
    assert_eq!(answer.1, Version::HTTP_2);
    assert_completion(&answer);
}

#[tokio::test]
async fn the_tls_port_refuses_plain_http_and_outlives_failed_handshakes() {
    let files = CertFiles::new();
    let sim = files.start_sim().await;
    let addr = sim_addr(&sim);

    let plain = send(Method::GET, &format!("http://{addr}/health"), None).await;
    assert!(plain.is_err(), "plain HTTP answered {:?}", plain.map(|r| r.status));

    // A client that trusts another certificate aborts the handshake.
    let stranger = CertFiles::new();
    let refused = connect(addr, &connector(&stranger.der, b"h2")).await;
    assert!(refused.is_err(), "a client trusting another certificate connected");

    // Garbage then a closed connection.
    let mut garbage = TcpStream::connect(addr).await.expect("tcp");
    garbage.write_all(b"\x16\x03\x01\x00\x05hello").await.expect("written");
    drop(garbage);

    let stream = connect(addr, &connector(&files.der, b"http/1.1")).await.expect("handshake");
    assert_completion(&chat_http1(stream).await);
    let stream = connect(addr, &connector(&files.der, b"h2")).await.expect("handshake");
    assert_completion(&chat_h2(stream, addr).await);
}

#[tokio::test]
async fn unusable_tls_files_stop_the_engine_at_start() {
    let files = CertFiles::new();
    let other = CertFiles::new();
    let (cert, missing) = (files.cert.to_str().expect("utf-8"), "/nonexistent/key.pem");
    let wrong_key = other.key.to_str().expect("utf-8");
    let cases: [(&[&str], &str); 3] = [
        (&["--tls-cert", cert], "invalid --tls-key: required with --tls-cert"),
        (&["--tls-cert", cert, "--tls-key", missing], "cannot read the private key"),
        (&["--tls-cert", cert, "--tls-key", wrong_key], "unusable certificate"),
    ];
    for (args, expected) in cases {
        let output = Sim::command(args).output().await.expect("router-sim runs");
        assert!(!output.status.success(), "{args:?} started");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
