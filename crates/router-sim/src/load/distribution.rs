//! The mean and nearest-rank percentiles of a run's values, shared by the run report and the
//! trace replay's bounds.

use serde_json::{Value, json};

/// Nearest-rank percentile of sorted values.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The mean and nearest-rank percentiles of some values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Distribution {
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Distribution {
    /// The distribution of `values`; `None` when there are none.
    pub(crate) fn of(mut values: Vec<f64>) -> Option<Self> {
        values.sort_by(f64::total_cmp);
        let at = |p| percentile(&values, p);
        Some(Self {
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p50: at(50.0)?,
            p90: at(90.0)?,
            p99: at(99.0)?,
        })
    }

    pub(super) fn to_json(self) -> Value {
        json!({ "mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distributions_are_the_mean_and_nearest_rank_percentiles() {
        let values: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        let d = Distribution::of(values).expect("values");
        assert_eq!((d.mean, d.p50, d.p90, d.p99), (5.5, 5.0, 9.0, 10.0));
        assert_eq!(Distribution::of(Vec::new()), None);
    }
}
