//! The rest of what the marks mode needs from the driver, hooked like the launches
//! (`crate::launch_hooks`) so that CUPTI is not loaded at all: measured on the H200
//! (BENCHMARKS.md, the recorder's price), initialising CUPTI — one `cuptiActivityRegisterTimestampCallback`,
//! nothing enabled — cost +12.6% on the launch-bound CUDA-graph loop (~160 ns per kernel
//! node), and a subscriber with its callbacks ~+18% there; with CUPTI loaded but never called,
//! +0.1%.
//!
//! - synchronizes and copies: the thread is inside them since when (the host view), and a
//!   returned synchronize retires the launches before it;
//! - stream captures beginning and ending: marks stay clear of captures;
//! - streams, contexts, modules and executable graphs destroyed: idle marks leave them
//!   alone, cached handles are dropped;
//! - graphs instantiated: their kernel nodes go into the journal's graph table, so a stuck
//!   graph launch is named with its kernels.
//!
//! Every entry point here takes at most six integer arguments, so one wrapper shape passes
//! any of them through (the System V ABI ignores unused argument registers).

use std::{
    ffi::{CStr, c_void},
    sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
};

use probe_common::{api, journal::ALL_STREAMS};

use super::hot;
use crate::{driver, marks, record};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// Synchronize of the stream in argument 0.
    StreamSync,
    /// Synchronize of the whole context.
    CtxSync,
    /// A call the host can wait in (event synchronize, synchronous copies).
    Wait,
    CaptureBegin,
    CaptureEnd,
    StreamDestroy,
    CtxDestroy,
    /// Primary context released or reset (argument 0 is a device, not a context).
    PrimaryRelease,
    ModuleUnload,
    GraphExecDestroy,
    /// Argument 0: out-pointer to the executable graph, argument 1: the graph.
    Instantiate,
}

const CALLS: &[(&CStr, Kind)] = &[
    (c"cuStreamSynchronize", Kind::StreamSync),
    (c"cuStreamSynchronize_ptsz", Kind::StreamSync),
    (c"cuCtxSynchronize", Kind::CtxSync),
    (c"cuCtxSynchronize_v2", Kind::CtxSync),
    (c"cuEventSynchronize", Kind::Wait),
    (c"cuMemcpy", Kind::Wait),
    (c"cuMemcpyHtoD_v2", Kind::Wait),
    (c"cuMemcpyDtoH_v2", Kind::Wait),
    (c"cuMemcpyDtoD_v2", Kind::Wait),
    (c"cuStreamBeginCapture", Kind::CaptureBegin),
    (c"cuStreamBeginCapture_ptsz", Kind::CaptureBegin),
    (c"cuStreamBeginCapture_v2", Kind::CaptureBegin),
    (c"cuStreamBeginCapture_v2_ptsz", Kind::CaptureBegin),
    (c"cuStreamBeginCaptureToGraph", Kind::CaptureBegin),
    (c"cuStreamBeginCaptureToGraph_ptsz", Kind::CaptureBegin),
    (c"cuStreamEndCapture", Kind::CaptureEnd),
    (c"cuStreamEndCapture_ptsz", Kind::CaptureEnd),
    (c"cuStreamDestroy", Kind::StreamDestroy),
    (c"cuStreamDestroy_v2", Kind::StreamDestroy),
    (c"cuCtxDestroy", Kind::CtxDestroy),
    (c"cuCtxDestroy_v2", Kind::CtxDestroy),
    (c"cuDevicePrimaryCtxRelease", Kind::PrimaryRelease),
    (c"cuDevicePrimaryCtxRelease_v2", Kind::PrimaryRelease),
    (c"cuDevicePrimaryCtxReset", Kind::PrimaryRelease),
    (c"cuDevicePrimaryCtxReset_v2", Kind::PrimaryRelease),
    (c"cuModuleUnload", Kind::ModuleUnload),
    (c"cuLibraryUnload", Kind::ModuleUnload),
    (c"cuGraphExecDestroy", Kind::GraphExecDestroy),
    (c"cuGraphInstantiate", Kind::Instantiate),
    (c"cuGraphInstantiate_v2", Kind::Instantiate),
    (c"cuGraphInstantiateWithFlags", Kind::Instantiate),
    (c"cuGraphInstantiateWithParams", Kind::Instantiate),
    (c"cuGraphInstantiateWithParams_ptsz", Kind::Instantiate),
];

pub const N: usize = 33;
const _: () = assert!(CALLS.len() == N);
static ORIGINAL: [AtomicUsize; N] = [const { AtomicUsize::new(0) }; N];
/// `probe_common::api` ids (u32::MAX: not a traced API).
static API: [AtomicU32; N] = [const { AtomicU32::new(u32::MAX) }; N];
/// Which APIs (by `probe_common::api` id) a call hook records: the simulated driver's own
/// callbacks leave those to the hooks.
static COVERED: [AtomicBool; 64] = [const { AtomicBool::new(false) }; 64];

type Generic = unsafe extern "C" fn(usize, usize, usize, usize, usize, usize) -> u32;

/// The entry points to hook: (name, our wrapper, index for `installed`).
pub fn entries() -> impl Iterator<Item = (&'static CStr, usize, usize)> {
    CALLS
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (*name, WRAPPERS[i] as *const () as usize, i))
}

/// Entry `i` is patched; `trampoline` calls its original.
pub fn installed(i: usize, trampoline: usize) {
    ORIGINAL[i].store(trampoline, Ordering::Release);
    if let Some(id) = CALLS
        .get(i)
        .and_then(|(name, _)| api::id_of(name.to_str().unwrap_or_default()))
    {
        API[i].store(id, Ordering::Relaxed);
        if let Some(c) = COVERED.get(id as usize) {
            c.store(true, Ordering::Relaxed);
        }
    }
}

/// Whether a call hook records API `api` now.
pub fn covers(api: u32) -> bool {
    hot::recording()
        && COVERED
            .get(api as usize)
            .is_some_and(|c| c.load(Ordering::Relaxed))
}

/// What `before` learned, for `after`: (correlation, recorded the entry).
type Token = (u64, bool);

fn before(i: usize, a: [usize; 6]) -> Token {
    // Bookkeeping (teardown, captures, graphs) whenever the hooks are in place, a lease
    // included: CUPTI attached late leaves it to them. Recording the call only while the
    // hooks record.
    if !hot::active() {
        return (0, false);
    }
    let Some(&(_, kind)) = CALLS.get(i) else {
        return (0, false);
    };
    match kind {
        Kind::StreamDestroy | Kind::CtxDestroy | Kind::PrimaryRelease => {
            hot::handles_changed();
            if let Some(m) = marks::get() {
                match kind {
                    Kind::StreamDestroy => m.forget(hot::current_context() as u64, a[0] as u64),
                    Kind::CtxDestroy => m.forget(a[0] as u64, 0),
                    _ => m.forget_all(),
                }
            }
        }
        Kind::ModuleUnload => hot::handles_changed(),
        Kind::GraphExecDestroy => {
            hot::handles_changed();
            forget_exec(a[0]);
        }
        _ => {}
    }
    let api = API[i].load(Ordering::Relaxed);
    if api == u32::MAX || !hot::recording() {
        return (0, false);
    }
    let Some(rec) = record::get() else {
        return (0, false);
    };
    let correlation = rec.next_correlation();
    rec.api_enter(api, correlation, crate::clock::monotonic_ns());
    (correlation, true)
}

fn after(i: usize, (correlation, entered): Token, a: [usize; 6], result: u32) {
    let Some(&(_, kind)) = CALLS.get(i) else {
        return;
    };
    let ok = result == 0;
    let rec = record::get();
    if entered && let Some(rec) = rec {
        rec.api_exit(ok);
        if ok {
            match kind {
                Kind::StreamSync => {
                    let per_thread = CALLS[i].0.to_bytes().ends_with(b"_ptsz");
                    rec.synced(correlation, marks::stream_handle(a[0] as u64, per_thread))
                }
                Kind::CtxSync => rec.synced(correlation, ALL_STREAMS),
                _ => {}
            }
        }
    }
    if !hot::active() {
        return;
    }
    match kind {
        Kind::CaptureBegin if ok => marks::capture(true),
        Kind::CaptureEnd => marks::capture(false),
        // SAFETY: on success argument 0 points at the new executable graph, argument 1 is
        // the graph it was instantiated from.
        Kind::Instantiate if ok && a[0] != 0 => unsafe {
            instantiated(*(a[0] as *const usize), a[1]);
        },
        _ => {}
    }
}

// Executable graphs: handle → our id, for the launch hook. Written at instantiation and
// destruction (rare), read lock-free on a graph launch (then cached per thread).
const EXECS: usize = 1024;
static EXEC_HANDLE: [AtomicUsize; EXECS] = [const { AtomicUsize::new(0) }; EXECS];
static EXEC_ID: [AtomicU32; EXECS] = [const { AtomicU32::new(0) }; EXECS];
static NEXT_GRAPH: AtomicU32 = AtomicU32::new(1);
static NEXT_NODE: AtomicU64 = AtomicU64::new(1);
/// A slot whose graph was destroyed (probing continues past it).
const GONE: usize = usize::MAX;

fn home(handle: usize) -> usize {
    (handle >> 4).wrapping_mul(0x9e37_79b9) % EXECS
}

/// Our id of an executable graph (0: not instantiated while we recorded).
pub fn exec_id(handle: usize) -> u32 {
    let h = home(handle);
    for k in 0..EXECS {
        let i = (h + k) % EXECS;
        match EXEC_HANDLE[i].load(Ordering::Acquire) {
            0 => return 0,
            x if x == handle => return EXEC_ID[i].load(Ordering::Acquire),
            _ => {}
        }
    }
    0
}

fn forget_exec(handle: usize) {
    let h = home(handle);
    for k in 0..EXECS {
        let i = (h + k) % EXECS;
        match EXEC_HANDLE[i].load(Ordering::Acquire) {
            0 => return,
            x if x == handle => {
                EXEC_ID[i].store(0, Ordering::Release);
                EXEC_HANDLE[i].store(GONE, Ordering::Release);
                return;
            }
            _ => {}
        }
    }
}

/// A graph was instantiated: its kernel nodes go into the journal's graph table under a new
/// graph id, the executable graph gets an id of ours. Allocates: instantiation is rare and
/// never on a launch path.
fn instantiated(exec: usize, graph: usize) {
    let (Some(rec), d) = (record::get(), driver::driver()) else {
        return;
    };
    let (Some(get_nodes), Some(node_type)) = (d.graph_get_nodes, d.graph_node_type) else {
        return;
    };
    let mut n = 0usize;
    // SAFETY: the graph just instantiated; a null array asks for the count.
    if unsafe { get_nodes(graph as *mut c_void, std::ptr::null_mut(), &mut n) } != 0 {
        return;
    }
    let mut nodes = vec![std::ptr::null_mut::<c_void>(); n];
    // SAFETY: an array of `n` node handles.
    if unsafe { get_nodes(graph as *mut c_void, nodes.as_mut_ptr(), &mut n) } != 0 {
        return;
    }
    let graph_id = NEXT_GRAPH.fetch_add(1, Ordering::Relaxed);
    for &node in nodes.iter().take(n) {
        let mut t = u32::MAX;
        // SAFETY: a node of the graph; out-pointer.
        if unsafe { node_type(node, &mut t) } != 0 || t != 0 {
            continue; // CU_GRAPH_NODE_TYPE_KERNEL = 0
        }
        let name = driver::kernel_node_name(node.cast());
        let node_id = NEXT_NODE.fetch_add(1, Ordering::Relaxed);
        rec.writer()
            .graph_kernel_node(node_id, 0, graph_id, rec.writer().intern(&name));
    }
    let exec_id = NEXT_GRAPH.fetch_add(1, Ordering::Relaxed);
    rec.graph_exec(exec_id, graph_id);
    let h = home(exec);
    for k in 0..EXECS {
        let i = (h + k) % EXECS;
        let cur = EXEC_HANDLE[i].load(Ordering::Acquire);
        if (cur == 0 || cur == GONE || cur == exec)
            && EXEC_HANDLE[i]
                .compare_exchange(cur, exec, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            EXEC_ID[i].store(exec_id, Ordering::Release);
            return;
        }
    }
}

macro_rules! call_hook {
    ($($name:ident = $i:expr),* $(,)?) => {
        $(
            unsafe extern "C" fn $name(a: usize, b: usize, c: usize, d: usize, e: usize, f: usize) -> u32 {
                let args = [a, b, c, d, e, f];
                let token = std::panic::catch_unwind(|| before($i, args)).unwrap_or((0, false));
                // SAFETY: the trampoline to the original; any of these entry points takes at
                // most six integer arguments (see the module docs).
                let r = unsafe {
                    std::mem::transmute::<usize, Generic>(ORIGINAL[$i].load(Ordering::Acquire))(a, b, c, d, e, f)
                };
                let _ = std::panic::catch_unwind(|| after($i, token, args, r));
                r
            }
        )*
        const WRAPPERS: [unsafe extern "C" fn(usize, usize, usize, usize, usize, usize) -> u32; N] = [$($name),*];
    };
}

call_hook!(
    h0 = 0,
    h1 = 1,
    h2 = 2,
    h3 = 3,
    h4 = 4,
    h5 = 5,
    h6 = 6,
    h7 = 7,
    h8 = 8,
    h9 = 9,
    h10 = 10,
    h11 = 11,
    h12 = 12,
    h13 = 13,
    h14 = 14,
    h15 = 15,
    h16 = 16,
    h17 = 17,
    h18 = 18,
    h19 = 19,
    h20 = 20,
    h21 = 21,
    h22 = 22,
    h23 = 23,
    h24 = 24,
    h25 = 25,
    h26 = 26,
    h27 = 27,
    h28 = 28,
    h29 = 29,
    h30 = 30,
    h31 = 31,
    h32 = 32,
);
