//! The launch path: libcuda's exported launch entry points, hooked. Each hook takes the
//! thread's state once, records the launch (`before`: its stream's id and mark slot cached per
//! stream, its name per function, one journal record and the mark decision in
//! `Recorder::launch_named_in`), calls the driver, and records the exit and the mark after it
//! (`after`) — the shim's parts under `catch_unwind`. Measured on the H200 (BENCHMARKS.md, the
//! recorder's price): CUPTI's launch callbacks were most of the shim's eager cost (launch-bound
//! loop +31% with them, +8% with them left off); a call through our function and a record
//! costs tens of ns.
//!
//! Every caller reaches these entry points — the runtime's `cuGetProcAddress` hands out the
//! exported addresses, Triton binds them with `dlsym`, NCCL through the runtime — so one patch
//! per entry point covers them all (`super::install`). Where an entry point cannot be
//! patched, none is, and CUPTI's callbacks record launches as before (one log line).
//!
//! Correlation ids: CUPTI's are not seen here, so while hooks record, every journal id comes
//! from the recorder's own counter (`Recorder::next_correlation`), synchronizes included;
//! CUPTI's ids are translated where CUPTI still reports (`Recorder::own_correlation`).
//! While `wedgeprobe trace` leases per-kernel records the hooks pass launches through and
//! CUPTI's launch callbacks record them (their completion records need CUPTI's ids).

use std::{
    ffi::{CStr, c_char, c_void},
    sync::atomic::{AtomicU32, Ordering},
};

use super::hot::{HOT, captures_unknown, current_context, hot_marks, hot_recorder, recording};
use crate::{
    journal::Launch,
    record::{
        Recorder,
        thread::{self, ThreadState},
    },
};

/// Whether the calling thread is inside a hooked launch entry point now.
pub fn inside() -> bool {
    thread::with(|t| t.inside.get())
}

/// Whether the calling thread is inside a hooked launch that its hook took (recorded, or left
/// out as a captured one). A launch
/// callback nested in that call asks this, not `recording()`: the pass-through flag can flip
/// between the hook's decision and the callback (a per-kernel lease starting or lapsing), and
/// the launch was then recorded twice under two correlation ids (seen once in a trace of
/// 300,000 launches on the simulated driver under load).
pub fn hook_records_this_launch() -> bool {
    thread::with(|t| t.inside.get() && t.hook_records.get())
}

#[derive(Clone, Copy)]
pub(super) enum Entry {
    Launch,
    LaunchPtsz,
    LaunchEx,
    LaunchExPtsz,
    Cooperative,
    CooperativePtsz,
    Graph,
    GraphPtsz,
}

pub(super) const ENTRIES: [(Entry, &CStr); 8] = [
    (Entry::Launch, c"cuLaunchKernel"),
    (Entry::LaunchPtsz, c"cuLaunchKernel_ptsz"),
    (Entry::LaunchEx, c"cuLaunchKernelEx"),
    (Entry::LaunchExPtsz, c"cuLaunchKernelEx_ptsz"),
    (Entry::Cooperative, c"cuLaunchCooperativeKernel"),
    (Entry::CooperativePtsz, c"cuLaunchCooperativeKernel_ptsz"),
    (Entry::Graph, c"cuGraphLaunch"),
    (Entry::GraphPtsz, c"cuGraphLaunch_ptsz"),
];

type LaunchFn = unsafe extern "C" fn(
    *mut c_void,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> u32;
type LaunchExFn = unsafe extern "C" fn(
    *const cupti_sys::CUlaunchConfig,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> u32;
type CooperativeFn = unsafe extern "C" fn(
    *mut c_void,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut c_void,
    *mut *mut c_void,
) -> u32;
type GraphFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> u32;

/// The mangled name of a launched function (a `CUfunction`, or a `CUkernel` passed as one).
fn function_name_id(rec: &Recorder, t: &ThreadState, epoch: u64, f: *mut c_void) -> u32 {
    t.names.get_or(f as usize, epoch, || {
        let d = crate::driver::driver();
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: out-pointer; the driver validates the handle and fails on a foreign one.
        let ok = d
            .func_name
            .is_some_and(|g| unsafe { g(&mut p, f.cast()) } == 0)
            || d.kernel_name
                .is_some_and(|g| unsafe { g(&mut p, f.cast()) } == 0);
        if !ok || p.is_null() {
            return rec.writer().intern(b"(kernel name unknown)").into();
        }
        // SAFETY: a NUL-terminated name the driver owns; bounded.
        let name = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), libc::strnlen(p, 4096)) };
        rec.writer().intern(name).into()
    }) as u32
}

/// The name id graph launches carry (interned once).
fn graph_launch_name(rec: &Recorder) -> u32 {
    static ID: AtomicU32 = AtomicU32::new(0);
    match ID.load(Ordering::Relaxed) {
        0 => {
            let id = rec.writer().intern(b"(graph launch)");
            ID.store(id, Ordering::Relaxed);
            id
        }
        id => id,
    }
}

fn capturing(stream: *mut c_void) -> bool {
    let mut status = 0u32;
    crate::driver::driver()
        .is_capturing
        // SAFETY: the launch's stream and an out-pointer.
        .is_some_and(|f| unsafe { f(stream, &mut status) } == 0 && status != 0)
}

/// Records a launch before the driver sees it; the exit is recorded by `after`. Returns
/// whether it was recorded.
#[inline(always)]
fn before(
    t: &ThreadState,
    entry: Entry,
    f: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    stream: *mut c_void,
    graph_exec: *mut c_void,
) -> bool {
    t.inside.set(true);
    t.hook_records.set(false);
    if !recording() {
        return false;
    }
    let Some(rec) = hot_recorder() else {
        return false;
    };
    let resolve = HOT.resolve.load(Ordering::Acquire);
    if resolve.is_null() {
        return false;
    }
    // SAFETY: set once from a leaked Box, never freed.
    let resolve = unsafe { &*resolve };
    // From here the hook owns this launch (records it, or leaves out a captured one).
    t.hook_records.set(true);
    rec.writer().prefetch_lines(&t.next_lines.get());
    // A launch into a stream being captured does not run: it becomes a graph node. Only
    // asked while some capture is in progress (rare), so a launch normally pays nothing —
    // and for a while after an attach, when captures begun before are not counted.
    let marks = hot_marks();
    if (marks.is_some_and(crate::marks::Marks::capturing) || captures_unknown())
        && capturing(stream)
    {
        return false;
    }
    let i = entry as usize;
    let per_thread = u8::from(matches!(
        entry,
        Entry::LaunchPtsz | Entry::LaunchExPtsz | Entry::CooperativePtsz | Entry::GraphPtsz
    ));
    let mut phases = crate::self_cost::Phases::start_if(HOT.self_cost.load(Ordering::Relaxed));
    let api = u32::from(HOT.api[i].load(Ordering::Relaxed));
    // Entering first, then the id: a synchronize that takes a later id sees this launch
    // until it is queued (`Writer::sync_floor`).
    let (correlation, now) = rec.launch_enter_in(t, api);
    phases.next(crate::self_cost::Phase::Enter);
    let ctx = current_context();
    if let Some(context) = resolve.context {
        context(ctx);
    }
    let epoch = HOT.epoch.load(Ordering::Acquire);
    let device = t.device_of(ctx);
    let handle = crate::marks::stream_handle(stream as u64, per_thread != 0);
    // The stream's id and its journal mark slot, cached together: both are lookups
    // (a driver call; a probe of the journal's mark table) a stream's launches repeat.
    let cached = t
        .streams
        .get_or((stream as usize) ^ usize::from(per_thread), epoch, || {
            let id = (resolve.stream_id)(ctx, stream as usize, per_thread);
            let slot = rec
                .mark_slot_of(id, device, handle)
                .map_or(0, |s| u64::from(s) + 1);
            (u64::from(id) + 1) | (slot << 32)
        });
    let stream_id = (cached as u32).wrapping_sub(1);
    let mark_slot = ((cached >> 32) as u32).checked_sub(1);
    let (name_id, graph_id) = if graph_exec.is_null() {
        (function_name_id(rec, t, epoch, f), 0)
    } else {
        (
            graph_launch_name(rec),
            t.graphs.get_or(graph_exec as usize, epoch, || {
                (resolve.graph_id)(graph_exec as usize).into()
            }) as u32,
        )
    };
    phases.next(crate::self_cost::Phase::Resolve);
    rec.launch_named_in(
        t,
        name_id,
        Launch {
            correlation,
            launch_ns: now,
            stream: handle,
            stream_id,
            device,
            api,
            grid,
            block,
            cluster: [1, 1, 1],
            graph_id,
            ..Launch::default()
        },
        ctx as u64,
        mark_slot,
        marks,
    );
    phases.next(crate::self_cost::Phase::Record);
    true
}

#[inline(always)]
fn after(t: &ThreadState, recorded: bool, result: u32) {
    t.inside.set(false);
    t.hook_records.set(false);
    if recorded && let Some(rec) = hot_recorder() {
        let mut phases = crate::self_cost::Phases::start_if(HOT.self_cost.load(Ordering::Relaxed));
        rec.api_exit_in(t, result == 0, hot_marks());
        phases.next(crate::self_cost::Phase::Exit);
    }
}

/// One hooked call: `before` (whether it recorded), the driver's `call`, then the exit —
/// the shim's parts under `catch_unwind`, so nothing unwinds into the caller; the thread's
/// state looked up once for both. Under `crate::self_cost` the shim's part on both sides is
/// timed.
#[inline(always)]
fn hooked(before: impl FnOnce(&ThreadState) -> bool, call: impl FnOnce() -> u32) -> u32 {
    thread::with(|t| {
        let t0 = HOT
            .self_cost
            .load(Ordering::Relaxed)
            .then(crate::self_cost::tsc);
        let recorded =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| before(t))).unwrap_or(false);
        let t1 = t0.map(|_| crate::self_cost::tsc());
        let r = call();
        let t2 = t0.map(|_| crate::self_cost::tsc());
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| after(t, recorded, r)));
        if let (true, Some(t0), Some(t1), Some(t2)) = (recorded, t0, t1, t2) {
            let t3 = crate::self_cost::tsc();
            crate::self_cost::launch(t1.wrapping_sub(t0).wrapping_add(t3.wrapping_sub(t2)));
        }
        r
    })
}

fn original(entry: Entry) -> usize {
    HOT.original[entry as usize].load(Ordering::Acquire)
}

/// `cuLaunchKernel` and `cuLaunchCooperativeKernel` (the same arguments, less `extra`).
macro_rules! launch_hook {
    ($name:ident, $entry:expr, $fn_ty:ty $(, $tail:ident)*) => {
        unsafe extern "C" fn $name(
            f: *mut c_void,
            gx: u32,
            gy: u32,
            gz: u32,
            bx: u32,
            by: u32,
            bz: u32,
            shmem: u32,
            stream: *mut c_void,
            params: *mut *mut c_void,
            $($tail: *mut *mut c_void,)*
        ) -> u32 {
            hooked(
                |t| {
                    before(
                        t,
                        $entry,
                        f,
                        [gx, gy, gz],
                        [bx, by, bz],
                        stream,
                        std::ptr::null_mut(),
                    )
                },
                // SAFETY: the trampoline to the original, which has this signature.
                || unsafe {
                    std::mem::transmute::<usize, $fn_ty>(original($entry))(
                        f, gx, gy, gz, bx, by, bz, shmem, stream, params $(, $tail)*
                    )
                },
            )
        }
    };
}

macro_rules! launch_ex_hook {
    ($name:ident, $entry:expr) => {
        unsafe extern "C" fn $name(
            config: *const cupti_sys::CUlaunchConfig,
            f: *mut c_void,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> u32 {
            hooked(
                // SAFETY: the caller's config, valid for the call (null is the driver's to
                // refuse).
                |t| match unsafe { config.as_ref() } {
                    Some(c) => before(
                        t,
                        $entry,
                        f,
                        [c.gridDimX, c.gridDimY, c.gridDimZ],
                        [c.blockDimX, c.blockDimY, c.blockDimZ],
                        c.hStream.cast(),
                        std::ptr::null_mut(),
                    ),
                    None => false,
                },
                // SAFETY: the trampoline to the original, which has this signature.
                || unsafe {
                    std::mem::transmute::<usize, LaunchExFn>(original($entry))(
                        config, f, params, extra,
                    )
                },
            )
        }
    };
}

macro_rules! graph_hook {
    ($name:ident, $entry:expr) => {
        unsafe extern "C" fn $name(exec: *mut c_void, stream: *mut c_void) -> u32 {
            hooked(
                |t| {
                    before(
                        t,
                        $entry,
                        std::ptr::null_mut(),
                        [0; 3],
                        [0; 3],
                        stream,
                        exec,
                    )
                },
                // SAFETY: the trampoline to the original, which has this signature.
                || unsafe { std::mem::transmute::<usize, GraphFn>(original($entry))(exec, stream) },
            )
        }
    };
}

launch_hook!(launch, Entry::Launch, LaunchFn, extra);
launch_hook!(launch_ptsz, Entry::LaunchPtsz, LaunchFn, extra);
launch_ex_hook!(launch_ex, Entry::LaunchEx);
launch_ex_hook!(launch_ex_ptsz, Entry::LaunchExPtsz);
launch_hook!(cooperative, Entry::Cooperative, CooperativeFn);
launch_hook!(cooperative_ptsz, Entry::CooperativePtsz, CooperativeFn);
graph_hook!(graph, Entry::Graph);
graph_hook!(graph_ptsz, Entry::GraphPtsz);

/// Our hooks' addresses, in `ENTRIES` order.
pub(super) fn addresses() -> [usize; 8] {
    [
        launch as *const () as usize,
        launch_ptsz as *const () as usize,
        launch_ex as *const () as usize,
        launch_ex_ptsz as *const () as usize,
        cooperative as *const () as usize,
        cooperative_ptsz as *const () as usize,
        graph as *const () as usize,
        graph_ptsz as *const () as usize,
    ]
}
