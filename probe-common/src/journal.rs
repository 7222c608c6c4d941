//! The shim↔probe journal: a fixed-size shared-memory file one serving process writes (the
//! CUPTI shim, lock-free, from its callbacks) and wedgeprobe reads (as root, from another
//! process). This module is the layout only; the writer lives in `cupti-shim::journal`, the
//! validating reader in `probe-user::journal`.
//!
//! The writer is untrusted from the reader's point of view: every offset, capacity, index and
//! length read from the file is checked by the reader before use (see `Layout::validate`).
//!
//! ```text
//! [Header 256 B][ThreadSlot × threads_cap][InflightSlot × inflight_cap]
//! [RingRecord × ring_cap][NameSlot × names_cap][GraphSlot × graphs_cap]
//! [MarkSlot × marks_cap][pad to 4 KiB][graph mark word (u32) × graph_marks_cap()]
//! ```
//! Concurrency: each section has its own protocol, all with atomics on naturally aligned
//! fields, so a reader never blocks a writer:
//! - `ThreadSlot`: claimed once per thread by CAS on `tid`; its owner thread alone writes it;
//!   `since_ns` is written last on entry (0 = not in a call), so a reader that sees it
//!   non-zero, reads the rest, and sees the same `since_ns` again has a consistent slot.
//! - `InflightSlot`: claimed by CAS on `correlation` (0 = free); `seq` is odd while the owner
//!   writes, even when stable (a seqlock); completion frees it (correlation back to 0).
//! - `RingRecord`: index = `ring_head.fetch_add(1)`; `seq` = 2·index+1 while written,
//!   2·index+2 when complete: a reader checks it before and after copying.
//! - `NameSlot`: claimed by CAS on `hash` (0 = empty); `len` is stored last (0 = not ready).
//! - `GraphSlot`: claimed by CAS on `key` (0 = empty); `kind` is stored last (0 = not ready).
//! - `MarkSlot`: one per stream, claimed by CAS on `key` (0 = empty); `done`/`done_at_ns` are
//!   stored by the shim's flush thread from the stream's GPU-written progress word; `records`
//!   is a counter every writer of one of the stream's ring records bumps (`fetch_add`) before
//!   it reserves the record's ring index.
//! - Graph mark words: written by the GPU (leaf write nodes the shim adds to an instantiated
//!   graph, and one reset node a replay: `GraphSlot::position`/`mark`), page-aligned
//!   so the shim can register them with the driver; 1 = the kernels before it completed in the
//!   replay running now (or no replay has started), 0 = not yet.
//! - `Header::control` and `Header::per_kernel_until_ns`: the words the *reader* writes (a
//!   request to the shim, see `CONTROL_RELEASE`; a lease on per-kernel records); the shim
//!   polls them from its flush thread.

/// A process's journal is an anonymous memory file (`memfd_create`) named `MEMFD_NAME`: no
/// path in /dev/shm, so no tmpfs size limit to fault on, no name to collide across pid
/// namespaces, nothing left behind after a SIGKILL. Its pages are allocated when it is made
/// and its size is sealed (`F_SEAL_SHRINK | F_SEAL_GROW`), so neither side can fault on it later.
/// wedgeprobe finds it in the process's memory map, where it reads `MAPS_PATH`, and opens it
/// through `/proc/PID/fd` (or `/proc/PID/map_files`).
pub const MEMFD_NAME: &str = "wedgeprobe-journal";
/// How `/proc/PID/maps` (and a readlink of its fd) shows a `MEMFD_NAME` file.
pub const MAPS_PATH: &str = "/memfd:wedgeprobe-journal (deleted)";

/// `b"WPJRNL"` then the format's major version.
pub const MAGIC: [u8; 8] = *b"WPJRNL\x00\x05";
/// 2: CUDA graph table, `InflightSlot::nodes_pending`, `Header::control`, ring records with
/// the launch's shape and graph node (104 B).
/// 3: stream progress marks (`MarkSlot`, `Header::record_mode`), `InflightSlot::mark` and
/// `flags` (104 B slots).
/// 4: per-stream record counts (`MarkSlot::records`, 40 B; claimed in both record modes) and
/// each ring record's number on its stream (`RingRecord::stream_seq`, 112 B).
/// 5: graph marks — `GraphSlot` of 72 B (a kernel node's position, branch, mark word, grid
/// and block; an exec's mark words and when they last changed) and the graph mark words' section after the mark slots.
pub const VERSION: u32 = 5;
/// Versions this reader knows to be older, to tell "upgrade the shim" from "corrupt".
pub const OLDER_VERSIONS: [u32; 4] = [1, 2, 3, 4];

/// `Header::record_mode`: how the shim learns that kernels completed.
/// Per-kernel completion records (CUPTI CONCURRENT_KERNEL): every kernel's end is known, so
/// a stuck kernel is always named exactly. Costs ~0.9 µs of CPU per eager launch and ~0.5 µs
/// of GPU time per graph kernel node (BENCHMARKS.md).
pub const RECORD_PER_KERNEL: u32 = 1;
/// Stream progress marks: after every few launches (and around idle gaps) the shim enqueues a
/// stream-ordered write of the last launch's correlation id into host memory; everything up to
/// a mark that the GPU passed has completed. A stuck kernel is named exactly when it is the
/// only unfinished launch before the next mark, otherwise narrowed to the launches between
/// two marks (`InflightSlot::flags`).
pub const RECORD_MARKS: u32 = 2;

/// `Header::state`.
pub const STATE_RECORDING: u32 = 1;
/// The shim turned itself off (disabled, failed, or released CUPTI for a profiler).
pub const STATE_OFF: u32 = 2;
/// The shim gave CUPTI back (so torch.profiler / Nsight can subscribe): nothing is recorded
/// from then on; the journal stays readable (threads' slots and what was in flight).
pub const STATE_RELEASED: u32 = 3;

/// `wedgeprobe attach` put the shim into the running process: it is preparing its hooks, and
/// goes to `STATE_RECORDING` once they are in place (or `STATE_OFF` if they never were).
pub const STATE_ATTACHING: u32 = 4;

/// `Header::flags` bit: the shim was injected into a running process (`wedgeprobe attach`),
/// at the journal's creation time. Launches before that are not in the journal; the first
/// launch on each stream after it is preceded by a mark that stands for them (a launch record
/// named `PRE_ATTACH_NAME`), so a kernel stuck from before is never taken for a later one.
pub const JOURNAL_ATTACHED_LATE: u32 = 1;
/// `Header::flags` bit: the shim samples its threads' CPU clocks (`ThreadSlot::busy_since_ns`),
/// so a spin that began before attach is dated by what the thread did, not by its life.
pub const JOURNAL_CPU_SAMPLED: u32 = 2;
/// `Header::flags` bits 8..16: why launches are recorded through the driver's callbacks
/// (CUPTI's; the simulated driver's) instead of the shim's launch hooks, a `CALLBACKS_*` code —
/// 0 where the hooks record them, or where the exact mode's per-kernel records use the
/// callbacks by design. Set once, at start (zero in older journals).
pub const JOURNAL_CALLBACKS_SHIFT: u32 = 8;
pub const JOURNAL_CALLBACKS_MASK: u32 = 0xff << JOURNAL_CALLBACKS_SHIFT;
/// `WEDGEPROBE_SHIM_HOOKS=off` in the process's environment.
pub const CALLBACKS_TURNED_OFF: u32 = 1;
/// libcuda lacks one of the launch entry points.
pub const CALLBACKS_NO_ENTRY_POINT: u32 = 2;
/// A launch entry point's first instructions cannot be moved safely.
pub const CALLBACKS_CODE_REFUSED: u32 = 3;
/// A breakpoint (a uprobe, a debugger's) sat on a launch entry point at start.
pub const CALLBACKS_BREAKPOINT: u32 = 4;
/// The hooks are x86-64 only.
pub const CALLBACKS_NOT_X86: u32 = 5;
/// Anything else (no memory near libcuda, mprotect refused, …).
pub const CALLBACKS_FAILED: u32 = 6;

/// Why a journal's launches come through the driver's callbacks (`JOURNAL_CALLBACKS_*` of
/// `flags`), in words; `None` where the launch hooks record them.
pub fn launch_callbacks_why(flags: u32) -> Option<&'static str> {
    Some(
        match (flags & JOURNAL_CALLBACKS_MASK) >> JOURNAL_CALLBACKS_SHIFT {
            0 => return None,
            CALLBACKS_TURNED_OFF => "launch hooks turned off (WEDGEPROBE_SHIM_HOOKS)",
            CALLBACKS_NO_ENTRY_POINT => "libcuda lacks a launch entry point",
            CALLBACKS_CODE_REFUSED => {
                "a launch entry point's first instructions cannot be moved safely (the target's log says which)"
            }
            CALLBACKS_BREAKPOINT => {
                "a breakpoint was on a launch entry point at start (a uprobe, or a debugger)"
            }
            CALLBACKS_NOT_X86 => "launch hooks are x86-64 only",
            _ => "the launch hooks could not be put in (the target's log says why)",
        },
    )
}

/// The name of the record standing for a stream's work queued before the shim was attached.
pub const PRE_ATTACH_NAME: &[u8] = b"(work queued before wedgeprobe attached)";

/// `Header::control` bit: wedgeprobe asks the shim to release CUPTI (`wedgeprobe release`).
pub const CONTROL_RELEASE: u64 = 1;

/// Indexes into `Header::drops`: everything the writer could not record.
pub mod drops {
    pub const THREADS_FULL: usize = 0;
    pub const INFLIGHT_FULL: usize = 1;
    pub const NAMES_FULL: usize = 2;
    /// A completion whose launch was not in the in-flight table.
    pub const COMPLETION_UNMATCHED: usize = 3;
    /// Activity records CUPTI reported as dropped.
    pub const ACTIVITY_DROPPED: usize = 4;
    /// A CUDA graph node or executable graph that did not fit the graph table.
    pub const GRAPHS_FULL: usize = 5;
    /// A stream that got no mark slot: its launches are retired only by synchronizes.
    pub const MARKS_FULL: usize = 6;
    /// A progress mark the driver refused to enqueue.
    pub const MARK_FAILED: usize = 7;
    pub const LEN: usize = 8;
    pub const NAMES: [&str; LEN] = [
        "threads_full",
        "inflight_full",
        "names_full",
        "completion_unmatched",
        "activity_dropped",
        "graphs_full",
        "marks_full",
        "mark_failed",
    ];
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub magic: [u8; 8],
    pub version: u32,
    /// `size_of::<Header>()` as the writer built it.
    pub header_size: u32,
    pub total_size: u64,
    pub pid: u32,
    /// `STATE_*` (atomic).
    pub state: u32,
    /// The clock pair taken together at creation: CLOCK_MONOTONIC and CLOCK_REALTIME ns.
    pub created_mono_ns: u64,
    pub created_real_ns: u64,
    /// CLOCK_MONOTONIC ns of the writer's last sign of life (atomic).
    pub heartbeat_ns: u64,
    pub threads_off: u64,
    pub threads_cap: u32,
    pub thread_slot_size: u32,
    pub inflight_off: u64,
    pub inflight_cap: u32,
    pub inflight_slot_size: u32,
    pub ring_off: u64,
    pub ring_cap: u32,
    pub ring_record_size: u32,
    pub names_off: u64,
    pub names_cap: u32,
    pub name_slot_size: u32,
    /// Records ever reserved on the ring (atomic).
    pub ring_head: u64,
    /// Counters indexed by `drops::*` (atomic).
    pub drops: [u64; drops::LEN],
    pub graphs_off: u64,
    pub graphs_cap: u32,
    pub graph_slot_size: u32,
    /// `CONTROL_*` requests from wedgeprobe (atomic; the only word the reader writes).
    pub control: u64,
    pub marks_off: u64,
    pub marks_cap: u32,
    pub mark_slot_size: u32,
    /// `RECORD_*` (atomic: the shim may fall back from marks to per-kernel records).
    pub record_mode: u32,
    /// Marks: a mark after at most this many launches on a stream…
    pub mark_every: u32,
    /// …or once this many µs have passed since the stream's last mark.
    pub mark_us: u32,
    /// `JOURNAL_*` bits. (A reserved word until 2026-12-01: zero in older journals.)
    pub flags: u32,
    /// Written by wedgeprobe (`trace`): while CLOCK_MONOTONIC is before it, the shim records
    /// per-kernel completions too, whatever its mode. A lease the reader renews every tick,
    /// so a reader that dies stops costing the target within seconds (atomic; 0 = none).
    pub per_kernel_until_ns: u64,
}

/// `ThreadSlot::since_ns` while its owner is entering a call: stored before a launch takes its
/// correlation id, so a synchronize that took a later id on another thread sees the launch
/// (see `RECORD_SYNCED`). Readers take it as "not in a call yet": it lasts nanoseconds.
pub const THREAD_ENTERING: u64 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadSlot {
    /// Owner thread id (atomic; 0 = free).
    pub tid: u32,
    /// `probe_common::api` id of the call it is in.
    pub api: u32,
    /// CLOCK_MONOTONIC ns the call began (atomic; 0 = not in a call; written last;
    /// [`THREAD_ENTERING`] while the slot is being written for a call begun).
    pub since_ns: u64,
    pub correlation: u64,
    /// CLOCK_MONOTONIC ns since which the thread has been on a core ≥ 80% of the time, as the
    /// shim's flush thread reads its CPU clock once a second (0 = not busy at the last
    /// reading). Written by the flush thread, not the owner (atomic); meaningful only under
    /// `JOURNAL_CPU_SAMPLED` (a reserved word, zero, in older journals).
    pub busy_since_ns: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InflightSlot {
    /// CUPTI correlation id (atomic; 0 = free).
    pub correlation: u64,
    /// Seqlock (atomic): odd while being written.
    pub seq: u32,
    /// Name slot index + 1 (0 = unknown).
    pub name_id: u32,
    /// CLOCK_MONOTONIC ns of the launch call.
    pub launch_ns: u64,
    /// The `CUstream` handle.
    pub stream: u64,
    /// CUPTI's stream id (what activity records carry).
    pub stream_id: u32,
    pub device: u32,
    pub api: u32,
    pub tid: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub cluster: [u32; 3],
    /// Graph launches: CUPTI's id of the executable graph (0 otherwise).
    pub graph_id: u32,
    /// Graph launches: kernel nodes not completed yet (atomic; 0 = unknown or not a graph).
    pub nodes_pending: u32,
    /// The stream's `MarkSlot` index + 1 (0 = none: per-kernel records, or no slot left).
    pub mark: u32,
    /// `FLAG_*` (atomic; set after the slot is published).
    pub flags: u32,
    pub _pad: u32,
}

/// `InflightSlot::flags`: a progress mark was enqueued on the stream right after this launch,
/// so once the stream passes it this launch has completed — and while it has not, this launch
/// or one before it is unfinished. Set only after the mark was enqueued successfully.
pub const FLAG_MARKED: u32 = 1;

/// `RingRecord::kind`.
pub const RECORD_LAUNCH: u32 = 1;
pub const RECORD_KERNEL_DONE: u32 = 2;
/// A synchronize returned successfully: every kernel launched with a correlation id up to
/// `correlation` on `stream` — on every stream when `stream` is [`ALL_STREAMS`] — has
/// completed. `correlation` is the synchronize's own id, or lower: a launch that took its
/// id before the synchronize but was still inside the driver as it began (a kernel's first
/// launch loads its module first under lazy loading) may not have been queued
/// yet, so the synchronize proves nothing about it — `correlation` stops just below the
/// oldest such launch (0: proves nothing). Retires launches whose completion record CUPTI
/// never delivered (a forced flush hands back a still-running kernel's record unfinished,
/// and never again), and, with marks, launches no passed mark covers yet.
pub const RECORD_SYNCED: u32 = 3;
/// A kernel node of a graph launch completed: `correlation` is the graph launch's,
/// `graph_node` CUPTI's node id, `name_id` the node's kernel.
pub const RECORD_NODE_DONE: u32 = 4;
/// A launch made while its stream was being captured into a graph: it never runs as such
/// (it became a graph node), so it leaves the in-flight table.
pub const RECORD_CAPTURED: u32 = 5;
pub const ALL_STREAMS: u64 = u64::MAX;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingRecord {
    /// 2·index+1 while written, 2·index+2 when complete (atomic).
    pub seq: u64,
    pub kind: u32,
    pub name_id: u32,
    pub correlation: u64,
    /// Launch: the launch call's time. Done: the kernel's start on the GPU.
    pub start_ns: u64,
    /// Done: the kernel's end on the GPU; 0 otherwise.
    pub end_ns: u64,
    pub stream: u64,
    pub stream_id: u32,
    pub device: u32,
    pub tid: u32,
    pub api: u32,
    /// Launch and done records: the launch's grid, block and cluster dimensions.
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub cluster: [u16; 4],
    /// Node done: CUPTI's graph node id.
    pub graph_node: u64,
    /// Launch and done records: this record's number among its stream's (from 1), taken from
    /// the stream's `MarkSlot::records` before the ring index: a reader that misses records
    /// knows on which streams, and how many (0: not counted per stream — synchronizes,
    /// captures, a stream that got no slot).
    pub stream_seq: u64,
}

/// Bytes of a kernel name kept (mangled names of templated kernels run past 1 KiB; the
/// prefix tells them apart in practice).
pub const NAME_BYTES: usize = 240;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NameSlot {
    /// FNV-1a of the full name, never 0 (atomic; 0 = empty).
    pub hash: u64,
    /// Bytes used in `bytes` (atomic; 0 = being written).
    pub len: u32,
    pub _pad: u32,
    pub bytes: [u8; NAME_BYTES],
}

/// `GraphSlot::kind`.
pub const GRAPH_KERNEL_NODE: u32 = 1;
pub const GRAPH_EXEC: u32 = 2;
/// Executable graphs' keys carry this bit so they never collide with node ids.
pub const GRAPH_EXEC_KEY: u64 = 1 << 62;
/// `GraphSlot::key` of a slot given back (its exec was destroyed; `kind` was set to 0 first):
/// lookups probe past it, as past another key, and a writer may claim it again. Never a
/// node's or an exec's key (node ids stay below `GRAPH_EXEC_KEY`, exec keys are ids below
/// 2^32 with that bit).
pub const GRAPH_FREED_KEY: u64 = u64::MAX;

/// What CUPTI's resource callbacks said about CUDA graphs: kernel nodes (with their kernel) and
/// executable graphs (with the graph they were instantiated from), so a stuck graph launch can
/// be broken down into the nodes that have not completed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphSlot {
    /// Kernel node: CUPTI's node id. Exec: its id | `GRAPH_EXEC_KEY` (atomic; 0 = free).
    pub key: u64,
    /// Kernel node: the node it was cloned from (0 = not a clone). Exec: its kernel nodes.
    pub original: u64,
    /// Kernel node: its graph's id. Exec: the id of the graph it was instantiated from.
    pub graph_id: u32,
    pub name_id: u32,
    /// `GRAPH_*` (atomic, written last; 0 = being written).
    pub kind: u32,
    /// Kernel node: its place among its graph's kernel nodes in launch (topological) order,
    /// from 1 (0: not known — recorded from CUPTI's callbacks). Exec: its first graph mark
    /// word + 1 (0: its replays carry no marks).
    pub position: u32,
    /// Kernel node: its branch — the chain of kernel nodes, each waiting for the one before,
    /// it belongs to (from 0). Exec: how many branches its kernel nodes form.
    pub branch: u32,
    /// Kernel node: which of its exec's mark words (counted from the exec's first, + 1) is set
    /// once it completed in a replay (0: none). Exec: how many mark words it has.
    pub mark: u32,
    /// Kernel node: its launch dimensions (0 when not known). Exec: `grid[0]` and `grid[1]`
    /// hold the id of its first kernel node (low, high half): its `original` kernel nodes have
    /// consecutive ids from there, so a reader looks them up (`graph_probes`) instead of
    /// reading the whole table (0: not known, as from CUPTI's callbacks).
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Exec: CLOCK_MONOTONIC ns since which the shim's flush thread has seen its mark words as
    /// they are now, while a replay of it is under way (a word 0): within the flush period
    /// (100 ms), when its last marked kernel completed — or its replay began, none yet (0: no
    /// replay under way, or none seen; atomic).
    pub since_ns: u64,
}

/// Slots of the graph table a key may sit in, in the order writer and readers try them: from
/// its hashed home, one by one, at most `GRAPH_MAX_PROBE`. `cap` is a power of two (any other
/// value still gives indices below it).
pub fn graph_probes(key: u64, cap: u32) -> impl Iterator<Item = u32> {
    let mask = cap.wrapping_sub(1);
    let home = (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32 & mask;
    (0..cap.min(GRAPH_MAX_PROBE)).map(move |k| home.wrapping_add(k) & mask)
}
pub const GRAPH_MAX_PROBE: u32 = 128;

/// Graph mark words per graph table slot (`Layout::graph_marks_cap`): a mark follows at least
/// one kernel node, and each kernel node takes a slot, so the words are never the scarcer.
pub const GRAPH_MARKS_PER_SLOT: u32 = 1;

/// One stream: its progress as its marks report it (marks mode), and how many ring records
/// were written for it (both modes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MarkSlot {
    /// The stream's key: CUPTI's stream id + 1 (atomic; 0 = free).
    pub key: u32,
    pub device: u32,
    /// The `CUstream` handle.
    pub stream: u64,
    /// Every launch on this stream with a correlation id ≤ `done` has completed (atomic).
    pub done: u64,
    /// CLOCK_MONOTONIC ns when the shim first saw `done` at its current value (atomic; within
    /// the flush thread's period, 100 ms, of when the GPU passed the mark).
    pub done_at_ns: u64,
    /// Ring records ever written for this stream (atomic; see `RingRecord::stream_seq`).
    pub records: u64,
}

/// FNV-1a 64, with 0 mapped to 1 (0 marks an empty name slot).
pub fn name_hash(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    if h == 0 { 1 } else { h }
}

/// Capacities of a journal; the sections follow the header in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub threads_cap: u32,
    pub inflight_cap: u32,
    pub ring_cap: u32,
    pub names_cap: u32,
    pub graphs_cap: u32,
    pub marks_cap: u32,
}

impl Layout {
    /// Defaults: 1,024 threads, 8,192 in-flight launches (8 streams × a full 1,021-deep
    /// queue), a 16,384-record ring (the last ~0.2 s of a launch-bound loop), 4,096 names,
    /// 4,096 graph nodes and executable graphs, 1,024 streams' slots, 4,096 graph mark words: 3.9 MiB in all.
    pub const DEFAULT: Layout = Layout {
        threads_cap: 1024,
        inflight_cap: 8192,
        ring_cap: 16384,
        names_cap: 4096,
        // vLLM's piecewise CUDA graphs: ~67 batch sizes × (layers + 1) pieces, and its full
        // decode graphs beside them — thousands of execs, ~40,000 kernel nodes; 4,096 slots
        // named none past the first few hundred execs (tests/suite/graph_marks.rs).
        graphs_cap: 65536,
        marks_cap: 1024,
    };

    pub const fn threads_off(&self) -> u64 {
        core::mem::size_of::<Header>() as u64
    }
    pub const fn inflight_off(&self) -> u64 {
        self.threads_off() + self.threads_cap as u64 * core::mem::size_of::<ThreadSlot>() as u64
    }
    pub const fn ring_off(&self) -> u64 {
        self.inflight_off() + self.inflight_cap as u64 * core::mem::size_of::<InflightSlot>() as u64
    }
    pub const fn names_off(&self) -> u64 {
        self.ring_off() + self.ring_cap as u64 * core::mem::size_of::<RingRecord>() as u64
    }
    pub const fn graphs_off(&self) -> u64 {
        self.names_off() + self.names_cap as u64 * core::mem::size_of::<NameSlot>() as u64
    }
    pub const fn marks_off(&self) -> u64 {
        self.graphs_off() + self.graphs_cap as u64 * core::mem::size_of::<GraphSlot>() as u64
    }
    /// The graph mark words start on a page (the shim registers them with the driver).
    pub const fn graph_marks_off(&self) -> u64 {
        let end =
            self.marks_off() + self.marks_cap as u64 * core::mem::size_of::<MarkSlot>() as u64;
        end.div_ceil(4096) * 4096
    }
    /// How many graph mark words there are (u32 each), rounded up to whole pages.
    pub const fn graph_marks_cap(&self) -> u32 {
        ((self.graphs_cap * GRAPH_MARKS_PER_SLOT) as u64 * 4).div_ceil(4096) as u32 * 1024
    }
    pub const fn total_size(&self) -> u64 {
        self.graph_marks_off() + self.graph_marks_cap() as u64 * 4
    }

    /// The header a writer of this layout starts with.
    pub fn header(&self, pid: u32, mono_ns: u64, real_ns: u64) -> Header {
        Header {
            magic: MAGIC,
            version: VERSION,
            header_size: core::mem::size_of::<Header>() as u32,
            total_size: self.total_size(),
            pid,
            state: STATE_RECORDING,
            created_mono_ns: mono_ns,
            created_real_ns: real_ns,
            heartbeat_ns: mono_ns,
            threads_off: self.threads_off(),
            threads_cap: self.threads_cap,
            thread_slot_size: core::mem::size_of::<ThreadSlot>() as u32,
            inflight_off: self.inflight_off(),
            inflight_cap: self.inflight_cap,
            inflight_slot_size: core::mem::size_of::<InflightSlot>() as u32,
            ring_off: self.ring_off(),
            ring_cap: self.ring_cap,
            ring_record_size: core::mem::size_of::<RingRecord>() as u32,
            names_off: self.names_off(),
            names_cap: self.names_cap,
            name_slot_size: core::mem::size_of::<NameSlot>() as u32,
            ring_head: 0,
            drops: [0; drops::LEN],
            graphs_off: self.graphs_off(),
            graphs_cap: self.graphs_cap,
            graph_slot_size: core::mem::size_of::<GraphSlot>() as u32,
            control: 0,
            marks_off: self.marks_off(),
            marks_cap: self.marks_cap,
            mark_slot_size: core::mem::size_of::<MarkSlot>() as u32,
            record_mode: RECORD_PER_KERNEL,
            mark_every: 0,
            mark_us: 0,
            flags: 0,
            per_kernel_until_ns: 0,
        }
    }
}

/// Largest journal a reader accepts (a hostile header must not make it map gigabytes).
pub const MAX_TOTAL_SIZE: u64 = 256 << 20;

/// Why a journal header is not acceptable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderError {
    TooShort {
        len: u64,
    },
    BadMagic,
    UnsupportedVersion {
        version: u32,
    },
    /// Written by an older shim (a format this reader no longer reads).
    OlderVersion {
        version: u32,
    },
    /// A size, offset or capacity is not what this version's layout gives.
    Inconsistent {
        field: &'static str,
    },
    TooLarge {
        total_size: u64,
    },
}

impl Header {
    /// Checks a header read from an untrusted file of `file_len` bytes: the magic, the
    /// version, and that every section is exactly where this version puts it for the
    /// capacities given (so no offset or size from the file is ever used unchecked).
    pub fn validate(&self, file_len: u64) -> Result<Layout, HeaderError> {
        if file_len < core::mem::size_of::<Header>() as u64 {
            return Err(HeaderError::TooShort { len: file_len });
        }
        if self.magic != MAGIC {
            return Err(HeaderError::BadMagic);
        }
        if self.version != VERSION {
            return Err(if OLDER_VERSIONS.contains(&self.version) {
                HeaderError::OlderVersion {
                    version: self.version,
                }
            } else {
                HeaderError::UnsupportedVersion {
                    version: self.version,
                }
            });
        }
        let layout = Layout {
            threads_cap: self.threads_cap,
            inflight_cap: self.inflight_cap,
            ring_cap: self.ring_cap,
            names_cap: self.names_cap,
            graphs_cap: self.graphs_cap,
            marks_cap: self.marks_cap,
        };
        if [
            layout.threads_cap,
            layout.inflight_cap,
            layout.ring_cap,
            layout.names_cap,
            layout.graphs_cap,
            layout.marks_cap,
        ]
        .iter()
        .any(|&c| c == 0 || c > 1 << 20)
        {
            return Err(HeaderError::Inconsistent { field: "capacity" });
        }
        let expected = layout.header(self.pid, 0, 0);
        let checks: [(&'static str, bool); 15] = [
            ("header_size", self.header_size == expected.header_size),
            (
                "thread_slot_size",
                self.thread_slot_size == expected.thread_slot_size,
            ),
            (
                "inflight_slot_size",
                self.inflight_slot_size == expected.inflight_slot_size,
            ),
            (
                "ring_record_size",
                self.ring_record_size == expected.ring_record_size,
            ),
            (
                "name_slot_size",
                self.name_slot_size == expected.name_slot_size,
            ),
            ("threads_off", self.threads_off == expected.threads_off),
            ("inflight_off", self.inflight_off == expected.inflight_off),
            ("ring_off", self.ring_off == expected.ring_off),
            ("names_off", self.names_off == expected.names_off),
            ("graphs_off", self.graphs_off == expected.graphs_off),
            (
                "graph_slot_size",
                self.graph_slot_size == expected.graph_slot_size,
            ),
            ("total_size", self.total_size == expected.total_size),
            ("marks_off", self.marks_off == expected.marks_off),
            (
                "mark_slot_size",
                self.mark_slot_size == expected.mark_slot_size,
            ),
            (
                "record_mode",
                self.record_mode == RECORD_PER_KERNEL || self.record_mode == RECORD_MARKS,
            ),
        ];
        if let Some((field, _)) = checks.iter().find(|(_, ok)| !ok) {
            return Err(HeaderError::Inconsistent { field });
        }
        if self.total_size > MAX_TOTAL_SIZE {
            return Err(HeaderError::TooLarge {
                total_size: self.total_size,
            });
        }
        if file_len < self.total_size {
            return Err(HeaderError::TooShort { len: file_len });
        }
        Ok(layout)
    }
}

#[cfg(test)]
mod tests {
    use core::mem::{offset_of, size_of};

    use super::*;

    #[test]
    fn layouts_are_pinned() {
        assert_eq!(size_of::<Header>(), 256);
        assert_eq!(offset_of!(Header, ring_head), 120);
        assert_eq!(size_of::<ThreadSlot>(), 32);
        assert_eq!(size_of::<InflightSlot>(), 104);
        assert_eq!(size_of::<MarkSlot>(), 40);
        assert_eq!(offset_of!(Header, record_mode), 232);
        assert_eq!(offset_of!(Header, per_kernel_until_ns), 248);
        assert_eq!(offset_of!(Header, flags), 244);
        assert_eq!(size_of::<GraphSlot>(), 72);
        assert_eq!(offset_of!(Header, control), 208);
        assert_eq!(size_of::<RingRecord>(), 112);
        assert_eq!(size_of::<NameSlot>(), 256);
        let before_words: u64 =
            256 + 32 * 1024 + 104 * 8192 + 112 * 16384 + 256 * 4096 + 72 * 65536 + 40 * 1024;
        assert_eq!(
            Layout::DEFAULT.graph_marks_off(),
            before_words.div_ceil(4096) * 4096
        );
        assert_eq!(Layout::DEFAULT.graph_marks_off() % 4096, 0);
        assert_eq!(Layout::DEFAULT.graph_marks_cap(), 65536);
        assert_eq!(
            Layout::DEFAULT.total_size(),
            Layout::DEFAULT.graph_marks_off() + 4 * 65536
        );
    }

    #[test]
    fn a_writers_header_validates_and_tampering_does_not() {
        let l = Layout::DEFAULT;
        let h = l.header(42, 1, 2);
        assert_eq!(h.validate(l.total_size()), Ok(l));
        assert_eq!(
            h.validate(l.total_size() - 1),
            Err(HeaderError::TooShort {
                len: l.total_size() - 1
            })
        );
        let mut bad = h;
        bad.ring_off += 8;
        assert_eq!(
            bad.validate(l.total_size()),
            Err(HeaderError::Inconsistent { field: "ring_off" })
        );
        let mut bad = h;
        bad.ring_cap = u32::MAX;
        assert!(bad.validate(u64::MAX).is_err());
        let mut bad = h;
        bad.magic[0] = b'X';
        assert_eq!(bad.validate(l.total_size()), Err(HeaderError::BadMagic));
        let mut bad = h;
        bad.version = 4;
        assert_eq!(
            bad.validate(l.total_size()),
            Err(HeaderError::OlderVersion { version: 4 })
        );
        bad.version = 9;
        assert_eq!(
            bad.validate(l.total_size()),
            Err(HeaderError::UnsupportedVersion { version: 9 })
        );
        let mut bad = h;
        bad.record_mode = 7;
        assert_eq!(
            bad.validate(l.total_size()),
            Err(HeaderError::Inconsistent {
                field: "record_mode"
            })
        );
    }

    #[test]
    fn name_hash_is_never_zero() {
        assert_ne!(name_hash(b""), 0);
        assert_ne!(name_hash(b"_Z6kernelv"), name_hash(b"_Z6kernelf"));
    }
}
