//! What a scope is bound to: one engine, in one incarnation.

use std::sync::Arc;

use router_workers::{Worker, WorkerId};

/// A binding to one engine: its id and the [`Worker::incarnation`] it was made with.
///
/// A replaced engine keeps its id but gets a new incarnation, so a binding made to the old
/// engine does not match the new one: [`Binding::find_in`] will not return it, and a policy
/// that wants the new engine rebinds explicitly (with [`crate::AffinityStore::replace`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Binding {
    worker: WorkerId,
    incarnation: u64,
}

impl Binding {
    /// A binding to this worker as it is now.
    pub fn of(worker: &Worker) -> Self {
        Self { worker: worker.id().clone(), incarnation: worker.incarnation() }
    }

    /// The bound engine's id.
    pub fn worker(&self) -> &WorkerId {
        &self.worker
    }

    /// The incarnation of the engine the binding was made to.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Whether this binding is to exactly this worker value (same id and incarnation).
    pub fn is_for(&self, worker: &Worker) -> bool {
        worker.incarnation() == self.incarnation && worker.id() == &self.worker
    }

    /// The candidate this binding points at, if it is one of `candidates`.
    ///
    /// A binding to an engine outside the candidates, or to an earlier incarnation of a
    /// candidate's id, finds nothing: such a binding never wins.
    pub fn find_in<'a>(&self, candidates: &'a [Arc<Worker>]) -> Option<&'a Arc<Worker>> {
        candidates.iter().find(|candidate| self.is_for(candidate))
    }
}

impl From<&Worker> for Binding {
    fn from(worker: &Worker) -> Self {
        Self::of(worker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_workers::ModelId;

    fn worker(id: &str) -> Arc<Worker> {
        let model = ModelId::new("m");
        Arc::new(Worker::plain(id, "http://127.0.0.1:1", &model).expect("valid worker"))
    }

    #[test]
    fn finds_only_the_same_incarnation() {
        let a = worker("a");
        let b = worker("b");
        let binding = Binding::of(&a);
        assert!(Arc::ptr_eq(binding.find_in(&[b.clone(), a.clone()]).expect("bound"), &a));

        let a_again = worker("a");
        assert_eq!(a_again.id(), a.id());
        assert!(!binding.is_for(&a_again), "a replaced engine must not inherit the binding");
        assert!(binding.find_in(&[a_again, b]).is_none());
    }

    #[test]
    fn outside_the_candidates_finds_nothing() {
        let a = worker("a");
        assert!(Binding::of(&a).find_in(&[worker("b"), worker("c")]).is_none());
        assert!(Binding::of(&a).find_in(&[]).is_none());
    }
}
