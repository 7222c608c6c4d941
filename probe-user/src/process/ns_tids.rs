//! Thread ids as a target's own pid namespace numbers them, turned into the host's.
//!
//! The shim writes `gettid()` into the journal; in a container that is the namespace's
//! number (its first thread is 1), while eBPF, /proc and every other source wedgeprobe reads
//! use the host's. Unmapped, a containerised launcher blocked behind a wedge was a thread the
//! process did not have, and its report said `healthy` with the kernel stuck (two pid-1
//! workers sharing /dev/shm, tests/suite/shim_safety.rs). The map comes from `NSpid:` in each
//! thread's /proc status; it is read again when an unknown id shows up, at most every
//! `REFRESH_NS`, so a thread storm cannot make every poll walk /proc.

use std::collections::HashMap;

const REFRESH_NS: u64 = 200_000_000;

/// One process's namespace → host thread ids.
pub struct NsTids {
    pid: u32,
    /// `None`: the process shares our pid namespace (ids are the same).
    map: Option<HashMap<u32, u32>>,
    refreshed_ns: u64,
}

impl NsTids {
    pub fn new(pid: u32) -> Self {
        let nested = ns_pids(&format!("/proc/{pid}/status")).is_some_and(|v| v.len() > 1);
        let mut s = Self {
            pid,
            map: nested.then(HashMap::new),
            refreshed_ns: 0,
        };
        if nested {
            s.refresh(0);
        }
        s
    }

    /// The host's id of the thread the target's namespace calls `tid` (`tid` itself where the
    /// namespaces are the same, or where no live thread has it: one that exited).
    pub fn host(&mut self, tid: u32, now_ns: u64) -> u32 {
        let Some(map) = &self.map else { return tid };
        if let Some(&h) = map.get(&tid) {
            return h;
        }
        if tid != 0 && now_ns.saturating_sub(self.refreshed_ns) >= REFRESH_NS {
            self.refresh(now_ns);
        }
        self.map
            .as_ref()
            .and_then(|m| m.get(&tid).copied())
            .unwrap_or(tid)
    }

    fn refresh(&mut self, now_ns: u64) {
        self.refreshed_ns = now_ns;
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            return;
        };
        let mut map = HashMap::new();
        for e in dir.flatten() {
            let Some(host) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(&inner) = ns_pids(&e.path().join("status").to_string_lossy())
                .as_ref()
                .and_then(|v| v.last())
            {
                map.insert(inner, host);
            }
        }
        self.map = Some(map);
    }
}

/// The `NSpid:` ids of a /proc status file, outermost first.
pub fn ns_pids(status_path: &str) -> Option<Vec<u32>> {
    let s = std::fs::read_to_string(status_path).ok()?;
    parse_ns_pids(&s)
}

fn parse_ns_pids(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_whitespace().map(|f| f.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nspid_lines_parse_outermost_first() {
        let s = "Name:\tlauncher\nTgid:\t4242\nNSpid:\t4242\t1\nPPid:\t7\n";
        assert_eq!(parse_ns_pids(s), Some(vec![4242, 1]));
        assert_eq!(parse_ns_pids("NSpid:\t9\n"), Some(vec![9]));
        assert_eq!(parse_ns_pids("Name:\tx\n"), None);
        assert_eq!(parse_ns_pids("NSpid:\t9\tx\n"), None);
    }

    #[test]
    fn our_own_threads_map_to_themselves() {
        let me = std::process::id();
        let mut t = NsTids::new(me);
        assert_eq!(t.host(me, 1), me);
    }
}
