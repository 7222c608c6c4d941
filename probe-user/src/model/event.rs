//! What a trace shows, in one shape whatever its source (eBPF rings, shim journals, the
//! model's current state, verdicts).

use std::{collections::HashMap, sync::Arc};

/// One thing that happened (or is still happening: `end_ns: None`).
#[derive(Clone, Debug, PartialEq)]
pub enum TraceEvent {
    /// A driver call on a host thread.
    Call(Call),
    /// A kernel launch recorded by the shim (the launch call's start; its end is not recorded).
    Launch(Launch),
    /// A kernel's execution on the GPU.
    Kernel(Kernel),
    /// A sampled value (in-flight kernels per stream, sched_yield rate per thread).
    Counter(Counter),
    /// The verdict changed.
    Verdict(VerdictMark),
    /// Journal records that never reached the trace (`collect::ring_pump`), where they were.
    Lost(LostRecords),
}

#[derive(Clone, Debug, PartialEq)]
pub struct LostRecords {
    pub pid: u32,
    pub ts_ns: u64,
    /// Overwritten in the journal's ring before they were read.
    pub overwritten: u64,
    /// Read while the reader's buffer was full (the trace writer fell behind).
    pub buffer_full: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub pid: u32,
    pub tid: u32,
    pub api: &'static str,
    pub start_ns: u64,
    /// None: still inside the call when the trace ends (drawn open, "never completed").
    pub end_ns: Option<u64>,
    pub stream: Option<u64>,
    pub failed: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub pid: u32,
    pub tid: u32,
    pub api: &'static str,
    pub ts_ns: u64,
    pub correlation: u64,
    pub stream: u64,
    pub kernel: Arc<str>,
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub pid: u32,
    pub device: u32,
    pub stream: u64,
    pub stream_id: u32,
    pub correlation: u64,
    pub kernel: Arc<str>,
    pub start_ns: u64,
    /// None: had not completed when the trace ended (the stuck kernel).
    pub end_ns: Option<u64>,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub cluster: [u32; 3],
    /// CUPTI's graph node id when it ran as a node of a graph launch.
    pub graph_node: u64,
    /// Open kernels: launches queued behind it on its stream.
    pub queued_behind: Option<usize>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Counter {
    pub pid: u32,
    /// Some(device): drawn on that GPU's track group, else on the host process.
    pub device: Option<u32>,
    pub name: String,
    pub ts_ns: u64,
    pub value: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct VerdictMark {
    pub pid: u32,
    pub ts_ns: u64,
    pub kind: &'static str,
    pub summary: String,
}

impl TraceEvent {
    /// When it began: what traces are ordered by.
    pub fn ts_ns(&self) -> u64 {
        match self {
            Self::Call(c) => c.start_ns,
            Self::Launch(l) => l.ts_ns,
            Self::Kernel(k) => k.start_ns,
            Self::Counter(c) => c.ts_ns,
            Self::Verdict(v) => v.ts_ns,
            Self::Lost(l) => l.ts_ns,
        }
    }

    pub fn pid(&self) -> u32 {
        match self {
            Self::Call(c) => c.pid,
            Self::Launch(l) => l.pid,
            Self::Kernel(k) => k.pid,
            Self::Counter(c) => c.pid,
            Self::Verdict(v) => v.pid,
            Self::Lost(l) => l.pid,
        }
    }
}

/// Process and thread names for track labels, kept by the caller from the model.
#[derive(Clone, Debug, Default)]
pub struct Names {
    pub processes: HashMap<u32, String>,
    pub threads: HashMap<(u32, u32), String>,
    /// Each process's (attach time, `names_version`) when last copied: a pid reused by a new
    /// process is another process.
    seen: HashMap<u32, (u64, u64)>,
}

impl Names {
    pub fn from_model(model: &crate::model::Model) -> Self {
        let mut n = Names::default();
        n.update(model);
        n
    }

    /// Adds what the model knows now (names of threads that exited are kept). Runs every
    /// second in the daemon: only processes whose threads were added or renamed since are
    /// looked at, and a name is copied only when new or changed (copying all of them every
    /// tick was 5% of the daemon's CPU at 64 processes of 61 threads).
    pub fn update(&mut self, model: &crate::model::Model) {
        fn keep<K: std::hash::Hash + Eq>(map: &mut HashMap<K, String>, key: K, name: &str) {
            match map.get_mut(&key) {
                Some(n) if n == name => {}
                Some(n) => name.clone_into(n),
                None => {
                    map.insert(key, name.to_owned());
                }
            }
        }
        self.seen.retain(|pid, _| model.procs.contains_key(pid));
        for (&pid, p) in &model.procs {
            let version = (p.attached_ns, p.names_version);
            if self.seen.insert(pid, version) == Some(version) {
                continue;
            }
            keep(&mut self.processes, pid, &p.target.comm);
            for (&tid, t) in &p.threads {
                if !t.name.is_empty() {
                    keep(&mut self.threads, (pid, tid), &t.name);
                }
            }
        }
    }
}

/// What is open right now, from the model: threads inside a driver call (as open calls) and
/// each stream's oldest unfinished kernel (as an open kernel from its estimated start).
pub fn open_now(
    model: &crate::model::Model,
    now_ns: u64,
    blocked_after_ns: u64,
) -> Vec<TraceEvent> {
    let mut out = Vec::new();
    for t in model.threads_in_calls(now_ns, blocked_after_ns) {
        let stream = t
            .stream
            .as_deref()
            .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok());
        out.push(TraceEvent::Call(Call {
            pid: t.pid,
            tid: t.tid,
            api: t.api,
            start_ns: now_ns.saturating_sub((t.in_call_ms * 1e6) as u64),
            end_ns: None,
            stream,
            failed: false,
        }));
    }
    for h in model.kernel_heads() {
        let stream = u64::from_str_radix(h.stream.trim_start_matches("0x"), 16).unwrap_or(0);
        out.push(TraceEvent::Kernel(Kernel {
            pid: h.pid,
            device: h.device,
            stream,
            stream_id: h.stream_id,
            correlation: h.correlation,
            kernel: Arc::from(h.kernel.as_str()),
            start_ns: now_ns.saturating_sub((h.running_ms * 1e6) as u64),
            end_ns: None,
            grid: h.grid,
            block: h.block,
            cluster: h.cluster,
            graph_node: 0,
            queued_behind: Some(h.queued_behind),
        }));
    }
    out
}
