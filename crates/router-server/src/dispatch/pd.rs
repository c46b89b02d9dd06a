//! The SGLang bootstrap protocol for a prefill/decode pair: both engines get the request with
//! the prefill engine's bootstrap address and one random room, sent concurrently; the decode
//! engine's answer is the client's. (A client's own bootstrap fields are replaced.) With a
//! prefill rank chosen, the room agrees with it and the decode engine is told it
//! (`disagg_prefill_dp_rank`); each engine gets its own rank.
//!
//! A prefill failure before the decode head arrives fails the request; after it, it ends the
//! stream with an error event (or fails a whole answer still being read). A decode failure
//! cancels the prefill request, and is never retried: the prefill engine may already hold the
//! request. A decode engine that answers 5xx because its bootstrap partner failed is not
//! blamed when the prefill failure arrives within [`PARTNER_GRACE`].

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use router_policies::Pick;
use router_workers::{Stage, Worker};
use serde_json::Value;
use tokio::sync::oneshot;
use tracing::{Instrument, warn};

use super::rank::EngineRequest;
use super::{
    DECODE_ENGINE_HEADER, DECODE_RANK_HEADER, Dispatch, Exchange, PREFILL_ENGINE_HEADER,
    PREFILL_RANK_HEADER, counted, read_snippet,
};
use crate::error::{ApiError, Chain, EngineError};

/// SGLang's default bootstrap port, used when a prefill worker does not name one.
pub(super) const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// How long a decode engine's 5xx waits for its prefill partner's failure to explain it.
const PARTNER_GRACE: Duration = Duration::from_secs(2);

/// A random 63-bit bootstrap room, as SGLang expects; with a prefill rank chosen, one that is
/// `rank` modulo the prefill engine's `dp_size`, as SGLang's decode side derives the prefill
/// rank when it is not told.
fn bootstrap_room(prefill_rank: Option<(u32, u32)>) -> u64 {
    let room = rand::random::<u64>() >> 1;
    match prefill_rank {
        Some((rank, dp_size)) if dp_size > 1 => room - room % u64::from(dp_size) + u64::from(rank),
        _ => room,
    }
}

/// The fields both engines get: the prefill engine's bootstrap address and the room, a list of
/// `rooms` rooms when given (see `InferenceRequest::bootstrap_rooms`), else one room; rooms
/// agree with the prefill rank when one was chosen.
pub(super) fn bootstrap_fields(
    prefill: &Worker,
    prefill_rank: Option<u32>,
    rooms: Option<usize>,
) -> Vec<(&'static str, Value)> {
    let ranked = prefill_rank.map(|rank| (rank, prefill.dp_size()));
    let room = match rooms {
        None => Value::from(bootstrap_room(ranked)),
        Some(k) => (0..k).map(|_| Value::from(bootstrap_room(ranked))).collect(),
    };
    vec![
        ("bootstrap_host", prefill.host().into()),
        ("bootstrap_port", prefill.bootstrap_port().unwrap_or(DEFAULT_BOOTSTRAP_PORT).into()),
        ("bootstrap_room", room),
    ]
}

pub(super) async fn dispatch(
    d: Dispatch<'_>,
    prefill: Pick,
    decode: Pick,
) -> Result<Response, ApiError> {
    let (prepared, x) = (d.prepared, d.exchange);
    let prefill_rank = d.rank(&prefill, Stage::Prefill)?;
    let decode_rank = d.rank(&decode, Stage::Decode)?;
    let mut fields = bootstrap_fields(
        &prefill.worker,
        prefill_rank.map(|r| r.rank),
        prepared.request.bootstrap_rooms(),
    );
    let prefill_request = d.engine_request(&prefill.worker, prefill_rank, &fields);
    let decode_request = match prefill_rank {
        // The same fields: the decode engine shares the prefill body when it needs the same.
        None => {
            d.engine_request_beside(&decode.worker, decode_rank, &fields, Some(&prefill_request))
        }
        Some(rank) => {
            // The decode side is told which prefill rank holds its KV cache.
            fields.push(("disagg_prefill_dp_rank", rank.rank.into()));
            d.engine_request(&decode.worker, decode_rank, &fields)
        }
    };
    let prefill_guard = d.dispatched(&prefill, Stage::Prefill, prefill_rank);
    let decode_guard = d.dispatched(&decode, Stage::Decode, decode_rank);

    let (failed_tx, mut failed_rx) = oneshot::channel::<ApiError>();
    let prefill_task = {
        let (ctx, worker) = (Arc::clone(x.ctx), Arc::clone(&prefill.worker));
        let (request_id, path, streamed) = (x.request_id.clone(), x.path, x.streamed);
        let trace = x.trace.clone();
        tokio::spawn(
            async move {
                let _guard = prefill_guard;
                let x =
                    Exchange { ctx: &ctx, request_id: &request_id, path, streamed, trace: &trace };
                if let Err(err) = run_prefill(x, &worker, prefill_request).await {
                    let err = ApiError::Prefill(err);
                    warn!(error = %Chain(&err), "prefill failed");
                    let _ = failed_tx.send(err);
                }
            }
            .in_current_span(),
        )
    };
    let abort_prefill = AbortOnDrop(Some(prefill_task));

    let decode_worker = &decode.worker;
    let decode_dispatched = std::time::Instant::now();
    let decode_send = x.send(decode_worker, decode_request);
    tokio::pin!(decode_send);
    let mut prefill_succeeded = false;
    let upstream = loop {
        tokio::select! {
            result = &mut decode_send => break result.map_err(ApiError::Decode)?,
            failed = &mut failed_rx, if !prefill_succeeded => match failed {
                Ok(err) => return Err(err),
                // The sender is dropped without a message when the prefill succeeded.
                Err(_) => prefill_succeeded = true,
            },
        }
    };
    if upstream.status().is_server_error() && !prefill_succeeded {
        if let Ok(Ok(err)) = tokio::time::timeout(PARTNER_GRACE, &mut failed_rx).await {
            return Err(err);
        }
        prefill_succeeded = true;
    }
    let (parts, body) = x.checked(decode_worker, upstream).await.map_err(ApiError::Decode)?;
    let mut response = if x.streams(&parts) {
        let partner = (!prefill_succeeded).then_some(failed_rx);
        let answer_metrics = d.answer_metrics(decode_dispatched);
        x.stream(parts, body, vec![decode_guard], decode_worker, partner, answer_metrics)
    } else {
        let answer_metrics = d.answer_metrics(decode_dispatched);
        let answer = x.whole(parts, body, decode_worker, &answer_metrics);
        let response = if prefill_succeeded {
            answer.await.map_err(ApiError::Decode)?
        } else {
            tokio::select! {
                answer = answer => answer.map_err(ApiError::Decode)?,
                err = failure_of(failed_rx) => return Err(err),
            }
        };
        drop(decode_guard);
        response
    };
    // The decode answer is under way: the prefill request runs to its end on its own.
    abort_prefill.disarm();
    let headers = response.headers_mut();
    headers.insert(PREFILL_ENGINE_HEADER, prefill.worker.id_header().clone());
    headers.insert(DECODE_ENGINE_HEADER, decode_worker.id_header().clone());
    if let Some(rank) = prefill_rank {
        headers.insert(PREFILL_RANK_HEADER, rank.rank.into());
    }
    if let Some(rank) = decode_rank {
        headers.insert(DECODE_RANK_HEADER, rank.rank.into());
    }
    Ok(response)
}

/// The prefill engine's side: sent, judged and read to its end.
async fn run_prefill(
    x: Exchange<'_>,
    worker: &Worker,
    request: EngineRequest,
) -> Result<(), EngineError> {
    let dispatched = std::time::Instant::now();
    let upstream = x.send(worker, request).await?;
    let (parts, body) = x.checked(worker, upstream).await?;
    if !parts.status.is_success() {
        let text = read_snippet(body).await;
        let status = parts.status;
        return Err(counted(EngineError::Refused { worker: worker.id().clone(), status, text }));
    }
    x.read_answer(worker, body, dispatched).await.map(drop)
}

/// The prefill partner's failure, if it fails; pending forever once it succeeded.
async fn failure_of(failed: oneshot::Receiver<ApiError>) -> ApiError {
    match failed.await {
        Ok(err) => err,
        Err(_) => std::future::pending().await,
    }
}

/// Aborts the prefill request when the PD dispatch is abandoned before the decode answer
/// starts (decode failure, or the client leaving).
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl AbortOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests;
