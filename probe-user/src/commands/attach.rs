//! `wedgeprobe attach --pid PID [--pid …] [--json]`: puts the shim into running CUDA processes
//! (`crate::inject`), one after the other; prints one line (or object) per process. The exit
//! code is the first failure's (README, "Exit codes"); the other processes are still tried.

use std::io::Write;

use serde_json::json;

use crate::{cli::AttachArgs, commands::Error, inject};

pub fn run(args: &AttachArgs, out: &mut impl Write) -> Result<(), Error> {
    let shim = crate::commands::shim_path::shim_path().map_err(Error::Internal)?;
    let mut first_error = None;
    for &pid in &args.pids {
        match inject::attach(pid, &shim) {
            Ok(a) => {
                if args.json {
                    writeln!(out, "{}", json!({"pid": pid, "attached": a}))?;
                } else {
                    writeln!(
                        out,
                        "pid {pid} ({}): attached in {:.1} s through thread {} ({}), borrowed \
                         from {} and given back; the shim records now ({} entry points hooked, \
                         journal {}; launches before it are not in it)",
                        a.comm, a.seconds, a.tid, a.thread, a.waiting_in, a.hooks, a.journal
                    )?;
                }
            }
            Err(e) => {
                if args.json {
                    writeln!(
                        out,
                        "{}",
                        json!({"pid": pid, "error": e.to_string(), "exit_code": e.exit_code()})
                    )?;
                } else if first_error.is_some() {
                    // (The first failure is printed by main, with its exit code.)
                    eprintln!("wedgeprobe: pid {pid}: {e}");
                }
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(Error::Attach(e)),
        None => Ok(()),
    }
}
