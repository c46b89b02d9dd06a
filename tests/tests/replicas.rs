//! Router replicas that share nothing agree on a session's engine (`session_aware` with
//! `new_binding: rendezvous`): three router processes over one fleet, every turn of every
//! session sent to the next replica round robin, each replica listing the engines in its own
//! order; every turn of a session lands on one engine whichever replica serves it, also after a
//! replica is restarted with no bindings. With the default `power_of_two` placement the same
//! traffic scatters. Assertions are on `x-router-engine`.

use std::collections::{BTreeMap, BTreeSet};

use router_e2e::{Engine, Http, Router, chat_body};

/// A router over `engines` (ids `e1`, `e2`, ..., listed in `order`) whose group runs `policy`.
fn config(engines: &[Engine], order: &[usize], policy: &str) -> String {
    let workers: String = order
        .iter()
        .map(|&i| format!("      - {{id: e{}, url: \"{}\"}}\n", i + 1, engines[i].url))
        .collect();
    format!(
        "server: {{port: 0}}\nmodels:\n  - id: m\n    workers:\n{workers}    buckets:\n      \
         - {{id: all, groups: {{plain: {{policy: {policy}}}}}}}\n"
    )
}

/// Sends `turns` turns of each of `sessions` sessions, the n-th request overall to replica
/// `n % replicas`; returns the engines that served each session, in turn order.
async fn spray(
    http: &Http,
    replicas: &[Router],
    sessions: usize,
    turns: usize,
    sent: &mut usize,
) -> BTreeMap<String, Vec<String>> {
    let mut served: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut replicas_of: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    for turn in 0..turns {
        for session in 0..sessions {
            let key = format!("session-{session}");
            let index = *sent % replicas.len();
            let router = &replicas[index];
            *sent += 1;
            let body = chat_body("m", &format!("{key} turn {turn}"), 2);
            let reply = http.chat(&router.url, &body, &[("x-session-id", &key)]).await;
            assert_eq!(reply.status, 200, "{key} turn {turn}: {}", reply.body);
            let engine = reply.header("x-router-engine").expect("x-router-engine").to_owned();
            served.entry(key).or_default().push(engine);
            replicas_of.entry(format!("session-{session}")).or_default().insert(index);
        }
    }
    for (session, seen) in &replicas_of {
        assert_eq!(seen.len(), replicas.len().min(turns), "{session} met {seen:?}");
    }
    served
}

fn replicas(engines: &[Engine], policy: &str) -> Vec<Router> {
    let n = engines.len();
    let forward: Vec<usize> = (0..n).collect();
    let backward: Vec<usize> = (0..n).rev().collect();
    let rotated: Vec<usize> = (0..n).map(|i| (i + 2) % n).collect();
    [forward, backward, rotated]
        .iter()
        .map(|order| Router::with_config(&config(engines, order, policy)))
        .collect()
}

#[tokio::test]
async fn every_turn_of_a_session_lands_on_one_engine_whichever_replica_serves_it() {
    let engines: Vec<Engine> = (0..4).map(|_| Engine::start("m", &[])).collect();
    let http = Http::default();
    // 25 sessions: not a multiple of the 3 replicas, so each turn of a session goes to the
    // next replica.
    let (sessions, turns) = (25, 4);

    let mut routers = replicas(&engines, "{type: session_aware, new_binding: rendezvous}");
    let mut sent = 0;
    let served = spray(&http, &routers, sessions, turns, &mut sent).await;
    let mut homes = BTreeMap::new();
    for (session, engines) in &served {
        let first = &engines[0];
        assert!(engines.iter().all(|e| e == first), "{session} scattered: {engines:?}");
        homes.insert(session.clone(), first.clone());
    }
    let used: BTreeSet<&String> = homes.values().collect();
    assert!(used.len() >= 3, "25 sessions spread over the engines, got {used:?}");

    // A replica restarted forgets its bindings, and binds every session where it was.
    let restarted = Router::with_config(&config(
        &engines,
        &[3, 1, 0, 2],
        "{type: session_aware, new_binding: rendezvous}",
    ));
    routers[0] = restarted;
    let again = spray(&http, &routers, sessions, turns, &mut sent).await;
    for (session, engines) in &again {
        let home = &homes[session];
        assert!(engines.iter().all(|e| e == home), "{session} left {home}: {engines:?}");
    }

    // The default placement (power-of-two on each replica) scatters the same traffic.
    drop(routers);
    let routers = replicas(&engines, "{type: session_aware}");
    let mut sent = 0;
    let served = spray(&http, &routers, sessions, turns, &mut sent).await;
    let scattered = served.values().filter(|e| e.iter().any(|x| x != &e[0])).count();
    assert!(scattered > 0, "power-of-two replicas kept every session together: {served:?}");
}
