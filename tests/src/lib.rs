//! Paths of the simulated driver and its workloads (built by build.rs), shared by the
//! integration tests and xtask (demo, bench).
use std::path::PathBuf;

pub mod chrome_check;

/// Directory holding `libcuda.so.1` (simulated) and `simworker`.
pub fn sim_dir() -> PathBuf {
    PathBuf::from(env!("SIMCUDA_DIR"))
}

pub fn simworker() -> PathBuf {
    sim_dir().join("simworker")
}

/// A process that maps a `libcuda.so.1` exporting none of the traced entry points.
pub fn nosyms_worker() -> PathBuf {
    sim_dir().join("nosyms").join("nosyms-worker")
}
