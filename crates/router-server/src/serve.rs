//! One prepared request's way through the router: the bucket loop of router-buckets selects
//! the engines (in the SLO order of the request's targets), [`crate::dispatch`] sends to them,
//! and an engine that could not be reached or declined the request is selected around, within
//! the retry budget. What
//! the selection passed over feeds the metrics from the selection's own record; whether the
//! serving bucket met the SLO targets goes to the response headers and the metrics.

use std::sync::Arc;
use std::time::Instant;

use axum::http::{HeaderName, HeaderValue};
use axum::response::Response;
use router_buckets::{Bucket, BucketRequest, BucketResolver, Selection, Skipped, SloVerdict};
use router_policies::PickError;
use router_workers::{ModelId, WorkerId};
use smallvec::SmallVec;
use tracing::warn;

use crate::app::AppContext;
use crate::dispatch::{Dispatch, Exchange};
use crate::error::{ApiError, Chain};
use crate::metrics;
use crate::telemetry::{ChildSpan, RequestTrace};
use router_config::ModelRuntime;
use router_prepare::PreparedRequest;

/// What a request's metrics are labelled with, filled in as it becomes known (shared ids,
/// not copies: each is a reference count).
#[derive(Debug, Default)]
pub(crate) struct Labels {
    /// The served model's id (never the client's string: a wildcard model would otherwise
    /// let clients mint series).
    model: Option<ModelId>,
    /// The bucket of the last selection.
    bucket: Option<Arc<str>>,
}

impl Labels {
    /// The served model's id; empty until it is known.
    pub(crate) fn model(&self) -> &str {
        self.model.as_ref().map_or("", ModelId::as_str)
    }

    /// The bucket of the last selection; empty before the first.
    pub(crate) fn bucket(&self) -> &str {
        self.bucket.as_deref().unwrap_or_default()
    }

    pub(crate) fn set_model(&mut self, model: &ModelId) {
        self.model = Some(model.clone());
    }

    pub(crate) fn set_bucket(&mut self, bucket: &Bucket) {
        self.bucket = Some(Arc::clone(bucket.shared_id()));
    }
}

/// Selects, dispatches and retries `prepared` for `model`.
pub(crate) async fn serve(
    ctx: &Arc<AppContext>,
    model: &ModelRuntime,
    prepared: &PreparedRequest,
    request_id: &HeaderValue,
    started: Instant,
    labels: &mut Labels,
    trace: &RequestTrace,
) -> Result<Response, ApiError> {
    let (path, streamed) = (prepared.request.endpoint.path(), prepared.request.stream);
    let exchange = Exchange { ctx, request_id, path, streamed, trace };
    ctx.retry_budget().deposit_at(started);
    let retry = &ctx.server().retry;
    let mut retries = 0;
    let mut failure: Option<ApiError> = None;
    // Engines that failed this request: a retry selects among the others.
    let mut excluded = Vec::new();
    loop {
        let request = prepared.bucket_request(model.resolver.model(), &excluded);
        let span = trace.child("selection");
        let selection = match select(ctx, &model.resolver, &request, labels.model(), started).await
        {
            Ok(selection) => selection,
            // A retry that finds nothing left to try reports the failure that caused it.
            Err(err) => {
                span.fail(&Chain(&err));
                return Err(failure.unwrap_or(err));
            }
        };
        if span.is_recording() {
            describe(&span, &selection, retries);
        }
        drop(span);
        labels.set_bucket(selection.bucket);
        let verdict = selection.slo;
        let dispatch = Dispatch {
            exchange,
            prepared,
            model: model.resolver.model(),
            bucket: selection.bucket.id_header(),
            started,
        };
        // Kept for a retry to select around: one engine, or a pair's two.
        let engines: SmallVec<[WorkerId; 2]> =
            selection.pick.workers().map(|w| w.id().clone()).collect();
        match dispatch.run(selection.pick).await {
            Ok(mut response) => {
                let headers = response.headers_mut();
                if retries > 0 {
                    headers.insert(RETRIES_HEADER, HeaderValue::from(retries));
                }
                headers.insert(PROMPT_TOKENS_HEADER, HeaderValue::from(prepared.input_tokens));
                headers.insert(
                    PROMPT_TOKENS_SOURCE_HEADER,
                    HeaderValue::from_static(prepared.token_source.as_str()),
                );
                report_slo(&mut response, labels.model(), verdict);
                return Ok(response);
            }
            Err(err) if err.is_retryable() && retries < retry.max_retries => {
                if !ctx.retry_budget().withdraw() {
                    metrics::retry_budget_exhausted(labels.model());
                    return Err(err);
                }
                retries += 1;
                metrics::retry(labels.model(), &err.retry_reason());
                warn!(error = %Chain(&err), retry = retries, "selecting again without that engine");
                excluded.extend(engines);
                tokio::time::sleep(crate::retry::backoff(retry, retries)).await;
                failure = Some(err);
            }
            Err(err) => return Err(err),
        }
    }
}

/// The bucket loop (docs/design/POLICY_DESIGN.md §3, in router-buckets), with its record counted: each
/// pick by policy, stage and reason; each bucket passed over, and each admission rejection
/// met there.
pub(crate) async fn select<'r>(
    ctx: &AppContext,
    resolver: &'r BucketResolver,
    request: &BucketRequest<'_>,
    model_label: &str,
    started: Instant,
) -> Result<Selection<'r>, ApiError> {
    let outcome = resolver.select(ctx.registry(), request).await;
    let skipped = match &outcome {
        Ok(selection) => &selection.skipped,
        Err(failure) => &failure.skipped,
    };
    for passed_over in skipped {
        count_skipped(model_label, passed_over);
    }
    let selection = outcome.map_err(|failure| ApiError::Select(failure.error))?;
    for (group, pick) in selection.picks() {
        metrics::pick(group.policy().name(), group.stage().as_str(), pick.reason.as_str());
        metrics::engine_selected(pick.worker.id().as_str(), group.stage().as_str());
    }
    metrics::selection(model_label, started.elapsed());
    Ok(selection)
}

/// The selection span's attributes: the bucket, and per stage (`plain`, `prefill`, `decode`)
/// the policy, its reason and the engine; `router.retry` on a retry's selection.
fn describe(span: &ChildSpan, selection: &Selection<'_>, retries: u32) {
    span.set("router.bucket", selection.bucket.id().to_owned());
    for (group, pick) in selection.picks() {
        let stage = group.stage().as_str();
        span.set(format!("router.{stage}.policy"), group.policy().name());
        span.set(format!("router.{stage}.reason"), pick.reason.as_str());
        span.set(format!("router.{stage}.engine"), pick.worker.id().as_str().to_owned());
    }
    if retries > 0 {
        span.set("router.retry", i64::from(retries));
    }
}

/// Says, in the response headers and the metrics, whether the bucket that served met each SLO
/// target the request stated and its model reads (`x-router-slo-ttft`, `x-router-slo-tps`:
/// `met` or `missed`, by the bucket's estimate when the order was made).
fn report_slo(response: &mut Response, model_label: &str, verdict: SloVerdict) {
    for (header, target, check) in
        [(SLO_TTFT_HEADER, "ttft", verdict.ttft), (SLO_TPS_HEADER, "tps", verdict.tps)]
    {
        let Some(check) = check else { continue };
        let value = HeaderValue::from_static(if check.met { "met" } else { "missed" });
        response.headers_mut().insert(header, value);
        metrics::slo_request(model_label, target, check.met);
    }
}

/// How many times the request was selected again after an engine failed it.
const RETRIES_HEADER: HeaderName = HeaderName::from_static("x-router-retries");

/// The prompt tokens the router routed with (a batch's summed), before the engine counted.
const PROMPT_TOKENS_HEADER: HeaderName = HeaderName::from_static("x-router-prompt-tokens");
/// Whether [`PROMPT_TOKENS_HEADER`] is `exact` (token ids) or `estimated` (from the size).
const PROMPT_TOKENS_SOURCE_HEADER: HeaderName =
    HeaderName::from_static("x-router-prompt-tokens-source");

/// Whether the serving bucket met the request's time-to-first-token target.
const SLO_TTFT_HEADER: HeaderName = HeaderName::from_static("x-router-slo-ttft");
/// Whether the serving bucket met the request's decode-throughput target.
const SLO_TPS_HEADER: HeaderName = HeaderName::from_static("x-router-slo-tps");

fn count_skipped(model_label: &str, skipped: &Skipped<'_>) {
    let reason = match &skipped.error.error {
        PickError::NoCandidates { .. } => "no_candidates",
        _ => "admission",
    };
    for rejection in skipped.error.error.rejections() {
        metrics::admission_rejection(rejection.limit.as_str());
    }
    metrics::bucket_fallback(model_label, skipped.bucket.id(), reason);
}

#[cfg(test)]
mod tests;
