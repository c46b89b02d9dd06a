//! The tuning of the affinity policies (`sticky`, `session_aware`): the fallback for new keys and
//! how a new key is placed.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid};
use crate::{
    BindingScope, DEFAULT_RENDEZVOUS_LOAD_FACTOR, DEFAULT_RENDEZVOUS_LOAD_FLOOR, LeastLoadPolicy,
    NewBinding, Policy, PolicyHandles, PowerOfTwoPolicy, RandomPolicy, RendezvousLoad,
    RoundRobinPolicy,
};

/// The policy a sticky policy runs for new or missing keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StickyFallback {
    /// Round-robin (the default).
    #[default]
    RoundRobin,
    /// Random.
    Random,
    /// Power-of-two.
    PowerOfTwo,
    /// Least-load.
    LoadBased,
}

impl StickyFallback {
    /// Builds the fallback with `AdmissionLimits::default()`: the owning policy checks the
    /// engine its fallback returns.
    pub fn build(self, handles: &PolicyHandles) -> Arc<dyn Policy> {
        let load = handles.load.clone();
        match self {
            StickyFallback::RoundRobin => Arc::new(RoundRobinPolicy::new()),
            StickyFallback::Random => Arc::new(RandomPolicy::new()),
            StickyFallback::PowerOfTwo => Arc::new(PowerOfTwoPolicy::new(load)),
            StickyFallback::LoadBased => Arc::new(LeastLoadPolicy::new(load)),
        }
    }
}

/// `sticky` tuning.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StickySettings {
    /// `fallback`: the policy for new or missing routing keys (and keyless requests).
    pub fallback: StickyFallback,
    /// `scope`: one binding per bucket (the default) or for the whole model.
    pub scope: BindingScope,
    /// `new_binding` and `rendezvous_load_factor`: how new keys are placed.
    pub placement: NewBindingSettings,
}

/// `session_aware` tuning.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SessionAwareSettings {
    /// `scope`: one binding per bucket (the default) or for the whole model.
    pub scope: BindingScope,
    /// `new_binding` and `rendezvous_load_factor`: how new sessions are placed.
    pub placement: NewBindingSettings,
}

/// How `session_aware` and `sticky` place a key without a usable binding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NewBindingSettings {
    /// `new_binding`: the fallback (the default: power-of-two for `session_aware`, the
    /// configured `fallback` for `sticky`) or `rendezvous`.
    pub new_binding: NewBinding,
    /// `rendezvous_load_factor` (with `rendezvous` only): a new key walks past an engine whose
    /// router-local in-flight count, the new request included, would exceed this factor times
    /// the candidates' mean; at least 1.
    pub rendezvous_load_factor: f64,
    /// `rendezvous_load_floor` (with `rendezvous` only): an engine with fewer router-local
    /// in-flight requests than this, the new one included, is never over the bound.
    pub rendezvous_load_floor: u64,
}

impl Default for NewBindingSettings {
    fn default() -> Self {
        Self {
            new_binding: NewBinding::Fallback,
            rendezvous_load_factor: DEFAULT_RENDEZVOUS_LOAD_FACTOR,
            rendezvous_load_floor: DEFAULT_RENDEZVOUS_LOAD_FLOOR,
        }
    }
}

impl NewBindingSettings {
    /// Checks the load factor.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let factor = self.rendezvous_load_factor;
        if !(factor >= 1.0 && factor.is_finite()) {
            return Err(invalid(
                "rendezvous_load_factor",
                format!("must be a finite number of at least 1, got {factor}"),
            ));
        }
        Ok(())
    }

    /// The rendezvous load bound, when new keys are placed by rendezvous hashing.
    pub(super) fn rendezvous(&self) -> Option<RendezvousLoad> {
        match self.new_binding {
            NewBinding::Rendezvous => Some(RendezvousLoad {
                factor: self.rendezvous_load_factor,
                floor: self.rendezvous_load_floor,
            }),
            NewBinding::Fallback => None,
        }
    }
}
