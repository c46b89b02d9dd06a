//! Watch events in, registry changes out: the pods each selector sees, folded into the workers
//! of the registry. A (re)list is buffered and applied whole at its end, so a relist never
//! drops a live worker it lists again; a pod whose worker changes (IP, port, role, model, a new
//! uid) replaces it with a new incarnation; a pod that leaves is removed, and the registry's
//! feed lets the state crates drop its KV entries, affinity bindings and subscriptions.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use router_workers::{Worker, WorkerId, WorkerOrigin, WorkerRegistry};

use crate::config::DiscoveryConfig;
use crate::pod::{PodProblem, PodVerdict, PodWorker, judge};
use crate::status::{DiscoveryState, SkippedPod};

/// What one selector's watch reports, in order.
#[derive(Debug)]
pub(crate) enum SourceEvent {
    /// A list starts (the first, or a relist after 410 Gone or a restart).
    Init,
    /// A pod of the list.
    InitApply(Box<Pod>),
    /// The list is complete: pods not in it are gone.
    InitDone,
    /// A pod was added or changed.
    Apply(Box<Pod>),
    /// A pod was deleted or left the selection.
    Delete(Box<Pod>),
    /// An attempt failed; the watch retries.
    Failed(String),
}

/// One selector's view.
#[derive(Default)]
struct Source {
    /// What each selected pod is, by name.
    pods: HashMap<String, PodVerdict>,
    /// A list in progress.
    listing: Option<HashMap<String, PodVerdict>>,
    listed: bool,
    /// Its last attempt failed (the status shows the error until a success).
    failing: bool,
}

/// The worker registered for a pod, and which incarnation it is.
struct Registered {
    worker: PodWorker,
    incarnation: u64,
}

/// Folds watch events into the registry.
pub(crate) struct Reconciler {
    registry: Arc<WorkerRegistry>,
    config: Arc<DiscoveryConfig>,
    namespace: String,
    sources: Vec<Source>,
    /// By pod name (= worker id).
    registered: HashMap<String, Registered>,
    /// Pods skipped, with the reason last warned about.
    skipped: BTreeMap<String, String>,
    state: DiscoveryState,
}

impl Reconciler {
    pub(crate) fn new(
        registry: Arc<WorkerRegistry>,
        config: Arc<DiscoveryConfig>,
        namespace: String,
        state: DiscoveryState,
    ) -> Self {
        let sources = config.sources.iter().map(|_| Source::default()).collect();
        Self {
            registry,
            config,
            namespace,
            sources,
            registered: HashMap::new(),
            skipped: BTreeMap::new(),
            state,
        }
    }

    /// Applies one event of source `index`; call [`Reconciler::publish`] after a batch.
    pub(crate) fn apply(&mut self, index: usize, event: SourceEvent) {
        let stage = self.config.sources[index].stage;
        match event {
            SourceEvent::Init => {
                let source = &mut self.sources[index];
                if source.listed {
                    tracing::info!(role = %stage, "listing pods again");
                    self.state.update(|s| s.sources[index].relists += 1);
                }
                source.listing = Some(HashMap::new());
            }
            SourceEvent::InitApply(pod) => {
                let Some((name, verdict)) = self.judge(&pod, index) else { return };
                match &mut self.sources[index].listing {
                    Some(listing) => {
                        listing.insert(name, verdict);
                    }
                    None => {
                        self.sources[index].pods.insert(name.clone(), verdict);
                        self.reconcile(&name);
                    }
                }
            }
            SourceEvent::InitDone => {
                let source = &mut self.sources[index];
                let listed = source.listing.take().unwrap_or_default();
                let previous = std::mem::replace(&mut source.pods, listed);
                source.listed = true;
                source.failing = false;
                let names: BTreeSet<String> =
                    previous.into_keys().chain(source.pods.keys().cloned()).collect();
                for name in names {
                    self.reconcile(&name);
                }
                self.state.update(|s| {
                    let status = &mut s.sources[index];
                    status.listed = true;
                    status.last_error = None;
                });
            }
            SourceEvent::Apply(pod) => {
                let Some((name, verdict)) = self.judge(&pod, index) else { return };
                self.sources[index].pods.insert(name.clone(), verdict);
                self.reconcile(&name);
                self.clear_error(index);
            }
            SourceEvent::Delete(pod) => {
                let Some(name) = pod.metadata.name.clone() else { return };
                self.sources[index].pods.remove(&name);
                self.reconcile(&name);
                self.clear_error(index);
            }
            SourceEvent::Failed(error) => {
                self.sources[index].failing = true;
                self.state.update(|s| {
                    let status = &mut s.sources[index];
                    status.errors += 1;
                    status.last_error = Some(error);
                });
            }
        }
    }

    fn clear_error(&mut self, index: usize) {
        if std::mem::take(&mut self.sources[index].failing) {
            self.state.update(|s| s.sources[index].last_error = None);
        }
    }

    fn judge(&self, pod: &Pod, index: usize) -> Option<(String, PodVerdict)> {
        let name = pod.metadata.name.clone()?;
        let stage = self.config.sources[index].stage;
        let verdict = judge(pod, stage, &self.namespace, &self.config.template, &self.config.model);
        Some((name, verdict))
    }

    /// Makes the registry agree with what the sources say about pod `name`.
    fn reconcile(&mut self, name: &str) {
        let desired = self.desired(name);
        let ours = self.registered.get(name).filter(|r| {
            WorkerId::new(name)
                .ok()
                .and_then(|id| self.registry.get(&id))
                .is_some_and(|w| w.incarnation() == r.incarnation)
        });
        let outcome = match (desired, ours) {
            (Ok(None), None) => Ok(()),
            (Ok(None), Some(_)) => {
                self.remove(name, "no longer a serving pod");
                Ok(())
            }
            (Ok(Some(worker)), Some(current)) if current.worker == worker => Ok(()),
            (Ok(Some(worker)), Some(_)) => self.replace(name, worker),
            (Ok(Some(worker)), None) => self.add(name, worker),
            (Err(problem), ours) => {
                if ours.is_some() {
                    self.remove(name, "cannot be a worker any more");
                }
                Err(problem)
            }
        };
        match outcome {
            Ok(()) => {
                if self.skipped.remove(name).is_some() {
                    tracing::info!(pod = %name, namespace = %self.namespace, "pod no longer skipped");
                }
            }
            Err(problem) => self.skip(name, &problem),
        }
    }

    /// The worker pod `name` should be, if any, from every source's verdict.
    fn desired(&self, name: &str) -> Result<Option<PodWorker>, PodProblem> {
        let mut serving: Vec<&PodWorker> = Vec::new();
        let mut problem = None;
        for source in &self.sources {
            match source.pods.get(name) {
                Some(PodVerdict::Serving(worker)) => serving.push(worker),
                Some(PodVerdict::Invalid(p)) => problem = Some(p.clone()),
                Some(PodVerdict::Waiting(_)) | None => {}
            }
        }
        match (serving.as_slice(), problem) {
            ([first, second, ..], _) => {
                Err(PodProblem::SeveralRoles { first: first.spec.role, second: second.spec.role })
            }
            (_, Some(problem)) => Err(problem),
            ([only], None) => Ok(Some((*only).clone())),
            ([], None) => Ok(None),
        }
    }

    fn build(worker: &PodWorker) -> Result<Worker, PodProblem> {
        let built = Worker::from_spec(&worker.spec, vec![worker.model.clone()])?;
        Ok(built.with_origin(WorkerOrigin::Discovery(worker.pod.clone())))
    }

    fn add(&mut self, name: &str, worker: PodWorker) -> Result<(), PodProblem> {
        if let Some(other) = WorkerId::new(name).ok().and_then(|id| self.registry.get(&id)) {
            let by = match other.origin() {
                WorkerOrigin::Config => "the configuration",
                WorkerOrigin::Admin => "the admin API",
                WorkerOrigin::Discovery(_) => "another pod",
            };
            return Err(PodProblem::IdTaken { id: name.to_owned(), by });
        }
        let added = self.registry.add(Self::build(&worker)?)?;
        tracing::info!(pod = %name, namespace = %self.namespace, url = %added.url(),
            role = %added.stage(), model = %worker.model, "discovered worker added");
        self.registered
            .insert(name.to_owned(), Registered { worker, incarnation: added.incarnation() });
        Ok(())
    }

    fn replace(&mut self, name: &str, worker: PodWorker) -> Result<(), PodProblem> {
        let built = match Self::build(&worker) {
            Ok(built) => built,
            Err(problem) => {
                self.remove(name, "its new spec is refused");
                return Err(problem);
            }
        };
        match self.registry.replace(built) {
            Ok(replaced) => {
                tracing::info!(pod = %name, namespace = %self.namespace, url = %replaced.url(),
                    role = %replaced.stage(), model = %worker.model, uid = %worker.pod.uid,
                    "discovered worker replaced by a new incarnation");
                self.registered.insert(
                    name.to_owned(),
                    Registered { worker, incarnation: replaced.incarnation() },
                );
                Ok(())
            }
            Err(err) => {
                self.remove(name, "its replacement is refused");
                Err(err.into())
            }
        }
    }

    fn remove(&mut self, name: &str, why: &str) {
        let Some(registered) = self.registered.remove(name) else { return };
        let Ok(id) = WorkerId::new(name) else { return };
        if self.registry.get(&id).is_some_and(|w| w.incarnation() == registered.incarnation) {
            let _ = self.registry.remove(&id);
            tracing::info!(pod = %name, namespace = %self.namespace, why, "discovered worker removed");
        }
    }

    fn skip(&mut self, name: &str, problem: &PodProblem) {
        let reason = problem.to_string();
        if self.skipped.get(name) != Some(&reason) {
            tracing::warn!(pod = %name, namespace = %self.namespace, %reason,
                "pod skipped: it cannot be a worker");
            self.skipped.insert(name.to_owned(), reason);
        }
    }

    /// Publishes the counts and the skipped pods after a batch of events.
    pub(crate) fn publish(&self) {
        let skipped: Vec<SkippedPod> = self
            .skipped
            .iter()
            .map(|(pod, reason)| SkippedPod { pod: pod.clone(), reason: reason.clone() })
            .collect();
        let pods: Vec<usize> = self.sources.iter().map(|s| s.pods.len()).collect();
        let workers = self.registered.len();
        self.state.update(|status| {
            status.workers = workers;
            status.skipped = skipped;
            for (status, pods) in status.sources.iter_mut().zip(pods) {
                status.pods = pods;
            }
        });
    }
}

#[cfg(test)]
mod tests;
