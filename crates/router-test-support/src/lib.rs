//! Test support shared by the workspace's tests (a dev-dependency only; the end-to-end crate's
//! helpers use it too): waiting for a condition instead of sleeping for a guessed time.
//!
//! Owns the waits: [`eventually`] (and [`poll_until`]) re-checks an async condition,
//! [`on_change`] re-checks one whenever a watch channel signals, [`settle`] lets the spawned
//! tasks of a current-thread runtime run until a condition holds. Each gives up after a bound ([`PATIENCE`], or a number
//! of scheduler turns) that only a broken test reaches: a bound, never a timing assertion.
//! Also the fake Kubernetes API server ([`fake_kube`]) that router-discovery's tests and the
//! end-to-end discovery test both run.
//!
//! Also a loopback URL nothing listens on ([`nothing_listens`]), prompt text of a known size
//! for the long-prompt benchmarks ([`prompts`]), the reading of a started program's output
//! until it says it is ready ([`process`]) and the Envoy gateway's configuration ([`envoy`]),
//! which the end-to-end harness and the benchmark (xtask) share.
//!
//! Does not own the fixtures of one crate (they stay beside its tests), nor the processes
//! themselves (`router-e2e` and xtask start theirs). It depends on no workspace crate, so that
//! any crate's unit tests can use it without building a second copy of that crate.

use std::time::Duration;

pub mod envoy;
pub mod fake_kube;
pub mod process;
pub mod prompts;

use tokio::sync::watch;

/// The longest a wait lasts; reaching it fails the test.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// How often [`eventually`] re-checks.
const POLL: Duration = Duration::from_millis(10);

/// Scheduler turns [`settle`] allows.
const TURNS: usize = 1000;

/// Re-checks `check` every few milliseconds until it holds, for conditions nothing signals
/// (a count behind an HTTP endpoint, a subscriber on the other side of a socket). Panics naming
/// `what` after [`PATIENCE`].
pub async fn eventually(what: &str, check: impl AsyncFnMut() -> bool) {
    assert!(poll_until(check).await, "gave up waiting for: {what}");
}

/// [`eventually`] for a caller that fails with more than a name: true once `check` holds,
/// false when [`PATIENCE`] ran out first.
pub async fn poll_until(mut check: impl AsyncFnMut() -> bool) -> bool {
    let waited = tokio::time::timeout(PATIENCE, async {
        while !check().await {
            tokio::time::sleep(POLL).await;
        }
    })
    .await;
    waited.is_ok()
}

/// Waits until `check` gives a value, checking now and again whenever `changes` signals (a
/// change between two checks is never missed). `None` after [`PATIENCE`] or when the sender is
/// gone, so that the caller can fail naming what it saw.
pub async fn on_change<T, R>(
    changes: &mut watch::Receiver<T>,
    mut check: impl FnMut() -> Option<R>,
) -> Option<R> {
    let found = tokio::time::timeout(PATIENCE, async {
        loop {
            changes.mark_unchanged();
            if let Some(found) = check() {
                return Some(found);
            }
            changes.changed().await.ok()?;
        }
    })
    .await;
    found.ok().flatten()
}

/// Lets the spawned tasks of a current-thread runtime run until `done` holds, yielding between
/// checks. Reads no clock, so it works under `tokio::time::pause`. Panics naming `what` when
/// `done` still fails after a thousand scheduler turns.
pub async fn settle(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..TURNS {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{what}: not reached after {TURNS} scheduler turns");
}

/// The URL of a loopback port nothing listens on, so connecting is refused: bound without
/// listening and held until the tests end, so that no other test's listener is given it (a
/// port bound and released could be).
pub fn nothing_listens() -> String {
    static HELD: parking_lot::Mutex<Vec<tokio::net::TcpSocket>> =
        parking_lot::Mutex::new(Vec::new());
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0))).expect("bind");
    let url = format!("http://{}", socket.local_addr().expect("address"));
    HELD.lock().push(socket);
    url
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn eventually_returns_once_the_condition_holds() {
        let mut checks = 0;
        eventually("the third check", async || {
            checks += 1;
            checks == 3
        })
        .await;
        assert_eq!(checks, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn eventually_gives_up_after_its_patience() {
        let waited = tokio::spawn(eventually("never", async || false)).await;
        let panic = waited.expect_err("gave up").into_panic();
        let message = panic.downcast_ref::<String>().map_or("", String::as_str);
        assert_eq!(message, "gave up waiting for: never");
    }

    #[tokio::test]
    async fn on_change_rechecks_on_every_signal_and_gives_what_it_found() {
        let (tx, mut rx) = watch::channel(0u64);
        let value = Arc::new(AtomicUsize::new(0));
        let writer = Arc::clone(&value);
        let task = tokio::spawn(async move {
            for n in 1..=3 {
                writer.store(n, Ordering::SeqCst);
                tx.send_modify(|v| *v += 1);
                tokio::task::yield_now().await;
            }
            tx
        });
        let found = on_change(&mut rx, || Some(value.load(Ordering::SeqCst)).filter(|v| *v == 3));
        assert_eq!(found.await, Some(3));
        drop(task.await);
    }

    #[tokio::test]
    async fn on_change_ends_when_the_sender_is_gone() {
        let (tx, mut rx) = watch::channel(());
        drop(tx);
        assert_eq!(on_change(&mut rx, || None::<()>).await, None);
    }

    #[tokio::test]
    async fn settle_lets_spawned_tasks_run() {
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
        settle("the task ran", || done.load(Ordering::SeqCst)).await;
    }
}
