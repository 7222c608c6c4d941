//! Everything the shim keeps per launching thread, in one thread-local.
//!
//! Why one: the shim is a `dlopen`ed library, so each access to one of its thread-locals is a
//! call to `__tls_get_addr` (the general-dynamic TLS model). With a thread-local per purpose a
//! hooked launch made ~12 such calls (callgrind on the simulated driver: 143 instructions a
//! launch in `__tls_get_addr` alone, every call a function call the launch path waits for).
//! Now a hook looks this state up once on entry and once on exit and passes it down.
//!
//! Only the owning thread touches it (`Cell`s, no atomics). Const-initialised and without a
//! destructor, so a thread's first use allocates its TLS block and nothing runs at its exit.

use std::cell::Cell;

use super::handles::HandleCache;
use crate::{journal::Lines, marks::Pending};

/// `ThreadState::slot`: not claimed yet / none left in the journal.
pub const SLOT_UNCLAIMED: u32 = u32::MAX;
pub const SLOT_NONE: u32 = u32::MAX - 1;

pub struct ThreadState {
    /// Inside a hooked launch entry point now (the hook coverage check reads it).
    pub inside: Cell<bool>,
    /// The hooked launch this thread is inside is being recorded by the hook (decided once
    /// at its entry): a backend's launch callback nested in the same call leaves it alone,
    /// whatever the pass-through flag says by then.
    pub hook_records: Cell<bool>,
    /// This thread's journal slot (`SLOT_UNCLAIMED`, `SLOT_NONE`, or the index).
    pub slot: Cell<u32>,
    /// This thread's id (0 = not read yet): gettid is a syscall, too dear for every launch.
    pub tid: Cell<u32>,
    /// The launch this thread is inside now: (correlation, name id); (0, 0) outside. A graph
    /// node created during a launch call is that launch being captured into a graph.
    pub in_launch: Cell<(u64, u32)>,
    /// The launch this thread is inside, if its stream is marked: (correlation, graph launch,
    /// what `Marks::before_launch` decided), for the API exit.
    pub pending: Cell<Option<(u64, bool, Pending)>>,
    /// (context, its device) of this thread's last launch: cuCtxGetDevice once per context.
    pub device: Cell<(usize, u32)>,
    /// The launch being recorded gave its id to the record of its stream's work from before
    /// `wedgeprobe attach` (`Recorder::pre_attach`).
    pub pre_attach_taken: Cell<bool>,
    /// The journal lines this thread's next launch will likely write, prefetched at the
    /// hook's entry (`Writer::prefetch_lines`).
    pub next_lines: Cell<Lines>,
    /// The synchronize this thread is inside: the id through which its return proves
    /// launches done (`Recorder::sync_floor`), for its exit callback.
    pub sync_floor: Cell<u64>,
    /// Launched functions' name ids by handle (tag: the hooks' epoch).
    pub names: HandleCache<256>,
    /// Streams by (handle, per-thread flag) (tag: the hooks' epoch): the stream id + 1 in the
    /// low half, the journal mark slot + 1 in the high half (0: not looked up).
    pub streams: HandleCache<32>,
    /// Executable graphs' ids by handle (tag: the hooks' epoch).
    pub graphs: HandleCache<32>,
    /// Names the driver's callbacks passed, by the address of the name (see
    /// `Recorder::launch_keyed`; tag: a check of the name's length and first bytes).
    pub callback_names: HandleCache<256>,
}

thread_local! {
    static STATE: ThreadState = const {
        ThreadState {
            inside: Cell::new(false),
            hook_records: Cell::new(false),
            slot: Cell::new(SLOT_UNCLAIMED),
            tid: Cell::new(0),
            in_launch: Cell::new((0, 0)),
            pending: Cell::new(None),
            device: Cell::new((0, 0)),
            pre_attach_taken: Cell::new(false),
            sync_floor: Cell::new(0),
            next_lines: Cell::new(Lines {
                ring: 0,
                slot: 0,
                thread: 0,
            }),
            names: HandleCache::new(),
            streams: HandleCache::new(),
            graphs: HandleCache::new(),
            callback_names: HandleCache::new(),
        }
    };
}

/// Runs `f` with the calling thread's state (one `__tls_get_addr`).
///
/// `f` runs here, in the caller's code, not inside `LocalKey::with`: that generic was
/// compiled in another codegen unit with the whole hooked launch inlined into it, and from
/// there the hooks' statics were reached through the GOT. Callgrind's cache model of a
/// serving loop (`scripts/shim_cache_model.sh`, 2026-12-02): 27.0 → 25.0 data misses and
/// 964 → 870 instructions a launch. (Laying `ThreadState` out hot-first in aligned lines and
/// aligning the handle caches' sets gained nothing on top of this in the model: not kept.)
#[inline(always)]
pub fn with<R>(f: impl FnOnce(&ThreadState) -> R) -> R {
    let state: *const ThreadState = STATE.with(std::ptr::from_ref);
    // SAFETY: the state is const-initialised with no destructor (asserted below), so it is
    // a plain thread-local that lives as long as the calling thread, at a fixed address; the
    // reference does not outlive this call on this thread.
    f(unsafe { &*state })
}

impl ThreadState {
    /// The device of a launch's context, which is current during the launch call (cached per
    /// thread: cuCtxGetDevice once per context).
    #[inline]
    pub fn device_of(&self, ctx: usize) -> u32 {
        let (cached_ctx, dev) = self.device.get();
        if cached_ctx == ctx && cached_ctx != 0 {
            return dev;
        }
        let mut d = 0i32;
        let ok = crate::driver::driver()
            .ctx_get_device
            // SAFETY: an out-pointer; the launch's context is current.
            .is_some_and(|f| unsafe { f(&mut d) } == 0);
        let dev = if ok { d.max(0) as u32 } else { 0 };
        self.device.set((ctx, dev));
        dev
    }

    /// This thread's id, read once.
    #[inline]
    pub fn tid(&self) -> u32 {
        let t = self.tid.get();
        if t != 0 {
            return t;
        }
        // SAFETY: gettid has no preconditions.
        let t = unsafe { libc::gettid() } as u32;
        self.tid.set(t);
        t
    }
}

// `with` cannot fail (and so cannot panic inside a hook) only because the state has no
// destructor: a const-initialised thread-local without one is never "destroyed".
const _: () = assert!(!std::mem::needs_drop::<ThreadState>());
