//! Store configuration, its defaults and its validation.

use std::time::Duration;

/// Default idle timeout: a binding unused for this long expires
/// (docs/design/POLICY_REFERENCE.md, `session_idle_secs` and the sticky idle timeout).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// Default interval between sweeps of expired bindings (the session and sticky eviction
/// interval of docs/design/POLICY_REFERENCE.md).
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Default maximum number of bindings one store holds.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;

/// How long bindings live and how many a store holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AffinityConfig {
    /// A binding not used (looked up, bound or replaced) for this long is expired: lookups
    /// stop returning it at once, and the next sweep frees it.
    pub idle_timeout: Duration,
    /// How often [`crate::run_sweeper`] calls [`crate::AffinityStore::sweep`].
    pub sweep_interval: Duration,
    /// The most bindings the store holds. Inserting one more first evicts the least recently
    /// used binding.
    pub max_entries: usize,
}

impl Default for AffinityConfig {
    fn default() -> Self {
        Self {
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

impl AffinityConfig {
    /// Checks that every setting is usable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.idle_timeout.is_zero() {
            return Err(ConfigError::ZeroIdleTimeout);
        }
        if self.sweep_interval.is_zero() {
            return Err(ConfigError::ZeroSweepInterval);
        }
        if self.max_entries == 0 {
            return Err(ConfigError::ZeroMaxEntries);
        }
        Ok(())
    }
}

/// An [`AffinityConfig`] that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `idle_timeout` is zero, which would expire every binding on creation.
    #[error("affinity idle_timeout must be greater than zero")]
    ZeroIdleTimeout,
    /// `sweep_interval` is zero, which would make the sweeper spin.
    #[error("affinity sweep_interval must be greater than zero")]
    ZeroSweepInterval,
    /// `max_entries` is zero, which would leave no room for any binding.
    #[error("affinity max_entries must be at least 1")]
    ZeroMaxEntries,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_policy_reference() {
        let config = AffinityConfig::default();
        assert_eq!(config.idle_timeout, Duration::from_secs(600));
        assert_eq!(config.sweep_interval, Duration::from_secs(60));
        assert_eq!(config.validate(), Ok(()));
    }

    #[test]
    fn zero_settings_are_rejected() {
        let base = AffinityConfig::default();
        let cases = [
            (AffinityConfig { idle_timeout: Duration::ZERO, ..base }, ConfigError::ZeroIdleTimeout),
            (
                AffinityConfig { sweep_interval: Duration::ZERO, ..base },
                ConfigError::ZeroSweepInterval,
            ),
            (AffinityConfig { max_entries: 0, ..base }, ConfigError::ZeroMaxEntries),
        ];
        for (config, expected) in cases {
            assert_eq!(config.validate(), Err(expected));
        }
    }
}
