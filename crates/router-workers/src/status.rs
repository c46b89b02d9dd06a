//! The engine's own statement of its serving state, as its load reports last gave it, and
//! whether that state takes new requests.

use std::fmt;

use serde::Serialize;

/// The engine's own view of its serving state (the `status` of its load reports).
///
/// router-state-load decodes it from the wire and records the latest one an engine stated on
/// its [`crate::Worker`]; a worker reporting [`EngineStatus::Starting`] or
/// [`EngineStatus::Draining`] is not a candidate for new requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineStatus {
    /// The engine did not say (always the case for `/v1/loads`, and before any report).
    #[default]
    Unknown,
    /// Loading or warming up; not serving requests yet.
    Starting,
    /// Serving requests.
    Serving,
    /// Finishing its running requests before shutting down; takes no new ones.
    Draining,
}

impl EngineStatus {
    /// Every status, in a fixed order (for metrics that show one series per status).
    pub const ALL: [EngineStatus; 4] = [
        EngineStatus::Unknown,
        EngineStatus::Starting,
        EngineStatus::Serving,
        EngineStatus::Draining,
    ];

    /// `unknown`, `starting`, `serving` or `draining`, as shown in `/admin/state` and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineStatus::Unknown => "unknown",
            EngineStatus::Starting => "starting",
            EngineStatus::Serving => "serving",
            EngineStatus::Draining => "draining",
        }
    }

    /// Whether an engine in this state may be given new requests: serving, or not saying (an
    /// engine that reports no status is judged by its health alone).
    pub fn accepts_new_requests(self) -> bool {
        matches!(self, EngineStatus::Unknown | EngineStatus::Serving)
    }

    pub(crate) fn to_bits(self) -> u8 {
        match self {
            EngineStatus::Unknown => 0,
            EngineStatus::Starting => 1,
            EngineStatus::Serving => 2,
            EngineStatus::Draining => 3,
        }
    }

    pub(crate) fn from_bits(bits: u8) -> Self {
        match bits {
            1 => EngineStatus::Starting,
            2 => EngineStatus::Serving,
            3 => EngineStatus::Draining,
            _ => EngineStatus::Unknown,
        }
    }
}

impl fmt::Display for EngineStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_serving_or_silent_engines_take_new_requests() {
        let accepting: Vec<&str> = EngineStatus::ALL
            .into_iter()
            .filter(|s| s.accepts_new_requests())
            .map(EngineStatus::as_str)
            .collect();
        assert_eq!(accepting, ["unknown", "serving"]);
    }

    #[test]
    fn bits_round_trip() {
        for status in EngineStatus::ALL {
            assert_eq!(EngineStatus::from_bits(status.to_bits()), status);
        }
    }
}
