//! One file per subcommand; each wires settings, the collector, the verdict pipeline and an
//! output together and holds no logic of its own. `Error` is what a command can fail with;
//! its kind picks the exit code (README, "Exit codes").

pub mod attach;
pub mod daemon;
pub mod merge;
pub mod release;
pub mod report;
pub mod run;
pub mod shim_path;
pub mod trace;
pub mod watch;

use crate::{
    error::{ProbeError, exit},
    output::{metrics::http::ListenError, trace::chrome::TraceError},
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The targets, the machine or the configuration (no such process, not CUDA, a missing
    /// capability, a bad config, …): each its own code.
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// The output file (a trace) cannot be written.
    #[error(transparent)]
    Output(#[from] TraceError),
    /// The daemon's metrics address cannot be bound.
    #[error(transparent)]
    Listen(#[from] ListenError),
    /// Writing to stdout/stderr failed (a closed pipe is a normal end, exit 0).
    #[error("cannot write the output: {0}")]
    Write(#[from] std::io::Error),
    /// `attach` could not put the shim into a process (its own exit codes).
    #[error(transparent)]
    Attach(#[from] crate::inject::InjectError),
    /// Anything else (exit 1), with its cause chain.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl Error {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Probe(e) => e.exit_code(),
            Self::Attach(e) => e.exit_code(),
            Self::Output(_) => exit::OUTPUT,
            Self::Listen(_) => exit::LISTEN,
            Self::Write(e) if e.kind() == std::io::ErrorKind::BrokenPipe => exit::OK,
            Self::Write(_) | Self::Internal(_) => exit::ERROR,
        }
    }

    /// A reader that went away (`wedgeprobe report | head`): not a failure.
    pub fn is_broken_pipe(&self) -> bool {
        match self {
            Self::Write(e) => e.kind() == std::io::ErrorKind::BrokenPipe,
            Self::Internal(e) => e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
                    || c.downcast_ref::<serde_json::Error>()
                        .and_then(|j| j.io_error_kind())
                        .is_some_and(|k| k == std::io::ErrorKind::BrokenPipe)
            }),
            _ => false,
        }
    }
}

/// `serde_json` writing to stdout: its I/O errors are writes, the rest internal.
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        match e.io_error_kind() {
            Some(kind) => Self::Write(std::io::Error::new(kind, e)),
            None => Self::Internal(e.into()),
        }
    }
}
