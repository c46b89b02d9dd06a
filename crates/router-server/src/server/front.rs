//! What each client connection is served by: the inference endpoints straight to their
//! handler, everything else through the axum router.
//!
//! An inference request takes the same steps as through the router's layers (the client key,
//! its rate limits, the admission queue, then the handler; the shared steps live in
//! [`crate::auth`] and [`crate::limit`]), without the router's matching, boxed middleware
//! futures and request extensions, which are a real share of a request that spends tens of
//! microseconds in the router (a fast path: docs/benchmarks.md, Fast paths). With CORS
//! configured, every request goes
//! through the router, whose CORS layer answers preflights and marks responses.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::response::{IntoResponse as _, Response};
use futures::FutureExt as _;
use futures::future::{BoxFuture, Either};
use http::{HeaderMap, HeaderName};
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;

use crate::app::AppContext;
use crate::intake::{BodyFraming, IncomingBody};
use crate::routes::inference;
use crate::{auth, limit};
use router_config::Http1Server;
use router_prepare::Endpoint;

/// A connection's service: the router's routes, with the inference endpoints taken first
/// when `inference` is set.
#[derive(Clone)]
pub(super) struct Front {
    app: TowerToHyperService<Router>,
    /// Serves the inference endpoints directly.
    inference: Option<Direct>,
    /// Whether the router's own HTTP/1.1 loop reads connections first (`server.http1: own`).
    own_loop: bool,
}

/// What serves the inference endpoints directly: the shared services, and the request header
/// fields an inference request is read for ([`inference::request_fields`], listed once).
#[derive(Clone)]
pub(super) struct Direct {
    pub ctx: Arc<AppContext>,
    pub fields: Arc<[HeaderName]>,
}

/// The router's own HTTP/1.1 loop serves the inference endpoints through this: each `POST` to
/// one of their paths, with only the header fields an inference request is read for.
impl router_http1::server::Handler for Direct {
    type Route = Endpoint;
    type Body = Body;

    fn route(&self, path: &str) -> Option<Endpoint> {
        Endpoint::at(path)
    }

    fn kept(&self) -> &[HeaderName] {
        &self.fields
    }

    fn call(
        &self,
        endpoint: Endpoint,
        headers: HeaderMap,
        body: router_http1::server::RequestBody,
    ) -> impl Future<Output = Response> + Send {
        // The loop serves no `Expect` (hyper does), and knows the length it read.
        let framing = BodyFraming { declared: Some(body.length()), waits_for_continue: false };
        let body = IncomingBody { body: Body::new(body), framing };
        serve(endpoint, Arc::clone(&self.ctx), headers, body)
    }
}

impl Front {
    /// `app` for every request.
    pub(super) fn app(app: Router) -> Self {
        Self { app: TowerToHyperService::new(app), inference: None, own_loop: false }
    }

    /// The router's routes over `ctx`, the inference endpoints served directly unless CORS
    /// is configured, and read by the own HTTP/1.1 loop first if `server.http1` says so.
    pub(super) fn router(ctx: Arc<AppContext>) -> Self {
        let app = TowerToHyperService::new(super::routes(Arc::clone(&ctx)));
        let direct = ctx.server().cors_allowed_origins.is_empty();
        let own_loop = ctx.server().http1 == Http1Server::Own;
        let inference = direct.then(|| Direct { fields: inference::request_fields(&ctx), ctx });
        Self { app, inference, own_loop }
    }

    /// What the own HTTP/1.1 loop serves the inference endpoints by, if it reads this front's
    /// connections.
    pub(super) fn own_loop(&self) -> Option<&Direct> {
        self.inference.as_ref().filter(|_| self.own_loop)
    }
}

type AppFuture =
    <TowerToHyperService<Router> as hyper::service::Service<http::Request<Incoming>>>::Future;

impl hyper::service::Service<http::Request<Incoming>> for Front {
    type Response = Response;
    type Error = Infallible;
    type Future = Either<BoxFuture<'static, Result<Response, Infallible>>, AppFuture>;

    fn call(&self, request: http::Request<Incoming>) -> Self::Future {
        if let Some(Direct { ctx, .. }) = &self.inference
            && request.method() == http::Method::POST
            && let Some(endpoint) = Endpoint::at(request.uri().path())
        {
            // The handler's future boxed as it is, not inside another future: a request's
            // future is kilobytes, and each layer around it is a copy of it.
            let ctx = Arc::clone(ctx);
            let (parts, body) = request.into_parts();
            let body = IncomingBody::framed_by(&parts.headers, Body::new(body));
            let served = serve(endpoint, ctx, parts.headers, body);
            return Either::Left(Box::pin(served.map(Ok)));
        }
        Either::Right(self.app.call(request))
    }
}

/// An inference request (its head's fields and its body) through the client key, its rate
/// limits and the admission queue to its handler, as the router's layers of the inference
/// routes take it.
pub(super) async fn serve(
    endpoint: Endpoint,
    ctx: Arc<AppContext>,
    headers: HeaderMap,
    body: IncomingBody,
) -> Response {
    let key = match auth::client_key(ctx.credentials(), &headers) {
        Ok(key) => key,
        Err(refusal) => return refusal.into_response(),
    };
    let charge = match limit::rate_limited(ctx.rate_limits(), key) {
        Ok(charge) => charge,
        Err(refusal) => return refusal.into_response(),
    };
    // The body first, within its own bounds; then a slot (the queue holds whole requests).
    let (bytes, held) = match ctx.bodies().receive(body).await {
        Ok(received) => received,
        Err(refusal) => return limit::refused_body(refusal, &headers, ctx.request_id_headers()),
    };
    let permit = match limit::admit(ctx.admission()).await {
        Ok(permit) => permit,
        Err(refusal) => return refusal.into_response(),
    };
    let framing = BodyFraming { declared: Some(bytes.len() as u64), waits_for_continue: false };
    let body = IncomingBody { body: Body::from(bytes), framing };
    let response = inference::endpoint_request(endpoint, ctx, charge, headers, body);
    limit::holding(response.await, (permit, held))
}
