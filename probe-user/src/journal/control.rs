//! `wedgeprobe release --pid PID`: asks a process's shim to give CUPTI back, so torch.profiler,
//! Kineto or Nsight can subscribe (CUDA allows one CUPTI subscriber per process before 13.3).
//!
//! The request is one bit in the journal header's `control` word — with the per-kernel lease
//! below (`per_kernel_until_ns`, what `trace` holds), the only words wedgeprobe ever writes. The shim polls it every 100 ms, flushes, unsubscribes, calls `cuptiFinalize`
//! and marks the journal released; recording does not resume (start the process again, or
//! keep it off with WEDGEPROBE_SHIM=off). From inside the process the same is
//! `wedgeprobe_shim_release()` in the shim library.

use std::{
    io::Write,
    mem::offset_of,
    os::fd::AsRawFd as _,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use probe_common::journal::{CONTROL_RELEASE, Header};

use crate::{error::ProbeError, journal::MappedJournal, process::target};

pub fn release(pid: u32, out: &mut impl Write) -> anyhow::Result<()> {
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Err(ProbeError::NoSuchProcess { pid }.into());
    }
    let mapping = target::find_journal(pid).ok_or(ProbeError::NoJournal { pid })?;
    // Validates ownership, mode and header before anything is written.
    let journal = MappedJournal::open(pid, &mapping.path)?;
    if journal.view().shim_released() {
        writeln!(out, "pid {pid}: the shim had already released CUPTI")?;
        return Ok(());
    }
    if journal.view().shim_off() {
        writeln!(out, "pid {pid}: the shim is off; CUPTI is free")?;
        return Ok(());
    }
    request(pid, &mapping.path)?;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        if journal.view().shim_released() {
            writeln!(
                out,
                "pid {pid}: the shim released CUPTI after {} ms; profilers can subscribe now (wedgeprobe continues eBPF-only for this process)",
                start.elapsed().as_millis()
            )?;
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    anyhow::bail!(
        "pid {pid}: the shim did not answer within 3 s (it polls every 100 ms; is the process stopped?)"
    )
}

/// A lease on per-kernel completion records in the targets' shims, held by `trace`: a shim that
/// records with stream marks (the default) names every kernel on the GPU tracks only with
/// per-kernel records. Renewed every tick (`renew`); dropping it, or a wedgeprobe that dies,
/// lets it lapse within `LEASE`.
pub struct PerKernelLease {
    /// (pid, the header mapped read-write).
    headers: Vec<(u32, *mut libc::c_void)>,
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
    pub fn renew(&mut self, journals: &[(u32, String)], now_ns: u64) {
        for (pid, path) in journals {
            if self.headers.iter().any(|(p, _)| p == pid) {
                continue;
            }
            if let Ok(base) = map_header(*pid, path) {
                self.headers.push((*pid, base));
            }
        }
        let until = now_ns + LEASE.as_nanos() as u64;
        for &(_, base) in &self.headers {
            store_lease(base, until);
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
        for &(_, base) in &self.headers {
            store_lease(base, 0);
            // SAFETY: our own mapping of one header.
            unsafe { libc::munmap(base, size_of::<Header>()) };
        }
    }
}

fn store_lease(base: *mut libc::c_void, until_ns: u64) {
    // SAFETY: `per_kernel_until_ns` is an 8-aligned word inside a mapped header (mapped by
    // `map_header` and kept until drop); the shim reads it atomically.
    unsafe {
        AtomicU64::from_ptr(
            base.cast::<u8>()
                .add(offset_of!(Header, per_kernel_until_ns))
                .cast(),
        )
        .store(until_ns, Ordering::Release);
    }
}

/// Maps the journal header of `pid` read-write (shared), for the words the reader writes.
fn map_header(pid: u32, path: &str) -> anyhow::Result<*mut libc::c_void> {
    let host_path = format!("/proc/{pid}/root{path}");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&host_path)
        .with_context(|| format!("cannot open {path} for writing"))?;
    let len = size_of::<Header>();
    // SAFETY: a shared mapping of the header of a file we opened; checked for MAP_FAILED.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error()).context("cannot map the journal header");
    }
    Ok(base)
}

/// Sets `CONTROL_RELEASE` in the journal's header, through a shared writable mapping of its
/// first page.
fn request(pid: u32, path: &str) -> anyhow::Result<()> {
    let base = map_header(pid, path)?;
    // SAFETY: `control` is an 8-aligned word inside the mapped header (the header was
    // validated by MappedJournal::open); the shim reads it atomically.
    unsafe {
        AtomicU64::from_ptr(base.cast::<u8>().add(offset_of!(Header, control)).cast())
            .fetch_or(CONTROL_RELEASE, Ordering::AcqRel);
        libc::munmap(base, size_of::<Header>());
    }
    Ok(())
}
