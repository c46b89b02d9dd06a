//! One worker's gRPC load subscription: connect, register, stream, and reconnect with jittered
//! backoff. Whenever a stream ends, breaks or stalls, the worker's load turns missing at once.

use std::time::Duration;

use router_proto::router::load::v1 as pb;
use router_proto::router::load::v1::load_reporter_client::LoadReporterClient;
use router_proto::router::load::v1::subscribe_request::Command;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;

use super::TaskContext;
use super::backoff::Backoff;
use crate::{MissingReason, RejectReason, Report};

/// Why a session ended without being cancelled.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("invalid load reporter endpoint {endpoint:?}")]
    Endpoint {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("cannot connect")]
    Connect(#[source] tonic::transport::Error),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("the engine refused or broke the stream")]
    Status(#[source] tonic::Status),
    #[error("the engine ended the stream")]
    Ended,
    #[error("no report for {0:?}")]
    Stalled(Duration),
}

/// How a session ended.
enum Ended {
    Cancelled,
    Broken { delivered: bool, error: SessionError },
}

/// The subscription task of one worker; returns when `cancel` fires.
pub(crate) async fn run(
    ctx: TaskContext,
    endpoint: String,
    mut interval: watch::Receiver<Duration>,
    cancel: CancellationToken,
) {
    let uri = if endpoint.contains("://") { endpoint } else { format!("http://{endpoint}") };
    let endpoint = match Endpoint::from_shared(uri.clone()) {
        Ok(endpoint) => endpoint.connect_timeout(ctx.config.connect_timeout).tcp_nodelay(true),
        Err(source) => {
            let error = SessionError::Endpoint { endpoint: uri, source };
            tracing::error!(worker = %ctx.worker.id(), error = &error as &dyn std::error::Error, "load subscription disabled");
            ctx.mark_missing(MissingReason::Disconnected);
            cancel.cancelled().await;
            return;
        }
    };
    let mut backoff = Backoff::new(ctx.config.backoff_min, ctx.config.backoff_max);
    let mut failures = 0u32;
    loop {
        match session(&ctx, &endpoint, &mut interval, &cancel).await {
            Ended::Cancelled => return,
            Ended::Broken { delivered, error } => {
                ctx.mark_missing(MissingReason::Disconnected);
                if delivered {
                    backoff.reset();
                    failures = 0;
                }
                failures += 1;
                let error = &error as &dyn std::error::Error;
                if failures == 1 {
                    tracing::warn!(worker = %ctx.worker.id(), %uri, error, "load report stream lost");
                } else {
                    tracing::debug!(worker = %ctx.worker.id(), %uri, error, failures, "load report stream still down");
                }
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

fn command(command: Command) -> pb::SubscribeRequest {
    pb::SubscribeRequest { command: Some(command) }
}

fn millis(interval: Duration) -> u32 {
    u32::try_from(interval.as_millis()).unwrap_or(u32::MAX)
}

/// One connection and stream, until it breaks or `cancel` fires.
async fn session(
    ctx: &TaskContext,
    endpoint: &Endpoint,
    interval: &mut watch::Receiver<Duration>,
    cancel: &CancellationToken,
) -> Ended {
    let broken = |error| Ended::Broken { delivered: false, error };
    let timeout = ctx.config.connect_timeout;
    let channel = tokio::select! {
        () = cancel.cancelled() => return Ended::Cancelled,
        connected = tokio::time::timeout(timeout, endpoint.connect()) => match connected {
            Ok(Ok(channel)) => channel,
            Ok(Err(error)) => return broken(SessionError::Connect(error)),
            Err(_) => return broken(SessionError::Timeout(timeout)),
        },
    };
    let mut client =
        LoadReporterClient::new(channel).max_decoding_message_size(ctx.config.max_report_bytes);
    // Room for the register, one interval change and the stop; further changes replace
    // nothing and are retried on the next change, so a full queue only delays them.
    let (requests, outbound) = mpsc::channel(4);
    let register = pb::Register {
        engine_id: ctx.worker.id().to_string(),
        interval_ms: millis(*interval.borrow_and_update()),
        subscriber: ctx.config.subscriber_name.clone(),
    };
    let _ = requests.try_send(command(Command::Register(register)));
    let response = tokio::select! {
        () = cancel.cancelled() => return Ended::Cancelled,
        opened = tokio::time::timeout(timeout, client.subscribe(ReceiverStream::new(outbound))) => {
            match opened {
                Ok(Ok(response)) => response,
                Ok(Err(status)) => return broken(SessionError::Status(status)),
                Err(_) => return broken(SessionError::Timeout(timeout)),
            }
        }
    };
    let mut stream = response.into_inner();
    let mut delivered = false;
    let mut interval_open = true;
    let (worker, incarnation) = (ctx.worker.id(), ctx.worker.incarnation());
    loop {
        let stall = ctx.config.stall_timeout.max(interval.borrow().saturating_mul(4));
        tokio::select! {
            biased;
            () = cancel.cancelled() => {
                let _ = requests.try_send(command(Command::Stop(pb::Stop {})));
                return Ended::Cancelled;
            }
            changed = interval.changed(), if interval_open => {
                if changed.is_ok() {
                    let set = pb::SetInterval { interval_ms: millis(*interval.borrow_and_update()) };
                    let _ = requests.try_send(command(Command::SetInterval(set)));
                } else {
                    interval_open = false;
                }
            }
            message = tokio::time::timeout(stall, stream.message()) => match message {
                Ok(Ok(Some(wire))) => {
                    match Report::from_wire(&wire) {
                        Ok(report) => {
                            delivered |= ctx.apply(report).is_ok();
                        }
                        Err(reason) => ctx.table.reject(worker, incarnation, reason),
                    }
                }
                Ok(Ok(None)) => return Ended::Broken { delivered, error: SessionError::Ended },
                Ok(Err(status)) => {
                    if status.code() == tonic::Code::OutOfRange {
                        ctx.table.reject(worker, incarnation, RejectReason::TooLarge);
                    }
                    return Ended::Broken { delivered, error: SessionError::Status(status) };
                }
                Err(_) => return Ended::Broken { delivered, error: SessionError::Stalled(stall) },
            },
        }
    }
}
