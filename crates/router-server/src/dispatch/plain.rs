//! A plain dispatch: one engine (at the rank chosen for it, named in `x-router-rank`) serves
//! the whole request. Its in-flight guard is held until the answer is read or the stream ends;
//! a pick with a TTFT prediction reports the observed first token beside it (a stream's first
//! byte, a one-token answer's end), which also teaches the engine's prefill rate.

use std::sync::Arc;
use std::time::Instant;

use axum::response::Response;
use router_policies::Pick;
use router_workers::Stage;

use super::{Dispatch, ENGINE_HEADER, RANK_HEADER, counted};
use crate::error::{ApiError, EngineError};
use crate::forward::{AnswerMetrics, TtftPrediction};
use crate::metrics;

/// Sends the request to `pick`'s engine, accounted as `stage` (plain, or the decode engine of a
/// pair answering a passed-through request).
pub(super) async fn dispatch(
    d: Dispatch<'_>,
    pick: Pick,
    stage: Stage,
) -> Result<Response, ApiError> {
    let x = d.exchange;
    let worker = &pick.worker;
    let rank = d.rank(&pick, stage)?;
    let request = d.engine_request(worker, rank, &[]);
    let guard = d.dispatched(&pick, stage, rank);
    let dispatched_at = Instant::now();
    let head = async {
        let upstream = x.send(worker, request).await?;
        metrics::time_to_response_head(d.model.as_str(), d.started.elapsed());
        x.checked(worker, upstream).await
    };
    // A whole answer's deadline covers its head too; a stream's head waits as long as
    // `request_timeout_secs` lets it.
    let (parts, body) = if x.streamed {
        head.await
    } else {
        let deadline = tokio::time::Instant::from_std(dispatched_at) + x.answer_limit();
        tokio::time::timeout_at(deadline, head).await.unwrap_or_else(|_| {
            let (worker, limit) = (worker.id().clone(), x.answer_limit());
            Err(counted(EngineError::Overdue { worker, limit }))
        })
    }
    .map_err(ApiError::Engine)?;
    let prediction = pick.predicted_ttft_ms.map(|predicted_ms| TtftPrediction {
        predicted_ms,
        work_tokens: pick.predicted_work_tokens,
        rates: Arc::clone(&x.ctx.load().rates),
    });
    let answer_metrics = AnswerMetrics { prediction, ..d.answer_metrics(dispatched_at) };
    let mut response = if x.streams(&parts) {
        x.stream(parts, body, vec![guard], worker, None, answer_metrics)
    } else {
        let response = x.whole(parts, body, worker, &answer_metrics).await;
        let response = response.map_err(ApiError::Engine)?;
        drop(guard);
        response
    };
    let headers = response.headers_mut();
    headers.insert(ENGINE_HEADER, worker.id_header().clone());
    if let Some(rank) = rank {
        headers.insert(RANK_HEADER, rank.rank.into());
    }
    Ok(response)
}
