//! Measurement switch `WEDGEPROBE_SHIM_MEASURE=self_cost`: the shim times its own work on the
//! launch path with the TSC and says at exit what a launch and a mark cost it, and why each
//! mark was written. On the H200 VM a process's speed varies ±10–25% between processes and
//! from one second to the next (BENCHMARKS.md, the recorder's price, 2026-12-01), more than the shim's whole cost
//! in a serving loop; the shim's own time, summed over every launch of a real run, is not
//! drowned by that. What it leaves out: the detour's jump (priced in C, base vs `pass`) and
//! any slowdown of the driver's own work after ours (cache lines we evicted).
//!
//! Off, it costs three relaxed loads per hooked launch.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

pub static ON: AtomicBool = AtomicBool::new(false);
/// `WEDGEPROBE_SHIM_MEASURE=self_cost,phases`: a launch's time split by phase too. Off by
/// default: the phase timer reads the TSC ten more times a launch (17 ns each on the H200, 16
/// on the development VM), and the total then carries them (~170 ns, BENCHMARKS.md, 2026-12-01).
pub static BY_PHASE: AtomicBool = AtomicBool::new(false);

/// Why a mark was written (`Marks::mark`'s callers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Before the first launch after an idle gap (the launch before the gap).
    Gap,
    /// After the first launch after an idle gap.
    AfterGap,
    /// After the thread's first launch since its synchronize.
    AfterSync,
    /// The stream's `every` launches since its last mark.
    Every,
    /// `us` since the stream's last mark.
    Period,
    /// After a graph launch (always).
    Graph,
    /// By the flush thread, the stream idle.
    Idle,
    /// Before the first launch on a stream after `wedgeprobe attach` (its earlier work).
    PreAttach,
}

const REASONS: usize = 8;
const NAMES: [&str; REASONS] = [
    "before a gap",
    "after a gap",
    "after a sync",
    "every N",
    "period",
    "graph launch",
    "idle",
    "before attach",
];

/// Where a recorded launch's time goes (`Phases`).
#[derive(Clone, Copy)]
pub enum Phase {
    /// Correlation id, clock, the thread's "inside" slot.
    Enter,
    /// Context, stream id, kernel name (per-thread caches).
    Resolve,
    /// The mark decision, the ring record, the in-flight slot.
    Record,
    /// After the driver's call: the thread's slot cleared, the mark after (its stream write
    /// is in the mark figures too).
    Exit,
}

const PHASES: usize = 4;
const PHASE_NAMES: [&str; PHASES] = ["enter", "resolve", "record", "exit"];
static PHASE_TICKS: [AtomicU64; PHASES] = [const { AtomicU64::new(0) }; PHASES];

/// Phase timer: free when the switch is off (one relaxed load at `start`).
pub struct Phases(u64);

impl Phases {
    #[inline]
    pub fn start() -> Self {
        Self(if BY_PHASE.load(Relaxed) { tsc() } else { 0 })
    }

    /// `start` where `on` (the caller's copy of `on()`) says timing is on at all: otherwise
    /// not even `BY_PHASE` is read (a cache line of its own on a launch's path).
    #[inline]
    pub fn start_if(on: bool) -> Self {
        if on { Self::start() } else { Self(0) }
    }

    #[inline]
    pub fn next(&mut self, phase: Phase) {
        if self.0 != 0 {
            let t = tsc();
            PHASE_TICKS[phase as usize].fetch_add(t.wrapping_sub(self.0), Relaxed);
            self.0 = tsc();
        }
    }
}

static LAUNCHES: AtomicU64 = AtomicU64::new(0);
static LAUNCH_TICKS: AtomicU64 = AtomicU64::new(0);
static MARKS: [AtomicU64; REASONS] = [const { AtomicU64::new(0) }; REASONS];
static MARK_TICKS: AtomicU64 = AtomicU64::new(0);
static EVENT_MARKS: AtomicU64 = AtomicU64::new(0);
static EVENT_TICKS: AtomicU64 = AtomicU64::new(0);
static POLLS: AtomicU64 = AtomicU64::new(0);
static POLL_QUERIES: AtomicU64 = AtomicU64::new(0);
static POLL_TICKS: AtomicU64 = AtomicU64::new(0);
static START_TSC: AtomicU64 = AtomicU64::new(0);
static START_NS: AtomicU64 = AtomicU64::new(0);

#[inline]
pub fn on() -> bool {
    ON.load(Relaxed)
}

#[inline]
pub fn tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no preconditions.
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    crate::clock::monotonic_ns()
}

pub fn enable() {
    START_TSC.store(tsc(), Relaxed);
    START_NS.store(crate::clock::monotonic_ns(), Relaxed);
    ON.store(true, Relaxed);
}

/// One hooked launch: `ticks` spent in the shim around the driver's call (marks included).
pub fn launch(ticks: u64) {
    LAUNCHES.fetch_add(1, Relaxed);
    LAUNCH_TICKS.fetch_add(ticks, Relaxed);
}

/// One mark enqueued (`event`: as an event record, else a stream write), `ticks` in it.
pub fn mark(reason: Reason, event: bool, ticks: u64) {
    MARKS[reason as usize].fetch_add(1, Relaxed);
    MARK_TICKS.fetch_add(ticks, Relaxed);
    if event {
        EVENT_MARKS.fetch_add(1, Relaxed);
        EVENT_TICKS.fetch_add(ticks, Relaxed);
    }
}

/// One poll of the event marks by the flush thread: `queries` cuEventQuery calls, `ticks`.
pub fn poll(queries: u32, ticks: u64) {
    POLLS.fetch_add(1, Relaxed);
    POLL_QUERIES.fetch_add(queries as u64, Relaxed);
    POLL_TICKS.fetch_add(ticks, Relaxed);
}

/// The exit line.
pub fn line() -> Option<String> {
    if !on() {
        return None;
    }
    let ticks = tsc().wrapping_sub(START_TSC.load(Relaxed)) as f64;
    let ns = crate::clock::monotonic_ns().saturating_sub(START_NS.load(Relaxed)) as f64;
    let per_tick = if ticks > 0.0 { ns / ticks } else { 0.0 };
    let launches = LAUNCHES.load(Relaxed);
    let marks: u64 = MARKS.iter().map(|m| m.load(Relaxed)).sum();
    let avg = |t: &AtomicU64, n: u64| {
        if n == 0 {
            0.0
        } else {
            t.load(Relaxed) as f64 * per_tick / n as f64
        }
    };
    let reasons: Vec<String> = NAMES
        .iter()
        .zip(&MARKS)
        .map(|(n, m)| format!("{} {n}", m.load(Relaxed)))
        .collect();
    let events = EVENT_MARKS.load(Relaxed);
    let writes = marks - events;
    let write_ticks = AtomicU64::new(
        MARK_TICKS
            .load(Relaxed)
            .saturating_sub(EVENT_TICKS.load(Relaxed)),
    );
    let polls = POLLS.load(Relaxed);
    let phases = if BY_PHASE.load(Relaxed) {
        let each: Vec<String> = PHASE_NAMES
            .iter()
            .zip(&PHASE_TICKS)
            .map(|(n, t)| format!("{n} {:.0}", avg(t, launches)))
            .collect();
        format!(
            "by phase, ns per launch, the phase timer's reads included: {}",
            each.join(", ")
        )
    } else {
        "phases not timed".to_string()
    };
    Some(format!(
        "self cost: {launches} launches, {:.0} ns each in the shim (marks included; {}); {marks} marks ({:.3} per launch), {:.0} ns each [{}]: {events} \
         event records ({:.0} ns each), {writes} stream writes ({:.0} ns each); flush thread: \
         {polls} event polls, {} queries, {:.1} µs each poll; over {:.1} s",
        avg(&LAUNCH_TICKS, launches),
        phases,
        if launches == 0 {
            0.0
        } else {
            marks as f64 / launches as f64
        },
        avg(&MARK_TICKS, marks),
        reasons.join(", "),
        avg(&EVENT_TICKS, events),
        avg(&write_ticks, writes),
        POLL_QUERIES.load(Relaxed),
        avg(&POLL_TICKS, polls) / 1e3,
        ns / 1e9
    ))
}
