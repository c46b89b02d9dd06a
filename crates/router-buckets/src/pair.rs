//! PD pairing constraints: the labels (`pair_on`) on which a bucket's prefill and decode
//! engines must agree, and the startup check that every prefill engine has a partner.
//!
//! The rule: with `pair_on: [l1, l2, ...]`, a decode engine may serve a prefill engine exactly
//! when both carry every listed label and their values are equal, label by label. A label
//! missing on either side never matches, not even when it is missing on both: the constraint
//! exists to guarantee compatibility (the same KV transfer backend, rack or parallel layout),
//! and two engines that do not declare a value guarantee nothing. An empty `pair_on` is no
//! constraint at all.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use router_workers::{Stage, Worker, WorkerId};

use crate::EngineGroup;
use crate::error::PairOnError;

/// The labels a PD bucket pairs its prefill and decode engines on; empty = no constraint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PairOn(Vec<String>);

impl PairOn {
    /// No constraint: any decode engine of the bucket serves any prefill engine.
    pub fn none() -> Self {
        Self::default()
    }

    /// Pairs on `labels`, in the order given. Fails on an empty name or a name listed twice.
    pub fn new(labels: Vec<String>) -> Result<Self, PairOnError> {
        let mut seen = HashSet::with_capacity(labels.len());
        for (position, label) in labels.iter().enumerate() {
            if label.trim().is_empty() {
                return Err(PairOnError::EmptyLabel { position });
            }
            if !seen.insert(label.as_str()) {
                return Err(PairOnError::DuplicateLabel { position, label: label.clone() });
            }
        }
        Ok(Self(labels))
    }

    /// The labels, in configuration order.
    pub fn labels(&self) -> &[String] {
        &self.0
    }

    /// Whether there is no constraint.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `decode` may serve `prefill`: each has every label and the values are equal
    /// (always, without labels to pair on).
    pub fn compatible(&self, prefill: &Worker, decode: &Worker) -> bool {
        self.0.iter().all(|label| match (prefill.label(label), decode.label(label)) {
            (Some(p), Some(d)) => p == d,
            _ => false,
        })
    }

    /// The labels of `pair_on` that `worker` does not carry.
    pub fn missing_on<'a>(&'a self, worker: &Worker) -> Vec<&'a str> {
        self.0.iter().filter(|l| worker.label(l).is_none()).map(String::as_str).collect()
    }
}

impl fmt::Display for PairOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(", "))
    }
}

/// Something about a bucket's pairing an operator should hear of; never an error, since
/// workers come and go through the admin API.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PairingWarning {
    /// No worker of the model carries this `pair_on` label (yet), so no pair can form.
    UnknownLabel {
        /// The bucket.
        bucket: String,
        /// The label.
        label: String,
    },
    /// A prefill engine of the bucket has no decode engine of the bucket it may pair with, so
    /// it is never selected there.
    UnpairedPrefill {
        /// The bucket.
        bucket: String,
        /// The prefill engine.
        prefill: WorkerId,
        /// The `pair_on` labels it lacks itself (empty: it has them all, but no decode engine
        /// has the same values).
        missing: Vec<String>,
    },
}

impl fmt::Display for PairingWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PairingWarning::UnknownLabel { bucket, label } => write!(
                f,
                "bucket {bucket}: no worker has the pair_on label {label:?}, so no prefill \
                 engine can be paired there"
            ),
            PairingWarning::UnpairedPrefill { bucket, prefill, missing } if missing.is_empty() => {
                write!(
                    f,
                    "bucket {bucket}: prefill engine {prefill} has no decode engine with the same \
                     pair_on labels, so it is never selected there"
                )
            }
            PairingWarning::UnpairedPrefill { bucket, prefill, missing } => write!(
                f,
                "bucket {bucket}: prefill engine {prefill} lacks the pair_on label(s) {}, so it \
                 pairs with no decode engine and is never selected there",
                missing.join(", ")
            ),
        }
    }
}

/// The pairing warnings of one PD bucket over `workers` (the model's workers, whatever their
/// health or status: this is a check of the configuration, not of the moment). Only the
/// prefill engines in `only` are judged when it is given (a worker just added).
pub(crate) fn warnings(
    bucket: &str,
    pair_on: &PairOn,
    prefill: &EngineGroup,
    decode: &EngineGroup,
    workers: &[Arc<Worker>],
    only: Option<&WorkerId>,
) -> Vec<PairingWarning> {
    let mut warnings = Vec::new();
    if pair_on.is_empty() {
        return warnings;
    }
    if only.is_none() {
        for label in pair_on.labels() {
            if !workers.iter().any(|w| w.label(label).is_some()) {
                let label = label.clone();
                warnings.push(PairingWarning::UnknownLabel { bucket: bucket.to_owned(), label });
            }
        }
    }
    let members = |group: &EngineGroup, stage: Stage| -> Vec<&Arc<Worker>> {
        workers.iter().filter(|w| w.stage() == stage && group.admits(w.id())).collect()
    };
    let decodes = members(decode, Stage::Decode);
    for p in members(prefill, Stage::Prefill) {
        if only.is_some_and(|id| id != p.id()) {
            continue;
        }
        if !decodes.iter().any(|d| pair_on.compatible(p, d)) {
            warnings.push(PairingWarning::UnpairedPrefill {
                bucket: bucket.to_owned(),
                prefill: p.id().clone(),
                missing: pair_on.missing_on(p).into_iter().map(str::to_owned).collect(),
            });
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use router_workers::{ModelId, WorkerLabels, WorkerSpec};

    use super::*;

    fn engine(id: &str, stage: Stage, labels: &[(&str, &str)]) -> Worker {
        let spec = WorkerSpec {
            labels: labels.iter().copied().collect::<WorkerLabels>(),
            ..WorkerSpec::new(id, "http://127.0.0.1:1", stage)
        };
        Worker::from_spec(&spec, vec![ModelId::new("m")]).expect("valid")
    }

    fn pair_on(labels: &[&str]) -> PairOn {
        PairOn::new(labels.iter().map(|l| (*l).to_owned()).collect()).expect("valid")
    }

    #[test]
    fn the_pairing_rule() {
        type Labels = &'static [(&'static str, &'static str)];
        // (pair_on, prefill labels, decode labels, compatible)
        #[rustfmt::skip]
        let cases: &[(&[&str], Labels, Labels, bool)] = &[
            (&[], &[], &[], true),
            (&[], &[("rack", "a")], &[("rack", "b")], true),
            (&["rack"], &[("rack", "a")], &[("rack", "a")], true),
            (&["rack"], &[("rack", "a")], &[("rack", "b")], false),
            (&["rack"], &[("rack", "a")], &[], false),
            (&["rack"], &[], &[("rack", "a")], false),
            (&["rack"], &[], &[], false),
            (&["rack"], &[("rack", "")], &[("rack", "")], true),
            (&["rack"], &[("rack", "a"), ("tp", "8")], &[("rack", "a"), ("tp", "4")], true),
            (&["rack", "tp"], &[("rack", "a"), ("tp", "8")], &[("rack", "a"), ("tp", "8")], true),
            (&["rack", "tp"], &[("rack", "a"), ("tp", "8")], &[("rack", "a"), ("tp", "4")], false),
            (&["rack", "tp"], &[("rack", "a"), ("tp", "8")], &[("rack", "a")], false),
            (&["rack"], &[("rack", "A")], &[("rack", "a")], false),
        ];
        for (labels, p, d, want) in cases {
            let rule = pair_on(labels);
            let (p, d) = (engine("p", Stage::Prefill, p), engine("d", Stage::Decode, d));
            let case =
                format!("pair_on {labels:?}, prefill {:?}, decode {:?}", p.labels(), d.labels());
            assert_eq!(rule.compatible(&p, &d), *want, "{case}");
        }
    }

    #[test]
    fn pair_on_names_must_be_non_empty_and_distinct() {
        let names = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            PairOn::new(names(&["rack", " "])),
            Err(PairOnError::EmptyLabel { position: 1 })
        );
        assert_eq!(
            PairOn::new(names(&["rack", "tp", "rack"])),
            Err(PairOnError::DuplicateLabel { position: 2, label: "rack".into() })
        );
        assert!(PairOn::new(Vec::new()).expect("no constraint").is_empty());
        assert_eq!(pair_on(&["rack", "tp"]).to_string(), "rack, tp");
    }
}
