//! The live model of the watched processes: which thread is inside which driver call, since
//! when, how often it yields, and how long finished calls took.
//!
//! Fed by `collector` (eBPF maps and rings, /proc); read by `report`, `watch` and `verdict`.
//! Pure data and arithmetic, so it is unit-tested without root or a GPU.

pub mod event;
pub mod history;
pub mod kernels;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use hdrhistogram::Histogram;
use probe_common::{CALL_OPEN_ENDED, CallDone, InCall, api};

use crate::{
    process::code::TargetCode,
    process::stackscan::{self, Found},
    process::target::Target,
};

/// A thread inside a CUDA API call, as the shim journal says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadInCall {
    pub tid: u32,
    pub api: u32,
    pub since_ns: u64,
    pub correlation: u64,
}

/// Api id of a thread found inside libcuda by stack scan when no entry point could be named.
pub const UNKNOWN_ENTRY_POINT: u32 = u32::MAX;
/// How such a thread's `api` reads in reports.
pub const UNKNOWN_ENTRY_POINT_NAME: &str = "libcuda (entry point unknown)";

pub fn api_name(id: u32) -> &'static str {
    if id == UNKNOWN_ENTRY_POINT {
        UNKNOWN_ENTRY_POINT_NAME
    } else {
        api::name(id)
    }
}

/// Where we learned that a thread is inside a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeenBy {
    /// The entry uprobe fired: start time and arguments are exact.
    Uprobe,
    /// A stack sample: the thread was already inside when wedgeprobe attached, so the time in
    /// call is a lower bound and the arguments are unknown.
    StackScan,
    /// A stack sample, with the start time from the shim journal's slot for the thread: the
    /// time in call is exact.
    StackScanAndJournal,
    /// The shim journal's slot for the thread (the shim saw it enter the call): start time
    /// exact, arguments not recorded. How launches are seen when the launch probes are off.
    Journal,
}

impl SeenBy {
    pub fn as_str(self) -> &'static str {
        match self {
            SeenBy::Uprobe => "uprobe",
            SeenBy::StackScan => "stack-scan",
            SeenBy::StackScanAndJournal => "stack-scan+journal",
            SeenBy::Journal => "journal",
        }
    }
}

#[derive(Clone, Debug)]
pub struct CurrentCall {
    pub api: u32,
    /// CLOCK_MONOTONIC ns the call began (or, for a stack scan, the earliest we know of).
    pub since_ns: u64,
    pub seen_by: SeenBy,
    pub args: Option<InCall>,
    /// For a call found by stack scan or journal: the thread's yield count at the first read
    /// after the call was seen, and when (yields are read only for threads in such calls; None
    /// until then).
    pub yields_at_first_seen: Option<(u64, u64)>,
    /// For a stack-scanned call: last time a sample confirmed it.
    pub confirmed_ns: u64,
}

impl CurrentCall {
    /// A launch traced without return probe: whether the thread is still inside is inferred.
    pub fn open_ended(&self) -> bool {
        self.args.is_some_and(|a| a.flags & CALL_OPEN_ENDED != 0)
    }

    /// (sched_yield/s, measured). Probes saw the call begin: its own yields over its whole
    /// time. Found by scan or journal: the thread's yields since first seen, over the time
    /// since then — not over the call's age (that diluted a 72k/s spin to "no sched_yield" at
    /// a watch's first ticks) — and not known before YIELD_RATE_MIN_NS of it.
    pub fn yield_rate(&self, yields_total: u64, now_ns: u64) -> (f64, bool) {
        let secs = now_ns.saturating_sub(self.since_ns) as f64 / 1e9;
        match (&self.args, self.yields_at_first_seen) {
            (Some(a), _) if secs > 0.0 => (a.yields as f64 / secs, true),
            (Some(_), _) => (0.0, true),
            (None, Some((first, at))) if now_ns.saturating_sub(at) >= YIELD_RATE_MIN_NS => (
                yields_total.saturating_sub(first) as f64
                    / (now_ns.saturating_sub(at) as f64 / 1e9),
                true,
            ),
            (None, _) => (0.0, false),
        }
    }
}

/// The older of two yield baselines (count, when): the longer span measures the rate.
fn older(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Option<(u64, u64)> {
    match (a, b) {
        (Some(x), Some(y)) => Some(if y.1 < x.1 { y } else { x }),
        (x, y) => x.or(y),
    }
}

/// A thread's CPU time so far, from /proc.
///
/// Why the waiting time: busy means wanting a core, not getting one. On the 2-core CI
/// machine with one core half taken by another load, one of two spinning ranks got 70-79% of
/// a core and was not a stall (`cargo xtask test` beside a busy loop, 2026-12-02); a rank on
/// an oversubscribed host meets the same, and one in a CPU-limited container more so (a busy
/// loop under a 30% CFS quota read 30% on a core and 70% waiting: throttled time is run-queue
/// wait). The scheduler's run-queue wait (`/proc/PID/task/TID/schedstat`) is that time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTime {
    /// On a core (schedstat's run time, or utime + stime where schedstat is not there).
    pub on_cpu_ns: u64,
    /// Runnable, waiting for a core (0 where schedstat is not there).
    pub waiting_ns: u64,
}

impl CpuTime {
    pub fn wanted_ns(self) -> u64 {
        self.on_cpu_ns.saturating_add(self.waiting_ns)
    }
}

#[derive(Clone, Debug, Default)]
pub struct ThreadState {
    pub name: String,
    pub uprobe_call: Option<CurrentCall>,
    pub scanned_call: Option<CurrentCall>,
    /// The call the shim journal says the thread is in.
    pub journal_call: Option<CurrentCall>,
    /// sched_yield calls since attach (from WP_THREAD_YIELDS).
    pub yields_total: u64,
    /// The latest stack scan of the thread: when, and whether it was inside libcuda.
    pub last_scan: Option<(u64, bool)>,
    /// The probes have seen this thread enter or leave a call since attach.
    pub traced: bool,
    /// CPU use over the last second (100 = one core), from /proc.
    pub cpu_pct: f64,
    /// Over the same second, the time it was runnable but waited for a core (100 = all of
    /// it): a spinner on an oversubscribed host wants a core all the time and gets part.
    pub waiting_pct: f64,
    /// Since when it has wanted ≥ 80% of a core (on one, or waiting for one) without a
    /// break (0: not now).
    pub busy_since_ns: u64,
    /// Read at the first CPU reading, from the shim's readings of the thread's clock: busy
    /// since this time, before attach (the first rate then dates `busy_since_ns` from here,
    /// not from the reading). Nothing else dates a spin that began before attach: a thread's
    /// CPU over its life is an upper bound, not a start (the H200 soak without the shim: a
    /// serving thread at 100% of a core for most of its life was "100% CPU for 93 s" 1 s
    /// into tokenizing, a false `host_stall`).
    pub busy_from_start_ns: Option<u64>,
    /// When the first CPU reading since the last `clear_cpu` was taken: a thread busy since
    /// then, with no dating of its own, has been busy at least since then (`undated`).
    pub first_cpu_ns: u64,
    /// The `CpuTime::wanted_ns` at `busy_since_ns` (0 when dated from the thread's start).
    pub busy_wanted_at_start: u64,
    /// What `busy_wanted_at_start` is when `busy_from_start_ns` dates the spin.
    pub busy_from_start_wanted: u64,
    /// (the reading, when) of the last CPU reading.
    pub cpu_last: Option<(CpuTime, u64)>,
    /// The shim's own readings of this thread's CPU clock (`ThreadSlot::busy_since_ns`):
    /// `Some(since)` busy since then, `Some(0)` not busy at its last reading, `None` not read
    /// by a shim (no journal, an older shim, a thread that never called CUDA). Where known it
    /// dates a spin that began before attach, instead of the thread's life.
    pub shim_busy_since: Option<u64>,
    /// The latest stack sample: (when, ip, words of the stack that point into code).
    pub last_sample: Option<(u64, u64, Vec<u64>)>,
}

impl ThreadState {
    /// One CPU reading: the rates since the last reading, and whether the thread has been
    /// busy (wanted ≥ 80% of a core on average) since when.
    pub fn cpu_reading(&mut self, cpu: CpuTime, now_ns: u64) {
        if let Some((prev, at)) = self.cpu_last
            && now_ns > at
        {
            let span = (now_ns - at) as f64;
            self.cpu_pct = cpu.on_cpu_ns.saturating_sub(prev.on_cpu_ns) as f64 / span * 100.0;
            self.waiting_pct = cpu.waiting_ns.saturating_sub(prev.waiting_ns) as f64 / span * 100.0;
            // Busy is judged on the average since the spin began, not on each reading: a
            // spinner sharing a core with wedgeprobe itself dips below 80% for one second
            // now and then (seen on the 2-core CI machine), and that must not restart it.
            if self.busy_since_ns != 0 {
                let span = now_ns.saturating_sub(self.busy_since_ns) as f64;
                let wanted = cpu.wanted_ns().saturating_sub(self.busy_wanted_at_start) as f64;
                if span > 0.0 && wanted / span < 0.8 {
                    self.busy_since_ns = 0;
                    self.busy_from_start_ns = None;
                }
            }
            let wanted_pct = cpu.wanted_ns().saturating_sub(prev.wanted_ns()) as f64 / span * 100.0;
            if self.busy_since_ns == 0 && wanted_pct >= 80.0 {
                (self.busy_since_ns, self.busy_wanted_at_start) = match self.busy_from_start_ns {
                    Some(start) => (start, self.busy_from_start_wanted),
                    None => (at, prev.wanted_ns()),
                };
            }
        } else if let Some(since) = self.shim_busy_since {
            // The shim read this thread's clock every second: it says since when the thread
            // has been busy (a life's average says nothing of that in a server). What it had
            // used by then is taken as 100% of a core since, for the running average.
            self.busy_from_start_ns = (since != 0).then_some(since);
            self.busy_from_start_wanted =
                cpu.wanted_ns().saturating_sub(now_ns.saturating_sub(since));
        }
        if self.cpu_last.is_none() {
            self.first_cpu_ns = now_ns;
        }
        self.cpu_last = Some((cpu, now_ns));
    }

    /// A stack scan of a thread in no call the probes saw begin (so in the one it was in at
    /// attach, or none): `found` is the entry point it is inside, if any. The slot is made
    /// again when the scan names another entry point (the shim's hook frames read as "entry
    /// point unknown" one sample, the entry point the next), but the call is the same one,
    /// so its yield baseline is kept: made new, the launcher of the H200's triton-wedge
    /// (≈2.4 M sched_yield/s, shim in) read "not measured yet" in `report`.
    pub fn scanned(&mut self, found: Option<u32>, attached_ns: u64, now_ns: u64) {
        match (found, &mut self.scanned_call) {
            (Some(api), Some(c)) if c.api == api => c.confirmed_ns = now_ns,
            // The journal named it; a scan that cannot is no evidence it left.
            (Some(UNKNOWN_ENTRY_POINT), Some(c)) if c.seen_by == SeenBy::StackScanAndJournal => {
                c.confirmed_ns = now_ns
            }
            (Some(api), slot) => {
                let yields = slot.as_ref().and_then(|c| c.yields_at_first_seen);
                *slot = Some(CurrentCall {
                    api,
                    since_ns: attached_ns,
                    seen_by: SeenBy::StackScan,
                    args: None,
                    yields_at_first_seen: yields,
                    confirmed_ns: now_ns,
                })
            }
            (None, slot) => *slot = None,
        }
    }

    /// The journal says the thread is inside `api` since `since_ns`: a stack-scanned call of
    /// that entry point (or an unknown one) takes its exact start, and the older of the two
    /// yield baselines.
    pub fn refine_scan(&mut self, api: u32, since_ns: u64) {
        let journal_yields = self
            .journal_call
            .as_ref()
            .and_then(|j| j.yields_at_first_seen);
        if let Some(sc) = self.scanned_call.as_mut()
            && (sc.api == api || sc.api == UNKNOWN_ENTRY_POINT)
            && api::class(api).is_some()
        {
            sc.api = api;
            sc.since_ns = since_ns;
            sc.seen_by = SeenBy::StackScanAndJournal;
            sc.yields_at_first_seen = older(sc.yields_at_first_seen, journal_yields);
        }
    }

    /// The thread's sched_yield count as read now: the first read dates each call's baseline.
    pub fn note_yields(&mut self, total: u64, now_ns: u64) {
        self.yields_total = total;
        for c in [&mut self.journal_call, &mut self.scanned_call]
            .into_iter()
            .flatten()
        {
            c.yields_at_first_seen.get_or_insert((total, now_ns));
        }
    }

    /// The call the thread is in: exact data first (both probes, then the shim journal), an
    /// inferred open-ended launch or a recent stack scan otherwise.
    pub fn current(&self, now_ns: u64) -> Option<&CurrentCall> {
        match &self.uprobe_call {
            Some(c) if !c.open_ended() => Some(c),
            // The journal's slot; a stack scan it confirmed says the same with more evidence.
            _ if self.journal_call.is_some() => self
                .scanned_call
                .as_ref()
                .filter(|c| {
                    c.seen_by == SeenBy::StackScanAndJournal
                        && now_ns.saturating_sub(c.confirmed_ns) < SCAN_VALID_NS
                })
                .or(self.journal_call.as_ref()),
            Some(c) if self.open_call_active(c, now_ns) => Some(c),
            _ => self
                .scanned_call
                .as_ref()
                .filter(|c| now_ns.saturating_sub(c.confirmed_ns) < SCAN_VALID_NS),
        }
    }

    /// Whether the thread is in a call with both probes (exact times, no inference).
    pub fn call_is_exact(&self) -> bool {
        self.uprobe_call.as_ref().is_some_and(|c| !c.open_ended())
    }

    /// Is a launch traced without return probe still under way? Yes while it yields (a launch
    /// behind a full queue spins on sched_yield), or if a stack sample taken since it began
    /// found the thread inside libcuda; no if one found it elsewhere. With neither, a young
    /// launch counts as under way: on-CPU threads are sampled every 200 ms and sleeping ones
    /// read every 250 ms, so the question is settled within OPEN_LAUNCH_GRACE_NS.
    fn open_call_active(&self, c: &CurrentCall, now_ns: u64) -> bool {
        let Some(a) = c.args else { return false };
        if a.yields > 0 && now_ns.saturating_sub(a.last_yield_ns) < YIELDING_NS {
            return true;
        }
        match self.last_scan {
            Some((at, inside)) if at >= a.start_ns => inside,
            _ => now_ns.saturating_sub(a.start_ns) < OPEN_LAUNCH_GRACE_NS,
        }
    }
}

/// Whether a thread's call is shown, given the process's shim journal: `recording` (its journal
/// is being read) and `moving` (its GPU work moved within the last second).
fn believed(c: &CurrentCall, recording: bool, moving: bool) -> bool {
    if c.seen_by != SeenBy::StackScan {
        return true;
    }
    // GPU work that keeps moving says a thread "inside libcuda, entry point unknown" is
    // passing through, not stuck: a launch-bound thread is inside libcuda at nearly every
    // sample (seen on the H200 with 8 PyTorch processes).
    if moving && c.api == UNKNOWN_ENTRY_POINT {
        return false;
    }
    // The journal is exact for launches, synchronizes and copies: a scan alone that puts a
    // thread in one (a sample taken after the journal was read this tick) is a launch-bound
    // thread passing through; H200: "in cuLaunchKernel for ≥ 16.3 s", since attach, for a
    // thread launching all along.
    // (Initialisation is not in the journal: a scan is the only witness there.)
    !(recording && api::class(c.api).is_some_and(|k| k != api::ApiClass::Init))
}

/// A thread that yielded this recently is still spinning (72,000 yields/s when blocked).
const YIELDING_NS: u64 = 100_000_000;
/// See `ThreadState::open_call_active`.
const OPEN_LAUNCH_GRACE_NS: u64 = 500_000_000;

/// A yield rate counted over less than this is not a rate yet (72k/s gives ~7,000 in it).
const YIELD_RATE_MIN_NS: u64 = 100_000_000;

/// A stack-scanned call is believed for this long after its last confirming sample. Samples of
/// a spinning thread come every 200 ms; a sleeping thread is re-read from /proc every 250 ms.
const SCAN_VALID_NS: u64 = 1_000_000_000;

pub struct ProcessState {
    pub target: Target,
    pub code: TargetCode,
    pub attached_ns: u64,
    pub exited: bool,
    pub threads: BTreeMap<u32, ThreadState>,
    /// Threads that existed when wedgeprobe attached: only they can be inside a call that
    /// began before attach (a stack-scanned call).
    pub threads_at_attach: std::collections::BTreeSet<u32>,
    /// Last sign of GPU work: a launch, completion, synchronize or mark in the journal (at
    /// its own time, possibly before attach), or a driver call returning (CLOCK_MONOTONIC ns;
    /// attach time at first, the journal's creation once it is opened).
    pub last_progress_ns: u64,
    /// A shim journal tells the GPU work from before attach: `last_progress_ns` may predate
    /// it. Without one, nothing before attach is known.
    pub progress_known_before_attach: bool,
    /// When the journal last showed GPU work *done* — a kernel completion, a stream mark
    /// passing, a synchronize returning (not a launch, not a driver call returning); 0: never.
    /// Threads waiting on a GPU that is still completing work are busy, not stuck.
    pub last_gpu_done_ns: u64,
    /// When the collector last listed the process's threads, and how many it had then
    /// (`Collector::prune`).
    pub threads_listed: (u64, u32),
    /// Bumped when a thread is added or renamed: `Names::update` copies only processes whose
    /// names changed since it last looked.
    pub names_version: u64,
    /// The threads that may be in a call (probes', journal's or a stack scan's): every place
    /// that sets one adds its thread, and `trim_may_call` drops those found in none. The
    /// passes over calls made every tick visit these, not every thread: a process has ~60
    /// threads and a handful in calls, and five passes over all of them each tick were
    /// processes × threads of work for the daemon (issue 34).
    pub may_call: BTreeSet<u32>,
    /// A CPU reading was taken since the last `clear_cpu` (nothing to clear otherwise).
    pub cpu_read: bool,
}

impl ProcessState {
    /// Drops from `may_call` the threads in no call (and those gone).
    fn trim_may_call(&mut self) {
        let threads = &self.threads;
        self.may_call.retain(|tid| {
            threads.get(tid).is_some_and(|t| {
                t.uprobe_call.is_some() || t.journal_call.is_some() || t.scanned_call.is_some()
            })
        });
    }

    /// The threads of `may_call`, with their state.
    pub fn maybe_in_calls(&self) -> impl Iterator<Item = (u32, &ThreadState)> {
        self.may_call
            .iter()
            .filter_map(|tid| self.threads.get(tid).map(|t| (*tid, t)))
    }
}

/// Latency of finished calls of one entry point.
pub struct ApiLatency {
    pub ns: Histogram<u64>,
    pub errors: u64,
}

pub struct Model {
    pub procs: BTreeMap<u32, ProcessState>,
    pub latency: Vec<ApiLatency>,
    /// (pid, CUfunction/CUkernel handle) → kernel name.
    pub kernel_names: HashMap<(u32, u64), String>,
    /// Sums of the eBPF loss counters.
    pub lost: [u64; probe_common::counters::LEN as usize],
    /// Records on the rings that did not decode (wrong size or kind): counted, never trusted.
    pub bad_records: u64,
    /// Per pid: the oldest in-flight kernel of each stream, from the shim journal.
    pub kernels: HashMap<u32, Vec<crate::model::kernels::StreamHead>>,
    /// Per pid: the state of its shim journal (absent: the process has none).
    pub journals: HashMap<u32, JournalInfo>,
    /// Durations of completed kernels per name, for the kernels' bounds.
    pub history: crate::model::history::History,
    /// `WEDGEPROBE_DEBUG_SCAN` is set: print every stack scan (read once, not per sample).
    debug_scan: bool,
    /// Thread states visited by the passes over calls and CPU made every tick or second
    /// (`WEDGEPROBE_DEBUG_TICK`; what `may_call` bounds).
    pub thread_visits: std::cell::Cell<u64>,
}

/// A shim journal's state, as reports spell it: `recording`, `shim_off`, `released`, or
/// `rejected: <reason>` (wedgeprobe would not read it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum JournalStatus {
    #[default]
    Recording,
    /// The shim turned itself off (one log line in the target says why).
    ShimOff,
    /// `wedgeprobe release` made it give CUPTI back.
    Released,
    /// `wedgeprobe attach` is putting the shim in (its hooks not all in place yet): nothing
    /// is judged from it until it records.
    Attaching,
    Rejected(String),
}

impl JournalStatus {
    /// Whether the journal is read at all (recording or not).
    pub fn is_readable(&self) -> bool {
        !matches!(self, Self::Rejected(_))
    }
}

impl std::fmt::Display for JournalStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Recording => f.write_str("recording"),
            Self::ShimOff => f.write_str("shim_off"),
            Self::Released => f.write_str("released"),
            Self::Attaching => f.write_str("attaching"),
            Self::Rejected(why) => write!(f, "rejected: {why}"),
        }
    }
}

impl serde::Serialize for JournalStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One stream's records while wedgeprobe read a journal (`journal::stream_losses`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StreamLoss {
    /// CUPTI's stream id.
    pub stream_id: u32,
    pub device: u32,
    /// Its records the shim wrote meanwhile (read + lost).
    pub written: u64,
    pub lost: u64,
}

/// What a report says about a process's shim journal.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct JournalInfo {
    pub path: String,
    pub status: JournalStatus,
    pub heartbeat_age_ms: Option<f64>,
    /// How the shim learns completions: `marks` (stream progress marks, the default) or
    /// `per-kernel` (a CUPTI record per kernel: exact names and graph nodes).
    pub record: &'static str,
    /// Per-kernel completion records read (per-kernel mode).
    pub completions_seen: u64,
    /// Stream marks seen advancing (marks mode): each proves every launch before it done.
    pub marks_passed: u64,
    /// Ring records overwritten before wedgeprobe read them.
    pub ring_lost: u64,
    /// Records the ring held when wedgeprobe began reading it (history from before) that a
    /// busy process overwrote before the first read reached them: the look back starts
    /// later, nothing of the window is missing.
    pub ring_history_unread: u64,
    /// The streams those records were on (launch and completion records; synchronizes and
    /// captures are not numbered per stream): each stream that lost any, with its records
    /// written while wedgeprobe read the journal, most lost first.
    pub ring_lost_by_stream: Vec<StreamLoss>,
    /// Ring records deliberately not read (the daemon reads at most the newest few thousand
    /// per process per tick).
    pub ring_skipped: u64,
    /// The shim's own drop counters.
    pub drops: std::collections::BTreeMap<&'static str, u64>,
    /// The shim was put into the running process (`wedgeprobe attach`): its launches from
    /// before are not in the journal.
    pub attached_late: bool,
    /// Why the shim records launches through the driver's callbacks (CUPTI's), the dearer
    /// path, instead of its launch hooks; absent where the hooks record them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch_callbacks: Option<&'static str>,
}

/// One thread inside a driver call, as reports show it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ThreadView {
    pub pid: u32,
    pub tid: u32,
    pub name: String,
    pub api: &'static str,
    /// `api` as its `probe_common::api` id (or UNKNOWN_ENTRY_POINT), for the verdict.
    #[serde(skip)]
    pub api_id: u32,
    pub in_call_ms: f64,
    /// True when the thread was already inside when wedgeprobe attached: `in_call_ms` is then
    /// the time since attach, a lower bound.
    pub in_call_at_least: bool,
    pub blocked: bool,
    pub sched_yield_per_s: f64,
    /// False while the rate of a call found by scan or journal is not known yet (less than
    /// 100 ms of yields counted since it was first seen).
    pub sched_yield_measured: bool,
    /// `CUstream` as hex (`0x0` legacy default, `0x2` per-thread default); null if unknown.
    pub stream: Option<String>,
    /// The launched `CUfunction` / graph exec / event, as hex.
    pub handle: Option<String>,
    /// Kernel name, when a `cuModuleGetFunction`-like lookup of the handle was seen.
    pub kernel: Option<String>,
    pub grid: Option<[u32; 3]>,
    pub block: Option<[u32; 3]>,
    pub seen_by: &'static str,
    /// Reports only, for blocked threads of CPython processes: the Python frames, innermost
    /// first (null when not read or not Python).
    pub python_stack: Option<Vec<String>>,
}

#[cfg(test)]
impl ThreadView {
    /// A thread of pid 1 in `api` for `ms`, blocked at `bound_ms` (tid derived from `ms`, so
    /// threads made with different times are different threads).
    pub fn for_test(api: &'static str, ms: f64, bound_ms: f64) -> Self {
        ThreadView {
            pid: 1,
            tid: ms as u32,
            name: "w".into(),
            api,
            api_id: api::id_of(api).unwrap_or(UNKNOWN_ENTRY_POINT),
            in_call_ms: ms,
            in_call_at_least: false,
            blocked: ms >= bound_ms,
            sched_yield_per_s: 0.0,
            sched_yield_measured: true,
            stream: Some("0x0".into()),
            handle: None,
            kernel: None,
            grid: None,
            block: None,
            seen_by: "uprobe",
            python_stack: None,
        }
    }
}

impl Default for Model {
    fn default() -> Self {
        Self::new()
    }
}

impl Model {
    pub fn new() -> Self {
        let latency = (0..api::COUNT)
            .map(|_| ApiLatency {
                // 1 ns .. 1 hour at 3 significant digits: ~200 KiB per entry point.
                ns: Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
                    .expect("static bounds are valid"),
                errors: 0,
            })
            .collect();
        Self {
            procs: BTreeMap::new(),
            latency,
            kernel_names: HashMap::new(),
            lost: [0; probe_common::counters::LEN as usize],
            bad_records: 0,
            kernels: HashMap::new(),
            journals: HashMap::new(),
            history: Default::default(),
            debug_scan: std::env::var_os("WEDGEPROBE_DEBUG_SCAN").is_some(),
            thread_visits: Default::default(),
        }
    }

    fn visited(&self, n: usize) {
        self.thread_visits.set(self.thread_visits.get() + n as u64);
    }

    pub fn add_process(&mut self, target: Target, code: TargetCode, now_ns: u64) {
        let threads_at_attach = target.threads().into_iter().collect();
        self.procs.insert(
            target.pid,
            ProcessState {
                target,
                code,
                attached_ns: now_ns,
                exited: false,
                threads: BTreeMap::new(),
                threads_at_attach,
                last_progress_ns: now_ns,
                progress_known_before_attach: false,
                last_gpu_done_ns: 0,
                threads_listed: (0, 0),
                names_version: 0,
                may_call: BTreeSet::new(),
                cpu_read: false,
            },
        );
    }

    fn thread(&mut self, pid: u32, tid: u32) -> Option<&mut ThreadState> {
        let p = self.procs.get_mut(&pid)?;
        let target = &p.target;
        let names = &mut p.names_version;
        Some(p.threads.entry(tid).or_insert_with(|| {
            *names += 1;
            ThreadState {
                name: target.thread_name(tid),
                ..Default::default()
            }
        }))
    }

    pub fn on_call_done(&mut self, ev: &CallDone) {
        self.progress(ev.header.tgid, ev.end_ns);
        let api = ev.call.api;
        if let Some(lat) = self.latency.get_mut(api as usize) {
            lat.ns
                .saturating_record(ev.end_ns.saturating_sub(ev.call.start_ns).max(1));
            if ev.result != 0 {
                lat.errors += 1;
            }
        }
        if let Some(t) = self.thread(ev.header.tgid, ev.header.tid) {
            t.traced = true;
            // It returned from something, so it is no longer in the call a scan found.
            t.scanned_call = None;
        }
    }

    pub fn on_kernel_name(&mut self, pid: u32, handle: u64, alias_of: u64, name: &[u8]) {
        let name = if alias_of != 0 {
            match self.kernel_names.get(&(pid, alias_of)) {
                Some(n) => n.clone(),
                None => return,
            }
        } else {
            let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            // Bytes from the target's memory: keep them printable.
            String::from_utf8_lossy(&name[..end])
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect()
        };
        if !name.is_empty() {
            self.kernel_names.insert((pid, handle), name);
        }
    }

    /// A stack sample (on-CPU from eBPF, or off-CPU from /proc): finds the entry point, if any.
    /// A sleeping thread is still where its last scan found it (same sp and pc): that scan's
    /// answer stands, as of now.
    pub fn confirm_scan(&mut self, pid: u32, tid: u32, now_ns: u64) {
        let Some(t) = self.thread(pid, tid) else {
            return;
        };
        if let Some((_, inside)) = t.last_scan {
            t.last_scan = Some((now_ns, inside));
        }
        if let Some(c) = t.scanned_call.as_mut() {
            c.confirmed_ns = now_ns;
        }
    }

    /// Returns whether the stack was inside libcuda.
    pub fn on_stack(&mut self, pid: u32, tid: u32, ip: u64, stack: &[u8], now_ns: u64) -> bool {
        let Some(p) = self.procs.get(&pid) else {
            return false;
        };
        let found = stackscan::entry_point(ip, stack, &p.code).map(|f| match f {
            Found::EntryPoint(id) => id,
            Found::UnknownEntryPoint => UNKNOWN_ENTRY_POINT,
        });
        let attached = p.attached_ns;
        let existed_at_attach = p.threads_at_attach.contains(&tid);
        if self.debug_scan {
            eprintln!(
                "scan pid {pid} tid {tid} -> {found:?}: {}",
                stackscan::explain(ip, stack, &p.code)
            );
        }
        let frames = stackscan::code_words(stack, &p.code, 48);
        let inside = found.is_some();
        let Some(t) = self.thread(pid, tid) else {
            return inside;
        };
        t.last_sample = Some((now_ns, ip, frames));
        t.last_scan = Some((now_ns, inside));
        if t.uprobe_call.is_some() {
            return inside;
        }
        // A call found by scan began before attach: impossible for a thread created since, or
        // one the probes have seen call since (its sample can arrive before its entry is read).
        if !existed_at_attach || t.traced {
            t.scanned_call = None;
            return inside;
        }
        t.scanned(found, attached, now_ns);
        if let Some(p) = self.procs.get_mut(&pid) {
            p.may_call.insert(tid);
        }
        inside
    }

    /// The in-call table as read from WP_IN_CALL; threads absent from it are in no call we saw
    /// begin.
    pub fn set_in_call(&mut self, entries: &[(u32, InCall)]) {
        for p in self.procs.values_mut() {
            self.thread_visits
                .set(self.thread_visits.get() + p.may_call.len() as u64);
            for tid in &p.may_call {
                if let Some(t) = p.threads.get_mut(tid) {
                    t.uprobe_call = None;
                }
            }
        }
        for (tid, call) in entries {
            if let Some(p) = self.procs.get_mut(&call.tgid) {
                p.may_call.insert(*tid);
            }
            if let Some(t) = self.thread(call.tgid, *tid) {
                t.uprobe_call = Some(CurrentCall {
                    api: call.api,
                    since_ns: call.start_ns,
                    seen_by: SeenBy::Uprobe,
                    args: Some(*call),
                    yields_at_first_seen: None,
                    confirmed_ns: call.start_ns,
                });
                t.scanned_call = None;
                t.traced = true;
            }
        }
        for p in self.procs.values_mut() {
            p.trim_may_call();
        }
    }

    /// The shim journal's "thread T is inside API X since S" slots: a call found by stack scan
    /// (begun before attach) gets its exact start, when the journal agrees on the entry point.
    /// The journal's per-thread slots: which threads the shim sees inside a call now. They
    /// replace what the last call said (a thread absent from `calls` is in no call the shim
    /// traces), and refine stack-scanned calls with their exact start.
    pub fn set_journal_calls(
        &mut self,
        pid: u32,
        calls: &[crate::model::ThreadInCall],
        now_ns: u64,
    ) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        self.thread_visits
            .set(self.thread_visits.get() + p.may_call.len() as u64);
        for &tid in &p.may_call {
            let Some(t) = p.threads.get_mut(&tid) else {
                continue;
            };
            if !calls.iter().any(|c| c.tid == tid) {
                t.journal_call = None;
                // The shim sees every launch, synchronize and copy: a stack scan that put
                // the thread inside one of those is stale (a launch-bound thread is inside
                // libcuda at nearly every sample, a new launch each time).
                if t.scanned_call
                    .as_ref()
                    .is_some_and(|sc| api::class(sc.api).is_some())
                {
                    t.scanned_call = None;
                }
            }
        }
        for c in calls {
            if api::class(c.api).is_none() {
                continue;
            }
            // The name is read for a thread new to the model only (read for every thread in
            // a call every tick, it was 11% of the daemon's CPU at 64 processes).
            let target = &p.target;
            let names = &mut p.names_version;
            p.may_call.insert(c.tid);
            let t = p.threads.entry(c.tid).or_insert_with(|| {
                *names += 1;
                ThreadState {
                    name: target.thread_name(c.tid),
                    ..ThreadState::default()
                }
            });
            let same = t
                .journal_call
                .as_ref()
                .is_some_and(|j| j.api == c.api && j.since_ns == c.since_ns);
            if !same {
                t.journal_call = Some(CurrentCall {
                    api: c.api,
                    since_ns: c.since_ns,
                    seen_by: SeenBy::Journal,
                    args: None,
                    yields_at_first_seen: None,
                    confirmed_ns: now_ns,
                });
            }
            t.refine_scan(c.api, c.since_ns);
        }
        p.trim_may_call();
    }

    pub fn set_yields(&mut self, pid: u32, tid: u32, total: u64, now_ns: u64) {
        if let Some(t) = self
            .procs
            .get_mut(&pid)
            .and_then(|p| p.threads.get_mut(&tid))
        {
            t.note_yields(total, now_ns);
        }
    }

    /// Threads whose yield count is used: those in a call found by stack scan or journal (a
    /// call seen by both probes carries its own count). Reading every thread's cost one map
    /// lookup per thread per tick — ~60 threads per PyTorch process.
    pub fn threads_needing_yields(&self) -> Vec<(u32, u32)> {
        self.visited(self.procs.values().map(|p| p.may_call.len()).sum());
        self.procs
            .iter()
            .flat_map(|(&pid, p)| {
                p.maybe_in_calls()
                    .filter(|(_, t)| t.journal_call.is_some() || t.scanned_call.is_some())
                    .map(move |(tid, _)| (pid, tid))
            })
            .collect()
    }

    /// Finished calls per entry point that has any (report and daemon alike).
    pub fn finished_calls(&self) -> impl Iterator<Item = (&'static str, &ApiLatency)> {
        self.latency
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.ns.is_empty())
            .map(|(id, l)| (api_name(id as u32), l))
    }

    /// What the eBPF side could not record, by reason, and journal-ring records that did not
    /// decode (report and daemon alike; the reserved counter slots are left out).
    pub fn losses(&self) -> std::collections::BTreeMap<&'static str, u64> {
        let mut lost: std::collections::BTreeMap<&'static str, u64> = probe_common::counters::NAMES
            .iter()
            .zip(self.lost)
            .filter(|(n, _)| !n.starts_with("reserved"))
            .map(|(n, v)| (*n, v))
            .collect();
        lost.insert("undecodable_records", self.bad_records);
        lost
    }

    /// Every thread inside a driver call right now, longest first.
    pub fn threads_in_calls(&self, now_ns: u64, blocked_after_ns: u64) -> Vec<ThreadView> {
        let mut out = Vec::new();
        for (&pid, p) in &self.procs {
            let recording = self
                .journals
                .get(&pid)
                .is_some_and(|j| j.status == JournalStatus::Recording);
            let moving = recording && now_ns.saturating_sub(p.last_progress_ns) < 1_000_000_000;
            self.visited(p.may_call.len());
            for (tid, t) in p.maybe_in_calls() {
                let Some(c) = t.current(now_ns) else { continue };
                if !believed(c, recording, moving) {
                    continue;
                }
                let in_call_ns = now_ns.saturating_sub(c.since_ns);
                let (sched_yield_per_s, sched_yield_measured) =
                    c.yield_rate(t.yields_total, now_ns);
                let args = c.args.as_ref();
                let has_stream = args.is_some_and(|a| {
                    matches!(
                        api::shape(a.api),
                        Some(
                            api::ArgShape::Launch
                                | api::ArgShape::LaunchEx
                                | api::ArgShape::GraphLaunch
                                | api::ArgShape::StreamSync
                        )
                    )
                });
                let is_launch = args.is_some_and(|a| {
                    matches!(
                        api::shape(a.api),
                        Some(api::ArgShape::Launch | api::ArgShape::LaunchEx)
                    )
                });
                out.push(ThreadView {
                    pid,
                    tid,
                    name: t.name.clone(),
                    api: api_name(c.api),
                    api_id: c.api,
                    in_call_ms: in_call_ns as f64 / 1e6,
                    in_call_at_least: c.seen_by == SeenBy::StackScan,
                    blocked: in_call_ns >= blocked_after_ns,
                    sched_yield_per_s,
                    sched_yield_measured,
                    stream: args
                        .filter(|_| has_stream)
                        .map(|a| format!("{:#x}", a.stream)),
                    handle: args
                        .filter(|a| a.handle != 0)
                        .map(|a| format!("{:#x}", a.handle)),
                    kernel: args
                        .filter(|_| is_launch)
                        .and_then(|a| self.kernel_names.get(&(pid, a.handle)).cloned()),
                    grid: args.filter(|_| is_launch).map(|a| a.grid),
                    block: args.filter(|_| is_launch).map(|a| a.block),
                    seen_by: c.seen_by.as_str(),
                    python_stack: None,
                });
            }
        }
        out.sort_by(|a, b| b.in_call_ms.total_cmp(&a.in_call_ms));
        out
    }

    /// Everything about `pid` (the daemon forgets processes that exited).
    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
        self.kernel_names.retain(|(p, _), _| *p != pid);
        self.kernels.remove(&pid);
        self.journals.remove(&pid);
        self.history.forget(pid);
    }

    /// Some target's shim journal is being read (so kernels can be named).
    pub fn journal_read(&self) -> bool {
        self.journals.values().any(|j| j.status.is_readable())
    }

    /// Whether `pid`'s kernels are known: its shim journal is recording (without one, eBPF
    /// alone cannot see what runs on the GPU).
    pub fn kernels_known(&self, pid: u32) -> bool {
        self.journals
            .get(&pid)
            .is_some_and(|j| j.status == JournalStatus::Recording)
    }

    /// Every process's stream heads, longest running first.
    pub fn kernel_heads(&self) -> Vec<crate::model::kernels::StreamHead> {
        let mut heads: Vec<_> = self.kernels.values().flatten().cloned().collect();
        heads.sort_by(|a, b| b.running_ms.total_cmp(&a.running_ms));
        heads
    }

    /// Something of `pid`'s GPU work moved at `at_ns`.
    pub fn progress(&mut self, pid: u32, at_ns: u64) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.last_progress_ns = p.last_progress_ns.max(at_ns);
        }
    }

    /// The journal showed some of `pid`'s GPU work done at `at_ns` (see `last_gpu_done_ns`).
    pub fn gpu_done(&mut self, pid: u32, at_ns: u64) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.last_gpu_done_ns = p.last_gpu_done_ns.max(at_ns);
        }
    }

    /// `pid`'s recording journal showed GPU work done within `recent_ns` of `now_ns`.
    pub fn gpu_completing(&self, pid: u32, now_ns: u64, recent_ns: u64) -> Option<u64> {
        let p = self.procs.get(&pid)?;
        let ago = now_ns.saturating_sub(p.last_gpu_done_ns);
        (self.kernels_known(pid) && p.last_gpu_done_ns > 0 && ago < recent_ns).then_some(ago)
    }

    /// `pid`'s shim journal, created at `created_ns`, is read from now on: it holds every
    /// launch and completion since then, so the last sign of GPU work is what it says (the
    /// creation itself when it says nothing) — possibly long before attach. A stall that
    /// began before attach is then measured from its real start (a boot deadlock
    /// reported healthy because `--stall-after` counted from attach).
    pub fn journal_opened(&mut self, pid: u32, created_ns: u64) {
        if let Some(p) = self.procs.get_mut(&pid)
            && !p.progress_known_before_attach
        {
            p.progress_known_before_attach = true;
            p.last_progress_ns = if created_ns <= p.attached_ns {
                created_ns
            } else {
                // CUDA initialised after attach: nothing before it to know.
                p.last_progress_ns.max(created_ns)
            };
        }
    }

    /// Per-thread CPU use, read from /proc once a second.
    pub fn set_cpu(&mut self, pid: u32, tid: u32, cpu: CpuTime, now_ns: u64) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.cpu_read = true;
        }
        if let Some(t) = self.thread(pid, tid) {
            t.cpu_reading(cpu, now_ns);
        }
    }

    /// The shim's dating of its threads' spins (`ThreadState::shim_busy_since`). A thread
    /// whose first CPU reading came before the shim's dating was known is read afresh, a
    /// second later, from the shim's.
    pub fn set_shim_busy(&mut self, pid: u32, busy: &[(u32, u64)]) {
        for &(tid, since) in busy {
            let Some(t) = self
                .procs
                .get_mut(&pid)
                .and_then(|p| p.threads.get_mut(&tid))
            else {
                // Threads not seen otherwise yet: their first CPU reading will find this.
                if let Some(t) = self.thread(pid, tid) {
                    t.shim_busy_since = Some(since);
                }
                continue;
            };
            if t.shim_busy_since.is_none() && t.cpu_last.is_some() {
                t.cpu_last = None;
                t.busy_since_ns = 0;
                t.busy_from_start_ns = None;
            }
            t.shim_busy_since = Some(since);
        }
    }

    /// GPU work moves again: per-thread CPU is not read meanwhile, and a later reading starts
    /// afresh (no thread is busy "since" before the pause).
    pub fn clear_cpu(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid)
            && std::mem::take(&mut p.cpu_read)
        {
            self.thread_visits
                .set(self.thread_visits.get() + p.threads.len() as u64);
            for t in p.threads.values_mut() {
                t.cpu_last = None;
                t.cpu_pct = 0.0;
                t.waiting_pct = 0.0;
                t.busy_since_ns = 0;
                t.busy_from_start_ns = None;
            }
        }
    }

    /// Forgets threads that no longer exist; returns their tids so their map entries go too.
    pub fn prune_threads(&mut self, pid: u32, alive: &[u32]) -> Vec<u32> {
        let Some(p) = self.procs.get_mut(&pid) else {
            return Vec::new();
        };
        let gone: Vec<u32> = p
            .threads
            .keys()
            .copied()
            .filter(|t| alive.binary_search(t).is_err())
            .collect();
        for t in &gone {
            p.threads.remove(t);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 34: a tick's passes over calls visit the threads in calls, not every thread —
    /// 64 processes of 61 threads made five passes over ~3,900 thread states a tick.
    #[test]
    fn a_tick_visits_the_threads_in_calls_not_every_thread() {
        let pid = std::process::id();
        let mut m = Model::new();
        let target = crate::process::target::Target::for_test(pid);
        let code = crate::process::code::TargetCode::empty(pid);
        m.add_process(target, code, 0);
        let launch = api::id_of("cuLaunchKernel").unwrap();
        // 300 threads the model knows (a CPU reading of each), one of them in a launch.
        for tid in 1..=300 {
            m.set_cpu(pid, tid, CpuTime::default(), 1_000);
        }
        m.clear_cpu(pid);
        let calls = [ThreadInCall {
            tid: 7,
            api: launch,
            since_ns: 5_000,
            correlation: 1,
        }];
        let now = 3_000_000_000;
        m.set_journal_calls(pid, &calls, now);
        m.thread_visits.set(0);
        // One tick's passes, twice: the first after the launch began, the second after it
        // returned.
        for calls in [&calls[..], &[]] {
            m.set_in_call(&[]);
            m.set_journal_calls(pid, calls, now);
            m.threads_needing_yields();
            let in_calls = m.threads_in_calls(now, 1_000_000_000);
            assert_eq!(
                in_calls.iter().map(|t| t.tid).collect::<Vec<_>>(),
                if calls.is_empty() { vec![] } else { vec![7] }
            );
            m.clear_cpu(pid);
        }
        assert!(
            m.thread_visits.get() <= 10,
            "{} thread states visited for one thread in a call among 300",
            m.thread_visits.get()
        );
        // The thread's call ended: it is no longer among those visited.
        assert!(m.procs[&pid].may_call.is_empty());
    }

    const MS: u64 = 1_000_000;

    fn open_launch(start_ns: u64, yields: u64, last_yield_ns: u64) -> ThreadState {
        let args = InCall {
            start_ns,
            yields,
            last_yield_ns,
            flags: CALL_OPEN_ENDED,
            ..InCall::default()
        };
        ThreadState {
            uprobe_call: Some(CurrentCall {
                api: 0,
                since_ns: start_ns,
                seen_by: SeenBy::Uprobe,
                args: Some(args),
                yields_at_first_seen: None,
                confirmed_ns: start_ns,
            }),
            ..ThreadState::default()
        }
    }

    #[test]
    fn open_launch_that_keeps_yielding_is_inside() {
        let t = open_launch(1000 * MS, 50_000, 4990 * MS);
        assert!(t.current(5000 * MS).is_some());
        assert!(!t.call_is_exact());
    }

    #[test]
    fn open_launch_that_stopped_yielding_and_was_seen_outside_has_returned() {
        let mut t = open_launch(1000 * MS, 50_000, 1200 * MS);
        t.last_scan = Some((1300 * MS, false));
        assert!(t.current(5000 * MS).is_none());
    }

    #[test]
    fn open_launch_confirmed_by_a_sample_is_inside() {
        let mut t = open_launch(1000 * MS, 0, 0);
        t.last_scan = Some((4900 * MS, true));
        assert!(t.current(5000 * MS).is_some());
    }

    #[test]
    fn open_launch_with_no_evidence_is_inside_only_while_young() {
        let mut t = open_launch(1000 * MS, 0, 0);
        // A sample from before the launch began says nothing about it.
        t.last_scan = Some((900 * MS, true));
        assert!(t.current(1100 * MS).is_some());
        assert!(t.current(2000 * MS).is_none());
    }

    #[test]
    fn with_a_recording_journal_a_scan_alone_never_puts_a_thread_in_a_launch() {
        let call = |api, seen_by| CurrentCall {
            api,
            since_ns: 0,
            seen_by,
            args: None,
            yields_at_first_seen: None,
            confirmed_ns: 0,
        };
        let launch = api::id_of("cuLaunchKernel").unwrap();
        let scanned = call(launch, SeenBy::StackScan);
        assert!(!believed(&scanned, true, false));
        assert!(
            believed(&scanned, false, false),
            "no journal: the scan is all there is"
        );
        assert!(believed(
            &call(launch, SeenBy::StackScanAndJournal),
            true,
            true
        ));
        assert!(believed(&call(launch, SeenBy::Journal), true, true));
        let unknown = call(UNKNOWN_ENTRY_POINT, SeenBy::StackScan);
        assert!(!believed(&unknown, true, true));
        assert!(
            believed(&unknown, true, false),
            "GPU work stopped: it may be stuck there"
        );
    }

    /// A launch blocked since before attach, found by scan and named by the journal, yields
    /// ~2.4 M/s (the H200's triton-wedge with the shim). A sample whose scan reads the shim's
    /// hook frames as "entry point unknown", or names the entry point again after one that
    /// could not, is the same call: its rate stays measured over the whole time watched.
    #[test]
    fn a_rescanned_call_keeps_its_yield_rate() {
        let launch = api::id_of("cuLaunchKernel").unwrap();
        let (attach, since) = (10_000 * MS, 6_000 * MS);
        let mut t = ThreadState {
            journal_call: Some(CurrentCall {
                api: launch,
                since_ns: since,
                seen_by: SeenBy::Journal,
                args: None,
                yields_at_first_seen: None,
                confirmed_ns: attach,
            }),
            ..ThreadState::default()
        };
        let rate = |t: &ThreadState, now| {
            let c = t.current(now).expect("in the launch");
            c.yield_rate(t.yields_total, now)
        };
        t.scanned(Some(launch), attach, attach);
        t.note_yields(0, attach);
        t.refine_scan(launch, since);
        t.note_yields(2_400_000, attach + 1_000 * MS);
        assert_eq!(rate(&t, attach + 1_000 * MS), (2_400_000.0, true));
        // A scan that cannot name it, then one that names it again: the slot is made again.
        t.scanned(Some(UNKNOWN_ENTRY_POINT), attach, attach + 1_100 * MS);
        t.scanned(Some(launch + 1), attach, attach + 1_150 * MS);
        t.scanned(Some(launch), attach, attach + 1_200 * MS);
        t.refine_scan(launch, since);
        t.note_yields(2_880_000, attach + 1_200 * MS);
        let (per_s, measured) = rate(&t, attach + 1_200 * MS);
        assert!(measured, "the same call: its rate is known");
        assert_eq!(per_s.round(), 2_400_000.0);
        assert_eq!(t.current(attach + 1_200 * MS).unwrap().since_ns, since);
    }

    /// A spinner that dips below 80% for one reading (sharing a core) stays busy since it
    /// began; one that stops spinning does not. Without the shim's readings a thread is busy
    /// at most since its first reading, however busy its life was: a life's average is not a
    /// start (the H200 soak: a serving thread's 93 s of CPU taken for a spin).
    #[test]
    fn busy_is_the_average_since_the_spin_began() {
        let s = 1_000 * MS;
        let on = |ns: u64| CpuTime {
            on_cpu_ns: ns,
            waiting_ns: 0,
        };
        let mut t = ThreadState::default();
        t.cpu_reading(on(0), 10 * s);
        t.cpu_reading(on(s), 11 * s); // 100%
        assert_eq!(t.busy_since_ns, 10 * s);
        assert_eq!(t.first_cpu_ns, 10 * s);
        t.cpu_reading(on(17 * s / 10), 12 * s); // 70% this second, 85% since 10 s
        assert_eq!(t.busy_since_ns, 10 * s, "one dip does not restart the spin");
        t.cpu_reading(on(175 * s / 100), 13 * s); // 5%: 58% since 10 s
        assert_eq!(t.busy_since_ns, 0, "a thread that stopped is not busy");
        // 29 s of CPU in a 30 s life at the first reading: busy from that reading only.
        let mut u = ThreadState::default();
        u.cpu_reading(on(29 * s), 100 * s);
        u.cpu_reading(on(30 * s), 101 * s);
        assert_eq!(u.busy_since_ns, 100 * s);
    }

    /// Where the shim read a thread's CPU clock, its dating is the spin's start: 2 s into a
    /// spin by the shim's readings, busy since then; one the shim found not busy is busy from
    /// the first busy reading only; and a spin the shim dated stops as any other.
    #[test]
    fn the_shims_dating_of_a_spin_is_its_start() {
        let s = 1_000 * MS;
        let on = |ns: u64| CpuTime {
            on_cpu_ns: ns,
            waiting_ns: 0,
        };
        let mut t = ThreadState {
            shim_busy_since: Some(398 * s),
            ..Default::default()
        };
        t.cpu_reading(on(290 * s), 400 * s);
        t.cpu_reading(on(291 * s), 401 * s);
        assert_eq!(t.busy_since_ns, 398 * s);
        t.cpu_reading(on(291 * s + s / 10), 402 * s); // 10%: 78% since 398 s
        assert_eq!(t.busy_since_ns, 0, "stopped");
        let mut u = ThreadState {
            shim_busy_since: Some(0),
            ..Default::default()
        };
        u.cpu_reading(on(290 * s), 400 * s);
        u.cpu_reading(on(291 * s), 401 * s);
        assert_eq!(u.busy_since_ns, 400 * s);
    }

    /// A spinner that gets 60% of a core and waits for one the other 38% is busy; a thread
    /// that sleeps half the time is not, however its on-CPU time splits.
    #[test]
    fn busy_counts_the_time_waiting_for_a_core() {
        let s = 1_000 * MS;
        let mut t = ThreadState::default();
        t.cpu_reading(CpuTime::default(), 10 * s);
        t.cpu_reading(
            CpuTime {
                on_cpu_ns: 6 * s / 10,
                waiting_ns: 38 * s / 100,
            },
            11 * s,
        );
        assert_eq!(t.busy_since_ns, 10 * s);
        assert!((t.cpu_pct - 60.0).abs() < 1e-9 && (t.waiting_pct - 38.0).abs() < 1e-9);
        let mut u = ThreadState::default();
        u.cpu_reading(CpuTime::default(), 10 * s);
        u.cpu_reading(
            CpuTime {
                on_cpu_ns: 4 * s / 10,
                waiting_ns: s / 10,
            },
            11 * s,
        );
        assert_eq!(u.busy_since_ns, 0);
    }

    #[test]
    fn closed_calls_need_no_inference() {
        let mut t = open_launch(1000 * MS, 0, 0);
        if let Some(c) = t.uprobe_call.as_mut().and_then(|c| c.args.as_mut()) {
            c.flags = 0;
        }
        assert!(t.call_is_exact());
        assert!(t.current(9000 * MS).is_some());
    }
}
