//! Kernels in flight, from a process's shim journal: per stream, the oldest launched kernel
//! that has not completed (streams run in order, so it is the one the others wait behind),
//! when it can have started, and how many launches are queued behind it.
//!
//! CUPTI cannot say when a kernel *started* before it completes; the estimate is the later of
//! its launch and the end of the last completed kernel on the same stream
//! (../shared/design.md).

use std::collections::HashMap;

use probe_common::journal::{
    ALL_STREAMS, InflightSlot, RECORD_KERNEL_DONE, RECORD_SYNCED, RingRecord,
};
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
    /// Highest completed correlation id per CUPTI stream id: streams run in order, so every
    /// launch before it on that stream is done even if its own record never came.
    done_through: HashMap<u32, u64>,
    /// Highest correlation id of a returned synchronize, per stream handle and context-wide.
    synced_through: HashMap<u64, u64>,
    synced_all: u64,
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
    /// `state` (stuck / suspect / running), `bound_ms`, `collective`: set by the verdict.
    #[serde(flatten)]
    pub judgement: Option<crate::kernel_verdict::KernelJudgement>,
}

impl JournalCursor {
    /// Consumes the ring since the last call; returns the completions seen.
    pub fn advance(&mut self, view: &JournalView) -> Vec<RingRecord> {
        let read = view.ring_since(self.next);
        self.next = read.next;
        self.lost += read.lost;
        for r in read.records.iter().filter(|r| r.kind == RECORD_SYNCED) {
            if r.stream == ALL_STREAMS {
                self.synced_all = self.synced_all.max(r.correlation);
            } else {
                let e = self.synced_through.entry(r.stream).or_insert(0);
                *e = (*e).max(r.correlation);
            }
        }
        let done: Vec<RingRecord> = read
            .records
            .into_iter()
            .filter(|r| r.kind == RECORD_KERNEL_DONE)
            .collect();
        for r in &done {
            let e = self.last_end.entry(r.stream_id).or_insert(0);
            *e = (*e).max(r.end_ns);
            let d = self.done_through.entry(r.stream_id).or_insert(0);
            *d = (*d).max(r.correlation);
        }
        self.completed += done.len() as u64;
        done
    }

    /// The oldest in-flight kernel of every stream, longest running first.
    pub fn heads(&self, pid: u32, view: &JournalView, now_ns: u64) -> Vec<StreamHead> {
        let mut by_stream: HashMap<(u32, u64), Vec<InflightSlot>> = HashMap::new();
        for s in view.inflight() {
            let retired = s.correlation <= self.synced_all
                || self
                    .synced_through
                    .get(&s.stream)
                    .is_some_and(|&c| s.correlation <= c)
                || self
                    .done_through
                    .get(&s.stream_id)
                    .is_some_and(|&c| s.correlation <= c);
            if !retired {
                by_stream.entry((s.device, s.stream)).or_default().push(s);
            }
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
                    judgement: None,
                })
            })
            .collect();
        heads.sort_by(|a, b| b.running_ms.total_cmp(&a.running_ms));
        heads
    }
}

#[cfg(test)]
mod tests {
    use std::ptr::NonNull;

    use cupti_shim::journal::{Completion, Launch, Writer};
    use probe_common::journal::Layout;

    use super::*;
    use crate::journal::OwnedJournal;

    const L: Layout = Layout {
        threads_cap: 4,
        inflight_cap: 64,
        ring_cap: 64,
        names_cap: 4,
    };

    fn launch(w: &Writer, corr: u64, stream: u64, name: u32) {
        w.launch(&Launch {
            correlation: corr,
            name_id: name,
            launch_ns: corr * 1_000,
            stream,
            stream_id: stream as u32,
            ..Launch::default()
        });
    }

    #[test]
    fn the_head_is_the_oldest_unretired_launch_and_later_evidence_retires_earlier_ones() {
        let mut mem = OwnedJournal::zeroed(L.total_size() as usize);
        // SAFETY: aligned, zeroed, sized; `mem` outlives the writer.
        let w = unsafe { Writer::create(NonNull::new(mem.as_mut_ptr()).unwrap(), L, 1, 0, 0) };
        let stuck = w.intern(b"stuck");
        let other = w.intern(b"other");
        // Stream 7: corr 1, 2 (its record never delivered), 3 completes; 4 stuck; 5, 6 queued.
        for c in 1..=6 {
            launch(&w, c, 7, if c == 4 { stuck } else { other });
        }
        w.complete(&Completion {
            correlation: 3,
            start_ns: 3_500,
            end_ns: 3_900,
            stream_id: 7,
            device: 0,
        });
        // Stream 9: corr 10, 11 retired by a synchronize of that stream returning.
        launch(&w, 10, 9, other);
        launch(&w, 11, 9, other);
        w.synced(12, 9, 12_000);
        let view = mem.view().unwrap();
        let mut cursor = JournalCursor::default();
        cursor.advance(&view);
        let heads = cursor.heads(1, &view, 10_000);
        assert_eq!(heads.len(), 1, "{heads:?}");
        let h = &heads[0];
        assert_eq!(
            (h.kernel.as_str(), h.correlation, h.queued_behind),
            ("stuck", 4, 2)
        );
        // Running since the previous kernel's end (3,900), not its own launch (4,000)? The later
        // of the two: 4,000.
        assert_eq!(h.running_ms, (10_000 - 4_000) as f64 / 1e6);
        // A context-wide synchronize retires everything launched before it.
        w.synced(100, probe_common::journal::ALL_STREAMS, 20_000);
        cursor.advance(&view);
        assert!(cursor.heads(1, &view, 30_000).is_empty());
    }
}
