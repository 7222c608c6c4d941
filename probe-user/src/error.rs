//! The failures a user can cause or meet, each with its documented exit code (README, "Exit
//! codes"). Everything else is an internal error (exit 1) printed with its cause chain.

use std::path::PathBuf;

/// Exit codes, as documented in the README.
pub mod exit {
    pub const OK: u8 = 0;
    pub const ERROR: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const NO_SUCH_PROCESS: u8 = 3;
    pub const NOT_CUDA: u8 = 4;
    pub const PRIVILEGE: u8 = 5;
    pub const TARGET_EXITED: u8 = 6;
    pub const NO_SYMBOLS: u8 = 7;
    pub const NO_JOURNAL: u8 = 8;
    pub const OUTPUT: u8 = 9;
    pub const LISTEN: u8 = 10;
    /// `attach`: the process's state forbids it (a thread stuck in a driver call, already
    /// instrumented, another tracer, another architecture).
    pub const ATTACH_REFUSED: u8 = 11;
    /// `attach`: the shim file could be replaced by someone other than root.
    pub const UNSAFE_SHIM: u8 = 12;
    /// `attach`: the injection did not complete (the process runs on without the shim).
    pub const ATTACH_FAILED: u8 = 13;
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("no process with pid {pid}")]
    NoSuchProcess { pid: u32 },
    #[error(
        "process {pid} ({comm}) does not map libcuda: not a CUDA process, or CUDA is not initialised yet"
    )]
    NotCuda { pid: u32, comm: String },
    #[error("missing {capability}: {why} (run as root, or grant it with setcap/securityContext)")]
    MissingCapability {
        capability: &'static str,
        why: &'static str,
    },
    #[error("process {pid} exited while wedgeprobe was attaching")]
    TargetExited { pid: u32 },
    #[error(
        "{path} exports none of the CUDA driver entry points wedgeprobe traces (stripped or not libcuda)"
    )]
    NoSymbols { path: PathBuf },
    #[error(
        "process {pid} has no wedgeprobe shim journal (not started with CUDA_INJECTION64_PATH set to the shim, or CUDA not initialised yet)"
    )]
    NoJournal { pid: u32 },
    #[error("config {0}")]
    Config(String),
    /// The kernel refused an eBPF operation with EPERM: a capability is missing.
    #[error(
        "{what}: missing {capability}: the kernel refused to load or attach eBPF programs (run as root, or grant it with setcap/securityContext)"
    )]
    Refused {
        what: String,
        capability: &'static str,
        #[source]
        source: anyhow::Error,
    },
    /// Anything else that failed while attaching or reading (exit 1), with its cause chain.
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// `e` and its causes, as one line: `outer: inner: innermost`.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(c) = cur {
        parts.push(c.to_string());
        cur = c.source();
    }
    parts.join(": ")
}

impl ProbeError {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NoSuchProcess { .. } => exit::NO_SUCH_PROCESS,
            Self::NotCuda { .. } => exit::NOT_CUDA,
            Self::MissingCapability { .. } => exit::PRIVILEGE,
            Self::TargetExited { .. } => exit::TARGET_EXITED,
            Self::NoSymbols { .. } => exit::NO_SYMBOLS,
            Self::NoJournal { .. } => exit::NO_JOURNAL,
            Self::Config(_) => exit::USAGE,
            Self::Refused { .. } => exit::PRIVILEGE,
            Self::Other(_) => exit::ERROR,
        }
    }
}
