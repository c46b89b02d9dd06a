//! The memory of request bodies: every inference body is read whole before its request takes
//! an admission slot or a queue place, within bounds of its own.
//!
//! - At most `server.max_pending_bodies` bodies are arriving at once; one more is refused at its
//!   head (429 `bodies_full`), so slow uploads are bounded by their own count and
//!   `server.body_read_timeout_secs`, never by the inference concurrency.
//! - Bodies in memory (arriving, queued or being served) hold at most
//!   `server.max_inflight_body_bytes` together: a declared length is reserved at the head, a
//!   chunked body as its chunks arrive; a body that would pass the bound is refused (429
//!   `bodies_full`). A request holds its body's bytes until its response ends.
//! - A declared length over `server.max_body_bytes` is a 413 at the head, unread.
//!
//! The router's own HTTP/1.1 loop feeds a body through a small bounded channel and reads the
//! socket only as fast as the body is taken, so no body waits in an unbounded buffer either.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use crate::error::ApiError;
use crate::intake::{IncomingBody, read_body_with};
use crate::metrics;

/// The bounds on bodies arriving and in memory.
#[derive(Debug)]
pub(crate) struct BodyBudget {
    /// One permit per body still arriving.
    arriving: Arc<Semaphore>,
    /// One permit per byte of the bodies in memory.
    bytes: Arc<Semaphore>,
    /// `server.max_body_bytes`.
    max_body: usize,
    /// `server.body_read_timeout_secs`.
    read_secs: u64,
}

/// A body's bytes, held in the budget until dropped (with the response that carries them).
#[derive(Debug)]
pub(crate) struct HeldBody {
    _bytes: Option<OwnedSemaphorePermit>,
}

impl BodyBudget {
    /// `max_pending` bodies arriving at once, `max_bytes` bytes of bodies in memory, each body
    /// at most `max_body` bytes read within `read_secs` seconds.
    pub(crate) fn new(
        max_pending: usize,
        max_bytes: usize,
        max_body: usize,
        read_secs: u64,
    ) -> Self {
        let bytes = max_bytes.min(Semaphore::MAX_PERMITS);
        Self {
            arriving: Arc::new(Semaphore::new(max_pending.min(Semaphore::MAX_PERMITS))),
            bytes: Arc::new(Semaphore::new(bytes)),
            max_body,
            read_secs,
        }
    }

    /// Bodies that may start arriving now.
    pub(crate) fn arriving_room(&self) -> usize {
        self.arriving.available_permits()
    }

    /// Bytes of bodies that may still come into memory.
    pub(crate) fn bytes_room(&self) -> usize {
        self.bytes.available_permits()
    }

    /// Reads `incoming` whole within the bounds: its bytes, and their hold on the budget.
    pub(crate) async fn receive(
        &self,
        incoming: IncomingBody,
    ) -> Result<(Bytes, HeldBody), ApiError> {
        let limit = self.max_body;
        let declared = incoming.framing.declared;
        if declared.is_some_and(|length| length > limit as u64) {
            // Refused unread, without taking a place (`read_body_with` answers it).
            let unread = read_body_with(incoming, limit, self.read_secs, |_| Ok(())).await;
            return unread.map(|bytes| (bytes, HeldBody { _bytes: None }));
        }
        let Ok(_arriving) = Arc::clone(&self.arriving).try_acquire_owned() else {
            return Err(refused());
        };
        let mut held: Option<OwnedSemaphorePermit> = None;
        let mut hold = |bytes: usize| -> Result<(), ApiError> {
            if bytes == 0 {
                return Ok(());
            }
            let n = u32::try_from(bytes).map_err(|_| refused())?;
            let permit = match Arc::clone(&self.bytes).try_acquire_many_owned(n) {
                Ok(permit) => permit,
                Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => return Err(refused()),
            };
            match &mut held {
                Some(all) => all.merge(permit),
                None => held = Some(permit),
            }
            Ok(())
        };
        // A declared length is reserved whole at the head: a flood of large uploads is refused
        // before any of it is read. A chunked body is held as its pieces arrive.
        if let Some(length) = declared {
            hold(usize::try_from(length).unwrap_or(usize::MAX))?;
        }
        let chunked = declared.is_none();
        let bytes =
            read_body_with(
                incoming,
                limit,
                self.read_secs,
                |n| if chunked { hold(n) } else { Ok(()) },
            )
            .await?;
        Ok((bytes, HeldBody { _bytes: held }))
    }
}

/// The refusal of a body the budget has no room for.
fn refused() -> ApiError {
    metrics::refused("bodies_full");
    ApiError::BodiesFull
}

#[cfg(test)]
mod tests {
    use axum::body::Body;

    use super::*;
    use crate::intake::BodyFraming;

    fn incoming(bytes: &'static [u8], declared: bool) -> IncomingBody {
        let framing = BodyFraming {
            declared: declared.then_some(bytes.len() as u64),
            waits_for_continue: false,
        };
        IncomingBody { body: Body::from(bytes), framing }
    }

    #[tokio::test]
    async fn bodies_are_bounded_in_count_and_bytes_and_hold_their_bytes_until_dropped() {
        let budget = BodyBudget::new(2, 10, 8, 5);
        let (bytes, held) = budget.receive(incoming(b"12345", true)).await.expect("fits");
        assert_eq!(&bytes[..], b"12345");
        assert_eq!(budget.bytes_room(), 5, "its bytes are held");
        assert_eq!(budget.arriving_room(), 2, "it is no longer arriving");
        let err = budget.receive(incoming(b"123456", true)).await.expect_err("over the bytes");
        assert!(matches!(err, ApiError::BodiesFull), "{err:?}");
        let err = budget.receive(incoming(b"123456", false)).await.expect_err("chunked, too");
        assert!(matches!(err, ApiError::BodiesFull), "{err:?}");
        assert_eq!(budget.bytes_room(), 5, "a refused body holds nothing");
        drop(held);
        assert_eq!(budget.bytes_room(), 10);
        let err = budget.receive(incoming(b"123456789", true)).await.expect_err("over one body");
        assert!(matches!(err, ApiError::BodyTooLarge { limit: 8 }), "{err:?}");
    }

    /// Found attacking the router: one head declaring 900 GB behind a busy slot made the
    /// router buffer whatever came. The head alone is refused now.
    #[tokio::test]
    async fn a_huge_declared_length_is_refused_at_its_head() {
        let budget = BodyBudget::new(4, 1 << 30, 32 << 20, 5);
        let framing = BodyFraming { declared: Some(900_000_000_000), waits_for_continue: false };
        let body = Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>());
        let err = budget.receive(IncomingBody { body, framing }).await.expect_err("413");
        assert!(matches!(err, ApiError::BodyTooLarge { .. }), "{err:?}");
        assert_eq!(budget.bytes_room(), 1 << 30);
    }

    #[tokio::test]
    async fn one_more_arriving_body_than_allowed_is_refused() {
        let budget = Arc::new(BodyBudget::new(1, 1 << 20, 1 << 20, 5));
        let framing = BodyFraming { declared: Some(4), waits_for_continue: false };
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
        let slow = {
            let budget = Arc::clone(&budget);
            tokio::spawn(async move { budget.receive(IncomingBody { body, framing }).await })
        };
        tokio::task::yield_now().await;
        while budget.arriving_room() > 0 {
            tokio::task::yield_now().await;
        }
        let err = budget.receive(incoming(b"1", true)).await.expect_err("no room to arrive");
        assert!(matches!(err, ApiError::BodiesFull), "{err:?}");
        tx.send(Ok(Bytes::from_static(b"1234"))).await.expect("send");
        drop(tx);
        let (bytes, _held) = slow.await.expect("task").expect("arrived");
        assert_eq!(&bytes[..], b"1234");
        assert_eq!(budget.arriving_room(), 1);
    }
}
