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

// The injection runs x86-64 code in the target (the blob, the register protocol of the
// take-over): built for x86-64 only; elsewhere `attach` says so (`x86_64.rs` holds the steps).
#[cfg(target_arch = "x86_64")]
pub mod blob;
#[cfg(target_arch = "x86_64")]
mod blocked;
#[cfg(target_arch = "x86_64")]
mod cave;
#[cfg(target_arch = "x86_64")]
mod checks;
#[cfg(target_arch = "x86_64")]
mod commit;
#[cfg(target_arch = "x86_64")]
mod ptrace;
#[cfg(target_arch = "x86_64")]
mod remote;
#[cfg(target_arch = "x86_64")]
mod stopped;
#[cfg(target_arch = "x86_64")]
mod x86_64;

mod error;

pub use self::error::{Attached, InjectError};
#[cfg(target_arch = "x86_64")]
pub use self::x86_64::attach;

/// `wedgeprobe attach` on a host that is not x86-64 (Grace Hopper, Grace Blackwell): the
/// injection is x86-64 code, so it is refused with one line naming the architecture; the
/// shim can still be loaded at start through `CUDA_INJECTION64_PATH`.
#[cfg(not(target_arch = "x86_64"))]
pub fn attach(pid: u32, _shim: &std::path::Path) -> Result<Attached, InjectError> {
    Err(InjectError::Refused(format!(
        "attach into pid {pid} needs an x86-64 host; this wedgeprobe is built for {} (start \
         the process with CUDA_INJECTION64_PATH=$(wedgeprobe shim-path) instead)",
        std::env::consts::ARCH
    )))
}
