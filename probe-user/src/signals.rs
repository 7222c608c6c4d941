//! Ctrl-C and SIGTERM set a flag the loops poll, so wedgeprobe detaches cleanly (dropping the
//! links) instead of dying mid-attach.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

extern "C" fn on_hup(_: libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
}

/// SIGHUP sets a flag the daemon polls (reload its configuration).
pub fn install_reload() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGHUP, on_hup as *const () as libc::sighandler_t) };
}

/// Whether a SIGHUP came since the last call.
pub fn reload_requested() -> bool {
    RELOAD.swap(false, Ordering::SeqCst)
}

pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
