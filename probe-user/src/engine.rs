//! The tick every command that watches shares — `report` (for its window), `watch` (and `run`,
//! which wraps it), `trace` and the daemon: poll the collector, notice exits and shims that stopped, evaluate the
//! verdict pipeline, keep the flight recorder and dump once per incident, find culprit ranks.
//! Each tick yields typed `Event`s; the commands only decide how to show them (lines on
//! stdout, structured logs, a trace file, metrics).

use std::collections::{HashMap, HashSet};

use crate::{
    collect::collector::Collector,
    model::{ThreadView, event::Names, event::TraceEvent},
    output::{
        report::TargetFacts,
        trace::{
            TickRecorder,
            flight::{Dump, FlightConfig, FlightRecorder},
        },
    },
    verdict::{Evaluation, Pipeline, VerdictKind, job::Culprit},
};

/// How often `report`, `watch`, `run` and `trace` tick: a crossing is printed within ~50 ms of
/// it (the daemon ticks at its `tick` setting).
pub const TICK: std::time::Duration = std::time::Duration::from_millis(50);
/// Events of the tick buffer kept allocated between ticks (~100 B each): a burst beyond it
/// is freed after its tick.
const TAP_KEPT_CAPACITY: usize = 1 << 16;

/// Something that happened this tick.
#[derive(Debug)]
pub enum Event {
    Exited {
        pid: u32,
        comm: String,
    },
    /// The shim of `pid` stopped recording (released or off); launch probes now: how, or why
    /// they could not be added.
    ShimStopped {
        pid: u32,
        launch_probes: Result<&'static str, String>,
    },
    /// A thread crossed into "blocked" (past `blocked_after` inside a call) or out of it.
    Blocked(ThreadView),
    Unblocked(ThreadView),
    /// The flight recorder wrote an incident's dump (or failed to).
    FlightDump {
        pid: u32,
        result: Result<Dump, String>,
        evicted_early: u64,
        failures: u64,
    },
    /// A job's culprit rank, newly found.
    Culprit {
        job: String,
        culprit: Culprit,
    },
    /// The verdict over every target changed (the first healthy one is not an event).
    Verdict(crate::verdict::Verdict),
    /// One process's own verdict changed (per-process engines: the daemon); `before` is
    /// `None` the first time.
    ProcessVerdict {
        pid: u32,
        before: Option<VerdictKind>,
        verdict: crate::verdict::Verdict,
    },
}

/// What one tick found: its events, the evaluations behind them, and the trace events it
/// recorded (when recording).
pub struct Tick {
    pub now_ns: u64,
    pub events: Vec<Event>,
    pub all: Evaluation,
    /// Each process on its own (per-process engines only).
    pub each: Vec<(u32, Evaluation)>,
    /// This tick's trace events (when `record_trace`; the flight recorder keeps its own copy).
    pub trace: Vec<TraceEvent>,
}

/// How an engine runs: which commands need what.
pub struct EngineOptions {
    /// Keep a flight recorder and dump incidents.
    pub flight: Option<FlightConfig>,
    /// Hand each tick's trace events to the caller (`trace`).
    pub record_trace: bool,
    /// Judge each process on its own too (the daemon's metrics and logs), and forget a process
    /// once it exits.
    pub per_process: bool,
    /// Launches carry return probes (reports say so).
    pub launch_returns: bool,
}

pub struct Engine {
    pub collector: Collector,
    pub facts: HashMap<u32, TargetFacts>,
    pub pipeline: Pipeline,
    pub names: Names,
    /// `names` is brought up to date at most this often, and before a dump (0: every tick).
    /// The daemon's second: every tick it was 5% of its CPU at 64 processes (a lookup per
    /// thread); its names serve dumps only.
    pub names_every_ns: u64,
    names_at_ns: u64,
    options: EngineOptions,
    flight: Option<FlightRecorder>,
    ticks: Option<TickRecorder>,
    /// Blocked threads by (pid, tid, api), with their last view.
    blocked: HashMap<(u32, u32, &'static str), ThreadView>,
    last_kind: VerdictKind,
    /// The processes in a host stall at the last verdict: a rank that joins a stall another
    /// began changes no verdict kind and blocks no thread, so without this `watch` on eight
    /// ranks said nothing of the second to stall.
    last_stalled: std::collections::BTreeSet<u32>,
    verdicts: HashMap<u32, VerdictKind>,
    culprits: HashSet<(String, u32, u32, String)>,
    start_ns: u64,
    /// Per-process mode: processes gone, and when. Their track names stay while the flight
    /// recorder may still hold their events (a dump labels them), then go: the daemon kept
    /// every thread name of every process that ever ran (`cargo xtask bench churn`).
    gone_at: HashMap<u32, u64>,
}

impl Engine {
    pub fn new(
        mut collector: Collector,
        facts: HashMap<u32, TargetFacts>,
        pipeline: Pipeline,
        options: EngineOptions,
        now_ns: u64,
    ) -> Self {
        let recording = options.flight.is_some() || options.record_trace;
        if recording {
            collector.tap.get_or_insert_with(Vec::new);
        }
        // The daemon's recorder takes a process's launches from its journal ring when it
        // dumps (`Collector::ring_events`); a trace needs every record as it comes.
        collector.tap_journal_records = options.record_trace || !options.per_process;
        let names = Names::from_model(&collector.model);
        Self {
            collector,
            facts,
            pipeline,
            names,
            names_every_ns: 0,
            names_at_ns: 0,
            flight: options.flight.clone().map(FlightRecorder::new),
            ticks: recording.then(TickRecorder::default),
            options,
            blocked: HashMap::new(),
            last_kind: VerdictKind::Healthy,
            last_stalled: Default::default(),
            verdicts: HashMap::new(),
            culprits: HashSet::new(),
            start_ns: now_ns,
            gone_at: HashMap::new(),
        }
    }

    /// The flight recorder's settings can change (the daemon's SIGHUP).
    pub fn set_flight(&mut self, config: FlightConfig) {
        if let Some(f) = &mut self.flight {
            f.config = config;
        }
    }

    pub fn flight(&self) -> Option<&FlightRecorder> {
        self.flight.as_ref()
    }

    /// Entries of each per-process and per-thread table (the collector's and its own): a
    /// daemon's state must follow the processes alive, not all that ever ran.
    pub fn state_entries(&self) -> Vec<(&'static str, u64)> {
        let mut out = self.collector.state_entries();
        out.extend([
            ("track_names", self.names.processes.len() as u64),
            ("track_thread_names", self.names.threads.len() as u64),
            ("target_facts", self.facts.len() as u64),
            ("verdicts", self.verdicts.len() as u64),
            ("blocked_threads", self.blocked.len() as u64),
            (
                "flight_events",
                self.flight.as_ref().map_or(0, |f| f.len() as u64),
            ),
            (
                "trace_counter_series",
                self.ticks.as_ref().map_or(0, |t| t.series_held() as u64),
            ),
            (
                "flight_incidents",
                self.flight
                    .as_ref()
                    .map_or(0, |f| f.incidents_held() as u64),
            ),
        ]);
        out
    }

    /// Whether any target is still alive.
    pub fn any_alive(&self) -> bool {
        self.collector.model.procs.values().any(|p| !p.exited)
    }

    pub fn tick(&mut self, now_ns: u64) -> Tick {
        let mut events = Vec::new();
        for gone in self.collector.poll(now_ns) {
            if self.options.per_process {
                self.collector.forget(gone.pid);
                self.facts.remove(&gone.pid);
                self.verdicts.remove(&gone.pid);
                if let Some(f) = &mut self.flight {
                    f.forget(gone.pid);
                }
                if let Some(t) = &mut self.ticks {
                    t.forget(gone.pid);
                }
                self.gone_at.insert(gone.pid, now_ns);
            }
            events.push(Event::Exited {
                pid: gone.pid,
                comm: gone.comm,
            });
        }
        let keep_ns = self
            .flight
            .as_ref()
            .map_or(0, |f| (f.config.seconds * 1e9) as u64);
        let names = &mut self.names;
        self.gone_at.retain(|pid, at| {
            if now_ns.saturating_sub(*at) < keep_ns {
                return true;
            }
            names.processes.remove(pid);
            names.threads.retain(|(p, _), _| p != pid);
            false
        });
        for (pid, outcome) in self.collector.take_launch_probe_changes() {
            if let (Ok(how), Some(f)) = (&outcome, self.facts.get_mut(&pid)) {
                f.launch_probes = how;
            }
            events.push(Event::ShimStopped {
                pid,
                launch_probes: outcome,
            });
        }
        let model = &self.collector.model;
        let (all, each) = if self.options.per_process {
            self.pipeline.evaluate_all_and_each(model, now_ns)
        } else {
            (self.pipeline.evaluate(model, now_ns), Vec::new())
        };
        self.crossings(&all, &mut events);
        let trace = self.record(&all, &each, now_ns, &mut events);
        // Culprits now; an event for each that was not one last tick.
        let mut culprits = HashSet::new();
        for j in &all.jobs {
            if let Some(c) = &j.culprit {
                let key = (j.job.clone(), c.rank, c.pid, c.kernel.clone());
                if !self.culprits.contains(&key) {
                    events.push(Event::Culprit {
                        job: j.job.clone(),
                        culprit: c.clone(),
                    });
                }
                culprits.insert(key);
            }
        }
        self.culprits = culprits;
        let stalled: std::collections::BTreeSet<u32> =
            all.host_stalls.iter().map(|s| s.pid).collect();
        let more_stalled =
            all.verdict.kind == VerdictKind::HostStall && !stalled.is_subset(&self.last_stalled);
        if all.verdict.kind != self.last_kind || more_stalled {
            self.last_kind = all.verdict.kind;
            events.push(Event::Verdict(all.verdict.clone()));
        }
        self.last_stalled = stalled;
        for (pid, ev) in &each {
            let before = self.verdicts.insert(*pid, ev.verdict.kind);
            if before != Some(ev.verdict.kind) {
                events.push(Event::ProcessVerdict {
                    pid: *pid,
                    before,
                    verdict: ev.verdict.clone(),
                });
            }
        }
        Tick {
            now_ns,
            events,
            all,
            each,
            trace,
        }
    }

    /// Threads crossing into or out of "blocked" since the last tick.
    fn crossings(&mut self, all: &Evaluation, events: &mut Vec<Event>) {
        let mut still = HashMap::new();
        for t in all.threads.iter().filter(|t| t.blocked) {
            let key = (t.pid, t.tid, t.api);
            if !self.blocked.contains_key(&key) {
                events.push(Event::Blocked(t.clone()));
            }
            still.insert(key, t.clone());
        }
        for (key, t) in self.blocked.drain() {
            if !still.contains_key(&key) {
                events.push(Event::Unblocked(t));
            }
        }
        self.blocked = still;
    }

    /// This tick's trace events (collector's tap, counters, verdict marks) into the flight
    /// recorder, and a dump per new incident; returns them when the caller records a trace.
    fn record(
        &mut self,
        all: &Evaluation,
        each: &[(u32, Evaluation)],
        now_ns: u64,
        events: &mut Vec<Event>,
    ) -> Vec<TraceEvent> {
        let Some(ticks) = &mut self.ticks else {
            return Vec::new();
        };
        let first = self
            .collector
            .model
            .procs
            .keys()
            .next()
            .copied()
            .unwrap_or(0);
        let pid = all.pid(first);
        let tapped = self
            .collector
            .tap
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        let collector = &self.collector;
        let fresh = |pid: u32, now: u64| collector.heads_fresh(pid, now);
        let trace = ticks.tick(
            tapped,
            &fresh,
            &all.threads,
            &all.kernels,
            &all.verdict,
            pid,
            now_ns,
        );
        if now_ns.saturating_sub(self.names_at_ns) >= self.names_every_ns {
            self.names.update(&self.collector.model);
            self.names_at_ns = now_ns;
        }
        let Some(flight) = &mut self.flight else {
            return trace;
        };
        // Handed to the caller only when it records a trace too: cloning every event each
        // tick would be the daemon's largest cost for nothing.
        let kept = if self.options.record_trace {
            trace.clone()
        } else {
            Vec::new()
        };
        let mut trace = trace;
        flight.push(trace.drain(..), now_ns);
        // The buffer goes back to the collector for the next tick: taken afresh each tick it
        // was allocated and freed at tens of thousands of events a tick (32 processes at
        // 5,400 launches a second), and glibc gave the freed pages back to the kernel every
        // time (unmap_page_range, page faults: a third of the daemon's samples at 8
        // simulated processes launching every 185 µs, perf 2026-12-06).
        if let Some(tap) = self.collector.tap.as_mut() {
            trace.shrink_to(TAP_KEPT_CAPACITY);
            *tap = trace;
        }
        // Incidents: per process where each is judged alone, else the verdict over all.
        let incidents: Vec<u32> = if self.options.per_process {
            each.iter()
                .filter(|(pid, ev)| flight.should_dump(*pid, ev.verdict.kind))
                .map(|(pid, _)| *pid)
                .collect()
        } else if flight.should_dump(pid, all.verdict.kind) {
            vec![pid]
        } else {
            Vec::new()
        };
        if !incidents.is_empty() {
            self.names.update(&self.collector.model);
        }
        for pid in incidents {
            let ring = if self.collector.tap_journal_records {
                Vec::new()
            } else {
                let since = now_ns.saturating_sub((flight.config.seconds * 1e9) as u64);
                self.collector
                    .ring_events(pid, since, flight.config.max_events, now_ns)
            };
            let result = flight.dump_incident(
                &self.collector.model,
                &self.facts,
                all,
                &self.names,
                pid,
                now_ns,
                now_ns.saturating_sub(self.start_ns) as f64 / 1e6,
                self.pipeline.settings.blocked_after_ms(),
                self.options.launch_returns,
                ring,
            );
            events.push(Event::FlightDump {
                pid,
                result: result.map_err(|e| format!("{e:#}")),
                evicted_early: flight.evicted_early,
                failures: flight.dumps_failed,
            });
        }
        kept
    }

    /// Stops tracing every target (takes seconds: see `Probe::detach`).
    pub fn detach_all(&mut self) {
        self.collector.detach_all();
    }

    /// Ends the run: detaches in the background where it can (`detach_in_background`; true),
    /// here otherwise (false).
    pub fn finish(self) -> bool {
        match self.detach_in_background() {
            Ok(()) => true,
            Err(mut engine) => {
                engine.detach_all();
                false
            }
        }
    }

    /// Ends the run without waiting for the uprobe links to close: the targets leave
    /// `WP_TARGETS` (nothing more is recorded), then a child process takes copies of the open
    /// files and exits after this process has, so the kernel closes the links in the child's
    /// exit while this process returns (`sys::leave_files_to_a_child`). Closing them here
    /// took ~4 s on the simulated driver and 7.5–9.9 s on the H200 (BENCHMARKS.md, "time to
    /// first answer"): each link waits for an RCU grace period under a kernel-wide mutex, and
    /// closing from parallel threads did not help. An attach by any process in those seconds
    /// waits behind the child's closing (README). `Ok`: the engine is leaked (dropping it
    /// would close the links here after all) and the process is to exit. `Err`: no child
    /// could be made; the engine comes back (boxed) for the caller to detach as before.
    pub fn detach_in_background(mut self) -> Result<(), Box<Self>> {
        self.collector.stop_recording_all();
        match crate::sys::leave_files_to_a_child() {
            Some(_) => {
                std::mem::forget(self);
                Ok(())
            }
            None => Err(Box::new(self)),
        }
    }
}
