//! Chrome Trace Event Format export (`wedgeprobe trace`) and the flight recorder (the last
//! seconds before a verdict, dumped once per incident by `watch`, `run` and the daemon).
//!
//! Both consume the same [`TraceEvent`]s: the collector taps what it drains from the eBPF
//! rings and the shim journals; `watch`/`trace` add counters and verdicts. One clock for every
//! process: CLOCK_MONOTONIC (the shim puts CUPTI's timestamps on it, and eBPF's
//! bpf_ktime_get_ns is it), with the realtime/monotonic pair in the trace's first event so
//! traces from several nodes can be aligned.

pub mod chrome;
pub mod flight;

use std::collections::{HashMap, HashSet};

use crate::{
    model::{
        ThreadView,
        event::{self, TraceEvent},
        kernels::StreamHead,
    },
    verdict::Verdict,
};

/// Counter samples at most this often per series (a trace is for people; 5 points a second
/// shows every change that matters without one event per tick per thread).
const COUNTER_EVERY_NS: u64 = 200_000_000;

/// What `watch` and `trace` add to the collector's events each tick: counters (in-flight
/// kernels per stream, sched_yield rate per blocked thread) and a mark when the verdict
/// changes.
#[derive(Default)]
pub struct TickRecorder {
    /// Last (value, time) emitted per series: (pid, device or u32::MAX, name). A series
    /// goes once it has said zero, or with its process: kept, every stream and blocked
    /// thread of every process that ever ran stayed here (a few entries a process; not the
    /// heap's rise in `cargo xtask bench churn`, which was libcuda's tables: BENCHMARKS.md).
    last: HashMap<(u32, u32, String), (f64, u64)>,
    last_verdict: Option<&'static str>,
}

impl TickRecorder {
    /// This tick's events: `tapped` (what the collector drained), plus counters and the
    /// verdict mark. `heads_fresh(pid, now)`: whether `pid`'s in-flight table was scanned this
    /// tick (queue counts are known at scans only — the daemon's).
    #[allow(clippy::too_many_arguments)]
    pub fn tick(
        &mut self,
        tapped: Vec<TraceEvent>,
        heads_fresh: &dyn Fn(u32, u64) -> bool,
        threads: &[ThreadView],
        kernels: &[StreamHead],
        verdict: &Verdict,
        verdict_pid: u32,
        now_ns: u64,
    ) -> Vec<TraceEvent> {
        let mut out = tapped;
        let mut seen = HashSet::new();
        for k in kernels {
            let name = format!("in-flight kernels, stream {} of pid {}", k.stream_id, k.pid);
            seen.insert((k.pid, k.device, name.clone()));
            if !heads_fresh(k.pid, now_ns) {
                continue; // counts are known at in-flight table scans only (the daemon's)
            }
            self.sample(
                &mut out,
                k.pid,
                Some(k.device),
                name,
                (k.queued_behind + 1) as f64,
                now_ns,
            );
        }
        for t in threads.iter().filter(|t| t.blocked) {
            let name = format!("sched_yield/s, tid {}", t.tid);
            seen.insert((t.pid, u32::MAX, name.clone()));
            self.sample(&mut out, t.pid, None, name, t.sched_yield_per_s, now_ns);
        }
        // Series that disappeared (stream drained, thread unblocked) drop to zero once.
        // A stream absent between two scans of its process's in-flight table only had its
        // head retire: its count is unknown until the next scan, not zero.
        let gone: Vec<_> = self
            .last
            .iter()
            .filter(|(key, (v, _))| {
                *v != 0.0
                    && !seen.contains(key)
                    && (key.1 == u32::MAX || heads_fresh(key.0, now_ns))
            })
            .map(|(key, _)| key.clone())
            .collect();
        for (pid, dev, name) in gone {
            let device = (dev != u32::MAX).then_some(dev);
            self.last.insert((pid, dev, name.clone()), (0.0, now_ns));
            out.push(TraceEvent::Counter(event::Counter {
                pid,
                device,
                name,
                ts_ns: now_ns,
                value: 0.0,
            }));
        }
        // A series at zero and gone has nothing more to say once its zero no longer holds
        // back a next sample (a stream that drains and fills again within the interval).
        self.last.retain(|key, (v, t)| {
            *v != 0.0 || seen.contains(key) || now_ns.saturating_sub(*t) < COUNTER_EVERY_NS
        });
        let kind = verdict.kind.as_str();
        if self.last_verdict != Some(kind) {
            self.last_verdict = Some(kind);
            out.push(TraceEvent::Verdict(event::VerdictMark {
                pid: verdict_pid,
                ts_ns: now_ns,
                kind,
                summary: verdict.summary.clone(),
            }));
        }
        out
    }

    /// `pid` exited: its series go (a stream absent between scans waits for the next scan to
    /// say zero, and an exited process has none).
    pub fn forget(&mut self, pid: u32) {
        self.last.retain(|key, _| key.0 != pid);
    }

    /// Series whose last value is held (the daemon's tables' entries count them).
    pub fn series_held(&self) -> usize {
        self.last.len()
    }

    fn sample(
        &mut self,
        out: &mut Vec<TraceEvent>,
        pid: u32,
        device: Option<u32>,
        name: String,
        value: f64,
        now_ns: u64,
    ) {
        let key = (pid, device.unwrap_or(u32::MAX), name);
        let due = match self.last.get(&key) {
            Some(&(v, t)) => v != value && now_ns.saturating_sub(t) >= COUNTER_EVERY_NS,
            None => true,
        };
        if due {
            out.push(TraceEvent::Counter(event::Counter {
                pid,
                device,
                name: key.2.clone(),
                ts_ns: now_ns,
                value,
            }));
            self.last.insert(key, (value, now_ns));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::{Verdict, VerdictKind};

    fn counters(evs: &[TraceEvent]) -> Vec<(u32, f64)> {
        evs.iter()
            .filter_map(|e| match e {
                TraceEvent::Counter(c) => Some((c.pid, c.value)),
                _ => None,
            })
            .collect()
    }

    /// A daemon ticks through months of processes: what it holds follows the streams alive.
    #[test]
    fn series_of_drained_streams_and_exited_processes_are_not_kept() {
        let mut r = TickRecorder::default();
        let healthy = Verdict {
            kind: VerdictKind::Healthy,
            summary: String::new(),
        };
        let fresh = |_: u32, _: u64| true;
        let mut now = 1_000_000_000;
        for pid in 1..=100 {
            let heads = [StreamHead::for_test(pid, "k", 1.0)];
            let evs = r.tick(Vec::new(), &fresh, &[], &heads, &healthy, pid, now);
            assert_eq!(counters(&evs), [(pid, 1.0)]);
            now += 1_000_000;
            // The stream drained: its series says zero once, then is let go once that zero
            // no longer holds back a next sample.
            let evs = r.tick(Vec::new(), &fresh, &[], &[], &healthy, pid, now);
            assert_eq!(counters(&evs), [(pid, 0.0)]);
            now += COUNTER_EVERY_NS / 2;
            let evs = r.tick(Vec::new(), &fresh, &[], &heads, &healthy, pid, now);
            assert_eq!(
                counters(&evs),
                [],
                "filled again within the interval: not yet"
            );
            now += COUNTER_EVERY_NS / 2;
            let evs = r.tick(Vec::new(), &fresh, &[], &[], &healthy, pid, now);
            assert_eq!(counters(&evs), []);
            now += COUNTER_EVERY_NS;
            let evs = r.tick(Vec::new(), &fresh, &[], &[], &healthy, pid, now);
            assert_eq!(counters(&evs), []);
        }
        assert_eq!(r.series_held(), 0, "series of 100 drained streams held");
        // A process that exits with a stream not drained (its table no longer scanned).
        let heads = [StreamHead::for_test(7, "k", 1.0)];
        r.tick(Vec::new(), &fresh, &[], &heads, &healthy, 7, now);
        let not_scanned = |_: u32, _: u64| false;
        r.tick(Vec::new(), &not_scanned, &[], &[], &healthy, 7, now + 1);
        assert_eq!(r.series_held(), 1, "unknown until the next scan");
        r.forget(7);
        assert_eq!(r.series_held(), 0);
    }
}
