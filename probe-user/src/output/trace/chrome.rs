//! Writes Chrome Trace Event Format (the JSON array form), streamed to disk: Perfetto UI,
//! chrome://tracing and speedscope load it. Layout of the tracks:
//! - one process per target, a track per host thread (named), slices for driver calls;
//! - one process per GPU device, a track per (target, stream), kernel slices named by the
//!   demangled kernel, with grid/block/cluster and correlation id in args;
//! - a flow arrow from each launch to its kernel (Perfetto's `bind_id` flows);
//! - slices still open at the end (the stuck kernel, the blocked calls) are `B` events with no
//!   `E`, marked `never_completed` — how the format says "did not end";
//! - counters (`C`) and verdicts (global instants).
//!
//! Why the array form: its closing `]` is optional by the format's definition, so a file cut
//! short (a full disk, a crash) still loads. The writer keeps that true on errors: JSON is
//! buffered and written in whole-event chunks; when a write fails, the file is cut back to the
//! last whole chunk. `.gz` output is a series of gzip members, one per chunk (256 KiB of
//! JSON), so the same cut leaves a valid gzip file; gunzip, Python and Perfetto read
//! concatenated members. The first chunk (the opening bracket and the clock event) is
//! written at once, so even a disk that fills immediately leaves a loadable file.

use std::{
    collections::HashSet,
    fs::File,
    io::{self, Write},
    path::{Path, PathBuf},
};

use std::sync::Arc;

use flate2::{Compression, write::GzEncoder};
use serde_json::{Value, json};

use crate::model::event::{Names, TraceEvent};
use crate::model::kernels::demangle;

/// GPU devices are drawn as processes with these pids (no real pid is this large).
pub const GPU_PID_BASE: u64 = 1 << 40;
/// JSON written per chunk (and per gzip member): a failed write loses at most this much.
const CHUNK_BYTES: usize = 256 << 10;
/// Flow ids of launches written whose kernel has not been written yet; past this many the
/// oldest are forgotten (their kernels then get no arrow) so memory stays bounded.
const MAX_PENDING_FLOWS: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    // The io error is the source, printed after these by the error chain (main).
    #[error("cannot create {path}")]
    Create { path: PathBuf, source: io::Error },
    #[error(
        "writing {path} failed after {events} events (the file was cut back to the last whole chunk and still loads)"
    )]
    Write {
        path: PathBuf,
        events: u64,
        source: io::Error,
    },
}

pub struct ChromeTrace {
    file: File,
    path: PathBuf,
    gzip: bool,
    buf: Vec<u8>,
    /// Bytes of the file that hold whole chunks.
    good_len: u64,
    first: bool,
    pub events: u64,
    /// What the trace holds and lacks, for its summary line: launches, kernel executions,
    /// and journal records lost before they reached it (`TraceEvent::Lost`).
    pub launches: u64,
    pub kernels: u64,
    pub lost: u64,
    /// Records lost so far per process, drawn as a counter beside each gap's marker.
    lost_by_pid: std::collections::HashMap<u32, u64>,
    tracks: HashSet<(u64, u64)>,
    processes: HashSet<u64>,
    flows: HashSet<u64>,
    flow_order: std::collections::VecDeque<u64>,
    failed: bool,
    /// Demangled names and short labels by kernel name: demangling is the dearest step of
    /// writing a kernel event, and a trace repeats a few hundred names a million times.
    labels: std::collections::HashMap<Arc<str>, Labels>,
    /// Latest slice start written per track: slices still open at the end are known only then,
    /// and their start can lie (by a fraction of a microsecond: the shim's slot and its launch
    /// record take the clock separately) before what the track already holds.
    last_start: std::collections::HashMap<(u64, u64), u64>,
}

#[derive(Clone)]
struct Labels {
    demangled: Option<Arc<str>>,
    short: Arc<str>,
}

/// Where an event is drawn.
fn gpu_pid(device: u32) -> u64 {
    GPU_PID_BASE + device as u64
}

fn stream_tid(pid: u32, stream_id: u32) -> u64 {
    ((pid as u64) << 20) | (stream_id as u64 & 0xF_FFFF)
}

fn flow_id(pid: u32, correlation: u64) -> u64 {
    ((pid as u64) << 40) ^ correlation
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

impl ChromeTrace {
    /// Creates `path` (gzip when it ends in `.gz`). The first event carries the clock pair.
    pub fn create(path: &Path, mono_ns: u64, real_ns: u64) -> Result<Self, TraceError> {
        let file = File::create(path).map_err(|source| TraceError::Create {
            path: path.to_path_buf(),
            source,
        })?;
        let mut t = Self {
            file,
            path: path.to_path_buf(),
            gzip: path.extension().is_some_and(|e| e == "gz"),
            buf: Vec::with_capacity(CHUNK_BYTES + 4096),
            good_len: 0,
            first: true,
            events: 0,
            launches: 0,
            kernels: 0,
            lost: 0,
            lost_by_pid: Default::default(),
            tracks: HashSet::new(),
            processes: HashSet::new(),
            flows: HashSet::new(),
            flow_order: Default::default(),
            failed: false,
            labels: Default::default(),
            last_start: Default::default(),
        };
        t.buf.extend_from_slice(b"[\n");
        t.push(&json!({
            "ph": "i", "s": "g", "name": "wedgeprobe trace start", "pid": 0, "tid": 0,
            "ts": us(mono_ns),
            "args": {
                "clock": "CLOCK_MONOTONIC",
                "monotonic_ns": mono_ns,
                "realtime_ns": real_ns,
                "wedgeprobe": env!("CARGO_PKG_VERSION"),
            }
        }))?;
        t.flush_chunk()?;
        Ok(t)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn push(&mut self, v: &Value) -> Result<(), TraceError> {
        self.separate();
        // Serialising a Value into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut self.buf, v);
        self.end()
    }

    fn separate(&mut self) {
        if !self.first {
            self.buf.extend_from_slice(b",\n");
        }
        self.first = false;
    }

    /// Starts an event written field by field (the hot events: building a serde_json
    /// `Value` per event cost ~2 µs, three times the rest of the export).
    fn begin(&mut self) -> Obj<'_> {
        self.separate();
        Obj::new(&mut self.buf)
    }

    /// Ends an event (its object closed by `Obj`'s drop).
    fn end(&mut self) -> Result<(), TraceError> {
        self.events += 1;
        if self.buf.len() >= CHUNK_BYTES {
            self.flush_chunk()?;
        }
        Ok(())
    }

    /// Writes the buffered JSON (whole events) as one chunk; on failure cuts the file back to
    /// the previous chunk and stops writing.
    fn flush_chunk(&mut self) -> Result<(), TraceError> {
        if self.failed || self.buf.is_empty() {
            self.buf.clear();
            return Ok(());
        }
        let result = if self.gzip {
            let mut gz =
                GzEncoder::new(Vec::with_capacity(self.buf.len() / 4), Compression::fast());
            gz.write_all(&self.buf)
                .and_then(|()| gz.finish())
                .and_then(|member| self.file.write_all(&member).map(|()| member.len()))
        } else {
            self.file.write_all(&self.buf).map(|()| self.buf.len())
        };
        self.buf.clear();
        match result {
            Ok(n) => {
                self.good_len += n as u64;
                Ok(())
            }
            Err(source) => {
                self.failed = true;
                let _ = self.file.set_len(self.good_len);
                Err(TraceError::Write {
                    path: self.path.clone(),
                    events: self.events,
                    source,
                })
            }
        }
    }

    fn ensure_process(&mut self, pid: u64, names: &Names) -> Result<(), TraceError> {
        if !self.processes.insert(pid) {
            return Ok(());
        }
        let (name, sort) = if pid >= GPU_PID_BASE {
            (
                format!("GPU {}", pid - GPU_PID_BASE),
                1_000_000 + (pid - GPU_PID_BASE),
            )
        } else {
            let comm = names
                .processes
                .get(&(pid as u32))
                .map_or("?", |s| s.as_str());
            (format!("{comm} (pid {pid})"), pid)
        };
        self.push(
            &json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
            "args": {"name": name}}),
        )?;
        self.push(
            &json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
            "args": {"sort_index": sort}}),
        )
    }

    fn ensure_track(
        &mut self,
        pid: u64,
        tid: u64,
        label: impl FnOnce() -> String,
        names: &Names,
    ) -> Result<(), TraceError> {
        self.ensure_process(pid, names)?;
        if !self.tracks.insert((pid, tid)) {
            return Ok(());
        }
        self.push(
            &json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
            "args": {"name": label()}}),
        )
    }

    fn host_track(&mut self, pid: u32, tid: u32, names: &Names) -> Result<(), TraceError> {
        self.ensure_track(
            pid as u64,
            tid as u64,
            || {
                let name = names.threads.get(&(pid, tid)).cloned().or_else(|| {
                    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                        .ok()
                        .map(|s| s.trim().to_string())
                });
                match name {
                    Some(n) => format!("{n} ({tid})"),
                    None => format!("tid {tid}"),
                }
            },
            names,
        )
    }

    /// Writes one event (events should come in start order; see `Sorter`).
    pub fn write(&mut self, ev: &TraceEvent, names: &Names) -> Result<(), TraceError> {
        match ev {
            TraceEvent::Call(c) => {
                self.host_track(c.pid, c.tid, names)?;
                let start = self.monotone((c.pid as u64, c.tid as u64), c.start_ns);
                let mut o = self.begin();
                o.str("name", c.api);
                o.str("cat", "driver");
                o.int("pid", c.pid as u64);
                o.int("tid", c.tid as u64);
                o.ts("ts", start);
                match c.end_ns {
                    Some(end) => {
                        o.str("ph", "X");
                        o.ts("dur", end.saturating_sub(c.start_ns));
                    }
                    None => o.str("ph", "B"),
                }
                o.open("args");
                if let Some(s) = c.stream {
                    o.hex("stream", s);
                }
                if c.failed {
                    o.raw("failed", "true");
                }
                if c.end_ns.is_none() {
                    o.raw("never_completed", "true");
                    o.str("state", "still inside this call when the trace ended");
                }
                if start != c.start_ns {
                    o.ts("began_us", c.start_ns);
                }
                o.close();
                drop(o);
                self.end()
            }
            TraceEvent::Launch(l) => {
                self.launches += 1;
                self.host_track(l.pid, l.tid, names)?;
                let id = flow_id(l.pid, l.correlation);
                self.remember_flow(id);
                let short = self.labels(&l.kernel).short;
                let ts = self.monotone((l.pid as u64, l.tid as u64), l.ts_ns);
                let mut o = self.begin();
                o.str("ph", "X");
                o.str_pair("name", "launch ", &short);
                o.str("cat", "launch");
                o.int("pid", l.pid as u64);
                o.int("tid", l.tid as u64);
                o.ts("ts", ts);
                // The shim records when a launch call began, not how long it took: drawn
                // 1 ns long (a zero-length slice inside an open call confuses viewers).
                o.raw("dur", "0.001");
                o.int("bind_id", id);
                o.raw("flow_out", "true");
                o.open("args");
                o.str("api", l.api);
                o.str("call_duration", "not recorded");
                o.int("correlation", l.correlation);
                o.hex("stream", l.stream);
                o.dims("grid", l.grid);
                o.dims("block", l.block);
                o.close();
                drop(o);
                self.end()
            }
            TraceEvent::Kernel(k) => {
                self.kernels += u64::from(k.end_ns.is_some());
                let (pid, tid) = (gpu_pid(k.device), stream_tid(k.pid, k.stream_id));
                let comm = names.processes.get(&k.pid).cloned().unwrap_or_default();
                self.ensure_track(
                    pid,
                    tid,
                    || {
                        format!(
                            "stream {} ({:#x}) of {comm} pid {}",
                            k.stream_id, k.stream, k.pid
                        )
                    },
                    names,
                )?;
                let demangled = self.labels(&k.kernel).demangled;
                let id = flow_id(k.pid, k.correlation);
                let flow = k.graph_node == 0 && self.flows.remove(&id);
                let start = self.monotone((pid, tid), k.start_ns);
                let mut o = self.begin();
                o.str("name", demangled.as_deref().unwrap_or(&k.kernel));
                o.str("cat", "kernel");
                o.int("pid", pid);
                o.int("tid", tid);
                o.ts("ts", start);
                match k.end_ns {
                    Some(end) => {
                        o.str("ph", "X");
                        o.ts("dur", end.saturating_sub(k.start_ns));
                    }
                    None => o.str("ph", "B"),
                }
                if flow {
                    o.int("bind_id", id);
                    o.raw("flow_in", "true");
                }
                o.open("args");
                o.str("kernel", &k.kernel);
                o.int("correlation", k.correlation);
                o.dims("grid", k.grid);
                o.dims("block", k.block);
                o.dims("cluster", k.cluster);
                o.int("pid", k.pid as u64);
                o.hex("stream", k.stream);
                if k.graph_node != 0 {
                    o.int("graph_node", k.graph_node);
                }
                if k.end_ns.is_none() {
                    o.raw("never_completed", "true");
                    o.str("state", "had not completed when the trace ended (start estimated from the previous kernel's end)");
                    if let Some(q) = k.queued_behind {
                        o.int("queued_behind", q as u64);
                    }
                }
                if start != k.start_ns {
                    o.ts("began_us", k.start_ns);
                }
                o.close();
                drop(o);
                self.end()
            }
            TraceEvent::Counter(c) => {
                let pid = c.device.map_or(c.pid as u64, gpu_pid);
                self.ensure_process(pid, names)?;
                self.push(&json!({"ph": "C", "name": c.name, "pid": pid, "tid": 0,
                    "ts": us(c.ts_ns), "args": {"value": c.value}}))
            }
            TraceEvent::Lost(l) => {
                let n = l.overwritten + l.buffer_full;
                self.lost += n;
                let total = {
                    let t = self.lost_by_pid.entry(l.pid).or_insert(0);
                    *t += n;
                    *t
                };
                self.ensure_process(l.pid as u64, names)?;
                self.push(&json!({"ph": "i", "s": "p", "cat": "lost",
                    "name": format!("{n} journal records lost"), "pid": l.pid, "tid": 0,
                    "ts": us(l.ts_ns),
                    "args": {"overwritten_in_ring": l.overwritten,
                             "reader_buffer_full": l.buffer_full,
                             "lost_so_far": total}}))?;
                self.push(
                    &json!({"ph": "C", "name": "journal records lost", "pid": l.pid,
                    "tid": 0, "ts": us(l.ts_ns), "args": {"value": total}}),
                )
            }
            TraceEvent::Verdict(m) => {
                self.ensure_process(m.pid as u64, names)?;
                self.push(
                    &json!({"ph": "i", "s": "g", "name": format!("verdict: {}", m.kind),
                    "cat": "verdict", "pid": m.pid, "tid": 0, "ts": us(m.ts_ns),
                    "args": {"kind": m.kind, "summary": m.summary}}),
                )
            }
        }
    }

    /// `ts` no earlier than the last slice start on `track` (the real start then goes in
    /// `args.began_us`): viewers expect each track in time order.
    fn monotone(&mut self, track: (u64, u64), ts: u64) -> u64 {
        let last = self.last_start.entry(track).or_insert(0);
        *last = (*last).max(ts);
        *last
    }

    fn labels(&mut self, kernel: &Arc<str>) -> Labels {
        if let Some(l) = self.labels.get(kernel) {
            return l.clone();
        }
        let l = Labels {
            demangled: demangle(kernel).map(Arc::from),
            short: Arc::from(short(kernel)),
        };
        if self.labels.len() < 100_000 {
            self.labels.insert(kernel.clone(), l.clone());
        }
        l
    }

    fn remember_flow(&mut self, id: u64) {
        if self.flows.insert(id) {
            self.flow_order.push_back(id);
            if self.flow_order.len() > MAX_PENDING_FLOWS
                && let Some(old) = self.flow_order.pop_front()
            {
                self.flows.remove(&old);
            }
        }
    }

    /// Marks where the trace ends on every track that has a slice still open: a zero-length
    /// child slice at `end_ns`. Perfetto and chrome://tracing show the open slice as "did not
    /// end" either way; speedscope closes open slices at the last event of their track, so
    /// without the marker the stuck kernel would look zero-length there.
    /// At the end: on each stream's GPU track, how many of its records the trace lost (the
    /// ring's gaps say when, not whose; see `journal::stream_losses`).
    pub fn mark_stream_losses(
        &mut self,
        losses: &[(u32, crate::model::StreamLoss)],
        end_ns: u64,
        names: &Names,
    ) -> Result<(), TraceError> {
        for (pid, l) in losses {
            let (gpu, tid) = (gpu_pid(l.device), stream_tid(*pid, l.stream_id));
            let comm = names.processes.get(pid).cloned().unwrap_or_default();
            self.ensure_track(
                gpu,
                tid,
                || format!("stream {} of {comm} pid {pid}", l.stream_id),
                names,
            )?;
            let ts = self.monotone((gpu, tid), end_ns);
            self.push(&json!({"ph": "i", "s": "t", "cat": "lost_by_stream",
                "name": format!("{} of this stream's {} records lost in the trace", l.lost, l.written),
                "pid": gpu, "tid": tid, "ts": us(ts),
                "args": {"pid": pid, "stream_id": l.stream_id, "lost": l.lost,
                         "written": l.written}}))?;
        }
        Ok(())
    }

    pub fn mark_end(&mut self, open: &[TraceEvent], end_ns: u64) -> Result<(), TraceError> {
        for e in open {
            let (pid, tid) = match e {
                TraceEvent::Call(c) if c.end_ns.is_none() => (c.pid as u64, c.tid as u64),
                TraceEvent::Kernel(k) if k.end_ns.is_none() => {
                    (gpu_pid(k.device), stream_tid(k.pid, k.stream_id))
                }
                _ => continue,
            };
            // Never before what the track already holds: a launch the last drain read can
            // start after the tick that ended the trace.
            let ts = self.monotone((pid, tid), end_ns);
            self.push(
                &json!({"ph": "X", "name": "end of trace (still running)", "cat": "marker",
                "pid": pid, "tid": tid, "ts": us(ts), "dur": 0}),
            )?;
        }
        Ok(())
    }

    /// Closes the JSON array and the file. Returns the bytes on disk.
    pub fn finish(mut self) -> Result<u64, TraceError> {
        self.buf.extend_from_slice(b"\n]\n");
        self.flush_chunk()?;
        self.file.flush().map_err(|source| TraceError::Write {
            path: self.path.clone(),
            events: self.events,
            source,
        })?;
        Ok(self.good_len)
    }
}

/// A JSON object written in place; closed when dropped.
struct Obj<'a> {
    buf: &'a mut Vec<u8>,
    /// Per nesting level: no field written yet.
    first: Vec<bool>,
}

impl<'a> Obj<'a> {
    fn new(buf: &'a mut Vec<u8>) -> Self {
        buf.push(b'{');
        Self {
            buf,
            first: vec![true],
        }
    }

    fn key(&mut self, k: &str) {
        if let Some(f) = self.first.last_mut() {
            if !*f {
                self.buf.push(b',');
            }
            *f = false;
        }
        self.buf.push(b'"');
        self.buf.extend_from_slice(k.as_bytes());
        self.buf.extend_from_slice(b"\":");
    }

    fn str(&mut self, k: &str, v: &str) {
        self.key(k);
        // Escapes as JSON requires (names come from the target: hostile bytes are possible).
        let _ = serde_json::to_writer(&mut *self.buf, v);
    }

    fn str_pair(&mut self, k: &str, a: &str, b: &str) {
        self.key(k);
        let mut s = String::with_capacity(a.len() + b.len());
        s.push_str(a);
        s.push_str(b);
        let _ = serde_json::to_writer(&mut *self.buf, &s);
    }

    fn raw(&mut self, k: &str, v: &str) {
        self.key(k);
        self.buf.extend_from_slice(v.as_bytes());
    }

    fn int(&mut self, k: &str, v: u64) {
        self.key(k);
        let _ = write!(self.buf, "{v}");
    }

    fn hex(&mut self, k: &str, v: u64) {
        self.key(k);
        let _ = write!(self.buf, "\"{v:#x}\"");
    }

    /// Nanoseconds as the format's microseconds, exactly (three decimals).
    fn ts(&mut self, k: &str, ns: u64) {
        self.key(k);
        let _ = write!(self.buf, "{}.{:03}", ns / 1000, ns % 1000);
    }

    fn dims(&mut self, k: &str, d: [u32; 3]) {
        self.key(k);
        let _ = write!(self.buf, "[{},{},{}]", d[0], d[1], d[2]);
    }

    fn open(&mut self, k: &str) {
        self.key(k);
        self.buf.push(b'{');
        self.first.push(true);
    }

    fn close(&mut self) {
        if self.first.len() > 1 {
            self.first.pop();
            self.buf.push(b'}');
        }
    }
}

impl Drop for Obj<'_> {
    fn drop(&mut self) {
        while self.first.len() > 1 {
            self.close();
        }
        self.buf.push(b'}');
    }
}

/// A kernel name short enough for a slice label.
fn short(name: &str) -> String {
    let d = demangle(name).unwrap_or_else(|| name.to_string());
    let base = d.split('(').next().unwrap_or(&d);
    if base.chars().count() > 60 {
        format!("{}…", base.chars().take(60).collect::<String>())
    } else {
        base.to_string()
    }
}

/// Start order; at equal times a call before the launch it contains (the journal's launch
/// time and the thread's "in call since" are the same instant), so viewers nest them.
pub fn order(e: &TraceEvent) -> (u64, u8) {
    (e.ts_ns(), u8::from(!matches!(e, TraceEvent::Call(_))))
}

/// Holds events back for `window_ns` and releases them in start order, so each track's
/// timestamps are monotone in the file although sources deliver late (CUPTI hands completions
/// over up to ~0.5 s after the fact) and out of order. A heap: each event is pushed and
/// popped once (a launch-bound process keeps ~200,000 events inside the window).
pub struct Sorter {
    window_ns: u64,
    held: std::collections::BinaryHeap<Held>,
    seq: u64,
}

/// Min-heap entry: by `order`, then arrival.
pub struct Held((u64, u8), u64, TraceEvent);

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.0, self.1) == (o.0, o.1)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.0, o.1).cmp(&(self.0, self.1))
    }
}

impl Sorter {
    pub fn new(window_ns: u64) -> Self {
        Self {
            window_ns,
            held: Default::default(),
            seq: 0,
        }
    }

    pub fn push(&mut self, evs: impl IntoIterator<Item = TraceEvent>) {
        for e in evs {
            self.seq += 1;
            self.held.push(Held(order(&e), self.seq, e));
        }
    }

    /// Events that began before `now_ns - window`, in start order.
    pub fn release(&mut self, now_ns: u64) -> Vec<TraceEvent> {
        let cut = now_ns.saturating_sub(self.window_ns);
        let mut out = Vec::new();
        while self.held.peek().is_some_and(|h| h.0.0 < cut) {
            if let Some(Held(_, _, e)) = self.held.pop() {
                out.push(e);
            }
        }
        out
    }

    /// Everything left, in start order.
    pub fn drain(&mut self) -> Vec<TraceEvent> {
        self.release(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::event::{Call, Kernel, Launch, VerdictMark};

    /// A small trace whose every byte is pinned: a blocked launch, a completed kernel with its
    /// flow, the stuck kernel open, a verdict. `UPDATE_GOLDEN=1` rewrites the file.
    #[test]
    fn golden_small_trace() {
        let mut names = Names::default();
        names.processes.insert(42, "worker".into());
        names.threads.insert((42, 43), "launcher".into());
        let kernel: Arc<str> = Arc::from("_Z6decodePf");
        let stuck: Arc<str> = Arc::from("_Z5stuckPVi");
        let k = |corr, name: &Arc<str>, start, end| {
            TraceEvent::Kernel(Kernel {
                pid: 42,
                device: 0,
                stream: 0x10,
                stream_id: 7,
                correlation: corr,
                kernel: name.clone(),
                start_ns: start,
                end_ns: end,
                grid: [4, 1, 1],
                block: [128, 1, 1],
                cluster: [1, 1, 1],
                graph_node: 0,
                queued_behind: end.is_none().then_some(2),
            })
        };
        let l = |corr, name: &Arc<str>, ts| {
            TraceEvent::Launch(Launch {
                pid: 42,
                tid: 43,
                api: "cuLaunchKernel",
                ts_ns: ts,
                correlation: corr,
                stream: 0x10,
                kernel: name.clone(),
                grid: [4, 1, 1],
                block: [128, 1, 1],
            })
        };
        let events = vec![
            l(1, &kernel, 1_000),
            k(1, &kernel, 2_000, Some(5_000)),
            l(2, &stuck, 6_000),
            k(2, &stuck, 7_000, None),
            TraceEvent::Call(Call {
                pid: 42,
                tid: 43,
                api: "cuStreamSynchronize",
                start_ns: 8_000,
                end_ns: None,
                stream: Some(0x10),
                failed: false,
            }),
            TraceEvent::Verdict(VerdictMark {
                pid: 42,
                ts_ns: 9_000,
                kind: "kernel_wedge",
                summary: "stuck".into(),
            }),
        ];
        let dir = std::env::temp_dir().join(format!("wp-golden-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("small.json");
        let mut t = ChromeTrace::create(&path, 500, 1_700_000_000_000_000_000).unwrap();
        for e in &events {
            t.write(e, &names).unwrap();
        }
        t.mark_end(&events, 10_000).unwrap();
        t.finish().unwrap();
        let got = std::fs::read_to_string(&path).unwrap();
        let golden = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/output/trace/golden/small.json"
        );
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(golden, &got).unwrap();
        }
        assert_eq!(
            got,
            std::fs::read_to_string(golden).unwrap(),
            "golden trace changed"
        );
    }

    #[test]
    fn a_gzip_trace_decompresses_to_the_same_events() {
        use std::io::Read as _;
        let dir = std::env::temp_dir().join(format!("wp-gz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.json.gz");
        let mut t = ChromeTrace::create(&path, 1, 2).unwrap();
        let names = Names::default();
        // Enough events for several gzip members.
        for i in 0..20_000u64 {
            t.write(
                &TraceEvent::Call(Call {
                    pid: 1,
                    tid: 1,
                    api: "cuStreamSynchronize",
                    start_ns: i * 1_000,
                    end_ns: Some(i * 1_000 + 500),
                    stream: None,
                    failed: false,
                }),
                &names,
            )
            .unwrap();
        }
        t.finish().unwrap();
        let mut s = String::new();
        flate2::read::MultiGzDecoder::new(std::fs::File::open(&path).unwrap())
            .read_to_string(&mut s)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        // start marker + 2 metadata for the process + 1 thread name + 20,000 calls
        assert_eq!(v.as_array().unwrap().len(), 1 + 2 + 1 + 20_000);
    }
}
