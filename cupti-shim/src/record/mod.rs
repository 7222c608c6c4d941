//! What the shim does when the driver calls it back: per-thread "inside API X since T", launches
//! into the in-flight table, completions out of it. One `Recorder` per process, reached
//! through a `OnceLock`; the backends (CUPTI, or the simulated driver in tests) call these
//! functions from their callbacks.
//!
//! Hot path rules: no allocation (the thread's slot index is cached in a const-initialised
//! thread-local), no locks, no panics (callers at the FFI boundary also catch unwinds).

use std::sync::{
    OnceLock,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

use probe_common::journal::{Layout, RECORD_MARKS, RECORD_PER_KERNEL, STATE_OFF};

mod handles;
pub(crate) mod thread;

use self::thread::{SLOT_NONE, SLOT_UNCLAIMED, ThreadState};
use crate::{
    clock::monotonic_ns,
    journal::file::JournalFile,
    journal::{Completion, Launch, Writer},
    marks::{self, Marks, Pending},
};

/// In C order: the writer's hot line first, the id counter (a locked add every launch) right
/// after it.
#[repr(C, align(64))]
pub struct Recorder {
    writer: Writer,
    /// The journal's correlation ids while the launch hooks record (`crate::launch_hooks`):
    /// CUPTI's ids are not seen on the hooked path, so every id comes from here.
    next_correlation: AtomicU64,
    /// CUPTI's id → ours, for what CUPTI still reports while the hooks are in place
    /// (synchronizes, and launches and their completion records under a per-kernel lease):
    /// one word per entry, indexed by CUPTI's id, holding a check of it (high 24 bits) and
    /// our id (low 40 bits). An entry is overwritten after `CORRELATION_MAP` later ids.
    correlation_map: Box<[AtomicU64]>,
    /// The launch hooks are in place (`crate::hooks::install`): every journal id is ours, and
    /// CUPTI's are translated (`own_correlation`, `mapped`).
    own_ids: AtomicBool,
    /// Marks could not work here (no pinned memory, no stream-ordered write): the backend is
    /// to switch per-kernel completion records on (its flush thread polls this).
    fallback_wanted: AtomicBool,
    /// The flush thread's CPU clock readings of the recording threads (`journal::cpu`).
    cpu: std::sync::Mutex<crate::journal::cpu::CpuSamples>,
    // Keeps the mapping alive for `writer`; dropped never (the process owns it until exit).
    _file: JournalFile,
}

static RECORDER: OnceLock<Recorder> = OnceLock::new();

/// Entries of `Recorder::correlation_map` (power of two).
const CORRELATION_MAP: usize = 1 << 16;
const OUR_ID_BITS: u32 = 40;

/// Length and first 7 bytes of a name, packed: what a cache entry is checked against.
fn name_check(name: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    let n = name.len().min(7);
    w[..n].copy_from_slice(&name[..n]);
    u64::from_le_bytes(w) ^ ((name.len() as u64) << 56)
}

/// Creates the process's journal; `Err` (with the reason) turns the shim off.
pub fn start(layout: Layout) -> std::io::Result<&'static Recorder> {
    if let Some(r) = RECORDER.get() {
        return Ok(r);
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    let file = JournalFile::create(layout.total_size() as usize)?;
    // The clock pair is taken back to back, so other nodes' journals can be aligned.
    let (mono, real) = (
        crate::clock::read(libc::CLOCK_MONOTONIC),
        crate::clock::read(libc::CLOCK_REALTIME),
    );
    // SAFETY: the mapping is page-aligned, zero-filled, total_size long, and lives in the
    // same Recorder as the writer.
    let writer = unsafe { Writer::create(file.base(), layout, pid, mono, real) };
    let rec = RECORDER.get_or_init(|| Recorder {
        writer,
        next_correlation: AtomicU64::new(1),
        correlation_map: (0..CORRELATION_MAP).map(|_| AtomicU64::new(0)).collect(),
        own_ids: AtomicBool::new(false),
        fallback_wanted: AtomicBool::new(false),
        cpu: std::sync::Mutex::new(Default::default()),
        _file: file,
    });
    Ok(rec)
}

/// The process's recorder; none in a forked child (`forked`).
pub fn get() -> Option<&'static Recorder> {
    if crate::journal::file::forked() {
        return None;
    }
    RECORDER.get()
}

impl Recorder {
    #[inline]
    pub fn writer(&self) -> &Writer {
        &self.writer
    }

    #[inline(always)]
    fn slot(&self, t: &ThreadState) -> Option<u32> {
        match t.slot.get() {
            SLOT_UNCLAIMED => self.claim_slot(t),
            SLOT_NONE => None,
            v => Some(v),
        }
    }

    /// The calling thread's first call: its journal slot claimed.
    #[cold]
    #[inline(never)]
    fn claim_slot(&self, t: &ThreadState) -> Option<u32> {
        let slot = self.writer.thread_slot(t.tid()).unwrap_or(SLOT_NONE);
        t.slot.set(slot);
        let claimed = (slot != SLOT_NONE).then_some(slot);
        if let Some(s) = claimed {
            // The slot never moves: its line is prefetched by every launch from now.
            let mut lines = t.next_lines.get();
            lines.thread = self.writer.thread_slot_off(s);
            t.next_lines.set(lines);
        }
        claimed
    }

    /// The launch hooks are in place from now: journal ids are the recorder's own.
    pub fn own_ids_from_now(&self) {
        self.own_ids.store(true, Ordering::Release);
    }

    /// The next correlation id of the recorder's own (launch hooks in place). AcqRel (on x86
    /// the same locked add as Relaxed): the counter is what orders a launch's `entering`
    /// before a synchronize that takes a later id (`sync_floor`).
    pub fn next_correlation(&self) -> u64 {
        self.next_correlation.fetch_add(1, Ordering::AcqRel)
    }

    /// The calling thread is about to take a launch's id (`Writer::entering`).
    #[inline(always)]
    pub fn entering_in(&self, t: &ThreadState) {
        if let Some(slot) = self.slot(t) {
            let _ = self.writer.entering(slot);
        }
    }

    /// A synchronize of `stream` (`ALL_STREAMS`: a context's) entered as `correlation` (its
    /// thread's call already entered): the id through which its return proves launches done
    /// (`Writer::sync_floor`). On the simulated driver, a kernel's first launch that loads
    /// its module while another thread synchronizes was otherwise retired unqueued, and the
    /// wedge named as the kernel after it (CI, 2026-12-07).
    pub fn sync_floor(&self, correlation: u64, stream: u64) -> u64 {
        self.writer.sync_floor(correlation, stream)
    }

    /// The journal's id for an API call CUPTI (or the simulated driver) reports at its entry
    /// with id `theirs`: while the launch hooks are in place, a new id of ours, remembered for
    /// `mapped`; otherwise `theirs`.
    pub fn own_correlation(&self, theirs: u64) -> u64 {
        if !self.own_ids.load(Ordering::Acquire) {
            return theirs;
        }
        let ours = self.next_correlation() & ((1 << OUR_ID_BITS) - 1);
        let i = theirs as usize & (CORRELATION_MAP - 1);
        self.correlation_map[i].store(((theirs >> 16) << OUR_ID_BITS) | ours, Ordering::Relaxed);
        ours
    }

    /// Our id for `theirs` given by `own_correlation` (`None`: not one we mapped, or
    /// overwritten since). Without launch hooks ids are not translated.
    pub fn mapped(&self, theirs: u64) -> Option<u64> {
        if !self.own_ids.load(Ordering::Acquire) {
            return Some(theirs);
        }
        let w =
            self.correlation_map[theirs as usize & (CORRELATION_MAP - 1)].load(Ordering::Relaxed);
        let check = (theirs >> 16) & ((1 << (64 - OUR_ID_BITS)) - 1);
        (w != 0 && w >> OUR_ID_BITS == check).then_some(w & ((1 << OUR_ID_BITS) - 1))
    }

    /// The calling thread enters a driver/runtime API call (`probe_common::api` id).
    pub fn api_enter(&self, api: u32, correlation: u64, now_ns: u64) {
        thread::with(|t| self.api_enter_in(t, api, correlation, now_ns));
    }

    /// A hooked launch's entry: the thread says it is entering, takes the launch's id, then
    /// enters the call — one slot lookup for both (`Writer::entering`). Returns (id, now).
    #[inline(always)]
    pub fn launch_enter_in(&self, t: &ThreadState, api: u32) -> (u64, u64) {
        let off = self.slot(t).map(|s| self.writer.entering(s));
        let correlation = self.next_correlation();
        let now = crate::clock::monotonic_ns();
        if let Some(off) = off {
            self.writer.entered(off, api, correlation, now);
        }
        (correlation, now)
    }

    /// `api_enter` with the calling thread's state in hand.
    #[inline]
    pub fn api_enter_in(&self, t: &ThreadState, api: u32, correlation: u64, now_ns: u64) {
        if let Some(slot) = self.slot(t) {
            self.writer.enter(slot, api, correlation, now_ns);
        }
    }

    /// The calling thread leaves its API call; `ok`: it returned CUDA_SUCCESS. A launch on a
    /// marked stream gets its mark here — before the thread's slot says "out of the call", so
    /// a mark that waits for room in a full queue shows as the launch still blocked.
    pub fn api_exit(&self, ok: bool) {
        thread::with(|t| self.api_exit_in(t, ok, marks::get()));
    }

    /// `api_exit` with the calling thread's state and the process's marks in hand.
    pub fn api_exit_in(&self, t: &ThreadState, ok: bool, marks: Option<&Marks>) {
        if let Some((correlation, graph, pending)) = t.pending.take()
            && let Some(m) = marks
        {
            if graph {
                m.after_graph_launch(&self.writer, pending, correlation, ok);
            } else {
                m.after_launch(&self.writer, pending, correlation, ok);
            }
        }
        t.in_launch.set((0, 0));
        if let Some(slot) = self.slot(t) {
            self.writer.exit(slot);
        }
    }

    /// How completions are learned now: `RECORD_MARKS` or `RECORD_PER_KERNEL`.
    pub fn record_mode(&self) -> u32 {
        self.writer.record_mode()
    }

    /// Records completions with stream marks from now on (at initialisation).
    pub fn use_marks(&self, cadence: marks::Cadence, with_events: bool) {
        marks::init(self.writer.marks_cap(), cadence, with_events);
        self.writer
            .set_record_mode(RECORD_MARKS, cadence.every, cadence.gap_us);
    }

    /// Whether marks failed and per-kernel records are wanted (not consumed).
    pub fn wants_fallback(&self) -> bool {
        self.fallback_wanted.load(Ordering::Acquire)
    }

    /// Whether marks failed and the backend should switch per-kernel records on (once).
    pub fn take_fallback(&self) -> bool {
        self.fallback_wanted.swap(false, Ordering::AcqRel)
    }

    /// A kernel launch; `name` is the mangled kernel name as the callback gives it. A graph
    /// launch (`launch.graph_id` = its executable graph) waits for that graph's kernel nodes.
    pub fn launch(&self, name: &[u8], launch: Launch) {
        self.launch_keyed(name, 0, launch, 0);
    }

    /// `launch` with `key` = the address the name came from (0: no caching). `launch.stream`
    /// must be a handle valid for the launching thread (the per-thread default stream as
    /// `marks::STREAM_PER_THREAD`): marks are written to it.
    pub fn launch_keyed(&self, name: &[u8], key: usize, launch: Launch, ctx: u64) {
        thread::with(|t| {
            let name_id = self.name_id(t, name, key);
            self.launch_named_in(t, name_id, launch, ctx, None, marks::get());
        });
    }

    /// `launch_keyed` with the name already interned (the launch hooks cache name ids) and
    /// the calling thread's state in hand; `mark_slot`: the stream's journal mark slot when
    /// the caller has it cached; `marks`: the process's marks (the hooks keep them at hand).
    #[inline]
    pub fn launch_named_in(
        &self,
        t: &ThreadState,
        name_id: u32,
        mut launch: Launch,
        ctx: u64,
        mark_slot: Option<u32>,
        marks: Option<&Marks>,
    ) {
        launch.name_id = name_id;
        launch.tid = t.tid();
        let graph = launch.graph_id != 0;
        if graph {
            launch.nodes_pending = self.writer.graph_exec_kernels(launch.graph_id);
        }
        let stream_slot =
            mark_slot.or_else(|| self.mark_slot_of(launch.stream_id, launch.device, launch.stream));
        let pending = self.mark_decision(&mut launch, ctx, stream_slot, marks);
        if t.pre_attach_taken.take() {
            // The launch's id went to the record of the stream's work from before an attach:
            // the thread's slot names its new one.
            self.api_enter_in(t, launch.api, launch.correlation, launch.launch_ns);
        }
        t.in_launch.set((launch.correlation, launch.name_id));
        let mut next = t.next_lines.get();
        self.writer
            .launch_predicting(&launch, stream_slot, &mut next);
        t.next_lines.set(next);
        t.pending
            .set(pending.map(|d| (launch.correlation, graph, d)));
    }

    /// The journal slot of a launch's stream (`None`: the table is full), in both record
    /// modes: its marks (marks mode) and its record count: what the launch hooks cache per
    /// stream.
    pub fn mark_slot_of(&self, stream_id: u32, device: u32, stream: u64) -> Option<u32> {
        self.writer
            .mark_slot(stream_id.wrapping_add(1).max(1), device, stream)
    }

    /// In marks mode: the stream's mark slot (into `launch.mark`), a mark before the launch
    /// after an idle gap, and whether to mark after it. `ctx`: the launch's context (the first
    /// one named is where the flush thread allocates the marks' memory).
    #[inline]
    fn mark_decision(
        &self,
        launch: &mut Launch,
        ctx: u64,
        stream_slot: Option<u32>,
        marks: Option<&Marks>,
    ) -> Option<Pending> {
        if self.writer.record_mode() != RECORD_MARKS {
            return None;
        }
        let m = marks?;
        let slot = stream_slot?;
        launch.mark = slot + 1;
        // The context a stream's launches run in: the flush thread's idle marks need it.
        m.set_context(slot, launch.stream, ctx);
        let pre = m
            .wants_pre_attach(slot)
            .then(|| self.pre_attach_record(slot, launch));
        if !m.ready(ctx) {
            // No context-created callback allocated the marks' memory (CUPTI is not loaded):
            // the first launch does, unless a capture is in progress (then the flush thread
            // does, later). Waiting for the flush thread cost the H200 reproducers their
            // names: a wedge ~1 ms into the process, a full queue before the memory existed.
            if ctx == 0 || !m.allocation_wanted() || m.capturing() {
                return None;
            }
            if let Err(why) = m.allocate_in(&self.writer, ctx) {
                self.fall_back(why);
                return None;
            }
            if !m.ready(ctx) {
                return None;
            }
        }
        if let Some(pre) = pre {
            m.pre_attach(&self.writer, slot, launch.stream, pre, launch.launch_ns);
        }
        Some(m.before_launch(
            &self.writer,
            slot,
            launch.stream,
            launch.launch_ns,
            launch.tid,
        ))
    }

    /// The first launch on a stream after `wedgeprobe attach`: whatever the stream ran before
    /// is unknown, and a kernel stuck there must not be taken for this launch. A launch record
    /// of its own (`PRE_ATTACH_NAME`, at the attach time) stands for it and takes this
    /// launch's id (the launch gets a new one); the caller marks it before the launch, so
    /// stream order puts it first. Without a mark (the marks' memory not there yet) it stays a
    /// candidate until a later mark or synchronize retires it. Returns its id.
    fn pre_attach_record(&self, slot: u32, launch: &mut Launch) -> u64 {
        let pre = launch.correlation;
        launch.correlation = self.next_correlation();
        thread::with(|t| t.pre_attach_taken.set(true));
        self.writer.launch(
            &Launch {
                correlation: pre,
                name_id: self.writer.intern(probe_common::journal::PRE_ATTACH_NAME),
                launch_ns: self.writer.created_ns(),
                stream: launch.stream,
                stream_id: launch.stream_id,
                device: launch.device,
                api: launch.api,
                tid: launch.tid,
                mark: slot + 1,
                ..Launch::default()
            },
            Some(slot),
        );
        pre
    }

    /// A CUDA context was created (CUPTI's resource callback; the simulated driver's first
    /// launch): the marks' memory is allocated in it now, while nothing can capture in it.
    pub fn context_created(&self, ctx: u64) {
        if self.writer.record_mode() == RECORD_MARKS
            && let Some(m) = marks::get()
            && let Err(why) = m.allocate_in(&self.writer, ctx)
        {
            self.fall_back(why);
        }
    }

    fn fall_back(&self, why: &str) {
        self.writer.set_record_mode(RECORD_PER_KERNEL, 0, 0);
        self.fallback_wanted.store(true, Ordering::Release);
        let mut line = why.as_bytes().to_vec();
        line.extend_from_slice(b"; recording per-kernel completions instead");
        crate::log_line(&line);
    }

    /// The flush thread's period now: 10 ms while the marks' memory waits to be allocated
    /// (launches before it get no marks) and while event marks are on (their progress is
    /// known only from its polls, and in-flight slots are reused only after), else 100 ms.
    pub fn flush_period(&self) -> std::time::Duration {
        let fast = self.writer.record_mode() == RECORD_MARKS
            && marks::get().is_some_and(|m| m.allocation_wanted() || m.polling());
        std::time::Duration::from_millis(if fast { 10 } else { 100 })
    }

    /// The name's id, cached by the address the callback passed it at: the driver hands the
    /// same pointer for the same function, and interning hashes the whole name (PyTorch's
    /// templated kernels' mangled names run to 200–300 bytes; FNV-1a over them costs about as
    /// much as the rest of the callback). Entries are checked against the name's length and
    /// first bytes, so a reused address with another name misses.
    fn name_id(&self, t: &ThreadState, name: &[u8], key: usize) -> u32 {
        if key == 0 {
            return self.writer.intern(name);
        }
        let check = name_check(name);
        t.callback_names
            .get_or(key, check, || self.writer.intern(name).into()) as u32
    }

    /// CUPTI created kernel node `node_id` in graph `graph_id`. Inside a launch call the node
    /// is that launch, captured: it takes the launch's kernel, and the launch leaves the
    /// in-flight table (it will never run as itself). Otherwise `name` resolves its kernel.
    pub fn graph_kernel_node(&self, node_id: u64, graph_id: u32, name: impl FnOnce() -> Vec<u8>) {
        let (correlation, launch_name) = thread::with(|t| t.in_launch.get());
        let name_id = if correlation != 0 {
            self.writer.captured(correlation, monotonic_ns());
            launch_name
        } else {
            self.writer.intern(&name())
        };
        self.writer.graph_kernel_node(node_id, 0, graph_id, name_id);
    }

    /// A graph node was created: inside a launch call, that launch is being captured and
    /// leaves the in-flight table (it will never run as itself).
    pub fn captured_if_in_launch(&self) {
        let (correlation, _) = thread::with(|t| t.in_launch.get());
        if correlation != 0 {
            self.writer.captured(correlation, monotonic_ns());
        }
    }

    /// Node `node_id` of graph `graph_id` is a clone of `original` (instantiation clones).
    pub fn graph_node_cloned(&self, node_id: u64, original: u64, graph_id: u32) {
        self.writer
            .graph_kernel_node(node_id, original, graph_id, 0);
    }

    pub fn graph_exec(&self, exec_id: u32, graph_id: u32) {
        self.writer.graph_exec(exec_id, graph_id);
    }

    /// A synchronize of `stream` (or `ALL_STREAMS`) returned successfully.
    pub fn synced(&self, correlation: u64, stream: u64) {
        self.writer.synced(correlation, stream, monotonic_ns());
        if let Some(m) = marks::get() {
            m.synced(
                &self.writer,
                stream,
                correlation,
                thread::with(ThreadState::tid),
            );
        }
    }

    pub fn complete(&self, completion: &Completion) {
        self.writer.complete(completion);
    }

    /// Flush thread, every tick (`flush_period`): event marks polled, marks published, a sign
    /// of life, then idle streams' last launches marked. Publishing comes first: an idle mark is a driver call that can wait
    /// for room in a stream's queue, and what passed before it must be readable meanwhile.
    pub fn heartbeat(&'static self) {
        if self.writer.record_mode() == RECORD_MARKS
            && let Some(m) = marks::get()
        {
            m.poll_events(&self.writer);
        }
        let now = monotonic_ns();
        self.writer.publish_marks(now);
        marks::graph::poll(&self.writer, now);
        self.writer.heartbeat(now);
        // Backends call this from one flush thread; a second caller skips rather than waits.
        if let Ok(mut samples) = self.cpu.try_lock() {
            self.writer.sample_cpu(&mut samples, now);
        }
        if self.writer.record_mode() == RECORD_MARKS
            && let Some(m) = marks::get()
        {
            if let Err(why) = m.allocate_if_wanted(&self.writer) {
                self.fall_back(why);
            }
            m.idle_marks(&self.writer, now);
        }
    }

    pub fn turn_off(&self) {
        self.writer.set_state(STATE_OFF);
    }
}
