//! Finding CUDA processes on the node: a periodic scan of /proc. A process is a candidate when
//! its memory map holds libcuda or a shim journal (`target::Target::open` decides).
//!
//! Cost bound: reading a process's maps costs ~50–200 µs, and most processes on a node never
//! use CUDA, so a process found not to map libcuda is re-checked with a growing interval
//! (2× each time, up to 60 s) — serving frameworks initialise CUDA some seconds after start,
//! and a new process is checked at the first scan after it appears. Per scan, the work is one
//! readdir of /proc plus the maps of new and due processes. Measured: BENCHMARKS.md.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How long a process whose environment loads the shim is left alone until its journal
/// appears (see `Daemon::discover`): PyTorch maps libcuda at `import torch` and initialises
/// CUDA at first use, which can be minutes later in a server that loads its weights first.
pub const SHIM_GRACE: Duration = Duration::from_secs(120);

#[derive(Default)]
pub struct Discovery {
    /// Processes found not (yet) to be CUDA processes: when to look again, and the interval.
    later: HashMap<u32, (Instant, Duration)>,
    /// Processes waiting for their shim to create its journal, since when.
    awaiting_shim: HashMap<u32, Instant>,
    /// The pids in /proc at the last scan.
    alive: std::collections::HashSet<u32>,
    pub last_scan: Duration,
    pub scans: u64,
}

impl Discovery {
    /// Pids worth trying now (new, or due again), skipping `attached` and ourselves.
    pub fn candidates(&mut self, attached: &dyn Fn(u32) -> bool) -> Vec<u32> {
        let start = Instant::now();
        let me = std::process::id();
        let mut out = Vec::new();
        let mut alive = std::mem::take(&mut self.alive);
        alive.clear();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for e in dir.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                alive.insert(pid);
                if pid == me || attached(pid) {
                    continue;
                }
                match self.later.get(&pid) {
                    Some((when, _)) if *when > start => {}
                    _ => out.push(pid),
                }
            }
        }
        self.later.retain(|pid, _| alive.contains(pid));
        self.awaiting_shim.retain(|pid, _| alive.contains(pid));
        self.alive = alive;
        self.scans += 1;
        self.last_scan = start.elapsed();
        out
    }

    /// `pid` is not a CUDA process (yet): look again later, less often each time.
    pub fn not_now(&mut self, pid: u32, first_interval: Duration) {
        let now = Instant::now();
        let next = match self.later.get(&pid) {
            Some((_, d)) => (*d * 2).min(MAX_BACKOFF),
            None => first_interval,
        };
        self.later.insert(pid, (now + next, next));
    }

    /// Whether `pid` was in /proc at the last scan.
    pub fn alive(&self, pid: u32) -> bool {
        self.alive.contains(&pid)
    }

    pub fn forget(&mut self, pid: u32) {
        self.later.remove(&pid);
        self.awaiting_shim.remove(&pid);
    }

    /// `pid` expects the shim and has no journal yet: `Some(first)` (whether this is the first
    /// time) while `SHIM_GRACE` has not passed since it was first seen so, and it is looked at
    /// again at the next scan; `None` once it has (attach it anyway).
    pub fn await_shim(&mut self, pid: u32, scan_interval: Duration) -> Option<bool> {
        let now = Instant::now();
        let first = !self.awaiting_shim.contains_key(&pid);
        let since = *self.awaiting_shim.entry(pid).or_insert(now);
        if now.duration_since(since) >= SHIM_GRACE {
            return None;
        }
        self.later.insert(pid, (now + scan_interval, scan_interval));
        Some(first)
    }

    /// Processes waiting for a re-check.
    pub fn pending(&self) -> usize {
        self.later.len()
    }
}
