//! The data-parallel rank of each engine of a dispatch, and the request that names it.
//!
//! An engine whose worker sets `dp_route` gets the rank the router chose
//! ([`router_policies::choose_rank`]), or the client's when `server.allow_client_dp_rank` is
//! set: as `"data_parallel_rank": r` in the body (`dp_route: body`, SGLang) or the
//! `X-data-parallel-rank: r` header (`dp_route: header`, vLLM), the client's own field or
//! header removed. An engine without `dp_route` balances its ranks itself and gets the
//! client's rank, if any, as the client gave it. Either way a client's rank that the engine
//! does not have is a 400, before anything is sent.

use bytes::Bytes;
use router_policies::{Pick, RankChoice, RankReason, choose_rank};
use router_state_load::InflightGuard;
use router_workers::{DpRoute, Stage, Worker};
use serde_json::Value;

use super::Dispatch;
use crate::error::ApiError;
use crate::metrics;
use router_prepare::{self as prepare, DP_RANK_HEADER, ROUTER_OWNED_FIELDS};

/// SGLang's body field naming the rank.
const DP_RANK_FIELD: &str = "data_parallel_rank";

/// What one engine of a dispatch gets: its body, and the rank for [`DP_RANK_HEADER`].
pub(super) struct EngineRequest {
    /// The JSON body.
    pub body: Bytes,
    /// The rank named in the header, if any.
    pub rank_header: Option<u32>,
    /// How `body` was made from the client's, so that a sibling engine needing the same one
    /// (the other engine of a PD pair) shares it instead of serialising it again.
    pub edit: BodyEdit,
}

/// How an engine's body differs from the client's, besides the router's fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct BodyEdit {
    /// The rank written as `data_parallel_rank`.
    rank: Option<u32>,
    /// The client's own `data_parallel_rank` is removed (the router names ranks there).
    drops_clients_rank: bool,
}

impl Dispatch<'_> {
    /// The rank of `pick`'s engine that serves this request for `stage`: `None` when the
    /// engine picks its own. Counted by reason.
    pub(super) fn rank(&self, pick: &Pick, stage: Stage) -> Result<Option<RankChoice>, ApiError> {
        let worker = &pick.worker;
        let client = self.prepared.client_rank;
        if let Some(client) = client
            && client.rank >= worker.dp_size()
        {
            let param = match client.via {
                DpRoute::Body => DP_RANK_FIELD,
                DpRoute::Header => DP_RANK_HEADER,
            };
            return Err(ApiError::InvalidRequest {
                message: format!(
                    "{param} {} names no rank of engine {} (dp_size {})",
                    client.rank,
                    worker.id(),
                    worker.dp_size()
                ),
                param: Some(param.to_owned()),
            });
        }
        worker.dp_route().map_or(Ok(None), |_| {
            let choice = match client {
                Some(client) if self.exchange.ctx.server().allow_client_dp_rank => {
                    Some(RankChoice { rank: client.rank, reason: RankReason::Client })
                }
                _ => choose_rank(self.exchange.ctx.load(), pick, stage, self.prepared.input_tokens),
            };
            if let Some(choice) = choice {
                metrics::rank_choice(worker.id().as_str(), choice.rank, choice.reason.as_str());
            }
            Ok(choice)
        })
    }

    /// The in-flight guard of sending `pick` for `stage`, to `rank` when one was chosen
    /// ([`AppContext::dispatched`](crate::app::AppContext::dispatched)).
    pub(super) fn dispatched(
        &self,
        pick: &Pick,
        stage: Stage,
        rank: Option<RankChoice>,
    ) -> InflightGuard {
        let prepared = self.prepared;
        self.exchange.ctx.dispatched(
            self.model,
            pick,
            stage,
            rank.map(|r| r.rank),
            prepared.input_tokens,
            prepared.tokens.as_deref(),
        )
    }

    /// The request `worker` gets: the prepared body with the router's `fields` set (the PD
    /// bootstrap fields, say), and the rank `rank` named as the worker's `dp_route` says.
    /// Without fields or a rank to write, the prepared bytes as they are.
    pub(super) fn engine_request(
        &self,
        worker: &Worker,
        rank: Option<RankChoice>,
        fields: &[(&str, Value)],
    ) -> EngineRequest {
        self.engine_request_beside(worker, rank, fields, None)
    }

    /// [`Self::engine_request`] for an engine beside `sibling`, made with the same `fields`:
    /// `sibling`'s body when this engine's is the same.
    pub(super) fn engine_request_beside(
        &self,
        worker: &Worker,
        rank: Option<RankChoice>,
        fields: &[(&str, Value)],
        sibling: Option<&EngineRequest>,
    ) -> EngineRequest {
        let prepared = self.prepared;
        let client = prepared.client_rank;
        let route = worker.dp_route();
        let rank = rank.map(|choice| choice.rank);
        let rank_header = match route {
            Some(DpRoute::Header) => rank,
            Some(DpRoute::Body) => None,
            // The engine picks its rank itself: a client's header goes through as it was.
            None => client.filter(|c| c.via == DpRoute::Header).map(|c| c.rank),
        };
        let edit = BodyEdit {
            rank: rank.filter(|_| route == Some(DpRoute::Body)),
            drops_clients_rank: route.is_some() && prepared.request.body.has(DP_RANK_FIELD),
        };
        let body = match sibling {
            Some(sibling) if sibling.edit == edit => sibling.body.clone(),
            _ if fields.is_empty() && edit == BodyEdit::default() => prepared.body.clone(),
            _ => self.edited_body(edit, fields),
        };
        EngineRequest { body, rank_header, edit }
    }

    /// The client's body without router-owned fields, with `fields` and `edit` applied.
    fn edited_body(&self, edit: BodyEdit, fields: &[(&str, Value)]) -> Bytes {
        let rank = edit.rank.map(|rank| (DP_RANK_FIELD, Value::from(rank)));
        let set: Vec<(&str, Value)> = fields.iter().cloned().chain(rank).collect();
        let dp_rank = edit.drops_clients_rank.then_some(DP_RANK_FIELD);
        let remove: Vec<&str> = ROUTER_OWNED_FIELDS.into_iter().chain(dp_rank).collect();
        // The body to forward is one `parse_request` accepted (or the same without the
        // router-owned fields): an object.
        prepare::edit_members(&self.prepared.body, &remove, &set)
            .expect("an accepted body is an object")
    }
}
