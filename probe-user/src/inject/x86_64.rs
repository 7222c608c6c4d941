//! The steps of an attach on x86-64 (the module doc of `super` lists them).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use probe_common::attach::{ATTACH_MAGIC, ATTACH_PREPARED, AttachArgs, MAX_PATCHES};

use super::{
    blocked, checks, commit,
    error::{Attached, InjectError},
    remote,
};
use crate::{
    error::ProbeError,
    process::{code::TargetCode, libcuda::LibCuda, target::Target},
    sys,
};

/// The whole attach of `pid` with the shim at `shim` (see the module doc).
pub fn attach(pid: u32, shim: &Path) -> Result<Attached, InjectError> {
    let start = Instant::now();
    let target = Target::open(pid)?;
    checks::traceable(pid)?;
    checks::architecture(pid)?;
    checks::not_instrumented(&target)?;
    let image = checks::shim_image(shim)?;
    let (dlopen, dlsym) = checks::dl_functions(pid)?;
    let lib = LibCuda::resolve(&target.libcuda_host_path).map_err(ProbeError::Other)?;
    checks::no_breakpoints(
        pid,
        lib.waits
            .iter()
            .filter_map(|ep| Some((target.libcuda_address(ep.file_offset)?, ep.symbol))),
    )?;
    let code = TargetCode::new(&target, &lib);
    if let Some(s) = blocked::stuck_thread(pid, &code, 8, Duration::from_millis(200))? {
        return Err(InjectError::Blocked {
            pid,
            tid: s.tid,
            name: s.name,
            api: s.api,
            seconds: s.seconds,
        });
    }
    // The shim backs out unless its hooks are in place by then.
    let deadline = sys::monotonic_ns() + 15_000_000_000;
    let args = AttachArgs {
        magic: ATTACH_MAGIC,
        commit_deadline_ns: deadline,
        ..AttachArgs::default()
    };
    // A thread seen idle may wake before it is stopped (a pool woken every few ms): it is let
    // go untouched, and the choice made again.
    let mut attempts = 0;
    // Threads whose relative wait did not end in time: not tried again.
    let mut slow = Vec::new();
    let ran = loop {
        attempts += 1;
        let Some(idle) = remote::pick_thread(pid, &code, &slow) else {
            if attempts < 20 {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            return Err(InjectError::Refused(format!(
                "no thread of pid {pid} is idle in a wait attach can borrow it from (a futex, \
                 epoll, poll, select or sleep wait, or a read on a pipe or socket) outside the \
                 driver; a Python or PyTorch process has many"
            )));
        };
        match remote::run(remote::Plan {
            pid,
            idle,
            dlopen,
            dlsym,
            image: &image,
            args,
            wait: Duration::from_secs(10),
        }) {
            Ok(ran) => break ran,
            Err(InjectError::ThreadBusy { .. }) if attempts < 20 => continue,
            Err(InjectError::ThreadSlow { tid }) if attempts < 20 => {
                slow.push(tid);
                continue;
            }
            Err(e) => return Err(e),
        }
    };
    let tid = ran.tid;
    let a = ran.args;
    if ran.handle == 0 || ran.symbol == 0 {
        return Err(InjectError::Failed(format!(
            "the target could not load the shim (stopped at step {}: {})",
            ran.step,
            if ran.handle == 0 {
                "dlopen failed"
            } else {
                "wedgeprobe_shim_attach not found in it"
            }
        )));
    }
    if a.magic != ATTACH_MAGIC || a.status != ATTACH_PREPARED {
        let msg = a.message.split(|&b| b == 0).next().unwrap_or_default();
        return Err(InjectError::Failed(format!(
            "the shim refused to attach (status {}): {}",
            a.status,
            String::from_utf8_lossy(msg)
        )));
    }
    let n = (a.npatches as usize).min(MAX_PATCHES);
    let words = &a.patches[..n];
    commit::validate(&target, words)?;
    let hooks = commit::write_all(pid, words, &ran.cave)?;
    // The shim's flush thread checks every 10–100 ms.
    let journal = format!("memfd:{}", probe_common::journal::MEMFD_NAME);
    let recording = wait_recording(pid, Duration::from_secs(3));
    if !recording {
        return Err(InjectError::Failed(format!(
            "the hooks are in place but the shim's journal {journal} does not say recording \
             within 3 s"
        )));
    }
    let thread = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_default();
    Ok(Attached {
        pid,
        comm: target.comm.clone(),
        tid,
        thread,
        waiting_in: ran.wait.describe(),
        hooks,
        journal,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Whether the target's journal says recording within `wait`.
fn wait_recording(pid: u32, wait: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < wait {
        if let Some(m) = crate::process::target::find_journal(pid)
            && let Ok(j) = crate::journal::MappedJournal::open(pid, &m)
            && j.view().header().state == probe_common::journal::STATE_RECORDING
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
