//! The CUPTI injection library (`CUDA_INJECTION64_PATH`).
//!
//! Error handling: nothing here may unwind into the host process; every failure turns the shim
//! off. Thread safety: `InitializeInjection` is called once by the driver.
//!
//! Until the CUPTI shim issue lands this only declines injection politely: the driver calls
//! `InitializeInjection`, which reports failure (0) so CUDA carries on without it.

pub mod journal;

/// Entry point the CUDA driver calls when it loads `CUDA_INJECTION64_PATH`. Returns 0: the
/// shim does not record anything yet, and says so once on stderr.
#[unsafe(no_mangle)]
pub extern "C" fn InitializeInjection() -> i32 {
    // eprintln! can panic only if stderr is closed in a way that errors; use write(2) directly.
    let msg = b"wedgeprobe shim: not implemented in this build; shim off\n";
    // SAFETY: writing a static buffer to fd 2; the result is deliberately ignored.
    unsafe { libc_write(2, msg.as_ptr(), msg.len()) };
    0
}

unsafe extern "C" {
    #[link_name = "write"]
    fn libc_write(fd: i32, buf: *const u8, count: usize) -> isize;
}
