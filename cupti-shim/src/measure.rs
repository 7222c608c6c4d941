//! Measurement switches of the shim (`WEDGEPROBE_SHIM_MEASURE`), for benchmarks only: they
//! price pieces of the recording on the real driver (BENCHMARKS.md, the recorder's price, 2026-12-01),
//! where a profiler is not available and side-by-side runs are noisier than the pieces.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::{hooks, log_line, self_cost};

/// Measurement switches (BENCHMARKS.md, the recorder's price), not modes: `WEDGEPROBE_SHIM_MEASURE=pass`
/// leaves the launch hooks in place but recording nothing (the detour's own price);
/// `toggle` lets the process switch recording
/// (`wedgeprobe_shim_measure_pass`); `self_cost` times the shim's own work and prints it at
/// exit (`crate::self_cost`), `phases` splits it by phase too (dearer: the timer's own reads
/// are counted); `no_barrier` writes stream marks without the memory fence the driver puts
/// before a stream write by default (to price that fence on the GPU's side: a mark costs eager
/// decode about twice its host time, 2026-12-02). Comma-separated; one log line when any is
/// on.
pub fn switches() {
    let v = std::env::var("WEDGEPROBE_SHIM_MEASURE").unwrap_or_default();
    let mut on = false;
    for w in v.split(',').map(str::trim) {
        match w {
            "toggle" => TOGGLE.store(true, Relaxed),
            "self_cost" => {
                self_cost::enable();
                hooks::hot::self_cost_on();
            }
            "phases" => {
                self_cost::enable();
                hooks::hot::self_cost_on();
                self_cost::BY_PHASE.store(true, Relaxed);
            }
            "pass" => hooks::hot::measure_pass(true),
            "no_barrier" => crate::marks::WRITE_FLAGS.store(WRITE_NO_MEMORY_BARRIER, Relaxed),
            "" => continue,
            other => {
                let line = format!(
                    "WEDGEPROBE_SHIM_MEASURE: `{other}` is not a measurement switch \
                     (self_cost, phases, pass, no_barrier, toggle); ignored"
                );
                log_line(line.as_bytes());
                continue;
            }
        }
        on = true;
    }
    if on {
        log_line(b"measurement switch WEDGEPROBE_SHIM_MEASURE: recording altered for a benchmark");
    }
}

/// `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER` (cuda.h).
const WRITE_NO_MEMORY_BARRIER: u32 = 0x1;

static TOGGLE: AtomicBool = AtomicBool::new(false);

/// For in-process A/B benchmarks (`gpu/inproc_ab.py`), only under
/// `WEDGEPROBE_SHIM_MEASURE=toggle`: the process itself switches launch recording off (1) and
/// on (0) between its turns, so both states are measured in one process, seconds apart, meant
/// to cancel the H200 VM's per-process speed differences. Measured (BENCHMARKS.md, 2026-12-01):
/// eager decode still varied ±20% from one turn to the next within one process, so the eager
/// figure comes from `self_cost`; the graph loops' on/off pairs were tight (quartiles within ~1%). Returns
/// 0, or -1 when the switch is not enabled.
#[unsafe(no_mangle)]
pub extern "C" fn wedgeprobe_shim_measure_pass(pass: i32) -> i32 {
    if !TOGGLE.load(Relaxed) {
        return -1;
    }
    hooks::hot::measure_pass(pass != 0);
    0
}

/// Under `WEDGEPROBE_SHIM_MEASURE=toggle`: how many kernel nodes a graph mark covers in the
/// graphs instantiated from now (bits 0-7; 0: no graph marks) and how the marks go in (bits
/// 8-10, `marks::graph::SHAPE_*`: the reset in the chain, no reset, no leaf writes), so one
/// process instantiates the same graph with and without marks and replays them in
/// neighbouring pairs (`gpu/graph_marks.cu`, `gpu/step_ab.py`): the replay price of the marks
/// and of their parts, apart from the VM's drift. Returns the value before, or -1 when the
/// switch is not enabled.
#[unsafe(no_mangle)]
pub extern "C" fn wedgeprobe_shim_graph_marks(every: i32) -> i32 {
    if !TOGGLE.load(Relaxed) || every < 0 {
        return -1;
    }
    crate::marks::graph::set_every(every as u32) as i32
}
