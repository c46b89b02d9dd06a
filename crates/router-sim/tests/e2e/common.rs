//! Helpers: start the real `router-sim` binary on port 0 and talk to it over HTTP.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_router-sim");
const STARTUP: Duration = Duration::from_secs(30);

/// A running `router-sim engine` process, killed on drop.
pub(crate) struct Sim {
    pub child: Child,
    /// Printed endpoints: `listening`, `kv events`, `kv replay`, `bootstrap`.
    pub endpoints: HashMap<String, String>,
}

impl Sim {
    /// Starts `router-sim engine --port 0 --model m <args>` and reads its ready lines.
    pub(crate) async fn start(args: &[&str]) -> Sim {
        let mut command = Sim::command(args);
        command.stderr(Stdio::inherit());
        Sim::spawn(command).await
    }

    /// The command `start` runs, for a test that needs to add to it (stderr is up to the test).
    pub(crate) fn command(args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command.args(["engine", "--port", "0", "--model", "m"]).args(args);
        command
    }

    /// Spawns `command` and reads its ready lines.
    pub(crate) async fn spawn(mut command: Command) -> Sim {
        let mut child =
            command.stdout(Stdio::piped()).kill_on_drop(true).spawn().expect("router-sim starts");
        let stdout = child.stdout.take().expect("stdout piped");
        let mut lines = BufReader::new(stdout).lines();
        let mut endpoints = HashMap::new();
        let read = async {
            while let Some(line) = lines.next_line().await.expect("readable stdout") {
                let (name, address) = line.split_once(" on ").expect("`<name> on <address>` lines");
                endpoints.insert(name.to_owned(), address.to_owned());
                if name == "listening" {
                    return;
                }
            }
            panic!("router-sim exited before it was ready");
        };
        tokio::time::timeout(STARTUP, read).await.expect("router-sim ready in time");
        Sim { child, endpoints }
    }

    pub(crate) fn url(&self) -> &str {
        &self.endpoints["listening"]
    }

    pub(crate) fn endpoint(&self, name: &str) -> &str {
        self.endpoints.get(name).unwrap_or_else(|| panic!("no `{name} on` line"))
    }

    pub(crate) fn port(&self, name: &str) -> u16 {
        let endpoint = self.endpoint(name);
        endpoint.rsplit(':').next().and_then(|p| p.parse().ok()).expect("endpoint with a port")
    }
}

pub(crate) fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// A response read to its end.
pub(crate) struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("json body ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The `data:` payloads of an SSE body.
    pub(crate) fn events(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.body)
            .split("\n\n")
            .filter_map(|event| event.strip_prefix("data: "))
            .map(str::to_owned)
            .collect()
    }
}

pub(crate) async fn send(method: Method, url: &str, body: Option<&Value>) -> Result<Reply, String> {
    send_with_headers(method, url, body, &[]).await
}

/// `send` with extra request headers.
pub(crate) async fn send_with_headers(
    method: Method,
    url: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> Result<Reply, String> {
    let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let mut request =
        Request::builder().method(method).uri(url).header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(body)).expect("request");
    let response = client().request(request).await.map_err(|e| format!("request failed: {e:?}"))?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.map_err(|e| format!("body failed: {e}"))?;
    Ok(Reply { status, headers, body: body.to_bytes() })
}

pub(crate) async fn get(url: &str) -> Reply {
    send(Method::GET, url, None).await.expect("GET answered")
}

pub(crate) async fn chat(sim: &Sim, body: &Value) -> Reply {
    send(Method::POST, &format!("{}/v1/chat/completions", sim.url()), Some(body))
        .await
        .expect("chat answered")
}

/// `POST {sim}{path}` with a JSON body.
pub(crate) async fn post(sim: &Sim, path: &str, body: &Value) -> Reply {
    send(Method::POST, &format!("{}{path}", sim.url()), Some(body)).await.expect("answered")
}

impl Reply {
    /// The JSON `data:` payloads of an SSE body, after checking that it ends with `[DONE]`.
    pub(crate) fn json_events(&self) -> Vec<Value> {
        let events = self.events();
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
        events[..events.len() - 1]
            .iter()
            .map(|e| {
                serde_json::from_str(e).unwrap_or_else(|err| panic!("json event ({err}): {e}"))
            })
            .collect()
    }

    /// The message of an error answer.
    pub(crate) fn error_message(&self) -> String {
        self.json()["error"]["message"].as_str().expect("an error message").to_owned()
    }
}

/// The token ids of `text` for the built-in tokenizer (one per byte).
pub(crate) fn byte_ids(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

pub(crate) fn request(content: &str, max_tokens: u64, stream: bool) -> Value {
    serde_json::json!({
        "model": "m",
        "messages": [{ "role": "user", "content": content }],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": { "include_usage": true },
    })
}

/// The ChatML prompt bytes the engine tokenizes (one token per byte).
pub(crate) fn chatml_user(content: &str) -> Vec<u32> {
    byte_ids(&format!("<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"))
}

/// Runs `router-sim load ARGS` to its end; returns its stdout lines and the JSON last line.
pub(crate) async fn run_load(args: &[&str]) -> (Vec<String>, Value) {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(BIN)
            .arg("load")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .output(),
    )
    .await
    .expect("load finishes in time")
    .expect("load runs");
    assert!(output.status.success(), "exit {:?}", output.status);
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    let json =
        serde_json::from_str(lines.last().expect("a last line")).expect("the last line is JSON");
    (lines, json)
}
