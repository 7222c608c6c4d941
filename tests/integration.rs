//! The one integration-test binary: real workloads on the simulated driver, real eBPF, real
//! `wedgeprobe` processes. Needs root (CI runs as root); without it every test says why it
//! skipped. Run one at a time (`--test-threads=1`, as `cargo xtask test` does): each workload
//! spins on both cores.
#![allow(
    clippy::unwrap_used,
    reason = "a failing step should fail the test loudly"
)]

mod suite;
