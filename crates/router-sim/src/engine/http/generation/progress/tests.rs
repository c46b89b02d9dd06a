//! The release rule over merged runs: the stream interval per run, complete runs flushed,
//! rooms ready at the first token, and a stopped engine reported after what it sent.

use std::sync::Arc;

use tokio::sync::mpsc::{self, UnboundedSender};

use super::*;
use crate::engine::bootstrap::{RoomState, Rooms};

fn run(len: usize, room: Option<RoomGuard>) -> Run {
    let pieces = (0..len).map(|i| format!("<{i}>")).collect();
    Run::new(0, 3, (0..len as u32).collect(), pieces, Finish::Length, room)
}

/// A generation of runs with these output lengths, and the scheduler's side of each.
fn generation(interval: usize, lens: &[usize]) -> (Generation, Vec<UnboundedSender<Progress>>) {
    let mut generation = Generation::new(Instant::now(), interval);
    let senders = lens
        .iter()
        .map(|len| {
            let (tx, rx) = mpsc::unbounded_channel();
            generation.add(run(*len, None), rx);
            tx
        })
        .collect();
    (generation, senders)
}

fn tokens(tx: &UnboundedSender<Progress>, count: usize, first: bool) {
    for i in 0..count {
        let message =
            if first && i == 0 { Progress::First { cached_tokens: 16 } } else { Progress::Token };
        tx.send(message).expect("receiver alive");
    }
}

fn release(run: usize, from: usize, to: usize) -> Release {
    Release { run, from, to }
}

#[tokio::test]
async fn a_run_releases_every_interval_and_at_its_end() {
    let (mut generation, txs) = generation(4, &[10]);
    let mut seen = Vec::new();
    for step in 0..10 {
        tokens(&txs[0], 1, step == 0);
        if step == 9 {
            txs[0].send(Progress::Done).expect("alive");
        }
        if let Some(Some(Ok(releases))) = generation.next().now_or_never() {
            seen.extend(releases);
        }
    }
    assert_eq!(seen, [release(0, 0, 4), release(0, 4, 8), release(0, 8, 10)]);
    assert!(generation.complete());
    assert!(generation.next().await.is_none(), "nothing after the end");
    let run = &generation.runs[0];
    assert_eq!((run.cached_tokens, run.generated, run.text(2).as_str()), (16, 10, "<0><1>"));
    assert!(run.latency.is_some());
}

#[tokio::test]
async fn what_is_already_there_goes_out_together_in_run_order() {
    let (mut generation, txs) = generation(1, &[3, 2, 2]);
    tokens(&txs[2], 2, true);
    tokens(&txs[0], 1, true);
    let releases = generation.next().await.expect("progress").expect("not broken");
    assert_eq!(releases, [release(0, 0, 1), release(2, 0, 2)]);
    assert!(!generation.complete());
    tokens(&txs[1], 2, true);
    tokens(&txs[0], 2, false);
    let releases = generation.next().await.expect("progress").expect("not broken");
    assert_eq!(releases, [release(0, 1, 3), release(1, 0, 2)]);
    assert!(generation.complete(), "complete without waiting for Done");
}

#[tokio::test]
async fn a_stopped_engine_sends_what_came_then_breaks() {
    let (mut generation, mut txs) = generation(8, &[10]);
    tokens(&txs[0], 3, true);
    drop(txs.pop());
    let releases = generation.next().await.expect("progress").expect("pending tokens first");
    assert_eq!(releases, [release(0, 0, 3)]);
    assert!(matches!(generation.next().await, Some(Err(Interrupted))));
    assert!(matches!(generation.next().await, Some(Err(Interrupted))), "and stays broken");
}

#[tokio::test]
async fn a_prefill_room_is_ready_at_the_first_token() {
    let rooms = Arc::new(Rooms::default());
    let mut guard = RoomGuard::new(Arc::clone(&rooms), 5);
    guard.describe(3, "ab".into());
    let mut generation = Generation::new(Instant::now(), 1);
    let (tx, rx) = mpsc::unbounded_channel();
    generation.add(run(2, Some(guard)), rx);
    assert_eq!(rooms.wait(5, Duration::ZERO).await, RoomState::Pending);
    tokens(&tx, 1, true);
    generation.next().await.expect("progress").expect("not broken");
    let RoomState::Ready(info) = rooms.wait(5, Duration::ZERO).await else {
        panic!("the room is ready")
    };
    assert_eq!((info.prompt_tokens, info.cached_tokens), (3, 16));
}
