//! `wedgeprobe watch`: continuous; a line whenever a thread crosses into or out of "blocked",
//! and whenever the verdict changes. Ticks every 50 ms, so a crossing is printed within
//! ~50 ms plus one on-CPU sample period (≤ 200 ms) for threads found by stack scan.

use std::{collections::HashMap, io::Write, time::Duration};

use serde_json::json;

use crate::{
    cli::WatchArgs,
    collect::session::Session,
    model::ThreadView,
    output::trace::{
        Names, TickRecorder,
        flight::{Dump, FlightRecorder},
        verdict_pid,
    },
    signals, sys,
    verdict::{self, Evaluation, VerdictKind, fmt_duration},
};

const TICK: Duration = Duration::from_millis(50);

pub fn run(args: &WatchArgs, out: &mut impl Write) -> anyhow::Result<()> {
    args.targets.apply_job_options();
    let mut session = Session::attach(&args.targets.pids, args.launch_returns)?;
    signals::install();
    let bound_ms = args.targets.blocked_after.as_secs_f64() * 1e3;
    let bounds = args.targets.kernel_bounds();
    let start = sys::monotonic_ns();
    for p in session.collector.model.procs.values() {
        let facts = &session.facts[&p.target.pid];
        if args.json {
            writeln!(
                out,
                "{}",
                json!({"event": "attached", "pid": p.target.pid, "comm": p.target.comm,
                "libcuda": p.target.libcuda, "traced_entry_points": facts.traced,
                "missing_symbols": facts.missing, "launch_probes": facts.launch_probes})
            )?;
        } else {
            writeln!(
                out,
                "{} watching pid {} ({}): {} entry points in {} (launch probes: {}); blocked after {}; Ctrl-C to stop",
                clock(),
                p.target.pid,
                p.target.comm,
                facts.traced,
                p.target.libcuda,
                facts.launch_probes,
                fmt_duration(bound_ms)
            )?;
        }
    }
    out.flush()?;

    // Blocked threads by (pid, tid, api), with their last view.
    let mut blocked: HashMap<(u32, u32, &'static str), ThreadView> = HashMap::new();
    let mut last_kind = VerdictKind::Healthy;
    let mut flight = args.flight.config().map(|c| {
        (
            FlightRecorder::new(c),
            TickRecorder::start(&mut session.collector),
            Names::default(),
        )
    });
    let first_pid = args.targets.pids[0];
    // Ranks come from the targets' environment, which does not change: read once.
    let infos: Vec<crate::verdict::job::RankInfo> = session
        .collector
        .model
        .procs
        .keys()
        .map(|&pid| crate::verdict::job::read_rank_info(pid))
        .collect();
    let mut last_culprit: Option<(u32, u32)> = None;
    loop {
        let now = sys::monotonic_ns();
        for gone in session.collector.poll(now) {
            if args.json {
                writeln!(
                    out,
                    "{}",
                    json!({"event": "exited", "pid": gone.pid, "comm": gone.comm})
                )?;
            } else {
                writeln!(
                    out,
                    "{} EXITED    pid {} ({})",
                    clock(),
                    gone.pid,
                    gone.comm
                )?;
            }
        }
        for (pid, outcome) in session.collector.take_launch_probe_changes() {
            let text = match &outcome {
                Ok(how) => format!("launch probes: {how}"),
                Err(e) => format!("launch probes could not be added: {e}"),
            };
            if let (Ok(how), Some(f)) = (&outcome, session.facts.get_mut(&pid)) {
                f.launch_probes = how;
            }
            if args.json {
                writeln!(
                    out,
                    "{}",
                    json!({"event": "shim_stopped", "pid": pid, "launch_probes": outcome.as_ref().ok(), "error": outcome.as_ref().err()})
                )?;
            } else {
                writeln!(
                    out,
                    "{} SHIM      pid {pid}: the shim stopped recording (released or off); {text}",
                    clock()
                )?;
            }
        }
        let Evaluation {
            threads,
            kernels,
            verdict: v,
        } = verdict::evaluate(&session.collector.model, now, bound_ms, &bounds);
        let mut still = HashMap::new();
        for t in threads.iter().filter(|t| t.blocked) {
            let key = (t.pid, t.tid, t.api);
            if !blocked.contains_key(&key) {
                print_crossing(out, args.json, "blocked", t)?;
            }
            still.insert(key, t.clone());
        }
        for (key, t) in blocked.drain() {
            if !still.contains_key(&key) {
                print_crossing(out, args.json, "unblocked", &t)?;
            }
        }
        blocked = still;

        let any_alive = session.collector.model.procs.values().any(|p| !p.exited);
        if let Some((recorder, ticks, names)) = &mut flight {
            let pid = verdict_pid(&threads, &kernels, first_pid);
            let events = ticks.tick(&mut session.collector, &threads, &kernels, &v, pid, now);
            recorder.push(events, now);
            names.update(&session.collector.model);
            if recorder.should_dump(pid, v.kind.as_str()) {
                let dumped = recorder.dump_incident(
                    &session.collector.model,
                    &session.facts,
                    names,
                    pid,
                    now,
                    (now - start) as f64 / 1e6,
                    bound_ms,
                    args.launch_returns,
                    &bounds,
                );
                print_dump(out, args.json, pid, &dumped, recorder)?;
            }
        }
        let model = &session.collector.model;
        let jobs = crate::verdict::job::analyze(
            &infos,
            &kernels,
            crate::verdict::job::one_job(),
            &|pid| model.kernels_known(pid),
        );
        let culprit = jobs.iter().find_map(|j| j.culprit.as_ref());
        if culprit.map(|c| (c.pid, c.rank)) != last_culprit {
            last_culprit = culprit.map(|c| (c.pid, c.rank));
            if let Some(c) = culprit {
                if args.json {
                    writeln!(out, "{}", json!({"event": "culprit", "culprit": c}))?;
                } else {
                    writeln!(out, "{} CULPRIT   {}", clock(), c.summary)?;
                }
            }
        }
        if v.kind != last_kind {
            if args.json {
                writeln!(out, "{}", json!({"event": "verdict", "verdict": v}))?;
            } else {
                writeln!(
                    out,
                    "{} VERDICT   {}: {}",
                    clock(),
                    v.kind.as_str(),
                    v.summary
                )?;
            }
            last_kind = v.kind;
        }
        out.flush()?;

        if !any_alive || signals::stop_requested() {
            break;
        }
        if args
            .duration
            .is_some_and(|d| now - start >= d.as_nanos() as u64)
        {
            break;
        }
        std::thread::sleep(TICK);
    }
    session.collector.detach_all();
    if !args.json {
        writeln!(out, "{} detached", clock())?;
    }
    Ok(())
}

fn print_crossing(
    out: &mut impl Write,
    json: bool,
    what: &str,
    t: &ThreadView,
) -> std::io::Result<()> {
    if json {
        return writeln!(out, "{}", json!({"event": what, "thread": t}));
    }
    let at_least = if t.in_call_at_least { "≥ " } else { "" };
    let blocked = what == "blocked";
    let (label, verb, since) = if blocked {
        ("BLOCKED  ", "in", "for")
    } else {
        ("UNBLOCKED", "left", "after")
    };
    let mut line = format!(
        "{} {label} pid {} tid {} ({}) {verb} {} {since} {at_least}{}",
        clock(),
        t.pid,
        t.tid,
        t.name,
        t.api,
        fmt_duration(t.in_call_ms)
    );
    if blocked {
        if let Some(s) = &t.stream {
            line.push_str(&format!(", stream {s}"));
        }
        if t.sched_yield_per_s >= 1.0 {
            line.push_str(&format!(", {:.0} sched_yield/s", t.sched_yield_per_s));
        }
        if let Some(k) = &t.kernel {
            line.push_str(&format!(", kernel {k}"));
        }
    }
    writeln!(out, "{line}")
}

fn print_dump(
    out: &mut impl Write,
    json: bool,
    pid: u32,
    dumped: &anyhow::Result<Dump>,
    recorder: &FlightRecorder,
) -> std::io::Result<()> {
    match (dumped, json) {
        (Ok(d), true) => writeln!(
            out,
            "{}",
            json!({"event": "flight_dump", "pid": pid, "trace": d.trace, "report": d.report,
                "events": d.events, "seconds_held": d.seconds_held,
                "evicted_early": recorder.evicted_early})
        ),
        (Ok(d), false) => writeln!(
            out,
            "{} FLIGHT    pid {pid}: last {:.1} s ({} events{}) in {} ; report {}",
            clock(),
            d.seconds_held,
            d.events,
            if recorder.evicted_early > 0 {
                format!(
                    ", {} older events dropped by --flight-max-events",
                    recorder.evicted_early
                )
            } else {
                String::new()
            },
            d.trace.display(),
            d.report.display()
        ),
        (Err(e), true) => writeln!(
            out,
            "{}",
            json!({"event": "flight_dump_failed", "pid": pid, "error": format!("{e:#}"),
                "failures": recorder.dumps_failed})
        ),
        (Err(e), false) => writeln!(
            out,
            "{} FLIGHT    pid {pid}: dump failed ({e:#}); still watching ({} failed dumps)",
            clock(),
            recorder.dumps_failed
        ),
    }
}

/// Wall-clock time of day (UTC), for log lines a person lines up with other logs.
fn clock() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let s = now.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        now.subsec_millis()
    )
}
