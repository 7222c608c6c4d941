//! The journal's memory: an anonymous memory file (`memfd_create`, `MEMFD_NAME`), mapped
//! shared, whose every page is allocated before the first write.
//!
//! Why not a file in /dev/shm (what the shim used before): a pod's /dev/shm is a tmpfs of
//! 64 MiB that NCCL and DataLoader workers fill, and `ftruncate` succeeds on a full tmpfs —
//! the first store to a page tmpfs could not back then raised SIGBUS and killed the serving
//! process (a 1 MiB /dev/shm: `Bus error` within a second, here and on the H200). A name in a
//! shared /dev/shm also collided across pid namespaces (two containers' pid 1), and a forked
//! child's exit removed its parent's file. A memfd has no name to collide, no mount's size
//! limit, and goes away with its last mapping.
//!
//! What still can fail does so here, once, at start, and turns the shim off with one line:
//! `fallocate` reserves every page now (ENOMEM/ENOSPC: the memory cgroup has no room), and
//! a `RLIMIT_FSIZE` smaller than the journal is refused before `ftruncate`, which would
//! otherwise raise SIGXFSZ (fatal by default). The size is then sealed, so nobody — the
//! reader, a stray `ftruncate` — can cut the file short under either side's mapping.
//!
//! Fork: `forked_child` (registered with `pthread_atfork` by `crate::lifecycle`) replaces the
//! child's view of the journal with private zeroed memory and closes its descriptor: the
//! child never writes into its parent's journal, whatever runs in it, and has none of its own
//! (a process that used CUDA before fork cannot use it in the child).
//!
//! Called once, from `InitializeInjection` or an attach, never from a callback.

use std::{
    io,
    ptr::NonNull,
    sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering::Relaxed},
};

/// The mapping and its descriptor, for the fork handler (which may not allocate or lock).
static BASE: AtomicUsize = AtomicUsize::new(0);
static LEN: AtomicUsize = AtomicUsize::new(0);
static FD: AtomicI32 = AtomicI32::new(-1);

/// The mapped journal. Never unmapped while the process runs: callbacks may write to it until
/// the very end.
pub struct JournalFile {
    base: NonNull<u8>,
}

// SAFETY: the mapping is plain shared memory; access is through the journal writer's atomics.
unsafe impl Send for JournalFile {}
// SAFETY: as above.
unsafe impl Sync for JournalFile {}

/// Why a journal could not be made; the shim is then off, the process untouched.
fn failed(step: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{step}: {e}"))
}

impl JournalFile {
    /// Creates, reserves, seals and maps a journal of `len` zero bytes.
    pub fn create(len: usize) -> io::Result<Self> {
        fsize_limit_allows(len as u64)?;
        let name = std::ffi::CString::new(probe_common::journal::MEMFD_NAME)
            .map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: a valid NUL-terminated name; flags are plain bits.
        let fd = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if fd < 0 {
            return Err(failed("memfd_create"));
        }
        let mapped = (|| {
            // SAFETY: fd is ours. A memfd is created 0777: only the process's user (and
            // root) may read what it records; wedgeprobe refuses a journal others can write.
            if unsafe { libc::fchmod(fd, 0o600) } != 0 {
                return Err(failed("fchmod"));
            }
            // SAFETY: fd is ours; len fits off_t for any journal size the shim makes.
            if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
                return Err(failed("ftruncate"));
            }
            // Every page allocated now: a shortage is this error, never a SIGBUS at a store.
            // SAFETY: as above.
            let rc = unsafe { libc::fallocate(fd, 0, 0, len as libc::off_t) };
            if rc != 0 {
                return Err(failed(&format!("reserving {len} bytes (fallocate)")));
            }
            let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
            // SAFETY: as above; sealing a memfd made with MFD_ALLOW_SEALING.
            if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } != 0 {
                return Err(failed("sealing its size"));
            }
            // SAFETY: a fresh shared mapping of the whole file; checked for MAP_FAILED.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(failed("mmap"));
            }
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))
        })();
        match mapped {
            Ok(base) => {
                // The descriptor stays open: wedgeprobe opens the journal through
                // /proc/PID/fd, which needs only ptrace access (map_files needs
                // CAP_SYS_ADMIN). CLOEXEC: a program this process execs does not get it.
                BASE.store(base.as_ptr() as usize, Relaxed);
                LEN.store(len, Relaxed);
                FD.store(fd, Relaxed);
                Ok(Self { base })
            }
            Err(e) => {
                // SAFETY: our own descriptor, closed once.
                unsafe { libc::close(fd) };
                Err(e)
            }
        }
    }

    /// Page-aligned (hence 8-byte aligned), zero-filled, mapped for the process's lifetime.
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }
}

/// `Err` when `RLIMIT_FSIZE` is below `len`: sizing the file would raise SIGXFSZ.
fn fsize_limit_allows(len: u64) -> io::Result<()> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) } != 0 {
        return Ok(()); // nothing known: ftruncate decides
    }
    if lim.rlim_cur != libc::RLIM_INFINITY && lim.rlim_cur < len {
        return Err(io::Error::other(format!(
            "the file size limit (RLIMIT_FSIZE, `ulimit -f`) is {} bytes, less than the \
             journal's {len}",
            lim.rlim_cur
        )));
    }
    Ok(())
}

/// Set in a forked child (`forked_child`): this process is not the one the journal records.
static FORKED: AtomicBool = AtomicBool::new(false);

/// Whether this process is a child forked from the one that made the journal: it records
/// nothing, and nothing of it may touch the parent's journal.
pub fn forked() -> bool {
    FORKED.load(Relaxed)
}

/// In a forked child (a `pthread_atfork` child handler; only the forking thread exists):
/// the parent's journal is replaced, at the same address, by private zeroed memory, and the
/// inherited descriptor is closed. Whatever the child still runs (a hook, an atexit handler)
/// then writes only its own memory: the parent's journal is never written, never marked off.
/// Only syscalls: nothing here allocates or locks.
pub fn forked_child() {
    FORKED.store(true, Relaxed);
    let (base, len) = (BASE.load(Relaxed), LEN.load(Relaxed));
    if base != 0 && len != 0 {
        // SAFETY: replaces exactly the journal's own mapping (made by `create`) in this
        // single-threaded child; the new memory is as writable and at least as zeroed.
        unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
    }
    let fd = FD.swap(-1, Relaxed);
    if fd >= 0 {
        // SAFETY: the inherited copy of our descriptor, closed once in this process.
        unsafe { libc::close(fd) };
    }
}
