//! Paths of the simulated driver and its workloads (built by build.rs), shared by the
//! integration tests and xtask (demo, bench).
use std::path::PathBuf;

pub mod chrome_check;
pub mod held;

/// Directory holding `libcuda.so.1` (simulated) and `simworker`.
pub fn sim_dir() -> PathBuf {
    PathBuf::from(env!("SIMCUDA_DIR"))
}

/// Directory holding a simulated driver whose launch entry points begin with `shape`'s
/// prologue (`cet`, `sub-rsp`, `rip-load`: tests/simcuda/libcuda_sim.c, SIM_PROLOGUE); a
/// `simworker` run with `LD_LIBRARY_PATH` set to it loads that driver.
pub fn prologue_dir(shape: &str) -> PathBuf {
    sim_dir().join(format!("prologue-{shape}"))
}

pub fn simworker() -> PathBuf {
    sim_dir().join("simworker")
}

/// A process that maps a `libcuda.so.1` exporting none of the traced entry points.
pub fn nosyms_worker() -> PathBuf {
    sim_dir().join("nosyms").join("nosyms-worker")
}
