//! The journal's shared-memory file: `/dev/shm/wedgeprobe-<pid>.journal`, mode 0600 (only the
//! process's own user — and root — can read it), created fresh, mapped shared.
//!
//! Called once, from `InitializeInjection`, never from a callback: it may allocate (the path)
//! and make syscalls. Every failure is returned, and turns the shim off with one log line.

use std::{ffi::CString, io, ptr::NonNull};

pub fn path_for(pid: u32) -> String {
    use probe_common::journal::{FILE_PREFIX, FILE_SUFFIX};
    format!("{FILE_PREFIX}{pid}{FILE_SUFFIX}")
}

/// A mapped journal file. Unmapped and removed on drop (the process is exiting or the shim
/// is turning off).
pub struct SharedFile {
    base: NonNull<u8>,
    len: usize,
    path: CString,
}

// SAFETY: the mapping is plain shared memory; access is through the journal writer's atomics.
unsafe impl Send for SharedFile {}
// SAFETY: as above.
unsafe impl Sync for SharedFile {}

impl SharedFile {
    /// Creates the file for `pid` (replacing a stale one left by an earlier process with the
    /// same pid), sizes it to `len` zero bytes and maps it read-write, shared.
    pub fn create(pid: u32, len: usize) -> io::Result<Self> {
        let path = CString::new(path_for(pid)).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: a valid NUL-terminated path; unlink of a missing file fails harmlessly.
        unsafe { libc::unlink(path.as_ptr()) };
        // SAFETY: as above; O_EXCL so we never write into a file someone else prepared.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC | libc::O_NOFOLLOW,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let result = (|| {
            // SAFETY: fd is ours; len fits off_t for any journal size we create.
            if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
                return Err(io::Error::last_os_error());
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
                return Err(io::Error::last_os_error());
            }
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))
        })();
        // SAFETY: the mapping (if any) keeps the file; the fd is no longer needed.
        unsafe { libc::close(fd) };
        match result {
            Ok(base) => Ok(Self { base, len, path }),
            Err(e) => {
                // SAFETY: remove the half-made file.
                unsafe { libc::unlink(path.as_ptr()) };
                Err(e)
            }
        }
    }

    /// Removes the file (the mapping stays valid until unmapped).
    pub fn unlink(&self) {
        // SAFETY: our own NUL-terminated path.
        unsafe { libc::unlink(self.path.as_ptr()) };
    }

    /// Page-aligned (hence 8-byte aligned), zero-filled, `len` bytes, mapped while `self` lives.
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }
}

impl Drop for SharedFile {
    fn drop(&mut self) {
        // SAFETY: our own mapping and file.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
            libc::unlink(self.path.as_ptr());
        }
    }
}
