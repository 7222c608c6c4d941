//! A process to watch: its identity, its threads, and where libcuda is mapped in it.
//!
//! Everything comes from /proc/PID, which the target (an untrusted process) can influence only
//! through its own comm names and mappings; lines that do not parse are skipped, never trusted.
//! The library path is opened through /proc/PID/root so that a process in a container is
//! probed on its own libcuda, not on the host's.

use std::{fs, io, path::PathBuf};

use crate::error::ProbeError;

/// One executable-or-not mapping of /proc/PID/maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    pub executable: bool,
    /// The mapped file's inode (0 for anonymous memory): tells a journal's descriptor among
    /// the process's open files.
    pub inode: u64,
    pub path: String,
}

#[derive(Clone, Debug)]
pub struct Target {
    pub pid: u32,
    pub comm: String,
    /// libcuda's path as the target sees it (inside its mount namespace).
    pub libcuda: String,
    /// The same file, reachable from here (through /proc/PID/root).
    pub libcuda_host_path: PathBuf,
    /// libcuda's mappings in the target.
    pub libcuda_maps: Vec<Mapping>,
    /// Every executable mapping: a stack word that points elsewhere is no return address.
    pub code_maps: Vec<Mapping>,
    /// The CUPTI shim's journal mapping, if the process has one.
    pub journal: Option<Mapping>,
    /// When the process started (proc(5) field 22, clock ticks since boot; 0: unknown): a pid
    /// reused by a new process has another, and `alive` tells them apart — a daemon that took
    /// the new one for the old kept the old one's journal and wedge (issue 34).
    pub start_ticks: u64,
    /// A pidfd of the process (None where the kernel has none, < 5.3): readable once it has
    /// exited, zombie included, and never another process's (`alive`).
    exit_fd: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
}

impl Target {
    /// A target of `pid` with no libcuda found (the model's unit tests).
    #[cfg(test)]
    pub fn for_test(pid: u32) -> Self {
        Self {
            pid,
            comm: "test".into(),
            libcuda: String::new(),
            libcuda_host_path: PathBuf::new(),
            libcuda_maps: Vec::new(),
            code_maps: Vec::new(),
            journal: None,
            start_ticks: 0,
            exit_fd: None,
        }
    }

    /// Checks that `pid` exists and maps libcuda, and records where.
    pub fn open(pid: u32) -> Result<Self, ProbeError> {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        if pid == 0 || !proc.exists() {
            return Err(ProbeError::NoSuchProcess { pid });
        }
        let start_ticks = start_ticks(pid).unwrap_or(0);
        let comm = read_comm(&proc.join("comm")).unwrap_or_else(|| "?".into());
        let maps = match fs::read_to_string(proc.join("maps")) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ProbeError::TargetExited { pid });
            }
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                return Err(ProbeError::MissingCapability {
                    capability: "CAP_SYS_PTRACE",
                    why: "needed to read the memory map of another user's process",
                });
            }
            // A process that exited between the two reads gives ESRCH or an empty file.
            Err(_) => return Err(ProbeError::TargetExited { pid }),
        };
        if maps.is_empty() && !proc.exists() {
            return Err(ProbeError::TargetExited { pid });
        }
        let all: Vec<Mapping> = maps.lines().filter_map(parse_maps_line).collect();
        let libcuda_maps: Vec<Mapping> = all
            .iter()
            .filter(|m| is_libcuda(&m.path))
            .cloned()
            .collect();
        let Some(first) = libcuda_maps.first() else {
            if !proc.exists() {
                return Err(ProbeError::TargetExited { pid });
            }
            return Err(ProbeError::NotCuda { pid, comm });
        };
        let libcuda = first.path.clone();
        let libcuda_host_path = proc.join("root").join(libcuda.trim_start_matches('/'));
        let journal = all.iter().find(|m| is_journal(&m.path)).cloned();
        let code_maps = all.into_iter().filter(|m| m.executable).collect();
        Ok(Self {
            exit_fd: pidfd(pid, start_ticks).map(std::sync::Arc::new),
            journal,
            pid,
            comm,
            libcuda,
            libcuda_host_path,
            libcuda_maps,
            code_maps,
            start_ticks,
        })
    }

    /// False once the process exited, including while it is a zombie its parent has not
    /// reaped yet (its threads and mappings are gone then).
    /// A pid now held by another process (its start time differs) counts as exited.
    ///
    /// The daemon asks this of every process every second: by the pidfd one `poll` (reading
    /// /proc/PID/stat was 3% of its CPU at 64 processes), by /proc where there is none.
    pub fn alive(&self) -> bool {
        if let Some(fd) = &self.exit_fd {
            use std::os::fd::AsRawFd;
            let mut p = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, no wait.
            let n = unsafe { libc::poll(&mut p, 1, 0) };
            if n >= 0 {
                return n == 0;
            }
        }
        let Ok(stat) = fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return false;
        };
        if matches!(stat_state(&stat), None | Some('Z' | 'X')) {
            return false;
        }
        self.start_ticks == 0
            || stat_field(&stat, 22).and_then(|v| v.parse().ok()) == Some(self.start_ticks)
    }

    /// Thread ids of the target right now.
    pub fn threads(&self) -> Vec<u32> {
        let Ok(dir) = fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            return Vec::new();
        };
        let mut tids: Vec<u32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        tids.sort_unstable();
        tids
    }

    /// How many threads the target has, without listing them: /proc/PID/task's link count
    /// is 2 + its threads (one lookup, where listing fills an entry per thread; None if gone).
    pub fn thread_count(&self) -> Option<u32> {
        use std::os::unix::fs::MetadataExt;
        let links = fs::metadata(format!("/proc/{}/task", self.pid))
            .ok()?
            .nlink();
        u32::try_from(links.checked_sub(2)?).ok()
    }

    pub fn thread_name(&self, tid: u32) -> String {
        read_comm(&PathBuf::from(format!(
            "/proc/{}/task/{tid}/comm",
            self.pid
        )))
        .unwrap_or_else(|| "?".into())
    }

    /// The process address of libcuda file offset `file_offset`, if that part is mapped.
    pub fn libcuda_address(&self, file_offset: u64) -> Option<u64> {
        self.libcuda_maps.iter().find_map(|m| {
            let len = m.end - m.start;
            (file_offset >= m.offset && file_offset - m.offset < len)
                .then(|| m.start + (file_offset - m.offset))
        })
    }
}

/// Largest environment read (a hostile process cannot make us read more).
const MAX_ENVIRON: usize = 1 << 20;

/// Whether `pid`'s environment loads wedgeprobe's shim when it initialises CUDA.
pub fn expects_shim(pid: u32) -> bool {
    let env = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    environ_expects_shim(&env[..env.len().min(MAX_ENVIRON)])
}

/// `CUDA_INJECTION64_PATH` names a `libcupti_shim.so` and `WEDGEPROBE_SHIM` does not turn it
/// off (NUL-separated `KEY=value` pairs, as /proc/PID/environ holds them).
pub fn environ_expects_shim(env: &[u8]) -> bool {
    let mut injected = false;
    let mut off = false;
    for kv in env.split(|&b| b == 0) {
        if let Some(path) = kv.strip_prefix(b"CUDA_INJECTION64_PATH=") {
            injected = path.ends_with(b"/libcupti_shim.so") || path == b"libcupti_shim.so";
        } else if let Some(v) = kv.strip_prefix(b"WEDGEPROBE_SHIM=") {
            off = v == b"off" || v == b"0";
        }
    }
    injected && !off
}

/// The state letter (R, S, D, Z, …) of a /proc/…/stat file. It follows the last ')': the
/// comm before it may contain spaces and parentheses.
/// `pid`'s start time (proc(5) field 22).
pub fn start_ticks(pid: u32) -> Option<u64> {
    stat_field(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?, 22)?
        .parse()
        .ok()
}

pub fn proc_state(stat_path: &str) -> Option<char> {
    stat_state(&fs::read_to_string(stat_path).ok()?)
}

fn stat_state(stat: &str) -> Option<char> {
    stat_field(stat, 3)?.chars().next()
}

/// Field `n` of a /proc/…/stat line, numbered as in proc(5) (1: pid, 2: comm, 3: state, …;
/// `n` ≥ 3): counted from the last ')', since the comm may contain spaces and parentheses.
pub fn stat_field(stat: &str, n: usize) -> Option<&str> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(n.checked_sub(3)?)
}

/// The task flags of a /proc/…/stat line (field 9).
fn stat_flags(stat: &str) -> Option<u64> {
    stat_field(stat, 9)?.parse().ok()
}

/// `PF_EXITING` (include/linux/sched.h): set on a task as its exit begins.
const PF_EXITING: u64 = 0x4;

/// Whether `pid` has exited or is exiting: gone, a zombie, its leader's exit begun
/// (`PF_EXITING`), or its memory given back already (an empty command line; kernel threads,
/// the other such case, are never targets). Seen on the H200 and here (2026-12-02): a process
/// in its exit keeps its /proc entry for seconds while it closes its files — a wedgeprobe's
/// uprobes among them. And on the H200 (2026-12-02): a short-lived process whose root was
/// already gone was logged as `attach_failed` — likely its leader past `exit_fs` while other
/// threads still held its memory (so its command line was there); its leader's flags then say
/// it is exiting. (Not reproduced here.)
pub fn exiting(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    matches!(stat_state(&stat), None | Some('Z' | 'X'))
        || stat_flags(&stat).is_some_and(|f| f & PF_EXITING != 0)
        || fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.is_empty())
}

/// The journal mapping of `pid`, if it has one now.
pub fn find_journal(pid: u32) -> Option<Mapping> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    maps.lines()
        .filter_map(parse_maps_line)
        .find(|m| is_journal(&m.path))
}

/// A shim journal's mapping (`probe_common::journal::MAPS_PATH`: a memfd of that name).
pub fn is_journal(path: &str) -> bool {
    path == probe_common::journal::MAPS_PATH
}

/// `libcuda.so`, `libcuda.so.1`, `libcuda.so.580.159.04`; not `libcudart` or `libcudnn`.
pub fn is_libcuda(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base == "libcuda.so" || base.starts_with("libcuda.so.")
}

/// A pidfd of `pid` if it is still the process that started at `start_ticks` (checked after
/// the open: the pid could have been reused before it).
fn pidfd(pid: u32, started: u64) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    if started == 0 {
        return None;
    }
    // SAFETY: pidfd_open takes a pid and flags; it returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor just returned to us, owned by nobody else.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
    (start_ticks(pid) == Some(started)).then_some(fd)
}

fn read_comm(path: &std::path::Path) -> Option<String> {
    let s = fs::read(path).ok()?;
    // comm is at most 16 bytes and set by the target: keep it printable.
    let s: String = String::from_utf8_lossy(&s)
        .trim_end_matches('\n')
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(16)
        .collect();
    Some(s)
}

/// `start-end perms offset dev inode path`; `None` for lines that do not parse.
pub fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut f = line.splitn(6, ' ');
    let (range, perms, offset) = (f.next()?, f.next()?, f.next()?);
    let (_dev, inode) = (f.next()?, f.next()?);
    let path = f.next().unwrap_or("").trim_start().to_string();
    let (s, e) = range.split_once('-')?;
    let start = u64::from_str_radix(s, 16).ok()?;
    let end = u64::from_str_radix(e, 16).ok()?;
    if end <= start {
        return None;
    }
    Some(Mapping {
        start,
        end,
        offset: u64::from_str_radix(offset, 16).ok()?,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        inode: inode.parse().ok()?,
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stat_line_gives_state_and_flags_past_a_comm_with_parentheses() {
        // A comm may hold spaces and ')': fields are counted from the last ')'.
        let line = "4242 (py (x) y) R 1 4242 4242 0 -1 4194564 120 0 0 0 5 1 0 0 20 0 3 0";
        assert_eq!(stat_state(line), Some('R'));
        assert_eq!(stat_flags(line), Some(4_194_564));
        assert_ne!(
            stat_flags(line).unwrap() & PF_EXITING,
            0,
            "0x400104 has PF_EXITING"
        );
        let live = "7 (python3) S 1 7 7 0 -1 4194560 1 0 0 0";
        assert_eq!(stat_flags(live).map(|f| f & PF_EXITING), Some(0));
        assert_eq!(stat_flags("7 (python3) S 1"), None);
        assert_eq!(stat_state("garbage"), None);
    }

    #[test]
    fn maps_lines_parse_and_garbage_is_skipped() {
        let m = parse_maps_line(
            "7f1c2a000000-7f1c2b000000 r-xp 00200000 fd:01 1234   /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04",
        )
        .expect("parses");
        assert_eq!(m.start, 0x7f1c2a000000);
        assert_eq!(m.offset, 0x200000);
        assert!(m.executable);
        assert!(is_libcuda(&m.path));
        assert!(parse_maps_line("zz-10 r-xp 0 0 0").is_none());
        assert!(parse_maps_line("20-10 r-xp 0 0:0 0").is_none());
        assert!(parse_maps_line("").is_none());
    }

    #[test]
    fn the_shim_is_expected_only_where_the_environment_loads_it() {
        let env = |vars: &[&str]| vars.join("\0").into_bytes();
        assert!(environ_expects_shim(&env(&[
            "HOME=/root",
            "CUDA_INJECTION64_PATH=/opt/wedgeprobe/libcupti_shim.so"
        ])));
        assert!(!environ_expects_shim(&env(&[
            "CUDA_INJECTION64_PATH=/opt/wedgeprobe/libcupti_shim.so",
            "WEDGEPROBE_SHIM=off"
        ])));
        assert!(!environ_expects_shim(&env(&[
            "CUDA_INJECTION64_PATH=/usr/local/cuda/extras/CUPTI/lib64/libcupti_trace_injection.so"
        ])));
        assert!(!environ_expects_shim(&env(&[
            "PATH=/bin",
            "XCUDA_INJECTION64_PATH=libcupti_shim.so"
        ])));
        assert!(!environ_expects_shim(b""));
    }

    #[test]
    fn journal_paths() {
        assert!(is_journal("/memfd:wedgeprobe-journal (deleted)"));
        assert!(!is_journal("/memfd:wedgeprobe-journal"));
        assert!(!is_journal("/dev/shm/wedgeprobe-4242.journal"));
        assert!(!is_journal("/memfd:other (deleted)"));
        let m = parse_maps_line(
            "7f1c2a000000-7f1c2a3b0000 rw-s 00000000 00:01 48213                      /memfd:wedgeprobe-journal (deleted)",
        )
        .expect("parses");
        assert_eq!(m.inode, 48213);
        assert!(is_journal(&m.path), "{}", m.path);
    }

    #[test]
    fn only_the_driver_library_counts_as_libcuda() {
        assert!(is_libcuda("/usr/lib64/libcuda.so.1"));
        assert!(is_libcuda("libcuda.so"));
        assert!(!is_libcuda("/usr/local/cuda/lib64/libcudart.so.13"));
        assert!(!is_libcuda("/opt/libcudnn.so.9"));
    }

    #[test]
    fn a_zombie_or_reaped_child_is_exiting_a_live_process_is_not() {
        assert!(!exiting(std::process::id()));
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = child.id();
        // Not reaped yet: a zombie once it has exited. Waited for by its state, not by
        // `exiting`: mid-exec its cmdline reads empty for an instant, and the loop ended there
        // while the process then ran on (4 failures in 60 runs).
        let zombie = || {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| stat_state(&s) == Some('Z'))
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !zombie() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(exiting(pid), "zombie {pid} not seen as exiting");
        child.wait().expect("reap");
        assert!(exiting(pid));
    }
}
