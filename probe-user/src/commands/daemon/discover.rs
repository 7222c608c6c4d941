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

#[derive(Default)]
pub struct Discovery {
    /// Processes found not (yet) to be CUDA processes: when to look again, and the interval.
    later: HashMap<u32, (Instant, Duration)>,
    pub last_scan: Duration,
    pub scans: u64,
}

impl Discovery {
    /// Pids worth trying now (new, or due again), skipping `attached` and ourselves.
    pub fn candidates(&mut self, attached: &dyn Fn(u32) -> bool) -> Vec<u32> {
        let start = Instant::now();
        let me = std::process::id();
        let mut out = Vec::new();
        let mut alive = std::collections::HashSet::new();
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

    pub fn forget(&mut self, pid: u32) {
        self.later.remove(&pid);
    }

    /// Processes waiting for a re-check.
    pub fn pending(&self) -> usize {
        self.later.len()
    }
}
