//! Opening a target's journal file, which the target made and may have tampered with.
//!
//! The journal is a memfd (`probe_common::journal::MEMFD_NAME`) the target keeps open: it is
//! found through `/proc/PID/fd` (ptrace access to the target is enough), the one whose inode
//! is the mapping's, or else through `/proc/PID/map_files` (which also needs CAP_SYS_ADMIN or
//! CAP_CHECKPOINT_RESTORE), for a process that closed the descriptor. Before anything maps it:
//! its owner must be the target's user, nobody else may write it, and its size must be sealed
//! against shrinking — a target that could truncate the file under our mapping could kill the
//! reader (root, the daemon of a whole node) with SIGBUS.

use std::{fs::File, os::unix::fs::MetadataExt as _};

use anyhow::{Context as _, bail};

use crate::process::target::Mapping;

/// Opens `mapping`'s file in `pid` (read-only, or read-write for the words wedgeprobe writes)
/// and checks owner, mode and seals. Returns the file and its length.
pub fn open(pid: u32, mapping: &Mapping, writable: bool) -> anyhow::Result<(File, usize)> {
    let file = open_by_fd(pid, mapping, writable)
        .or_else(|| open_by_map_files(pid, mapping, writable))
        .with_context(|| {
            format!(
                "cannot open pid {pid}'s journal (neither /proc/{pid}/fd nor /proc/{pid}/map_files \
                 gives it: the process exited, or wedgeprobe lacks CAP_SYS_PTRACE)"
            )
        })?;
    let meta = file.metadata()?;
    let uid = process_uid(pid).context("cannot read the target's uid")?;
    if meta.uid() != uid {
        bail!(
            "pid {pid}'s journal is owned by uid {}, not by the target's uid {uid}",
            meta.uid()
        );
    }
    if meta.mode() & 0o022 != 0 {
        bail!(
            "pid {pid}'s journal is writable by other users (mode {:o})",
            meta.mode() & 0o777
        );
    }
    let seals = seals(&file);
    if seals & libc::F_SEAL_SHRINK == 0 {
        bail!(
            "pid {pid}'s journal is not sealed against shrinking (seals {seals:#x}): it could be \
             truncated under the reader; not read"
        );
    }
    let len = usize::try_from(meta.len()).context("journal size")?;
    Ok((file, len))
}

fn open_by_fd(pid: u32, mapping: &Mapping, writable: bool) -> Option<File> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    for entry in dir.flatten() {
        let Ok(link) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if link.as_os_str() != probe_common::journal::MAPS_PATH {
            continue;
        }
        if let Ok(f) = open_path(&entry.path(), writable)
            && f.metadata().is_ok_and(|m| m.ino() == mapping.inode)
        {
            return Some(f);
        }
    }
    None
}

fn open_by_map_files(pid: u32, mapping: &Mapping, writable: bool) -> Option<File> {
    let path = format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    );
    let f = open_path(std::path::Path::new(&path), writable).ok()?;
    f.metadata()
        .is_ok_and(|m| m.ino() == mapping.inode)
        .then_some(f)
}

fn open_path(path: &std::path::Path, writable: bool) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(writable)
        .open(path)
}

/// The file's seals (`F_GET_SEALS`; 0 for a file that cannot be sealed).
fn seals(file: &File) -> i32 {
    use std::os::fd::AsRawFd as _;
    // SAFETY: a query on a descriptor we own.
    let s = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    s.max(0)
}

/// The real uid of a process (first field of `Uid:` in /proc/PID/status).
fn process_uid(pid: u32) -> Option<u32> {
    status_field(pid, "Uid:")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The process's pid in its own pid namespace (the last field of `NSpid:`; the pid itself on
/// kernels without it): what its `getpid` returns, so what its shim wrote in the header.
pub fn pid_in_namespace(pid: u32) -> u32 {
    crate::process::ns_tids::ns_pids(&format!("/proc/{pid}/status"))
        .and_then(|v| v.last().copied())
        .unwrap_or(pid)
}

fn status_field(pid: u32, name: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memfd named like a journal, mapped in this process; sealed against shrinking or not.
    fn journal_like(seal: bool) -> (crate::process::target::Mapping, i32) {
        let name = std::ffi::CString::new(probe_common::journal::MEMFD_NAME).unwrap();
        // SAFETY: plain syscalls on descriptors and memory this test owns.
        unsafe {
            let fd = libc::memfd_create(name.as_ptr(), libc::MFD_ALLOW_SEALING);
            assert!(fd >= 0);
            assert_eq!(libc::fchmod(fd, 0o600), 0);
            assert_eq!(libc::ftruncate(fd, 8192), 0);
            if seal {
                assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
            let m = maps
                .lines()
                .filter_map(crate::process::target::parse_maps_line)
                .find(|m| m.start == p as u64)
                .expect("the mapping is listed");
            (m, fd)
        }
    }

    #[test]
    fn a_journal_that_could_be_truncated_under_the_reader_is_refused() {
        let me = std::process::id();
        let (unsealed, fd1) = journal_like(false);
        let err = open(me, &unsealed, false).unwrap_err().to_string();
        assert!(err.contains("not sealed against shrinking"), "{err}");
        let (sealed, fd2) = journal_like(true);
        let (_, len) = open(me, &sealed, false).expect("a sealed journal opens");
        assert_eq!(len, 8192);
        // SAFETY: this test's own descriptors (the mappings end with the test process).
        unsafe {
            libc::close(fd1);
            libc::close(fd2);
        }
    }

    #[test]
    fn our_pid_in_our_namespace_is_ours() {
        assert_eq!(pid_in_namespace(std::process::id()), std::process::id());
    }
}
