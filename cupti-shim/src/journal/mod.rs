//! The journal writer: records launches, completions and "thread T is inside API X since T0"
//! into the shared-memory journal (layout and protocols: `probe_common::journal`).
//!
//! Runs inside the serving process, on CUPTI callback threads: lock-free, allocation-free,
//! panic-free. Every store is an atomic (Relaxed for data, Release for the field that
//! publishes it), so a reader in another process never sees a half-written slot as valid.
//! Anything that does not fit is counted in the header's drop counters, never lost silently.

use core::{
    mem::{offset_of, size_of},
    ptr::NonNull,
    sync::atomic::{AtomicU32, AtomicU64, Ordering::*},
};

use probe_common::journal::{
    ALL_STREAMS, CONTROL_RELEASE, FLAG_MARKED, Header, InflightSlot, Layout, NAME_BYTES, NameSlot,
    RECORD_CAPTURED, RECORD_KERNEL_DONE, RECORD_LAUNCH, RECORD_NODE_DONE, RECORD_SYNCED,
    RingRecord, THREAD_ENTERING, ThreadSlot, drops, name_hash,
};

mod claimed;
use claimed::Claimed;
pub mod cpu;
pub mod file;
mod graphs;
pub use graphs::{ExecMarks, Placement};
mod marks;

/// Cluster dimensions as the ring keeps them (at most 16 blocks per cluster dimension on
/// current GPUs; larger values saturate).
fn cluster16(c: [u32; 3]) -> [u16; 4] {
    let n = |v: u32| u16::try_from(v).unwrap_or(u16::MAX);
    [n(c[0]), n(c[1]), n(c[2]), 0]
}

/// Slots probed from a key's home position before giving up (in-flight table and names):
/// bounds the work of a callback; with the default capacities a probe run this long needs
/// the table nearly full.
const MAX_PROBE: u32 = 128;

/// In-flight slots probed from a launch's sequential home (`correlation % cap`) before its
/// hashed home. Consecutive launches then write consecutive slots, which the cache and TLB
/// already hold: a hashed home alone made every launch's slot a cache miss — 53% of the
/// writer's time on the simulated driver (perf), a bigger share of the ~350 ns a launch
/// cost on the H200 (BENCHMARKS.md, 2026-12-01). The hashed second home keeps a long held
/// run (a stuck kernel's queue, ~1,000 launches) from pushing later launches past the
/// probe limit: they go round it.
const SEQ_PROBE: u32 = 8;
/// A prime larger than any held run the probe limit could cross.
const HASHED_STEP: u64 = 5003;

/// How long a synchronize waits for a thread seen entering a call to store its id, in
/// spin-loop hints (x86 PAUSE: up to ~140 cycles each since Skylake, so ≤ ~14,000 cycles): the
/// window is a clock read and a few stores, unless the thread was preempted in it — then the
/// synchronize proves nothing (`Writer::sync_floor`). Not timed here.
const ENTERING_SPINS: u32 = 100;

/// `x % cap` for the writer's capacities, which are powers of two (`Writer::create`): a mask,
/// not a 64-bit division (tens of cycles; a launch made five). With any other capacity the
/// index is still below `cap`, only spread unevenly.
#[inline(always)]
pub(crate) fn wrap(x: u64, cap: u32) -> u32 {
    (x & u64::from(cap.wrapping_sub(1))) as u32
}

/// Whether the CPU has PREFETCHW (CPUID 8000_0001h, ECX bit 8): Intel since Broadwell, AMD
/// since K6.
fn has_prefetchw() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // Leaf 8000_0000h says which extended leaves exist.
        let max = core::arch::x86_64::__cpuid(0x8000_0000).eax;
        max >= 0x8000_0001 && core::arch::x86_64::__cpuid(0x8000_0001).ecx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Journal offsets of what the calling thread's next launch will likely write: its ring
/// record, its in-flight slot, the thread's slot (0: none known).
#[derive(Clone, Copy, Default)]
pub struct Lines {
    pub ring: u64,
    pub slot: u64,
    pub thread: u64,
}

/// A launch as the callback saw it: the in-flight slot's own fields (`seq` is ignored).
pub use probe_common::journal::InflightSlot as Launch;

/// A kernel's completion as an activity record reports it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Completion {
    pub correlation: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub stream_id: u32,
    pub device: u32,
    /// CUPTI's graph node id when the kernel ran as a node of a graph launch (0 otherwise).
    pub graph_node: u64,
}

/// In C order, what every launch reads first, in the first cache line (`base`, `layout`,
/// `mode`, `prefetchw`, `done_seen`, `marks_done`: 64 bytes); let the compiler order them
/// and they spread over three lines, each a cold miss in a serving loop (callgrind's cache
/// model, BENCHMARKS.md, 2026-12-02).
#[repr(C)]
pub struct Writer {
    base: NonNull<u8>,
    layout: Layout,
    /// `Header::record_mode`, mirrored in process memory: a launch asks it three times, and
    /// the header's line is shared with words the reader writes (`control`, the lease).
    mode: AtomicU32,
    /// The CPU has PREFETCHW (`prefetch_for_write`).
    prefetchw: bool,
    /// The highest progress value seen per mark word, in ordinary process memory: whether a
    /// slot's old launch is retired is usually answered here. The pinned word itself is
    /// written by the GPU over PCIe, so reading it after each mark is a cache miss. Marks
    /// recorded as events (`crate::marks::events`) report their progress here directly.
    done_seen: Box<[AtomicU64]>,
    /// The GPU-written progress words of the streams' marks (`marks_cap` of them, process
    /// memory pinned for the device; null until the first mark). A launch reuses an in-flight
    /// slot whose launch a passed mark has retired: without per-kernel completions nothing
    /// else frees slots, and a launch-bound loop makes ~100k launches a second.
    marks_done: core::sync::atomic::AtomicPtr<AtomicU64>,
    /// Launches whose completion record CUPTI handed back unfinished (a forced flush): it will
    /// never come again, so their slots are freed by the next synchronize that covers them.
    orphans: AtomicU64,
    /// Which mark slots are claimed: the flush thread's walks over the streams (publishing,
    /// polling events) visit those, not all `marks_cap`.
    marks_claimed: Claimed,
    /// Which thread slots are claimed: a synchronize's walk over the threads inside a launch
    /// (`sync_floor`) visits those, not all `threads_cap`.
    threads_claimed: Claimed,
}
const _: () = assert!(offset_of!(Writer, marks_done) + 8 <= 64);

// SAFETY: every access through `base` is atomic; the memory outlives the writer (contract of
// `Writer::create`).
unsafe impl Send for Writer {}
// SAFETY: as above.
unsafe impl Sync for Writer {}

impl Writer {
    /// Lays a new journal out in `mem` and marks it recording.
    ///
    /// # Safety
    /// `mem` must be 8-byte aligned, writable, zero-filled, at least `layout.total_size()`
    /// bytes long, and stay mapped for the writer's lifetime. The layout's capacities should
    /// be powers of two (`wrap`); others work, with uneven hashing.
    pub unsafe fn create(
        mem: NonNull<u8>,
        layout: Layout,
        pid: u32,
        mono_ns: u64,
        real_ns: u64,
    ) -> Self {
        debug_assert!(
            [
                layout.threads_cap,
                layout.inflight_cap,
                layout.ring_cap,
                layout.names_cap,
                layout.graphs_cap,
                layout.marks_cap
            ]
            .iter()
            .all(|c| c.is_power_of_two()),
            "journal capacities must be powers of two"
        );
        let header = layout.header(pid, mono_ns, real_ns);
        let w = Self {
            base: mem,
            layout,
            orphans: AtomicU64::new(0),
            marks_done: core::sync::atomic::AtomicPtr::new(core::ptr::null_mut()),
            done_seen: (0..layout.marks_cap).map(|_| AtomicU64::new(0)).collect(),
            marks_claimed: Claimed::new(layout.marks_cap),
            threads_claimed: Claimed::new(layout.threads_cap),
            prefetchw: has_prefetchw(),
            mode: AtomicU32::new(header.record_mode),
        };
        let words = size_of::<Header>() / 8;
        // SAFETY: Header is plain old data of `words` u64s.
        let src =
            unsafe { core::slice::from_raw_parts((&header as *const Header).cast::<u64>(), words) };
        // The magic (word 0) is stored last: a reader that sees it sees a whole header.
        for (i, &word) in src.iter().enumerate().skip(1) {
            w.word(i as u64 * 8).store(word, Relaxed);
        }
        w.word(0).store(src[0], Release);
        w
    }

    /// Asks for the cache lines of the `len` bytes at `off` with intent to write. A launch
    /// writes a new ring record and a new in-flight slot (104 bytes each, two or three cache
    /// lines) that were last touched thousands of launches ago: their stores missed the
    /// cache, and the next locked instruction waited for them (the journal writes were ~220 ns
    /// of a launch on the H200, BENCHMARKS.md, 2026-12-01). Fetched here for the next launch,
    /// they are in the cache by the time it writes them, microseconds later.
    #[inline(always)]
    #[cfg_attr(
        not(target_arch = "x86_64"),
        expect(unused_variables, reason = "the prefetch is x86-64 only")
    )]
    fn prefetch_for_write(&self, off: u64, len: u64) {
        #[cfg(target_arch = "x86_64")]
        let ats: &[u64] = if len > 64 {
            &[0, 64, len - 1]
        } else {
            &[0, len - 1]
        };
        #[cfg(target_arch = "x86_64")]
        for &at in ats {
            let p = self.base.as_ptr().wrapping_add((off + at) as usize);
            if self.prefetchw {
                // SAFETY: a prefetch never faults (an address outside the mapping is a
                // no-op); `has_prefetchw` checked the instruction exists.
                unsafe {
                    core::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, preserves_flags, readonly))
                };
            } else {
                // SAFETY: as above; SSE is part of x86-64.
                unsafe {
                    core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                        p.cast(),
                    )
                };
            }
        }
    }

    /// Starts fetching, for writing, the lines a launch will write, as the thread's previous
    /// launch predicted them (`Lines`): at the hook's entry, so their misses overlap the rest
    /// of its work instead of coming one after another. In a serving loop the interpreter
    /// between two launches evicts them (the prefetch at the end of a launch is lost by
    /// then): on the simulated driver with 512 KiB touched between launches the shim's time
    /// rose from ~190 to ~370 ns a launch. A wrong prediction (another thread took the ring
    /// record) costs a useless prefetch.
    #[inline(always)]
    pub fn prefetch_lines(&self, lines: &Lines) {
        for (off, len) in [
            (lines.ring, size_of::<RingRecord>()),
            (lines.slot, size_of::<InflightSlot>()),
            (lines.thread, size_of::<ThreadSlot>()),
        ] {
            if off != 0 {
                self.prefetch_for_write(off, len as u64);
            }
        }
    }

    fn word(&self, off: u64) -> &AtomicU64 {
        // SAFETY: callers pass 8-aligned offsets inside the journal (all derived from the
        // layout), and the memory is only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(off as usize).cast()) }
    }

    fn half(&self, off: u64) -> &AtomicU32 {
        // SAFETY: as for `word`, 4-aligned.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(off as usize).cast()) }
    }

    pub fn count_drop(&self, which: usize) {
        self.count_drops(which, 1);
    }

    pub fn count_drops(&self, which: usize, n: u64) {
        if which < drops::LEN && n > 0 {
            self.word((offset_of!(Header, drops) + which * 8) as u64)
                .fetch_add(n, Relaxed);
        }
    }

    fn drop_count(&self, which: usize) -> u64 {
        if which < drops::LEN {
            self.word((offset_of!(Header, drops) + which * 8) as u64)
                .load(Relaxed)
        } else {
            0
        }
    }

    pub fn heartbeat(&self, now_ns: u64) {
        self.word(offset_of!(Header, heartbeat_ns) as u64)
            .store(now_ns, Relaxed);
    }

    /// Sets `JOURNAL_*` bits of the header's flags.
    pub fn set_flags(&self, flags: u32) {
        self.half(offset_of!(Header, flags) as u64)
            .fetch_or(flags, Release);
    }

    /// When the journal was created (CLOCK_MONOTONIC ns): for an injected shim, the attach.
    pub fn created_ns(&self) -> u64 {
        self.word(offset_of!(Header, created_mono_ns) as u64)
            .load(Relaxed)
    }

    pub fn set_state(&self, state: u32) {
        self.half(offset_of!(Header, state) as u64)
            .store(state, Release);
    }

    pub fn state(&self) -> u32 {
        self.half(offset_of!(Header, state) as u64).load(Acquire)
    }

    /// Whether wedgeprobe holds a lease on per-kernel records now
    /// (`Header::per_kernel_until_ns`, e.g. while `wedgeprobe trace` runs).
    pub fn per_kernel_leased(&self, now_ns: u64) -> bool {
        now_ns
            < self
                .word(offset_of!(Header, per_kernel_until_ns) as u64)
                .load(Acquire)
    }

    /// `RECORD_*`: how completions are learned (the header says it to the reader).
    #[inline]
    pub fn record_mode(&self) -> u32 {
        self.mode.load(Relaxed)
    }

    pub fn set_record_mode(&self, mode: u32, every: u32, us: u32) {
        self.half(offset_of!(Header, mark_every) as u64)
            .store(every, Relaxed);
        self.half(offset_of!(Header, mark_us) as u64)
            .store(us, Relaxed);
        self.mode.store(mode, Relaxed);
        self.half(offset_of!(Header, record_mode) as u64)
            .store(mode, Release);
    }

    /// Whether wedgeprobe has asked the shim to release CUPTI (`Header::control`).
    pub fn release_requested(&self) -> bool {
        self.word(offset_of!(Header, control) as u64).load(Acquire) & CONTROL_RELEASE != 0
    }

    // ---- threads ----

    fn thread_off(&self, i: u32) -> u64 {
        self.layout.threads_off() + i as u64 * size_of::<ThreadSlot>() as u64
    }

    /// The slot of thread `tid`, claimed on first use; `None` (counted) when all are taken.
    /// Callers cache the index per thread.
    pub fn thread_slot(&self, tid: u32) -> Option<u32> {
        let cap = self.layout.threads_cap;
        let home = wrap(u64::from(tid.wrapping_mul(0x9e37_79b9)), cap);
        for k in 0..cap.min(MAX_PROBE) {
            let i = wrap(u64::from(home + k), cap);
            let owner = self.half(self.thread_off(i) + offset_of!(ThreadSlot, tid) as u64);
            match owner.compare_exchange(0, tid, AcqRel, Acquire) {
                Ok(_) => {
                    self.threads_claimed.set(i);
                    return Some(i);
                }
                Err(t) if t == tid => {
                    // A slot a thread of this id claimed before (a reused id): ours now.
                    self.threads_claimed.set(i);
                    return Some(i);
                }
                Err(_) => {}
            }
        }
        self.count_drop(drops::THREADS_FULL);
        None
    }

    /// The journal offset of thread slot `slot` (`Lines::thread`).
    pub fn thread_slot_off(&self, slot: u32) -> u64 {
        self.thread_off(wrap(u64::from(slot), self.layout.threads_cap))
    }

    /// Thread of `slot` is about to take a launch's correlation id: says so first, so a
    /// synchronize that takes a later id sees this thread entering (`sync_floor`; the id's
    /// counter is the Release/Acquire edge between them).
    /// Returns the slot's offset, for `entered`.
    #[inline(always)]
    pub fn entering(&self, slot: u32) -> u64 {
        let off = self.thread_off(wrap(u64::from(slot), self.layout.threads_cap));
        self.word(off + offset_of!(ThreadSlot, since_ns) as u64)
            .store(THREAD_ENTERING, Relaxed);
        off
    }

    /// The thread whose slot is at `off` (from `entering`, whose store opened the slot for
    /// writing) is in call `api` as `correlation` since `now_ns`.
    #[inline(always)]
    pub fn entered(&self, off: u64, api: u32, correlation: u64, now_ns: u64) {
        self.half(off + offset_of!(ThreadSlot, api) as u64)
            .store(api, Relaxed);
        self.word(off + offset_of!(ThreadSlot, correlation) as u64)
            .store(correlation, Relaxed);
        self.word(off + offset_of!(ThreadSlot, since_ns) as u64)
            .store(now_ns.max(THREAD_ENTERING + 1), Release);
    }

    /// Thread of `slot` enters `api` (a `probe_common::api` id) now.
    pub fn enter(&self, slot: u32, api: u32, correlation: u64, now_ns: u64) {
        let off = self.entering(slot);
        self.entered(off, api, correlation, now_ns);
    }

    /// A synchronize of `stream` (`ALL_STREAMS`: a context's) took correlation id `own`
    /// (after every launch id below it was taken: `Recorder::next_correlation`): the highest
    /// id through which it can prove launches done. A launch that took a lower id and is
    /// still inside the driver may not be queued yet — the synchronize does not wait for it —
    /// so the bound stops below the oldest such launch on that stream (one on another stream,
    /// known by its in-flight record, does not count: a launcher blocked behind a stuck
    /// kernel must not stop other streams' synchronizes from proving anything). A thread seen
    /// entering a call (its id not yet stored) is waited for briefly, then taken to prove
    /// nothing (0), as is a process with threads the table had no room for (they publish
    /// nothing). The walk reads the claimed thread slots only.
    pub fn sync_floor(&self, own: u64, stream: u64) -> u64 {
        if self.drop_count(drops::THREADS_FULL) != 0 {
            return 0;
        }
        let mut floor = own;
        for i in self.threads_claimed.iter() {
            let off = self.thread_off(i);
            let since = self.word(off + offset_of!(ThreadSlot, since_ns) as u64);
            let mut s = since.load(Acquire);
            let mut spins = 0;
            while s == THREAD_ENTERING && spins < ENTERING_SPINS {
                core::hint::spin_loop();
                spins += 1;
                s = since.load(Acquire);
            }
            if s == THREAD_ENTERING {
                return 0;
            }
            if s == 0 {
                continue;
            }
            let api = self
                .half(off + offset_of!(ThreadSlot, api) as u64)
                .load(Relaxed);
            let c = self
                .word(off + offset_of!(ThreadSlot, correlation) as u64)
                .load(Relaxed);
            let launch = probe_common::api::class(api) == Some(probe_common::api::ApiClass::Launch);
            let elsewhere =
                stream != ALL_STREAMS && self.inflight_stream(c).is_some_and(|s| s != stream);
            if launch && c < own && !elsewhere {
                floor = floor.min(c.saturating_sub(1));
            }
        }
        floor
    }

    pub fn exit(&self, slot: u32) {
        let off = self.thread_off(wrap(u64::from(slot), self.layout.threads_cap));
        self.word(off + offset_of!(ThreadSlot, since_ns) as u64)
            .store(0, Release);
    }

    // ---- in-flight launches ----

    fn inflight_off(&self, i: u32) -> u64 {
        self.layout.inflight_off() + i as u64 * size_of::<InflightSlot>() as u64
    }

    fn home(&self, key: u64, cap: u32) -> u32 {
        wrap(key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32, cap)
    }

    /// The in-flight slots a launch may occupy, in the order they are tried: `SEQ_PROBE` from
    /// its sequential home, then `MAX_PROBE` from its hashed one, `HASHED_STEP` apart — a
    /// held run is contiguous (a stuck queue took consecutive slots), and stepping by one
    /// from a hashed home inside it would not leave it. Writers and finders walk the same
    /// sequence.
    fn inflight_probes(&self, correlation: u64) -> impl Iterator<Item = u32> + use<> {
        let cap = self.layout.inflight_cap;
        let seq = wrap(correlation, cap);
        let hashed = self.home(correlation, cap);
        (0..cap.min(SEQ_PROBE))
            .map(move |k| wrap(u64::from(seq + k), cap))
            .chain(
                (0..cap.min(MAX_PROBE))
                    .map(move |k| wrap(u64::from(hashed) + u64::from(k) * HASHED_STEP, cap)),
            )
    }

    /// Records a launch: an in-flight slot (until its completion) and a ring record.
    /// Returns false (counted) if the in-flight table has no room near its home slot.
    pub fn launch(&self, l: &Launch, stream_slot: Option<u32>) -> bool {
        self.launch_predicting(l, stream_slot, &mut Lines::default())
    }

    /// `launch`, saying in `next` where the thread's next launch will likely write its ring
    /// record and in-flight slot (`next.thread` is left as it is): for `prefetch_lines`.
    /// `stream_slot`: the stream's slot (`mark_slot`), whose record count numbers the record.
    #[inline]
    pub fn launch_predicting(
        &self,
        l: &Launch,
        stream_slot: Option<u32>,
        next: &mut Lines,
    ) -> bool {
        let index = self.ring_push_counted(
            stream_slot,
            &RingRecord {
                kind: RECORD_LAUNCH,
                correlation: l.correlation,
                name_id: l.name_id,
                start_ns: l.launch_ns,
                stream: l.stream,
                stream_id: l.stream_id,
                device: l.device,
                tid: l.tid,
                api: l.api,
                grid: l.grid,
                block: l.block,
                cluster: cluster16(l.cluster),
                ..RingRecord::default()
            },
        );
        next.ring = self.ring_record_off(index + 1);
        next.slot = self.inflight_off(wrap(l.correlation + 1, self.layout.inflight_cap));
        if l.correlation == 0 {
            return false;
        }
        for i in self.inflight_probes(l.correlation) {
            let off = self.inflight_off(i);
            let corr = self.word(off + offset_of!(InflightSlot, correlation) as u64);
            let held = corr.load(Relaxed);
            if held != 0 && !self.retired_by_mark(off, held) {
                continue;
            }
            let Some(seq) = self.lock_inflight(off) else {
                continue;
            };
            if corr.load(Relaxed) != held {
                self.half(off + offset_of!(InflightSlot, seq) as u64)
                    .store(seq + 2, Release);
                continue; // taken by another writer between the check and the lock
            }
            self.write_inflight(off, l);
            corr.store(l.correlation, Relaxed);
            self.half(off + offset_of!(InflightSlot, seq) as u64)
                .store(seq + 2, Release);
            // The next launch's sequential home.
            self.prefetch_for_write(
                self.inflight_off(wrap(l.correlation + 1, self.layout.inflight_cap)),
                size_of::<InflightSlot>() as u64,
            );
            return true;
        }
        self.count_drop(drops::INFLIGHT_FULL);
        false
    }

    /// Takes a slot's seqlock (even → odd); returns the even value it had. A slot's seq is odd
    /// exactly while one writer changes it, so a reader that sees the same even seq before and
    /// after copying the slot has a consistent copy — claiming included.
    fn lock_inflight(&self, off: u64) -> Option<u32> {
        let seq = self.half(off + offset_of!(InflightSlot, seq) as u64);
        let s = seq.load(Relaxed);
        if s & 1 == 1 {
            return None;
        }
        seq.compare_exchange(s, s + 1, Acquire, Relaxed).ok()?;
        core::sync::atomic::fence(Release);
        Some(s)
    }

    /// The slot's fields after its seqlock word, as whole words (`name_id` shares a word with
    /// `seq`): 12 stores, not the 21 a field at a time took.
    fn write_inflight(&self, off: u64, l: &Launch) {
        self.half(off + offset_of!(InflightSlot, name_id) as u64)
            .store(l.name_id, Relaxed);
        let slot = InflightSlot { _pad: 0, ..*l };
        const FIRST: usize = offset_of!(InflightSlot, launch_ns) / 8;
        const WORDS: usize = size_of::<InflightSlot>() / 8;
        // SAFETY: InflightSlot is plain old data of WORDS u64s (size pinned by probe-common).
        let src = unsafe {
            core::slice::from_raw_parts((&slot as *const InflightSlot).cast::<u64>(), WORDS)
        };
        let base = self.base.as_ptr().wrapping_add(off as usize);
        for (i, &w) in src.iter().enumerate().skip(FIRST) {
            // SAFETY: as for `word`: an 8-aligned offset inside the journal, accessed
            // atomically only.
            unsafe { AtomicU64::from_ptr(base.add(8 * i).cast()) }.store(w, Relaxed);
        }
    }

    /// Whether the launch `correlation` held in the slot at `off` is done by its stream's
    /// mark. One load of the mark's progress word, which the GPU writes a few times per
    /// thousand launches: usually a cache hit.
    fn retired_by_mark(&self, off: u64, correlation: u64) -> bool {
        let mark = self
            .half(off + offset_of!(InflightSlot, mark) as u64)
            .load(Relaxed);
        mark != 0 && self.mark_passed(mark - 1, correlation)
    }

    /// Whether mark word `i` has passed `correlation`: from `done_seen` when it says so, else
    /// from the pinned word (and `done_seen` catches up).
    fn mark_passed(&self, i: u32, correlation: u64) -> bool {
        let Some(seen) = self.done_seen.get(i as usize) else {
            return false;
        };
        if seen.load(Relaxed) >= correlation {
            return true;
        }
        let done = self.mark_done(i);
        if done > seen.load(Relaxed) {
            seen.fetch_max(done, Relaxed);
        }
        done >= correlation
    }

    /// Finds the in-flight slot of `correlation` (None if it left the table).
    fn find_inflight(&self, correlation: u64) -> Option<u64> {
        if correlation == 0 {
            return None;
        }
        self.inflight_probes(correlation)
            .map(|i| self.inflight_off(i))
            .find(|&off| {
                self.word(off + offset_of!(InflightSlot, correlation) as u64)
                    .load(Acquire)
                    == correlation
            })
    }

    /// The stream of launch `correlation`'s in-flight record, if it has a whole one now.
    fn inflight_stream(&self, correlation: u64) -> Option<u64> {
        let off = self.find_inflight(correlation)?;
        let seq = self.half(off + offset_of!(InflightSlot, seq) as u64);
        let before = seq.load(Acquire);
        let stream = self
            .word(off + offset_of!(InflightSlot, stream) as u64)
            .load(Acquire);
        let same = self
            .word(off + offset_of!(InflightSlot, correlation) as u64)
            .load(Acquire)
            == correlation;
        (before.is_multiple_of(2) && same && seq.load(Acquire) == before).then_some(stream)
    }

    /// A mark was enqueued right after launch `correlation` (`FLAG_MARKED`).
    pub fn set_marked(&self, correlation: u64) {
        if let Some(off) = self.find_inflight(correlation) {
            self.half(off + offset_of!(InflightSlot, flags) as u64)
                .fetch_or(FLAG_MARKED, Release);
        }
    }

    /// A launch the driver refused: it will never run, so it leaves the in-flight table.
    pub fn launch_failed(&self, correlation: u64) {
        let _ = self.take_inflight(correlation, false);
    }

    /// Records a completion: frees the launch's in-flight slot and appends a ring record. A
    /// graph node's completion only counts down its graph launch's pending nodes; the launch
    /// leaves the table with its last node (or, with an unknown node count, its first).
    pub fn complete(&self, c: &Completion) {
        let node = c.graph_node != 0;
        let launched = self.take_inflight(c.correlation, node);
        let matched = launched.is_some();
        let mut r = launched.unwrap_or_else(|| {
            self.count_drop(drops::COMPLETION_UNMATCHED);
            RingRecord::default()
        });
        if node {
            r.name_id = self.graph_node_name(c.graph_node);
            r.graph_node = c.graph_node;
            // The graph launch's shape is not its nodes'.
            (r.grid, r.block, r.cluster) = ([0; 3], [0; 3], [0; 4]);
        }
        r.kind = if node {
            RECORD_NODE_DONE
        } else {
            RECORD_KERNEL_DONE
        };
        r.correlation = c.correlation;
        r.start_ns = c.start_ns;
        r.end_ns = c.end_ns;
        // The stream as its launch named it, so a launch and its completion share one stream
        // id (and one record count): without CUPTI loaded at launch the hooks name streams by
        // the driver's id (`cuStreamGetId`), while CUPTI's activity records, once a trace's
        // lease has loaded CUPTI, carry CUPTI's own. On the H200 (2026-12-03) the two
        // differed, and no completion lost in a default-mode trace could be put on its stream.
        if !matched {
            r.stream_id = c.stream_id;
            r.device = c.device;
        }
        // Completions are written off the launch path (the flush thread, CUPTI's buffer
        // callback): a probe of the stream table here costs the application nothing.
        let slot = self.find_mark_slot(r.stream_id.wrapping_add(1).max(1));
        self.ring_push_counted(slot, &r);
    }

    /// A launch turned out to be captured into a graph (it will never run as itself).
    pub fn captured(&self, correlation: u64, now_ns: u64) {
        let _ = self.take_inflight(correlation, false);
        self.ring_push(&RingRecord {
            kind: RECORD_CAPTURED,
            correlation,
            start_ns: now_ns,
            ..RingRecord::default()
        });
    }

    /// Frees the in-flight slot of `correlation` — for a graph node (`node`), only once its
    /// pending count runs out — and returns a record with the launch's fields (name, stream,
    /// thread, api, shape).
    fn take_inflight(&self, correlation: u64, node: bool) -> Option<RingRecord> {
        if correlation == 0 {
            return None;
        }
        for i in self.inflight_probes(correlation) {
            let off = self.inflight_off(i);
            let corr = self.word(off + offset_of!(InflightSlot, correlation) as u64);
            if corr.load(Acquire) != correlation {
                continue;
            }
            // Only the completion of this correlation frees it, so the lock is free but for a
            // launch writer probing past; retry briefly.
            let mut seq = None;
            for _ in 0..64 {
                seq = self.lock_inflight(off);
                if seq.is_some() {
                    break;
                }
                core::hint::spin_loop();
            }
            let s = seq?;
            let h = |f: usize| self.half(off + f as u64).load(Relaxed);
            let dims = |f: usize| [h(f), h(f + 4), h(f + 8)];
            let fields = RingRecord {
                name_id: h(offset_of!(InflightSlot, name_id)),
                stream_id: h(offset_of!(InflightSlot, stream_id)),
                device: h(offset_of!(InflightSlot, device)),
                stream: self
                    .word(off + offset_of!(InflightSlot, stream) as u64)
                    .load(Relaxed),
                tid: h(offset_of!(InflightSlot, tid)),
                api: h(offset_of!(InflightSlot, api)),
                grid: dims(offset_of!(InflightSlot, grid)),
                block: dims(offset_of!(InflightSlot, block)),
                cluster: cluster16(dims(offset_of!(InflightSlot, cluster))),
                ..RingRecord::default()
            };
            let pending = self.half(off + offset_of!(InflightSlot, nodes_pending) as u64);
            let left = pending.load(Relaxed);
            if node && left > 1 {
                pending.store(left - 1, Relaxed);
            } else {
                corr.store(0, Relaxed);
            }
            self.half(off + offset_of!(InflightSlot, seq) as u64)
                .store(s + 2, Release);
            return Some(fields);
        }
        None
    }

    /// A synchronize returned: see `probe_common::journal::RECORD_SYNCED`.
    pub fn synced(&self, correlation: u64, stream: u64, now_ns: u64) {
        if self.orphans.load(Relaxed) > 0 {
            self.free_synced(correlation, stream);
        }
        self.ring_push(&RingRecord {
            kind: RECORD_SYNCED,
            correlation,
            start_ns: now_ns,
            end_ns: now_ns,
            stream,
            ..RingRecord::default()
        });
    }

    /// CUPTI handed `correlation`'s record back unfinished: no completion will free its slot.
    pub fn orphaned(&self, _correlation: u64) {
        self.orphans.fetch_add(1, Relaxed);
    }

    /// Frees the slots of launches through `correlation` on `stream` (or every stream): a
    /// returned synchronize proves them done. Runs only while orphans exist.
    fn free_synced(&self, correlation: u64, stream: u64) {
        let mut freed = 0;
        for i in 0..self.layout.inflight_cap {
            let off = self.inflight_off(i);
            let corr = self.word(off + offset_of!(InflightSlot, correlation) as u64);
            let c = corr.load(Acquire);
            let slot_stream = self
                .word(off + offset_of!(InflightSlot, stream) as u64)
                .load(Relaxed);
            if c == 0 || c > correlation || (stream != ALL_STREAMS && slot_stream != stream) {
                continue;
            }
            if let Some(s) = self.lock_inflight(off) {
                if corr.load(Relaxed) == c {
                    corr.store(0, Relaxed);
                    freed += 1;
                }
                self.half(off + offset_of!(InflightSlot, seq) as u64)
                    .store(s + 2, Release);
            }
        }
        let _ = self
            .orphans
            .try_update(Relaxed, Relaxed, |o| Some(o.saturating_sub(freed.max(1))));
    }

    /// The earliest `since_ns` of the threads inside a call now (0 if none): the flush thread
    /// uses it to notice a wait that may be held up by a withheld activity buffer.
    pub fn oldest_call_since(&self) -> u64 {
        let mut oldest = 0;
        for i in 0..self.layout.threads_cap {
            let since = self
                .word(self.thread_off(i) + offset_of!(ThreadSlot, since_ns) as u64)
                .load(Relaxed);
            if since > THREAD_ENTERING && (oldest == 0 || since < oldest) {
                oldest = since;
            }
        }
        oldest
    }

    /// The earliest launch time of the launches in flight now (0 if none): with
    /// `oldest_call_since`, what tells the flush thread a withheld buffer may hide a
    /// completion. Scans the table (8,192 slots by default, ~0.8 MB) — every 100 ms, on the
    /// flush thread.
    pub fn oldest_launch_ns(&self) -> u64 {
        let mut oldest = 0;
        for i in 0..self.layout.inflight_cap {
            let off = self.inflight_off(i);
            if self
                .word(off + offset_of!(InflightSlot, correlation) as u64)
                .load(Relaxed)
                == 0
            {
                continue;
            }
            let t = self
                .word(off + offset_of!(InflightSlot, launch_ns) as u64)
                .load(Relaxed);
            if t != 0 && (oldest == 0 || t < oldest) {
                oldest = t;
            }
        }
        oldest
    }

    // ---- ring ----

    /// `ring_push`, numbering the record on its stream first (`RingRecord::stream_seq`):
    /// the count is taken before the ring index, so a reader that read the ring head before
    /// the counts knows every record numbered above them is at or after that head.
    #[inline]
    fn ring_push_counted(&self, stream_slot: Option<u32>, r: &RingRecord) -> u64 {
        match stream_slot.and_then(|s| self.stream_records(s)) {
            Some(count) => self.ring_push(&RingRecord {
                stream_seq: count.fetch_add(1, AcqRel) + 1,
                ..*r
            }),
            None => self.ring_push(r),
        }
    }

    /// Appends `r` to the ring (its `seq` is set here).
    fn ring_push(&self, r: &RingRecord) -> u64 {
        let index = self
            .word(offset_of!(Header, ring_head) as u64)
            .fetch_add(1, AcqRel);
        let off = self.layout.ring_off()
            + u64::from(wrap(index, self.layout.ring_cap)) * size_of::<RingRecord>() as u64;
        let seq = self.word(off + offset_of!(RingRecord, seq) as u64);
        seq.store(2 * index + 1, Relaxed);
        core::sync::atomic::fence(Release);
        let words = size_of::<RingRecord>() / 8;
        // SAFETY: RingRecord is plain old data of `words` u64s.
        let src =
            unsafe { core::slice::from_raw_parts((r as *const RingRecord).cast::<u64>(), words) };
        // Word 0 is `seq`: everything after it, then seq last.
        let base = self.base.as_ptr().wrapping_add(off as usize);
        for (i, &w) in src.iter().enumerate().skip(1) {
            // SAFETY: as for `word`: an 8-aligned offset inside the journal, accessed
            // atomically only.
            unsafe { AtomicU64::from_ptr(base.add(8 * i).cast()) }.store(w, Relaxed);
        }
        seq.store(2 * index + 2, Release);
        self.prefetch_for_write(
            self.ring_record_off(index + 1),
            size_of::<RingRecord>() as u64,
        );
        index
    }

    fn ring_record_off(&self, index: u64) -> u64 {
        self.layout.ring_off()
            + u64::from(wrap(index, self.layout.ring_cap)) * size_of::<RingRecord>() as u64
    }

    // ---- names ----

    /// The id (slot index + 1) of `name`, interned on first use; 0 (counted) when full.
    pub fn intern(&self, name: &[u8]) -> u32 {
        let hash = name_hash(name);
        let cap = self.layout.names_cap;
        let home = self.home(hash, cap);
        for k in 0..cap.min(MAX_PROBE) {
            let i = wrap(u64::from(home + k), cap);
            let off = self.layout.names_off() + i as u64 * size_of::<NameSlot>() as u64;
            let slot_hash = self.word(off + offset_of!(NameSlot, hash) as u64);
            // Every launch interns its name: the common case (already there) must be a plain
            // load, not a compare-exchange that takes the cache line from other launchers.
            match slot_hash.load(Acquire) {
                h if h == hash => return i + 1,
                0 => {}
                _ => continue,
            }
            match slot_hash.compare_exchange(0, hash, AcqRel, Acquire) {
                Ok(_) => {
                    let n = name.len().min(NAME_BYTES);
                    let bytes = off + offset_of!(NameSlot, bytes) as u64;
                    for (j, chunk) in name[..n].chunks(8).enumerate() {
                        let mut word = [0u8; 8];
                        word[..chunk.len()].copy_from_slice(chunk);
                        self.word(bytes + 8 * j as u64)
                            .store(u64::from_le_bytes(word), Relaxed);
                    }
                    self.half(off + offset_of!(NameSlot, len) as u64)
                        .store(n.max(1) as u32, Release);
                    return i + 1;
                }
                Err(h) if h == hash => return i + 1,
                Err(_) => {}
            }
        }
        self.count_drop(drops::NAMES_FULL);
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer over zeroed process memory (the journal's layout, no file).
    pub(super) fn writer(mem: &mut Vec<u64>) -> Writer {
        let layout = Layout::DEFAULT;
        *mem = vec![0u64; (layout.total_size() as usize).div_ceil(8)];
        let base = NonNull::from(&mut mem[0]).cast::<u8>();
        // SAFETY: 8-aligned, zeroed, long enough; `mem` outlives the writer in each test.
        unsafe { Writer::create(base, layout, 1, 1, 1) }
    }

    fn launch(correlation: u64, mark: u32) -> Launch {
        Launch {
            correlation,
            name_id: 1,
            launch_ns: correlation,
            mark,
            ..Launch::default()
        }
    }

    fn ring_record(w: &Writer, index: u64) -> RingRecord {
        let off = w.ring_record_off(index) as usize;
        // SAFETY: a whole record inside the journal, read while nothing writes it.
        unsafe { w.base.as_ptr().add(off).cast::<RingRecord>().read() }
    }

    /// A synchronize proves done only the launches that took their ids before it and are
    /// out of the driver; a launch still inside (or a thread entering one) holds the bound
    /// below it.
    #[test]
    fn a_synchronize_proves_nothing_about_a_launch_still_inside_the_driver() {
        let mut mem = Vec::new();
        let w = writer(&mut mem);
        let id = |s: &str| probe_common::api::id_of(s).unwrap();
        let (launcher, syncer, other) = (
            w.thread_slot(101).unwrap(),
            w.thread_slot(102).unwrap(),
            w.thread_slot(103).unwrap(),
        );
        w.enter(syncer, id("cuStreamSynchronize"), 9, 50);
        assert_eq!(w.sync_floor(9, ALL_STREAMS), 9, "nothing else in a call");
        // A thread in a copy (not a launch) says nothing about launches.
        w.enter(other, id("cuMemcpyDtoH_v2"), 3, 40);
        assert_eq!(w.sync_floor(9, ALL_STREAMS), 9);
        // The launch of id 5 is inside the driver: 5 is not proved, 4 is.
        w.enter(launcher, id("cuLaunchKernel"), 5, 45);
        assert_eq!(w.sync_floor(9, ALL_STREAMS), 4);
        // A launch that took its id after the synchronize's is not its business.
        assert_eq!(w.sync_floor(4, ALL_STREAMS), 4);
        w.exit(launcher);
        assert_eq!(w.sync_floor(9, ALL_STREAMS), 9, "queued: proved");
        // Entering (its id not stored yet): it may be below 9, so nothing is proved.
        w.entering(launcher);
        assert_eq!(w.sync_floor(9, ALL_STREAMS), 0);
        w.enter(launcher, id("cuLaunchKernel"), 11, 60);
        assert_eq!(w.sync_floor(9, ALL_STREAMS), 9);
        w.exit(launcher);
        // A launch whose in-flight record says it is on another stream holds back only a
        // synchronize of its own stream, or of every stream.
        w.enter(launcher, id("cuLaunchKernel"), 7, 70);
        assert!(w.launch(
            &Launch {
                stream: 0x100,
                ..launch(7, 0)
            },
            None
        ));
        assert_eq!(w.sync_floor(9, 0x200), 9);
        assert_eq!(w.sync_floor(9, 0x100), 6);
        assert_eq!(w.sync_floor(9, ALL_STREAMS), 6);
        // Before its record is written its stream is unknown: it holds back every one.
        w.enter(launcher, id("cuLaunchKernel"), 8, 80);
        assert_eq!(w.sync_floor(9, 0x200), 7);
        // A thread the table had no room for publishes nothing: nothing is proved.
        w.count_drop(drops::THREADS_FULL);
        assert_eq!(w.sync_floor(9, 0x200), 0);
    }

    #[test]
    fn launches_and_completions_are_numbered_on_their_stream() {
        let mut mem = Vec::new();
        let w = writer(&mut mem);
        let a = w.mark_slot(8, 0, 0x100).unwrap();
        let b = w.mark_slot(9, 0, 0x200).unwrap();
        let on = |corr: u64, stream_id: u32| Launch {
            stream_id,
            ..launch(corr, 0)
        };
        assert!(w.launch(&on(1, 7), Some(a)));
        assert!(w.launch(&on(2, 8), Some(b)));
        assert!(w.launch(&on(3, 7), Some(a)));
        // CUPTI's id for the stream (42) is not the one the launch named it by (7): the
        // completion keeps its launch's.
        w.complete(&Completion {
            correlation: 1,
            stream_id: 42,
            ..Completion::default()
        });
        w.synced(3, ALL_STREAMS, 5);
        assert!(w.launch(&on(4, 99), None));
        let seqs: Vec<(u32, u64)> = (0..6)
            .map(|i| ring_record(&w, i))
            .map(|r| (r.stream_id, r.stream_seq))
            .collect();
        assert_eq!(
            seqs,
            [(7, 1), (8, 1), (7, 2), (7, 3), (0, 0), (99, 0)],
            "per stream from 1; a synchronize and a stream with no slot are not numbered"
        );
        assert_eq!(w.stream_records(a).unwrap().load(Relaxed), 3);
        assert_eq!(w.stream_records(b).unwrap().load(Relaxed), 1);
        assert_eq!(
            w.find_mark_slot(10),
            None,
            "looking a stream up does not claim it"
        );
    }

    pub(super) fn drops(w: &Writer, which: usize) -> u64 {
        w.word((offset_of!(Header, drops) + which * 8) as u64)
            .load(Relaxed)
    }

    /// The lines a launch predicts for the thread's next launch are the ones that launch then
    /// writes: its ring record and its in-flight slot.
    #[test]
    fn a_launch_predicts_the_lines_the_next_one_writes() {
        let mut mem = Vec::new();
        let w = writer(&mut mem);
        let mut next = Lines::default();
        assert!(w.launch_predicting(&launch(41, 0), None, &mut next));
        let predicted = next;
        assert!(w.launch_predicting(&launch(42, 0), None, &mut next));
        let head = w.word(offset_of!(Header, ring_head) as u64).load(Relaxed);
        assert_eq!(predicted.ring, w.ring_record_off(head - 1), "ring record");
        assert_eq!(Some(predicted.slot), w.find_inflight(42), "in-flight slot");
        // Prefetching them (or the header, for an unknown line) is harmless.
        w.prefetch_lines(&next);
        w.prefetch_lines(&Lines::default());
    }

    #[test]
    fn consecutive_launches_take_consecutive_slots_and_are_found_again() {
        let mut mem = Vec::new();
        let w = writer(&mut mem);
        for c in 1..=100 {
            assert!(w.launch(&launch(c, 0), None));
        }
        let slot = |c: u64| {
            w.find_inflight(c)
                .map(|off| (off - w.layout.inflight_off()) / size_of::<InflightSlot>() as u64)
        };
        assert!(slot(41).is_some());
        assert_eq!(
            slot(41).map(|i| i + 1),
            slot(42),
            "not laid out in launch order"
        );
        for c in 1..=100 {
            assert!(w.take_inflight(c, false).is_some(), "launch {c} not found");
        }
        assert!(w.find_inflight(7).is_none());
    }

    #[test]
    fn a_stuck_queue_longer_than_the_probe_limit_does_not_crowd_out_later_launches() {
        let mut mem = Vec::new();
        let w = writer(&mut mem);
        let cap = w.layout.inflight_cap as u64;
        // A stuck kernel and 1,500 launches queued behind it: never retired (no mark).
        for c in 1..=1_500 {
            assert!(w.launch(&launch(c, 0), None));
        }
        // Another stream keeps launching; its mark passes everything it launched, so its own
        // slots are reused, and its homes come round to the held run again and again.
        let words = vec![0u64; w.layout.marks_cap as usize];
        // SAFETY: marks_cap u64s, 8-aligned, outliving the writer here, accessed atomically.
        unsafe { w.set_mark_words(words.as_ptr().cast_mut()) };
        let done = |v: u64| {
            // SAFETY: index 0 of the words above.
            unsafe { AtomicU64::from_ptr(words.as_ptr().cast_mut()) }.store(v, Relaxed)
        };
        for c in 1_501..1_501 + 3 * cap {
            assert!(w.launch(&launch(c, 1), None), "launch {c} found no slot");
            done(c);
        }
        assert_eq!(drops(&w, drops::INFLIGHT_FULL), 0);
        for c in 1..=1_500 {
            assert!(w.find_inflight(c).is_some(), "held launch {c} lost");
        }
    }

    #[test]
    fn a_slot_is_reused_only_once_its_mark_passed() {
        let mut mem = Vec::new();
        let w = writer(&mut mem);
        let cap = w.layout.inflight_cap as u64;
        let words = vec![0u64; w.layout.marks_cap as usize];
        // SAFETY: as above.
        unsafe { w.set_mark_words(words.as_ptr().cast_mut()) };
        let word = || {
            // SAFETY: index 0 of the words above.
            unsafe { AtomicU64::from_ptr(words.as_ptr().cast_mut()) }
        };
        assert!(w.launch(&launch(5, 1), None));
        // Launch 5 + cap has 5's home; 5 is not retired, so it goes elsewhere.
        assert!(w.launch(&launch(5 + cap, 1), None));
        assert!(w.find_inflight(5).is_some());
        // The mark passes 5 (the cache has not seen it yet: read from the word).
        word().store(5, Relaxed);
        assert!(w.launch(&launch(5 + 2 * cap, 1), None));
        assert!(w.find_inflight(5).is_none(), "retired launch kept its slot");
        assert_eq!(w.done_seen[0].load(Relaxed), 5);
    }
}
