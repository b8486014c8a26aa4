//! Bounded bookkeeping: what the simulator remembers for tests and
//! diagnostics (the call log, the NvSciSync memsync log, the handles that
//! were destroyed) keeps at most [`LOG_LIMIT`] entries each, so a simulator
//! that serves millions of calls (a long pipeline run) stays at a constant
//! size. The oldest entries go first; how many went is counted.

#![deny(unsafe_code)]

use std::collections::{HashMap, VecDeque};

use crate::instance::{GoneWhy, Tag};

/// How many entries each of the simulator's logs keeps (the most recent
/// ones): the call log ([`crate::Sim::call_log`]), the memsync log
/// ([`crate::Sim::nvsci_memsync_log`]) and the record of destroyed handles
/// that tells a use after destroy from an unknown handle.
pub const LOG_LIMIT: usize = 1 << 16;

/// A log of the most recent [`LOG_LIMIT`] entries.
#[derive(Clone, Debug)]
pub(crate) struct Journal<T> {
    entries: VecDeque<T>,
    dropped: u64,
}

impl<T> Default for Journal<T> {
    fn default() -> Self {
        Journal {
            entries: VecDeque::new(),
            dropped: 0,
        }
    }
}

impl<T: Clone> Journal<T> {
    /// Appends `v`, forgetting the oldest entry when full.
    pub(crate) fn push(&mut self, v: T) {
        if self.entries.len() >= LOG_LIMIT {
            self.entries.pop_front();
            self.dropped += 1;
        }
        self.entries.push_back(v);
    }

    /// The entries kept, oldest first.
    pub(crate) fn to_vec(&self) -> Vec<T> {
        self.entries.iter().cloned().collect()
    }

    /// Entries kept now.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Entries forgotten so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// Handles (and device addresses) that were live once, and why they are not
/// any more. Handles are never reused, so without a bound this grows by one
/// entry per object ever destroyed (two per EGLStream frame). It keeps every
/// context and every object lost with its context (those answers differ:
/// `CONTEXT_IS_DESTROYED` on a destroy), and the most recent [`LOG_LIMIT`]
/// objects destroyed by their own call; an older one is then answered as an
/// unknown handle: the same error code, an `UnknownHandle` diagnostic instead
/// of `UseAfterDestroy` / `DoubleDestroy`.
#[derive(Default)]
pub(crate) struct GoneMap {
    map: HashMap<u64, GoneWhy>,
    /// Evictable entries in the order they were recorded (may name entries
    /// removed since; they are skipped).
    order: VecDeque<u64>,
    forgotten: u64,
}

impl GoneMap {
    /// Records `h` as gone for `why`.
    pub(crate) fn insert(&mut self, h: u64, why: GoneWhy) {
        let evictable = why == GoneWhy::Destroyed && (h >> 48) != Tag::Context as u64;
        if self.map.capacity() == 0 {
            // The table's full size at once (its pages are touched as it
            // fills): a table that doubles late in a long run (57,344
            // entries: 2 MiB more) looks like a leak in the soak.
            self.map.reserve(LOG_LIMIT + 1024);
            self.order.reserve(LOG_LIMIT + 1);
        }
        if self.map.insert(h, why).is_none() && evictable {
            self.order.push_back(h);
            while self.order.len() > LOG_LIMIT {
                let Some(old) = self.order.pop_front() else {
                    break;
                };
                if self.map.get(&old) == Some(&GoneWhy::Destroyed) {
                    self.map.remove(&old);
                    self.forgotten += 1;
                }
            }
        }
    }

    /// Why `h` is gone, if it is remembered.
    pub(crate) fn get(&self, h: &u64) -> Option<&GoneWhy> {
        self.map.get(h)
    }

    /// Whether `h` is remembered as gone.
    pub(crate) fn contains_key(&self, h: &u64) -> bool {
        self.map.contains_key(h)
    }

    /// `h` is live again (a reused device address, a retained primary
    /// context).
    pub(crate) fn remove(&mut self, h: &u64) {
        self.map.remove(h);
    }

    /// Entries kept now.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Destroyed handles forgotten so far.
    pub(crate) fn forgotten(&self) -> u64 {
        self.forgotten
    }
}

/// How much the simulator's bounded logs hold now, and how much they forgot
/// ([`crate::Sim::kept_records`]): each stays at most [`LOG_LIMIT`] however
/// long the simulator runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeptRecords {
    /// Entries in the call log.
    pub calls: usize,
    /// Calls no longer in the call log.
    pub calls_forgotten: u64,
    /// Entries in the NvSciSync memsync log.
    pub memsync: usize,
    /// Memsync events no longer in that log.
    pub memsync_forgotten: u64,
    /// Destroyed handles remembered (for use-after-destroy diagnostics).
    pub gone: usize,
    /// Destroyed handles forgotten (now answered as unknown handles).
    pub gone_forgotten: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::new_handle;

    #[test]
    fn a_journal_keeps_the_most_recent_entries() {
        let mut j = Journal::default();
        for i in 0..LOG_LIMIT as u64 + 10 {
            j.push(i);
        }
        assert_eq!(j.len(), LOG_LIMIT);
        assert_eq!(j.dropped(), 10);
        let v = j.to_vec();
        assert_eq!(v.first(), Some(&10));
        assert_eq!(v.last(), Some(&(LOG_LIMIT as u64 + 9)));
    }

    #[test]
    fn destroyed_handles_are_bounded_but_contexts_and_context_losses_stay() {
        let mut g = GoneMap::default();
        let ctx = new_handle(Tag::Context);
        g.insert(ctx, GoneWhy::Destroyed);
        let lost = new_handle(Tag::Stream);
        g.insert(lost, GoneWhy::ContextDestroyed);
        let first = new_handle(Tag::GraphicsResource);
        g.insert(first, GoneWhy::Destroyed);
        let mut last = first;
        for _ in 0..2 * LOG_LIMIT {
            last = new_handle(Tag::GraphicsResource);
            g.insert(last, GoneWhy::Destroyed);
        }
        assert!(g.len() <= LOG_LIMIT + 2, "{}", g.len());
        assert_eq!(g.forgotten(), (LOG_LIMIT + 1) as u64);
        assert_eq!(g.get(&ctx), Some(&GoneWhy::Destroyed));
        assert_eq!(g.get(&lost), Some(&GoneWhy::ContextDestroyed));
        assert!(
            !g.contains_key(&first),
            "the oldest destroyed handle is forgotten"
        );
        assert!(g.contains_key(&last), "the newest is remembered");
        g.remove(&last);
        assert!(!g.contains_key(&last));
    }
}
