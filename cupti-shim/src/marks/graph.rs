//! Marks inside CUDA graph replays, so that a stuck replay is named to its node (issue 30), not
//! only "graph launch (exec N)". **Opt-in** (`WEDGEPROBE_GRAPH_MARK_EVERY=N`): measured on an
//! H100 (docs/runs/h100-2026-12-07-1336-graph-marks-price.md), a leaf write after every 4th
//! kernel node cost PyTorch's transformers decode graph (779 kernel nodes) +4.8% a replay
//! against +0.6% between two unmarked captures, every 8th +3.4%, and a launch-bound graph of
//! 100 tiny kernels +12%; a decode-shaped chain of 250 kernels of ~11 µs +0.9%. Not a price
//! to leave on by default; the default mode names the stuck graph launch and lists its nodes.
//! No cheaper node was found: event record nodes *in* the chain cost ~1.2 µs of GPU time a
//! mark against a leaf write's ~0.35 µs, and read back by `cuEventQuery` they lose a stuck
//! replay's position once a later replay of the exec is queued (H100,
//! docs/runs/h100-2026-12-07-1517-graph-event-marks.md).
//!
//! Stream marks go between launches, never inside a replay. Measured on the H200 (issue 30,
//! a chain of 256 kernels): a 64-bit write node *in the chain* after every kernel costs +33% /
//! +80% (6 µs / 2 µs kernels), ~2.3 µs of GPU time each; a write node as a *leaf* (it depends
//! on kernel i, nothing depends on it) ~0.15 µs: every 4th kernel +0.8% / +2.0%. So:
//!
//! - at instantiation (`hooks::calls`, before the driver's `cuGraphInstantiate*`), the user's
//!   graph gets one leaf write node after every `every`-th kernel of each branch (a chain of
//!   kernel nodes, each waiting for the one before) and after each branch's last, writing 1
//!   into the exec's own mark word, plus one reset node that sets the exec's words to 0, a
//!   root of its own that every leaf write also waits for (`put_nodes`: in the chain before
//!   the roots it cost +20% of a 100-node loop graph on the H200, 2026-12-07); the driver
//!   instantiates that; then the nodes are taken out of the
//!   user's graph again (the exec keeps them, the user's node handles stay valid for
//!   `cuGraphExecKernelNodeSetParams`);
//! - graph launches on a stream run in order, so replay N+1's reset runs only after replay N
//!   finished: while a replay is stuck, its words say which of its groups completed, and
//!   queued replays cannot touch them. Words start at 1 ("no replay started"), so a replay
//!   not yet begun is never taken for a stuck one;
//! - the words live in the journal (`Layout::graph_marks_off`, registered with the driver
//!   once): wedgeprobe reads them as it reads the rest.
//!
//! A stuck replay is then named to the group of ≤ `every` kernel nodes after the last set
//! word of each branch — exactly where a group holds one kernel (`every` = 1, or a branch's
//! last). Not covered, and said so: graphs with conditional nodes, device-launched graphs
//! (their replays start from the GPU, the reset could run concurrently), and the kernels
//! inside child graph nodes (a child graph node is marked as one node).
//!
//! Allocates and calls the driver: instantiation is rare and never on a launch path.

use std::{collections::HashMap, ffi::c_void, sync::Mutex};

use crate::{
    driver::{
        self, BatchMemOpNodeParams, MEM_OP_WRITE_VALUE_32, MEM_OP_WRITE_VALUE_64, MemOpWrite,
    },
    journal::{ExecMarks, Placement, Writer},
};

/// `CU_GRAPH_NODE_TYPE_*` (cuda.h).
const NODE_KERNEL: u32 = 0;
const NODE_CHILD_GRAPH: u32 = 4;
const NODE_CONDITIONAL: u32 = 13;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`.
pub const INSTANTIATE_DEVICE_LAUNCH: u64 = 4;
/// Words an exec may take: its reset is one batch node of `MAX_WORDS / 2` 64-bit writes.
const MAX_WORDS: usize = 512;
/// Kernels a mark covers when not set: none (off; see the module's doc for the price). Set,
/// 4 gives ≤ 4 candidates by construction.
const DEFAULT_EVERY: u32 = 0;
/// `CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP`.
const REGISTER_FLAGS: u32 = 0x01 | 0x02;
/// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`.
const ALREADY_REGISTERED: u32 = 712;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: u32 = 2;

/// What the graph marks keep between instantiations (touched only by instantiations, exec
/// updates and destructions — rare calls — so one lock).
struct State {
    /// Kernels a mark covers (`WEDGEPROBE_GRAPH_MARK_EVERY`, 1..=64; 0 = no graph marks),
    /// read once.
    every: Option<u32>,
    /// Free ranges of the journal's graph mark words (first, len); `None` until first used.
    free: Option<Vec<(u32, u32)>>,
    /// The words' device address once registered (0: not yet; u64::MAX: registration
    /// failed, graph marks off).
    device_base: u64,
    /// Marked execs the flush thread watches (`poll`).
    live: Vec<Live>,
    /// `SHAPE_*` bits: how the marks go in (a measurement switch; 0 by default).
    shape: u32,
}

/// Measurement variants (`crate::measure`, `wedgeprobe_shim_graph_marks`): the reset in the
/// chain before the roots (the first design), no reset, no leaf writes.
pub const SHAPE_RESET_IN_CHAIN: u32 = 1 << 8;
pub const SHAPE_NO_RESET: u32 = 1 << 9;
pub const SHAPE_NO_LEAVES: u32 = 1 << 10;
/// Leaf writes without the memory barrier the driver puts before a write by default
/// (`CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER`: a mark needs its kernel done, not its kernel's
/// data visible).
pub const SHAPE_NO_FENCE: u32 = 1 << 11;
/// Leaves as 4-byte memset nodes, or as event record nodes (nothing reads those: their price
/// only), instead of write nodes.
pub const SHAPE_MEMSET_LEAVES: u32 = 1 << 12;
pub const SHAPE_EVENT_LEAVES: u32 = 1 << 13;
/// Event record nodes *in* the chain, after the mark's node and before what followed it (no
/// reset, no leaves; nothing reads them yet: their price only). An event record on a stream
/// costs ~0 GPU time where a write costs ~2.1 µs (BENCHMARKS.md, the marks' GPU price).
pub const SHAPE_EVENT_IN_CHAIN: u32 = 1 << 14;
/// `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER`.
const WRITE_NO_MEMORY_BARRIER: u32 = 0x1;

/// A marked exec: its handle, its id in the journal, its words as the flush thread last saw
/// them, and since when.
struct Live {
    exec: usize,
    exec_id: u32,
    first: u32,
    seen: Vec<u32>,
    since_ns: u64,
}

static STATE: Mutex<State> = Mutex::new(State {
    every: None,
    free: None,
    device_base: 0,
    live: Vec::new(),
    shape: 0,
});

/// Exec `exec` (our id `exec_id`) replays with words `first..first+words`: kept for its
/// updates and destruction, and watched by the flush thread.
pub fn track(exec: usize, exec_id: u32, first: u32, words: u32) {
    if let Ok(mut s) = STATE.lock() {
        s.live
            .retain(|l| l.exec != exec && l.exec_id != exec_id && l.first != first);
        s.live.push(Live {
            exec,
            exec_id,
            first,
            seen: vec![1; words as usize],
            since_ns: 0,
        });
    }
}

/// Exec `exec`'s words (first, count), if its replays carry marks.
pub fn words_of(exec: usize) -> Option<(u32, u32)> {
    let s = STATE.lock().ok()?;
    let l = s.live.iter().find(|l| l.exec == exec)?;
    Some((l.first, l.seen.len() as u32))
}

/// Exec `exec` was destroyed: its words go back. A replay still running then may write them
/// once more — a 1 in another exec's fresh words, which start at 1 anyway.
pub fn forget(exec: usize) {
    if let Some((first, n)) = words_of(exec) {
        give_words(first, n);
    }
}

/// Flush thread, every tick: for each marked exec whose words changed since the last tick,
/// when (`GraphSlot::since_ns`: the last progress of a replay under way, within a tick). Reads
/// memory only (no driver call), and skips a tick rather than wait for an instantiation.
pub fn poll(w: &Writer, now_ns: u64) {
    let Ok(mut s) = STATE.try_lock() else {
        return;
    };
    for l in &mut s.live {
        let mut changed = false;
        for (k, seen) in l.seen.iter_mut().enumerate() {
            let v = w.graph_mark_word(l.first + k as u32);
            changed |= v != *seen;
            *seen = v;
        }
        if changed {
            l.since_ns = if l.seen.contains(&0) { now_ns } else { 0 };
            w.set_graph_exec_since(l.exec_id, l.since_ns);
        }
    }
}

/// Sets the kernels a mark covers and the `SHAPE_*` bits (a measurement switch,
/// `crate::measure`); the value before.
pub fn set_every(every: u32) -> u32 {
    STATE.lock().map_or(0, |mut s| {
        let before = self::every(&mut s) | s.shape;
        s.every = Some((every & 0xff).min(64));
        s.shape = every & 0xff00;
        before
    })
}

/// Whether graph marks are on (`WEDGEPROBE_GRAPH_MARK_EVERY` set to 1..=64): off, an
/// instantiation costs nothing more than before — its graph is not even read.
pub fn enabled() -> bool {
    STATE.lock().is_ok_and(|mut s| every(&mut s) != 0)
}

fn every(state: &mut State) -> u32 {
    *state.every.get_or_insert_with(|| {
        std::env::var("WEDGEPROBE_GRAPH_MARK_EVERY")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .map_or(DEFAULT_EVERY, |v| v.min(64))
    })
}

/// Where the marks go in one graph: its marked nodes (kernel and child graph nodes) in launch
/// order, the node each mark word follows, the roots the reset precedes.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// (node, is a kernel node, placement without dimensions).
    pub nodes: Vec<(usize, bool, Placement)>,
    /// Mark word k (relative) follows node `marks[k]`.
    pub marks: Vec<usize>,
    pub roots: Vec<usize>,
    pub branches: u32,
}

/// What the planner needs of a graph: its nodes with their types, and its edges.
pub struct Shape {
    pub nodes: Vec<(usize, u32)>,
    pub edges: Vec<(usize, usize)>,
}

/// Places marks in a graph of this shape, `every` marked nodes a mark at most (doubled until
/// the words fit `MAX_WORDS`). `Err` says why the graph gets none.
pub fn plan(shape: &Shape, every: u32) -> Result<Plan, &'static str> {
    if every == 0 {
        return Err("graph marks off (WEDGEPROBE_GRAPH_MARK_EVERY=0)");
    }
    if shape.nodes.iter().any(|&(_, t)| t == NODE_CONDITIONAL) {
        return Err("a graph with conditional nodes is not covered by graph marks");
    }
    let index: HashMap<usize, usize> = shape
        .nodes
        .iter()
        .enumerate()
        .map(|(i, &(n, _))| (n, i))
        .collect();
    let n = shape.nodes.len();
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(from, to) in &shape.edges {
        let (Some(&f), Some(&t)) = (index.get(&from), index.get(&to)) else {
            return Err("an edge names a node the graph does not list");
        };
        preds[t].push(f);
        succs[f].push(t);
    }
    // Kahn's order, ties by the driver's node order (stable: a captured graph's order).
    let mut indegree: Vec<usize> = preds.iter().map(Vec::len).collect();
    let mut ready: std::collections::BTreeSet<usize> =
        (0..n).filter(|&i| indegree[i] == 0).collect();
    let roots: Vec<usize> = ready.iter().map(|&i| shape.nodes[i].0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &s in &succs[i] {
            indegree[s] -= 1;
            if indegree[s] == 0 {
                ready.insert(s);
            }
        }
    }
    if order.len() != n {
        return Err("the graph has a cycle");
    }
    let marked = |i: usize| matches!(shape.nodes[i].1, NODE_KERNEL | NODE_CHILD_GRAPH);
    // Per node: the marked nodes it waits for directly (through unmarked nodes).
    let mut frontier: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut branch_of: Vec<usize> = vec![usize::MAX; n];
    let mut branches: Vec<Vec<usize>> = Vec::new();
    for &i in &order {
        let mut f: Vec<usize> = Vec::new();
        for &p in &preds[i] {
            if marked(p) {
                f.push(p);
            } else {
                f.extend_from_slice(&frontier[p]);
            }
        }
        f.sort_unstable();
        f.dedup();
        if marked(i) {
            // A node continues its one predecessor's branch when that predecessor is still
            // the branch's last: then each node of a branch waits for the one before.
            let b = match f.as_slice() {
                [p] if branches[branch_of[*p]].last() == Some(p) => branch_of[*p],
                _ => {
                    branches.push(Vec::new());
                    branches.len() - 1
                }
            };
            branch_of[i] = b;
            branches[b].push(i);
        }
        frontier[i] = f;
    }
    let mut every = every as usize;
    while branches
        .iter()
        .map(|b| b.len().div_ceil(every))
        .sum::<usize>()
        > MAX_WORDS
    {
        every *= 2;
    }
    let mut placement: HashMap<usize, Placement> = HashMap::new();
    let mut marks = Vec::new();
    for (b, nodes) in branches.iter().enumerate() {
        for group in nodes.chunks(every) {
            marks.push(*group.last().unwrap_or(&0));
            for &i in group {
                placement.insert(
                    i,
                    Placement {
                        branch: b as u32,
                        mark: marks.len() as u32,
                        ..Placement::default()
                    },
                );
            }
        }
    }
    let mut position = 0u32;
    let nodes = order
        .iter()
        .filter(|&&i| marked(i))
        .map(|&i| {
            position += 1;
            let p = Placement {
                position,
                ..placement.get(&i).copied().unwrap_or_default()
            };
            (shape.nodes[i].0, shape.nodes[i].1 == NODE_KERNEL, p)
        })
        .collect();
    Ok(Plan {
        nodes,
        marks: marks.iter().map(|&i| shape.nodes[i].0).collect(),
        roots,
        branches: branches.len() as u32,
    })
}

/// The graph's nodes with their types (`CU_GRAPH_NODE_TYPE_*`), in the driver's order.
pub fn nodes_of(graph: usize) -> Result<Vec<(usize, u32)>, &'static str> {
    let d = driver::driver();
    let (Some(get_nodes), Some(node_type)) = (d.graph_get_nodes, d.graph_node_type) else {
        return Err("libcuda lacks cuGraphGetNodes or cuGraphNodeGetType");
    };
    let g = graph as *mut c_void;
    let mut n = 0usize;
    // SAFETY: a graph handle the caller passed to the driver; a null array asks for the count.
    if unsafe { get_nodes(g, std::ptr::null_mut(), &mut n) } != 0 {
        return Err("cuGraphGetNodes failed");
    }
    let mut nodes = vec![std::ptr::null_mut::<c_void>(); n];
    // SAFETY: an array of `n` node handles.
    if n > 0 && unsafe { get_nodes(g, nodes.as_mut_ptr(), &mut n) } != 0 {
        return Err("cuGraphGetNodes failed");
    }
    nodes.truncate(n);
    let mut typed = Vec::with_capacity(n);
    for &node in &nodes {
        let mut t = u32::MAX;
        // SAFETY: a node of the graph; out-pointer.
        if unsafe { node_type(node, &mut t) } != 0 {
            return Err("cuGraphNodeGetType failed");
        }
        typed.push((node as usize, t));
    }
    Ok(typed)
}

/// The graph's nodes and edges as the driver reports them.
pub fn shape_of(graph: usize) -> Result<Shape, &'static str> {
    let typed = nodes_of(graph)?;
    let g = graph as *mut c_void;
    let (from, to, _) = edges_with_data(g)?;
    let edges = from
        .iter()
        .zip(&to)
        .map(|(&f, &t)| (f as usize, t as usize))
        .collect();
    Ok(Shape {
        nodes: typed,
        edges,
    })
}

/// Takes `n` words (rounded up to an even count, at an even index: the reset writes 64 bits).
fn take_words(state: &mut State, w: &Writer, n: u32) -> Option<u32> {
    let n = n.div_ceil(2) * 2;
    let free = state
        .free
        .get_or_insert_with(|| vec![(0, w.graph_mark_words().1)]);
    let i = free.iter().position(|&(_, len)| len >= n)?;
    let (first, len) = free[i];
    if len == n {
        free.remove(i);
    } else {
        free[i] = (first + n, len - n);
    }
    Some(first)
}

/// Gives words back (an exec destroyed, or an instantiation that failed).
pub fn give_words(first: u32, n: u32) {
    let n = n.div_ceil(2) * 2;
    if n == 0 {
        return;
    }
    let Ok(mut state) = STATE.lock() else {
        return;
    };
    state.live.retain(|l| l.first != first);
    let Some(free) = state.free.as_mut() else {
        return;
    };
    free.push((first, n));
    free.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::with_capacity(free.len());
    for &(f, l) in free.iter() {
        match merged.last_mut() {
            Some((mf, ml)) if *mf + *ml == f => *ml += l,
            _ => merged.push((f, l)),
        }
    }
    *free = merged;
}

/// The words' device address, registering them with the driver the first time (this thread's
/// capture mode relaxed for the call, so a capture elsewhere is never invalidated).
fn device_base(state: &mut State, w: &Writer) -> Result<u64, &'static str> {
    match state.device_base {
        0 => {}
        u64::MAX => return Err("graph marks off: registering their words failed"),
        base => return Ok(base),
    }
    let d = driver::driver();
    let (Some(register), Some(dev_ptr), Some(exchange)) = (
        d.host_register,
        d.host_device_pointer,
        d.exchange_capture_mode,
    ) else {
        state.device_base = u64::MAX;
        return Err("graph marks off: libcuda lacks cuMemHostRegister_v2");
    };
    let (host, words) = w.graph_mark_words();
    let mut mode = CAPTURE_MODE_RELAXED;
    // SAFETY: an in/out pointer to a valid mode; restored below.
    let relaxed = unsafe { exchange(&mut mode) } == 0;
    // SAFETY: the journal's page-aligned word section, mapped for the process's life.
    let r = unsafe { register(host.cast(), words as usize * 4, REGISTER_FLAGS) };
    let mut base = 0u64;
    let ok = (r == 0 || r == ALREADY_REGISTERED)
        // SAFETY: registered host memory; out-pointer.
        && unsafe { dev_ptr(&mut base, host.cast(), 0) } == 0
        && base != 0;
    if relaxed {
        // SAFETY: restores the mode this thread had.
        unsafe { exchange(&mut mode) };
    }
    if !ok {
        state.device_base = u64::MAX;
        return Err("graph marks off: cuMemHostRegister of their words failed");
    }
    state.device_base = base;
    Ok(base)
}

/// Marks added to a user's graph for one instantiation (or exec update): taken out again
/// with `remove` once the driver has built the exec.
#[derive(Debug)]
pub struct Added {
    pub graph: usize,
    pub plan: Plan,
    pub first: u32,
    pub words: u32,
    nodes: Vec<usize>,
    /// The user's edges our in-chain nodes were put into (`SHAPE_EVENT_IN_CHAIN`): given back
    /// by `remove`.
    rerouted: Vec<(usize, usize)>,
}

impl Added {
    pub fn marks(&self) -> ExecMarks {
        ExecMarks {
            first: self.first,
            words: self.words,
            branches: self.plan.branches,
        }
    }

    /// Takes our nodes out of the user's graph.
    pub fn remove(&mut self) {
        if let Some(destroy) = driver::driver().graph_destroy_node {
            for &n in &self.nodes {
                // SAFETY: a node we added to the graph and nothing else references.
                unsafe { destroy(n as *mut c_void) };
            }
        }
        self.nodes.clear();
        if let Some(add_deps) = driver::driver().graph_add_dependencies {
            for &(from, to) in &self.rerouted {
                let (f, t) = (from as *mut c_void, to as *mut c_void);
                // SAFETY: two nodes of the user's graph, the edge they had before.
                unsafe { add_deps(self.graph as *mut c_void, &f, &t, 1) };
            }
        }
        self.rerouted.clear();
    }
}

/// Adds marks to `graph` before it is instantiated: into fresh words (`reuse: None`), or into
/// an exec's words (`Some((first, words))`: a `cuGraphExecUpdate` of a marked exec, whose
/// topology the update must find again — `Err` when the plan does not come out the same).
pub fn add(
    w: &Writer,
    graph: usize,
    ctx: usize,
    reuse: Option<(u32, u32)>,
) -> Result<Added, &'static str> {
    let mut state = STATE
        .lock()
        .map_err(|_| "graph marks off: their lock was poisoned")?;
    let plan = plan(&shape_of(graph)?, every(&mut state))?;
    let words = plan.marks.len() as u32;
    if words == 0 {
        return Err("no kernel nodes to mark");
    }
    let base = device_base(&mut state, w)?;
    let first = match reuse {
        Some((first, n)) if n == words => first,
        Some(_) => return Err("the updated graph's marks do not match the exec's"),
        None => {
            let first =
                take_words(&mut state, w, words).ok_or("graph marks full: no words left")?;
            w.set_graph_mark_words(first, words, 1);
            first
        }
    };
    let shape = state.shape;
    drop(state);
    let mut added = Added {
        graph,
        plan,
        first,
        words,
        nodes: Vec::new(),
        rerouted: Vec::new(),
    };
    if let Err(e) = put_nodes(&mut added, base, ctx, shape) {
        added.remove();
        if reuse.is_none() {
            give_words(first, words);
        }
        return Err(e);
    }
    Ok(added)
}

/// The reset and the leaf writes into the user's graph. The reset is a root of its own that
/// every leaf write waits for, beside the kernels, not in their chain: replay N+1 begins only
/// after replay N (its writes included) ended, so the reset still comes between replay N's
/// writes and N+1's — and its writes are off the kernels' path.
fn put_nodes(a: &mut Added, base: u64, ctx: usize, shape: u32) -> Result<(), &'static str> {
    let d = driver::driver();
    let (Some(add_memop), Some(add_deps)) =
        (d.graph_add_batch_mem_op_node, d.graph_add_dependencies)
    else {
        return Err("libcuda lacks cuGraphAddBatchMemOpNode or cuGraphAddDependencies");
    };
    if shape & SHAPE_EVENT_IN_CHAIN != 0 {
        return events_in_chain(a);
    }
    let word = |k: u32| base + 4 * u64::from(a.first + k);
    let g = a.graph as *mut c_void;
    let add = |ops: &[MemOpWrite], deps: &[usize]| -> Result<usize, &'static str> {
        let params = BatchMemOpNodeParams {
            ctx: ctx as *mut c_void,
            count: ops.len() as u32,
            ops: ops.as_ptr(),
            flags: 0,
        };
        let mut node: *mut c_void = std::ptr::null_mut();
        // SAFETY: the user's graph (not being instantiated yet), handles of its nodes, ops
        // writing the journal's registered words.
        let r = unsafe { add_memop(&mut node, g, deps.as_ptr().cast(), deps.len(), &params) };
        if r != 0 || node.is_null() {
            return Err("cuGraphAddBatchMemOpNode failed");
        }
        Ok(node as usize)
    };
    let reset: Vec<MemOpWrite> = (0..a.words.div_ceil(2))
        .map(|k| MemOpWrite {
            operation: MEM_OP_WRITE_VALUE_64,
            address: word(2 * k),
            ..MemOpWrite::default()
        })
        .collect();
    let reset_node = if shape & SHAPE_NO_RESET == 0 {
        let n = add(&reset, &[])?;
        a.nodes.push(n);
        Some(n)
    } else {
        None
    };
    let from = vec![reset_node.unwrap_or(0); a.plan.roots.len()];
    if shape & SHAPE_RESET_IN_CHAIN != 0
        && reset_node.is_some()
        && !a.plan.roots.is_empty()
        // SAFETY: nodes of the graph, `roots.len()` of each.
        && unsafe {
            add_deps(
                g,
                from.as_ptr().cast(),
                a.plan.roots.as_ptr().cast(),
                from.len(),
            )
        } != 0
    {
        return Err("cuGraphAddDependencies failed");
    }
    if shape & SHAPE_NO_LEAVES != 0 {
        return Ok(());
    }
    for k in 0..a.words {
        let op = MemOpWrite {
            operation: MEM_OP_WRITE_VALUE_32,
            address: word(k),
            value: 1,
            flags: if shape & SHAPE_NO_FENCE != 0 {
                WRITE_NO_MEMORY_BARRIER
            } else {
                0
            },
            ..MemOpWrite::default()
        };
        let after = a.plan.marks[k as usize];
        if shape & (SHAPE_MEMSET_LEAVES | SHAPE_EVENT_LEAVES) != 0 {
            a.nodes
                .push(measured_leaf(a.graph, after, word(k), ctx, shape)?);
            continue;
        }
        let node = match reset_node {
            Some(r) if shape & SHAPE_RESET_IN_CHAIN == 0 => {
                add(std::slice::from_ref(&op), &[after, r])?
            }
            _ => add(std::slice::from_ref(&op), &[after])?,
        };
        a.nodes.push(node);
    }
    Ok(())
}

/// `SHAPE_EVENT_IN_CHAIN`: an event record node after each mark's node, taking over that
/// node's edges to what followed it (a node with an edge that carries data — a programmatic
/// dependency — is left unmarked: an event node cannot be its source).
fn events_in_chain(a: &mut Added) -> Result<(), &'static str> {
    let d = driver::driver();
    let (Some(add), Some(create), Some(add_deps), Some(remove_deps)) = (
        d.graph_add_event_record_node,
        d.event_create,
        d.graph_add_dependencies,
        d.graph_remove_dependencies,
    ) else {
        return Err("libcuda lacks cuGraphAddEventRecordNode or cuGraphRemoveDependencies");
    };
    let g = a.graph as *mut c_void;
    let (from, to, data) = edges_with_data(g)?;
    for k in 0..a.words as usize {
        let after = a.plan.marks[k];
        let outs: Vec<usize> = (0..from.len())
            .filter(|&e| from[e] as usize == after)
            .collect();
        if outs.iter().any(|&e| data[e] != [0; 8]) {
            continue;
        }
        let mut ev: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointer; CU_EVENT_DISABLE_TIMING (2). Leaked: a measurement only.
        if unsafe { create(&mut ev, 2) } != 0 {
            return Err("cuEventCreate failed");
        }
        let dep = after as *mut c_void;
        let mut node: *mut c_void = std::ptr::null_mut();
        // SAFETY: the user's graph, one of its nodes, an event we made.
        if unsafe { add(&mut node, g, &dep, 1, ev) } != 0 || node.is_null() {
            return Err("cuGraphAddEventRecordNode failed");
        }
        a.nodes.push(node as usize);
        for &e in &outs {
            // SAFETY: an edge of the user's graph (removed), then our node before its target.
            if unsafe { remove_deps(g, &from[e], &to[e], 1) } != 0 {
                return Err("cuGraphRemoveDependencies failed");
            }
            a.rerouted.push((after, to[e] as usize));
            // SAFETY: our node and a node of the user's graph.
            if unsafe { add_deps(g, &node, &to[e], 1) } != 0 {
                return Err("cuGraphAddDependencies failed");
            }
        }
    }
    Ok(())
}

/// The graph's edges and their data: through `cuGraphGetEdges_v2` where the driver has it (it
/// lists edges that carry data — a programmatic dependency is still an order for the
/// branches), else the CUDA 12 form (all-zero data).
#[allow(clippy::type_complexity)]
fn edges_with_data(
    g: *mut c_void,
) -> Result<(Vec<*mut c_void>, Vec<*mut c_void>, Vec<[u8; 8]>), &'static str> {
    let d = driver::driver();
    let null: *mut c_void = std::ptr::null_mut();
    let none: *mut *mut c_void = std::ptr::null_mut();
    let mut e = 0usize;
    let (mut from, mut to, mut data);
    if let Some(v2) = d.graph_get_edges_v2 {
        // SAFETY: null arrays ask for the count.
        if unsafe { v2(g, none, none, std::ptr::null_mut(), &mut e) } != 0 {
            return Err("cuGraphGetEdges_v2 failed");
        }
        (from, to, data) = (vec![null; e], vec![null; e], vec![[0u8; 8]; e]);
        if e > 0
            // SAFETY: three arrays of `e` entries (CUgraphEdgeData is 8 bytes).
            && unsafe { v2(g, from.as_mut_ptr(), to.as_mut_ptr(), data.as_mut_ptr(), &mut e) }
                != 0
        {
            return Err("cuGraphGetEdges_v2 failed");
        }
    } else {
        let Some(get_edges) = d.graph_get_edges else {
            return Err("libcuda lacks cuGraphGetEdges");
        };
        // SAFETY: null arrays ask for the count.
        if unsafe { get_edges(g, none, none, &mut e) } != 0 {
            return Err(
                "cuGraphGetEdges failed (a graph whose edges carry data, on a driver without cuGraphGetEdges_v2)",
            );
        }
        (from, to, data) = (vec![null; e], vec![null; e], vec![[0u8; 8]; e]);
        // SAFETY: two arrays of `e` handles.
        if e > 0 && unsafe { get_edges(g, from.as_mut_ptr(), to.as_mut_ptr(), &mut e) } != 0 {
            return Err("cuGraphGetEdges failed");
        }
    }
    from.truncate(e);
    to.truncate(e);
    data.truncate(e);
    Ok((from, to, data))
}

/// A leaf of another kind, for its price (`SHAPE_MEMSET_LEAVES`, `SHAPE_EVENT_LEAVES`).
fn measured_leaf(
    graph: usize,
    after: usize,
    word: u64,
    ctx: usize,
    shape: u32,
) -> Result<usize, &'static str> {
    let d = driver::driver();
    let g = graph as *mut c_void;
    let deps = [after as *mut c_void];
    let mut node: *mut c_void = std::ptr::null_mut();
    let r = if shape & SHAPE_MEMSET_LEAVES != 0 {
        let add = d
            .graph_add_memset_node
            .ok_or("libcuda lacks cuGraphAddMemsetNode")?;
        let p = driver::MemsetParams {
            dst: word,
            pitch: 0,
            value: 1,
            element_size: 4,
            width: 1,
            height: 1,
        };
        // SAFETY: the user's graph, one of its nodes, a memset of our registered word.
        unsafe { add(&mut node, g, deps.as_ptr(), 1, &p, ctx as *mut c_void) }
    } else {
        let (Some(add), Some(create)) = (d.graph_add_event_record_node, d.event_create) else {
            return Err("libcuda lacks cuGraphAddEventRecordNode");
        };
        let mut ev: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointer; CU_EVENT_DISABLE_TIMING (2). Leaked: a measurement only.
        if unsafe { create(&mut ev, 2) } != 0 {
            return Err("cuEventCreate failed");
        }
        // SAFETY: the user's graph, one of its nodes, an event we made.
        unsafe { add(&mut node, g, deps.as_ptr(), 1, ev) }
    };
    if r != 0 || node.is_null() {
        return Err("a measured leaf node (memset or event record) was refused");
    }
    Ok(node as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(nodes: &[(usize, u32)], edges: &[(usize, usize)]) -> Shape {
        Shape {
            nodes: nodes.to_vec(),
            edges: edges.to_vec(),
        }
    }

    fn chain(n: usize) -> Shape {
        let nodes: Vec<(usize, u32)> = (1..=n).map(|i| (i, NODE_KERNEL)).collect();
        let edges: Vec<(usize, usize)> = (1..n).map(|i| (i, i + 1)).collect();
        shape(&nodes, &edges)
    }

    #[test]
    fn a_chain_gets_a_mark_after_every_fourth_kernel_and_after_its_last() {
        let p = plan(&chain(10), 4).unwrap();
        assert_eq!(p.marks, vec![4, 8, 10]);
        assert_eq!(p.roots, vec![1]);
        assert_eq!(p.branches, 1);
        let marks: Vec<u32> = p.nodes.iter().map(|n| n.2.mark).collect();
        assert_eq!(marks, vec![1, 1, 1, 1, 2, 2, 2, 2, 3, 3]);
        let positions: Vec<u32> = p.nodes.iter().map(|n| n.2.position).collect();
        assert_eq!(positions, (1..=10).collect::<Vec<_>>());
    }

    #[test]
    fn a_fork_makes_branches_each_marked_on_its_own() {
        // 1 → {2 → 3, 4 → 5} → 6 (a join): three branches — [1,2,3], [4,5], [6].
        let k = NODE_KERNEL;
        let s = shape(
            &[(1, k), (2, k), (3, k), (4, k), (5, k), (6, k)],
            &[(1, 2), (2, 3), (1, 4), (4, 5), (3, 6), (5, 6)],
        );
        let p = plan(&s, 4).unwrap();
        assert_eq!(p.branches, 3);
        let by_node: HashMap<usize, Placement> = p.nodes.iter().map(|n| (n.0, n.2)).collect();
        assert_eq!(by_node[&2].branch, by_node[&3].branch);
        assert_eq!(by_node[&4].branch, by_node[&5].branch);
        assert_ne!(by_node[&3].branch, by_node[&5].branch);
        assert_ne!(by_node[&6].branch, by_node[&3].branch);
        assert_eq!(p.marks.len(), 3);
    }

    #[test]
    fn unmarked_nodes_between_kernels_keep_the_branch() {
        // kernel 1 → memset 2 → kernel 3: one branch of two kernels.
        let s = shape(
            &[(1, NODE_KERNEL), (2, 2), (3, NODE_KERNEL)],
            &[(1, 2), (2, 3)],
        );
        let p = plan(&s, 1).unwrap();
        assert_eq!(p.branches, 1);
        assert_eq!(p.marks, vec![1, 3]);
    }

    #[test]
    fn conditional_graphs_are_refused_and_huge_ones_grouped_to_fit() {
        let s = shape(&[(1, NODE_KERNEL), (2, NODE_CONDITIONAL)], &[(1, 2)]);
        assert!(plan(&s, 4).is_err());
        let p = plan(&chain(4000), 4).unwrap();
        assert!(p.marks.len() <= MAX_WORDS);
        assert_eq!(p.marks.last(), Some(&4000));
    }

    #[test]
    fn words_are_taken_even_and_merged_when_given_back() {
        let mut mem = vec![0u64; probe_common::journal::Layout::DEFAULT.total_size() as usize / 8];
        // SAFETY: zeroed, 8-aligned, large enough, outlives the writer.
        let w = unsafe {
            Writer::create(
                std::ptr::NonNull::new(mem.as_mut_ptr().cast()).unwrap(),
                probe_common::journal::Layout::DEFAULT,
                1,
                1,
                1,
            )
        };
        let take = |n| take_words(&mut STATE.lock().unwrap(), &w, n);
        let a = take(3).unwrap();
        let b = take(1).unwrap();
        assert_eq!(a % 2, 0);
        assert_eq!(b, a + 4);
        give_words(a, 3);
        give_words(b, 1);
        assert_eq!(take(6), Some(a));
        give_words(a, 6);
    }
}
