//! `https://` engines: the router verifies the engine's certificate against the system roots
//! plus `server.engine_ca_file`, over HTTP/1.1 or HTTP/2 chosen by ALPN, and an engine it cannot
//! verify is a 502 that says why.

use std::path::PathBuf;

use router_e2e::tempfile_path::TempPath;
use router_e2e::{Engine, Http, Router, chat_body};

/// A self-signed certificate for 127.0.0.1 and localhost, as PEM files in a temporary
/// directory.
struct Certificate {
    cert: TempPath,
    key: PathBuf,
}

impl Certificate {
    fn generate() -> Self {
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(names).expect("certificate");
        let cert = TempPath::write("engine.pem", &cert.pem());
        let key = PathBuf::from(cert.display()).with_file_name("engine.key");
        std::fs::write(&key, signing_key.serialize_pem()).expect("key file");
        Self { cert, key }
    }

    fn engine(&self) -> Engine {
        let (cert, key) = (self.cert.display(), self.key.display().to_string());
        Engine::start("m", &["--tls-cert", &cert, "--tls-key", &key])
    }
}

fn config(engine: &Engine, server_extra: &str) -> String {
    format!(
        "server: {{port: 0{server_extra}}}\nmodels:\n  - id: m\n    workers:\n      - {{id: e1, url: \"{}\"}}\n    \
         buckets:\n      - id: all\n        groups: {{plain: {{policy: {{type: round_robin}}}}}}\n",
        engine.url
    )
}

#[tokio::test]
async fn an_https_engine_trusted_through_the_ca_file_serves_http1_and_h2() {
    let certificate = Certificate::generate();
    let engine = certificate.engine();
    assert!(engine.url.starts_with("https://"), "{}", engine.url);
    let http = Http::default();
    for upstream_http2 in [false, true] {
        let extra = format!(
            ", engine_ca_file: \"{}\", upstream_http2: {upstream_http2}",
            certificate.cert.display()
        );
        let router = Router::with_config(&config(&engine, &extra));
        let reply = http.chat(&router.url, &chat_body("m", "hello over tls", 4), &[]).await;
        assert_eq!(reply.status, 200, "h2={upstream_http2}: {}", reply.body);
        assert_eq!(reply.header("x-router-engine"), Some("e1"));
        assert_eq!(reply.json()["object"], "chat.completion");

        let mut body = chat_body("m", "stream over tls", 8);
        body["stream"] = true.into();
        let streamed = http.chat(&router.url, &body, &[]).await;
        assert_eq!(streamed.status, 200, "h2={upstream_http2}: {}", streamed.body);
        assert!(streamed.body.trim_end().ends_with("data: [DONE]"), "{}", streamed.body);
    }
}

#[tokio::test]
async fn an_https_engine_the_router_cannot_verify_is_a_502_saying_why() {
    let certificate = Certificate::generate();
    let engine = certificate.engine();
    // Trusting another certificate than the engine's is no better than trusting none.
    let other = Certificate::generate();
    let extra = format!(", engine_ca_file: \"{}\"", other.cert.display());
    let router = Router::with_config(&config(&engine, &extra));
    let http = Http::default();
    let reply = http.chat(&router.url, &chat_body("m", "hello", 4), &[]).await;
    assert_eq!(reply.status, 502, "{}", reply.body);
    let message = reply.json()["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("certificate"), "{message}");
}

#[tokio::test]
async fn an_unreadable_ca_file_is_a_configuration_error() {
    let certificate = Certificate::generate();
    let engine = certificate.engine();
    let yaml = config(&engine, ", engine_ca_file: /nonexistent/ca.pem");
    let file = TempPath::write("router.yaml", &yaml);
    let output = std::process::Command::new(router_e2e::binary("router-server"))
        .args(["check-config", &file.display()])
        .output()
        .expect("check-config runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("server.engine_ca_file"), "{stderr}");
}
