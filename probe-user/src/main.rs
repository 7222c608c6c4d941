//! `wedgeprobe`: wires the command line to the subcommands and turns errors into the exit
//! codes documented in the README. Nothing else lives here; the rest is the `probe_user`
//! library (a library so the fuzz targets reach the parsers of untrusted input).

use std::{io::Write, process::ExitCode, time::Duration};

use clap::Parser as _;

use probe_user::{
    cli::{Cli, Command, ReportArgs},
    error::{ProbeError, exit},
    report::Report,
    session::Session,
    signals, sys, watch,
};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            });
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = match &cli.command {
        Command::Report(args) => report(args, &mut out),
        Command::Watch(args) => watch::run(args, &mut out),
        Command::ShimPath => shim_path(&mut out),
        Command::Trace(args) => probe_user::trace::command::run(args, &mut out),
        Command::Daemon(args) => probe_user::daemon::run(args),
        Command::Merge(args) => probe_user::merge::run(args, &mut out),
        Command::Release { pid } => probe_user::release::release(*pid, &mut out),
        Command::Run(args) => match probe_user::run::run(args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::from(exit::OK),
        Err(e) if is_broken_pipe(&e) => ExitCode::from(exit::OK),
        Err(e) => {
            eprintln!("wedgeprobe: {e:#}");
            let code = if e
                .downcast_ref::<probe_user::trace::chrome::TraceError>()
                .is_some()
            {
                exit::OUTPUT
            } else if e
                .downcast_ref::<probe_user::daemon::http::ListenError>()
                .is_some()
            {
                exit::LISTEN
            } else {
                e.downcast_ref::<ProbeError>()
                    .map_or(exit::ERROR, ProbeError::exit_code)
            };
            ExitCode::from(code)
        }
    }
}

fn report(args: &ReportArgs, out: &mut impl Write) -> anyhow::Result<()> {
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

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .and_then(|j| j.io_error_kind())
                .is_some_and(|k| k == std::io::ErrorKind::BrokenPipe)
    })
}

/// The shim library installed next to the wedgeprobe binary.
fn shim_path(out: &mut impl Write) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let shim = exe.with_file_name("libcupti_shim.so");
    if !shim.exists() {
        anyhow::bail!(
            "no libcupti_shim.so next to {} (build it: cargo build -p cupti-shim)",
            exe.display()
        );
    }
    writeln!(out, "{}", shim.display())?;
    Ok(())
}
