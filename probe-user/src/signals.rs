//! Ctrl-C and SIGTERM set a flag the loops poll, so wedgeprobe detaches cleanly (dropping the
//! links) instead of dying mid-attach.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
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
