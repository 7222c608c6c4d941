//! Kernels in flight, from a process's shim journal: per stream, the oldest launched kernel
//! that has not completed (streams run in order, so it is the one the others wait behind),
//! when it can have started, and how many launches are queued behind it.
//!
//! CUPTI cannot say when a kernel *started* before it completes; the estimate is the later of
//! its launch and the end of the last completed kernel on the same stream (or, with marks,
//! when the shim saw the stream pass its last mark) — docs/architecture.md.
//!
//! With stream marks (the shim's default, `probe_common::journal::RECORD_MARKS`) a launch is
//! known done once a mark after it passed; the stuck kernel is the first unfinished one among
//! the launches from the head up to the first launch with a mark after it. When that is the
//! head alone the name is exact; otherwise the head lists the candidates in launch order and
//! names none of them (`StreamHead::exact`).

use std::collections::{HashMap, HashSet};

use probe_common::journal::{
    ALL_STREAMS, FLAG_MARKED, InflightSlot, RECORD_KERNEL_DONE, RECORD_LAUNCH, RECORD_NODE_DONE,
    RECORD_SYNCED, RingRecord, drops,
};

use crate::{
    journal::JournalView,
    model::kernels::{Candidate, GraphNodeView, GraphProgress, StreamHead, demangle},
};

/// Follows one journal's ring across polls.
#[derive(Default)]
pub struct JournalCursor {
    next: u64,
    /// The ring head when reading began: records below it are history (`RingRead`).
    window_from: u64,
    /// History records overwritten before the first read reached them (not lost).
    pub history_unread: u64,
    /// Latest GPU end time per CUPTI stream id.
    last_end: HashMap<u32, u64>,
    pub lost: u64,
    /// Records passed over by `advance_at_most` (not lost: deliberately not read).
    pub skipped: u64,
    pub completed: u64,
    /// Times a stream's mark was seen to advance (marks mode).
    pub marks_passed: u64,
    /// When the shim saw the newest of those marks pass (0: none).
    last_mark_at_ns: u64,
    /// Highest completed correlation id per CUPTI stream id: streams run in order, so every
    /// launch before it on that stream is done even if its own record never came.
    done_through: HashMap<u32, u64>,
    /// Highest correlation id of a returned synchronize, per stream handle and context-wide.
    synced_through: HashMap<u64, u64>,
    synced_all: u64,
    /// Graph launches in flight: the node ids (as CUPTI reported them) that completed.
    nodes_done: HashMap<u64, HashSet<u64>>,
    /// Stream marks by CUPTI stream id: (correlation through which the stream is done, when
    /// the shim saw it pass). Read from the journal at every `advance`.
    marks: HashMap<u32, (u64, u64)>,
    /// The journal records completions with marks (no per-kernel records, no node progress).
    marks_mode: bool,
    /// The heads of the last in-flight table scan (see `heads_every`), and when it was.
    scanned: Vec<(StreamHead, HeadTimes)>,
    scanned_at_ns: Option<u64>,
    /// Which streams' records were lost, and how many.
    pub stream_losses: crate::journal::stream_losses::StreamLosses,
    /// Per CUPTI stream id, what tells whether an unfinished launch could be there unseen
    /// (marks mode; `a_head_may_be_hiding`).
    watch: HashMap<u32, StreamWatch>,
    /// The mark slots claimed when all were last read, and how many reads there were.
    mark_slots: Vec<u32>,
    mark_reads: u64,
    /// The graph table as last read whole, and when (`whole_graph_table`).
    graph_table: Option<(std::sync::Arc<crate::journal::Graphs>, u64)>,
}

/// How long a whole read of the graph table serves (`whole_graph_table`): it changes only as
/// graphs are instantiated or updated, and a whole read of its 65,536 slots took 3.1 ms with
/// 2,000 execs of 12 nodes in it (release build, this machine; by key: 1.3 µs for 3 execs) —
/// every tick of a graph-replaying process, most of the daemon's time for that process.
const GRAPH_TABLE_KEPT_NS: u64 = 2_000_000_000;

/// One stream as the ring and its mark slot show it between in-flight table scans.
#[derive(Clone, Copy, Debug, Default)]
struct StreamWatch {
    /// The `CUstream` handle (synchronizes retire by handle).
    stream: u64,
    /// The newest launch read from the ring (correlation id; 0: none since the last scan
    /// that found the stream empty).
    newest: u64,
    /// The highest per-stream record number accounted for: read from the ring, or covered by
    /// a scan that found nothing unfinished on the stream.
    seen_seq: u64,
    /// Records the stream's mark slot says were written (0: no slot, uncounted).
    records: u64,
}

/// A stream that has not passed a mark for this long, with a launch not known done, is
/// looked for in the in-flight table (at most every `heads_every`'s period). The shim
/// publishes marks every 100 ms and marks an idle stream's last launch after 100 ms, so a
/// stream that is moving shows a newer mark well within this; a stuck one is found at most
/// this plus one period after its last mark, against verdict floors of seconds.
const HIDDEN_HEAD_NS: u64 = 500_000_000;

/// Every mark slot is read once in this many reads of the marks (else the known ones).
const MARK_SLOTS_FULL_EVERY: u64 = 4;

/// With nothing that could hide a head, the table is still scanned once in this many periods:
/// per-stream in-flight counts (metrics, the trace's counters) come from scans only.
const QUIET_SCAN_PERIODS: u64 = 10;

/// What a head's ages are computed from, kept between in-flight table scans.
#[derive(Clone, Copy, Debug)]
struct HeadTimes {
    stream: u64,
    launch_ns: u64,
    since_ns: u64,
}

/// One stream's unfinished launches, as one pass over the in-flight table sees them.
struct StreamQueue {
    /// (device, CUPTI stream id, `CUstream`).
    key: (u32, u32, u64),
    /// The oldest unfinished launch.
    head: InflightSlot,
    len: usize,
    /// The correlation id of the first launch with a mark after it (`u64::MAX`: none).
    first_marked: u64,
    /// The head is a graph launch whose graph marks show its replay begun and not finished:
    /// everything before it on the stream has run, so it is named exactly.
    graph_running: bool,
}

/// Candidates listed at most; `candidates_total` says how many there were.
const MAX_CANDIDATES: usize = 16;

/// Marks are published by the shim's flush thread every 100 ms. When its last sign of life
/// (the journal's heartbeat) is older than this, it is waiting somewhere — on the H200
/// (2026-12-01) event-mark queries waited behind a launch blocked in the full queue — and a
/// mark the GPU passed meanwhile may not be published: "a mark right after the head, not
/// passed" no longer proves the head is the stuck one. Ten periods: a loaded machine's
/// scheduling delay is not taken for it.
pub const MARKS_STALE_MS: f64 = 1_000.0;

impl JournalCursor {
    /// Consumes the ring since the last call; returns every record read (launches,
    /// completions, synchronizes), in ring order.
    pub fn advance(&mut self, view: &JournalView) -> Vec<RingRecord> {
        self.advance_at_most(view, u64::MAX)
    }

    /// `advance`, reading at most the newest `max` records (older ones are counted in
    /// `skipped`): the daemon's work per tick stays bounded however fast processes launch.
    /// The stream heads come from the in-flight table, not the ring, so skipping only thins
    /// the history and the flight recorder.
    pub fn advance_at_most(&mut self, view: &JournalView, max: u64) -> Vec<RingRecord> {
        let head = view.header_now_ring_head();
        if head.saturating_sub(self.next) > max {
            let from = head - max;
            self.skipped += from - self.next;
            self.next = from;
            self.stream_losses.skipped();
        }
        let read = view.ring_since(self.next, self.window_from);
        self.absorb(view, read)
    }

    /// A cursor for a journal opened now: it starts at the oldest record the ring still
    /// holds. What the ring overwrote before wedgeprobe attached was never wedgeprobe's to
    /// read; counted as `lost` it made every report of a process that had launched for a
    /// while say records were lost.
    pub fn starting_at(view: &JournalView) -> Self {
        let cap = u64::from(view.layout().ring_cap);
        let head = view.header_now_ring_head();
        let next = head.saturating_sub(cap);
        // After the head: every record numbered above these counts is at or after it.
        let counts = view.stream_counts();
        Self {
            next,
            window_from: head,
            stream_losses: crate::journal::stream_losses::StreamLosses::after(&counts),
            ..Self::default()
        }
    }

    /// Where the next read of the ring starts (a `RingPump` taking over starts here).
    pub fn next_index(&self) -> u64 {
        self.next
    }

    /// Where the reader's window begins (records below are history; a `RingPump` needs it).
    pub fn window_from(&self) -> u64 {
        self.window_from
    }

    /// Takes in what was read of the ring (by `advance_at_most`, or by a `RingPump` on its
    /// own thread): what it proves done, marks, losses. Returns the records.
    pub fn absorb(
        &mut self,
        view: &JournalView,
        read: crate::journal::RingRead,
    ) -> Vec<RingRecord> {
        self.next = read.next;
        self.lost += read.lost;
        self.history_unread += read.history_unread;
        self.stream_losses.note_all(&read.records);
        // Per run of one stream's records, one lookup.
        for run in read.records.chunk_by(|a, b| a.stream_id == b.stream_id) {
            let mut launches = run.iter().filter(|r| r.kind == RECORD_LAUNCH).peekable();
            let Some(first) = launches.peek() else {
                continue;
            };
            let w = self.watch.entry(first.stream_id).or_default();
            for r in launches {
                w.stream = r.stream;
                w.newest = w.newest.max(r.correlation);
                w.seen_seq = w.seen_seq.max(r.stream_seq);
            }
        }
        for r in read.records.iter().filter(|r| r.kind == RECORD_SYNCED) {
            if r.stream == ALL_STREAMS {
                self.synced_all = self.synced_all.max(r.correlation);
            } else {
                let e = self.synced_through.entry(r.stream).or_insert(0);
                *e = (*e).max(r.correlation);
            }
        }
        for r in read.records.iter().filter(|r| is_completion(r)) {
            let e = self.last_end.entry(r.stream_id).or_insert(0);
            *e = (*e).max(r.end_ns);
            // A graph node's completion proves everything launched before its graph launch
            // done, not the graph launch itself (its other nodes may still run).
            let through = if r.kind == RECORD_NODE_DONE {
                self.nodes_done
                    .entry(r.correlation)
                    .or_default()
                    .insert(r.graph_node);
                r.correlation.saturating_sub(1)
            } else {
                r.correlation
            };
            let d = self.done_through.entry(r.stream_id).or_insert(0);
            *d = (*d).max(through);
        }
        self.completed += read.records.iter().filter(|r| is_completion(r)).count() as u64;
        let mode = view.record_mode();
        self.marks_mode = mode.marks;
        if mode.marks {
            // The known streams' slots every time, all 1,024 once in `MARK_SLOTS_FULL_EVERY`
            // reads or when a launch names a stream not known yet (at 64 processes, reading
            // every slot every tick was 4% of the daemon's CPU).
            let new_stream = read.records.iter().any(|r| {
                r.kind == RECORD_LAUNCH
                    && r.stream_seq != 0
                    && !self.marks.contains_key(&r.stream_id)
            });
            self.mark_reads += 1;
            let marks = if new_stream || self.mark_reads % MARK_SLOTS_FULL_EVERY == 1 {
                let all = view.marks();
                self.mark_slots = all.iter().map(|m| m.index).collect();
                all
            } else {
                view.marks_at(&self.mark_slots)
            };
            for m in marks {
                let w = self.watch.entry(m.stream_id).or_default();
                w.stream = m.stream;
                w.records = m.records;
                let e = self.marks.entry(m.stream_id).or_insert((0, 0));
                if m.done > e.0 {
                    *e = (m.done, m.done_at_ns);
                    self.marks_passed += 1;
                    self.last_mark_at_ns = self.last_mark_at_ns.max(m.done_at_ns);
                }
            }
        }
        read.records
    }

    /// When the shim saw the newest advancing mark pass (0: none seen): a sign of GPU work.
    pub fn last_mark_at_ns(&self) -> u64 {
        self.last_mark_at_ns
    }

    /// The oldest in-flight kernel of every stream, longest running first.
    pub fn heads(&mut self, pid: u32, view: &JournalView, now_ns: u64) -> Vec<StreamHead> {
        self.heads_every(pid, view, now_ns, 0)
    }

    /// `heads`, scanning the in-flight table at most every `every_ns` (0: every call). In
    /// between, the last scan's heads are kept with their ages brought up to `now_ns`, and
    /// dropped once later evidence retires them: a stream whose head completed has no head
    /// until the next scan, while a stuck head stays, aging. The scan reads 8,192 slots that
    /// the target keeps writing — on the H200 with 8 launch-bound PyTorch processes it was
    /// ~390 µs per process, two thirds of the daemon's tick.
    ///
    /// With marks, a period's scan is skipped when nothing could be hiding a head: every
    /// stream passed a mark in the last `HIDDEN_HEAD_NS` or has no launch not known done
    /// (`a_head_may_be_hiding`), and no kept head is that old; then the table is scanned once
    /// in `QUIET_SCAN_PERIODS` periods. In marks mode the table's slots are not cleared at
    /// completion (a passed mark retires them), so a scan reads every slot a busy process
    /// ever filled: at 64 simulated processes it was 38% of the daemon's CPU (BENCHMARKS.md).
    pub fn heads_every(
        &mut self,
        pid: u32,
        view: &JournalView,
        now_ns: u64,
        every_ns: u64,
    ) -> Vec<StreamHead> {
        let scanned = std::mem::take(&mut self.scanned);
        self.scanned = scanned
            .into_iter()
            .filter(|(h, t)| !self.retired(h.correlation, t.stream, h.stream_id))
            .map(|(mut h, t)| {
                h.launched_ms_ago = now_ns.saturating_sub(t.launch_ns) as f64 / 1e6;
                h.running_ms = now_ns.saturating_sub(t.since_ns) as f64 / 1e6;
                (h, t)
            })
            .collect();
        let due = match self.scanned_at_ns {
            None => true,
            Some(at) => {
                let since = now_ns.saturating_sub(at);
                since >= every_ns
                    && (every_ns == 0
                        || !self.marks_mode
                        || since >= every_ns.saturating_mul(QUIET_SCAN_PERIODS)
                        || self
                            .scanned
                            .iter()
                            .any(|(_, t)| now_ns.saturating_sub(t.since_ns) >= HIDDEN_HEAD_NS)
                        || self.a_head_may_be_hiding(view, now_ns))
            }
        };
        if due {
            self.scanned = self.scan_heads(pid, view, now_ns);
            self.scanned_at_ns = Some(now_ns);
            // What the scan found nothing unfinished on is accounted for up to the records
            // its slot had counted before the scan (read with the marks, before the table).
            let headed: HashSet<u32> = self.scanned.iter().map(|(h, _)| h.stream_id).collect();
            self.watch.retain(|id, w| {
                if headed.contains(id) {
                    return true;
                }
                w.seen_seq = w.seen_seq.max(w.records);
                w.newest = 0;
                // A stream with no mark slot has nothing left to watch (its id may never
                // come back: streams are created and destroyed).
                w.records != 0
            });
        }
        let mut heads: Vec<StreamHead> = self.scanned.iter().map(|(h, _)| h.clone()).collect();
        heads.sort_by(|a, b| b.running_ms.total_cmp(&a.running_ms));
        heads
    }

    /// Whether the in-flight table could hold an unfinished launch older than
    /// `HIDDEN_HEAD_NS` that the last scan did not see: a stream that has not passed a mark
    /// for that long with a launch read from the ring and not known done, or with records its
    /// slot counted that were not read (skipped by the daemon's bounded reads, lost, or written
    /// since the read). A stream without a mark slot is invisible when its records are not
    /// read: any such stream keeps the period's scans on.
    fn a_head_may_be_hiding(&self, view: &JournalView, now_ns: u64) -> bool {
        if view.header_now().drops[drops::MARKS_FULL] != 0 {
            return true;
        }
        self.watch.iter().any(|(&id, w)| {
            let passed_at = self.marks.get(&id).map_or(0, |m| m.1);
            now_ns.saturating_sub(passed_at) >= HIDDEN_HEAD_NS
                && (w.records > w.seen_seq
                    || (w.newest != 0 && !self.retired(w.newest, w.stream, id)))
        })
    }

    /// When the in-flight table was last scanned (see `heads_every`).
    pub fn scanned_at_ns(&self) -> Option<u64> {
        self.scanned_at_ns
    }

    /// Whether later evidence says this launch is done: a synchronize that returned after
    /// it, or a later completion on its (in-order) stream.
    fn retired(&self, correlation: u64, stream: u64, stream_id: u32) -> bool {
        correlation <= self.synced_all
            || self
                .marks
                .get(&stream_id)
                .is_some_and(|&(done, _)| correlation <= done)
            || self
                .synced_through
                .get(&stream)
                .is_some_and(|&c| correlation <= c)
            || self
                .done_through
                .get(&stream_id)
                .is_some_and(|&c| correlation <= c)
    }

    /// The whole graph table, read again when the last read is older than
    /// `GRAPH_TABLE_KEPT_NS` or lacks one of `execs` (a graph instantiated since). Where node
    /// completions carry CUPTI's node ids, or the shim recorded its graphs from CUPTI's
    /// callbacks, nodes cannot be looked up by key.
    fn whole_graph_table(
        &mut self,
        view: &JournalView,
        execs: &[u32],
        now_ns: u64,
    ) -> std::sync::Arc<crate::journal::Graphs> {
        if let Some((g, at)) = &self.graph_table
            && now_ns.saturating_sub(*at) < GRAPH_TABLE_KEPT_NS
            && execs.iter().all(|&e| g.source_of(e).is_some())
        {
            return g.clone();
        }
        let g = std::sync::Arc::new(view.graphs());
        self.graph_table = Some((g.clone(), now_ns));
        g
    }

    fn scan_heads(
        &mut self,
        pid: u32,
        view: &JournalView,
        now_ns: u64,
    ) -> Vec<(StreamHead, HeadTimes)> {
        // Done by the cheap evidence (a context-wide synchronize, the stream's marks or
        // completions), told from two words of a slot; the rest is checked in full below.
        let mut through: Vec<(u32, u64)> = self
            .marks
            .iter()
            .map(|(&id, &(done, _))| (id, done))
            .chain(self.done_through.iter().map(|(&id, &c)| (id, c)))
            .collect();
        through.sort_unstable();
        let synced_all = self.synced_all;
        let inflight = view.inflight_unless(|correlation, stream_id| {
            // Sorted: the last entry of the stream's run holds its highest evidence.
            let end = through.partition_point(|&(id, _)| id <= stream_id);
            correlation <= synced_all
                || (end > 0 && through[end - 1].0 == stream_id && correlation <= through[end - 1].1)
        });
        // Node completions are kept only while their graph launch is in flight.
        if !self.nodes_done.is_empty() {
            let live: HashSet<u64> = inflight
                .iter()
                .filter(|s| s.graph_id != 0)
                .map(|s| s.correlation)
                .collect();
            self.nodes_done.retain(|c, _| live.contains(c));
        }
        // The execs of the graph launches in flight, looked up by key (the table holds 65,536
        // slots: reading it whole every tick of a graph-replaying server was ~9 MiB); whole
        // when node completions are kept (their CUPTI node ids may name clones) or an exec's
        // nodes were recorded from CUPTI's callbacks.
        let graphs = inflight.iter().any(|s| s.graph_id != 0).then(|| {
            let execs = graph_execs(&inflight);
            match self.nodes_done.is_empty().then(|| view.graphs_of(&execs)) {
                Some(Some(g)) => std::sync::Arc::new(g),
                _ => self.whole_graph_table(view, &execs, now_ns),
            }
        });
        // One pass, per stream: its oldest unretired launch and how many there are. Sorting
        // each stream's queue was 30% of the daemon's CPU on the H200 (8 PyTorch processes,
        // ~1,000 launches in flight each); a process has a handful of streams, so a linear
        // search beats hashing every slot.
        // Per stream also the first launch with a mark after it (marks mode): the window the
        // stuck kernel is in ends there.
        let mut streams: Vec<StreamQueue> = Vec::new();
        let live: Vec<InflightSlot> = inflight
            .into_iter()
            .filter(|s| !self.retired(s.correlation, s.stream, s.stream_id))
            .collect();
        for s in &live {
            let s = *s;
            let key = (s.device, s.stream_id, s.stream);
            let marked = if s.flags & FLAG_MARKED != 0 {
                s.correlation
            } else {
                u64::MAX
            };
            match streams.iter_mut().find(|q| q.key == key) {
                Some(q) => {
                    q.len += 1;
                    q.first_marked = q.first_marked.min(marked);
                    if (s.launch_ns, s.correlation) < (q.head.launch_ns, q.head.correlation) {
                        q.head = s;
                    }
                }
                None => streams.push(StreamQueue {
                    key,
                    head: s,
                    len: 1,
                    first_marked: marked,
                    graph_running: false,
                }),
            }
        }
        // Graph marks: a stream's earliest graph launch whose replay has begun and not
        // finished is what the stream is running — the launches before it have completed,
        // whatever the stream marks could prove.
        // Each exec's words are read once a scan (a stream can hold ~1,000 queued replays).
        if self.marks_mode
            && let Some(g) = graphs.as_deref()
            && !g.exec_marks.is_empty()
        {
            let mut execs = graph_execs(&live);
            execs.retain(|&e| started_replay(view, g, e).is_some());
            for q in &mut streams {
                let running = live
                    .iter()
                    .filter(|s| (s.device, s.stream_id, s.stream) == q.key && s.graph_id != 0)
                    .filter(|s| execs.binary_search(&s.graph_id).is_ok())
                    .min_by_key(|s| s.correlation);
                if let Some(r) = running {
                    q.len = live
                        .iter()
                        .filter(|s| {
                            (s.device, s.stream_id, s.stream) == q.key
                                && s.correlation >= r.correlation
                        })
                        .count();
                    q.head = *r;
                    q.graph_running = true;
                }
            }
        }
        let marks_mode = self.marks_mode;
        let heartbeat = view.heartbeat_ns();
        let marks_stale_ms = (marks_mode && heartbeat > 0)
            .then(|| now_ns.saturating_sub(heartbeat) as f64 / 1e6)
            .filter(|&age| age > MARKS_STALE_MS);
        streams
            .into_iter()
            .map(|q| {
                let StreamQueue {
                    key,
                    head: h,
                    len: n,
                    first_marked,
                    graph_running,
                } = q;
                let since = h
                    .launch_ns
                    .max(self.last_end.get(&h.stream_id).copied().unwrap_or(0))
                    .max(self.marks.get(&h.stream_id).map_or(0, |m| m.1));
                let mut kernel = view.name(h.name_id).unwrap_or_else(|| "?".into());
                // Exact: per-kernel records, or the head has a mark right after it (and the
                // marks are current), or nothing else is unfinished on its stream.
                let exact = !marks_mode
                    || (h.flags & FLAG_MARKED != 0 && marks_stale_ms.is_none())
                    || n == 1
                    || graph_running;
                // Stale marks: a later mark may have passed unseen, so the window runs to the
                // stream's newest launch.
                let first_marked = if marks_stale_ms.is_some() {
                    u64::MAX
                } else {
                    first_marked
                };
                let mut candidates = Vec::new();
                let mut candidates_total = 0;
                if !exact {
                    let mut window: Vec<&InflightSlot> = live
                        .iter()
                        .filter(|s| {
                            (s.device, s.stream_id, s.stream) == key
                                && s.correlation <= first_marked
                        })
                        .collect();
                    window.sort_by_key(|s| s.correlation);
                    candidates_total = window.len();
                    candidates = window
                        .iter()
                        .take(MAX_CANDIDATES)
                        .map(|s| {
                            let name = if s.graph_id != 0 {
                                "(graph launch)".to_string()
                            } else {
                                view.name(s.name_id).unwrap_or_else(|| "?".into())
                            };
                            Candidate {
                                kernel_demangled: demangle(&name),
                                kernel: name,
                                correlation: s.correlation,
                                grid: s.grid,
                                block: s.block,
                                launched_ms_ago: now_ns.saturating_sub(s.launch_ns) as f64 / 1e6,
                                graph_exec: s.graph_id,
                            }
                        })
                        .collect();
                    kernel = format!("(one of {candidates_total} kernels)");
                }
                let graph = (exact && h.graph_id != 0).then(|| {
                    self.graph_progress(view, graphs.as_deref(), h.graph_id, h.correlation, now_ns)
                });
                let times = HeadTimes {
                    stream: h.stream,
                    launch_ns: h.launch_ns,
                    since_ns: since,
                };
                let (grid, block, cluster) = if exact {
                    (h.grid, h.block, h.cluster)
                } else {
                    ([0; 3], [0; 3], [0; 3])
                };
                let head = StreamHead {
                    pid,
                    device: h.device,
                    stream: format!("{:#x}", h.stream),
                    stream_id: h.stream_id,
                    kernel_demangled: if exact { demangle(&kernel) } else { None },
                    kernel,
                    correlation: h.correlation,
                    grid,
                    block,
                    cluster,
                    tid: h.tid,
                    launched_ms_ago: now_ns.saturating_sub(h.launch_ns) as f64 / 1e6,
                    running_ms: now_ns.saturating_sub(since) as f64 / 1e6,
                    queued_behind: n - 1,
                    graph,
                    exact,
                    candidates,
                    candidates_total,
                    marks_stale_ms: (!exact).then_some(marks_stale_ms).flatten(),
                    judgement: None,
                };
                (head, times)
            })
            .collect()
    }

    fn graph_progress(
        &self,
        view: &JournalView,
        graphs: Option<&crate::journal::Graphs>,
        exec_id: u32,
        correlation: u64,
        now_ns: u64,
    ) -> GraphProgress {
        if self.marks_mode
            && let Some(p) = graphs.and_then(|g| marks_progress(view, g, exec_id, now_ns))
        {
            return p;
        }
        let graph_id = graphs.and_then(|g| g.source_of(exec_id));
        let done: HashSet<u64> = self
            .nodes_done
            .get(&correlation)
            .map(|ids| {
                ids.iter()
                    .flat_map(|&id| [id, graphs.map_or(id, |g| g.origin(id))])
                    .collect()
            })
            .unwrap_or_default();
        let nodes: Vec<_> = match (graphs, graph_id) {
            (Some(g), Some(gid)) => g.kernel_nodes(gid).copied().collect(),
            _ => Vec::new(),
        };
        let node_progress = !self.marks_mode;
        let not_completed: Vec<GraphNodeView> = nodes
            .iter()
            .filter(|n| !done.contains(&n.id))
            .map(|n| node_view(view, n))
            .collect();
        GraphProgress {
            exec_id,
            graph_id,
            kernel_nodes: nodes.len(),
            completed: nodes.len() - not_completed.len(),
            not_completed,
            node_progress,
            marks: None,
        }
    }
}

/// The executable graphs these launches replay, each once, in id order.
fn graph_execs(launches: &[InflightSlot]) -> Vec<u32> {
    let mut execs: Vec<u32> = launches
        .iter()
        .filter(|s| s.graph_id != 0)
        .map(|s| s.graph_id)
        .collect();
    execs.sort_unstable();
    execs.dedup();
    execs
}

fn node_view(view: &JournalView, n: &crate::journal::GraphNode) -> GraphNodeView {
    let kernel = view.name(n.name_id).unwrap_or_else(|| "?".into());
    GraphNodeView {
        node_id: n.id,
        kernel_demangled: demangle(&kernel),
        kernel,
        position: n.position,
        grid: n.grid,
        block: n.block,
    }
}

/// Exec `exec_id`'s graph mark words when a replay of it has begun and not finished (a word
/// still 0 after the replay's reset); `None` when it carries no marks or no replay is
/// under way (every word 1: its last replay's, or the value words start at).
fn started_replay(
    view: &JournalView,
    graphs: &crate::journal::Graphs,
    exec_id: u32,
) -> Option<(crate::journal::ExecMarks, Vec<u32>)> {
    let m = graphs.marks_of(exec_id)?;
    let words = view.graph_mark_words(m.first, m.words)?;
    words.contains(&0).then_some((m, words))
}

/// A begun replay's progress by its graph marks: per branch, the kernel nodes known done and
/// the group of the first not known done (`GraphMarkProgress`).
fn marks_progress(
    view: &JournalView,
    graphs: &crate::journal::Graphs,
    exec_id: u32,
    now_ns: u64,
) -> Option<GraphProgress> {
    let (m, words) = started_replay(view, graphs, exec_id)?;
    let graph_id = graphs.source_of(exec_id)?;
    let mut nodes: Vec<&crate::journal::GraphNode> = graphs
        .kernel_nodes(graph_id)
        .filter(|n| n.position != 0)
        .collect();
    nodes.sort_by_key(|n| n.position);
    let done = |n: &crate::journal::GraphNode| {
        n.mark != 0 && words.get(n.mark as usize - 1).is_some_and(|&w| w != 0)
    };
    let mut kernels_per_mark = 1;
    let mut branches: Vec<crate::model::kernels::BranchProgress> = Vec::new();
    for b in 0..m.branches.min(4096) {
        let of_branch: Vec<_> = nodes.iter().filter(|n| n.branch == b).copied().collect();
        for n in &of_branch {
            let group = of_branch.iter().filter(|o| o.mark == n.mark).count();
            kernels_per_mark = kernels_per_mark.max(group);
        }
        let Some(first) = of_branch.iter().find(|n| !done(n)) else {
            continue;
        };
        let candidates: Vec<GraphNodeView> = of_branch
            .iter()
            .filter(|n| n.mark == first.mark)
            .map(|n| node_view(view, n))
            .collect();
        branches.push(crate::model::kernels::BranchProgress {
            branch: b,
            kernel_nodes: of_branch.len(),
            done: of_branch.iter().filter(|n| done(n)).count(),
            exact: candidates.len() == 1,
            candidates,
        });
    }
    let not_completed: Vec<GraphNodeView> = nodes
        .iter()
        .filter(|n| !done(n))
        .map(|n| node_view(view, n))
        .collect();
    Some(GraphProgress {
        exec_id,
        graph_id: Some(graph_id),
        kernel_nodes: nodes.len(),
        completed: nodes.len() - not_completed.len(),
        not_completed,
        node_progress: true,
        marks: Some(crate::model::kernels::GraphMarkProgress {
            branches,
            kernels_per_mark,
            last_progress_ms_ago: (m.since_ns != 0)
                .then(|| now_ns.saturating_sub(m.since_ns) as f64 / 1e6),
        }),
    })
}

/// A kernel (or graph node) completion record.
pub fn is_completion(r: &RingRecord) -> bool {
    r.kind == RECORD_KERNEL_DONE || r.kind == RECORD_NODE_DONE
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
        graphs_cap: 8,
        marks_cap: 4,
    };

    /// A journal of layout `L` and its writer (the journal outlives the writer's use).
    fn journal() -> (OwnedJournal, Writer) {
        let mut mem = OwnedJournal::zeroed(L.total_size() as usize);
        // SAFETY: aligned, zeroed, sized; the caller keeps `mem` alive while it writes.
        let w = unsafe { Writer::create(NonNull::new(mem.as_mut_ptr()).unwrap(), L, 1, 0, 0) };
        (mem, w)
    }

    fn launch(w: &Writer, corr: u64, stream: u64, name: u32) {
        w.launch(
            &Launch {
                correlation: corr,
                name_id: name,
                launch_ns: corr * 1_000,
                stream,
                stream_id: stream as u32,
                ..Launch::default()
            },
            None,
        );
    }

    #[test]
    fn the_head_is_the_oldest_unretired_launch_and_later_evidence_retires_earlier_ones() {
        let (mem, w) = journal();
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
            graph_node: 0,
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

    #[test]
    fn between_scans_heads_age_and_retire_but_new_ones_wait_for_the_next_scan() {
        let (mem, w) = journal();
        let (stuck, other) = (w.intern(b"stuck"), w.intern(b"other"));
        launch(&w, 1, 7, stuck); // stream 7: never completes
        launch(&w, 2, 9, other); // stream 9: completes between scans
        let view = mem.view().unwrap();
        let mut cursor = JournalCursor::default();
        const EVERY: u64 = 1_000_000;
        cursor.advance(&view);
        assert_eq!(cursor.heads_every(1, &view, 10_000, EVERY).len(), 2);
        w.complete(&Completion {
            correlation: 2,
            start_ns: 2_500,
            end_ns: 3_000,
            stream_id: 9,
            device: 0,
            graph_node: 0,
        });
        launch(&w, 3, 9, other); // behind it on stream 9: found by the next scan only
        cursor.advance(&view);
        let between = cursor.heads_every(1, &view, 500_000, EVERY);
        assert_eq!(between.len(), 1, "{between:?}");
        assert_eq!(between[0].kernel, "stuck");
        assert_eq!(between[0].running_ms, (500_000 - 1_000) as f64 / 1e6);
        let rescanned = cursor.heads_every(1, &view, 1_010_000, EVERY);
        let mut got: Vec<(&str, u64)> = rescanned
            .iter()
            .map(|h| (h.kernel.as_str(), h.correlation))
            .collect();
        got.sort();
        assert_eq!(got, [("other", 3), ("stuck", 1)]);
    }

    /// With marks, the daemon's once-a-period scan of the in-flight table is made only when
    /// something could hide a head there: a busy healthy stream is rescanned once in
    /// `QUIET_SCAN_PERIODS`, a stream that stops passing marks with a launch after its last
    /// one is scanned within a period, and so is one whose launches the reader skipped.
    #[test]
    fn with_marks_the_table_is_scanned_when_a_stream_stops_passing_marks_not_every_period() {
        const S: u64 = 1_000_000_000;
        let (mem, w) = journal();
        w.set_record_mode(probe_common::journal::RECORD_MARKS, 8, 100);
        let (a, stuck) = (w.intern(b"a"), w.intern(b"stuck"));
        let slot = w.mark_slot(7 + 1, 0, 7).unwrap();
        let on = |corr: u64, name: u32, at: u64| {
            w.launch(
                &Launch {
                    correlation: corr,
                    name_id: name,
                    launch_ns: at,
                    stream: 7,
                    stream_id: 7,
                    mark: slot + 1,
                    ..Launch::default()
                },
                Some(slot),
            );
        };
        let view = mem.view().unwrap();
        let mut cursor = JournalCursor::default();
        let mut corr = 0;
        let mut scans = Vec::new();
        // Eleven periods of a busy stream passing its marks.
        for tick in 0..44u64 {
            let now = S + tick * S / 4;
            for _ in 0..20 {
                corr += 1;
                on(corr, a, now - 1_000);
            }
            w.mark_progress(slot, corr - 5); // the last few still in flight
            w.publish_marks(now - 100_000_000);
            cursor.advance(&view);
            cursor.heads_every(1, &view, now, S);
            if scans.last() != cursor.scanned_at_ns().as_ref() {
                scans.extend(cursor.scanned_at_ns());
            }
        }
        // The first scan, then one at the tenth period: not one each period.
        assert_eq!(scans, [S, S + 10 * S], "one scan in ten periods");
        // The kernel after the last passed mark never completes; the stream stops there.
        let last_pass = S + 43 * S / 4 - 100_000_000;
        corr += 1;
        let stuck_corr = corr;
        on(stuck_corr, stuck, last_pass + 1_000);
        w.mark_progress(slot, stuck_corr - 1);
        w.publish_marks(last_pass + 50_000_000);
        let mut found = None;
        for tick in 44..64u64 {
            let now = S + tick * S / 4;
            cursor.advance(&view);
            let heads = cursor.heads_every(1, &view, now, S);
            if let Some(h) = heads.iter().find(|h| h.correlation == stuck_corr) {
                found = Some((now, h.running_ms));
                break;
            }
        }
        let (at, running_ms) = found.expect("the stuck launch is found");
        assert!(
            at <= last_pass + 50_000_000 + HIDDEN_HEAD_NS + S,
            "found {} ms after its stream's last mark",
            (at - last_pass) / 1_000_000
        );
        assert_eq!(running_ms, (at - (last_pass + 50_000_000)) as f64 / 1e6);

        // Skipped, not read: a launch on a quiet stream the reader never saw is looked for.
        let (mem, w) = journal();
        w.set_record_mode(probe_common::journal::RECORD_MARKS, 8, 100);
        let name = w.intern(b"unread");
        let slot = w.mark_slot(7 + 1, 0, 7).unwrap();
        let view = mem.view().unwrap();
        let mut cursor = JournalCursor::default();
        cursor.advance(&view);
        assert!(cursor.heads_every(1, &view, S, S).is_empty());
        w.launch(
            &Launch {
                correlation: 1,
                name_id: name,
                launch_ns: S + 1_000,
                stream: 7,
                stream_id: 7,
                mark: slot + 1,
                ..Launch::default()
            },
            Some(slot),
        );
        cursor.advance_at_most(&view, 0);
        let heads = cursor.heads_every(1, &view, 2 * S + 1, S);
        assert_eq!(heads.len(), 1, "{heads:?}");
        assert_eq!(heads[0].kernel, "unread");
    }

    /// Read whole (node ids from CUPTI's callbacks), the graph table is read again only when
    /// an exec in flight is not in the last read, or that read is 2 s old.
    #[test]
    fn the_whole_graph_table_is_read_again_for_a_new_exec_or_after_two_seconds() {
        let (mem, w) = journal();
        let name = w.intern(b"_Z1kv");
        w.graph_kernel_node(11, 0, 5, name);
        w.graph_exec(9, 5);
        let view = mem.view().unwrap();
        let mut c = JournalCursor::default();
        let first = c.whole_graph_table(&view, &[9], 1_000);
        assert_eq!(first.source_of(9), Some(5));
        w.graph_kernel_node(21, 0, 6, name);
        w.graph_exec(10, 6);
        let kept = c.whole_graph_table(&view, &[9], 2_000);
        assert!(std::sync::Arc::ptr_eq(&first, &kept));
        assert_eq!(kept.source_of(10), None);
        let fresh = c.whole_graph_table(&view, &[9, 10], 3_000);
        assert_eq!(fresh.source_of(10), Some(6));
        let again = c.whole_graph_table(&view, &[9, 10], 4_000);
        assert!(std::sync::Arc::ptr_eq(&fresh, &again));
        let later = c.whole_graph_table(&view, &[9, 10], 3_000 + GRAPH_TABLE_KEPT_NS);
        assert!(!std::sync::Arc::ptr_eq(&fresh, &later));
    }

    #[test]
    fn a_stuck_graph_launch_names_its_first_kernel_node_not_completed() {
        let (mem, w) = journal();
        let (pre, mid, post) = (
            w.intern(b"_Z3prev"),
            w.intern(b"_Z6middlePVi"),
            w.intern(b"_Z4postv"),
        );
        // Graph 5 has kernel nodes 11, 12, 13; instantiation clones them into 21, 22, 23.
        for (node, name) in [(11, pre), (12, mid), (13, post)] {
            w.graph_kernel_node(node, 0, 5, name);
        }
        for (clone, original) in [(21, 11), (22, 12), (23, 13)] {
            w.graph_kernel_node(clone, original, 6, 0);
        }
        assert_eq!(w.graph_exec(9, 5), 3);
        assert_eq!(w.graph_exec_kernels(9), 3);
        w.launch(
            &Launch {
                correlation: 40,
                launch_ns: 1_000,
                stream: 7,
                stream_id: 7,
                graph_id: 9,
                nodes_pending: 3,
                ..Launch::default()
            },
            None,
        );
        launch(&w, 41, 7, pre); // queued behind the graph
        // The first node completes (reported by its clone's id): the graph launch stays in flight.
        w.complete(&Completion {
            correlation: 40,
            start_ns: 1_100,
            end_ns: 1_200,
            stream_id: 7,
            device: 0,
            graph_node: 21,
        });
        let view = mem.view().unwrap();
        let mut cursor = JournalCursor::default();
        assert_eq!(
            cursor
                .advance(&view)
                .iter()
                .filter(|r| is_completion(r))
                .count(),
            1
        );
        let heads = cursor.heads(1, &view, 10_000);
        assert_eq!(heads.len(), 1, "{heads:?}");
        let g = heads[0].graph.as_ref().expect("a graph launch");
        assert_eq!(
            (g.exec_id, g.graph_id, g.kernel_nodes, g.completed),
            (9, Some(5), 3, 1)
        );
        let names: Vec<&str> = g.not_completed.iter().map(|n| n.kernel.as_str()).collect();
        assert_eq!(names, ["_Z6middlePVi", "_Z4postv"]);
        assert_eq!(
            g.not_completed[0].kernel_demangled.as_deref(),
            Some("middle(int volatile*)")
        );
        assert_eq!(heads[0].queued_behind, 1);
        // The other two nodes complete: the launch leaves the table.
        for node in [22, 23] {
            w.complete(&Completion {
                correlation: 40,
                start_ns: 1_300,
                end_ns: 1_400,
                stream_id: 7,
                device: 0,
                graph_node: node,
            });
        }
        cursor.advance(&view);
        let heads = cursor.heads(1, &view, 10_000);
        assert_eq!(heads[0].correlation, 41, "{heads:?}");
        assert!(heads[0].graph.is_none());
    }

    /// Stream marks (the default recording): launches up to a passed mark are done; the head
    /// is named only when a mark follows it directly (or nothing follows it), otherwise the
    /// launches up to the first mark are listed as candidates, never one of them alone.
    #[test]
    fn with_marks_the_stuck_kernel_is_named_or_narrowed_to_the_launches_between_two_marks() {
        let (mem, w) = journal();
        let mut words = vec![0u64; L.marks_cap as usize];
        // SAFETY: marks_cap u64s that outlive the writer's use in this test.
        unsafe { w.set_mark_words(words.as_mut_ptr()) };
        w.set_record_mode(probe_common::journal::RECORD_MARKS, 8, 100);
        let (a, b, stuck) = (w.intern(b"a"), w.intern(b"b"), w.intern(b"stuck"));
        let slot7 = w.mark_slot(7 + 1, 0, 7).unwrap();
        let slot9 = w.mark_slot(9 + 1, 0, 9).unwrap();
        let on = |corr: u64, stream: u64, name: u32, slot: u32| {
            w.launch(
                &Launch {
                    correlation: corr,
                    name_id: name,
                    launch_ns: corr * 1_000,
                    stream,
                    stream_id: stream as u32,
                    mark: slot + 1,
                    ..Launch::default()
                },
                None,
            );
        };
        // Stream 7: 1 (marked, passed), 2 a, 3 b, 4 stuck (marked after it, not passed), 5, 6.
        on(1, 7, a, slot7);
        w.set_marked(1);
        for (c, n) in [(2, a), (3, b), (4, stuck)] {
            on(c, 7, n, slot7);
        }
        w.set_marked(4);
        on(5, 7, a, slot7);
        on(6, 7, a, slot7);
        // Stream 9: 10 passed; 11 stuck with a mark right after it; 12 queued.
        on(10, 9, a, slot9);
        w.set_marked(10);
        on(11, 9, stuck, slot9);
        w.set_marked(11);
        on(12, 9, b, slot9);
        words[slot7 as usize] = 1;
        words[slot9 as usize] = 10;
        w.publish_marks(50_000);
        let view = mem.view().unwrap();
        let mut cursor = JournalCursor::default();
        cursor.advance(&view);
        let heads = cursor.heads(1, &view, 100_000);
        assert_eq!(heads.len(), 2, "{heads:?}");
        let s7 = heads.iter().find(|h| h.stream == "0x7").unwrap();
        assert!(!s7.exact);
        assert_eq!(s7.kernel, "(one of 3 kernels)");
        let names: Vec<&str> = s7.candidates.iter().map(|c| c.kernel.as_str()).collect();
        assert_eq!(
            names,
            ["a", "b", "stuck"],
            "in launch order, up to the first mark"
        );
        assert_eq!((s7.candidates_total, s7.queued_behind), (3, 4));
        assert_eq!(
            s7.running_ms,
            (100_000 - 50_000) as f64 / 1e6,
            "since the mark was seen"
        );
        let s9 = heads.iter().find(|h| h.stream == "0x9").unwrap();
        assert!(s9.exact, "{s9:?}");
        assert_eq!((s9.kernel.as_str(), s9.queued_behind), ("stuck", 1));
        assert!(s9.candidates.is_empty());
        // Stream 7 passes its next mark: 2..4 done; 5 and 6 are left, none marked after:
        // with two unfinished and no mark between, still candidates.
        words[slot7 as usize] = 4;
        w.publish_marks(60_000);
        cursor.advance(&view);
        let s7 = cursor
            .heads(1, &view, 100_000)
            .into_iter()
            .find(|h| h.stream == "0x7")
            .unwrap();
        assert_eq!((s7.exact, s7.candidates_total), (false, 2));
        // The writer reuses slots of launches a passed mark retired.
        for c in 20..(20 + L.inflight_cap as u64) {
            on(c, 7, a, slot7);
            w.set_marked(c);
            words[slot7 as usize] = c;
        }
        let drops: HashMap<_, _> = view.drops().into_iter().collect();
        assert_eq!(drops["inflight_full"], 0, "retired slots were reused");
    }

    /// Marks the shim has not published for over `MARKS_STALE_MS` (its flush thread waits —
    /// the H200's event-mark queries behind a launch blocked in the full queue): a mark right
    /// after the head no longer names it; every unfinished launch is a candidate, and why is
    /// said. Fresh marks name it.
    #[test]
    fn with_marks_not_published_for_a_second_the_head_is_not_named_alone() {
        let (mem, w) = journal();
        let mut words = vec![0u64; L.marks_cap as usize];
        // SAFETY: marks_cap u64s that outlive the writer's use in this test.
        unsafe { w.set_mark_words(words.as_mut_ptr()) };
        w.set_record_mode(probe_common::journal::RECORD_MARKS, 8, 100);
        let (a, b, stuck) = (w.intern(b"a"), w.intern(b"b"), w.intern(b"stuck"));
        let slot = w.mark_slot(9 + 1, 0, 9).unwrap();
        for (corr, name) in [(10, a), (11, stuck), (12, b), (13, b)] {
            w.launch(
                &Launch {
                    correlation: corr,
                    name_id: name,
                    launch_ns: corr * 1_000,
                    stream: 9,
                    stream_id: 9,
                    mark: slot + 1,
                    ..Launch::default()
                },
                None,
            );
            if corr <= 11 {
                w.set_marked(corr);
            }
        }
        words[slot as usize] = 10;
        w.publish_marks(50_000);
        w.heartbeat(50_000);
        let view = mem.view().unwrap();
        let mut cursor = JournalCursor::default();
        cursor.advance(&view);
        // 0.9 s after the last sign of life: current.
        let fresh = cursor.heads(1, &view, 50_000 + 900_000_000);
        assert!(fresh[0].exact, "{fresh:?}");
        assert_eq!(fresh[0].kernel, "stuck");
        assert_eq!(fresh[0].marks_stale_ms, None);
        // 3 s after: the mark after `stuck` may have passed unseen.
        let mut cursor = JournalCursor::default();
        cursor.advance(&view);
        let stale = cursor.heads(1, &view, 50_000 + 3_000_000_000);
        assert!(!stale[0].exact, "{stale:?}");
        let names: Vec<&str> = stale[0]
            .candidates
            .iter()
            .map(|c| c.kernel.as_str())
            .collect();
        assert_eq!(
            names,
            ["stuck", "b", "b"],
            "to the newest launch, in launch order"
        );
        assert_eq!(stale[0].marks_stale_ms, Some(3_000.0));
        // A stream with one unfinished launch is still that launch.
        words[slot as usize] = 12;
        w.publish_marks(60_000);
        let mut cursor = JournalCursor::default();
        cursor.advance(&view);
        let one = cursor.heads(1, &view, 50_000 + 3_000_000_000);
        assert!(one[0].exact && one[0].kernel == "b", "{one:?}");
    }

    #[test]
    fn a_launch_captured_into_a_graph_leaves_the_in_flight_table() {
        let (mem, w) = journal();
        launch(&w, 3, 7, 0);
        w.captured(3, 5_000);
        let view = mem.view().unwrap();
        let mut cursor = JournalCursor::default();
        cursor.advance(&view);
        assert!(cursor.heads(1, &view, 10_000).is_empty());
    }
}
