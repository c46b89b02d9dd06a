//! Fixtures the unit tests share: in-process fake engines on loopback, an `AppContext` built
//! from a YAML configuration, a prepared chat request, and one series read back from the
//! rendered Prometheus text.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::response::Response;
use bytes::Bytes;
use http_body_util::BodyExt;

use crate::app::AppContext;
use router_config::ConfigFile;
use router_prepare::{Endpoint, PreparedRequest, parse_request, prepare};

/// Serves `app` on a fresh loopback port; its base URL.
pub(crate) async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

/// Requests an engine received.
#[derive(Clone, Default)]
pub(crate) struct Hits(Arc<AtomicUsize>);

impl Hits {
    pub(crate) fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    pub(crate) fn add(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// An engine whose chat endpoint answers `status` with `body`, counting its requests.
pub(crate) async fn answering(status: u16, body: &'static str) -> (String, Hits) {
    let hits = Hits::default();
    let counted = hits.clone();
    let chat = move || {
        counted.add();
        let status = axum::http::StatusCode::from_u16(status).expect("status");
        async move { (status, [("content-type", "application/json")], body) }
    };
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(chat));
    (serve(app).await, hits)
}

/// The context a configuration builds (nothing started).
pub(crate) fn context(yaml: &str) -> Arc<AppContext> {
    let config = ConfigFile::parse(yaml).unwrap_or_else(|err| panic!("{err}\n{yaml}"));
    let ctx = AppContext::build(&config).unwrap_or_else(|problems| panic!("{problems:?}"));
    Arc::new(ctx)
}

/// A one-model configuration: `top` more top-level sections (YAML lines), `workers` as YAML
/// flow text, and one bucket `all` whose plain group runs `policy`.
pub(crate) fn one_model(top: &str, model: &str, workers: &str, policy: &str) -> String {
    format!(
        "{top}\nmodels:\n  - id: {model}\n    workers: {workers}\n    buckets:\n      \
         - {{id: all, groups: {{plain: {{policy: {policy}}}}}}}\n"
    )
}

/// A short chat request for `model`, prepared without a tokenizer.
pub(crate) fn prepared(model: &str, stream: bool) -> PreparedRequest {
    let body = serde_json::json!({
        "model": model, "stream": stream, "messages": [{"role": "user", "content": "hello"}]
    });
    let body = Bytes::from(body.to_string());
    let chat = parse_request(Endpoint::Chat, &body, 4).expect("a valid request");
    prepare(body, chat, None, None, None).expect("prepared")
}

/// The whole body of a response, as text.
pub(crate) async fn text(response: Response) -> String {
    let body = response.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

/// The value of the series `name` carrying every label of `labels`, as `/metrics` renders it.
pub(crate) fn metric(name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let rendered = crate::metrics::install().render();
    rendered.lines().filter(|line| !line.starts_with('#')).find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let (series_name, series_labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.strip_suffix('}')?),
            None => (series, ""),
        };
        let pairs: Vec<&str> = series_labels.split(',').collect();
        let matches = series_name == name
            && labels.iter().all(|(k, v)| pairs.contains(&format!("{k}=\"{v}\"").as_str()));
        if matches { value.parse().ok() } else { None }
    })
}

/// What the router's routes answer to `method path` with `body` (JSON when not empty) and
/// `token` as the bearer credential: the status, the headers and the body text.
pub(crate) async fn call(
    ctx: &Arc<AppContext>,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (axum::http::StatusCode, axum::http::HeaderMap, String) {
    use tower::ServiceExt as _;
    let mut request = axum::http::Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    if !body.is_empty() {
        request = request.header("content-type", "application/json");
    }
    let request = request.body(axum::body::Body::from(body.to_owned())).expect("request");
    let response = crate::server::routes(Arc::clone(ctx)).oneshot(request).await.expect("answered");
    let (status, headers) = (response.status(), response.headers().clone());
    (status, headers, text(response).await)
}

/// `text` as JSON.
pub(crate) fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|err| panic!("{err}: {text}"))
}
