//! The shim put into a process that is already running (`wedgeprobe attach`), instead of being
//! loaded by the driver at `cuInit` through `CUDA_INJECTION64_PATH`.
//!
//! wedgeprobe takes over one of the process's threads at a system-call boundary, has it load
//! this library and call `wedgeprobe_shim_attach`, and the thread goes back to its wait
//! (probe-user's `inject::blob`); the protocol and its layout are `probe_common::attach`. Here, on that thread: the journal is created (marked
//! attaching and attached late), marks are set up, every hook is prepared but none applied —
//! other threads are running and one could be half-way through a prologue a jump overwrites —
//! and the code words that apply them are handed back. wedgeprobe writes them with every
//! thread stopped. The flush thread then sees them in place and starts recording; if they are
//! not all there by the deadline (wedgeprobe killed in the middle, say), it takes back the
//! ones that are and turns the shim off, with one line. Nothing here blocks: no driver call,
//! no lock another thread of the process could hold (the hooks' trampolines and the journal
//! are new memory of our own).
//!
//! What an attach cannot know, and how it is told: launches made before it are not in the
//! journal — each stream's first launch after it is preceded by a marked record standing for
//! them (`Recorder::pre_attach_record`), so a kernel stuck from before is reported as such,
//! never as a later one; a stream capture begun before it is not counted — every launch asks
//! the driver for the first `LATE_CAPTURE_S` seconds; executable graphs instantiated before it
//! have no node list (their launches are named as graph launches without their kernels).

use std::panic::{AssertUnwindSafe, catch_unwind};

use probe_common::{
    attach::{
        ATTACH_ALREADY, ATTACH_FAILED, ATTACH_HOOKS_REFUSED, ATTACH_MAGIC, ATTACH_NO_JOURNAL,
        ATTACH_NO_LIBCUDA, ATTACH_PREPARED, AttachArgs,
    },
    journal::{JOURNAL_ATTACHED_LATE, Layout, STATE_ATTACHING},
};

use crate::{hooks, marks, record};

/// How long after an attach every launch asks whether its stream is being captured: a capture
/// that began before the attach is not in the shim's count (captures last milliseconds).
const LATE_CAPTURE_S: u64 = 10;

/// Called by the thread wedgeprobe took over (see the module doc): prepares everything but
/// the jumps, lists their code words in `args`, returns `args.status` (`ATTACH_*`).
///
/// # Safety
/// `args` points to an `AttachArgs` wedgeprobe wrote, writable, for the call's duration.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wedgeprobe_shim_attach(args: *mut AttachArgs) -> u32 {
    // SAFETY: the caller's promise; null is refused.
    let Some(a) = (unsafe { args.as_mut() }) else {
        return ATTACH_FAILED;
    };
    if a.magic != ATTACH_MAGIC {
        return ATTACH_FAILED;
    }
    let (status, why) = match catch_unwind(AssertUnwindSafe(|| prepare(a))) {
        Ok(Ok(n)) => {
            a.npatches = n as u32;
            (ATTACH_PREPARED, String::new())
        }
        Ok(Err((status, why))) => (status, why),
        Err(_) => (ATTACH_FAILED, "internal error while preparing".to_string()),
    };
    let n = why.len().min(a.message.len() - 1);
    a.message[..n].copy_from_slice(&why.as_bytes()[..n]);
    a.message[n] = 0;
    a.status = status;
    status
}

fn prepare(a: &mut AttachArgs) -> Result<usize, (u32, String)> {
    if record::get().is_some() || hooks::install::tried() {
        return Err((
            ATTACH_ALREADY,
            "the shim is already loaded in this process".into(),
        ));
    }
    let rec = crate::lifecycle::start(Layout::DEFAULT)
        .map_err(|e| (ATTACH_NO_JOURNAL, format!("cannot create its journal: {e}")))?;
    rec.writer().set_state(STATE_ATTACHING);
    rec.writer().set_flags(JOURNAL_ATTACHED_LATE);
    rec.use_marks(
        marks::Cadence {
            every: marks::DEFAULT_EVERY,
            gap_us: marks::DEFAULT_US,
            period_us: marks::DEFAULT_PERIOD_US,
        },
        // As a shim started with the process (`marks::DEFAULT_WITH_EVENTS`).
        marks::DEFAULT_WITH_EVENTS,
    );
    if let Some(m) = marks::get() {
        m.set_attached_late();
    }
    hooks::hot::check_captures_until(crate::clock::monotonic_ns() + LATE_CAPTURE_S * 1_000_000_000);
    let n =
        hooks::install::prepare_for_attach(crate::backend::cupti::hook_resolve(), &mut a.patches)
            .map_err(|why| {
            rec.turn_off();
            let status = match why.kind {
                hooks::install::NotHookedKind::NoLibcuda => ATTACH_NO_LIBCUDA,
                hooks::install::NotHookedKind::Refused
                | hooks::install::NotHookedKind::Breakpoint => ATTACH_HOOKS_REFUSED,
                hooks::install::NotHookedKind::Failed
                | hooks::install::NotHookedKind::TurnedOff
                | hooks::install::NotHookedKind::NotX86 => ATTACH_FAILED,
            };
            (status, why.line)
        })?;
    hooks::install::await_jumps(a.commit_deadline_ns);
    crate::backend::cupti::spawn_flush_thread().map_err(|why| {
        hooks::hot::pass_through(true);
        rec.turn_off();
        (ATTACH_FAILED, why)
    })?;
    Ok(n)
}
