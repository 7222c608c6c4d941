//! What an attach did, and how it can fail (each failure a line and an exit code).

use std::{path::PathBuf, time::Duration};

use crate::error::{ProbeError, exit};

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
    #[error("thread {tid}'s wait did not end in time to borrow it as it ended")]
    ThreadSlow { tid: u32 },
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
            Self::Timeout { .. }
            | Self::ThreadBusy { .. }
            | Self::ThreadSlow { .. }
            | Self::Failed(_) => exit::ATTACH_FAILED,
        }
    }
}

/// What an attach did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Attached {
    pub pid: u32,
    pub comm: String,
    /// The thread that ran the injection: its id, its name, and the wait it was borrowed from
    /// (and given back to).
    pub tid: u32,
    pub thread: String,
    pub waiting_in: &'static str,
    /// Code words written (launch entry points and the other hooked calls).
    pub hooks: usize,
    pub journal: String,
    /// Seconds from the start of the attach to the journal recording.
    pub seconds: f64,
}
