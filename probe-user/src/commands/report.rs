//! `wedgeprobe report --pid P…`: attach, watch for a window (1 s by default), print what every
//! target waits on now — text, or JSON (schema in the README) — and detach.
//!
//! The default window grows while the evidence cannot decide: a thread busy on the host since
//! attach, in a process with no shim journal that returned from no driver call, may have spun
//! for minutes (a handshake after hours of serving) or be one second into tokenizing — /proc
//! keeps CPU totals, not when a thread last slept, so only watching tells them apart. `report`
//! watches on until that thread has been busy `stall_after` (a `host_stall`) or stops (work),
//! and says so on stderr. `--window` fixes the window; undecided threads are then listed.

use std::{io::Write, time::Duration};

use crate::{
    cli::ReportArgs,
    collect::session::Session,
    commands::Error,
    engine::{Engine, EngineOptions, TICK},
    output::report::Report,
    signals, sys,
    timings::Phases,
    verdict::{
        Pipeline,
        host_stall::{UndecidedWhy, Watched},
    },
};

/// The default window, and the most it grows to (report is a snapshot; `watch` observes).
const DEFAULT_WINDOW: Duration = Duration::from_secs(1);
const MOST: Duration = Duration::from_secs(60);

/// After the last CPU reading that could decide a thread: the readings come once a second.
const DECIDE_SLACK: Duration = Duration::from_millis(1500);

pub fn run(args: &ReportArgs, out: &mut impl Write) -> Result<(), Error> {
    let asked = args.window;
    if asked.is_some_and(|w| w > MOST) {
        return Err(Error::Internal(anyhow::anyhow!(
            "--window is at most 60s (a report is a snapshot; use `watch` to observe longer)"
        )));
    }
    let settings = args.targets.settings.settings();
    let blocked_after_ms = settings.blocked_after_ms();
    let stall_after = settings.stall_after;
    let mut phases = Phases::from_env();
    let session = Session::attach(&args.targets.pids, !args.no_launch_returns, &mut phases)?;
    signals::install();
    let start = sys::monotonic_ns();
    let mut engine = Engine::new(
        session.collector,
        session.facts,
        Pipeline::new(settings),
        EngineOptions {
            flight: None,
            record_trace: false,
            per_process: false,
            launch_returns: !args.no_launch_returns,
        },
        start,
    );
    // The engine's ticks for the window; the report is the last tick's evaluation.
    let window = asked.unwrap_or(DEFAULT_WINDOW);
    let most = (stall_after + DECIDE_SLACK).clamp(window, MOST);
    let mut first = true;
    let mut said = false;
    // The threads that made the window grow, as last seen busy (`Watched`).
    let mut watching: std::collections::BTreeMap<(u32, u32), Watched> = Default::default();
    let tick = loop {
        let now = sys::monotonic_ns();
        if Duration::from_nanos(now - start) >= window {
            // This tick may be the answer: a target that exited since the last look (once a
            // second) is said exited, not healthy (a 200 ms window never looked again).
            engine.collector.look_for_exits_next();
        }
        let tick = engine.tick(now);
        if std::mem::take(&mut first) {
            phases.done("first tick (probes read, stacks scanned)");
        }
        let elapsed = Duration::from_nanos(tick.now_ns - start);
        if signals::stop_requested() {
            break tick;
        }
        if elapsed >= window {
            if asked.is_none() {
                for u in tick
                    .all
                    .undecided
                    .iter()
                    .filter(|u| u.why == UndecidedWhy::StartUnknown)
                {
                    let w = watching.entry((u.pid, u.tid)).or_insert_with(|| Watched {
                        pid: u.pid,
                        tid: u.tid,
                        name: u.name.clone(),
                        busy_ms: 0.0,
                        stopped_after_ms: 0.0,
                    });
                    w.busy_ms = w.busy_ms.max(u.busy_ms.unwrap_or(0.0));
                    w.stopped_after_ms = elapsed.as_secs_f64() * 1e3;
                }
            }
            if asked.is_some() || tick.all.undecided.is_empty() || elapsed >= most {
                break tick;
            }
            if !said
                && tick
                    .all
                    .undecided
                    .iter()
                    .any(|u| u.why == UndecidedWhy::StartUnknown)
            {
                said = true;
                eprintln!(
                    "{}",
                    growing_window_line(&tick.all.undecided, most - elapsed)
                );
            }
        }
        std::thread::sleep(TICK.min(window));
    };
    phases.done("the rest of the window");
    let mut report = Report::build(
        &engine.collector.model,
        &engine.facts,
        &tick.all,
        tick.now_ns,
        (tick.now_ns - start) as f64 / 1e6,
        blocked_after_ms,
        !args.no_launch_returns,
    );
    report.uprobe_links = Some(engine.collector.probe.uprobe_links());
    report.watched = stopped(watching, &tick.all);
    phases.done("build the report (stacks symbolized, Python stacks read)");
    if args.json {
        serde_json::to_writer_pretty(&mut *out, &report)?;
        writeln!(out)?;
    } else {
        report.write_text(out)?;
    }
    out.flush()?;
    // Detaching takes seconds (see Probe::detach): let a pipeline reading us finish first.
    sys::close_stdout();
    phases.done("write the report (stdout closed: the answer is out)");
    phases.done(if engine.finish() {
        "detach (the uprobe links left to a child process to close)"
    } else {
        "detach (uprobe links closed)"
    });
    Ok(())
}

/// The watched threads that are neither undecided nor a stall at the window's end: they
/// stopped being busy while watched.
fn stopped(
    watching: std::collections::BTreeMap<(u32, u32), Watched>,
    ev: &crate::verdict::Evaluation,
) -> Vec<Watched> {
    watching
        .into_values()
        .filter(|w| {
            !ev.undecided
                .iter()
                .any(|u| (u.pid, u.tid) == (w.pid, w.tid))
                && !ev
                    .host_stalls
                    .iter()
                    .any(|s| s.pid == w.pid && s.threads.iter().any(|t| t.tid == w.tid))
        })
        .collect()
}

/// One line on stderr when the window grows: what is watched, why, for how long at most.
fn growing_window_line(
    undecided: &[crate::verdict::host_stall::Undecided],
    left: Duration,
) -> String {
    let threads: Vec<String> = undecided
        .iter()
        .filter(|u| u.why == UndecidedWhy::StartUnknown)
        .map(|u| format!("pid {} tid {} ({})", u.pid, u.tid, u.name))
        .collect();
    format!(
        "wedgeprobe: {} busy on the host since attach, no driver call returning, no shim \
         journal to say since when: watching up to {:.1} s more to tell a host stall from work \
         (--window answers sooner, undecided)",
        threads.join(", "),
        left.as_secs_f64()
    )
}
