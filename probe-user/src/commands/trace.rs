//! `wedgeprobe trace --pid PID… [--duration D] -o FILE`: attaches like `watch`, records for
//! D (or until Ctrl-C / every target exited), and writes a Chrome trace. Events are streamed
//! to disk through a 1 s reordering window, never held whole in memory; at the end, what is
//! still running (the stuck kernel, blocked calls) is written as open slices.

use std::{io::Write, path::PathBuf, time::Duration};

use crate::output::trace::{
    Names, TickRecorder,
    chrome::{ChromeTrace, Sorter, TraceError},
    event::open_now,
    verdict_pid,
};
use crate::{cli::Targets, collect::session::Session, signals, sys, verdict};

const TICK: Duration = Duration::from_millis(50);
/// Completions reach the journal up to ~0.5 s late (CUPTI's buffers; the forced flush);
/// events are held this long so each track is written in time order.
const REORDER_NS: u64 = 1_000_000_000;

#[derive(clap::Args, Debug)]
pub struct TraceArgs {
    #[command(flatten)]
    pub targets: Targets,
    /// How long to record (default 10s; Ctrl-C ends it early, the file stays valid).
    #[arg(long, default_value = "10s", value_parser = crate::cli::parse_duration)]
    pub duration: Duration,
    /// Output file: Chrome trace JSON, gzip-compressed when it ends in `.gz`.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
}

pub fn run(args: &TraceArgs, out: &mut impl Write) -> anyhow::Result<()> {
    // The output first: an unwritable path fails before anything is attached.
    let mut trace = ChromeTrace::create(&args.output, sys::monotonic_ns(), sys::realtime_ns())?;
    args.targets.apply_job_options();
    let mut session = match Session::attach(&args.targets.pids, false) {
        Ok(s) => s,
        Err(e) => {
            drop(trace);
            let _ = std::fs::remove_file(&args.output);
            return Err(e);
        }
    };
    signals::install();
    let bound_ms = args.targets.blocked_after.as_secs_f64() * 1e3;
    let bounds = args.targets.kernel_bounds();
    let first = args.targets.pids[0];
    let mut rec = TickRecorder::start(&mut session.collector);
    let mut sorter = Sorter::new(REORDER_NS);
    let mut names = Names::from_model(&session.collector.model);
    let start = sys::monotonic_ns();
    let mut write_error: Option<TraceError> = None;
    let mut exited = Vec::new();
    // Shims recording with stream marks (the default) add per-kernel records while we trace,
    // so the GPU tracks show every kernel; the lease lapses when the trace ends (or dies).
    let mut lease = crate::journal::control::PerKernelLease::new();
    let now = loop {
        let now = sys::monotonic_ns();
        lease.renew(&session.collector.journal_paths(), now);
        exited.extend(session.collector.poll(now).into_iter().map(|e| e.pid));
        names.update(&session.collector.model);
        let ev = verdict::evaluate(&session.collector.model, now, bound_ms, &bounds);
        let pid = verdict_pid(&ev.threads, &ev.kernels, first);
        let events = rec.tick(
            &mut session.collector,
            &ev.threads,
            &ev.kernels,
            &ev.verdict,
            pid,
            now,
        );
        sorter.push(events);
        if write_error.is_none() {
            for e in sorter.release(now) {
                if let Err(err) = trace.write(&e, &names) {
                    write_error = Some(err);
                    break;
                }
            }
        }
        let any_alive = session.collector.model.procs.values().any(|p| !p.exited);
        if write_error.is_some()
            || !any_alive
            || signals::stop_requested()
            || now - start >= args.duration.as_nanos() as u64
        {
            break now;
        }
        std::thread::sleep(TICK);
    };
    drop(lease);
    let open = open_now(&session.collector.model, now, (bound_ms * 1e6) as u64);
    let open_count = open.len();
    let mut rest = sorter.drain();
    rest.extend(open);
    rest.sort_by_key(crate::output::trace::chrome::order);
    if write_error.is_none() {
        for e in &rest {
            if let Err(err) = trace.write(e, &names) {
                write_error = Some(err);
                break;
            }
        }
    }
    if write_error.is_none()
        && let Err(err) = trace.mark_end(&rest, now)
    {
        write_error = Some(err);
    }
    let events = trace.events;
    let path = trace.path().to_path_buf();
    let finished = trace.finish();
    let mode = if session.collector.model.journal_read() {
        "journal+ebpf"
    } else {
        "ebpf-only (host tracks only)"
    };
    if !exited.is_empty() {
        let pids: Vec<String> = exited.iter().map(|p| p.to_string()).collect();
        writeln!(
            out,
            "target exited during the trace: pid {}",
            pids.join(", ")
        )?;
    }
    if let Ok(bytes) = &finished {
        writeln!(
            out,
            "wrote {events} events ({:.1} MiB, {open_count} slices still open at the end) to {}; mode {mode}",
            *bytes as f64 / (1 << 20) as f64,
            path.display()
        )?;
    }
    out.flush()?;
    // Detaching takes seconds (Probe::detach): let a pipeline reading us finish first.
    sys::close_stdout();
    session.collector.detach_all();
    if let Some(e) = write_error {
        return Err(e.into());
    }
    finished?;
    Ok(())
}
