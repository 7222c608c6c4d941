//! The code layout of one target as the stack scanner sees it: where libcuda's traced entry
//! points sit in the process, which addresses are code, and the bytes before a return address
//! (read from the live process with process_vm_readv — no stop, no ptrace).

use std::{cell::RefCell, collections::HashMap};

use crate::{
    process::libcuda::LibCuda, process::stackscan::CodeView, process::target::Target, sys,
};

/// Code bytes remembered per process (the bytes before a candidate return address, read once
/// per address): a PyTorch thread's stack sample has ~100 candidates, nearly all seen before,
/// and each read is a process_vm_readv. Cleared when full.
const READ_CACHE_MAX: usize = 65_536;

/// (address, length) → the bytes there (length ≤ 8), or None when unreadable.
type ReadCache = HashMap<(u64, usize), Option<[u8; 8]>>;

pub struct TargetCode {
    pid: u32,
    /// (start, end, id) of each traced entry point in the process, sorted by start.
    entry_points: Vec<(u64, u64, u32)>,
    libcuda_code: Vec<(u64, u64)>,
    runtime_code: Vec<(u64, u64)>,
    /// Executable mappings, sorted by start: a PyTorch process has hundreds, and every word
    /// of every sampled stack is looked up here.
    code: Vec<(u64, u64)>,
    read_cache: RefCell<ReadCache>,
}

impl TargetCode {
    /// No code known (the model's unit tests).
    #[cfg(test)]
    pub fn empty(pid: u32) -> Self {
        Self {
            pid,
            entry_points: Vec::new(),
            libcuda_code: Vec::new(),
            runtime_code: Vec::new(),
            code: Vec::new(),
            read_cache: RefCell::default(),
        }
    }

    pub fn new(target: &Target, lib: &LibCuda) -> Self {
        let mut entry_points: Vec<(u64, u64, u32)> = lib
            .waits
            .iter()
            .filter_map(|ep| {
                let start = target.libcuda_address(ep.file_offset)?;
                // A symbol without a size still marks its first instruction.
                Some((start, start + ep.size.max(1), ep.id))
            })
            .collect();
        entry_points.sort_unstable();
        let ranges = |maps: &[crate::process::target::Mapping], only_exec: bool| {
            maps.iter()
                .filter(|m| !only_exec || m.executable)
                .map(|m| (m.start, m.end))
                .collect()
        };
        let runtime: Vec<crate::process::target::Mapping> = target
            .code_maps
            .iter()
            .filter(|m| is_runtime_support(&m.path))
            .cloned()
            .collect();
        let mut code: Vec<(u64, u64)> = ranges(&target.code_maps, true);
        code.sort_unstable();
        Self {
            pid: target.pid,
            entry_points,
            libcuda_code: ranges(&target.libcuda_maps, true),
            runtime_code: ranges(&runtime, true),
            code,
            read_cache: RefCell::default(),
        }
    }
}

impl CodeView for TargetCode {
    fn entry_point_at(&self, addr: u64) -> Option<u32> {
        let i = self.entry_points.partition_point(|&(s, _, _)| s <= addr);
        let &(s, e, id) = self.entry_points.get(i.checked_sub(1)?)?;
        (s..e).contains(&addr).then_some(id)
    }

    fn in_libcuda(&self, addr: u64) -> bool {
        self.libcuda_code
            .iter()
            .any(|&(s, e)| (s..e).contains(&addr))
    }

    fn in_code(&self, addr: u64) -> bool {
        let i = self.code.partition_point(|&(s, _)| s <= addr);
        i.checked_sub(1)
            .and_then(|i| self.code.get(i))
            .is_some_and(|&(s, e)| (s..e).contains(&addr))
    }

    fn in_runtime(&self, addr: u64) -> bool {
        self.runtime_code
            .iter()
            .any(|&(s, e)| (s..e).contains(&addr))
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let fresh = |buf: &mut [u8]| {
            sys::read_process_memory(self.pid, addr, buf).is_ok_and(|n| n == buf.len())
        };
        if buf.len() > 8 {
            return fresh(buf);
        }
        let mut cache = self.read_cache.borrow_mut();
        let key = (addr, buf.len());
        if let Some(known) = cache.get(&key) {
            return match known {
                Some(bytes) => {
                    buf.copy_from_slice(&bytes[..buf.len()]);
                    true
                }
                None => false,
            };
        }
        let ok = fresh(buf);
        if cache.len() >= READ_CACHE_MAX {
            cache.clear();
        }
        cache.insert(
            key,
            ok.then(|| {
                let mut b = [0u8; 8];
                b[..buf.len()].copy_from_slice(buf);
                b
            }),
        );
        ok
    }
}

/// Code that calls into libcuda without being the application: glibc, its split-out
/// libpthread, musl, the dynamic loader, and libcupti (loaded by our shim or a profiler), whose
/// own threads call the driver. A thread whose frames are only these and libcuda is not an
/// application thread inside an API call (seen on the H200: a CUPTI thread flapped as
/// "libcuda (entry point unknown)").
fn is_runtime_support(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    [
        "libc.so",
        "libc-",
        "libpthread",
        "ld-linux",
        "ld-musl",
        "libc.musl",
        "libcupti",
    ]
    .iter()
    .any(|p| base.starts_with(p))
}
