//! The simulated driver as a backend (tests/simcuda): it calls the shim back at the moments
//! CUPTI would — API enter and exit with a correlation id, and a kernel's completion with its
//! GPU start and end — so CI drives the journal-writing core for real without a GPU.
//!
//! The simulated libcuda exports `simcuda_subscribe`; on a real driver that symbol does not
//! exist and this backend is not used. The structs mirror `tests/simcuda/cuda_sim.h`.

use std::{
    ffi::{c_char, c_void},
    sync::atomic::{AtomicBool, Ordering},
};

use probe_common::journal::{RECORD_MARKS, STATE_RELEASED};

use crate::{
    clock::monotonic_ns,
    guarded,
    journal::{Completion, Launch},
    record::{self},
};

#[repr(C)]
pub struct SimLaunch {
    pub name: *const c_char,
    pub stream: u64,
    pub stream_id: u32,
    pub device: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

#[repr(C)]
pub struct SimCallbacks {
    pub api_enter: extern "C" fn(api: u32, correlation: u64, launch: *const SimLaunch),
    pub api_exit: extern "C" fn(api: u32, correlation: u64),
    pub kernel_done: extern "C" fn(correlation: u64, start_ns: u64, end_ns: u64, stream_id: u32),
}

static CALLBACKS: SimCallbacks = SimCallbacks {
    api_enter,
    api_exit,
    kernel_done,
};

static ATTACHED: AtomicBool = AtomicBool::new(false);
static RELEASED: AtomicBool = AtomicBool::new(false);

pub fn released() -> bool {
    RELEASED.load(Ordering::Acquire)
}

pub fn attached() -> bool {
    ATTACHED.load(Ordering::Acquire)
}

/// The simulated counterpart of giving CUPTI back: callbacks stop recording, the journal says
/// released (what `wedgeprobe release` is tested against in CI).
pub fn release() {
    if RELEASED.swap(true, Ordering::AcqRel) {
        return;
    }
    crate::hooks::install::remove();
    if let Some(rec) = record::get() {
        rec.writer().set_state(STATE_RELEASED);
    }
    crate::log_line(b"released CUPTI for another tool; recording stopped");
}

fn recording() -> Option<&'static record::Recorder> {
    if RELEASED.load(Ordering::Relaxed) {
        None
    } else {
        record::get()
    }
}

/// Subscribes to the simulated driver if this process runs on it.
pub fn attach() -> bool {
    const SYMBOL: &[u8] = b"simcuda_subscribe\0";
    // SAFETY: a NUL-terminated symbol name; RTLD_DEFAULT searches the loaded objects.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, SYMBOL.as_ptr().cast()) };
    if sym.is_null() {
        return false;
    }
    // SAFETY: the simulated driver defines `void simcuda_subscribe(const SimCallbacks*)`.
    let subscribe: extern "C" fn(*const SimCallbacks) =
        unsafe { std::mem::transmute::<*mut c_void, _>(sym) };
    subscribe(&CALLBACKS);
    ATTACHED.store(true, Ordering::Release);
    if record::get().is_some_and(|r| r.record_mode() == RECORD_MARKS)
        && let Err(why) = crate::hooks::install::install(
            crate::hooks::hot::Resolve {
                stream_id: sim_stream_id,
                graph_id: |exec| crate::hooks::calls::exec_id(exec),
                context: Some(|_| sim_context()),
            },
            true,
        )
    {
        why.fell_back("launches recorded through the driver's callbacks: ");
    }
    true
}

/// The simulated driver's stream index (`simcuda_stream_id`), what its callbacks report.
fn sim_stream_id(_ctx: usize, stream: usize, _per_thread: u8) -> u32 {
    // SAFETY: a NUL-terminated symbol name; RTLD_DEFAULT searches the loaded objects.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"simcuda_stream_id".as_ptr()) };
    if sym.is_null() {
        return 0;
    }
    // SAFETY: the simulated driver defines `unsigned simcuda_stream_id(CUstream)`.
    let f: extern "C" fn(usize) -> u32 = unsafe { std::mem::transmute::<*mut c_void, _>(sym) };
    f(stream)
}

/// The simulated driver has one context, "created" before its first call (or launch).
fn sim_context() {
    static CONTEXT: std::sync::Once = std::sync::Once::new();
    if let Some(rec) = recording() {
        CONTEXT.call_once(|| rec.context_created(1));
    }
}

thread_local! {
    /// The launch callback now running was left to the launch hooks (its exit is too).
    static LEFT_TO_HOOKS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

extern "C" fn api_enter(api: u32, correlation: u64, launch: *const SimLaunch) {
    guarded(|| {
        let Some(rec) = recording() else { return };
        sim_context();
        // A launch the hooks recorded: what CUPTI's callbacks do when the hooks are in place
        // (their launch callbacks are off).
        let hooked = (!launch.is_null() && crate::hooks::launch::hook_records_this_launch())
            || crate::hooks::calls::covers(api);
        LEFT_TO_HOOKS.with(|l| l.set(hooked));
        if hooked {
            return;
        }
        if !launch.is_null() {
            crate::record::thread::with(|t| rec.entering_in(t));
        }
        let correlation = rec.own_correlation(correlation);
        let now = monotonic_ns();
        rec.api_enter(api, correlation, now);
        // SAFETY: the driver passes a valid SimLaunch for launches, null otherwise.
        let Some(l) = (unsafe { launch.as_ref() }) else {
            return;
        };
        let name: &[u8] = if l.name.is_null() {
            b""
        } else {
            // SAFETY: a NUL-terminated name owned by the driver for the call's duration;
            // strnlen bounds the read.
            unsafe {
                let n = libc::strnlen(l.name, 4096);
                std::slice::from_raw_parts(l.name.cast::<u8>(), n)
            }
        };
        rec.launch_keyed(
            name,
            l.name as usize,
            Launch {
                correlation,
                launch_ns: now,
                stream: l.stream,
                stream_id: l.stream_id,
                device: l.device,
                api,
                grid: l.grid,
                block: l.block,
                cluster: [1, 1, 1],
                ..Launch::default()
            },
            // The simulated driver has one context, current everywhere.
            1,
        );
    });
}

extern "C" fn api_exit(_api: u32, _correlation: u64) {
    guarded(|| {
        if LEFT_TO_HOOKS.with(|l| l.replace(false)) {
            return;
        }
        if let Some(rec) = recording() {
            rec.api_exit(true);
        }
    });
}

/// What CUPTI's CONCURRENT_KERNEL records would deliver: used in the exact mode, or while
/// wedgeprobe holds a per-kernel lease (with marks the real backend enables them only then).
extern "C" fn kernel_done(correlation: u64, start_ns: u64, end_ns: u64, stream_id: u32) {
    guarded(|| {
        if let Some(rec) = recording()
            && (rec.record_mode() != RECORD_MARKS || rec.writer().per_kernel_leased(monotonic_ns()))
        {
            let Some(correlation) = rec.mapped(correlation) else {
                return;
            };
            rec.complete(&Completion {
                correlation,
                start_ns,
                end_ns,
                stream_id,
                device: 0,
                graph_node: 0,
            });
        }
    });
}
