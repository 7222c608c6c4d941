//! Durations of completed kernels per process and name: what a kernel's own bound is made of
//! (`verdict::kernel`: a multiple of its name's p99).

use std::{collections::HashMap, sync::Arc};

use hdrhistogram::Histogram;

/// Completed runs needed before a name's history sets its bound.
const MIN_HISTORY: u64 = 5;

/// Durations of completed kernels per (pid, name), in µs.
#[derive(Default)]
pub struct History {
    /// By pid, then kernel name. Names are shared with the collector's name cache: a
    /// completion costs a lookup, not a String (8 launch-bound processes complete ~800,000
    /// kernels a second).
    by_name: HashMap<u32, HashMap<Arc<str>, Histogram<u64>>>,
}

impl History {
    /// Drops what was learned about `pid` (it exited; the daemon forgets it).
    pub fn forget(&mut self, pid: u32) {
        self.by_name.remove(&pid);
    }

    /// (pid, name) histograms held.
    pub fn entries(&self) -> usize {
        self.by_name.values().map(HashMap::len).sum()
    }

    pub fn record(&mut self, pid: u32, name: &Arc<str>, duration_ns: u64) {
        self.record_all(pid, name, &[duration_ns]);
    }

    /// Several durations of one kernel name (one lookup).
    pub fn record_all(&mut self, pid: u32, name: &Arc<str>, durations_ns: &[u64]) {
        if durations_ns.is_empty() {
            return;
        }
        let names = self.by_name.entry(pid).or_default();
        let h = match names.get_mut(name.as_ref()) {
            Some(h) => h,
            None => names.entry(name.clone()).or_insert_with(|| {
                Histogram::new_with_bounds(1, 3_600_000_000, 2).expect("static bounds are valid")
            }),
        };
        for d in durations_ns {
            h.saturating_record((d / 1_000).max(1));
        }
    }

    /// multiple × p99 of the name's history, in ms, when there is enough of it.
    pub fn bound_ms(&self, pid: u32, name: &str, multiple: f64) -> Option<f64> {
        let h = self.by_name.get(&pid)?.get(name)?;
        (h.len() >= MIN_HISTORY).then(|| h.value_at_quantile(0.99) as f64 / 1e3 * multiple)
    }
}
