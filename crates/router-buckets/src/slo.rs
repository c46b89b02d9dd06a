//! SLO-aware bucket preference (docs/design/SLO.md): what a bucket declares it delivers, what a
//! model prefers, what a request asks for, and the tiers that reorder compatible buckets.
//!
//! Pure values and arithmetic: the estimates themselves are read by [`crate::Bucket`] and the
//! order applied by [`crate::BucketResolver`].

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;

/// How a model's resolver treats one kind of target (`ttft_slo`, `tps_slo`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SloPreference {
    /// The target is ignored, and so is its header (the default).
    #[default]
    Disabled,
    /// A bucket that does not meet the target is tried after those that do.
    SloFirst,
    /// A bucket that meets the target is tried after those that do not: a best-effort
    /// request leaves the fast buckets to those that need them.
    BestEffort,
}

impl SloPreference {
    /// Every preference, in documentation order.
    pub const ALL: [SloPreference; 3] =
        [SloPreference::Disabled, SloPreference::SloFirst, SloPreference::BestEffort];

    /// The configuration name: `disabled`, `slo_first` or `best_effort`.
    pub fn as_str(self) -> &'static str {
        match self {
            SloPreference::Disabled => "disabled",
            SloPreference::SloFirst => "slo_first",
            SloPreference::BestEffort => "best_effort",
        }
    }

    /// Whether a target of this kind is read at all.
    pub fn is_enabled(self) -> bool {
        self != SloPreference::Disabled
    }

    /// The tier this preference adds to a bucket that does (`true`) or does not meet the
    /// target: 1 for a `slo_first` miss and a `best_effort` hit, else 0.
    fn tier(self, met: bool) -> u8 {
        match self {
            SloPreference::Disabled => 0,
            SloPreference::SloFirst => u8::from(!met),
            SloPreference::BestEffort => u8::from(met),
        }
    }
}

impl fmt::Display for SloPreference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no [`SloPreference`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown SLO preference {name:?} (expected disabled, slo_first or best_effort)")]
pub struct UnknownSloPreference {
    /// The name given.
    pub name: String,
}

impl FromStr for SloPreference {
    type Err = UnknownSloPreference;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == name)
            .ok_or_else(|| UnknownSloPreference { name: name.to_owned() })
    }
}

/// A model's two independent preferences.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SloPreferences {
    /// For time-to-first-token targets (`ttft_slo`).
    pub ttft: SloPreference,
    /// For decode-throughput targets (`tps_slo`).
    pub tps: SloPreference,
}

impl SloPreferences {
    /// The targets of `targets` whose preference is enabled; the others are dropped, as if the
    /// request had not stated them.
    pub fn active(&self, targets: SloTargets) -> SloTargets {
        SloTargets {
            ttft_ms: targets.ttft_ms.filter(|_| self.ttft.is_enabled()),
            tokens_per_second: targets.tokens_per_second.filter(|_| self.tps.is_enabled()),
        }
    }

    /// The tiers of a bucket with `estimates` for the `active` targets, and whether it met
    /// each (docs/design/SLO.md, "Ordering").
    pub fn judge(&self, active: SloTargets, estimates: SloEstimates) -> (u8, SloVerdict) {
        let ttft = active.ttft_ms.map(|target| {
            let met = estimates.ttft_ms.is_some_and(|e| e > 0.0 && e <= target.get() as f64);
            SloCheck { target: target.get() as f64, estimate: estimates.ttft_ms, met }
        });
        let tps = active.tokens_per_second.map(|target| {
            let met = estimates
                .tokens_per_second
                .is_some_and(|e| e.is_finite() && e > 0.0 && e >= target.get());
            SloCheck { target: target.get(), estimate: estimates.tokens_per_second, met }
        });
        let tiers =
            ttft.map_or(0, |c| self.ttft.tier(c.met)) + tps.map_or(0, |c| self.tps.tier(c.met));
        (tiers, SloVerdict { ttft, tps })
    }
}

/// A decode speed: a finite number above 0, in output tokens per second.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct TokensPerSecond(f64);

impl TokensPerSecond {
    /// `value` if it is finite and above 0.
    pub fn new(value: f64) -> Option<Self> {
        (value.is_finite() && value > 0.0).then_some(Self(value))
    }

    /// The value.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl fmt::Display for TokensPerSecond {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What one request asks for: the targets of its headers (`x-sgl-ttft-slo-ms`,
/// `x-sgl-tps-slo`), each absent when not stated.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SloTargets {
    /// The longest acceptable time to first token, in milliseconds.
    pub ttft_ms: Option<NonZeroU64>,
    /// The lowest acceptable decode speed, in output tokens per second.
    pub tokens_per_second: Option<TokensPerSecond>,
}

impl SloTargets {
    /// No target at all.
    pub const NONE: SloTargets = SloTargets { ttft_ms: None, tokens_per_second: None };

    /// Whether neither target is stated.
    pub fn is_empty(&self) -> bool {
        self.ttft_ms.is_none() && self.tokens_per_second.is_none()
    }

    /// Parses a time-to-first-token target: a positive integer of milliseconds.
    pub fn parse_ttft_ms(text: &str) -> Result<NonZeroU64, SloTargetError> {
        let invalid = || SloTargetError::InvalidTtft { value: text.to_owned() };
        let value: u64 = text.trim().parse().map_err(|_| invalid())?;
        NonZeroU64::new(value).ok_or(SloTargetError::ZeroTtft)
    }

    /// Parses a decode-throughput target: a finite number above 0, in tokens per second.
    pub fn parse_tokens_per_second(text: &str) -> Result<TokensPerSecond, SloTargetError> {
        let value: f64 = text
            .trim()
            .parse()
            .map_err(|_| SloTargetError::InvalidTps { value: text.to_owned() })?;
        TokensPerSecond::new(value).ok_or(SloTargetError::OutOfRangeTps { value })
    }
}

/// A request's target that cannot be used (a 400 before anything is dispatched).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SloTargetError {
    /// The time-to-first-token target is not an integer of milliseconds.
    #[error("time-to-first-token target {value:?} is not a positive integer of milliseconds")]
    InvalidTtft {
        /// The text given.
        value: String,
    },
    /// A time-to-first-token target of 0, which no bucket can meet.
    #[error("time-to-first-token target must be at least 1 ms, got 0")]
    ZeroTtft,
    /// The throughput target is not a number.
    #[error("throughput target {value:?} is not a number of tokens per second")]
    InvalidTps {
        /// The text given.
        value: String,
    },
    /// The throughput target is zero, negative, NaN or infinite.
    #[error("throughput target must be a finite number above 0, got {value}")]
    OutOfRangeTps {
        /// The number given.
        value: f64,
    },
}

/// What a bucket declares for one kind of estimate: a fixed value, or the live estimate of
/// its engines (`live`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SloEstimate<T> {
    /// A fixed value from the configuration.
    Declared(T),
    /// The current estimate from the engines' load (see [`router_policies::LiveEstimator`]).
    Live,
}

impl<T: fmt::Display> fmt::Display for SloEstimate<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SloEstimate::Declared(value) => value.fmt(f),
            SloEstimate::Live => f.write_str("live"),
        }
    }
}

/// What a bucket says it delivers (`ttft_ms`, `tokens_per_second`); either may be absent.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BucketSlo {
    /// Time to first token, in milliseconds.
    pub ttft_ms: Option<SloEstimate<NonZeroU64>>,
    /// Decode speed of one request, in output tokens per second.
    pub tokens_per_second: Option<SloEstimate<TokensPerSecond>>,
}

impl BucketSlo {
    /// Nothing declared.
    pub const NONE: BucketSlo = BucketSlo { ttft_ms: None, tokens_per_second: None };

    /// Whether some estimate is `live`.
    pub fn is_live(&self) -> bool {
        matches!(self.ttft_ms, Some(SloEstimate::Live))
            || matches!(self.tokens_per_second, Some(SloEstimate::Live))
    }
}

/// A bucket's estimates at one moment, as compared with targets; `None` when it has none (or
/// a live one could not be made).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SloEstimates {
    /// Time to first token, in milliseconds.
    pub ttft_ms: Option<f64>,
    /// Decode speed of one request, in output tokens per second.
    pub tokens_per_second: Option<f64>,
}

/// One target against one bucket's estimate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SloCheck {
    /// The request's target.
    pub target: f64,
    /// The bucket's estimate when the order was made; `None` when it had none.
    pub estimate: Option<f64>,
    /// Whether the estimate met the target (a missing estimate never does).
    pub met: bool,
}

/// How a bucket stood against the request's targets: a check for each target that was stated
/// and whose preference is enabled, `None` for the others.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SloVerdict {
    /// The time-to-first-token target.
    pub ttft: Option<SloCheck>,
    /// The decode-throughput target.
    pub tps: Option<SloCheck>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(ttft: Option<u64>, tps: Option<f64>) -> SloTargets {
        SloTargets {
            ttft_ms: ttft.and_then(NonZeroU64::new),
            tokens_per_second: tps.and_then(TokensPerSecond::new),
        }
    }

    #[test]
    fn meeting_a_target_needs_a_valid_estimate_on_the_right_side() {
        let both = SloPreferences { ttft: SloPreference::SloFirst, tps: SloPreference::SloFirst };
        let active = targets(Some(50), Some(100.0));
        #[rustfmt::skip]
        let cases: [(Option<f64>, Option<f64>, bool, bool); 9] = [
            (Some(50.0), Some(100.0), true, true),     // at the target meets it
            (Some(49.0), Some(101.0), true, true),
            (Some(51.0), Some(99.9), false, false),
            (None, None, false, false),                // no estimate meets nothing
            (Some(0.0), Some(0.0), false, false),      // nor does a zero one
            (Some(-1.0), Some(-1.0), false, false),
            (Some(f64::NAN), Some(f64::NAN), false, false),
            (Some(1.0), Some(f64::INFINITY), true, false),
            (Some(f64::INFINITY), Some(1e9), false, true),
        ];
        for (ttft, tps, ttft_met, tps_met) in cases {
            let (tiers, verdict) =
                both.judge(active, SloEstimates { ttft_ms: ttft, tokens_per_second: tps });
            let checks = (verdict.ttft.map(|c| c.met), verdict.tps.map(|c| c.met));
            assert_eq!(checks, (Some(ttft_met), Some(tps_met)), "{ttft:?} {tps:?}");
            assert_eq!(tiers, u8::from(!ttft_met) + u8::from(!tps_met), "{ttft:?} {tps:?}");
        }
    }

    #[test]
    fn an_absent_or_disabled_target_adds_no_tier_and_no_check() {
        let estimates = SloEstimates { ttft_ms: Some(500.0), tokens_per_second: Some(1.0) };
        let prefs = SloPreferences { ttft: SloPreference::SloFirst, tps: SloPreference::Disabled };
        let active = prefs.active(targets(None, Some(100.0)));
        assert!(active.is_empty(), "a disabled preference drops its target");
        assert_eq!(prefs.judge(active, estimates), (0, SloVerdict::default()));
        let best_effort =
            SloPreferences { ttft: SloPreference::BestEffort, tps: SloPreference::BestEffort };
        let (tiers, verdict) = best_effort.judge(targets(Some(1000), None), estimates);
        assert_eq!(tiers, 1, "a best-effort request is pushed off a bucket that meets it");
        assert!(verdict.ttft.is_some_and(|c| c.met && c.target == 1000.0));
        assert_eq!(verdict.tps, None);
    }

    #[test]
    fn targets_parse_as_slo_md_says() {
        assert_eq!(SloTargets::parse_ttft_ms("250").map(NonZeroU64::get), Ok(250));
        assert_eq!(SloTargets::parse_ttft_ms("0"), Err(SloTargetError::ZeroTtft));
        for bad in ["", "fast", "1.5", "-3", "1e3", "99999999999999999999999"] {
            assert_eq!(
                SloTargets::parse_ttft_ms(bad),
                Err(SloTargetError::InvalidTtft { value: bad.to_owned() }),
                "{bad:?}"
            );
        }
        for (text, value) in [("100", 100.0), ("12.5", 12.5), ("1e3", 1000.0)] {
            assert_eq!(SloTargets::parse_tokens_per_second(text).map(|t| t.get()), Ok(value));
        }
        for bad in ["0", "-1", "-0.5", "inf", "-inf", "infinity"] {
            assert!(
                matches!(
                    SloTargets::parse_tokens_per_second(bad),
                    Err(SloTargetError::OutOfRangeTps { .. })
                ),
                "{bad:?}"
            );
        }
        let nan = SloTargets::parse_tokens_per_second("NaN");
        assert!(matches!(nan, Err(SloTargetError::OutOfRangeTps { value }) if value.is_nan()));
        for bad in ["", "many", "1,5"] {
            assert_eq!(
                SloTargets::parse_tokens_per_second(bad),
                Err(SloTargetError::InvalidTps { value: bad.to_owned() }),
                "{bad:?}"
            );
        }
        assert_eq!(
            SloTargetError::ZeroTtft.to_string(),
            "time-to-first-token target must be at least 1 ms, got 0"
        );
    }

    #[test]
    fn preferences_have_their_configuration_names() {
        for preference in SloPreference::ALL {
            assert_eq!(preference.as_str().parse::<SloPreference>(), Ok(preference));
        }
        assert_eq!(
            "fastest".parse::<SloPreference>(),
            Err(UnknownSloPreference { name: "fastest".into() })
        );
        assert_eq!(SloEstimate::Declared(50).to_string(), "50");
        assert_eq!(SloEstimate::<u64>::Live.to_string(), "live");
    }
}
