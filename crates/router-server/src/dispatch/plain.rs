//! A plain dispatch: one engine (at the rank chosen for it, named in `x-router-rank`) serves
//! the whole request. Its in-flight guard is held until the answer is read or the stream ends;
//! a pick with a TTFT prediction reports the observed first token beside it (a stream's first
//! byte, a one-token answer's end), which also teaches the engine's prefill rate.

use std::sync::Arc;
use std::time::Instant;

use axum::response::Response;
use router_policies::Pick;
use router_workers::Stage;

use super::{Dispatch, ENGINE_HEADER, RANK_HEADER};
use crate::error::ApiError;
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
    let upstream = x.send(worker, request).await.map_err(ApiError::Engine)?;
    metrics::time_to_response_head(d.model.as_str(), d.started.elapsed());
    let (parts, body) = x.checked(worker, upstream).await.map_err(ApiError::Engine)?;
    let prediction = pick.predicted_ttft_ms.map(|predicted_ms| TtftPrediction {
        predicted_ms,
        work_tokens: pick.predicted_work_tokens,
        dispatched_at,
        rates: Arc::clone(&x.ctx.load().rates),
    });
    let answer_metrics = AnswerMetrics { prediction, ..d.answer_metrics() };
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
