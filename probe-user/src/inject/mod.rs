//! `wedgeprobe attach`: the shim put into a CUDA process that is already running, so that its
//! launches are journaled from then on — a process started without `CUDA_INJECTION64_PATH`
//! otherwise gets the host view only, and a kernel that wedges later cannot be named after
//! the fact (CUPTI PC sampling, cuda-gdb and the GPU core dump all fail at that, measured on
//! the H200: docs/measured-facts.md).
//!
//! The steps, each bounded in time, each refusing with one line (the target is someone's
//! production server):
//! 1. `checks`: a CUDA process (libcuda mapped) of our architecture, not instrumented already
//!    (our journal, our shim, an injection library from its start), traceable (Yama,
//!    CAP_SYS_PTRACE, no other tracer), and a shim file only root could have put there;
//! 2. `blocked`: no thread stuck inside a driver call (eight snapshots over 1.4 s);
//! 3. `remote`: one idle thread is taken over at its futex wait and runs the blob (`blob`,
//!    written into a code cave: `cave`), which maps its own page, loads the shim from a memfd
//!    and calls its attach entry point on that thread; the shim prepares its hooks and lists
//!    the code words that turn them on;
//! 4. `commit`: those words are written with every thread stopped (milliseconds);
//! 5. the shim's flush thread sees them in place: the journal says recording.
//!
//! Killed at any point, wedgeprobe leaves the process running and every thread as it was (see
//! `remote` for why no step needs wedgeprobe to finish it, `cupti-shim/src/attach.rs` for the
//! shim's own deadline).

pub mod blob;
mod blocked;
mod cave;
mod checks;
mod commit;
mod ptrace;
mod remote;
mod stopped;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use probe_common::attach::{ATTACH_MAGIC, ATTACH_PREPARED, AttachArgs, MAX_PATCHES};

use crate::{
    error::{ProbeError, exit},
    process::{code::TargetCode, libcuda::LibCuda, target::Target},
    sys,
};

#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error("process {pid} exited while wedgeprobe was attaching")]
    TargetExited { pid: u32 },
    #[error("attach refused: {0}")]
    Refused(String),
    #[error(
        "attach refused: thread {tid} ({name}) has been inside {api} for at least {seconds:.1} s, its callers' frames unchanged: recording cannot start behind a stuck or busy GPU (what it waits for is not in any journal); `wedgeprobe report --pid {pid}` says what it is waiting on"
    )]
    Blocked {
        pid: u32,
        tid: u32,
        name: String,
        api: &'static str,
        seconds: f64,
    },
    #[error("cannot trace the process: {0}")]
    NotTraceable(String),
    #[error("missing {capability}: {why} (run as root, or grant it with setcap/securityContext)")]
    MissingCapability {
        capability: &'static str,
        why: &'static str,
    },
    #[error("the shim {path} is not safe to inject: {why}")]
    UnsafeShim { path: PathBuf, why: String },
    #[error(
        "the injection did not come back within {} s (last step {step}: 1 memfd, 2 image written, 3 dlopen, 4 dlsym, 5 the shim's attach); the thread is left to finish it on its own, and the shim turns itself off at its deadline if it loaded",
        waited.as_secs()
    )]
    Timeout { step: u64, waited: Duration },
    #[error("thread {tid} was not where it was seen a moment ago")]
    ThreadBusy { tid: u32 },
    #[error("attach failed: {0}")]
    Failed(String),
}

impl InjectError {
    /// ptrace refused: who and why, in words.
    pub fn from_ptrace(pid: u32, e: nix::errno::Errno) -> Self {
        match e {
            nix::errno::Errno::ESRCH => Self::TargetExited { pid },
            nix::errno::Errno::EPERM => Self::NotTraceable(format!(
                "the kernel refused to trace pid {pid} (EPERM): Yama's ptrace_scope, a \
                 missing CAP_SYS_PTRACE, or a process that is not dumpable"
            )),
            other => Self::Failed(format!("ptrace on pid {pid}: {other}")),
        }
    }

    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Probe(e) => e.exit_code(),
            Self::TargetExited { .. } => exit::TARGET_EXITED,
            Self::NotTraceable(_) | Self::MissingCapability { .. } => exit::PRIVILEGE,
            Self::Refused(_) | Self::Blocked { .. } => exit::ATTACH_REFUSED,
            Self::UnsafeShim { .. } => exit::UNSAFE_SHIM,
            Self::Timeout { .. } | Self::ThreadBusy { .. } | Self::Failed(_) => exit::ATTACH_FAILED,
        }
    }
}

/// What an attach did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Attached {
    pub pid: u32,
    pub comm: String,
    /// The thread that ran the injection.
    pub tid: u32,
    /// Code words written (launch entry points and the other hooked calls).
    pub hooks: usize,
    pub journal: String,
    /// Seconds from the start of the attach to the journal recording.
    pub seconds: f64,
}

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
    let ran = loop {
        attempts += 1;
        let Some(tid) = remote::pick_thread(pid, &code, &[]) else {
            if attempts < 20 {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            return Err(InjectError::Refused(format!(
                "no thread of pid {pid} is idle in a futex wait to take over (attach needs one \
                 outside the driver; a Python or PyTorch process has many)"
            )));
        };
        match remote::run(remote::Plan {
            pid,
            tid,
            dlopen,
            dlsym,
            image: &image,
            args,
            wait: Duration::from_secs(10),
        }) {
            Ok(ran) => break ran,
            Err(InjectError::ThreadBusy { .. }) if attempts < 20 => continue,
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
    Ok(Attached {
        pid,
        comm: target.comm.clone(),
        tid,
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
