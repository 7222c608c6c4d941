//! `wedgeprobe trace --pid PID… [--duration D] -o FILE`: attaches like `watch`, records for
//! D (or until Ctrl-C / every target exited), and writes a Chrome trace. Events are streamed
//! to disk through a 1 s reordering window, never held whole in memory; at the end, what is
//! still running (the stuck kernel, blocked calls) is written as open slices.

use std::io::Write;

use crate::{
    cli::TraceArgs,
    collect::session::Session,
    commands::Error,
    engine::{Engine, EngineOptions, TICK},
    model::event::open_now,
    output::trace::chrome::{self, ChromeTrace, Sorter, TraceError},
    signals, sys,
    verdict::Pipeline,
};

/// Completions reach the journal up to ~0.5 s late (CUPTI's buffers; the forced flush);
/// events are held this long so each track is written in time order.
const REORDER_NS: u64 = 1_000_000_000;

pub fn run(args: &TraceArgs, out: &mut impl Write) -> Result<(), Error> {
    // The output first: an unwritable path fails before anything is attached.
    let mut trace = ChromeTrace::create(&args.output, sys::monotonic_ns(), sys::realtime_ns())?;
    let settings = args.targets.settings.settings();
    let session = match Session::attach(
        &args.targets.pids,
        false,
        &mut crate::timings::Phases::from_env(),
    ) {
        Ok(s) => s,
        Err(e) => {
            drop(trace);
            let _ = std::fs::remove_file(&args.output);
            return Err(e.into());
        }
    };
    signals::install();
    let bound_ns = settings.blocked_after_ns();
    let mut collector = session.collector;
    // The rings are read on a thread of their own while the trace runs: a tick (50 ms, more
    // while JSON is written) is longer than one lap of a ring at graph-replay rates.
    if let Err(e) = collector.start_ring_pump() {
        writeln!(
            out,
            "wedgeprobe: cannot start the ring reader ({e}); records the ring overwrites between ticks are counted as lost"
        )?;
    }
    let mut sorter = Sorter::new(REORDER_NS);
    let start = sys::monotonic_ns();
    let mut engine = Engine::new(
        collector,
        session.facts,
        Pipeline::new(settings),
        EngineOptions {
            flight: None,
            record_trace: true,
            per_process: false,
            launch_returns: false,
        },
        start,
    );
    let mut write_error: Option<TraceError> = None;
    let mut exited = Vec::new();
    // Shims recording with stream marks (the default) add per-kernel records while we trace,
    // so the GPU tracks show every kernel; the lease lapses when the trace ends (or dies).
    let mut lease = crate::journal::control::PerKernelLease::new();
    let now = loop {
        let now = sys::monotonic_ns();
        lease.renew(&engine.collector.journal_mappings(), now);
        let tick = engine.tick(now);
        exited.extend(tick.events.iter().filter_map(|e| match e {
            crate::engine::Event::Exited { pid, .. } => Some(*pid),
            _ => None,
        }));
        sorter.push(tick.trace);
        if write_error.is_none() {
            for e in sorter.release(now) {
                if let Err(err) = trace.write(&e, &engine.names) {
                    write_error = Some(err);
                    break;
                }
            }
        }
        if write_error.is_some()
            || !engine.any_alive()
            || signals::stop_requested()
            || now - start >= args.duration.as_nanos() as u64
        {
            break now;
        }
        std::thread::sleep(TICK);
    };
    drop(lease);
    let open = open_now(&engine.collector.model, now, bound_ns);
    let open_count = open.len();
    let mut rest = sorter.drain();
    rest.extend(open);
    rest.sort_by_key(chrome::order);
    if write_error.is_none() {
        for e in &rest {
            if let Err(err) = trace.write(e, &engine.names) {
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
    let stream_losses: Vec<_> = engine
        .collector
        .model
        .journals
        .iter()
        .flat_map(|(&pid, j)| j.ring_lost_by_stream.iter().map(move |l| (pid, *l)))
        .collect();
    if write_error.is_none()
        && let Err(err) = trace.mark_stream_losses(&stream_losses, now, &engine.names)
    {
        write_error = Some(err);
    }
    let events = trace.events;
    let (launches, kernels, lost) = (trace.launches, trace.kernels, trace.lost);
    let path = trace.path().to_path_buf();
    let finished = trace.finish();
    let mode = if engine.collector.model.journal_read() {
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
        if engine.collector.model.journal_read() {
            let completeness = if lost == 0 {
                "no journal record lost".to_string()
            } else {
                let shown = 8;
                let mut by_stream: Vec<String> = stream_losses
                    .iter()
                    .take(shown)
                    .map(|(pid, l)| {
                        format!(
                            "pid {pid} stream {}: {} of {}",
                            l.stream_id, l.lost, l.written
                        )
                    })
                    .collect();
                if stream_losses.len() > shown {
                    by_stream.push(format!("{} more streams", stream_losses.len() - shown));
                }
                let on_streams: u64 = stream_losses.iter().map(|(_, l)| l.lost).sum();
                let unnumbered = lost.saturating_sub(on_streams);
                if unnumbered > 0 {
                    by_stream.push(format!(
                        "{unnumbered} synchronize/capture records or not yet placed on a stream"
                    ));
                }
                format!(
                    "{lost} journal records LOST (the trace could not keep up; each gap is a \
                     `journal records lost` marker on its process; by stream: {})",
                    if by_stream.is_empty() {
                        "none attributed".to_string()
                    } else {
                        by_stream.join(", ")
                    }
                )
            };
            // What the ring held before the trace is a bonus look back, not the trace's window:
            // its oldest records overwritten before the first read got to them are said, not
            // counted lost.
            let history: u64 = engine
                .collector
                .model
                .journals
                .values()
                .map(|j| j.ring_history_unread)
                .sum();
            let history = if history > 0 {
                format!(
                    "; the look back before the trace starts later: {history} of the oldest \
                     records the ring held were overwritten before the first read reached them"
                )
            } else {
                String::new()
            };
            writeln!(
                out,
                "kept {launches} launches and {kernels} kernel executions from the journals; {completeness}{history}"
            )?;
        }
    }
    out.flush()?;
    // Detaching takes seconds (Probe::detach): let a pipeline reading us finish first, and
    // leave it to a child after we exit (Engine::detach_in_background).
    sys::close_stdout();
    let _ = engine.finish();
    if let Some(e) = write_error {
        return Err(e.into());
    }
    finished?;
    Ok(())
}
