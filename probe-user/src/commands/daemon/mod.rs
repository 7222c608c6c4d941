//! `wedgeprobe daemon [--config FILE]`: one probe per node, always on. It finds every process
//! that maps libcuda or a shim journal (also those started later: `discover`), attaches,
//! evaluates each process's verdict every tick, keeps a flight recorder, and on an incident
//! writes the report and the trace into a size-capped directory (oldest dumps go first) and
//! logs a structured line. Metrics on `listen` (/metrics). SIGHUP reloads the configuration;
//! SIGINT/SIGTERM detach and exit.

pub mod config;
pub mod discover;

use std::{
    collections::HashMap,
    io::Write,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::json;

use crate::{
    cli::DaemonArgs,
    collect::{collector::Collector, probe::Probe},
    commands::Error,
    engine::{Engine, EngineOptions, Event, Tick},
    error::ProbeError,
    output::{
        metrics::{self, Hist, ProcessMetrics, Snapshot, StreamMetrics, bounded_label},
        report::TargetFacts,
    },
    process::target::Target,
    signals, sys,
    verdict::{Evaluation, Pipeline},
};
use config::Config;

/// Journal records read per process per tick, the newest (see `run`).
const MAX_RECORDS_PER_TICK: u64 = 256;
/// Each journal's ring pages are let go this often (see `run`).
const RELEASE_RING_EVERY_NS: u64 = 1_000_000_000;
/// In-flight tables are scanned this often (see `run`).
const HEADS_EVERY_NS: u64 = 1_000_000_000;
/// The metrics snapshot's histograms, own usage and table sizes are recomputed this often.
const SLOW_PARTS_EVERY_NS: u64 = 1_000_000_000;
/// The C heap's free pages are given back this often (see `Daemon::publish`).
const TRIM_HEAP_EVERY_NS: u64 = 60_000_000_000;
/// Track names (for dumps) are refreshed this often (`Engine::names_every_ns`).
const NAMES_EVERY_NS: u64 = 1_000_000_000;

/// Structured log lines on stderr: text, or one JSON object per line. Lines are queued and
/// written by `flush` once the tick's metrics are published, so what a line says (a verdict,
/// a rejected configuration, a dump) is already on /metrics when someone reads it.
struct Log {
    json: bool,
    pending: Vec<String>,
}

impl Log {
    fn event(&mut self, event: &str, fields: serde_json::Value, text: String) {
        let ts = crate::output::trace::flight::utc_stamp(sys::realtime_ns());
        let line = if self.json {
            let mut v = json!({"ts": ts, "event": event});
            if let (Some(o), Some(f)) = (v.as_object_mut(), fields.as_object()) {
                o.extend(f.clone());
            }
            v.to_string()
        } else {
            format!("{ts} wedgeprobe daemon: {text}")
        };
        self.pending.push(line);
    }

    fn flush(&mut self) {
        let mut err = std::io::stderr().lock();
        for line in self.pending.drain(..) {
            let _ = writeln!(err, "{line}");
        }
    }
}

pub fn run(args: &DaemonArgs) -> Result<(), Error> {
    let cfg =
        config::load(args.config.as_deref()).map_err(|e| ProbeError::Config(e.to_string()))?;
    let mut log = Log {
        json: cfg.json_logs,
        pending: Vec::new(),
    };
    let snapshot = Arc::new(Mutex::new(Snapshot::default()));
    let bound = crate::output::metrics::http::serve(cfg.listen, snapshot.clone())?;
    let mut collector = Collector::new(Probe::load()?)?;
    // Processes come and go by their entry in WP_TARGETS; the waits' probes are linked once per
    // libcuda file (`Probe::share_waits`).
    collector.probe.share_waits();
    // Bounded work per tick: 8 launch-bound processes write ~1.6M journal records a second
    // (a launch and a completion each); reading and converting all of them cost the daemon
    // 29% of a core on the H200. The heads come from the in-flight tables, and a dump takes
    // its launches from the ring itself (`Collector::ring_events`); what the daemon keeps
    // from the records it reads are maxima — each stream's newest launch and record number,
    // the newest completion and sign of GPU work — which the newest records carry, and the
    // history's kernel durations, which a sample serves (1,024 a second per process). A
    // synchronize among the records passed over proves less than the marks that retire the
    // same launches within the shim's 100 ms period. Reading costs ~47 ns a record (16
    // simulated processes, 2026-12-06); at that cost the 1,024 a tick read before came to
    // ~0.6% of a core at 32 PyTorch servers launching 5,400 times a second each.
    collector.max_records_per_poll = MAX_RECORDS_PER_TICK;
    // Stream heads from a full in-flight table scan once a second, kept up to date in
    // between: a head found up to 1 s late still has its true age (verdict bounds are
    // seconds), and the scan was two thirds of a tick (BENCHMARKS.md).
    collector.heads_every_ns = HEADS_EVERY_NS;
    // What the ticks' reads mapped of each ring is let go once a second: it was 186 MiB of the
    // daemon's 204 MiB RSS at 64 simulated processes (`MappedJournal::release_ring_every`).
    collector.release_ring_every_ns = RELEASE_RING_EVERY_NS;
    // WEDGEPROBE_DEBUG_TICK=1: where a tick's time goes, every 100 ticks on stderr.
    let debug = std::env::var_os("WEDGEPROBE_DEBUG_TICK").map(|_| TickDebug::default());
    collector.timed = debug.is_some();
    signals::install();
    signals::install_reload();
    let links = collector.probe.uprobe_links();
    log.event(
        "started",
        json!({"listen": bound.to_string(), "dump_dir": cfg.dump_dir, "config": args.config,
               "uprobe_links": links}),
        format!(
            "started; metrics on http://{bound}/metrics; dumps in {}; uprobe links: {links}",
            cfg.dump_dir.display()
        ),
    );
    log.flush();
    let engine = Engine::new(
        collector,
        HashMap::new(),
        Pipeline::new(cfg.settings()),
        EngineOptions {
            flight: Some(cfg.flight()),
            record_trace: false,
            per_process: true,
            launch_returns: false,
        },
        sys::monotonic_ns(),
    );
    let mut engine = engine;
    engine.names_every_ns = NAMES_EVERY_NS;
    let mut d = Daemon {
        engine,
        cfg,
        log,
        discovery: discover::Discovery::default(),
        last_streams: HashMap::new(),
        snap: Snapshot::default(),
        shared: snapshot,
        last_scan: 0,
        slow_parts_at: 0,
        heap_trimmed_at: 0,
        debug,
        injections: Injections::default(),
    };
    loop {
        let now = sys::monotonic_ns();
        if signals::stop_requested() {
            break;
        }
        if signals::reload_requested() {
            d.reload(args.config.as_deref());
        }
        // The thread CPU clock is a system call: read only when asked for.
        let cpu = |on: bool| if on { sys::thread_cpu_ns() } else { 0 };
        let t0 = cpu(d.debug.is_some());
        d.discover(now);
        let t1 = cpu(d.debug.is_some());
        let tick = d.engine.tick(now);
        let t2 = cpu(d.debug.is_some());
        d.handle(&tick);
        d.publish(&tick);
        d.log.flush();
        if let Some(debug) = &mut d.debug {
            let t3 = sys::thread_cpu_ns();
            debug.add([t1 - t0, t2 - t1, t3 - t2], &mut d.engine.collector);
        }
        std::thread::sleep(d.cfg.tick);
    }
    d.engine.detach_all();
    d.log
        .event("stopped", json!({}), "stopped; detached".into());
    d.log.flush();
    Ok(())
}

struct Daemon {
    engine: Engine,
    cfg: Config,
    log: Log,
    discovery: discover::Discovery,
    /// Per process, the per-stream series of the last in-flight table scan.
    last_streams: HashMap<u32, Vec<StreamMetrics>>,
    snap: Snapshot,
    /// What the HTTP thread serves (`snap` as of the last tick).
    shared: Arc<Mutex<Snapshot>>,
    last_scan: u64,
    /// When the snapshot's slow parts were last computed (`publish`).
    slow_parts_at: u64,
    /// When the C heap's free pages were last given back.
    heap_trimmed_at: u64,
    debug: Option<TickDebug>,
    injections: Injections,
}

/// An attach that finished: (pid, comm, what it did or why not).
type Injected = (u32, String, Result<crate::inject::Attached, String>);

/// `inject = true`: the attaches under way (each on its thread) and the processes tried.
#[derive(Default)]
struct Injections {
    /// (pid, start time): a pid reused by a new process is another process to try, and an
    /// exited one's entry goes at the next scan (`prune`). Keyed by pid alone and never
    /// pruned, a new process given a tried pid was never injected, and the set grew by one
    /// a process for as long as the daemon ran.
    tried: std::collections::HashSet<(u32, u64)>,
    running: std::collections::HashSet<u32>,
    done: Arc<Mutex<Vec<Injected>>>,
}

impl Injections {
    /// Whether the process (`pid`, started at `start_ticks`) is tried for the first time.
    fn first_try(&mut self, pid: u32, start_ticks: u64) -> bool {
        self.tried.insert((pid, start_ticks))
    }

    /// Forgets the processes no longer alive.
    fn prune(&mut self, alive: &dyn Fn(u32) -> bool) {
        self.tried.retain(|(pid, _)| alive(*pid));
    }

    /// Starts the attach of `pid` unless it was tried before; whether it started.
    fn start(&mut self, pid: u32, start_ticks: u64, comm: &str, log: &mut Log) -> bool {
        if !self.first_try(pid, start_ticks) {
            return false;
        }
        let shim = match crate::commands::shim_path::shim_path() {
            Ok(s) => s,
            Err(e) => {
                log.event(
                    "inject_failed",
                    json!({"pid": pid, "comm": comm, "error": format!("{e:#}")}),
                    format!("pid {pid} ({comm}): cannot inject the shim: {e:#}"),
                );
                return false;
            }
        };
        let done = self.done.clone();
        let comm = comm.to_string();
        let spawned = std::thread::Builder::new()
            .name("wedgeprobe-inject".into())
            .spawn(move || {
                let r = crate::inject::attach(pid, &shim).map_err(|e| e.to_string());
                if let Ok(mut d) = done.lock() {
                    d.push((pid, comm, r));
                }
            });
        if spawned.is_ok() {
            self.running.insert(pid);
        }
        spawned.is_ok()
    }

    fn running(&self, pid: u32) -> bool {
        self.running.contains(&pid)
    }

    /// Logs the attaches that finished.
    fn finished(&mut self, log: &mut Log) {
        let done: Vec<_> = match self.done.lock() {
            Ok(mut d) => d.drain(..).collect(),
            Err(_) => return,
        };
        for (pid, comm, r) in done {
            self.running.remove(&pid);
            match r {
                Ok(a) => log.event(
                    "injected",
                    json!({"pid": pid, "comm": comm, "hooks": a.hooks, "seconds": a.seconds}),
                    format!(
                        "pid {pid} ({comm}): shim injected in {:.1} s ({} entry points hooked)",
                        a.seconds, a.hooks
                    ),
                ),
                Err(e) => log.event(
                    "inject_failed",
                    json!({"pid": pid, "comm": comm, "error": e}),
                    format!("pid {pid} ({comm}): shim not injected: {e}; watching it eBPF-only"),
                ),
            }
        }
    }
}

impl Daemon {
    /// SIGHUP: the new configuration, except `listen` (the socket stays bound).
    fn reload(&mut self, path: Option<&Path>) {
        match config::load(path) {
            Ok(new) => {
                if new.listen != self.cfg.listen {
                    self.log.event(
                        "config_note",
                        json!({"key": "listen"}),
                        "`listen` changes need a restart; the rest is applied".into(),
                    );
                }
                self.engine.set_flight(new.flight());
                self.engine.pipeline.settings = new.settings();
                self.cfg = Config {
                    listen: self.cfg.listen,
                    ..new
                };
                self.snap.config_reloads_total += 1;
                self.log.event(
                    "config_reloaded",
                    json!({"config": path}),
                    "configuration reloaded".into(),
                );
            }
            Err(e) => {
                self.snap.config_errors_total += 1;
                self.log.event(
                    "config_rejected",
                    json!({"error": e.to_string()}),
                    format!("configuration rejected, keeping the old one: {e}"),
                );
            }
        }
    }

    /// Every `scan_interval`: attaches to CUDA processes not watched yet.
    fn discover(&mut self, now: u64) {
        self.injections.finished(&mut self.log);
        if now.saturating_sub(self.last_scan) < self.cfg.scan_interval.as_nanos() as u64 {
            return;
        }
        self.last_scan = now;
        let collector = &mut self.engine.collector;
        let attached = |pid: u32| collector.model.procs.contains_key(&pid);
        let candidates = self.discovery.candidates(&attached);
        let discovery = &self.discovery;
        self.injections.prune(&|pid| discovery.alive(pid));
        for pid in candidates {
            if collector.model.procs.len() >= self.cfg.max_targets {
                break;
            }
            let Ok(target) = Target::open(pid) else {
                self.discovery.not_now(pid, self.cfg.scan_interval);
                continue;
            };
            let comm = target.comm.clone();
            // `inject = true`: a CUDA process without the shim gets it first (on a thread of
            // its own: an attach takes up to seconds, and the ticks go on), then is attached
            // like one started with it.
            if self.cfg.inject
                && target.journal.is_none()
                && !crate::process::target::expects_shim(pid)
                && self
                    .injections
                    .start(pid, target.start_ticks, &comm, &mut self.log)
            {
                self.discovery.await_shim(pid, self.cfg.scan_interval);
                continue;
            }
            if self.injections.running(pid) {
                self.discovery.await_shim(pid, self.cfg.scan_interval);
                continue;
            }
            // A process that will load the shim when it initialises CUDA, not there yet: uprobes
            // put on libcuda's entry points now would make the shim find them and record
            // through CUPTI's callbacks instead of its hooks (on the H200 a daemon started
            // before the serving process did exactly that). It is watched once its journal is.
            if target.journal.is_none() && crate::process::target::expects_shim(pid) {
                match self.discovery.await_shim(pid, self.cfg.scan_interval) {
                    Some(first) => {
                        if first {
                            self.log.event(
                                "awaiting_shim",
                                json!({"pid": pid, "comm": comm, "grace_s": discover::SHIM_GRACE.as_secs()}),
                                format!(
                                    "pid {pid} ({comm}) loads the shim when it initialises CUDA; \
                                     attaching once its journal appears (at most {} s from now)",
                                    discover::SHIM_GRACE.as_secs()
                                ),
                            );
                        }
                        continue;
                    }
                    None => self.log.event(
                        "shim_not_seen",
                        json!({"pid": pid, "comm": comm}),
                        format!(
                            "pid {pid} ({comm}): no shim journal {} s after it was found; \
                             attaching without it",
                            discover::SHIM_GRACE.as_secs()
                        ),
                    ),
                }
            }
            match collector.attach(target, false) {
                Ok(a) => {
                    self.engine.facts.insert(
                        pid,
                        TargetFacts {
                            traced: a.lib.waits.len(),
                            launch_probes: a.launch_probes,
                            missing: a.lib.missing.clone(),
                        },
                    );
                    self.log.event(
                        "attached",
                        json!({"pid": pid, "comm": comm, "launch_probes": a.launch_probes}),
                        format!(
                            "attached to pid {pid} ({comm}); launch probes: {}",
                            a.launch_probes
                        ),
                    );
                }
                Err(_) if crate::process::target::exiting(pid) => {
                    // It exited while being attached (H200: a short-lived child that mapped
                    // libcuda; 2026-12-02, one still exiting — its /proc entry there, its
                    // root and memory gone — was logged as attach_failed): nothing to report.
                    self.discovery.forget(pid);
                }
                Err(e) => {
                    self.discovery.not_now(pid, self.cfg.scan_interval);
                    self.log.event(
                        "attach_failed",
                        json!({"pid": pid, "error": format!("{e:#}")}),
                        format!("cannot attach to pid {pid}: {e:#}"),
                    );
                }
            }
        }
        self.snap.discovery_scans_total = self.discovery.scans;
        self.snap.discovery_scan_seconds = self.discovery.last_scan.as_secs_f64();
        self.snap.discovery_pending = self.discovery.pending() as u64;
    }

    /// The tick's events as log lines and counters.
    fn handle(&mut self, tick: &Tick) {
        for e in &tick.events {
            match e {
                Event::Exited { pid, comm } => {
                    self.log.event(
                        "detached",
                        json!({"pid": pid, "comm": comm}),
                        format!("pid {pid} ({comm}) exited; forgotten"),
                    );
                    self.last_streams.remove(pid);
                    self.discovery.forget(*pid);
                }
                Event::ShimStopped { pid, launch_probes } => self.log.event(
                    "shim_stopped",
                    json!({"pid": pid, "launch_probes": launch_probes.as_ref().ok(), "error": launch_probes.as_ref().err()}),
                    match launch_probes {
                        Ok(how) => format!("pid {pid}: the shim stopped recording (released or off); launch probes: {how}"),
                        Err(e) => format!("pid {pid}: the shim stopped recording (released or off); launch probes could not be added: {e}"),
                    },
                ),
                Event::ProcessVerdict {
                    pid,
                    before,
                    verdict,
                } => {
                    let kind = verdict.kind.as_str();
                    *self.snap.verdicts_total.entry(kind).or_default() += 1;
                    if before.is_some() || kind != "healthy" {
                        self.log.event(
                            "verdict",
                            json!({"pid": pid, "kind": kind, "summary": verdict.summary}),
                            format!("pid {pid}: {kind}: {}", verdict.summary),
                        );
                    }
                }
                Event::FlightDump { pid, result, failures, .. } => match result {
                    Ok(d) => {
                        self.snap.dumps_total += 1;
                        let removed = enforce_cap(
                            &self.cfg.dump_dir,
                            self.cfg.dump_max_bytes,
                            &[&d.trace, &d.report],
                        );
                        self.snap.dump_dir_bytes = dir_bytes(&self.cfg.dump_dir);
                        self.log.event(
                            "dump",
                            json!({"pid": pid, "trace": d.trace, "report": d.report, "events": d.events, "seconds_held": d.seconds_held, "rotated_out": removed}),
                            format!("pid {pid}: wrote {} and {} ({} events, last {:.1} s)", d.trace.display(), d.report.display(), d.events, d.seconds_held),
                        );
                    }
                    Err(e) => self.log.event(
                        "dump_failed",
                        json!({"pid": pid, "error": e, "failures": failures}),
                        format!("pid {pid}: dump failed ({e}); still watching"),
                    ),
                },
                Event::Culprit { job, culprit } => self.log.event(
                    "culprit",
                    json!({"job": job, "rank": culprit.rank, "pid": culprit.pid, "kernel": culprit.kernel, "summary": culprit.summary}),
                    format!("job {job}: {}", culprit.summary),
                ),
                // The node-wide verdict and thread crossings are `watch`'s lines; the daemon
                // logs per process.
                Event::Verdict(_) | Event::Blocked(_) | Event::Unblocked(_) => {}
            }
        }
    }

    /// The metrics snapshot the HTTP thread serves.
    fn publish(&mut self, tick: &Tick) {
        let now = tick.now_ns;
        let collector = &self.engine.collector;
        let mut processes = Vec::new();
        for (pid, ev) in &tick.each {
            let mut pm = process_metrics(collector, *pid, ev);
            // Per-stream series from the last in-flight table scan: between scans a stream
            // whose head retired is missing from the heads, and its series would blink out
            // for up to a second (a scrape would often miss a healthy busy stream). Streams
            // still headed now carry their current age.
            if collector.heads_fresh(*pid, now) {
                self.last_streams.insert(*pid, pm.streams.clone());
            } else if let Some(last) = self.last_streams.get(pid) {
                keep_streams_of_last_scan(&mut pm.streams, last);
            }
            processes.push(pm);
        }
        let snap = &mut self.snap;
        snap.processes = processes;
        for j in &tick.all.jobs {
            for r in &j.ranks {
                if let Some(p) = snap.processes.iter_mut().find(|p| p.pid == r.pid) {
                    p.job = j.job.clone();
                    p.rank = r.rank.to_string();
                }
            }
        }
        snap.culprits = tick
            .all
            .jobs
            .iter()
            .filter_map(|j| {
                j.culprit
                    .as_ref()
                    .map(|c| (j.job.clone(), c.rank, c.pid, c.kernel.clone()))
            })
            .collect();
        // Latency histograms, its own usage and table sizes once a second: per tick the
        // histograms alone were 5% of the daemon's CPU at 64 processes; scrapes come every
        // 15-60 s.
        if now.saturating_sub(self.slow_parts_at) >= SLOW_PARTS_EVERY_NS {
            self.slow_parts_at = now;
            snap.latency = collector
                .model
                .finished_calls()
                .map(|(api, l)| (api, Hist::from_hdr(&l.ns)))
                .collect();
            // Processes come and go, and what the daemon allocated for each is freed between
            // what the live ones hold: glibc keeps those free pages. The churn bench (16 alive,
            // one new every 3 s) read the heap in use flat at 12.6-12.9 MiB and its free part
            // 3.1 -> 5.7 MiB in 13 minutes, the RSS's own part 15 -> 18 MiB (2026-12-07).
            if now.saturating_sub(self.heap_trimmed_at) >= TRIM_HEAP_EVERY_NS {
                self.heap_trimmed_at = now;
                sys::trim_heap();
            }
            (snap.cpu_seconds, snap.rss_bytes) = metrics::own_usage();
            snap.heap_bytes = sys::heap_bytes()
                .map(|(used, free)| vec![("in_use", used), ("free", free)])
                .unwrap_or_default();
            snap.state_entries = self.engine.state_entries();
        }
        snap.ebpf_lost = collector.model.losses().into_iter().collect();
        snap.dump_failures_total = self.engine.flight().map_or(0, |f| f.dumps_failed);
        snap.blocked_after_seconds = self.cfg.blocked_after.as_secs_f64();
        if let Ok(mut s) = self.shared.lock() {
            *s = snap.clone();
        }
    }
}

/// `WEDGEPROBE_DEBUG_TICK=1`: where the daemon's CPU goes, every 100 ticks on stderr — the
/// main thread's parts of a tick and the collector's phases (thread CPU time), the records
/// read from the journals, and the whole process's CPU (the HTTP thread's too) as a share of
/// one core. The GPU harness's `daemon-node` keeps these lines.
struct TickDebug {
    /// Discovery, the engine's tick (the collector's poll in it), logging and metrics.
    parts: [u64; 3],
    ticks: u64,
    since: (u64, u64),
}

impl Default for TickDebug {
    fn default() -> Self {
        Self {
            parts: [0; 3],
            ticks: 0,
            since: (sys::monotonic_ns(), sys::process_cpu_ns()),
        }
    }
}

impl TickDebug {
    fn add(&mut self, parts: [u64; 3], collector: &mut Collector) {
        for (sum, p) in self.parts.iter_mut().zip(parts) {
            *sum += p;
        }
        self.ticks += 1;
        if !self.ticks.is_multiple_of(100) {
            return;
        }
        let per_tick = |ns: u64| Duration::from_nanos(ns / 100);
        let poll: Vec<String> = collector
            .take_phases()
            .into_iter()
            .map(|(n, d)| format!("{n} {:?}", d / 100))
            .collect();
        let (wall, cpu) = (sys::monotonic_ns(), sys::process_cpu_ns());
        let share = 100.0 * cpu.saturating_sub(self.since.1) as f64
            / wall.saturating_sub(self.since.0).max(1) as f64;
        let heap = sys::heap_bytes().map_or(String::new(), |(used, free)| {
            format!(
                "; heap in use {} KiB, free in its arenas {} KiB",
                used >> 10,
                free >> 10
            )
        });
        eprintln!(
            "wedgeprobe daemon: per tick over the last 100 (CPU): discover {:?}, engine tick {:?}, log+metrics {:?} (poll: {}); records read {}; thread states visited {}; process {share:.2}% of a core{heap}",
            per_tick(self.parts[0]),
            per_tick(self.parts[1]),
            per_tick(self.parts[2]),
            poll.join(", "),
            std::mem::take(&mut collector.records_read) / 100,
            collector.model.thread_visits.take() / 100,
        );
        self.parts = [0; 3];
        self.since = (wall, cpu);
    }
}

/// Adds to `now` the streams of the last in-flight table scan that `now` lacks (their heads
/// retired since; their counts are unknown until the next scan, not zero).
fn keep_streams_of_last_scan(now: &mut Vec<StreamMetrics>, last: &[StreamMetrics]) {
    for s in last {
        if !now
            .iter()
            .any(|c| c.device == s.device && c.stream == s.stream)
        {
            now.push(s.clone());
        }
    }
}

fn process_metrics(collector: &Collector, pid: u32, ev: &Evaluation) -> ProcessMetrics {
    let model = &collector.model;
    let journal = model.journals.get(&pid);
    ProcessMetrics {
        pid,
        comm: model
            .procs
            .get(&pid)
            .map(|p| p.target.comm.clone())
            .unwrap_or_default(),
        // Set once the node's jobs are known (after every process's verdict).
        job: String::new(),
        rank: String::new(),
        mode: if journal.is_some_and(|j| j.status.is_readable()) {
            "journal+ebpf"
        } else {
            "ebpf-only"
        },
        verdict: ev.verdict.kind.as_str(),
        threads_in_calls: ev.threads.len() as u64,
        blocked_threads: ev.threads.iter().filter(|t| t.blocked).count() as u64,
        // A fold from +0.0: `f64`'s `Sum` of no threads is -0.0, which the metric exported as
        // `-0.0` (seen on the H200, 2026-12-03).
        sched_yield_per_s: ev
            .threads
            .iter()
            .filter(|t| t.sched_yield_measured)
            .fold(0.0, |sum, t| sum + t.sched_yield_per_s),
        streams: ev
            .kernels
            .iter()
            .map(|k| StreamMetrics {
                device: k.device,
                stream: k.stream.clone(),
                kernel: bounded_label(k.kernel_demangled.as_deref().unwrap_or(&k.kernel)),
                oldest_age_seconds: k.running_ms / 1e3,
                in_flight: k.queued_behind as u64 + 1,
            })
            .collect(),
        journal_drops: journal.map_or(vec![], |j| j.drops.iter().map(|(k, v)| (*k, *v)).collect()),
        journal_ring_lost: journal.map_or(0, |j| j.ring_lost),
        journal_ring_skipped: journal.map_or(0, |j| j.ring_skipped),
        launches_via: journal.map(|j| match (j.launch_callbacks, j.record) {
            (Some(why), _) => ("callbacks", why),
            // Per-kernel records come with the driver's callbacks by design.
            (None, "per-kernel") => ("callbacks", "per-kernel records (the exact mode)"),
            (None, _) => ("hooks", ""),
        }),
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Removes the oldest dump files until the directory holds at most `cap` bytes (never the
/// ones just written). Returns how many were removed.
fn enforce_cap(dir: &Path, cap: u64, keep: &[&Path]) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut files: Vec<(std::time::SystemTime, PathBuf, u64)> = rd
        .flatten()
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            let name = e.file_name().to_string_lossy().to_string();
            (m.is_file() && (name.ends_with(".trace.json.gz") || name.ends_with(".report.json")))
                .then(|| {
                    (
                        m.modified().unwrap_or(std::time::UNIX_EPOCH),
                        e.path(),
                        m.len(),
                    )
                })
        })
        .collect();
    files.sort();
    let mut total: u64 = files.iter().map(|f| f.2).sum();
    let mut removed = 0;
    for (_, path, len) in files {
        if total <= cap {
            break;
        }
        if keep.iter().any(|k| *k == path) {
            continue;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    /// Issue 34: a pid reused by a new process never inherits the old one's state.
    #[test]
    fn a_new_process_on_a_tried_pid_is_tried_for_injection_again() {
        let mut i = super::Injections::default();
        assert!(i.first_try(7, 100));
        assert!(!i.first_try(7, 100), "the same process: once");
        assert!(i.first_try(7, 200), "another process on pid 7");
        i.prune(&|pid| pid != 7);
        assert!(i.tried.is_empty(), "exited processes kept: {:?}", i.tried);
    }

    use super::*;

    fn stream(name: &str, age: f64, in_flight: u64) -> StreamMetrics {
        StreamMetrics {
            device: 0,
            stream: name.into(),
            kernel: "k".into(),
            oldest_age_seconds: age,
            in_flight,
        }
    }

    #[test]
    fn rotation_removes_the_oldest_dumps_down_to_the_cap_but_never_the_new_ones() {
        let dir = std::env::temp_dir().join(format!("wp-rotation-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let names = [
            "a.trace.json.gz",
            "a.report.json",
            "b.trace.json.gz",
            "b.report.json",
            "c.trace.json.gz",
            "c.report.json",
        ];
        let t0 = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
        for (i, n) in names.iter().enumerate() {
            let f = std::fs::File::create(dir.join(n)).unwrap();
            f.set_len(1000).unwrap();
            f.set_modified(t0 + std::time::Duration::from_secs(i as u64 * 10))
                .unwrap();
        }
        std::fs::write(dir.join("notes.txt"), [0u8; 5000]).unwrap(); // not a dump: kept
        // The newest pair was just written; 2,500 bytes allowed: a and b go, c stays.
        let (ct, cr) = (dir.join("c.trace.json.gz"), dir.join("c.report.json"));
        let removed = enforce_cap(&dir, 2500, &[&ct, &cr]);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(removed, 4);
        assert_eq!(left, ["c.report.json", "c.trace.json.gz", "notes.txt"]);
        // A cap below the newest dump itself: it is still kept.
        assert_eq!(enforce_cap(&dir, 1, &[&ct, &cr]), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn between_scans_a_stream_whose_head_retired_keeps_its_last_scan_series() {
        let last = [stream("0x1", 0.001, 40), stream("0x2", 3.0, 1022)];
        // Now only the stuck stream is headed (aged since the scan); 0x1's head retired.
        let mut now = vec![stream("0x2", 3.5, 1022)];
        keep_streams_of_last_scan(&mut now, &last);
        let got: Vec<(&str, f64, u64)> = now
            .iter()
            .map(|s| (s.stream.as_str(), s.oldest_age_seconds, s.in_flight))
            .collect();
        assert_eq!(got, [("0x2", 3.5, 1022), ("0x1", 0.001, 40)]);
    }
}
