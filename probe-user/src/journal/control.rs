//! The journal's control word — the only words wedgeprobe writes into a target's journal:
//! the release request (`wedgeprobe release`: the shim gives CUPTI back, so torch.profiler,
//! Kineto or Nsight can subscribe (CUDA allows one CUPTI subscriber per process before 13.3).
//!
//! The request is one bit in the journal header's `control` word — with the per-kernel lease
//! below (`per_kernel_until_ns`, what `trace` holds), the only words wedgeprobe ever writes. The shim polls it every 100 ms, flushes, unsubscribes, calls `cuptiFinalize`
//! and marks the journal released; recording does not resume (start the process again, or
//! keep it off with WEDGEPROBE_SHIM=off). From inside the process the same is
//! `wedgeprobe_shim_release()` in the shim library.

use std::{
    mem::offset_of,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use anyhow::Context as _;
use probe_common::journal::{CONTROL_RELEASE, Header};

use crate::{process::target::Mapping as TargetMapping, sys::Mapping};

/// A lease on per-kernel completion records in the targets' shims, held by `trace`: a shim that
/// records with stream marks (the default) names every kernel on the GPU tracks only with
/// per-kernel records. Renewed every tick (`renew`); dropping it, or a wedgeprobe that dies,
/// lets it lapse within `LEASE`.
pub struct PerKernelLease {
    /// (pid, the header mapped read-write).
    headers: Vec<(u32, Mapping)>,
}

/// How far ahead a renewal reaches.
const LEASE: Duration = Duration::from_secs(2);

impl PerKernelLease {
    pub fn new() -> Self {
        Self {
            headers: Vec::new(),
        }
    }

    /// Leases per-kernel records from every journal in `journals` (pid, path) until
    /// `now_ns + LEASE`; journals not leased yet are mapped first (one that cannot be is
    /// skipped: the trace then has what marks give).
    pub fn renew(&mut self, journals: &[(u32, TargetMapping)], now_ns: u64) {
        for (pid, at) in journals {
            if self.headers.iter().any(|(p, _)| p == pid) {
                continue;
            }
            if let Ok(map) = map_header(*pid, at) {
                self.headers.push((*pid, map));
            }
        }
        let until = now_ns + LEASE.as_nanos() as u64;
        for (_, map) in &self.headers {
            store_lease(map, until);
        }
    }
}

impl Default for PerKernelLease {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PerKernelLease {
    fn drop(&mut self) {
        for (_, map) in &self.headers {
            store_lease(map, 0);
        }
    }
}

fn store_lease(map: &Mapping, until_ns: u64) {
    // SAFETY: `per_kernel_until_ns` is an 8-aligned word inside the mapped header (mapped by
    // `map_header`, at least a header long); the shim reads it atomically.
    unsafe {
        AtomicU64::from_ptr(
            map.as_ptr()
                .add(offset_of!(Header, per_kernel_until_ns))
                .cast(),
        )
        .store(until_ns, Ordering::Release);
    }
}

/// Maps the journal header of `pid` read-write (shared), for the words the reader writes.
fn map_header(pid: u32, at: &TargetMapping) -> anyhow::Result<Mapping> {
    let (file, len) = super::target_file::open(pid, at, true)?;
    if len < size_of::<Header>() {
        anyhow::bail!("pid {pid}'s journal is shorter than its header");
    }
    Mapping::of_file(&file, size_of::<Header>(), true).context("cannot map the journal header")
}

/// Sets `CONTROL_RELEASE` in the journal's header, through a shared writable mapping of it.
pub fn request(pid: u32, at: &TargetMapping) -> anyhow::Result<()> {
    let map = map_header(pid, at)?;
    // SAFETY: `control` is an 8-aligned word inside the mapped header (the header was
    // validated by MappedJournal::open); the shim reads it atomically.
    unsafe {
        AtomicU64::from_ptr(map.as_ptr().add(offset_of!(Header, control)).cast())
            .fetch_or(CONTROL_RELEASE, Ordering::AcqRel);
    }
    Ok(())
}
