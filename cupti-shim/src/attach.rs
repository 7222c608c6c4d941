//! The shim put into a process that is already running (`wedgeprobe attach`), instead of being
//! loaded by the driver at `cuInit` through `CUDA_INJECTION64_PATH`.
//!
//! wedgeprobe takes over one of the process's threads at a system-call boundary, has it load
//! this library and call `wedgeprobe_shim_attach`, and gives the thread back; the protocol and
//! its layout are `probe_common::attach`. Here, on that thread: the journal is created (marked
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

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::atomic::{AtomicU8, AtomicU64, Ordering::*},
};

use probe_common::{
    attach::{
        ATTACH_ALREADY, ATTACH_FAILED, ATTACH_HOOKS_REFUSED, ATTACH_MAGIC, ATTACH_NO_JOURNAL,
        ATTACH_NO_LIBCUDA, ATTACH_PREPARED, AttachArgs,
    },
    journal::{JOURNAL_ATTACHED_LATE, Layout, STATE_ATTACHING, STATE_OFF, STATE_RECORDING},
};

use crate::{launch_hooks, marks, recorder};

/// How long after an attach every launch asks whether its stream is being captured: a capture
/// that began before the attach is not in the shim's count (captures last milliseconds).
const LATE_CAPTURE_S: u64 = 10;
/// How long after the taking-over thread returned its page is unmapped: it has a few
/// instructions left to run there (restoring its registers) — a thread throttled by a CPU
/// quota can be held back for a 100 ms period.
const UNMAP_AFTER_NS: u64 = 2_000_000_000;

const IDLE: u8 = 0;
const WAITING: u8 = 1;
const DONE: u8 = 2;

static PHASE: AtomicU8 = AtomicU8::new(IDLE);
static DEADLINE_NS: AtomicU64 = AtomicU64::new(0);
static PAGE: AtomicU64 = AtomicU64::new(0);
static PAGE_LEN: AtomicU64 = AtomicU64::new(0);
static UNMAP_AT_NS: AtomicU64 = AtomicU64::new(0);

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
    if status != ATTACH_PREPARED {
        // No flush thread to give the page back: a short-lived one does.
        PAGE.store(a.page, Relaxed);
        PAGE_LEN.store(a.page_len, Relaxed);
        let _ = std::thread::Builder::new()
            .name("wedgeprobe-unmap".into())
            .spawn(|| {
                std::thread::sleep(std::time::Duration::from_nanos(UNMAP_AFTER_NS));
                unmap_page();
            });
    }
    status
}

fn prepare(a: &mut AttachArgs) -> Result<usize, (u32, String)> {
    if recorder::get().is_some() || launch_hooks::tried() {
        return Err((
            ATTACH_ALREADY,
            "the shim is already loaded in this process".into(),
        ));
    }
    let rec = recorder::start(Layout::DEFAULT).map_err(|e| {
        (
            ATTACH_NO_JOURNAL,
            format!(
                "cannot create its journal {}: {e}",
                crate::shm::path_for(std::process::id())
            ),
        )
    })?;
    rec.writer().set_state(STATE_ATTACHING);
    rec.writer().set_flags(JOURNAL_ATTACHED_LATE);
    rec.use_marks(
        marks::Cadence {
            every: marks::DEFAULT_EVERY,
            gap_us: marks::DEFAULT_US,
            period_us: marks::DEFAULT_PERIOD_US,
        },
        true,
    );
    if let Some(m) = marks::get() {
        m.set_attached_late();
    }
    launch_hooks::check_captures_until(recorder::monotonic_ns() + LATE_CAPTURE_S * 1_000_000_000);
    let n = launch_hooks::prepare_for_attach(crate::cupti_backend::hook_resolve(), &mut a.patches)
        .map_err(|why| {
            rec.turn_off();
            let status = if why.contains("not loaded") || why.contains("lacks") {
                ATTACH_NO_LIBCUDA
            } else if why.contains("does not move") {
                ATTACH_HOOKS_REFUSED
            } else {
                ATTACH_FAILED
            };
            (status, why.to_string())
        })?;
    DEADLINE_NS.store(a.commit_deadline_ns, Relaxed);
    PAGE.store(a.page, Relaxed);
    PAGE_LEN.store(a.page_len, Relaxed);
    PHASE.store(WAITING, Release);
    crate::cupti_backend::spawn_flush_thread().map_err(|why| {
        launch_hooks::pass_through(true);
        rec.turn_off();
        (ATTACH_FAILED, why)
    })?;
    Ok(n)
}

/// The flush thread, every tick: once an attach's jumps are all in place, the journal
/// records; past the deadline without them, the shim steps aside. Then the injection page
/// goes back. One load when there is no attach.
pub fn tick(rec: &recorder::Recorder) {
    let now = recorder::monotonic_ns();
    match PHASE.load(Acquire) {
        IDLE => {}
        WAITING => {
            let (in_place, all) = launch_hooks::patches_in_place();
            if in_place == all && all > 0 {
                rec.writer().set_state(STATE_RECORDING);
                crate::log_line(
                    format!("attached by wedgeprobe: recording ({all} entry points hooked)")
                        .as_bytes(),
                );
            } else if now > DEADLINE_NS.load(Relaxed) {
                launch_hooks::remove();
                rec.writer().set_state(STATE_OFF);
                crate::log_line(
                    format!(
                        "attach did not complete ({in_place} of {all} hooks in place by its \
                         deadline); hooks taken back; shim off"
                    )
                    .as_bytes(),
                );
            } else {
                return;
            }
            UNMAP_AT_NS.store(now + UNMAP_AFTER_NS, Relaxed);
            PHASE.store(DONE, Release);
        }
        _ => {
            if now >= UNMAP_AT_NS.load(Relaxed) {
                unmap_page();
            }
        }
    }
}

/// Gives the injection page back, once.
fn unmap_page() {
    let page = PAGE.swap(0, AcqRel);
    let len = PAGE_LEN.load(Relaxed);
    if page != 0 && len != 0 {
        // SAFETY: wedgeprobe's injection page (it told us where and how long), which the
        // thread that ran the injection has left (UNMAP_AFTER_NS after it returned).
        unsafe { libc::munmap(page as *mut libc::c_void, len as usize) };
    }
}
