//! The single-threaded binding table behind the store's lock: an exact least-recently-used
//! list with idle timestamps.
//!
//! Entries live in a slab of slots linked into one list, most recently used at the head. Every
//! use moves the entry to the head and stamps it with the time of use, so the list is also in
//! order of last use: the tail is both the eviction victim and the first to expire. Every
//! operation takes `now` from the caller; the store reads the clock under its lock so list
//! order and timestamps agree.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Binding, Scope};

const NIL: usize = usize::MAX;

struct Entry {
    scope: Scope,
    binding: Binding,
    last_used: Instant,
}

struct Slot {
    entry: Option<Entry>,
    /// Towards the head (more recently used).
    prev: usize,
    /// Towards the tail (less recently used).
    next: usize,
}

/// Running totals since the table was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub(crate) bound: u64,
    pub(crate) replaced: u64,
    pub(crate) expired: u64,
    pub(crate) evicted: u64,
    pub(crate) invalidated: u64,
}

pub(crate) struct Table {
    index: HashMap<Scope, usize>,
    slots: Vec<Slot>,
    free: Vec<usize>,
    head: usize,
    tail: usize,
    capacity: usize,
    idle_timeout: Duration,
    counters: Counters,
}

impl Table {
    /// An empty table; `capacity` must be at least 1 (checked by the config).
    pub(crate) fn new(capacity: usize, idle_timeout: Duration) -> Self {
        Self {
            index: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            capacity,
            idle_timeout,
            counters: Counters::default(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    pub(crate) fn counters(&self) -> Counters {
        self.counters
    }

    /// The live binding of `scope`, refreshed.
    pub(crate) fn get(&mut self, scope: &Scope, now: Instant) -> Option<Binding> {
        let slot = self.live(scope, now)?;
        self.touch(slot, now);
        Some(self.entry(slot).binding.clone())
    }

    /// Binds `scope` if it has no live binding; otherwise refreshes and returns the existing one.
    pub(crate) fn bind(
        &mut self,
        scope: &Scope,
        binding: Binding,
        now: Instant,
    ) -> Result<(), Binding> {
        if let Some(slot) = self.live(scope, now) {
            self.touch(slot, now);
            return Err(self.entry(slot).binding.clone());
        }
        self.insert(scope.clone(), binding, now);
        self.counters.bound += 1;
        Ok(())
    }

    /// Replaces the live binding of `scope` if it equals `expected`; otherwise returns the
    /// current one (refreshed), or `None` when there is none.
    pub(crate) fn replace(
        &mut self,
        scope: &Scope,
        expected: &Binding,
        new: Binding,
        now: Instant,
    ) -> Result<(), Option<Binding>> {
        let Some(slot) = self.live(scope, now) else {
            return Err(None);
        };
        self.touch(slot, now);
        let entry = self.entry_mut(slot);
        if entry.binding != *expected {
            return Err(Some(entry.binding.clone()));
        }
        entry.binding = new;
        self.counters.replaced += 1;
        Ok(())
    }

    /// Frees up to `budget` expired entries, oldest first; returns how many it freed.
    pub(crate) fn sweep(&mut self, now: Instant, budget: usize) -> usize {
        let mut freed = 0;
        while freed < budget && self.tail != NIL && self.is_expired(self.tail, now) {
            self.remove(self.tail);
            freed += 1;
        }
        self.counters.expired += freed as u64;
        freed
    }

    /// Removes every binding for which `keep` is false; returns how many it removed.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Binding) -> bool) -> usize {
        let mut removed = 0;
        for slot in 0..self.slots.len() {
            if self.slots[slot].entry.as_ref().is_some_and(|entry| !keep(&entry.binding)) {
                self.remove(slot);
                removed += 1;
            }
        }
        self.counters.invalidated += removed as u64;
        removed
    }

    /// The slot of `scope` if its binding is live; frees it if it has expired.
    fn live(&mut self, scope: &Scope, now: Instant) -> Option<usize> {
        let slot = *self.index.get(scope)?;
        if self.is_expired(slot, now) {
            self.remove(slot);
            self.counters.expired += 1;
            return None;
        }
        Some(slot)
    }

    fn is_expired(&self, slot: usize, now: Instant) -> bool {
        now.saturating_duration_since(self.entry(slot).last_used) >= self.idle_timeout
    }

    fn insert(&mut self, scope: Scope, binding: Binding, now: Instant) {
        if self.index.len() >= self.capacity && self.tail != NIL {
            if self.is_expired(self.tail, now) {
                self.counters.expired += 1;
            } else {
                self.counters.evicted += 1;
            }
            self.remove(self.tail);
        }
        let entry = Entry { scope: scope.clone(), binding, last_used: now };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot].entry = Some(entry);
                slot
            }
            None => {
                self.slots.push(Slot { entry: Some(entry), prev: NIL, next: NIL });
                self.slots.len() - 1
            }
        };
        self.push_front(slot);
        self.index.insert(scope, slot);
    }

    fn remove(&mut self, slot: usize) {
        self.unlink(slot);
        if let Some(entry) = self.slots[slot].entry.take() {
            self.index.remove(&entry.scope);
        }
        self.free.push(slot);
    }

    fn touch(&mut self, slot: usize, now: Instant) {
        self.entry_mut(slot).last_used = now;
        if self.head != slot {
            self.unlink(slot);
            self.push_front(slot);
        }
    }

    fn unlink(&mut self, slot: usize) {
        let Slot { prev, next, .. } = self.slots[slot];
        if prev == NIL {
            self.head = next;
        } else {
            self.slots[prev].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.slots[next].prev = prev;
        }
        self.slots[slot].prev = NIL;
        self.slots[slot].next = NIL;
    }

    fn push_front(&mut self, slot: usize) {
        self.slots[slot].prev = NIL;
        self.slots[slot].next = self.head;
        if self.head == NIL {
            self.tail = slot;
        } else {
            self.slots[self.head].prev = slot;
        }
        self.head = slot;
    }

    fn entry(&self, slot: usize) -> &Entry {
        self.slots[slot].entry.as_ref().expect("linked slots hold an entry")
    }

    fn entry_mut(&mut self, slot: usize) -> &mut Entry {
        self.slots[slot].entry.as_mut().expect("linked slots hold an entry")
    }

    /// Scopes from most to least recently used (tests only).
    #[cfg(test)]
    fn order(&self) -> Vec<Scope> {
        let mut out = Vec::new();
        let mut slot = self.head;
        while slot != NIL {
            out.push(self.entry(slot).scope.clone());
            slot = self.slots[slot].next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;
    use router_workers::{ModelId, Stage, Worker};

    use super::*;

    const IDLE: Duration = Duration::from_secs(10);

    fn scopes(n: usize) -> Vec<Scope> {
        let model = ModelId::new("m");
        (0..n)
            .map(|i| Scope::new(&model, "b", Stage::Plain, &format!("k{i}")).expect("valid"))
            .collect()
    }

    fn workers(n: usize) -> Vec<Arc<Worker>> {
        let model = ModelId::new("m");
        (0..n)
            .map(|i| {
                Arc::new(Worker::plain(&format!("w{i}"), "http://127.0.0.1:1", &model).expect("ok"))
            })
            .collect()
    }

    #[derive(Clone, Debug)]
    enum Op {
        Get(usize),
        Bind(usize, usize),
        Replace(usize, usize, usize),
        Advance(u64),
        Sweep,
        RemoveWorker(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..6usize).prop_map(Op::Get),
            (0..6usize, 0..3usize).prop_map(|(s, w)| Op::Bind(s, w)),
            (0..6usize, 0..3usize, 0..3usize).prop_map(|(s, e, w)| Op::Replace(s, e, w)),
            (0..12u64).prop_map(Op::Advance),
            Just(Op::Sweep),
            (0..3usize).prop_map(Op::RemoveWorker),
        ]
    }

    /// The reference: a vector from most to least recently used, with use times.
    #[derive(Default)]
    struct Model {
        entries: Vec<(usize, usize, Instant)>,
    }

    impl Model {
        fn drop_expired(&mut self, scope: usize, now: Instant) {
            self.entries.retain(|&(s, _, t)| s != scope || now.duration_since(t) < IDLE);
        }

        fn touch(&mut self, scope: usize, now: Instant) -> Option<usize> {
            let at = self.entries.iter().position(|&(s, _, _)| s == scope)?;
            let (s, w, _) = self.entries.remove(at);
            self.entries.insert(0, (s, w, now));
            Some(w)
        }
    }

    proptest! {
        /// The table behaves like a plain most-recently-used list with idle expiry and a cap.
        #[test]
        fn matches_a_reference_list(ops in proptest::collection::vec(op(), 1..120), cap in 1..5usize) {
            let scopes = scopes(6);
            let workers = workers(3);
            let mut table = Table::new(cap, IDLE);
            let mut model = Model::default();
            let mut now = Instant::now();
            for op in ops {
                match op {
                    Op::Get(s) => {
                        model.drop_expired(s, now);
                        let expected = model.touch(s, now);
                        let got = table.get(&scopes[s], now);
                        prop_assert_eq!(got, expected.map(|w| Binding::of(&workers[w])));
                    }
                    Op::Bind(s, w) => {
                        model.drop_expired(s, now);
                        let expected = match model.touch(s, now) {
                            Some(existing) => Err(Binding::of(&workers[existing])),
                            None => {
                                if model.entries.len() >= cap {
                                    model.entries.pop();
                                }
                                model.entries.insert(0, (s, w, now));
                                Ok(())
                            }
                        };
                        prop_assert_eq!(table.bind(&scopes[s], Binding::of(&workers[w]), now), expected);
                    }
                    Op::Replace(s, e, w) => {
                        model.drop_expired(s, now);
                        let expected = match model.touch(s, now) {
                            None => Err(None),
                            Some(current) if current == e => {
                                model.entries[0].1 = w;
                                Ok(())
                            }
                            Some(current) => Err(Some(Binding::of(&workers[current]))),
                        };
                        let got = table.replace(
                            &scopes[s], &Binding::of(&workers[e]), Binding::of(&workers[w]), now);
                        prop_assert_eq!(got, expected);
                    }
                    Op::Advance(secs) => now += Duration::from_secs(secs),
                    Op::Sweep => {
                        let before = model.entries.len();
                        model.entries.retain(|&(_, _, t)| now.duration_since(t) < IDLE);
                        prop_assert_eq!(table.sweep(now, usize::MAX), before - model.entries.len());
                    }
                    Op::RemoveWorker(w) => {
                        let before = model.entries.len();
                        model.entries.retain(|&(_, bound, _)| bound != w);
                        let id = workers[w].id();
                        prop_assert_eq!(table.retain(|b| b.worker() != id), before - model.entries.len());
                    }
                }
                let expected_order: Vec<Scope> =
                    model.entries.iter().map(|&(s, _, _)| scopes[s].clone()).collect();
                prop_assert_eq!(table.order(), expected_order);
                prop_assert_eq!(table.len(), model.entries.len());
                prop_assert!(table.len() <= cap);
            }
        }
    }

    #[test]
    fn sweep_respects_its_budget_and_stops_at_the_first_live_entry() {
        let scopes = scopes(4);
        let workers = workers(1);
        let binding = Binding::of(&workers[0]);
        let start = Instant::now();
        let mut table = Table::new(10, IDLE);
        for (i, scope) in scopes.iter().enumerate() {
            let at = start + Duration::from_secs(i as u64 * 5);
            assert_eq!(table.bind(scope, binding.clone(), at), Ok(()));
        }
        // At start + 19 s, the entries bound at 0 and 5 s have been idle for >= 10 s; the one
        // bound at 10 s has been idle for 9 s.
        let now = start + Duration::from_secs(19);
        assert_eq!(table.sweep(now, 1), 1);
        assert_eq!(table.sweep(now, 10), 1);
        assert_eq!(table.sweep(now, 10), 0);
        assert_eq!(table.order(), vec![scopes[3].clone(), scopes[2].clone()]);
        assert_eq!(table.counters().expired, 2);
    }

    #[test]
    fn slots_are_reused_after_removal() {
        let scopes = scopes(3);
        let workers = workers(1);
        let now = Instant::now();
        let mut table = Table::new(2, IDLE);
        for scope in &scopes {
            assert_eq!(table.bind(scope, Binding::of(&workers[0]), now), Ok(()));
        }
        assert_eq!(table.slots.len(), 2, "the evicted slot is reused, not leaked");
        assert_eq!(table.counters().evicted, 1);
    }
}
