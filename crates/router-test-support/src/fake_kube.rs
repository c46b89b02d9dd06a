//! A fake Kubernetes API server for Pods on 127.0.0.1, enough for a watcher and for `kubectl`:
//! LIST with a label selector and a resource version, WATCH from a resource version (replayed
//! from its history, then live; objects leaving a selection arrive as DELETED), BOOKMARK, a 410
//! Gone for a compacted resource version, 403 for a forbidden namespace, the discovery
//! documents `kubectl` asks for, and a stop and restart on the same port with the same objects
//! (what etcd keeps across an API server restart).
//!
//! The test drives it: [`FakeKube::put_pod`], [`FakeKube::delete_pod`], [`FakeKube::bookmark`],
//! [`FakeKube::expire_watches`] (410 on every live watch and compacted history, so watchers
//! relist), [`FakeKube::inject_event`] (any line on every live watch),
//! [`FakeKube::set_silent`] (changes reach no live watch, as if the events were lost),
//! [`FakeKube::forbid`], [`FakeKube::stop`] (abrupt), [`FakeKube::stop_gracefully`] and
//! [`FakeKube::restart`]. [`FakeKube::requests`]
//! tells what was asked (`LIST ns selector` or `WATCH ns rv`).

mod pods;

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinSet;

use pods::Selector;
pub use pods::{PodBuilder, pod};

type Body = BoxBody<Bytes, Infallible>;

/// What a live watch is sent.
#[derive(Clone, Debug)]
enum Broadcast {
    /// An object changed.
    Change(Arc<Change>),
    /// A bookmark at this resource version.
    Bookmark(u64),
    /// Every live watch gets 410 Gone and ends.
    Expire,
    /// Every live watch ends after what it was sent before (the API server shutting down).
    End,
    /// Sent as it is to every live watch.
    Raw(Value),
}

/// One change in the history: the object before and after (absent = did not exist).
#[derive(Debug)]
struct Change {
    rv: u64,
    namespace: String,
    before: Option<Value>,
    after: Option<Value>,
}

#[derive(Default)]
struct State {
    rv: u64,
    /// Current objects by (namespace, name).
    pods: BTreeMap<(String, String), Value>,
    history: Vec<Arc<Change>>,
    /// A watch from a resource version below this is 410 Gone.
    floor: u64,
    forbidden: HashSet<String>,
    silent: bool,
    requests: Vec<String>,
    next_uid: u64,
}

struct Shared {
    state: Mutex<State>,
    live: broadcast::Sender<Broadcast>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }
}

/// The fake API server. Dropping it stops it.
pub struct FakeKube {
    shared: Arc<Shared>,
    addr: SocketAddr,
    running: Option<Running>,
}

/// The accepting task and its graceful stop signal.
struct Running {
    task: JoinSet<()>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl FakeKube {
    /// Starts on a free loopback port with no pods.
    pub async fn start() -> Self {
        Self::start_on(0).await
    }

    /// Starts on `port` of 127.0.0.1 (0: a free one) with no pods.
    pub async fn start_on(port: u16) -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { rv: 1, ..State::default() }),
            live: broadcast::channel(4096).0,
        });
        let mut fake =
            Self { shared, addr: SocketAddr::from(([127, 0, 0, 1], port)), running: None };
        fake.restart().await;
        fake
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// A kubeconfig naming this server (no credentials), with `namespace` as its context's.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: nobody\n    \
             namespace: {namespace}\ncurrent-context: fake\nusers:\n- name: nobody\n  user: {{}}\n",
            self.url()
        )
    }

    /// Closes the listener and every connection (live watches end without a word), keeping
    /// the objects and their history.
    pub async fn stop(&mut self) {
        if let Some(mut running) = self.running.take() {
            running.task.abort_all();
            while running.task.join_next().await.is_some() {}
        }
    }

    /// Shuts down as an API server does: the listener closes, every live watch ends after the
    /// events it was sent before (a watcher has read them all), and each connection closes once
    /// its answer is written; the objects and their history are kept.
    pub async fn stop_gracefully(&mut self) {
        if let Some(mut running) = self.running.take() {
            let _ = running.stop.send(true);
            let _ = self.shared.live.send(Broadcast::End);
            while running.task.join_next().await.is_some() {}
        }
    }

    /// Listens again on the same port (after [`FakeKube::stop`]) with the same objects.
    pub async fn restart(&mut self) {
        self.stop().await;
        let listener = bind(self.addr).await;
        self.addr = listener.local_addr().expect("local address");
        let shared = Arc::clone(&self.shared);
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let mut task = JoinSet::new();
        task.spawn(accept(listener, shared, stopping));
        self.running = Some(Running { task, stop });
    }

    /// Creates or replaces a pod in `namespace` (from [`pod`]'s `build()` or any pod object);
    /// a new pod gets a uid unless it has one, a replaced one keeps its uid unless given one.
    pub fn put_pod(&self, namespace: &str, mut object: Value) {
        let name = object["metadata"]["name"].as_str().expect("a pod has a name").to_owned();
        let mut state = self.shared.state();
        let key = (namespace.to_owned(), name);
        let before = state.pods.get(&key).cloned();
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = match &before {
                Some(old) => old["metadata"]["uid"].clone(),
                None => {
                    state.next_uid += 1;
                    format!("uid-{}-{}", key.1, state.next_uid).into()
                }
            };
        }
        object["metadata"]["namespace"] = namespace.into();
        let rv = state.rv + 1;
        object["metadata"]["resourceVersion"] = rv.to_string().into();
        state.pods.insert(key, object.clone());
        self.record(state, namespace, before, Some(object));
    }

    /// Deletes a pod; false when there was none.
    pub fn delete_pod(&self, namespace: &str, name: &str) -> bool {
        let mut state = self.shared.state();
        let Some(mut before) = state.pods.remove(&(namespace.to_owned(), name.to_owned())) else {
            return false;
        };
        before["metadata"]["resourceVersion"] = (state.rv + 1).to_string().into();
        self.record(state, namespace, Some(before), None);
        true
    }

    fn record(
        &self,
        mut state: MutexGuard<'_, State>,
        namespace: &str,
        before: Option<Value>,
        after: Option<Value>,
    ) {
        state.rv += 1;
        let change =
            Arc::new(Change { rv: state.rv, namespace: namespace.to_owned(), before, after });
        state.history.push(Arc::clone(&change));
        if !state.silent {
            let _ = self.shared.live.send(Broadcast::Change(change));
        }
    }

    /// Sends a BOOKMARK at the current resource version to every live watch that allows them.
    pub fn bookmark(&self) {
        let rv = self.shared.state().rv;
        let _ = self.shared.live.send(Broadcast::Bookmark(rv));
    }

    /// Compacts the history up to now and sends 410 Gone to every live watch, which ends
    /// them: a watcher must list again.
    pub fn expire_watches(&self) {
        let mut state = self.shared.state();
        state.floor = state.rv;
        state.history.clear();
        let _ = self.shared.live.send(Broadcast::Expire);
    }

    /// Sends `event` as it is, one line, to every live watch (an event of a type no client
    /// knows, say).
    pub fn inject_event(&self, event: Value) {
        let _ = self.shared.live.send(Broadcast::Raw(event));
    }

    /// Compacts the history up to now without telling anyone: a watch resumed from an older
    /// resource version gets 410 Gone.
    pub fn compact(&self) {
        let mut state = self.shared.state();
        state.floor = state.rv;
        state.history.clear();
    }

    /// While silent, changes are kept but reach no live watch (lost events); a relist or a
    /// resumed watch still sees them.
    pub fn set_silent(&self, silent: bool) {
        self.shared.state().silent = silent;
    }

    /// Answers 403 Forbidden to every request about `namespace` while `forbidden`.
    pub fn forbid(&self, namespace: &str, forbidden: bool) {
        let mut state = self.shared.state();
        if forbidden {
            state.forbidden.insert(namespace.to_owned());
        } else {
            state.forbidden.remove(namespace);
        }
    }

    /// Every pod request so far: `LIST <namespace> <selector>` or `WATCH <namespace> <rv>`.
    pub fn requests(&self) -> Vec<String> {
        self.shared.state().requests.clone()
    }

    /// How many LISTs were asked for.
    pub fn lists(&self) -> usize {
        self.requests().iter().filter(|r| r.starts_with("LIST")).count()
    }

    /// How many live watch streams are open (subscribers of changes).
    pub fn live_watches(&self) -> usize {
        self.shared.live.receiver_count()
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        if let Some(running) = &mut self.running {
            running.task.abort_all();
        }
    }
}

/// Binds `addr`, retrying briefly: after a restart the old port may still be in TIME_WAIT.
async fn bind(addr: SocketAddr) -> tokio::net::TcpListener {
    let mut last = None;
    for _ in 0..100 {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_reuseaddr(true).expect("SO_REUSEADDR");
        match socket.bind(addr).and_then(|()| socket.listen(64)) {
            Ok(listener) => return listener,
            Err(err) => last = Some(err),
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("binding {addr}: {last:?}");
}

/// Serves connections until `stopping` says stop; then closes the listener and waits for each
/// connection to finish its answer (hyper's graceful shutdown).
async fn accept(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        let stream = tokio::select! {
            _ = stopping.wait_for(|stop| *stop) => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
        };
        let shared = Arc::clone(&shared);
        let mut stopping = stopping.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let shared = Arc::clone(&shared);
                async move { Ok::<_, Infallible>(handle(&shared, &request)) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = stopping.wait_for(|stop| *stop) => connection.as_mut().graceful_shutdown(),
            }
            let _ = connection.await;
        });
        // Reap finished connections; dropping the set (on abort) closes the live ones.
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

fn full(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .expect("response")
}

fn status_object(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    })
}

fn query(request: &Request<hyper::body::Incoming>) -> BTreeMap<String, String> {
    request.uri().query().map(|q| url_decode_pairs(q).collect()).unwrap_or_default()
}

fn url_decode_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k), percent_decode(v))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn handle(shared: &Shared, request: &Request<hyper::body::Incoming>) -> Response<Body> {
    let path = request.uri().path().trim_end_matches('/');
    match path {
        "/api" => {
            return full(
                StatusCode::OK,
                &json!({"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
            );
        }
        "/apis" => {
            return full(
                StatusCode::OK,
                &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
            );
        }
        "/api/v1" => {
            return full(
                StatusCode::OK,
                &json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [{
                    "name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
                    "verbs": ["get", "list", "watch"], "shortNames": ["po"],
                }]}),
            );
        }
        "/version" => {
            return full(
                StatusCode::OK,
                &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake", "platform": "linux/amd64"}),
            );
        }
        _ => {}
    }
    let namespace = path
        .strip_prefix("/api/v1/namespaces/")
        .and_then(|rest| rest.strip_suffix("/pods"))
        .filter(|ns| !ns.contains('/'));
    let Some(namespace) = namespace else {
        return full(
            StatusCode::NOT_FOUND,
            &status_object(404, "NotFound", "the server could not find the requested resource"),
        );
    };
    let params = query(request);
    let Some(selector) = Selector::parse(params.get("labelSelector").map_or("", String::as_str))
    else {
        return full(
            StatusCode::BAD_REQUEST,
            &status_object(400, "BadRequest", "unable to parse requirement"),
        );
    };
    let watch = params.get("watch").is_some_and(|w| w == "true" || w == "1");
    let mut state = shared.state();
    let rv_asked = params.get("resourceVersion").cloned().unwrap_or_default();
    state.requests.push(if watch {
        format!("WATCH {namespace} {rv_asked}")
    } else {
        format!("LIST {namespace} {}", params.get("labelSelector").map_or("", String::as_str))
    });
    if state.forbidden.contains(namespace) {
        let verb = if watch { "watch" } else { "list" };
        let message = format!(
            "pods is forbidden: User \"system:serviceaccount:router:router\" cannot {verb} \
             resource \"pods\" in API group \"\" in the namespace \"{namespace}\""
        );
        return full(StatusCode::FORBIDDEN, &status_object(403, "Forbidden", &message));
    }
    if !watch {
        let items: Vec<Value> = state
            .pods
            .iter()
            .filter(|((ns, _), pod)| ns == namespace && selector.matches(pod))
            .map(|(_, pod)| pod.clone())
            .collect();
        let list = json!({
            "kind": "PodList", "apiVersion": "v1",
            "metadata": {"resourceVersion": state.rv.to_string()},
            "items": items,
        });
        return full(StatusCode::OK, &list);
    }
    let bookmarks = params.get("allowWatchBookmarks").is_some_and(|b| b == "true");
    let from: u64 = rv_asked.parse().unwrap_or(state.rv);
    let (tx, rx) = mpsc::unbounded_channel::<Value>();
    if from < state.floor {
        let _ = tx.send(json!({"type": "ERROR", "object": status_object(410, "Expired", &format!("too old resource version: {from} ({})", state.floor))}));
        drop(tx);
    } else {
        let watch = Watch { namespace: namespace.to_owned(), selector, bookmarks };
        for change in state.history.iter().filter(|c| c.rv > from) {
            if let Some(event) = watch.event(change) {
                let _ = tx.send(event);
            }
        }
        let live = shared.live.subscribe();
        tokio::spawn(watch.forward(live, tx));
    }
    drop(state);
    let lines = tokio_stream_from(rx).map(|event| {
        let mut line = event.to_string();
        line.push('\n');
        Ok::<_, Infallible>(Frame::data(Bytes::from(line)))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(StreamBody::new(lines)))
        .expect("response")
}

fn tokio_stream_from(mut rx: mpsc::UnboundedReceiver<Value>) -> impl futures::Stream<Item = Value> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// One live watch: what it selects.
struct Watch {
    namespace: String,
    selector: Selector,
    bookmarks: bool,
}

impl Watch {
    /// The event this watch sees for `change`, if any: an object entering the selection is
    /// ADDED, one leaving it DELETED.
    fn event(&self, change: &Change) -> Option<Value> {
        if change.namespace != self.namespace {
            return None;
        }
        let selected = |object: &Option<Value>| -> Option<Value> {
            object.as_ref().filter(|o| self.selector.matches(o)).cloned()
        };
        let (kind, object) = match (selected(&change.before), selected(&change.after)) {
            (None, Some(after)) => ("ADDED", after),
            (Some(_), Some(after)) => ("MODIFIED", after),
            (Some(before), None) => {
                let mut gone = change.after.clone().unwrap_or(before);
                gone["metadata"]["resourceVersion"] = change.rv.to_string().into();
                ("DELETED", gone)
            }
            (None, None) => return None,
        };
        Some(json!({"type": kind, "object": object}))
    }

    async fn forward(
        self,
        mut live: broadcast::Receiver<Broadcast>,
        tx: mpsc::UnboundedSender<Value>,
    ) {
        loop {
            let message = tokio::select! {
                () = tx.closed() => return,
                message = live.recv() => message,
            };
            let event = match message {
                Ok(Broadcast::Change(change)) => self.event(&change),
                Ok(Broadcast::Bookmark(rv)) => self.bookmarks.then(|| {
                    json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                        "metadata": {"resourceVersion": rv.to_string()}}})
                }),
                Ok(Broadcast::Raw(event)) => Some(event),
                Ok(Broadcast::End) => return,
                Ok(Broadcast::Expire) => {
                    let _ = tx.send(json!({"type": "ERROR", "object": status_object(410, "Expired", "too old resource version")}));
                    return;
                }
                // A watch that fell this far behind is ended, as the API server does.
                Err(_) => return,
            };
            if let Some(event) = event
                && tx.send(event).is_err()
            {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
