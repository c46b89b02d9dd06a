//! The picker's decision for one request: prepared as the HTTP front prepares it
//! ([`crate::routes::inference::prepare_request`]), selected by the same bucket loop
//! ([`crate::serve::select`]) within the subset hint, with up to `fallbacks` further engines
//! of the routed group named after the pick ([`router_buckets::EngineGroup::pick_fallback`]),
//! and the in-flight guards of what Envoy will send to, held by the [`Routed`] value.
//!
//! A PD selection routes the request to its decode engine and names the prefill engine for a
//! decode-side sidecar (`x-prefiller-host-port`); requests the engines do not generate for
//! (embeddings, tokenize, ...) go to the decode engine alone, as in the HTTP front.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::HeaderMap;
use router_buckets::{BucketPick, EngineGroup};
use router_policies::Pick;
use router_state_load::InflightGuard;
use router_workers::{Stage, WorkerId};

use super::endpoints::{endpoint_of, workers_at};
use crate::app::AppContext;
use crate::error::ApiError;
use crate::routes::inference::prepare_request;
use crate::serve::{Labels, select};
use router_prepare::Endpoint;

/// What a stream asks the picker to route.
pub(crate) struct RouteRequest<'a> {
    /// The API of the request's path; `None`: a path the router does not prepare (or a request
    /// without a body), routed as a one-token passed-through request of the only model.
    pub endpoint: Option<Endpoint>,
    /// The client's headers (affinity keys, the data-parallel rank header).
    pub headers: &'a HeaderMap,
    /// The whole request body (empty for `endpoint: None`).
    pub body: Bytes,
    /// The subset hint's endpoints, when the request carried one.
    pub subset: Option<&'a [String]>,
    /// How many fallbacks to name after the pick.
    pub fallbacks: usize,
    /// When the stream began.
    pub started: Instant,
}

/// A routed request: where Envoy sends it, and the in-flight accounting of that dispatch,
/// released when this value is dropped (the stream's end).
#[derive(Debug)]
pub(crate) struct Routed {
    /// `ip:port` of the routed engine, then of each fallback, comma-separated.
    pub destination: String,
    /// `ip:port` of the prefill engine of a PD pair, for the decode-side sidecar.
    pub prefiller: Option<String>,
    /// The routed engine.
    pub engine: WorkerId,
    /// The served model and the bucket that chose, for metrics and response headers.
    pub labels: Labels,
    /// The body Envoy forwards: the client's bytes, or a copy without router-owned fields.
    pub body: Bytes,
    /// How many fallbacks were named.
    pub fallbacks: usize,
    _guards: Vec<InflightGuard>,
}

/// An empty JSON object: what a request the router does not prepare is parsed as.
const OPAQUE_BODY: &[u8] = b"{}";

/// Prepares, selects and accounts `request`.
pub(crate) async fn route(
    ctx: &Arc<AppContext>,
    request: RouteRequest<'_>,
) -> Result<Routed, ApiError> {
    let mut labels = Labels::default();
    let (endpoint, prepared_body) = match request.endpoint {
        Some(endpoint) => (endpoint, request.body.clone()),
        None => (Endpoint::Embeddings, Bytes::from_static(OPAQUE_BODY)),
    };
    let (model, prepared) =
        prepare_request(ctx, endpoint, request.headers, prepared_body, &mut labels).await?;
    let subset = request.subset.map(|endpoints| workers_at(ctx.registry(), endpoints));
    let mut bucket_request = prepared.bucket_request(model.resolver.model(), &[]);
    bucket_request.subset = subset.as_deref();
    let selection =
        select(ctx, &model.resolver, &bucket_request, labels.model(), request.started).await?;
    labels.set_bucket(selection.bucket);
    let generates = request.endpoint.is_some_and(Endpoint::generates);
    let groups: Vec<&EngineGroup> = selection.bucket.groups().iter().collect();
    let tokens = prepared.tokens.as_deref();
    let dispatched = |pick: &Pick, stage| {
        ctx.dispatched(model.resolver.model(), pick, stage, None, prepared.input_tokens, tokens)
    };
    let (routed, group, stage, prefill) = match &selection.pick {
        BucketPick::Plain(pick) => (pick, groups[0], Stage::Plain, None),
        BucketPick::Pd { prefill, decode } if generates => {
            (decode, groups[1], Stage::Decode, Some(prefill))
        }
        BucketPick::Pd { decode, .. } => (decode, groups[1], Stage::Decode, None),
    };
    let mut guards = vec![dispatched(routed, stage)];
    let prefiller = match prefill {
        Some(prefill) => {
            guards.push(dispatched(prefill, Stage::Prefill));
            Some(endpoint_named(prefill)?)
        }
        None => None,
    };
    let mut named = vec![routed.worker.id().clone()];
    let mut destination = endpoint_named(routed)?;
    for _ in 0..request.fallbacks {
        let next = group
            .pick_fallback(ctx.registry(), selection.bucket.id(), &bucket_request, &named)
            .await;
        // Fewer fallbacks than asked is fine: the group has no other admitted candidate.
        let Ok(next) = next else { break };
        let Ok(endpoint) = endpoint_named(&next) else { break };
        destination.push(',');
        destination.push_str(&endpoint);
        named.push(next.worker.id().clone());
    }
    let body = match request.endpoint {
        Some(_) => prepared.body.clone(),
        None => request.body,
    };
    Ok(Routed {
        destination,
        prefiller,
        engine: routed.worker.id().clone(),
        labels,
        body,
        fallbacks: named.len() - 1,
        _guards: guards,
    })
}

/// The endpoint of `pick`'s engine; a worker URL without one cannot be routed to by Envoy.
fn endpoint_named(pick: &Pick) -> Result<String, ApiError> {
    endpoint_of(&pick.worker).ok_or_else(|| ApiError::NoEndpoint {
        worker: pick.worker.id().clone(),
        url: pick.worker.url().to_owned(),
    })
}
