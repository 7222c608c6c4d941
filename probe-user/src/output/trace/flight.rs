//! The flight recorder: while attached, the last N seconds of trace events stay in memory;
//! when a verdict says something is wrong, they are written as a Chrome trace
//! (`<dir>/<host>-<pid>-<time>.trace.json.gz`) with the JSON report beside it — once per
//! incident, so a wedge that lasts an hour gives one dump, not one per tick.
//!
//! Memory is bounded twice: by age (`seconds`, default 30) and by count (`max_events`,
//! default 500,000 — about 60 MB). A launch-bound process makes ~100,000 launches a second
//! (two events each with the shim), so under that load the count bound wins and the dump
//! covers less than N seconds; the events evicted early are counted and the dump says how
//! many seconds it really holds.
//!
//! The daemon holds no journal launches or completions here: a dump takes the incident
//! process's from its journal ring (`Collector::ring_events`, up to `max_events` of the last
//! N seconds), which the shim keeps anyway and which stops moving when the process wedges.
//! One node-wide recorder let busy neighbours evict a wedged process's own launches before
//! its wedge was declared, and copying every record into it was most of the daemon's CPU.

use std::{
    collections::{HashSet, VecDeque},
    path::{Path, PathBuf},
};

use super::chrome::{ChromeTrace, TraceError};
use crate::{
    model::event::{Names, TraceEvent},
    verdict::VerdictKind,
};

#[derive(Clone, Debug)]
pub struct FlightConfig {
    pub dir: PathBuf,
    pub seconds: f64,
    pub max_events: usize,
}

pub struct FlightRecorder {
    pub config: FlightConfig,
    events: VecDeque<TraceEvent>,
    /// Evicted by the count bound before they aged out.
    pub evicted_early: u64,
    /// Incidents already dumped: (pid, verdict kind). Cleared for a pid when its verdict is
    /// healthy again, so the next incident dumps anew.
    dumped: HashSet<(u32, VerdictKind)>,
    pub dumps_failed: u64,
}

/// Where one dump went.
#[derive(Debug)]
pub struct Dump {
    pub trace: PathBuf,
    pub report: PathBuf,
    pub events: u64,
    pub seconds_held: f64,
}

impl FlightRecorder {
    pub fn new(config: FlightConfig) -> Self {
        Self {
            config,
            events: VecDeque::new(),
            evicted_early: 0,
            dumped: HashSet::new(),
            dumps_failed: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    pub fn push(&mut self, evs: impl IntoIterator<Item = TraceEvent>, now_ns: u64) {
        for e in evs {
            if self.events.len() >= self.config.max_events {
                self.events.pop_front();
                self.evicted_early += 1;
            }
            self.events.push_back(e);
        }
        let horizon = now_ns.saturating_sub((self.config.seconds * 1e9) as u64);
        while self.events.front().is_some_and(|e| e.ts_ns() < horizon) {
            self.events.pop_front();
        }
    }

    /// Whether (pid, kind) starts a new incident now; marks it dumped. A healthy (or busy)
    /// verdict for `pid` re-arms it.
    pub fn should_dump(&mut self, pid: u32, kind: VerdictKind) -> bool {
        if !kind.is_incident() {
            self.dumped.retain(|(p, _)| *p != pid);
            return false;
        }
        self.dumped.insert((pid, kind))
    }

    /// `pid` exited: its incidents go. Kept, the set grew by one entry per process that
    /// exited in an incident (a daemon watches processes come and go for months), and a new
    /// process given the same pid and judged in an incident from its first verdict would
    /// have had its dump taken for the old one's.
    pub fn forget(&mut self, pid: u32) {
        self.dumped.retain(|(p, _)| *p != pid);
    }

    /// Incidents remembered as dumped (the daemon's tables' entries count them).
    pub fn incidents_held(&self) -> usize {
        self.dumped.len()
    }

    /// An incident of `pid` now: the report of the whole model (`ev`, the pipeline's
    /// evaluation of it) and what is still open go with the held events (`watch`, `run` and
    /// the daemon, through the engine).
    #[allow(clippy::too_many_arguments)]
    pub fn dump_incident(
        &mut self,
        model: &crate::model::Model,
        facts: &std::collections::HashMap<u32, crate::output::report::TargetFacts>,
        ev: &crate::verdict::Evaluation,
        names: &Names,
        pid: u32,
        now_ns: u64,
        observed_ms: f64,
        blocked_after_ms: f64,
        launch_returns: bool,
        ring: Vec<TraceEvent>,
    ) -> Result<Dump, anyhow::Error> {
        let report = crate::output::report::Report::build(
            model,
            facts,
            ev,
            now_ns,
            observed_ms,
            blocked_after_ms,
            launch_returns,
        );
        let open = crate::model::event::open_now(model, now_ns, (blocked_after_ms * 1e6) as u64);
        let result = self.write_dump(
            &crate::sys::hostname(),
            pid,
            now_ns,
            crate::sys::realtime_ns(),
            ring,
            open,
            names,
            &serde_json::to_value(&report).unwrap_or_default(),
        );
        if result.is_err() {
            self.dumps_failed += 1;
        }
        result
    }

    /// Writes the held events, `ring` (what the incident's journal ring holds:
    /// `Collector::ring_events`) and `open` (what is still running now) as a gzip Chrome
    /// trace, and `report_json` beside it.
    #[allow(clippy::too_many_arguments)]
    fn write_dump(
        &self,
        host: &str,
        pid: u32,
        now_ns: u64,
        real_ns: u64,
        ring: Vec<TraceEvent>,
        open: Vec<TraceEvent>,
        names: &Names,
        report_json: &serde_json::Value,
    ) -> Result<Dump, anyhow::Error> {
        use anyhow::Context as _;
        std::fs::create_dir_all(&self.config.dir)
            .with_context(|| format!("cannot create {}", self.config.dir.display()))?;
        let stamp = utc_stamp(real_ns);
        let base = format!("{}-{pid}-{stamp}", sanitize(host));
        let trace_path = self.config.dir.join(format!("{base}.trace.json.gz"));
        let report_path = self.config.dir.join(format!("{base}.report.json"));
        let mut all: Vec<&TraceEvent> = self
            .events
            .iter()
            .chain(ring.iter())
            .chain(open.iter())
            .collect();
        all.sort_by_key(|e| super::chrome::order(e));
        let mut trace = ChromeTrace::create(&trace_path, now_ns, real_ns)?;
        for e in &all {
            trace.write(e, names)?;
        }
        trace.mark_end(&open, now_ns)?;
        let events = trace.events;
        trace.finish()?;
        write_file(&report_path, report_json)?;
        let oldest = self
            .events
            .front()
            .into_iter()
            .chain(ring.first())
            .map(TraceEvent::ts_ns)
            .min()
            .unwrap_or(now_ns);
        Ok(Dump {
            trace: trace_path,
            report: report_path,
            events,
            seconds_held: now_ns.saturating_sub(oldest) as f64 / 1e9,
        })
    }
}

fn write_file(path: &Path, v: &serde_json::Value) -> Result<(), TraceError> {
    let bytes = serde_json::to_vec_pretty(v).unwrap_or_default();
    std::fs::write(path, bytes).map_err(|source| TraceError::Write {
        path: path.to_path_buf(),
        events: 0,
        source,
    })
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `20261129T114001Z` from CLOCK_REALTIME ns (UTC, civil-from-days).
pub fn utc_stamp(real_ns: u64) -> String {
    let secs = real_ns / 1_000_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Howard Hinnant's days-to-civil.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}{mo:02}{d:02}T{h:02}{m:02}{s:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{Counter, TraceEvent};

    fn counter(ts: u64) -> TraceEvent {
        TraceEvent::Counter(Counter {
            pid: 1,
            device: None,
            name: "x".into(),
            ts_ns: ts,
            value: 1.0,
        })
    }

    fn recorder(seconds: f64, max_events: usize) -> FlightRecorder {
        FlightRecorder::new(FlightConfig {
            dir: "/nonexistent".into(),
            seconds,
            max_events,
        })
    }

    #[test]
    fn keeps_the_last_seconds_and_at_most_max_events() {
        let mut f = recorder(2.0, 3);
        f.push((0..5).map(|i| counter(10_000_000_000 + i)), 10_000_000_010);
        assert_eq!((f.len(), f.evicted_early), (3, 2));
        f.push([counter(13_000_000_000)], 13_000_000_000);
        assert_eq!(f.len(), 1, "older than 2 s are gone");
    }

    #[test]
    fn one_dump_per_incident() {
        let mut f = recorder(1.0, 10);
        assert!(f.should_dump(7, VerdictKind::KernelWedge));
        assert!(!f.should_dump(7, VerdictKind::KernelWedge));
        assert!(!f.should_dump(7, VerdictKind::Healthy));
        assert!(
            f.should_dump(7, VerdictKind::KernelWedge),
            "re-armed by a healthy verdict"
        );
        assert!(!f.should_dump(7, VerdictKind::Busy));
    }

    #[test]
    fn an_exited_process_s_incidents_are_forgotten() {
        let mut f = recorder(1.0, 10);
        assert!(f.should_dump(7, VerdictKind::KernelWedge));
        assert!(f.should_dump(8, VerdictKind::KernelWedge));
        f.forget(7);
        assert_eq!(f.incidents_held(), 1);
        assert!(
            f.should_dump(7, VerdictKind::KernelWedge),
            "a new process on pid 7, wedged from its first verdict, gets its own dump"
        );
    }

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(1_795_953_601_000_000_000), "20261129T120001Z");
    }
}
