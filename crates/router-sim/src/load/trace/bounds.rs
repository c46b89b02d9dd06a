//! The time scale of a replay (given, or chosen for `--offered-load`) and the bounds its
//! measurements are judged against beside the oracles: the TTFT floor and the offered load.
//!
//! Work is counted in uncached prompt tokens, the prefill an engine cannot skip:
//! - the **offered load** of a replay is the uncached work the fleet oracle leaves (prompt
//!   tokens minus its hits), per second of replay, over the fleet's prefill speed (`--engines`
//!   times `--prefill-tokens-per-sec`). The replay lasts the trace's span (last arrival minus
//!   first) divided by the time scale, so `--offered-load RHO` picks `time_scale = span /
//!   (work / (RHO x engines x speed))`;
//! - the **TTFT floor** of a request is its prompt tokens the unlimited cache misses, prefilled
//!   at `--prefill-tokens-per-sec` with no queueing: no engine can answer sooner.

use super::oracle::{OracleReport, Step};
use super::{LoadError, Pace, TraceRequest, TraceSpec};
use crate::load::distribution::Distribution;

/// How a replay's arrivals were timed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schedule {
    /// Every arrival is `timestamp / time_scale` (JSON `time_scale`).
    pub time_scale: f64,
    /// With `--offered-load`: what the scale was chosen from.
    pub scaled: Option<ScaledLoad>,
}

/// The offered load a time scale was chosen for, and the trace it was computed over.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScaledLoad {
    /// `--offered-load`.
    pub offered_load: f64,
    /// Uncached prompt tokens the fleet oracle leaves, over every request replayed.
    pub uncached_tokens: u64,
    /// Last arrival minus first, in seconds of trace, over the same requests.
    pub span_secs: f64,
}

/// What a replay is judged against, over the requests it sent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplayReport {
    /// The oracles' hit rates.
    pub oracle: OracleReport,
    /// The time scale it ran at.
    pub schedule: Schedule,
    /// Each request's unlimited-cache misses prefilled at `--prefill-tokens-per-sec`, in ms;
    /// `None` without that speed or when nothing was sent.
    pub ttft_floor_ms: Option<Distribution>,
    /// The offered load as replayed; `None` without `--engines`, `--prefill-tokens-per-sec`
    /// or the fleet oracle, or when the requests sent span no time.
    pub offered_load: Option<f64>,
}

/// Last arrival minus first, in seconds of trace (0 for fewer than two requests).
fn span_secs(requests: &[TraceRequest]) -> f64 {
    let times = requests.iter().map(|r| r.timestamp_ms);
    let (first, last) =
        times.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), t| (lo.min(t), hi.max(t)));
    if last > first { (last - first) / 1000.0 } else { 0.0 }
}

/// Prompt tokens the fleet oracle misses; `None` without one.
fn fleet_uncached_tokens(steps: &[Step]) -> Option<u64> {
    steps.iter().map(|s| Some(s.prompt_tokens - s.fleet_hit_tokens?)).sum()
}

/// The time scale of a replay of `requests`, whose oracle steps are `steps`.
pub(super) fn schedule(
    spec: &TraceSpec,
    requests: &[TraceRequest],
    steps: &[Step],
) -> Result<Schedule, LoadError> {
    let offered_load = match spec.pace {
        Pace::TimeScale(time_scale) => return Ok(Schedule { time_scale, scaled: None }),
        Pace::OfferedLoad(load) => load,
    };
    let bad = |reason: String| LoadError::Config { flag: "--offered-load", reason };
    let needs = |needs: &'static str| LoadError::Needs { flag: "--offered-load", needs };
    let engines = spec.engines.ok_or(needs("--engines"))?;
    let speed = spec.prefill_tokens_per_sec.ok_or(needs("--prefill-tokens-per-sec"))?;
    let uncached_tokens = fleet_uncached_tokens(steps).ok_or(needs("--fleet-capacity-tokens"))?;
    let span_secs = span_secs(requests);
    if span_secs <= 0.0 {
        return Err(bad(format!(
            "the {} requests replayed all arrive at once: a trace without a time span cannot be scaled",
            requests.len()
        )));
    }
    if uncached_tokens == 0 {
        return Err(bad("the requests replayed leave no uncached work to scale".into()));
    }
    let replay_secs = uncached_tokens as f64 / (offered_load * engines as f64 * speed);
    let time_scale = span_secs / replay_secs;
    if !(time_scale.is_finite() && time_scale > 0.0) {
        return Err(bad(format!("the time scale {time_scale} it needs is not a positive factor")));
    }
    Ok(Schedule {
        time_scale,
        scaled: Some(ScaledLoad { offered_load, uncached_tokens, span_secs }),
    })
}

/// The TTFT floor of the requests of `steps`, in ms.
pub(super) fn ttft_floor_ms(steps: &[Step], speed: Option<f64>) -> Option<Distribution> {
    let speed = speed?;
    let floors = steps.iter().map(|s| s.floor_ms(speed));
    Distribution::of(floors.collect())
}

/// The offered load of `requests` (with oracle steps `steps`) replayed at `time_scale`.
pub(super) fn offered_load(
    requests: &[TraceRequest],
    steps: &[Step],
    time_scale: f64,
    engines: Option<usize>,
    speed: Option<f64>,
) -> Option<f64> {
    let capacity = engines? as f64 * speed?;
    let uncached = fleet_uncached_tokens(steps)?;
    let replay_secs = span_secs(requests) / time_scale;
    (replay_secs > 0.0).then(|| uncached as f64 / replay_secs / capacity)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(timestamp_ms: f64) -> TraceRequest {
        TraceRequest {
            index: 0,
            timestamp_ms,
            input_length: 1,
            output_length: 1,
            hash_ids: Vec::new(),
        }
    }

    fn step(prompt_tokens: u64, hit_tokens: u64, fleet_hit_tokens: u64) -> Step {
        Step {
            prompt_tokens,
            hit_tokens,
            fleet_hit_tokens: Some(fleet_hit_tokens),
            belady_hit_tokens: Some(fleet_hit_tokens),
        }
    }

    fn offered(load: f64) -> TraceSpec {
        TraceSpec {
            pace: Pace::OfferedLoad(load),
            fleet_capacity_tokens: Some(1024),
            engines: Some(2),
            prefill_tokens_per_sec: Some(1000.0),
            ..TraceSpec::new("unused")
        }
    }

    #[test]
    fn the_offered_load_picks_the_time_scale_of_its_uncached_work() {
        // 10 s of trace; the fleet oracle leaves 600 + 300 + 100 = 1000 uncached tokens.
        let requests = [request(2000.0), request(5000.0), request(12_000.0)];
        let steps = [step(1000, 600, 400), step(500, 400, 200), step(200, 150, 100)];
        // At 0.5 of 2 engines x 1000 tokens/s, 1000 tokens take 1 s: ten times faster.
        let chosen = schedule(&offered(0.5), &requests, &steps).expect("scales");
        let scaled = ScaledLoad { offered_load: 0.5, uncached_tokens: 1000, span_secs: 10.0 };
        assert_eq!(chosen, Schedule { time_scale: 10.0, scaled: Some(scaled) });
        // Replayed at that scale, every request sent: the offered load asked for.
        assert_eq!(offered_load(&requests, &steps, 10.0, Some(2), Some(1000.0)), Some(0.5));
        // Twice the load, twice as fast.
        let faster = schedule(&offered(1.0), &requests, &steps).expect("scales");
        assert_eq!(faster.time_scale, 20.0);
        // Cut after two requests (3 s of trace, 900 uncached tokens) at scale 10: 900
        // tokens in 0.3 s, 1.5 times the fleet's 2000 tokens/s.
        let two = offered_load(&requests[..2], &steps[..2], 10.0, Some(2), Some(1000.0));
        assert!(two.is_some_and(|load| (load - 1.5).abs() < 1e-12), "{two:?}");
        // An explicit time scale is kept as given.
        let given = TraceSpec { pace: Pace::TimeScale(3.0), ..offered(0.5) };
        assert_eq!(schedule(&given, &requests, &steps).expect("given").time_scale, 3.0);
    }

    #[test]
    fn the_offered_load_needs_a_fleet_and_a_time_span() {
        let steps = [step(10, 0, 0), step(10, 0, 0)];
        let err =
            schedule(&offered(0.5), &[request(7.0), request(7.0)], &steps).expect_err("no span");
        assert!(err.to_string().contains("--offered-load"), "{err}");
        assert!(err.to_string().contains("without a time span"), "{err}");
        assert!(schedule(&offered(0.5), &[], &[]).is_err(), "no request, no span");
        let requests = [request(0.0), request(1000.0)];
        assert_eq!(offered_load(&requests[..1], &steps[..1], 1.0, Some(1), Some(1.0)), None);
        assert_eq!(offered_load(&requests, &steps, 1.0, None, Some(1.0)), None);
        assert_eq!(offered_load(&requests, &steps, 1.0, Some(1), None), None);
        let no_fleet = [Step { fleet_hit_tokens: None, ..steps[0] }; 2];
        assert_eq!(offered_load(&requests, &no_fleet, 1.0, Some(1), Some(1.0)), None);
        assert_eq!(offered_load(&requests, &steps, 2.0, Some(1), Some(10.0)), Some(4.0));
    }

    #[test]
    fn the_ttft_floor_prefills_the_unlimited_misses_without_queueing() {
        // Misses of 100, 300, 200 and 400 tokens at 1000 tokens/s.
        let steps = [step(150, 50, 0), step(300, 0, 0), step(250, 50, 0), step(400, 0, 0)];
        let floor = ttft_floor_ms(&steps, Some(1000.0)).expect("a speed");
        assert_eq!((floor.mean, floor.p50, floor.p90, floor.p99), (250.0, 200.0, 400.0, 400.0));
        assert_eq!(ttft_floor_ms(&steps, None), None, "no speed, no floor");
        assert_eq!(ttft_floor_ms(&[], Some(1000.0)), None, "nothing sent");
    }
}
