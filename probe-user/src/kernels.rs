//! Kernels in flight, from a process's shim journal: per stream, the oldest launched kernel
//! that has not completed (streams run in order, so it is the one the others wait behind),
//! when it can have started, and how many launches are queued behind it.
//!
//! CUPTI cannot say when a kernel *started* before it completes; the estimate is the later of
//! its launch and the end of the last completed kernel on the same stream
//! (../shared/design.md).

use std::collections::HashMap;

use probe_common::journal::{InflightSlot, RECORD_KERNEL_DONE, RingRecord};
use serde::Serialize;

use crate::journal::JournalView;

/// Follows one journal's ring across polls.
#[derive(Default)]
pub struct JournalCursor {
    next: u64,
    /// Latest GPU end time per CUPTI stream id.
    last_end: HashMap<u32, u64>,
    pub lost: u64,
    pub completed: u64,
}

/// The head of one stream's queue.
#[derive(Clone, Debug, Serialize)]
pub struct StreamHead {
    pub pid: u32,
    pub device: u32,
    /// `CUstream` as hex.
    pub stream: String,
    pub stream_id: u32,
    pub kernel: String,
    pub correlation: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub cluster: [u32; 3],
    /// Thread that launched it.
    pub tid: u32,
    pub launched_ms_ago: f64,
    /// Since max(launch, previous kernel's end on the stream): an estimate.
    pub running_ms: f64,
    pub queued_behind: usize,
}

impl JournalCursor {
    /// Consumes the ring since the last call; returns the completions seen.
    pub fn advance(&mut self, view: &JournalView) -> Vec<RingRecord> {
        let read = view.ring_since(self.next);
        self.next = read.next;
        self.lost += read.lost;
        let done: Vec<RingRecord> = read
            .records
            .into_iter()
            .filter(|r| r.kind == RECORD_KERNEL_DONE)
            .collect();
        for r in &done {
            let e = self.last_end.entry(r.stream_id).or_insert(0);
            *e = (*e).max(r.end_ns);
        }
        self.completed += done.len() as u64;
        done
    }

    /// The oldest in-flight kernel of every stream, longest running first.
    pub fn heads(&self, pid: u32, view: &JournalView, now_ns: u64) -> Vec<StreamHead> {
        let mut by_stream: HashMap<(u32, u64), Vec<InflightSlot>> = HashMap::new();
        for s in view.inflight() {
            by_stream.entry((s.device, s.stream)).or_default().push(s);
        }
        let mut heads: Vec<StreamHead> = by_stream
            .into_values()
            .filter_map(|mut q| {
                q.sort_by_key(|s| (s.launch_ns, s.correlation));
                let h = *q.first()?;
                let since = h
                    .launch_ns
                    .max(self.last_end.get(&h.stream_id).copied().unwrap_or(0));
                Some(StreamHead {
                    pid,
                    device: h.device,
                    stream: format!("{:#x}", h.stream),
                    stream_id: h.stream_id,
                    kernel: view.name(h.name_id).unwrap_or_else(|| "?".into()),
                    correlation: h.correlation,
                    grid: h.grid,
                    block: h.block,
                    cluster: h.cluster,
                    tid: h.tid,
                    launched_ms_ago: now_ns.saturating_sub(h.launch_ns) as f64 / 1e6,
                    running_ms: now_ns.saturating_sub(since) as f64 / 1e6,
                    queued_behind: q.len() - 1,
                })
            })
            .collect();
        heads.sort_by(|a, b| b.running_ms.total_cmp(&a.running_ms));
        heads
    }
}
