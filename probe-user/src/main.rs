//! `wedgeprobe`: wires the command line to the subcommands and turns errors into the exit
//! codes documented in the README. Nothing else lives here; the rest is the `probe_user`
//! library (a library so the fuzz targets reach the parsers of untrusted input).

use std::process::ExitCode;

use clap::Parser as _;

use probe_user::{
    cli::{Cli, Command},
    commands,
    error::{ProbeError, exit},
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
        Command::Report(args) => commands::report::run(args, &mut out),
        Command::Watch(args) => commands::watch::run(args, &mut out),
        Command::ShimPath => commands::shim_path::run(&mut out),
        Command::Trace(args) => commands::trace::run(args, &mut out),
        Command::Daemon(args) => commands::daemon::run(args),
        Command::Merge(args) => commands::merge::run(args, &mut out),
        Command::Release { pid } => probe_user::journal::control::release(*pid, &mut out),
        Command::Run(args) => match commands::run::run(args) {
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
                .downcast_ref::<probe_user::output::trace::chrome::TraceError>()
                .is_some()
            {
                exit::OUTPUT
            } else if e
                .downcast_ref::<probe_user::output::metrics::http::ListenError>()
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

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .and_then(|j| j.io_error_kind())
                .is_some_and(|k| k == std::io::ErrorKind::BrokenPipe)
    })
}
