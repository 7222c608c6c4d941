//! `wedgeprobe`: wires the command line to the subcommands and turns errors into the exit
//! codes documented in the README (`commands::Error::exit_code`). Nothing else lives here; the
//! rest is the `probe_user` library (a library so the fuzz targets reach the parsers of
//! untrusted input).

use std::process::ExitCode;

use clap::Parser as _;

use probe_user::{
    cli::{Cli, Command},
    commands,
    error::{chain, exit},
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
        Command::Release { pid } => commands::release::run(*pid, &mut out),
        Command::Attach(args) => commands::attach::run(args, &mut out),
        Command::Run(args) => match commands::run::run(args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
    };
    match result {
        Ok(()) => ExitCode::from(exit::OK),
        Err(e) if e.is_broken_pipe() => ExitCode::from(exit::OK),
        Err(e) => {
            eprintln!("wedgeprobe: {}", chain(&e));
            ExitCode::from(e.exit_code())
        }
    }
}
