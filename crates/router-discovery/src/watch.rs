//! One selector's watch: kube's watcher (LIST, then WATCH from the resource version, bookmarks,
//! a relist on 410 Gone), its failures described for an operator and retried with backoff,
//! its events handed to the reconciler in order.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::watcher;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{Backoff, BackoffConfig};
use crate::reconcile::SourceEvent;

/// An event of source `index`.
pub(crate) type Tagged = (usize, SourceEvent);

/// Follows the pods `selector` selects until `cancel` fires (or the reconciler is gone).
pub(crate) async fn follow(
    api: Api<Pod>,
    index: usize,
    selector: String,
    namespace: String,
    events: mpsc::Sender<Tagged>,
    backoff: BackoffConfig,
    cancel: CancellationToken,
) {
    let config = watcher::Config::default().labels(&selector);
    let mut stream = watcher(api, config).boxed();
    let mut backoff = Backoff::new(backoff);
    loop {
        let item = tokio::select! {
            () = cancel.cancelled() => return,
            item = stream.next() => item,
        };
        let event = match item {
            Some(Ok(event)) => event,
            Some(Err(error)) => {
                let failure = Failure::of(&error, &namespace);
                if failure.relists {
                    tracing::info!(%selector, %namespace, "{}", failure.message);
                    continue;
                }
                let wait = backoff.next_wait();
                if failure.forbidden {
                    tracing::error!(%selector, %namespace, retry_in = ?wait, "{}", failure.message);
                } else {
                    tracing::warn!(%selector, %namespace, retry_in = ?wait, "{}", failure.message);
                }
                if events.send((index, SourceEvent::Failed(failure.message))).await.is_err() {
                    return;
                }
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(wait) => continue,
                }
            }
            // The watcher recovers by itself and never ends; should it, start it again.
            None => return,
        };
        let event = match event {
            watcher::Event::Init => SourceEvent::Init,
            watcher::Event::InitApply(pod) => SourceEvent::InitApply(Box::new(pod)),
            watcher::Event::InitDone => {
                backoff.reset();
                SourceEvent::InitDone
            }
            watcher::Event::Apply(pod) => {
                backoff.reset();
                SourceEvent::Apply(Box::new(pod))
            }
            watcher::Event::Delete(pod) => {
                backoff.reset();
                SourceEvent::Delete(Box::new(pod))
            }
        };
        if events.send((index, event)).await.is_err() {
            return;
        }
    }
}

/// A watcher failure as an operator reads it.
#[derive(Debug)]
struct Failure {
    message: String,
    /// The API server forbids it: the router's RBAC is missing.
    forbidden: bool,
    /// 410 Gone: the watcher lists again at once; not a failure.
    relists: bool,
}

impl Failure {
    fn of(error: &watcher::Error, namespace: &str) -> Self {
        let client = match error {
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => e,
            watcher::Error::WatchError(status) if status.code == 410 => {
                return Self {
                    message: "the watch's resource version expired (410 Gone): listing again"
                        .to_owned(),
                    forbidden: false,
                    relists: true,
                };
            }
            watcher::Error::WatchError(status) => {
                return Self::api(status.code, &status.reason, &status.message, namespace);
            }
            other => return Self { message: chain(other), forbidden: false, relists: false },
        };
        match client {
            kube::Error::Api(status) => {
                Self::api(status.code, &status.reason, &status.message, namespace)
            }
            kube::Error::SerdeError(_) => Self {
                message: format!(
                    "the API server sent what the router cannot read (a watch event of an \
                     unknown type?); watching on: {}",
                    chain(client)
                ),
                forbidden: false,
                relists: false,
            },
            other => Self {
                message: format!("cannot reach the Kubernetes API server: {}", chain(other)),
                forbidden: false,
                relists: false,
            },
        }
    }

    fn api(code: u16, reason: &str, message: &str, namespace: &str) -> Self {
        let (message, forbidden) = match code {
            // What kube makes of a watch event it cannot read (an unknown type): a status
            // without a code.
            0 => (
                format!(
                    "the API server sent a watch event the router cannot read (an unknown \
                     type?); skipped, watching on{}",
                    if message.is_empty() { String::new() } else { format!(": {message}") }
                ),
                false,
            ),
            403 => (
                format!(
                    "forbidden (403): the router may not list and watch pods in namespace \
                     {namespace:?}; grant its service account get, list and watch on pods \
                     there (docs/deployment.md): {message}"
                ),
                true,
            ),
            401 => (
                format!(
                    "unauthorized (401): the API server refused the router's credentials: {message}"
                ),
                true,
            ),
            _ => (format!("the API server answered {code} {reason}: {message}"), false),
        };
        Self { message, forbidden, relists: false }
    }
}

/// An error with its causes, `a: b: c` (a cause its parent already prints is left out).
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}
