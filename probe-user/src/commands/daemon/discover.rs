//! Finding CUDA processes on the node: a periodic scan of /proc. A process is a candidate when
//! its memory map holds libcuda or a shim journal (`target::Target::open` decides).
//!
//! Cost bound: reading a process's maps costs ~50–200 µs, and most processes on a node never
//! use CUDA, so a process found not to map libcuda is re-checked with a growing interval
//! (2× each time, up to 60 s) — serving frameworks initialise CUDA some seconds after start,
//! and a new process is checked at the first scan after it appears. Per scan, the work is one
//! readdir of /proc plus the maps of new and due processes. Measured: BENCHMARKS.md.
//!
//! Pids are reused: what is remembered of a process (its back-off, how long it has waited for
//! its shim) is keyed by its pid *and* the inode number of its /proc entry, which readdir
//! gives at no cost. procfs gives a process's directory a new inode number when it is made,
//! so a new process on an old pid has another one; the old key held it back for up to 60 s
//! (a CUDA server on a pid a shell script had held went unwatched that long) and counted a
//! dead process's wait for its shim against the new one. A live process's number can change
//! only if its directory left the dentry cache: then it is looked at once more, early.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How long a process whose environment loads the shim is left alone until its journal
/// appears (see `Daemon::discover`): PyTorch maps libcuda at `import torch` and initialises
/// CUDA at first use, which can be minutes later in a server that loads its weights first.
pub const SHIM_GRACE: Duration = Duration::from_secs(120);

/// A process found not (yet) to be a CUDA process: when to look again, and the interval.
struct Later {
    ino: u64,
    when: Instant,
    interval: Duration,
}

#[derive(Default)]
pub struct Discovery {
    /// Processes found not (yet) to be CUDA processes, by pid.
    later: HashMap<u32, Later>,
    /// Processes waiting for their shim to create its journal: their /proc inode, since when.
    awaiting_shim: HashMap<u32, (u64, Instant)>,
    /// The pids in /proc at the last scan, with their directories' inode numbers.
    alive: HashMap<u32, u64>,
    pub last_scan: Duration,
    pub scans: u64,
}

impl Discovery {
    /// Pids worth trying now (new, or due again), skipping `attached` and ourselves.
    pub fn candidates(&mut self, attached: &dyn Fn(u32) -> bool) -> Vec<u32> {
        use std::os::unix::fs::DirEntryExt;
        let start = Instant::now();
        let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
        let pids = entries.filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((pid, e.ino()))
        });
        let out = self.candidates_in(pids, attached, start);
        self.scans += 1;
        self.last_scan = start.elapsed();
        out
    }

    /// `candidates` over the (pid, inode) pairs of a scan of /proc taken at `now`.
    fn candidates_in(
        &mut self,
        pids: impl Iterator<Item = (u32, u64)>,
        attached: &dyn Fn(u32) -> bool,
        now: Instant,
    ) -> Vec<u32> {
        let me = std::process::id();
        let mut out = Vec::new();
        let mut alive = std::mem::take(&mut self.alive);
        alive.clear();
        for (pid, ino) in pids {
            alive.insert(pid, ino);
            // Another process on a pid remembered: forget the old one's back-off and wait.
            if self.later.get(&pid).is_some_and(|l| l.ino != ino) {
                self.later.remove(&pid);
            }
            if self.awaiting_shim.get(&pid).is_some_and(|&(i, _)| i != ino) {
                self.awaiting_shim.remove(&pid);
            }
            if pid == me || attached(pid) {
                continue;
            }
            match self.later.get(&pid) {
                Some(l) if l.when > now => {}
                _ => out.push(pid),
            }
        }
        self.later.retain(|pid, _| alive.contains_key(pid));
        self.awaiting_shim.retain(|pid, _| alive.contains_key(pid));
        self.alive = alive;
        out
    }

    /// The inode number of `pid`'s /proc entry at the last scan (0: not seen).
    fn ino(&self, pid: u32) -> u64 {
        self.alive.get(&pid).copied().unwrap_or(0)
    }

    /// `pid` is not a CUDA process (yet): look again later, less often each time.
    pub fn not_now(&mut self, pid: u32, first_interval: Duration) {
        self.not_now_at(pid, first_interval, Instant::now());
    }

    fn not_now_at(&mut self, pid: u32, first_interval: Duration, now: Instant) {
        let interval = match self.later.get(&pid) {
            Some(l) => (l.interval * 2).min(MAX_BACKOFF),
            None => first_interval,
        };
        let ino = self.ino(pid);
        self.later.insert(
            pid,
            Later {
                ino,
                when: now + interval,
                interval,
            },
        );
    }

    /// Whether `pid` was in /proc at the last scan.
    pub fn alive(&self, pid: u32) -> bool {
        self.alive.contains_key(&pid)
    }

    pub fn forget(&mut self, pid: u32) {
        self.later.remove(&pid);
        self.awaiting_shim.remove(&pid);
    }

    /// `pid` expects the shim and has no journal yet: `Some(first)` (whether this is the first
    /// time) while `SHIM_GRACE` has not passed since it was first seen so, and it is looked at
    /// again at the next scan; `None` once it has (attach it anyway).
    pub fn await_shim(&mut self, pid: u32, scan_interval: Duration) -> Option<bool> {
        self.await_shim_at(pid, scan_interval, Instant::now())
    }

    fn await_shim_at(&mut self, pid: u32, scan_interval: Duration, now: Instant) -> Option<bool> {
        let first = !self.awaiting_shim.contains_key(&pid);
        let ino = self.ino(pid);
        let (_, since) = *self.awaiting_shim.entry(pid).or_insert((ino, now));
        if now.duration_since(since) >= SHIM_GRACE {
            return None;
        }
        let later = Later {
            ino,
            when: now + scan_interval,
            interval: scan_interval,
        };
        self.later.insert(pid, later);
        Some(first)
    }

    /// Processes waiting for a re-check.
    pub fn pending(&self) -> usize {
        self.later.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCAN: Duration = Duration::from_secs(1);
    const PID: u32 = 4_000_000;

    fn scan(d: &mut Discovery, ino: u64, now: Instant) -> Vec<u32> {
        d.candidates_in([(PID, ino)].into_iter(), &|_| false, now)
    }

    /// A process that backed off to 32 s, gone, its pid taken by another at once (between two
    /// scans): the new one is looked at the next scan and backs off from the start. On the
    /// pid-keyed back-off it waited out the old one's 32 s.
    #[test]
    fn a_new_process_on_a_pid_does_not_inherit_its_back_off() {
        let mut d = Discovery::default();
        let t0 = Instant::now();
        assert_eq!(scan(&mut d, 7, t0), [PID]);
        for _ in 0..5 {
            d.not_now_at(PID, SCAN, t0);
        }
        assert_eq!(d.later[&PID].interval, Duration::from_secs(16));
        let next = t0 + Duration::from_secs(1);
        assert!(
            scan(&mut d, 7, next).is_empty(),
            "the same process stays backed off"
        );
        assert_eq!(
            scan(&mut d, 8, next),
            [PID],
            "a new process is looked at now"
        );
        d.not_now_at(PID, SCAN, next);
        assert_eq!(d.later[&PID].interval, SCAN);
    }

    /// A process waiting for its shim, gone, its pid taken by another that also loads the
    /// shim: the new one gets its own grace, not what is left of the old one's.
    #[test]
    fn a_new_process_on_a_pid_waits_its_own_grace_for_its_shim() {
        let mut d = Discovery::default();
        let t0 = Instant::now();
        scan(&mut d, 7, t0);
        assert_eq!(d.await_shim_at(PID, SCAN, t0), Some(true));
        let late = t0 + SHIM_GRACE - Duration::from_secs(1);
        scan(&mut d, 7, late);
        assert_eq!(d.await_shim_at(PID, SCAN, late), Some(false));
        let after = late + Duration::from_secs(2);
        scan(&mut d, 8, after);
        assert_eq!(
            d.await_shim_at(PID, SCAN, after),
            Some(true),
            "a first wait, its own"
        );
    }

    /// The same process seen again keeps its wait: its grace runs out.
    #[test]
    fn the_same_process_runs_out_of_grace() {
        let mut d = Discovery::default();
        let t0 = Instant::now();
        scan(&mut d, 7, t0);
        assert_eq!(d.await_shim_at(PID, SCAN, t0), Some(true));
        let after = t0 + SHIM_GRACE;
        scan(&mut d, 7, after);
        assert_eq!(d.await_shim_at(PID, SCAN, after), None);
    }
}
