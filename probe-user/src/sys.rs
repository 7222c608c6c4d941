//! The raw syscalls wedgeprobe makes outside aya, behind small safe functions so the rest of
//! the code (and its unit tests) never touches libc directly — signals.rs alone installs its
//! async-signal-safe handlers itself.

use std::io;

/// CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns`, so eBPF timestamps compare with it.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time of the calling thread (what a tick costs, whatever else the machine runs: wall
/// time on a loaded node counted the preemptions too).
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time of this whole process, every thread (the daemon's HTTP thread included).
pub fn process_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// Clock ticks per second (`_SC_CLK_TCK`), the unit of /proc's CPU times.
pub fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as f64
}

/// This machine's page size in bytes.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(1) as u64
}

/// A shared mapping of the first `len` bytes of a file, unmapped on drop: the journals
/// wedgeprobe reads (read-only) and the one header word group it writes (read-write).
pub struct Mapping {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: a mapping is process-wide memory, unmapped once (on drop); what is read through it
// is read with atomic loads (`journal::JournalView`), so it may be used from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file` from offset 0, shared; `writable` adds PROT_WRITE.
    pub fn of_file(file: &std::fs::File, len: usize, writable: bool) -> io::Result<Self> {
        use std::os::fd::AsRawFd as _;
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a shared mapping of a file the caller opened; checked for MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { base, len })
    }

    /// The first byte (page-aligned); valid for `len` bytes while `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.cast()
    }

    /// Lets go of the resident pages of `off..off + len` (the whole pages inside it): the file
    /// keeps its content — the mapping is shared — and a later read maps the page again.
    /// What this process mapped of another's file counts in its RSS (and its OOM score) for
    /// as long as it stays mapped.
    pub fn release(&self, off: usize, len: usize) -> io::Result<()> {
        let page = page_size() as usize;
        let end = off.saturating_add(len).min(self.len) / page * page;
        let start = off.div_ceil(page) * page;
        if start >= end {
            return Ok(());
        }
        // SAFETY: a page-aligned range inside our own shared mapping; MADV_DONTNEED on a
        // shared mapping drops only this process's page-table entries, never the file's data,
        // and nothing of ours holds a reference into those pages across this call (reads go
        // through `JournalView`'s loads, which fault the page in again).
        let rc = unsafe {
            libc::madvise(
                self.base.cast::<u8>().add(start).cast(),
                end - start,
                libc::MADV_DONTNEED,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// The C heap's bytes handed out (`uordblks` + `hblkhd`) and free inside its arenas
/// (`fordblks`), over every arena (glibc's mallinfo2): a structure that grows shows in the
/// first, a fragmented heap in the second. It locks each arena: for `WEDGEPROBE_DEBUG_TICK`
/// lines, not for every tick. None off glibc.
pub fn heap_bytes() -> Option<(u64, u64)> {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallinfo2 has no preconditions.
        let m = unsafe { libc::mallinfo2() };
        Some(((m.uordblks + m.hblkhd) as u64, m.fordblks as u64))
    }
    #[cfg(not(target_env = "gnu"))]
    None
}

/// Gives the C heap's free pages back to the kernel (glibc's malloc_trim: every arena, free
/// pages inside them too, not only the top); nothing off glibc.
pub fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions; it only releases memory malloc holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Whether a raw OS error number is EPERM (the kernel refused for lack of privilege).
pub fn is_eperm(errno: i32) -> bool {
    errno == libc::EPERM
}

/// Mounts tracefs at `at` (root may; the H200 machine starts without it mounted).
pub fn mount_tracefs(at: &str) -> io::Result<()> {
    let src = std::ffi::CString::new("tracefs").map_err(io::Error::other)?;
    let target = std::ffi::CString::new(at).map_err(io::Error::other)?;
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            src.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// This machine's host name ("localhost" if it cannot be read).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// CLOCK_REALTIME in ns: paired with the monotonic clock to align traces across nodes.
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; every clock used here always exists on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Reads `buf.len()` bytes of another process's memory at `addr` without stopping it.
/// Returns how many bytes were read (short at the end of a mapping).
pub fn read_process_memory(pid: u32, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: one local iovec over `buf`, which outlives the call; the remote side is checked
    // by the kernel and faults are reported as errors.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Writes `buf` into another process's memory at `addr` (writable mappings only). Returns how
/// many bytes were written.
pub fn write_process_memory(pid: u32, addr: u64, buf: &[u8]) -> io::Result<usize> {
    let local = libc::iovec {
        iov_base: buf.as_ptr().cast_mut().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: one local iovec over `buf` (only read by the kernel), which outlives the call;
    // the remote side is checked by the kernel and faults are reported as errors.
    let n = unsafe { libc::process_vm_writev(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Writes one aligned 8-byte word of another process's *code* through /proc/PID/mem (which,
/// for a tracer, writes read-only private mappings the way a debugger sets a breakpoint),
/// after checking it holds `old`; reads it back. `Ok(false)`: it held something else.
pub fn write_code_word(mem: &std::fs::File, addr: u64, old: u64, new: u64) -> io::Result<bool> {
    use std::os::unix::fs::FileExt as _;
    let mut b = [0u8; 8];
    mem.read_exact_at(&mut b, addr)?;
    if u64::from_le_bytes(b) != old {
        return Ok(false);
    }
    mem.write_all_at(&new.to_le_bytes(), addr)?;
    mem.read_exact_at(&mut b, addr)?;
    Ok(u64::from_le_bytes(b) == new)
}

/// Writes `new` over another process's code at `addr` through /proc/PID/mem, after checking
/// it still holds `old` (same length); reads it back.
pub fn write_code_bytes(mem: &std::fs::File, addr: u64, old: &[u8], new: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt as _;
    let mut now = vec![0u8; old.len()];
    mem.read_exact_at(&mut now, addr)?;
    if now != old || old.len() != new.len() {
        return Err(io::Error::other("the bytes there changed"));
    }
    mem.write_all_at(new, addr)?;
    mem.read_exact_at(&mut now, addr)?;
    if now != new {
        return Err(io::Error::other("the bytes did not stay written"));
    }
    Ok(())
}

/// The effective capability set of this process (bit n = capability n).
pub fn effective_capabilities() -> u64 {
    // /proc/self/status is the documented, stable view (CapEff as hex).
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0)
}

pub const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// Raises RLIMIT_MEMLOCK for kernels that still charge BPF maps to it (before 5.11).
pub fn raise_memlock_limit() {
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a valid rlimit; failure only matters on old kernels and shows up at map creation.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
}

/// Number of possible CPUs (perf events are opened per CPU).
pub fn online_cpus() -> Vec<u32> {
    aya::util::online_cpus().unwrap_or_else(|_| vec![0])
}

/// Closes fd 1 so a reader sees end-of-file while wedgeprobe finishes detaching; later writes
/// to stdout fail with EBADF, which nothing does after this.
/// Forks a child that holds copies of every open file of this process, detached from the
/// terminal and from our stdout/stderr, and exits once this process has exited: what the
/// last close of a file costs (a uprobe link's release) is then paid in the child's exit, not
/// ours. The child must outlive us — whichever process closes a file last pays for it (seen:
/// a child that exited at once left the 4.9 s to our exit) — so it waits to be reparented
/// (which happens after our files are released), at most a minute. It runs only
/// async-signal-safe calls (fork in a threaded process). Returns the child's pid, or None if
/// fork failed.
pub fn leave_files_to_a_child() -> Option<u32> {
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: fork has no preconditions; the child below calls only setsid, open, dup2,
    // getppid, nanosleep and _exit, all async-signal-safe.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => None,
        0 => {
            // SAFETY: async-signal-safe calls on our own descriptors; _exit never returns.
            unsafe {
                libc::setsid();
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                if null >= 0 {
                    libc::dup2(null, 0);
                    libc::dup2(null, 1);
                    libc::dup2(null, 2);
                }
                let ms = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 1_000_000,
                };
                for _ in 0..60_000 {
                    if libc::getppid() != parent {
                        break;
                    }
                    libc::nanosleep(&ms, std::ptr::null_mut());
                }
                libc::_exit(0)
            }
        }
        child => Some(child as u32),
    }
}

pub fn close_stdout() {
    // SAFETY: fd 1 is owned by this process; Rust's stdout is flushed by the caller and the
    // lock is not used afterwards.
    unsafe { libc::close(1) };
}
