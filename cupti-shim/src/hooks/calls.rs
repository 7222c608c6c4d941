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
    collections::HashMap,
    ffi::CStr,
    sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering},
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
    /// Argument 0: the executable graph, argument 1: the graph it is updated from.
    ExecUpdate,
    /// Argument 0: an executable graph, 1: a node of its graph, 2: the node's new params
    /// (`cuGraphExecKernelNodeSetParams`: CUDA_KERNEL_NODE_PARAMS; `_v2`: the v2 layout;
    /// `cuGraphExecNodeSetParams`: CUgraphNodeParams).
    NodeSetParams,
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
    (c"cuGraphExecUpdate", Kind::ExecUpdate),
    (c"cuGraphExecUpdate_v2", Kind::ExecUpdate),
    (c"cuGraphExecKernelNodeSetParams", Kind::NodeSetParams),
    (c"cuGraphExecKernelNodeSetParams_v2", Kind::NodeSetParams),
    (c"cuGraphExecNodeSetParams", Kind::NodeSetParams),
];

pub const N: usize = 38;
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

/// What `before` learned, for `after`.
#[derive(Default)]
struct Token {
    /// A synchronize's: the id through which its return proves launches done
    /// (`Recorder::sync_floor`).
    sync_floor: u64,
    /// A synchronize's stream (`marks::stream_handle`; `ALL_STREAMS`: a context's).
    sync_stream: u64,
    /// The entry was recorded.
    entered: bool,
    /// Graph marks added to the user's graph for this instantiation or exec update.
    graph: Option<marks::graph::Added>,
}

fn before(i: usize, a: [usize; 6]) -> Token {
    // Bookkeeping (teardown, captures, graphs) whenever the hooks are in place, a lease
    // included: CUPTI attached late leaves it to them. Recording the call only while the
    // hooks record.
    let mut token = Token::default();
    if !hot::active() {
        return token;
    }
    let Some(&(_, kind)) = CALLS.get(i) else {
        return token;
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
        Kind::Instantiate | Kind::ExecUpdate => token.graph = mark_graph(i, kind, a),
        _ => {}
    }
    let api = API[i].load(Ordering::Relaxed);
    if api == u32::MAX || !hot::recording() {
        return token;
    }
    let Some(rec) = record::get() else {
        return token;
    };
    let correlation = rec.next_correlation();
    rec.api_enter(api, correlation, crate::clock::monotonic_ns());
    token.entered = true;
    match kind {
        Kind::StreamSync => {
            let per_thread = CALLS[i].0.to_bytes().ends_with(b"_ptsz");
            token.sync_stream = marks::stream_handle(a[0] as u64, per_thread);
            token.sync_floor = rec.sync_floor(correlation, token.sync_stream);
        }
        Kind::CtxSync => {
            token.sync_stream = ALL_STREAMS;
            token.sync_floor = rec.sync_floor(correlation, ALL_STREAMS);
        }
        _ => {}
    }
    token
}

fn after(i: usize, token: Token, a: [usize; 6], result: u32) {
    let Token {
        sync_floor,
        sync_stream,
        entered,
        graph: mut pending,
    } = token;
    let Some(&(_, kind)) = CALLS.get(i) else {
        return;
    };
    let ok = result == 0;
    let rec = record::get();
    if entered && let Some(rec) = rec {
        rec.api_exit(ok);
        if ok {
            match kind {
                Kind::StreamSync | Kind::CtxSync => rec.synced(sync_floor, sync_stream),
                _ => {}
            }
        }
    }
    // Graph marks added in `before` come out of the user's graph whatever happens next.
    if !hot::active() {
        if let Some(mut a) = pending.take() {
            a.remove();
        }
        return;
    }
    match kind {
        Kind::CaptureBegin if ok => marks::capture(true),
        Kind::CaptureEnd => marks::capture(false),
        // SAFETY: on success argument 0 points at the new executable graph, argument 1 is
        // the graph it was instantiated from.
        Kind::Instantiate if ok && a[0] != 0 => unsafe {
            instantiated(*(a[0] as *const usize), a[1], pending.take());
        },
        Kind::ExecUpdate if ok => updated(a[0], a[1], pending.take()),
        Kind::NodeSetParams if ok => node_set(CALLS[i].0.to_bytes(), a[0], a[1], a[2]),
        _ => {}
    }
    if let Some(mut a) = pending {
        a.remove();
        if kind == Kind::Instantiate {
            marks::graph::give_words(a.first, a.words);
        }
    }
}

// Executable graphs: handle → our id, for the launch hook. Written at instantiation and
// destruction (rare), read lock-free on a graph launch (then cached per thread).
// 16,384: a server's captured graphs number in the thousands (vLLM's piecewise graphs: ~67
// batch sizes × (layers + 1) pieces); 1,024 left the rest unnamed.
const EXECS: usize = 16384;
static EXEC_HANDLE: [AtomicUsize; EXECS] = [const { AtomicUsize::new(0) }; EXECS];
static EXEC_ID: [AtomicU32; EXECS] = [const { AtomicU32::new(0) }; EXECS];

/// The graph bookkeeping of instantiations and updates (rare calls, one lock): ids handed
/// out, the reasons already logged. (Each marked exec's words: `marks::graph`.)
struct Book {
    next_graph: u32,
    next_node: u64,
    logged: Vec<Vec<u8>>,
    /// Per live exec (its handle): each kernel node's handle in the user's graph and our node
    /// id in the journal — what a set-params call names the node by. Dropped with the exec.
    nodes: Option<HashMap<usize, Vec<(usize, u64)>>>,
}

static BOOK: std::sync::Mutex<Book> = std::sync::Mutex::new(Book {
    next_graph: 1,
    next_node: 1,
    logged: Vec::new(),
    nodes: None,
});

fn next_graph_id() -> u32 {
    BOOK.lock().map_or(0, |mut b| {
        b.next_graph += 1;
        b.next_graph - 1
    })
}

/// The first of `n` consecutive node ids (an exec's nodes are looked up by them).
fn next_node_ids(n: usize) -> u64 {
    BOOK.lock().map_or(0, |mut b| {
        b.next_node += n as u64;
        b.next_node - n as u64
    })
}
/// A slot whose graph was destroyed (probing continues past it).
const GONE: usize = usize::MAX;

fn home(handle: usize) -> usize {
    (handle >> 4).wrapping_mul(0x9e37_79b9) % EXECS
}

/// Our id of an executable graph (0: not instantiated while we recorded).
pub fn exec_id(handle: usize) -> u32 {
    exec_slot(handle).map_or(0, |i| EXEC_ID[i].load(Ordering::Acquire))
}

fn exec_slot(handle: usize) -> Option<usize> {
    let h = home(handle);
    for k in 0..EXECS {
        let i = (h + k) % EXECS;
        match EXEC_HANDLE[i].load(Ordering::Acquire) {
            0 => return None,
            x if x == handle => return Some(i),
            _ => {}
        }
    }
    None
}

fn forget_exec(handle: usize) {
    let h = home(handle);
    for k in 0..EXECS {
        let i = (h + k) % EXECS;
        match EXEC_HANDLE[i].load(Ordering::Acquire) {
            0 => return,
            x if x == handle => {
                let exec_id = EXEC_ID[i].swap(0, Ordering::AcqRel);
                if exec_id != 0
                    && let Some(rec) = record::get()
                {
                    rec.writer().graph_exec_gone(exec_id);
                }
                marks::graph::forget(handle);
                if let Ok(mut b) = BOOK.lock()
                    && let Some(nodes) = b.nodes.as_mut()
                {
                    nodes.remove(&handle);
                }
                EXEC_HANDLE[i].store(GONE, Ordering::Release);
                return;
            }
            _ => {}
        }
    }
}

/// Before an instantiation (or exec update) in the marks mode: adds graph marks to the user's
/// graph (`marks::graph`). Why a graph gets none is logged once per reason.
fn mark_graph(i: usize, kind: Kind, a: [usize; 6]) -> Option<marks::graph::Added> {
    let rec = record::get()?;
    if !hot::recording()
        || rec.record_mode() != probe_common::journal::RECORD_MARKS
        || a[1] == 0
        || !marks::graph::enabled()
    {
        return None;
    }
    let name = CALLS[i].0.to_bytes();
    let reuse = match kind {
        Kind::ExecUpdate => Some(marks::graph::words_of(a[0])?),
        _ => {
            let flags = if name.starts_with(b"cuGraphInstantiateWithFlags") {
                a[2] as u64
            } else if name.starts_with(b"cuGraphInstantiateWithParams") && a[2] != 0 {
                // SAFETY: argument 2 of cuGraphInstantiateWithParams points at its params,
                // whose first field is the flags (u64).
                unsafe { *(a[2] as *const u64) }
            } else {
                0
            };
            if flags & marks::graph::INSTANTIATE_DEVICE_LAUNCH != 0 {
                log_once(b"a device-launched graph is not covered by graph marks");
                return None;
            }
            None
        }
    };
    marks::graph::add(rec.writer(), a[1], hot::current_context(), reuse)
        .map_err(|why| log_once(why.as_bytes()))
        .ok()
}

/// The driver refused an instantiation with our marks in the graph: take them out, so the
/// caller can call it again as the user made it. Whether to.
fn retry_without_marks(i: usize, token: &mut Token, result: u32) -> bool {
    if result == 0
        || !matches!(
            CALLS.get(i),
            Some((_, Kind::Instantiate | Kind::ExecUpdate))
        )
    {
        return false;
    }
    let Some(mut added) = token.graph.take() else {
        return false;
    };
    added.remove();
    if matches!(CALLS[i].1, Kind::Instantiate) {
        marks::graph::give_words(added.first, added.words);
    }
    log_once(b"the driver refused a graph with graph marks; instantiated without them");
    true
}

/// One log line per distinct reason (a process instantiates hundreds of graphs).
fn log_once(why: &[u8]) {
    if let Ok(mut book) = BOOK.lock()
        && !book.logged.iter().any(|s| s == why)
    {
        book.logged.push(why.to_vec());
        crate::log_line(why);
    }
}

/// Kernel (and child graph) nodes of `graph` into the journal's graph table under a new
/// graph id, placed as the marks see them when `added` planned them, with consecutive node
/// ids. Returns the graph id, the first node id and how many, and each kernel node's handle
/// with its node id.
fn record_nodes(
    rec: &record::Recorder,
    graph: usize,
    added: Option<&marks::graph::Added>,
) -> Option<Recorded> {
    let graph_id = next_graph_id();
    let w = rec.writer();
    let mut ids = Vec::new();
    let first;
    let count;
    match added {
        Some(a) => {
            count = a.plan.nodes.len();
            first = next_node_ids(count);
            for (k, &(node, kernel, placement)) in a.plan.nodes.iter().enumerate() {
                let (name, (grid, block)) = if kernel {
                    (
                        driver::kernel_node_name(node as *mut _),
                        driver::kernel_node_dims(node as *mut _),
                    )
                } else {
                    (
                        b"(child graph node: its own kernels are not marked)".to_vec(),
                        ([0; 3], [0; 3]),
                    )
                };
                let node_id = first + k as u64;
                let placement = crate::journal::Placement {
                    grid,
                    block,
                    ..placement
                };
                w.graph_kernel_node_placed(node_id, 0, graph_id, w.intern(&name), placement);
                if kernel {
                    ids.push((node, node_id));
                }
            }
        }
        None => {
            // CU_GRAPH_NODE_TYPE_KERNEL = 0
            let kernels: Vec<usize> = marks::graph::nodes_of(graph)
                .ok()?
                .into_iter()
                .filter(|n| n.1 == 0)
                .map(|n| n.0)
                .collect();
            count = kernels.len();
            first = next_node_ids(count);
            for (k, node) in kernels.into_iter().enumerate() {
                let name = driver::kernel_node_name(node as *mut _);
                let node_id = first + k as u64;
                w.graph_kernel_node(node_id, 0, graph_id, w.intern(&name));
                ids.push((node, node_id));
            }
        }
    }
    Some(Recorded {
        graph_id,
        nodes: (first, count as u32),
        ids,
    })
}

/// What `record_nodes` wrote: the graph's id, its nodes' first id and count, each kernel
/// node's handle and id.
struct Recorded {
    graph_id: u32,
    nodes: (u64, u32),
    ids: Vec<(usize, u64)>,
}

/// Exec `exec`'s kernel nodes are `ids` (handle, node id) from now. After an update the
/// nodes of the graph first instantiated answer too, paired in order (the update kept the
/// topology): callers may go on naming those. At most those two sets are kept, however many
/// updates come (a server may update an exec every step).
fn remember_nodes(exec: usize, mut ids: Vec<(usize, u64)>, update: bool) {
    let Ok(mut b) = BOOK.lock() else {
        return;
    };
    let nodes = b.nodes.get_or_insert_with(HashMap::new);
    let n = ids.len();
    if update
        && let Some(before) = nodes.get(&exec)
        && before.len() >= n
    {
        // The last n: the first instantiation's nodes (or the only set there is).
        let firsts: Vec<(usize, u64)> = before[before.len() - n..]
            .iter()
            .zip(&ids)
            .filter(|((old, _), (new, _))| old != new)
            .map(|(&(old, _), &(_, id))| (old, id))
            .collect();
        ids.extend(firsts);
    }
    nodes.insert(exec, ids);
}

/// A kernel node of exec `exec` was given new params (`entry` names the call and so their
/// layout): the journal's node takes the kernel and dimensions it runs now.
fn node_set(entry: &[u8], exec: usize, node: usize, params: usize) {
    let Some(rec) = record::get() else {
        return;
    };
    if params == 0 {
        return;
    }
    // SAFETY: a plain C struct, all-zero is a valid value.
    let mut p: cupti_sys::CUDA_KERNEL_NODE_PARAMS_v2_st = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of_val(&p);
    let (from, len) = match entry {
        // CUgraphNodeParams: the type (CU_GRAPH_NODE_TYPE_KERNEL = 0), 12 bytes reserved,
        // then the kernel's params in the v2 layout (v3 is the same).
        // SAFETY: the driver accepted the call, so `params` points at a CUgraphNodeParams.
        b"cuGraphExecNodeSetParams" if unsafe { *(params as *const i32) } == 0 => {
            (params + 16, size)
        }
        b"cuGraphExecNodeSetParams" => return,
        b"cuGraphExecKernelNodeSetParams_v2" => (params, size),
        // CUDA 11's layout: no `kern` and `ctx` after `extra`.
        _ => (
            params,
            std::mem::offset_of!(cupti_sys::CUDA_KERNEL_NODE_PARAMS_v2_st, kern),
        ),
    };
    // SAFETY: `len` bytes of the params the driver accepted, into a struct at least as long.
    unsafe {
        std::ptr::copy_nonoverlapping(from as *const u8, (&raw mut p).cast::<u8>(), len);
    }
    let node_id = BOOK.lock().ok().and_then(|b| {
        b.nodes
            .as_ref()?
            .get(&exec)?
            .iter()
            .find(|&&(h, _)| h == node)
            .map(|&(_, id)| id)
    });
    let Some(node_id) = node_id else {
        return;
    };
    let w = rec.writer();
    let name = w.intern(&driver::kernel_params_name(&p));
    w.graph_kernel_node_set(
        node_id,
        name,
        [p.gridDimX, p.gridDimY, p.gridDimZ],
        [p.blockDimX, p.blockDimY, p.blockDimZ],
    );
}

/// A graph was instantiated: its kernel nodes go into the journal's graph table under a new
/// graph id, the executable graph gets an id of ours (and its graph marks, when `added`).
/// Allocates: instantiation is rare and never on a launch path.
fn instantiated(exec: usize, graph: usize, mut added: Option<marks::graph::Added>) {
    if let Some(a) = added.as_mut() {
        a.remove();
    }
    let Some(rec) = record::get() else {
        if let Some(a) = added {
            marks::graph::give_words(a.first, a.words);
        }
        return;
    };
    let Some(Recorded {
        graph_id,
        nodes,
        ids,
    }) = record_nodes(rec, graph, added.as_ref())
    else {
        if let Some(a) = added {
            marks::graph::give_words(a.first, a.words);
        }
        return;
    };
    let exec_id = next_graph_id();
    rec.writer()
        .graph_exec_marked(exec_id, graph_id, added.as_ref().map(|a| a.marks()), nodes);
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
            remember_nodes(exec, ids, false);
            if let Some(a) = &added {
                marks::debug(format_args!(
                    "graph marks: exec {exec_id}: {} marked nodes, {} branches, {} words from {}",
                    a.plan.nodes.len(),
                    a.plan.branches,
                    a.words,
                    a.first
                ));
            }
            if let Some(a) = added {
                marks::graph::track(exec, exec_id, a.first, a.words);
            }
            return;
        }
    }
    if let Some(a) = added {
        marks::graph::give_words(a.first, a.words);
    }
}

/// An exec was updated in place from `graph` (`cuGraphExecUpdate`): its nodes (kernels may
/// have changed) are recorded again under a new graph id; its id and mark words stay.
fn updated(exec: usize, graph: usize, mut added: Option<marks::graph::Added>) {
    if let Some(a) = added.as_mut() {
        a.remove();
    }
    let (Some(rec), Some(slot)) = (record::get(), exec_slot(exec)) else {
        return;
    };
    let exec_id = EXEC_ID[slot].load(Ordering::Acquire);
    if exec_id == 0 {
        return;
    }
    if let Some(r) = record_nodes(rec, graph, added.as_ref()) {
        // The nodes of the graph it ran before have ids of their own: their slots go back.
        rec.writer().graph_exec_nodes_gone(exec_id);
        rec.writer().graph_exec_marked(
            exec_id,
            r.graph_id,
            added.as_ref().map(|a| a.marks()),
            r.nodes,
        );
        remember_nodes(exec, r.ids, true);
    }
}

macro_rules! call_hook {
    ($($name:ident = $i:expr),* $(,)?) => {
        $(
            unsafe extern "C" fn $name(a: usize, b: usize, c: usize, d: usize, e: usize, f: usize) -> u32 {
                let args = [a, b, c, d, e, f];
                let mut token = std::panic::catch_unwind(|| before($i, args)).unwrap_or_default();
                // SAFETY: the trampoline to the original; any of these entry points takes at
                // most six integer arguments (see the module docs).
                let call = || unsafe {
                    std::mem::transmute::<usize, Generic>(ORIGINAL[$i].load(Ordering::Acquire))(a, b, c, d, e, f)
                };
                let mut r = call();
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    retry_without_marks($i, &mut token, r)
                }))
                .unwrap_or(false)
                {
                    r = call();
                }
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
    h33 = 33,
    h34 = 34,
    h35 = 35,
    h36 = 36,
    h37 = 37,
);
