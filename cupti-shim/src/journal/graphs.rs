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
    GRAPH_EXEC, GRAPH_EXEC_KEY, GRAPH_FREED_KEY, GRAPH_KERNEL_NODE, GraphSlot, drops, graph_probes,
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
    /// Probed as readers probe (`graph_probes`); a claim takes the first slot given back
    /// (`GRAPH_FREED_KEY`) on the key's path, else the first empty one, once it has seen the
    /// key is not already there (the path runs to an empty slot or the probe limit).
    fn graph_slot(&self, key: u64, claim: bool) -> Result<(u64, bool), ()> {
        // Twice at most: a claim that lost both its slots to other writers looks again.
        for _ in 0..2 {
            let mut freed = None;
            let mut empty = None;
            for i in graph_probes(key, self.layout.graphs_cap) {
                let off = self.graph_off(i);
                match self.word(off + KEY).load(Acquire) {
                    k if k == key => return Ok((off, false)),
                    0 => {
                        empty = Some(off);
                        break;
                    }
                    GRAPH_FREED_KEY if freed.is_none() => freed = Some(off),
                    _ => {}
                }
            }
            if !claim {
                return Err(());
            }
            for (off, was) in [(freed, GRAPH_FREED_KEY), (empty, 0)]
                .into_iter()
                .filter_map(|(o, w)| o.map(|o| (o, w)))
            {
                match self
                    .word(off + KEY)
                    .compare_exchange(was, key, AcqRel, Acquire)
                {
                    Ok(_) => return Ok((off, true)),
                    Err(k) if k == key => return Ok((off, false)),
                    Err(_) => {}
                }
            }
            if freed.is_none() && empty.is_none() {
                break;
            }
        }
        if claim {
            self.count_drop(drops::GRAPHS_FULL);
        }
        Err(())
    }

    /// Gives the slot of `key` back: its kind to 0 first (readers skip it), then its key to
    /// `GRAPH_FREED_KEY` (lookups probe past it, a claim may take it).
    fn free_graph_slot(&self, key: u64) {
        if let Ok((off, _)) = self.graph_slot(key, false) {
            self.half(off + KIND).store(0, Release);
            self.word(off + KEY).store(GRAPH_FREED_KEY, Release);
        }
    }

    /// Executable graph `exec_id` was destroyed: its slot and its kernel nodes' slots (the
    /// consecutive ids the hooks gave them, `graph_exec_marked`) go back. Without this a
    /// server that captures graphs again and again (a model reloaded, batch sizes captured
    /// anew) filled the table: 65,536 slots are ~84 execs of a 779-node decode graph, and
    /// past that a stuck replay was "graph launch of 0 kernel nodes". Nodes recorded from
    /// CUPTI's callbacks (CUPTI's ids, per graph, not per exec) stay.
    pub fn graph_exec_gone(&self, exec_id: u32) {
        self.graph_exec_nodes_gone(exec_id);
        self.free_graph_slot(exec_id as u64 | GRAPH_EXEC_KEY);
    }

    /// The kernel nodes' slots of exec `exec_id` go back, its own slot stays: for an exec
    /// updated in place, whose new nodes are recorded under new ids (then its slot is
    /// written again with them).
    pub fn graph_exec_nodes_gone(&self, exec_id: u32) {
        let Ok((off, _)) = self.graph_slot(exec_id as u64 | GRAPH_EXEC_KEY, false) else {
            return;
        };
        if self.half(off + KIND).load(Acquire) != GRAPH_EXEC {
            return;
        }
        let first = u64::from(self.half(off + GRID).load(Relaxed))
            | u64::from(self.half(off + GRID + 4).load(Relaxed)) << 32;
        let count = self
            .word(off + ORIGINAL)
            .load(Relaxed)
            .min(u64::from(self.layout.graphs_cap));
        if first != 0 {
            for id in first..first.saturating_add(count) {
                self.free_graph_slot(id);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::tests::{drops, writer};

    /// Node ids sharing a home slot: once the first is given back the second is still found
    /// past it, and a new key takes the given-back slot rather than one further on.
    #[test]
    fn a_graph_slot_given_back_is_probed_past_and_claimed_again() {
        let mut mem = Vec::new();
        let w = writer(&mut mem);
        let cap = w.layout.graphs_cap;
        let home = |k: u64| graph_probes(k, cap).next();
        let a = 1u64;
        let same: Vec<u64> = (2..).filter(|&k| home(k) == home(a)).take(2).collect();
        let (b, c) = (same[0], same[1]);
        w.graph_kernel_node(a, 0, 7, 11);
        w.graph_kernel_node(b, 0, 7, 12);
        let at_a = w.graph_slot(a, false).map(|s| s.0);
        w.graph_exec_marked(3, 7, None, (a, 1));
        w.graph_exec_gone(3);
        assert!(w.graph_slot(a, false).is_err(), "node a given back");
        assert!(
            w.graph_slot(3 | GRAPH_EXEC_KEY, false).is_err(),
            "exec given back"
        );
        assert_eq!(w.graph_node_name(b), 12, "b found past a's slot");
        w.graph_kernel_node(c, 0, 7, 13);
        assert_eq!(
            w.graph_slot(c, false).map(|s| s.0),
            at_a,
            "a's slot taken again"
        );
        assert_eq!(w.graph_node_name(c), 13);
        assert_eq!(w.graph_exec_kernels(3), 0);
        assert_eq!(drops(&w, drops::GRAPHS_FULL), 0);
    }
}
