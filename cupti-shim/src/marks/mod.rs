//! Stream progress marks: how the shim learns that kernels completed without a per-kernel
//! completion record. After a launch, when the stream has had `every` launches or `us` µs
//! since its last mark, the shim enqueues a mark of the launch's correlation id on the
//! stream: an event record (`crate::marks::events`: the flush thread's poll finds the newest
//! passed), or `cuStreamWriteValue64(stream, word, correlation)` (the GPU writes the id into
//! pinned host memory once everything before it on the stream has run) where events are not
//! ready or not wanted (`WEDGEPROBE_SHIM_MARK_WITH=write`). Everything up to a passed mark has
//! completed; a stuck kernel is among the launches after the last passed mark, up to the
//! first launch with a mark after it.
//!
//! Why: per-kernel CONCURRENT_KERNEL records cost ~0.9 µs of CPU per eager launch and ~0.5 µs
//! of GPU time per graph kernel node on the H200 (18% and 5.5% of a serving workload); a mark
//! costs about one stream-ordered write (~0.8 µs, docs/measured-facts.md) per `every` launches,
//! and graph launches get one each (not one per node).
//!
//! Naming stays exact where marks bracket the stuck kernel alone: a stream whose launches come
//! `us` µs apart or more is marked after every launch, and the first launch after an idle gap
//! of `us` gets marks on both sides (the launch before the gap is marked first). Elsewhere the verdict lists
//! the candidates (`FLAG_MARKED`, probe-user's `journal::heads`), never one guessed name.
//!
//! A stream's last launch before it goes quiet would stay unproven (and age into a false
//! wedge): the flush thread marks a stream whose latest launch is unmarked and 100 ms old and
//! on which no launch is in progress (`idle_marks`; a launch waiting for room in a full queue
//! means a mark would wait too, and the flush thread must keep publishing), from its own
//! thread with the stream's context made current — never a stream
//! or context whose destruction has started (CUPTI resource callbacks, under the slot's lock),
//! never a per-thread default stream (that handle means the calling thread's own), and never
//! the legacy default stream: an operation there synchronises with every blocking stream of
//! the context, and one the program did not issue could make a blocking stream wait behind
//! another (behind a stuck kernel, even). Marks right after a program's own launch on it add
//! no ordering that launch did not. So the last launches before a legacy stream goes quiet are
//! proven done by the next synchronize or mark; until then its head can age (a `stuck` verdict
//! still needs a blocked thread or the hard bound).
//!
//! Capture safety (a stream being captured into a CUDA graph must never see our calls): the
//! pinned words are allocated by the flush thread, never by a launching thread (an
//! allocation during a capture in the default global mode fails *and invalidates the user's
//! capture* — seen on the H200), with its capture interaction mode set to relaxed and only
//! while no capture is in progress (`captures`, from CUPTI's callbacks on cuStreamBeginCapture
//! and cuStreamEndCapture); a mark is never enqueued on a stream that is capturing
//! (cuStreamIsCapturing, asked only while some capture is in progress), nor on the legacy
//! default stream then, and idle marks wait for captures to end.
//!
//! State: one `StreamState` per journal mark slot (same index), updated by the launching
//! threads with relaxed atomics (a stream is normally launched to by one thread; a race costs
//! one mark too many or too few, never a wrong retirement). The pinned words are allocated at
//! the first launch (a context is current then), once per process.

use std::{
    ffi::c_void,
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering::*},
    },
};

pub mod events;
pub mod graph;

use self::events::{Recorded, Ring};
use crate::{driver, journal::Writer, self_cost::Reason};

/// `CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP` (cuda.h).
const HOST_ALLOC_FLAGS: u32 = 0x01 | 0x02;
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream, valid wherever a CUstream is.
pub const STREAM_PER_THREAD: u64 = 0x2;
/// `CU_STREAM_LEGACY`: the legacy default stream (as is the null handle).
pub const STREAM_LEGACY: u64 = 0x1;

/// Defaults. Measured on the H200 (BENCHMARKS.md, the recorder's price, 2026-12-01): a mark's stream write
/// costs the launching thread ~1.8 µs in eager decode (an event record ~0.8 µs), and eager
/// decode launches ~17 µs apart. With 8 launches / 100 µs it wrote 0.19 marks a launch, 70%
/// of them for the 100 µs period alone (the self cost of 2026-12-01's run: 45,698 of 65,498) — ~2% of
/// the step in marks. What keeps the named shapes exact is the gap rule (both sides of the
/// first launch after `gap_us` idle) and the mark after a synchronize, not the period or the
/// count: so the period is off and the count bound 16 (a stuck kernel inside a dense run of
/// launches is narrowed to at most 16 candidates, listed; the exact mode names it).
pub const DEFAULT_EVERY: u32 = 16;
pub const DEFAULT_US: u32 = 100;
/// The period bound (`WEDGEPROBE_SHIM_MARK_PERIOD_US`; 0: off, the default): a mark after a
/// launch this many µs after the stream's last mark. Off, a stream's progress still shows
/// every `every` launches, at each gap and synchronize, and in the flush thread's idle marks.
pub const DEFAULT_PERIOD_US: u32 = 0;

/// Marks are event records by default (`WEDGEPROBE_SHIM_MARK_WITH=write`: stream writes).
/// Measured on the H200 in one device call (2026-12-07, the harness's cost suite, 756 eager
/// pairs each, BENCHMARKS.md): eager decode +2.97% with event marks against +3.93% with
/// stream writes, the launch-bound loop +3.34% against +4.99%, its CUDA graph +0.08% against
/// +1.60%, graph decode +0.05% against +0.13%; a stream write stalls its stream ~2.1 µs of
/// GPU time where an event record costs none measurable (`gpu/mark_bubble.cu`). They were
/// opt-in from 2026-12-01 until the rings were made off the flush thread (`make_events`):
/// an event's progress is learned only from the flush thread's queries, and making a ring
/// behind a full queue held that thread, so a wedge right after a stream's first launches
/// was narrowed, not named. Streams without a ring yet (until the next flush tick, ≤ 100 ms), those past
/// `MAX_RINGS`, and any whose ring is full or failed mark with stream writes: both are read
/// as lower bounds of the stream's progress.
pub const DEFAULT_WITH_EVENTS: bool = true;

/// When marks are enqueued (`WEDGEPROBE_SHIM_MARK_EVERY`, `…_MARK_US`, `…_MARK_PERIOD_US`).
#[derive(Clone, Copy, Debug)]
pub struct Cadence {
    /// After this many launches since the stream's last mark.
    pub every: u32,
    /// Both sides of the first launch after an idle gap of this many µs.
    pub gap_us: u32,
    /// After a launch this many µs after the stream's last mark (0: never).
    pub period_us: u32,
}

/// A stream's last launch is marked by the flush thread once it is this old.
const IDLE_NS: u64 = 100_000_000;

/// Streams that get event rings (each `events::RING` events); the rest mark with stream
/// writes. Serving processes use a handful of streams per device.
const MAX_RINGS: u32 = 32;

/// `StreamState::gone`: alive, the stream destroyed (its context lives: its events can be
/// destroyed), the context gone (its events with it).
const ALIVE: u8 = 0;
const STREAM_GONE: u8 = 1;
const CONTEXT_GONE: u8 = 2;

/// In C order, what a launch reads and writes first, in one cache line (asserted below).
#[derive(Default)]
#[repr(C, align(64))]
struct StreamState {
    since_mark: AtomicU32,
    /// The thread whose synchronize covering this stream returned, entered after the
    /// stream's latest launch (0: none since).
    synced_by: AtomicU32,
    /// A launch on the stream entered and has not returned: the stream is not idle, and an
    /// idle mark would wait with the launch for room in its full queue.
    launching: AtomicBool,
    /// An injected shim (`wedgeprobe attach`) has stood for the stream's work from before it
    /// with a launch record of its own (`Marks::pre_attach`).
    pre_attach_done: AtomicBool,
    gone: AtomicU8,
    last_mark_ns: AtomicU64,
    last_launch_ns: AtomicU64,
    /// Correlation id of the stream's latest successful launch, and of its latest mark.
    last_corr: AtomicU64,
    last_marked: AtomicU64,
    /// For idle marks and event polls: the stream's handle and context (0: unknown), and
    /// whether its destruction (or its context's) has begun (`ALIVE`, `STREAM_GONE`,
    /// `CONTEXT_GONE`). `gone` and the flush thread's driver calls on the stream are
    /// serialised by `idle_lock`.
    stream: AtomicU64,
    ctx: AtomicU64,
    idle_lock: Mutex<()>,
    /// The stream's event marks.
    ring: Ring,
}
const _: () = assert!(std::mem::offset_of!(StreamState, ctx) + 8 <= 64);

/// In C order, what a launch reads first (one cache line: 64 bytes, asserted below).
#[repr(C, align(64))]
pub struct Marks {
    streams: Box<[StreamState]>,
    /// An idle gap this long before a launch marks both sides of it.
    gap_ns: u64,
    /// A stream's launches are marked at least this often (while it launches).
    period_ns: u64,
    device_words: AtomicU64,
    every: u32,
    /// Stream captures in progress in the process (begun and not ended).
    captures: AtomicU32,
    /// 0 = words not allocated yet, 1 = allocating, 2 = ready, 3 = failed for good.
    status: AtomicU8,
    /// Marks are event records where a stream's ring is ready (else stream writes).
    with_events: bool,
    /// The shim was injected into a running process: each stream's work from before is
    /// unknown (`pre_attach`).
    attached_late: AtomicBool,
    /// Event rings created so far (at most `MAX_RINGS`).
    rings: AtomicU32,
    /// The context of the first launch: the flush thread allocates the words in it.
    want_ctx: AtomicU64,
    /// The thread that creates and destroys event rings (`make_events`), once started.
    maker: OnceLock<std::thread::Thread>,
    /// At the flush thread's last poll some stream had marked since the one before (`polling`).
    events_outstanding: AtomicBool,
}
const _: () = assert!(std::mem::offset_of!(Marks, want_ctx) + 8 <= 64);

static MARKS: OnceLock<Marks> = OnceLock::new();

const READY: u8 = 2;
const FAILED: u8 = 3;

/// Flags of the marks' stream writes: 0 (the driver's memory fence before the write), or
/// `CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER` under the measurement switch `no_barrier`
/// (`crate::measure`).
pub static WRITE_FLAGS: AtomicU32 = AtomicU32::new(0);

/// Turns marks on for a journal of `cap` streams (at initialisation, off the launch path);
/// `with_events`: record them as events where possible.
pub fn init(cap: u32, cadence: Cadence, with_events: bool) -> &'static Marks {
    MARKS.get_or_init(|| Marks {
        every: cadence.every.max(1),
        gap_ns: u64::from(cadence.gap_us) * 1_000,
        period_ns: match cadence.period_us {
            0 => u64::MAX,
            us => u64::from(us) * 1_000,
        },
        streams: (0..cap).map(|_| StreamState::default()).collect(),
        status: AtomicU8::new(0),
        device_words: AtomicU64::new(0),
        want_ctx: AtomicU64::new(0),
        captures: AtomicU32::new(0),
        with_events,
        rings: AtomicU32::new(0),
        attached_late: AtomicBool::new(false),
        maker: OnceLock::new(),
        events_outstanding: AtomicBool::new(true),
    })
}

/// A stream capture began (`true`) or ended, as CUPTI's callbacks report it.
pub fn capture(begun: bool) {
    if let Some(m) = MARKS.get() {
        if begun {
            m.captures.fetch_add(1, AcqRel);
        } else {
            let _ = m
                .captures
                .try_update(AcqRel, Acquire, |c| Some(c.saturating_sub(1)));
        }
    }
}

/// A launch's or synchronize's stream as the journal and marks keep it: the per-thread
/// default stream (a null stream through a `_ptsz` entry point) as `STREAM_PER_THREAD`, a
/// handle valid anywhere (marks are written to it).
pub fn stream_handle(stream: u64, per_thread: bool) -> u64 {
    if stream == 0 && per_thread {
        STREAM_PER_THREAD
    } else {
        stream
    }
}

/// `WEDGEPROBE_SHIM_DEBUG=1`: one line per event of the marks' set-up (never per launch).
pub(crate) fn debug(args: std::fmt::Arguments) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var("WEDGEPROBE_SHIM_DEBUG").is_ok_and(|v| v == "1")) {
        crate::log_line(format!("debug: {args}").as_bytes());
    }
}

pub fn get() -> Option<&'static Marks> {
    if crate::journal::file::forked() {
        return None; // a forked child records nothing (`record::forked`)
    }
    MARKS.get()
}

/// What `before_launch` decided, for `after_launch`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pending {
    pub slot: u32,
    pub stream: u64,
    /// Mark right after the launch, and why (the reason is for `crate::self_cost`).
    pub mark_after: Option<Reason>,
    pub now_ns: u64,
}

impl Marks {
    /// The shim was injected into a running process (`wedgeprobe attach`).
    pub fn set_attached_late(&self) {
        self.attached_late.store(true, Release);
    }

    /// After an attach, before the first launch the shim sees on the stream of mark slot
    /// `slot`: whether the stream's earlier work needs a record standing for it (once per
    /// stream). The caller records it as launch `correlation` and calls `pre_attach`.
    pub fn wants_pre_attach(&self, slot: u32) -> bool {
        self.attached_late.load(Relaxed)
            && self
                .streams
                .get(slot as usize)
                .is_some_and(|s| !s.pre_attach_done.swap(true, Relaxed))
    }

    /// Marks the record standing for a stream's work from before the attach (launch
    /// `correlation`), so it completes — and the first real launch has a window of its own —
    /// as soon as that work has.
    pub fn pre_attach(
        &self,
        writer: &Writer,
        slot: u32,
        stream: u64,
        correlation: u64,
        now_ns: u64,
    ) {
        if let Some(s) = self.streams.get(slot as usize) {
            self.mark(
                writer,
                s,
                (slot, stream),
                correlation,
                (now_ns, Reason::PreAttach),
            );
        }
    }

    /// Whether marks can be enqueued now; the first call names the context the flush thread
    /// is to allocate the pinned words in.
    pub fn ready(&self, ctx: u64) -> bool {
        if self.status.load(Acquire) == READY {
            return true;
        }
        if ctx != 0 {
            let first = self
                .want_ctx
                .compare_exchange(0, ctx, AcqRel, Relaxed)
                .is_ok();
            if first {
                debug(format_args!("marks wanted in context {ctx:#x}"));
            }
        } else {
            debug(format_args!("a launch without a current context"));
        }
        false
    }

    /// Whether the flush thread has words to allocate (it then polls every 10 ms, not 100).
    pub fn allocation_wanted(&self) -> bool {
        self.status.load(Acquire) == 0 && self.want_ctx.load(Acquire) != 0
    }

    /// Flush thread: allocates the pinned words once a launch named a context and no capture
    /// is in progress — the backup for a process whose contexts were created before the shim
    /// was there. `Err` means marks cannot work in this process and the caller falls back.
    pub fn allocate_if_wanted(&self, writer: &Writer) -> Result<(), &'static str> {
        let ctx = self.want_ctx.load(Acquire);
        if ctx == 0 || self.captures.load(Acquire) != 0 {
            return Ok(());
        }
        self.allocate_in(writer, ctx)
    }

    /// Allocates the pinned words in context `ctx`, once per process: called as a context is
    /// created (nothing can be capturing in it yet) or from the flush thread. The calling
    /// thread's capture mode is relaxed for the allocation and restored after.
    pub fn allocate_in(&self, writer: &Writer, ctx: u64) -> Result<(), &'static str> {
        if self.status.compare_exchange(0, 1, AcqRel, Acquire).is_err() {
            return Ok(());
        }
        let r = allocate(self.streams.len(), ctx);
        debug(format_args!(
            "marks' memory allocated in context {ctx:#x}: {:?}",
            r.map(|_| ())
        ));
        match r {
            Ok((host, device)) => {
                // SAFETY: `host` holds `streams.len()` (= marks_cap) zeroed u64s, pinned for the
                // process's life; the GPU writes them, the CPU reads them atomically.
                unsafe { writer.set_mark_words(host.cast()) };
                self.device_words.store(device, Release);
                self.status.store(READY, Release);
                Ok(())
            }
            Err(why) => {
                self.status.store(FAILED, Release);
                Err(why)
            }
        }
    }

    /// Before a launch on the stream of mark slot `slot`: after an idle gap of `us` or more
    /// since the stream's last launch, marks that launch first (so the new launch starts a
    /// window of its own), and says whether to mark after this launch.
    pub fn before_launch(
        &self,
        writer: &Writer,
        slot: u32,
        stream: u64,
        now_ns: u64,
        tid: u32,
    ) -> Pending {
        let Some(s) = self.streams.get(slot as usize) else {
            return Pending::default();
        };
        s.launching.store(true, Relaxed);
        let last = s.last_corr.load(Relaxed);
        let gap = now_ns.saturating_sub(s.last_launch_ns.load(Relaxed));
        // The first launch after an idle gap (a stream's first launch too) gets a window of
        // its own: a mark after it always — so a stream whose launches come `us` apart or more
        // is marked after every launch — and one before it where the launch before the gap is
        // unmarked. (Wedges often strike the first kernel after a synchronize.)
        let after_gap = gap >= self.gap_ns;
        // The first launch after this thread's synchronize too: the synchronize retired
        // everything before it, so a mark right after it gives it a window of its own — on
        // the H200 the wedge launched ~50 µs after a synchronize (under the 100 µs gap) was
        // otherwise narrowed to two candidates. Another thread's synchronize says nothing
        // about this thread's launches in flight around it.
        let after_sync =
            tid != 0 && s.synced_by.load(Relaxed) == tid && s.synced_by.swap(0, Relaxed) == tid;
        // A gap after this thread's synchronize needs no mark before the launch: the
        // synchronize retired the launch before the gap (eager decode synchronizes once a
        // step, at its longest gap: a run on 2026-12-01 wrote 2,949 such marks in 348,039 launches).
        if after_gap && !after_sync && last != 0 && last > s.last_marked.load(Relaxed) {
            self.mark(writer, s, (slot, stream), last, (now_ns, Reason::Gap));
        }
        let mark_after = if after_gap {
            Some(Reason::AfterGap)
        } else if after_sync {
            Some(Reason::AfterSync)
        } else if s.since_mark.load(Relaxed) + 1 >= self.every {
            Some(Reason::Every)
        } else if now_ns.saturating_sub(s.last_mark_ns.load(Relaxed)) >= self.period_ns {
            Some(Reason::Period)
        } else {
            None
        };
        Pending {
            slot,
            stream,
            mark_after,
            now_ns,
        }
    }

    /// A synchronize of `stream` (`ALL_STREAMS`: of every stream) entered as `correlation`
    /// returned on thread `tid`: where it was entered after the stream's latest launch, that
    /// thread's next launch on it is marked right after.
    pub fn synced(&self, writer: &Writer, stream: u64, correlation: u64, tid: u32) {
        // The claimed slots only: a walk over all `marks_cap` was ~1 cold line a launch in
        // eager decode's one synchronize a step (callgrind's cache model, 2026-12-02).
        for s in writer
            .claimed_marks()
            .filter_map(|i| self.streams.get(i as usize))
        {
            if (stream == probe_common::journal::ALL_STREAMS || s.stream.load(Relaxed) == stream)
                && correlation > s.last_corr.load(Relaxed)
            {
                s.synced_by.store(tid, Relaxed);
            }
        }
    }

    /// The context a stream's launches run in (for idle marks from the flush thread).
    pub fn set_context(&self, slot: u32, stream: u64, ctx: u64) {
        if let Some(s) = self.streams.get(slot as usize)
            && s.ctx.load(Relaxed) != ctx
        {
            s.stream.store(stream, Relaxed);
            s.ctx.store(ctx, Release);
        }
    }

    /// Destruction of `stream` (or, with `stream` 0, of every stream of `ctx`) has started:
    /// the flush thread must not touch it again.
    pub fn forget(&self, ctx: u64, stream: u64) {
        for s in self.streams.iter() {
            if s.ctx.load(Acquire) == ctx && (stream == 0 || s.stream.load(Relaxed) == stream) {
                let _guard = s.idle_lock.lock();
                let why = if stream == 0 {
                    CONTEXT_GONE
                } else {
                    STREAM_GONE
                };
                s.gone.fetch_max(why, Release);
            }
        }
    }

    /// A primary context was released or reset: no idle mark touches any stream again.
    pub fn forget_all(&self) {
        for s in self.streams.iter() {
            let _guard = s.idle_lock.lock();
            s.gone.store(CONTEXT_GONE, Release);
        }
    }

    /// Whether a stream capture is in progress anywhere in the process.
    pub fn capturing(&self) -> bool {
        self.captures.load(Acquire) != 0
    }

    /// Flush thread: marks streams whose latest launch is unmarked and `IDLE_NS` old.
    pub fn idle_marks(&self, writer: &Writer, now_ns: u64) {
        // Not once the process is exiting (our atexit handler turned the journal off before
        // the runtime's teardown destroys contexts, possibly without a destroy callback).
        if self.status.load(Acquire) != READY
            || self.captures.load(Acquire) != 0
            || writer.state() != probe_common::journal::STATE_RECORDING
        {
            return;
        }
        let Some(set_current) = driver::driver().ctx_set_current else {
            return;
        };
        for slot in writer.claimed_marks() {
            let Some(s) = self.streams.get(slot as usize) else {
                continue;
            };
            let last = s.last_corr.load(Relaxed);
            let (stream, ctx) = (s.stream.load(Relaxed), s.ctx.load(Acquire));
            // A launch still in progress: the stream is not idle but (most likely) full —
            // behind a wedged kernel, the launching thread waits for room, and a mark would
            // wait with it: the flush thread would publish nothing more (the CI run where
            // marks published just before the wedge named the kernel before the stuck one,
            // from a mark that had passed) and could not release.
            if last == 0
                || s.launching.load(Relaxed)
                || last <= s.last_marked.load(Relaxed)
                || now_ns.saturating_sub(s.last_launch_ns.load(Relaxed)) < IDLE_NS
                || ctx == 0
                || stream == STREAM_PER_THREAD
                || stream == 0
                || stream == STREAM_LEGACY
            {
                continue;
            }
            // Not `lock`: the event maker holds it while it makes this stream's ring, which
            // can wait behind another stream's full queue; the mark waits for a later tick.
            let Ok(_guard) = s.idle_lock.try_lock() else {
                continue;
            };
            if s.gone.load(Acquire) != ALIVE {
                continue;
            }
            // SAFETY: a context whose destruction has not started (checked under the lock
            // its destroy callback takes), made current on our own thread.
            if unsafe { set_current(ctx as *mut c_void) } != 0 {
                continue;
            }
            self.mark(writer, s, (slot, stream), last, (now_ns, Reason::Idle));
        }
    }

    /// Flush thread, every tick (10 ms while event marks are on): asks each stream's
    /// outstanding events how far it got and notes that as its progress. Creating a stream's
    /// ring and giving back a destroyed stream's events is `make_events`' work, on a thread of
    /// its own, woken from here: on the H200 (2026-12-07, the harness's launch and burst
    /// wedges with event marks) the first mark of a stream wanted its ring just as the
    /// launching thread filled the queue behind the stuck kernel, `cuEventCreate` waited
    /// behind that blocked launch until the kernel was released, and the flush thread waited
    /// with it: no mark published, the heartbeat 5.3 s stale, the stuck kernel one of 966.
    /// `cuEventQuery` does not wait there (`gpu/event_marks.cu`: 11–19 µs with the launcher
    /// blocked). A slot whose lock the maker holds is skipped this tick: its ring is not
    /// ready, so its marks are stream writes, published from memory. Not while a capture is
    /// in progress, nor once the journal stopped recording.
    pub fn poll_events(&'static self, writer: &'static Writer) {
        if !self.events_wanted_now(writer) {
            // No poll now: no fast ticks for one (a released or stopped shim ticks every
            // 100 ms; a capture's end is seen within that).
            self.events_outstanding.store(false, Relaxed);
            return;
        }
        let Some(query) = driver::driver().event_query else {
            return;
        };
        let t0 = if crate::self_cost::on() {
            crate::self_cost::tsc()
        } else {
            0
        };
        let mut queries = 0;
        let mut maker_work = false;
        // Whether any stream marked since the last poll, or a ring is being made (its stream
        // is marking): the next tick comes in 10 ms then.
        let mut outstanding = false;
        for slot in writer.claimed_marks() {
            let Some(s) = self.streams.get(slot as usize) else {
                continue;
            };
            let Ok(_guard) = s.idle_lock.try_lock() else {
                outstanding = true;
                continue;
            };
            match s.gone.load(Acquire) {
                ALIVE => {}
                STREAM_GONE => {
                    maker_work |= s.ring.has_events();
                    continue;
                }
                _ => continue,
            }
            if s.ring.wanted() {
                let make = s.ctx.load(Acquire) != 0 && self.rings.load(Relaxed) < MAX_RINGS;
                maker_work |= make;
                outstanding |= make;
                continue;
            }
            // Marked since the last poll: the stream is busy, the next poll comes in 10 ms.
            outstanding |= s.ring.outstanding();
            let (passed, n) = s.ring.poll(query);
            queries += n;
            if let Some(c) = passed {
                writer.mark_progress(slot, c);
            }
        }
        self.events_outstanding.store(outstanding, Relaxed);
        if maker_work {
            self.wake_maker(writer);
        }
        if t0 != 0 {
            crate::self_cost::poll(queries, crate::self_cost::tsc().wrapping_sub(t0));
        }
    }

    /// Whether event marks are polled and made now: on, the pinned words ready, no capture in
    /// progress (nothing of ours runs beside one), the journal recording.
    fn events_wanted_now(&self, writer: &Writer) -> bool {
        self.with_events
            && self.status.load(Acquire) == READY
            && self.captures.load(Acquire) == 0
            && writer.state() == probe_common::journal::STATE_RECORDING
    }

    /// Wakes the event maker (`make_events`), starting it the first time.
    fn wake_maker(&'static self, writer: &'static Writer) {
        if let Some(t) = self.maker.get() {
            t.unpark();
            return;
        }
        let started = std::thread::Builder::new()
            .name("wedgeprobe-events".into())
            .spawn(move || {
                loop {
                    if get().is_some() {
                        self.make_events(writer);
                    }
                    std::thread::park_timeout(std::time::Duration::from_secs(1));
                }
            });
        match started {
            Ok(h) => {
                let _ = self.maker.set(h.thread().clone());
            }
            Err(e) => {
                // No maker: every stream keeps stream writes. The ring count is set full, so
                // no stream asks again (and this is said once).
                self.rings.store(MAX_RINGS, Relaxed);
                let line = format!(
                    "event marks unavailable (no thread for them: {e}); marking with stream writes"
                );
                crate::log_line(line.as_bytes());
            }
        }
    }

    /// The event maker's thread (`wake_maker`): creates the event rings marking threads asked
    /// for (in the stream's context, its own capture mode relaxed) and gives back the events
    /// of destroyed streams. Any of these calls may wait behind a launch blocked in a full
    /// queue; only this thread waits then — the flush thread keeps polling and publishing.
    pub fn make_events(&self, writer: &Writer) {
        if !self.events_wanted_now(writer) {
            return;
        }
        let d = driver::driver();
        let (Some(create), Some(destroy), Some(set_current), Some(exchange)) = (
            d.event_create,
            d.event_destroy,
            d.ctx_set_current,
            d.exchange_capture_mode,
        ) else {
            return;
        };
        // Our own thread: relaxed for good, so no call of ours can invalidate a capture
        // another thread makes in the global mode.
        thread_local!(static RELAXED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
        if !RELAXED.get() {
            let mut mode = CAPTURE_MODE_RELAXED;
            // SAFETY: an in/out pointer to a valid mode.
            if unsafe { exchange(&mut mode) } != 0 {
                return;
            }
            RELAXED.set(true);
        }
        for slot in writer.claimed_marks() {
            let Some(s) = self.streams.get(slot as usize) else {
                continue;
            };
            let Ok(_guard) = s.idle_lock.lock() else {
                continue;
            };
            match s.gone.load(Acquire) {
                ALIVE => {}
                STREAM_GONE => {
                    s.ring.destroy_events(destroy);
                    continue;
                }
                _ => continue,
            }
            if !s.ring.wanted() {
                continue;
            }
            let ctx = s.ctx.load(Acquire);
            if ctx == 0 || self.rings.load(Relaxed) >= MAX_RINGS {
                continue;
            }
            // SAFETY: a context whose destruction has not started (checked under the lock
            // its destroy callback takes), made current on our own thread.
            if unsafe { set_current(ctx as *mut c_void) } != 0 {
                continue;
            }
            self.rings.fetch_add(1, Relaxed);
            let r = s.ring.create(create, destroy);
            debug(format_args!("event ring for mark slot {slot}: {r:?}"));
            static TOLD: AtomicBool = AtomicBool::new(false);
            if let Err(code) = r
                && !TOLD.swap(true, Relaxed)
            {
                let line = format!(
                    "event marks unavailable (cuEventCreate returned {code}); marking with \
                     stream writes (dearer)"
                );
                crate::log_line(line.as_bytes());
            }
        }
    }

    /// Whether the flush thread should tick fast: event marks are on and a stream marked
    /// since the poll before its last (their progress is found only by its polls, and
    /// in-flight slots retire only then). An idle process's flush thread ticks every 100 ms,
    /// as with stream writes. Measured by its schedstat on the simulated driver (this
    /// machine): a 10 ms tick costs it ~0.4% of a core (40.8 ms in 10 s of `simworker
    /// healthy`, writes 3.9 ms); idle it now costs what it does with writes (5.4 ms in 8 s of
    /// `simworker idle-after`'s sleep, writes 5.3 ms; 10 ms ticks regardless: 35–41 ms in
    /// 10 s). The first marks after a quiet spell are polled ≤ 100 ms late, within a ring of
    /// `RING` unless a stream marks over 5,000 times a second (eager decode on the H200: ~100
    /// marks in 10 ms; past the ring a mark is a stream write).
    pub fn polling(&self) -> bool {
        self.with_events
            && self.status.load(Acquire) == READY
            && self.events_outstanding.load(Relaxed)
    }

    /// After the launch `correlation` returned `ok`.
    pub fn after_launch(&self, writer: &Writer, p: Pending, correlation: u64, ok: bool) {
        let Some(s) = self.streams.get(p.slot as usize) else {
            return;
        };
        if !ok {
            writer.launch_failed(correlation);
            s.launching.store(false, Relaxed);
            return;
        }
        s.last_corr.store(correlation, Relaxed);
        s.last_launch_ns.store(p.now_ns, Relaxed);
        if let Some(reason) = p.mark_after {
            self.mark(
                writer,
                s,
                (p.slot, p.stream),
                correlation,
                (p.now_ns, reason),
            );
        } else {
            // A load and a store, not a locked add: a stream is normally launched to by one
            // thread, and a lost count only moves the next mark by a launch.
            s.since_mark
                .store(s.since_mark.load(Relaxed).saturating_add(1), Relaxed);
        }
        // Only now: the mark after the launch can wait for room in the queue too.
        s.launching.store(false, Relaxed);
    }

    /// A graph launch: always marked (one mark per launch of ~hundreds of kernel nodes).
    pub fn after_graph_launch(&self, writer: &Writer, p: Pending, correlation: u64, ok: bool) {
        self.after_launch(
            writer,
            Pending {
                mark_after: Some(Reason::Graph),
                ..p
            },
            correlation,
            ok,
        );
    }

    /// Enqueues the mark of `correlation` on the stream of mark slot `slot` (`at`: when, and
    /// why — the latter for `crate::self_cost`).
    fn mark(
        &self,
        writer: &Writer,
        s: &StreamState,
        (slot, stream): (u32, u64),
        correlation: u64,
        (now_ns, reason): (u64, Reason),
    ) {
        let base = self.device_words.load(Acquire);
        let d = driver::driver();
        let (Some(write), Some(capturing)) = (d.write_value64, d.is_capturing) else {
            return;
        };
        if base == 0 {
            return;
        }
        // A write on a stream being captured would become a node of the user's graph (and
        // every replay would write a stale value), and a call another thread's capture in the
        // global mode deems unsafe would invalidate that capture: while any capture is in
        // progress, no marks at all (captures are rare and short; the next mark after it
        // covers the launches made meanwhile). cuStreamIsCapturing double-checks the stream.
        if self.captures.load(Acquire) != 0 {
            return;
        }
        let mut status = u32::MAX;
        // SAFETY: a stream handle the process just used; an out-pointer. (A pure query,
        // permitted during captures.)
        if unsafe { capturing(stream as *mut c_void, &mut status) } != 0 || status != 0 {
            return;
        }
        let t0 = if crate::self_cost::on() {
            crate::self_cost::tsc()
        } else {
            0
        };
        let as_event = match (self.with_events, d.event_record) {
            (true, Some(record)) => s.ring.record(record, stream, correlation),
            _ => Recorded::NotReady,
        };
        let r = match as_event {
            Recorded::Yes => 0,
            // Another thread marks this stream this very moment: its mark covers ours but
            // for at most the launch in between (a race the single-writer design accepts).
            Recorded::Busy => return,
            // SAFETY: a stream the process just launched on, a device address of our pinned
            // words (slot < marks_cap), flags `WRITE_FLAGS`: a stream-ordered 64-bit write.
            _ => unsafe {
                write(
                    stream as *mut c_void,
                    base + slot as u64 * 8,
                    correlation,
                    WRITE_FLAGS.load(Relaxed),
                )
            },
        };
        if t0 != 0 {
            crate::self_cost::mark(
                reason,
                as_event == Recorded::Yes,
                crate::self_cost::tsc().wrapping_sub(t0),
            );
        }
        if r != 0 {
            writer.count_drop(probe_common::journal::drops::MARK_FAILED);
            return;
        }
        writer.set_marked(correlation);
        s.last_marked.store(correlation, Relaxed);
        s.last_mark_ns.store(now_ns, Relaxed);
        s.since_mark.store(0, Relaxed);
    }
}

/// `CU_STREAM_CAPTURE_MODE_RELAXED` (cuda.h): this thread may make calls that are unsafe
/// during a capture even while another thread captures in the global mode.
const CAPTURE_MODE_RELAXED: u32 = 2;

/// Pinned, device-mapped, zeroed memory for `n` progress words, allocated in context `ctx`
/// (pushed for the call) with this thread's capture mode relaxed: (host, device address).
fn allocate(n: usize, ctx: u64) -> Result<(*mut u64, u64), &'static str> {
    let d = driver::driver();
    let (Some(alloc), Some(dev_ptr), Some(_), Some(_), Some(push), Some(pop), Some(exchange)) = (
        d.host_alloc,
        d.host_device_pointer,
        d.write_value64,
        d.is_capturing,
        d.ctx_push,
        d.ctx_pop,
        d.exchange_capture_mode,
    ) else {
        return Err(
            "stream marks unavailable: libcuda lacks cuMemHostAlloc, cuMemHostGetDevicePointer_v2, cuStreamWriteValue64, cuStreamIsCapturing, cuCtxPushCurrent_v2, cuCtxPopCurrent_v2 or cuThreadExchangeStreamCaptureMode",
        );
    };
    let mut mode = CAPTURE_MODE_RELAXED;
    // SAFETY: an in/out pointer to a valid mode; restored below.
    if unsafe { exchange(&mut mode) } != 0 {
        return Err("stream marks unavailable: cannot relax the thread's capture mode");
    }
    // SAFETY: a context that exists (being created, or a launch ran in it); popped below.
    let pushed = unsafe { push(ctx as *mut c_void) } == 0;
    let result = if pushed {
        pinned(alloc, dev_ptr, n)
    } else {
        Err("stream marks unavailable: cannot make the context current")
    };
    if pushed {
        let mut popped: *mut c_void = std::ptr::null_mut();
        // SAFETY: pops what was pushed above.
        unsafe { pop(&mut popped) };
    }
    // SAFETY: restores the mode this thread had.
    unsafe { exchange(&mut mode) };
    result
}

fn pinned(
    alloc: driver::HostAlloc,
    dev_ptr: driver::HostDevicePointer,
    n: usize,
) -> Result<(*mut u64, u64), &'static str> {
    let bytes = n.max(1) * 8;
    let mut host: *mut c_void = std::ptr::null_mut();
    // SAFETY: out-pointer and flags as documented; the context is current on this thread.
    if unsafe { alloc(&mut host, bytes, HOST_ALLOC_FLAGS) } != 0 || host.is_null() {
        return Err("cuMemHostAlloc for the stream marks failed");
    }
    // SAFETY: `bytes` writable bytes just allocated.
    unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, bytes) };
    let mut device = 0u64;
    // SAFETY: pinned memory allocated with DEVICEMAP; out-pointer.
    if unsafe { dev_ptr(&mut device, host, 0) } != 0 || device == 0 {
        return Err("cuMemHostGetDevicePointer for the stream marks failed");
    }
    Ok((host.cast(), device))
}
