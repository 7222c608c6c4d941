//! `wedgeprobe run -- CMD ARGS…`: starts the command with the shim injected
//! (`CUDA_INJECTION64_PATH`), waits until it maps libcuda (CUDA initialises lazily), then
//! watches it like `watch`, printing on stderr so the command's own output stays clean.
//! Exits with the command's exit code (128 + signal when a signal ended it).

use std::{
    os::unix::process::ExitStatusExt as _,
    process::{Command, ExitCode},
    time::Duration,
};

use anyhow::Context as _;

use crate::{
    cli::RunArgs,
    commands::Error,
    commands::watch::{WatchOptions, watch},
    error::ProbeError,
    process::target,
    signals,
};

pub fn run(args: &RunArgs) -> Result<ExitCode, Error> {
    let (program, rest) = args.command.split_first().context("no command given")?;
    let mut cmd = Command::new(program);
    cmd.args(rest);
    if !args.no_shim && std::env::var_os("CUDA_INJECTION64_PATH").is_none() {
        let shim = std::env::current_exe()?.with_file_name("libcupti_shim.so");
        if shim.exists() {
            cmd.env("CUDA_INJECTION64_PATH", &shim);
        } else {
            eprintln!("wedgeprobe: no libcupti_shim.so next to wedgeprobe; running eBPF-only");
        }
    }
    let injected = cmd
        .get_envs()
        .any(|(k, v)| k == "CUDA_INJECTION64_PATH" && v.is_some())
        || (!args.no_shim && std::env::var_os("CUDA_INJECTION64_PATH").is_some());
    let mut waited_for_journal = 0;
    let mut child = cmd
        .spawn()
        .with_context(|| format!("failed to start {program}"))?;
    let pid = child.id();
    signals::install();
    // CUDA maps libcuda at initialisation, possibly long after start.
    let mut attached = false;
    while !attached {
        if let Some(status) = child.try_wait()? {
            return Ok(exit_code(status));
        }
        if signals::stop_requested() {
            break;
        }
        match target::Target::open(pid) {
            // With the shim injected, its journal appears during CUDA's initialisation,
            // just after libcuda is mapped: wait for it (up to 2 s), so `watch` finds it and
            // leaves launches to the shim instead of putting probes on them.
            Ok(t) if t.journal.is_none() && injected && waited_for_journal < 20 => {
                waited_for_journal += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(_) => attached = true,
            Err(ProbeError::NotCuda { .. }) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(e.into()),
        }
    }
    if attached {
        let options = WatchOptions {
            json: args.json,
            duration: None,
            launch_returns: false,
            flight: args.flight.config(),
        };
        let mut err = std::io::stderr().lock();
        watch(&[pid], args.settings.settings(), &options, &mut err)?;
    }
    let status = child.wait()?;
    Ok(exit_code(status))
}

fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
