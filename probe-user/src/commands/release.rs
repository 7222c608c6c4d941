//! `wedgeprobe release --pid PID`: asks a process's shim to give CUPTI back (the request is
//! `journal::control`'s), and waits up to 3 s for it to say it did.

use std::{
    io::Write,
    time::{Duration, Instant},
};

use crate::{
    commands::Error,
    error::ProbeError,
    journal::{MappedJournal, control},
    process::target,
};

pub fn run(pid: u32, out: &mut impl Write) -> Result<(), Error> {
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Err(ProbeError::NoSuchProcess { pid }.into());
    }
    let mapping = target::find_journal(pid).ok_or(ProbeError::NoJournal { pid })?;
    // Validates ownership, mode and header before anything is written.
    let journal = MappedJournal::open(pid, &mapping).map_err(Error::Internal)?;
    if journal.view().shim_released() {
        writeln!(out, "pid {pid}: the shim had already released CUPTI")?;
        return Ok(());
    }
    if journal.view().shim_off() {
        writeln!(out, "pid {pid}: the shim is off; CUPTI is free")?;
        return Ok(());
    }
    control::request(pid, &mapping).map_err(Error::Internal)?;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        if journal.view().shim_released() {
            writeln!(
                out,
                "pid {pid}: the shim released CUPTI after {} ms; profilers can subscribe now (wedgeprobe continues eBPF-only for this process)",
                start.elapsed().as_millis()
            )?;
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(Error::Internal(anyhow::anyhow!(
        "pid {pid}: the shim did not answer within 3 s (it polls every 100 ms; is the process stopped?)"
    )))
}
