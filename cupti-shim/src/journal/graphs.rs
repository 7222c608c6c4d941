//! The journal's CUDA graph table: which kernel each graph node runs and which graph an
//! executable graph was instantiated from, as CUPTI's resource callbacks report them. A stuck
//! graph launch is one in-flight launch for many kernels; with this table wedgeprobe can say
//! which of its kernel nodes have not completed.
//!
//! Written from resource callbacks (graph construction and instantiation, never per launch)
//! and read per completion record of a graph node (CUPTI's buffer thread): both off the
//! launch path. Same rules as the rest of the writer: lock-free, no allocation.

use core::{
    mem::size_of,
    sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release},
};

use probe_common::journal::{
    GRAPH_EXEC, GRAPH_EXEC_KEY, GRAPH_KERNEL_NODE, GraphSlot, drops, graph_probes,
};

use super::Writer;

const KEY: u64 = core::mem::offset_of!(GraphSlot, key) as u64;
const ORIGINAL: u64 = core::mem::offset_of!(GraphSlot, original) as u64;
const GRAPH_ID: u64 = core::mem::offset_of!(GraphSlot, graph_id) as u64;
const NAME_ID: u64 = core::mem::offset_of!(GraphSlot, name_id) as u64;
const KIND: u64 = core::mem::offset_of!(GraphSlot, kind) as u64;
const POSITION: u64 = core::mem::offset_of!(GraphSlot, position) as u64;
const BRANCH: u64 = core::mem::offset_of!(GraphSlot, branch) as u64;
const MARK: u64 = core::mem::offset_of!(GraphSlot, mark) as u64;
const GRID: u64 = core::mem::offset_of!(GraphSlot, grid) as u64;
const BLOCK: u64 = core::mem::offset_of!(GraphSlot, block) as u64;
const SINCE: u64 = core::mem::offset_of!(GraphSlot, since_ns) as u64;

/// Where a kernel node sits in its graph, as the graph marks see it (`GraphSlot`'s fields of
/// the same names); all zero when not known.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    pub position: u32,
    pub branch: u32,
    pub mark: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

/// An executable graph's mark words (`GraphSlot` of an exec): the first word's index, how
/// many, and how many branches its kernel nodes form.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecMarks {
    pub first: u32,
    pub words: u32,
    pub branches: u32,
}

impl Writer {
    fn graph_off(&self, i: u32) -> u64 {
        self.layout.graphs_off() + i as u64 * size_of::<GraphSlot>() as u64
    }

    /// The slot of `key`: `Ok(offset)` of an existing or newly claimed one (`claim`), `Err(())`
    /// when absent (lookup) or the table is full around its home (counted when claiming).
    /// Probed as readers probe (`graph_probes`).
    fn graph_slot(&self, key: u64, claim: bool) -> Result<(u64, bool), ()> {
        for i in graph_probes(key, self.layout.graphs_cap) {
            let off = self.graph_off(i);
            let slot_key = self.word(off + KEY);
            match slot_key.load(Acquire) {
                k if k == key => return Ok((off, false)),
                0 if !claim => return Err(()),
                0 => match slot_key.compare_exchange(0, key, AcqRel, Acquire) {
                    Ok(_) => return Ok((off, true)),
                    Err(k) if k == key => return Ok((off, false)),
                    Err(_) => {}
                },
                _ => {}
            }
        }
        if claim {
            self.count_drop(drops::GRAPHS_FULL);
        }
        Err(())
    }

    fn fill_graph_slot_placed(
        &self,
        off: u64,
        original: u64,
        graph_id: u32,
        name_id: u32,
        kind: u32,
        p: Placement,
    ) {
        self.half(off + KIND).store(0, Release);
        self.word(off + SINCE).store(0, Relaxed);
        self.half(off + POSITION).store(p.position, Relaxed);
        self.half(off + BRANCH).store(p.branch, Relaxed);
        self.half(off + MARK).store(p.mark, Relaxed);
        for k in 0..3u64 {
            self.half(off + GRID + 4 * k)
                .store(p.grid[k as usize], Relaxed);
            self.half(off + BLOCK + 4 * k)
                .store(p.block[k as usize], Relaxed);
        }
        self.word(off + ORIGINAL).store(original, Relaxed);
        self.half(off + GRAPH_ID).store(graph_id, Relaxed);
        self.half(off + NAME_ID).store(name_id, Relaxed);
        self.half(off + KIND).store(kind, Release);
    }

    /// A kernel node `node_id` of graph `graph_id` runs kernel `name_id`; `original` is the node
    /// it was cloned from (0 if created). A clone inherits its original's kernel when
    /// `name_id` is 0.
    pub fn graph_kernel_node(&self, node_id: u64, original: u64, graph_id: u32, name_id: u32) {
        self.graph_kernel_node_placed(node_id, original, graph_id, name_id, Placement::default());
    }

    /// `graph_kernel_node`, with where the node sits in its graph (the graph marks' view).
    pub fn graph_kernel_node_placed(
        &self,
        node_id: u64,
        original: u64,
        graph_id: u32,
        name_id: u32,
        placement: Placement,
    ) {
        if node_id == 0 || node_id & GRAPH_EXEC_KEY != 0 {
            return;
        }
        let name_id = if name_id == 0 && original != 0 {
            self.graph_node_name(original)
        } else {
            name_id
        };
        if let Ok((off, _)) = self.graph_slot(node_id, true) {
            self.fill_graph_slot_placed(
                off,
                original,
                graph_id,
                name_id,
                GRAPH_KERNEL_NODE,
                placement,
            );
        }
    }

    /// Kernel node `node_id` runs kernel `name_id` with these dimensions from now (an exec's
    /// node set by `cuGraphExecKernelNodeSetParams`). In place, kind untouched: a reader sees
    /// the node throughout, for one read perhaps with the new name and the old dimensions.
    pub fn graph_kernel_node_set(
        &self,
        node_id: u64,
        name_id: u32,
        grid: [u32; 3],
        block: [u32; 3],
    ) {
        let Ok((off, _)) = self.graph_slot(node_id, false) else {
            return;
        };
        if self.half(off + KIND).load(Acquire) != GRAPH_KERNEL_NODE {
            return;
        }
        for k in 0..3u64 {
            self.half(off + GRID + 4 * k)
                .store(grid[k as usize], Relaxed);
            self.half(off + BLOCK + 4 * k)
                .store(block[k as usize], Relaxed);
        }
        self.half(off + NAME_ID).store(name_id, Release);
    }

    /// Executable graph `exec_id` was instantiated from graph `graph_id`; returns its number of
    /// kernel nodes (the kernel nodes recorded for that graph), 0 if unknown.
    /// Counts the graph's kernel nodes in the whole table: for CUPTI's callbacks, whose node
    /// ids are CUPTI's (the hooks give theirs consecutive ids: `graph_exec_marked`).
    pub fn graph_exec(&self, exec_id: u32, graph_id: u32) -> u32 {
        let mut kernels = 0u32;
        for i in 0..self.layout.graphs_cap {
            let off = self.graph_off(i);
            if self.half(off + KIND).load(Acquire) == GRAPH_KERNEL_NODE
                && self.half(off + GRAPH_ID).load(Relaxed) == graph_id
            {
                kernels += 1;
            }
        }
        self.graph_exec_marked(exec_id, graph_id, None, (0, kernels))
    }

    /// `graph_exec` for an exec whose kernel nodes have the consecutive ids `nodes.0..` (0:
    /// not consecutive), `nodes.1` of them, and graph mark words when its replays carry marks.
    /// Returns its number of kernel nodes.
    pub fn graph_exec_marked(
        &self,
        exec_id: u32,
        graph_id: u32,
        marks: Option<ExecMarks>,
        nodes: (u64, u32),
    ) -> u32 {
        let (first_node, kernels) = nodes;
        if let Ok((off, _)) = self.graph_slot(exec_id as u64 | GRAPH_EXEC_KEY, true) {
            let m = marks.unwrap_or_default();
            let placement = Placement {
                position: if m.words == 0 { 0 } else { m.first + 1 },
                branch: m.branches,
                mark: m.words,
                grid: [first_node as u32, (first_node >> 32) as u32, 0],
                ..Placement::default()
            };
            self.fill_graph_slot_placed(off, kernels as u64, graph_id, 0, GRAPH_EXEC, placement);
        }
        kernels
    }

    /// Kernel nodes of executable graph `exec_id` (0 if unknown): what a launch of it waits for.
    pub fn graph_exec_kernels(&self, exec_id: u32) -> u32 {
        match self.graph_slot(exec_id as u64 | GRAPH_EXEC_KEY, false) {
            Ok((off, _)) if self.half(off + KIND).load(Acquire) == GRAPH_EXEC => {
                self.word(off + ORIGINAL).load(Relaxed) as u32
            }
            _ => 0,
        }
    }

    /// The graph mark words (`Layout::graph_marks_off`): where they start in this process's
    /// memory and how many there are. The GPU writes them; the shim only initialises them.
    pub fn graph_mark_words(&self) -> (*mut u32, u32) {
        // SAFETY: inside the journal (`Layout::total_size` covers the section).
        let p = unsafe {
            self.base
                .as_ptr()
                .add(self.layout.graph_marks_off() as usize)
        };
        (p.cast(), self.layout.graph_marks_cap())
    }

    /// Exec `exec_id`'s `GraphSlot::since_ns` (the flush thread's view of its words).
    pub fn set_graph_exec_since(&self, exec_id: u32, since_ns: u64) {
        if let Ok((off, _)) = self.graph_slot(exec_id as u64 | GRAPH_EXEC_KEY, false) {
            self.word(off + SINCE).store(since_ns, Relaxed);
        }
    }

    /// Graph mark word `i` as the GPU left it (0 outside the section).
    pub fn graph_mark_word(&self, i: u32) -> u32 {
        if i >= self.layout.graph_marks_cap() {
            return 0;
        }
        self.half(self.layout.graph_marks_off() + 4 * u64::from(i))
            .load(Relaxed)
    }

    /// Sets graph mark words `first..first+n` to `value` (1 when handed to a new exec: no
    /// replay of it has started).
    pub fn set_graph_mark_words(&self, first: u32, n: u32, value: u32) {
        let cap = self.layout.graph_marks_cap();
        for i in first..first.saturating_add(n).min(cap) {
            self.half(self.layout.graph_marks_off() + 4 * u64::from(i))
                .store(value, Relaxed);
        }
    }

    /// The kernel (name id) of node `node_id`; 0 if unknown.
    pub fn graph_node_name(&self, node_id: u64) -> u32 {
        match self.graph_slot(node_id, false) {
            Ok((off, _)) if self.half(off + KIND).load(Acquire) == GRAPH_KERNEL_NODE => {
                self.half(off + NAME_ID).load(Relaxed)
            }
            _ => 0,
        }
    }
}
