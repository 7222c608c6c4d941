//! `wedgeprobe report --pid P…`: attach, watch for a window (1 s by default), print what every
//! target waits on now — text, or JSON (schema in the README) — and detach.

use std::{io::Write, time::Duration};

use crate::{
    cli::ReportArgs, collect::session::Session, commands::Error, output::report::Report, signals,
    sys, verdict::Pipeline,
};

pub fn run(args: &ReportArgs, out: &mut impl Write) -> Result<(), Error> {
    if args.window > Duration::from_secs(60) {
        return Err(crate::commands::Error::Internal(anyhow::anyhow!(
            "--window is at most 60s (a report is a snapshot; use `watch` to observe longer)"
        )));
    }
    let settings = args.targets.settings.settings();
    let mut session = Session::attach(&args.targets.pids, !args.no_launch_returns)?;
    signals::install();
    let start = sys::monotonic_ns();
    let window = args.window.as_nanos() as u64;
    loop {
        let now = sys::monotonic_ns();
        session.collector.poll(now);
        if now - start >= window || signals::stop_requested() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50).min(Duration::from_nanos(window)));
    }
    let now = sys::monotonic_ns();
    let blocked_after_ms = settings.blocked_after_ms();
    let ev = Pipeline::new(settings).evaluate(&session.collector.model, now);
    let report = Report::build(
        &session.collector.model,
        &session.facts,
        &ev,
        now,
        (now - start) as f64 / 1e6,
        blocked_after_ms,
        !args.no_launch_returns,
    );
    if args.json {
        serde_json::to_writer_pretty(&mut *out, &report)?;
        writeln!(out)?;
    } else {
        report.write_text(out)?;
    }
    out.flush()?;
    // Detaching takes seconds (see Probe::detach): let a pipeline reading us finish first.
    sys::close_stdout();
    session.collector.detach_all();
    Ok(())
}
