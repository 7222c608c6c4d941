//! The injection library (`CUDA_INJECTION64_PATH`): records launches and completions of the
//! process it is loaded into, in a shared-memory journal wedgeprobe reads
//! (`probe_common::journal`).
//!
//! Error handling: nothing here may unwind into the host process. `InitializeInjection` and
//! every callback run their body under `catch_unwind`; every failure turns the shim off with
//! one line on stderr (`wedgeprobe shim: …; shim off`) and the process runs on untouched.
//! Thread safety: callbacks come from any thread; the journal writer is lock-free.
//!
//! Backends: CUPTI (launch callbacks; completions from stream marks, or CONCURRENT_KERNEL
//! activity records in the exact mode), or the simulated driver (tests/simcuda) when the
//! process runs on it. `WEDGEPROBE_SHIM=off` disables the shim.
//!
//! How completions are recorded, `WEDGEPROBE_SHIM_RECORD`: `marks` (default; `crate::marks`:
//! a stream-ordered progress mark every `WEDGEPROBE_SHIM_MARK_EVERY` launches (16), on both
//! sides of the first launch after `WEDGEPROBE_SHIM_MARK_US` µs idle (100) and after a
//! synchronize — a stream write, or with `WEDGEPROBE_SHIM_MARK_WITH=event`
//! an event record polled by the flush thread (cheaper, not safe for exact names yet: see `init`)
//! — stuck kernels named exactly or narrowed to the
//! launches between two marks) or `exact` (a CUPTI record per kernel: always the exact kernel
//! and graph node, at the price in BENCHMARKS.md).

pub mod attach;
pub mod backend;
pub mod clock;
mod driver;
pub mod hooks;
pub mod journal;
mod lifecycle;
pub mod marks;
mod measure;
pub mod record;
pub mod self_cost;

use std::panic::{AssertUnwindSafe, catch_unwind};

use probe_common::journal::Layout;

/// The journal's layout: the default, or with `WEDGEPROBE_SHIM_RING_RECORDS` records on
/// the ring — the flight recorder's depth (16,384 by default: ~0.2 s of a launch-bound loop;
/// 112 bytes each). A power of two from 1,024 to 1,048,576; anything else is said once and
/// the default used.
fn layout_from_env() -> Layout {
    let Ok(v) = std::env::var("WEDGEPROBE_SHIM_RING_RECORDS") else {
        return Layout::DEFAULT;
    };
    match v.parse::<u32>() {
        Ok(n) if n.is_power_of_two() && (1024..=1 << 20).contains(&n) => Layout {
            ring_cap: n,
            ..Layout::DEFAULT
        },
        _ => {
            let line = format!(
                "WEDGEPROBE_SHIM_RING_RECORDS={v} is not a power of two from 1024 to 1048576; \
                 the ring keeps {} records",
                Layout::DEFAULT.ring_cap
            );
            log_line(line.as_bytes());
            Layout::DEFAULT
        }
    }
}

/// Entry point the CUDA driver calls when it loads `CUDA_INJECTION64_PATH`: 1 when the shim
/// records, 0 when it turned itself off (the driver then carries on without it).
#[unsafe(no_mangle)]
pub extern "C" fn InitializeInjection() -> i32 {
    match catch_unwind(init) {
        Ok(Ok(())) => 1,
        Ok(Err(why)) => {
            log_off(why.as_bytes());
            0
        }
        Err(_) => {
            log_off(b"internal error during initialisation");
            0
        }
    }
}

fn init() -> Result<(), String> {
    if std::env::var("WEDGEPROBE_SHIM").is_ok_and(|v| v == "off" || v == "0") {
        return Err("disabled by WEDGEPROBE_SHIM".into());
    }
    measure::switches();
    let rec = lifecycle::start(layout_from_env())
        .map_err(|e| format!("cannot create its journal: {e}"))?;
    match std::env::var("WEDGEPROBE_SHIM_RECORD").as_deref() {
        Ok("exact") => {}
        Ok("marks") | Err(_) => {
            let num = |var: &str, default: u32, max: u32| {
                std::env::var(var)
                    .ok()
                    .and_then(|v| v.parse::<u32>().ok())
                    .filter(|&v| v >= 1 && v <= max)
                    .unwrap_or(default)
            };
            // Event records by default, stream writes where a stream has no ring yet, where
            // events cannot be had, or with `WEDGEPROBE_SHIM_MARK_WITH=write`
            // (`marks::DEFAULT_WITH_EVENTS` says why).
            let with_events = match std::env::var("WEDGEPROBE_SHIM_MARK_WITH").as_deref() {
                Ok("event") => true,
                Ok("write") => false,
                Err(_) => marks::DEFAULT_WITH_EVENTS,
                Ok(other) => {
                    let line = format!(
                        "WEDGEPROBE_SHIM_MARK_WITH={other} is not `event` or `write`; marking \
                         with {}",
                        if marks::DEFAULT_WITH_EVENTS {
                            "event records"
                        } else {
                            "stream writes"
                        }
                    );
                    log_line(line.as_bytes());
                    marks::DEFAULT_WITH_EVENTS
                }
            };
            let gap_us = num("WEDGEPROBE_SHIM_MARK_US", marks::DEFAULT_US, 60_000_000);
            rec.use_marks(
                marks::Cadence {
                    every: num("WEDGEPROBE_SHIM_MARK_EVERY", marks::DEFAULT_EVERY, 1 << 20),
                    gap_us,
                    period_us: num(
                        "WEDGEPROBE_SHIM_MARK_PERIOD_US",
                        marks::DEFAULT_PERIOD_US,
                        60_000_000,
                    ),
                },
                with_events,
            );
        }
        Ok(other) => {
            rec.turn_off();
            return Err(format!(
                "WEDGEPROBE_SHIM_RECORD={other} is not `marks` or `exact`"
            ));
        }
    }
    if !backend::sim::attach() {
        // The hook coverage check needs CUPTI's launch callbacks beside the hooks.
        let verify = std::env::var("WEDGEPROBE_SHIM_VERIFY_HOOKS").is_ok_and(|v| v == "1");
        if rec.record_mode() == probe_common::journal::RECORD_MARKS && !verify {
            match backend::cupti::attach_without_cupti() {
                Ok(()) => return Ok(()),
                Err(why) => why.fell_back("recording through CUPTI callbacks (dearer): "),
            }
        }
        return backend::cupti::attach().inspect_err(|_| rec.turn_off());
    }
    std::thread::Builder::new()
        .name("wedgeprobe-hb".into())
        .spawn(|| {
            loop {
                if let Some(rec) = record::get() {
                    if rec.writer().release_requested() {
                        backend::sim::release();
                    }
                    if rec.take_fallback() {
                        // Per-kernel records carry the driver's ids: it records launches now.
                        hooks::hot::pass_through(true);
                    }
                    // A lease of per-kernel records: the simulated driver's callbacks record
                    // launches meanwhile (as CUPTI's do), the hooks pass them through.
                    if hooks::hot::active()
                        && rec.record_mode() == probe_common::journal::RECORD_MARKS
                        && !backend::sim::released()
                    {
                        let leased = rec.writer().per_kernel_leased(crate::clock::monotonic_ns());
                        hooks::hot::pass_through(leased);
                    }
                    rec.heartbeat();
                }
                std::thread::sleep(
                    record::get()
                        .map_or(std::time::Duration::from_millis(100), |r| r.flush_period()),
                );
            }
        })
        .map_err(|e| format!("cannot start its heartbeat thread: {e}"))?;
    Ok(())
}

/// Runs a callback body; a panic is swallowed (it must never unwind into the driver).
pub(crate) fn guarded(f: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(f));
}

/// Gives CUPTI back so torch.profiler, Kineto or Nsight can subscribe (CUDA allows one
/// subscriber per process before 13.3). Call it from the process, e.g. in Python:
/// `ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"]).wedgeprobe_shim_release()`, or from
/// outside with `wedgeprobe release --pid PID`. Recording stops for good; returns 1 if the
/// shim was recording.
#[unsafe(no_mangle)]
pub extern "C" fn wedgeprobe_shim_release() -> i32 {
    let Some(rec) = record::get() else { return 0 };
    let was = rec.writer().state() == probe_common::journal::STATE_RECORDING;
    guarded(|| {
        if backend::sim::attached() {
            backend::sim::release();
        } else {
            backend::cupti::release();
        }
    });
    i32::from(was)
}

fn log_off(why: &[u8]) {
    let mut line = Vec::with_capacity(why.len() + 16);
    line.extend_from_slice(why);
    line.extend_from_slice(b"; shim off");
    log_line(&line);
}

/// One line on stderr, `wedgeprobe shim: …`, without allocating on the way to the fd.
pub(crate) fn log_line(what: &[u8]) {
    let mut line = Vec::with_capacity(what.len() + 40);
    line.extend_from_slice(b"wedgeprobe shim: ");
    line.extend_from_slice(what);
    line.extend_from_slice(b"\n");
    // SAFETY: writing our own buffer to fd 2; the result is deliberately ignored.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}
