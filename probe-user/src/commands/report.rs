//! `wedgeprobe report --pid P…`: attach, watch for a window (1 s by default), print what every
//! target waits on now — text, or JSON (schema in the README) — and detach.

use std::{io::Write, time::Duration};

use crate::{cli::ReportArgs, collect::session::Session, output::report::Report, signals, sys};

pub fn run(args: &ReportArgs, out: &mut impl Write) -> anyhow::Result<()> {
    if args.window > Duration::from_secs(60) {
        anyhow::bail!(
            "--window is at most 60s (a report is a snapshot; use `watch` to observe longer)"
        );
    }
    args.targets.apply_job_options();
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
    let report = Report::build(
        &session.collector.model,
        &session.facts,
        now,
        (now - start) as f64 / 1e6,
        args.targets.blocked_after.as_secs_f64() * 1e3,
        !args.no_launch_returns,
        &args.targets.kernel_bounds(),
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
