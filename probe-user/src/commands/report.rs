//! `wedgeprobe report --pid P…`: attach, watch for a window (1 s by default), print what every
//! target waits on now — text, or JSON (schema in the README) — and detach.

use std::{io::Write, time::Duration};

use crate::{
    cli::ReportArgs,
    collect::session::Session,
    commands::Error,
    engine::{Engine, EngineOptions, TICK},
    output::report::Report,
    signals, sys,
    timings::Phases,
    verdict::Pipeline,
};

pub fn run(args: &ReportArgs, out: &mut impl Write) -> Result<(), Error> {
    if args.window > Duration::from_secs(60) {
        return Err(Error::Internal(anyhow::anyhow!(
            "--window is at most 60s (a report is a snapshot; use `watch` to observe longer)"
        )));
    }
    let settings = args.targets.settings.settings();
    let blocked_after_ms = settings.blocked_after_ms();
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
    let window = args.window.as_nanos() as u64;
    let mut first = true;
    let tick = loop {
        let tick = engine.tick(sys::monotonic_ns());
        if std::mem::take(&mut first) {
            phases.done("first tick (probes read, stacks scanned)");
        }
        if tick.now_ns - start >= window || signals::stop_requested() {
            break tick;
        }
        std::thread::sleep(TICK.min(args.window));
    };
    phases.done("the rest of the window");
    let report = Report::build(
        &engine.collector.model,
        &engine.facts,
        &tick.all,
        tick.now_ns,
        (tick.now_ns - start) as f64 / 1e6,
        blocked_after_ms,
        !args.no_launch_returns,
    );
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
