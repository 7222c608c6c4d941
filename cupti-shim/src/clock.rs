//! The shim's one clock: CLOCK_MONOTONIC, the clock of `bpf_ktime_get_ns` and of the probe's
//! readings, so journal times and eBPF times compare directly. A read through the vDSO costs
//! 27 ns on the H200 VM (BENCHMARKS.md); CLOCK_MONOTONIC_COARSE, once tried as a cheaper one
//! behind a measurement switch, saved nothing measurable and is gone.

/// Now, CLOCK_MONOTONIC ns.
#[inline]
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// Now on `id`, ns.
#[inline]
pub fn read(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer and a clock that exists on Linux.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
