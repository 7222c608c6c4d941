//! The shim's life in its process: the journal made once (at `InitializeInjection` or an
//! attach), and what happens at the process's exit and in a forked child. Above every stage it
//! touches (the recorder, the hooks), so that none of them reaches up to the others.

use std::sync::Once;

use probe_common::journal::{Layout, STATE_OFF};

use crate::{hooks, journal, record};

/// Creates the process's journal (`record::start`) and, the first time, registers the exit and
/// fork handlers. `Err` (with the reason) turns the shim off.
pub fn start(layout: Layout) -> std::io::Result<&'static record::Recorder> {
    let rec = record::start(layout)?;
    static HANDLERS: Once = Once::new();
    // The recorder is never dropped (callbacks may run until the very end): the journal is
    // marked off at exit, and its memory goes with the process (a memfd: nothing is left
    // behind, not even after a SIGKILL).
    HANDLERS.call_once(|| {
        // SAFETY: registering plain extern "C" fns, once.
        unsafe {
            libc::atexit(off_at_exit);
            libc::pthread_atfork(None, None, Some(forked_child));
        }
    });
    Ok(rec)
}

/// `pthread_atfork`'s child handler: launches pass through unrecorded, and the journal's
/// memory is the child's own private copy from here on (`journal::file::forked_child`).
extern "C" fn forked_child() {
    hooks::hot::pass_through(true);
    journal::file::forked_child();
}

extern "C" fn off_at_exit() {
    if journal::file::forked() {
        // A forked child's exit (its atexit handlers run): the parent still records.
        return;
    }
    if let Some(line) = hooks::coverage::coverage_line() {
        crate::log_line(&line);
    }
    if let Some(line) = crate::self_cost::line() {
        crate::log_line(line.as_bytes());
    }
    hooks::install::remove();
    if let Some(rec) = record::get() {
        rec.writer().set_state(STATE_OFF);
    }
}
