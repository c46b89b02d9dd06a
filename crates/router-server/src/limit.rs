//! A bound on concurrent chat requests: beyond it the router answers 503 with `Retry-After`
//! at once instead of queueing, so a flood cannot grow memory without bound. A request holds
//! its permit until its response body ends or is dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::Frame;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// Admits a request while `slots` (`server.max_concurrent_requests` of them) has a permit.
pub(crate) async fn concurrency(
    State(slots): State<Arc<Semaphore>>,
    request: Request,
    next: Next,
) -> Response {
    let Ok(permit) = slots.try_acquire_owned() else {
        crate::metrics::refused("overloaded");
        return ApiError::Overloaded.into_response();
    };
    next.run(request).await.map(|body| Body::new(PermitBody { inner: body, _permit: permit }))
}

struct PermitBody {
    inner: Body,
    _permit: OwnedSemaphorePermit,
}

impl http_body::Body for PermitBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
