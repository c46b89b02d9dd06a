//! The router's cost per prompt token (`cargo xtask bench --only long`): chat prompts of 1k, 8k,
//! 32k and 128k GPT-2 tokens, each fresh and as the next turn of its conversation, sent one at
//! a time through our router (round_robin, cache_aware, predicted_ttft, GPT-2's tokenizer) and
//! through sglang-router and vllm-router (round_robin, cache_aware) in front of the same two
//! router-sim engines, which answer at once; each router's CPU per request from `/proc` (every
//! thread's run time), the median of three runs; and the page section `long`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use router_test_support::prompts::message;
use serde_json::json;

use super::peers::{self, Peer, SGLANG_ROUTER, VLLM_ROUTER};
use super::procs::{Bins, Proc, engine, router_with_config};

/// Prompt sizes, in thousands of tokens (a message is about a thousand).
const SIZES: [usize; 4] = [1, 8, 32, 128];

/// Runs of each arm; the page shows their median.
const RUNS: usize = 3;

/// One router in front of the fleet.
#[derive(Clone, Copy, Debug)]
enum Arm {
    Ours(&'static str),
    Peer(Peer, &'static str),
}

impl Arm {
    fn name(&self) -> String {
        match self {
            Arm::Ours(policy) => format!("ours, {policy}"),
            Arm::Peer(peer, policy) => format!("{}, {policy}", peer.name),
        }
    }
}

/// One arm's CPU per request (ms) for each size, fresh and as the next turn: the median of
/// the runs.
pub(crate) struct Measured {
    name: String,
    fresh: Vec<f64>,
    next: Vec<f64>,
}

/// A chat request of `messages` messages of conversation `seed`, answered with one token.
fn body(seed: u64, messages: usize) -> Bytes {
    let messages: Vec<_> = (0..messages)
        .map(|turn| {
            let role = if turn % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": message(seed, turn)})
        })
        .collect();
    Bytes::from(json!({"model": "m", "messages": messages, "max_tokens": 1}).to_string())
}

/// Requests of each size per run: enough CPU to measure at 1k tokens, few at 128k.
fn requests(size: usize, quick: bool) -> usize {
    let full: usize = match size {
        1 => 24,
        8 => 8,
        32 => 4,
        _ => 2,
    };
    if quick { full.div_ceil(2) } else { full }
}

pub(crate) fn measure(root: &Path, bins: &Bins, quick: bool) -> Result<Vec<Measured>> {
    let runtime = tokio::runtime::Runtime::new()?;
    let tokenizer = root.join("crates/router-sim/assets/gpt2/tokenizer.json");
    let arms = [
        Arm::Ours("round_robin"),
        Arm::Ours("cache_aware"),
        Arm::Ours("predicted_ttft"),
        Arm::Peer(SGLANG_ROUTER, "round_robin"),
        Arm::Peer(SGLANG_ROUTER, "cache_aware"),
        Arm::Peer(VLLM_ROUTER, "round_robin"),
        Arm::Peer(VLLM_ROUTER, "cache_aware"),
    ];
    let mut measured = Vec::new();
    for arm in arms {
        // Per run: CPU per request at each size, fresh ([0]) and next turn ([1]).
        let mut runs: Vec<[Vec<f64>; 2]> = Vec::new();
        for run in 0..if quick { 1 } else { RUNS } {
            let seed_base = 1000 * (run as u64 + 1);
            let per_request = runtime
                .block_on(measure_arm(bins, &tokenizer, arm, seed_base, quick))
                .with_context(|| format!("{} (run {})", arm.name(), run + 1))?;
            runs.push([per_request.0, per_request.1]);
        }
        let median_of = |kind: usize| {
            (0..SIZES.len())
                .map(|i| {
                    let mut values: Vec<f64> = runs.iter().map(|run| run[kind][i]).collect();
                    values.sort_by(f64::total_cmp);
                    values[values.len() / 2]
                })
                .collect()
        };
        let row = Measured { name: arm.name(), fresh: median_of(0), next: median_of(1) };
        eprintln!(
            "xtask bench: long: {}: fresh {:?} ms, next turn {:?} ms",
            row.name, row.fresh, row.next
        );
        measured.push(row);
    }
    Ok(measured)
}

/// One run of `arm` on a fresh fleet: CPU per request (ms) at each size, fresh and next turn.
async fn measure_arm(
    bins: &Bins,
    tokenizer: &Path,
    arm: Arm,
    seed_base: u64,
    quick: bool,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let tokenizer = tokenizer.display().to_string();
    let mut engines: Vec<(Proc, String, String)> = Vec::new();
    for _ in 0..2 {
        let events = format!("tcp://127.0.0.1:{}", peers::free_port()?);
        let (proc, url) = engine(
            bins,
            &[
                "--tokenizer",
                &tokenizer,
                "--kv-capacity-tokens",
                "8000000",
                "--prefill-tokens-per-sec",
                "1000000000",
                "--decode-tokens-per-sec",
                "1000000",
                "--kv-events",
                &events,
            ],
        )?;
        engines.push((proc, url, events));
    }
    let urls: Vec<String> = engines.iter().map(|(_, url, _)| url.clone()).collect();
    let (router, url) = match arm {
        Arm::Ours(policy) => {
            let workers: String = engines
                .iter()
                .enumerate()
                .map(|(i, (_, url, events))| {
                    format!("      - {{id: e{i}, url: \"{url}\", kv_events: {{endpoint: \"{events}\"}}}}\n")
                })
                .collect();
            let yaml = format!(
                "server: {{port: 0}}\nmodels:\n  - id: m\n    tokenizer: \"{tokenizer}\"\n    \
                 workers:\n{workers}    buckets:\n      - id: all\n        \
                 groups: {{plain: {{policy: {{type: {policy}}}}}}}\n"
            );
            router_with_config(bins, &yaml)?
        }
        Arm::Peer(peer, policy) => peer.start(policy, &urls).await?,
    };
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let uri: http::Uri = format!("{url}/v1/chat/completions").parse()?;
    let send = |body: Bytes| {
        let (client, uri) = (client.clone(), uri.clone());
        async move {
            let request = http::Request::post(uri)
                .header("content-type", "application/json")
                .body(Full::new(body))
                .expect("request");
            let response = client.request(request).await?;
            let status = response.status();
            let answer = response.into_body().collect().await?.to_bytes();
            if !status.is_success() {
                bail!("{status}: {}", String::from_utf8_lossy(&answer[..answer.len().min(300)]));
            }
            Ok::<_, anyhow::Error>(())
        }
    };
    // A warm-up request, so that connections and caches of the router are up.
    send(body(seed_base + 999, 1)).await?;
    let (mut fresh, mut next) = (Vec::new(), Vec::new());
    for (index, size) in SIZES.into_iter().enumerate() {
        let count = requests(size, quick);
        let seeds: Vec<u64> =
            (0..count as u64).map(|i| seed_base + 100 * index as u64 + i).collect();
        let bodies: Vec<Bytes> = seeds.iter().map(|&seed| body(seed, size)).collect();
        let cpu = router.cpu_time()?;
        for body in bodies {
            send(body).await?;
        }
        fresh.push(per_request(router.cpu_time()? - cpu, count));
        // The next turn of each: the same messages and one more.
        let bodies: Vec<Bytes> = seeds.iter().map(|&seed| body(seed, size + 1)).collect();
        let cpu = router.cpu_time()?;
        for body in bodies {
            send(body).await?;
        }
        next.push(per_request(router.cpu_time()? - cpu, count));
    }
    drop(router);
    drop(engines);
    Ok((fresh, next))
}

fn per_request(cpu: Duration, count: usize) -> f64 {
    cpu.as_secs_f64() * 1000.0 / count.max(1) as f64
}

/// The page section.
pub(crate) fn render(measured: &[Measured]) -> String {
    let mut out = String::from("## Long prompts: router CPU per request against prompt length\n\n");
    out.push_str(
        "Chat requests of 1k to 128k GPT-2 tokens (messages of about 1k tokens of words), sent one \
         at a time through each router in front of the same two router-sim engines that answer \
         at once (one output token); each request fresh, then as the next turn of its \
         conversation (the same messages and one more). CPU per request is the router \
         process's run time over all its threads (`/proc/<pid>/task/*/schedstat`), the median of \
         three runs on a fresh fleet each. Our router tokenizes with GPT-2's tokenizer and \
         follows the engines' KV events; the peers match text.\n\n",
    );
    out.push_str("| router | ");
    for size in SIZES {
        let _ = write!(out, "{size}k fresh | {size}k next | ");
    }
    out.push_str("per extra 1k, fresh |\n|---|");
    for _ in SIZES {
        out.push_str("---:|---:|");
    }
    out.push_str("---:|\n");
    for row in measured {
        let _ = write!(out, "| {} | ", row.name);
        for (fresh, next) in row.fresh.iter().zip(&row.next) {
            let _ = write!(out, "{} | {} | ", ms(*fresh), ms(*next));
        }
        let slope = (row.fresh[SIZES.len() - 1] - row.fresh[0])
            / (SIZES[SIZES.len() - 1] - SIZES[0]) as f64;
        let _ = writeln!(out, "{:.0} us |", slope * 1000.0);
    }
    if let (Some(vllm), Some(ours)) = (
        measured
            .iter()
            .find(|m| m.name.starts_with("vllm-router") && m.name.ends_with("cache_aware")),
        measured.iter().find(|m| m.name == "ours, cache_aware"),
    ) {
        let last = SIZES.len() - 1;
        let _ = write!(
            out,
            "\nAt 128k tokens our cache_aware costs {:.1}x vllm-router's CPU on a fresh prompt and \
             {:.1}x on the next turn.\n",
            ours.fresh[last] / vllm.fresh[last],
            ours.next[last] / vllm.next[last],
        );
    }
    out
}

fn ms(value: f64) -> String {
    if value < 10.0 { format!("{value:.2} ms") } else { format!("{value:.1} ms") }
}
