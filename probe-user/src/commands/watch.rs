//! `wedgeprobe watch`: continuous; a line whenever a thread crosses into or out of "blocked",
//! and whenever the verdict changes. Ticks every 50 ms, so a crossing is printed within
//! ~50 ms plus one on-CPU sample period (≤ 200 ms) for threads found by stack scan.

use std::{io::Write, time::Duration};

use serde_json::json;

use crate::{
    cli::WatchArgs,
    collect::session::Session,
    commands::Error,
    engine::{Engine, EngineOptions, Event, TICK},
    model::ThreadView,
    output::trace::flight::{Dump, FlightConfig},
    settings::Settings,
    signals, sys,
    verdict::{Pipeline, describe::fmt_duration},
};

/// What `watch` (and `run`) is asked to do beyond the settings.
pub struct WatchOptions {
    pub json: bool,
    pub duration: Option<Duration>,
    pub launch_returns: bool,
    pub flight: Option<FlightConfig>,
}

pub fn run(args: &WatchArgs, out: &mut impl Write) -> Result<(), Error> {
    let options = WatchOptions {
        json: args.json,
        duration: args.duration,
        launch_returns: args.launch_returns,
        flight: args.flight.config(),
    };
    watch(
        &args.targets.pids,
        args.targets.settings.settings(),
        &options,
        out,
    )
}

/// Attaches to `pids` and prints the engine's events until every target exited, Ctrl-C, or
/// the duration is up.
pub fn watch(
    pids: &[u32],
    settings: Settings,
    options: &WatchOptions,
    out: &mut impl Write,
) -> Result<(), Error> {
    let session = Session::attach(
        pids,
        options.launch_returns,
        &mut crate::timings::Phases::from_env(),
    )?;
    signals::install();
    let bound_ms = settings.blocked_after_ms();
    let start = sys::monotonic_ns();
    for p in session.collector.model.procs.values() {
        let facts = &session.facts[&p.target.pid];
        if options.json {
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
    let mut engine = Engine::new(
        session.collector,
        session.facts,
        Pipeline::new(settings),
        EngineOptions {
            flight: options.flight.clone(),
            record_trace: false,
            per_process: false,
            launch_returns: options.launch_returns,
        },
        start,
    );
    loop {
        let now = sys::monotonic_ns();
        let tick = engine.tick(now);
        for e in &tick.events {
            print_event(out, options.json, e)?;
        }
        out.flush()?;
        if !engine.any_alive() || signals::stop_requested() {
            break;
        }
        if options
            .duration
            .is_some_and(|d| now - start >= d.as_nanos() as u64)
        {
            break;
        }
        std::thread::sleep(TICK);
    }
    // The links are closed by a child after we exit (Engine::detach_in_background): Ctrl-C
    // returns at once, not after seconds of the kernel's closing.
    let _ = engine.finish();
    if !options.json {
        writeln!(out, "{} detached", clock())?;
    }
    Ok(())
}

fn print_event(out: &mut impl Write, json: bool, e: &Event) -> std::io::Result<()> {
    match e {
        Event::Exited { pid, comm } => {
            if json {
                writeln!(
                    out,
                    "{}",
                    json!({"event": "exited", "pid": pid, "comm": comm})
                )
            } else {
                writeln!(out, "{} EXITED    pid {pid} ({comm})", clock())
            }
        }
        Event::ShimStopped { pid, launch_probes } => {
            if json {
                writeln!(
                    out,
                    "{}",
                    json!({"event": "shim_stopped", "pid": pid, "launch_probes": launch_probes.as_ref().ok(), "error": launch_probes.as_ref().err()})
                )
            } else {
                let text = match launch_probes {
                    Ok(how) => format!("launch probes: {how}"),
                    Err(e) => format!("launch probes could not be added: {e}"),
                };
                writeln!(
                    out,
                    "{} SHIM      pid {pid}: the shim stopped recording (released or off); {text}",
                    clock()
                )
            }
        }
        Event::Blocked(t) => print_crossing(out, json, "blocked", t),
        Event::Unblocked(t) => print_crossing(out, json, "unblocked", t),
        Event::FlightDump {
            pid,
            result,
            evicted_early,
            failures,
        } => print_dump(out, json, *pid, result, *evicted_early, *failures),
        Event::Culprit { culprit, .. } => {
            if json {
                writeln!(out, "{}", json!({"event": "culprit", "culprit": culprit}))
            } else {
                writeln!(out, "{} CULPRIT   {}", clock(), culprit.summary)
            }
        }
        Event::Verdict(v) => {
            if json {
                writeln!(out, "{}", json!({"event": "verdict", "verdict": v}))
            } else {
                writeln!(
                    out,
                    "{} VERDICT   {}: {}",
                    clock(),
                    v.kind.as_str(),
                    v.summary
                )
            }
        }
        // Per-process verdicts are the daemon's.
        Event::ProcessVerdict { .. } => Ok(()),
    }
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
    dumped: &Result<Dump, String>,
    evicted_early: u64,
    failures: u64,
) -> std::io::Result<()> {
    match (dumped, json) {
        (Ok(d), true) => writeln!(
            out,
            "{}",
            json!({"event": "flight_dump", "pid": pid, "trace": d.trace, "report": d.report,
                "events": d.events, "seconds_held": d.seconds_held,
                "evicted_early": evicted_early})
        ),
        (Ok(d), false) => writeln!(
            out,
            "{} FLIGHT    pid {pid}: last {:.1} s ({} events{}) in {} ; report {}",
            clock(),
            d.seconds_held,
            d.events,
            if evicted_early > 0 {
                format!(", {evicted_early} older events dropped by --flight-max-events")
            } else {
                String::new()
            },
            d.trace.display(),
            d.report.display()
        ),
        (Err(e), true) => writeln!(
            out,
            "{}",
            json!({"event": "flight_dump_failed", "pid": pid, "error": e,
                "failures": failures})
        ),
        (Err(e), false) => writeln!(
            out,
            "{} FLIGHT    pid {pid}: dump failed ({e}); still watching ({failures} failed dumps)",
            clock()
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
