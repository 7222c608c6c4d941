//! Launches recorded at libcuda's exported launch entry points instead of through CUPTI's
//! callbacks (the default with stream marks). Measured on the H200 (BENCHMARKS.md, the recorder's price):
//! CUPTI's launch callbacks were most of the shim's eager cost (launch-bound loop +31% with
//! them, +8% with them left off); a call through our function and a record costs tens of ns.
//!
//! Every caller reaches these entry points — the runtime's `cuGetProcAddress` hands out the
//! exported addresses, Triton binds them with `dlsym`, NCCL through the runtime — so one patch
//! per entry point covers them all (`crate::code_patch`). Where an entry point cannot be
//! patched, none is, and CUPTI's callbacks record launches as before (one log line).
//!
//! Correlation ids: CUPTI's are not seen here, so while hooks record, every journal id comes
//! from the recorder's own counter (`Recorder::next_correlation`), synchronizes included;
//! CUPTI's ids are translated where CUPTI still reports (`Recorder::own_correlation`).
//! While `wedgeprobe trace` leases per-kernel records the hooks pass launches through and
//! CUPTI's launch callbacks record them (their completion records need CUPTI's ids).

use std::{
    ffi::{CStr, c_char, c_void},
    sync::{
        OnceLock,
        atomic::{
            AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering,
        },
    },
};

use probe_common::api;

use crate::{
    code_patch,
    journal::Launch,
    recorder::{self, monotonic_ns},
    thread_state::{self, ThreadState},
};

/// Everything of the hooks' own a hooked launch reads, in two cache lines of their own.
/// Scattered statics were ~16 of the ~38 cold lines a launch took in callgrind's cache model
/// of a serving loop (BENCHMARKS.md, 2026-12-02): several of them reached through the GOT
/// first, two lines for one flag.
#[repr(C, align(64))]
struct Hot {
    /// The hooks are in place and record launches.
    active: AtomicBool,
    /// Launches pass through unrecorded: CUPTI's callbacks record them now (a per-kernel
    /// lease), or the shim stopped (released, process exiting).
    pass: AtomicBool,
    /// Measurement switch `pass` (`crate::measure`).
    measure_pass: AtomicBool,
    /// `crate::self_cost::on()`, mirrored (`self_cost_on`).
    self_cost: AtomicBool,
    /// `probe_common::api` ids of the entries (27 ids today).
    api: [AtomicU8; 8],
    /// The clock every timestamp of the shim reads (`clock_id`).
    clock: AtomicI32,
    /// The driver's `cuCtxGetCurrent` (0: none), asked by every launch.
    ctx_get_current: AtomicUsize,
    /// Bumped when handles may be reused (a module unloaded, a stream, graph or context
    /// destroyed): the per-thread caches drop what they hold.
    epoch: AtomicU64,
    /// Until then (CLOCK_MONOTONIC ns; 0 = never) every launch asks whether its stream is
    /// being captured (`crate::attach`).
    check_captures_until: AtomicU64,
    /// `recorder::get()`, `RESOLVE`, `marks::get()`, cached (null: not yet).
    recorder: AtomicPtr<recorder::Recorder>,
    resolve: AtomicPtr<Resolve>,
    marks: AtomicPtr<crate::marks::Marks>,
    /// The originals, reached through their trampolines (the second line).
    original: [AtomicUsize; 8],
}

static HOT: Hot = Hot {
    active: AtomicBool::new(false),
    pass: AtomicBool::new(false),
    measure_pass: AtomicBool::new(false),
    self_cost: AtomicBool::new(false),
    api: [const { AtomicU8::new(0) }; 8],
    clock: AtomicI32::new(libc::CLOCK_MONOTONIC),
    ctx_get_current: AtomicUsize::new(0),
    epoch: AtomicU64::new(1),
    check_captures_until: AtomicU64::new(0),
    recorder: AtomicPtr::new(std::ptr::null_mut()),
    resolve: AtomicPtr::new(std::ptr::null_mut()),
    marks: AtomicPtr::new(std::ptr::null_mut()),
    original: [const { AtomicUsize::new(0) }; 8],
};
const _: () = assert!(std::mem::size_of::<Hot>() == 128);

/// `get()`'s answer, kept in `slot` once there is one: a `OnceLock` that never changes after,
/// read through `HOT` (a line the launch reads anyway) instead of its own.
#[inline(always)]
fn cached<T>(slot: &AtomicPtr<T>, get: fn() -> Option<&'static T>) -> Option<&'static T> {
    let p = slot.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: stored below from a `&'static T`.
        return Some(unsafe { &*p });
    }
    let v = get()?;
    slot.store(std::ptr::from_ref(v).cast_mut(), Ordering::Release);
    Some(v)
}

#[inline(always)]
fn hot_recorder() -> Option<&'static recorder::Recorder> {
    cached(&HOT.recorder, recorder::get)
}

#[inline(always)]
pub(crate) fn hot_marks() -> Option<&'static crate::marks::Marks> {
    cached(&HOT.marks, crate::marks::get)
}

/// The clock `recorder::monotonic_ns` reads: CLOCK_MONOTONIC, or CLOCK_MONOTONIC_COARSE
/// under the measurement switch `WEDGEPROBE_SHIM_MEASURE=coarse_clock` (`crate::measure`).
#[inline(always)]
pub fn clock_id() -> libc::clockid_t {
    HOT.clock.load(Ordering::Relaxed)
}

pub fn set_clock(id: libc::clockid_t) {
    HOT.clock.store(id, Ordering::Relaxed);
}

/// `crate::self_cost` was switched on: hooked launches time themselves.
pub fn self_cost_on() {
    HOT.self_cost.store(true, Ordering::Relaxed);
}

/// Coverage check (`WEDGEPROBE_SHIM_VERIFY_HOOKS=1`, a validation switch): CUPTI's launch
/// callbacks stay on beside the hooks and count every launch CUPTI saw, and those that did
/// not come through a hook — a caller that reaches the driver's launch path some other way.
pub static VERIFY: AtomicBool = AtomicBool::new(false);
pub static SEEN_BY_CUPTI: AtomicU64 = AtomicU64::new(0);
pub static MISSED_BY_HOOKS: AtomicU64 = AtomicU64::new(0);

/// Whether the calling thread is inside a hooked launch entry point now.
pub fn inside() -> bool {
    thread_state::with(|t| t.inside.get())
}

/// Whether the calling thread is inside a hooked launch that its hook took (recorded, or left
/// out as a captured one). A launch
/// callback nested in that call asks this, not `recording()`: the pass-through flag can flip
/// between the hook's decision and the callback (a per-kernel lease starting or lapsing), and
/// the launch was then recorded twice under two correlation ids (seen once in a trace of
/// 300,000 launches on the simulated driver under load).
pub fn hook_records_this_launch() -> bool {
    thread_state::with(|t| t.inside.get() && t.hook_records.get())
}

/// The coverage check's line, at exit.
pub fn coverage_line() -> Option<Vec<u8>> {
    if !VERIFY.load(Ordering::Relaxed) {
        return None;
    }
    Some(
        format!(
            "hook coverage: {} launches seen by CUPTI, {} of them not through the launch hooks",
            SEEN_BY_CUPTI.load(Ordering::Relaxed),
            MISSED_BY_HOOKS.load(Ordering::Relaxed)
        )
        .into_bytes(),
    )
}

/// How the backend names what a launch refers to.
pub struct Resolve {
    /// (context, stream, per-thread default stream) → the stream id CUPTI's records use.
    pub stream_id: fn(usize, usize, u8) -> u32,
    /// An executable graph → its id in the journal's graph table (0: unknown).
    pub graph_id: fn(usize) -> u32,
    /// Called with each launch's context before it is recorded (the simulated driver has no
    /// context-created callback). None for CUPTI's backend, which learns contexts from CUPTI:
    /// a call through a pointer that did nothing still cost every launch a cold line.
    pub context: Option<fn(usize)>,
}

/// The patches applied, for `remove`.
static PATCHES: OnceLock<Vec<code_patch::Patch>> = OnceLock::new();

#[derive(Clone, Copy)]
enum Entry {
    Launch,
    LaunchPtsz,
    LaunchEx,
    LaunchExPtsz,
    Cooperative,
    CooperativePtsz,
    Graph,
    GraphPtsz,
}

const ENTRIES: [(Entry, &CStr); 8] = [
    (Entry::Launch, c"cuLaunchKernel"),
    (Entry::LaunchPtsz, c"cuLaunchKernel_ptsz"),
    (Entry::LaunchEx, c"cuLaunchKernelEx"),
    (Entry::LaunchExPtsz, c"cuLaunchKernelEx_ptsz"),
    (Entry::Cooperative, c"cuLaunchCooperativeKernel"),
    (Entry::CooperativePtsz, c"cuLaunchCooperativeKernel_ptsz"),
    (Entry::Graph, c"cuGraphLaunch"),
    (Entry::GraphPtsz, c"cuGraphLaunch_ptsz"),
];

type LaunchFn = unsafe extern "C" fn(
    *mut c_void,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> u32;
type LaunchExFn = unsafe extern "C" fn(
    *const cupti_sys::CUlaunchConfig,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> u32;
type CooperativeFn = unsafe extern "C" fn(
    *mut c_void,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut c_void,
    *mut *mut c_void,
) -> u32;
type GraphFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> u32;

/// Whether the hooks record launches now (CUPTI's launch callbacks are then off).
#[inline(always)]
pub fn recording() -> bool {
    HOT.active.load(Ordering::Relaxed)
        && !HOT.pass.load(Ordering::Relaxed)
        && !HOT.measure_pass.load(Ordering::Relaxed)
}

/// Measurement switch `WEDGEPROBE_SHIM_MEASURE=pass` (`crate::measure`): the hooks stay in
/// place and pass every launch through unrecorded, to price the detour alone.
pub fn measure_pass(on: bool) {
    HOT.measure_pass.store(on, Ordering::Relaxed);
}

static TRIED: AtomicBool = AtomicBool::new(false);

/// Whether `install` ran already (successful or not).
pub fn tried() -> bool {
    TRIED.load(Ordering::Acquire)
}

/// Whether the hooks are installed (journal correlation ids are then the recorder's own).
pub fn active() -> bool {
    HOT.active.load(Ordering::Relaxed)
}

/// Launches pass through (`true`: CUPTI's callbacks record them, or nothing does once the shim
/// stopped) or are recorded here again.
pub fn pass_through(on: bool) {
    HOT.pass.store(on, Ordering::SeqCst);
}

/// Handles may be reused from now on: cached names, stream ids and graph ids are dropped.
pub fn handles_changed() {
    HOT.epoch.fetch_add(1, Ordering::AcqRel);
}

/// Every patch, prepared: trampolines written and sealed, jumps not in place yet.
struct Prepared {
    launches: Vec<code_patch::Patch>,
    /// (index in `call_hooks`' table, patch).
    calls: Vec<(usize, code_patch::Patch)>,
}

/// Resolves the loaded libcuda's launch entry points (all of them, or `Err`), the other
/// entry points (`crate::call_hooks`, each where it exists and can be moved) when
/// `with_calls`, and writes every trampoline.
fn prepare(resolve: Resolve, with_calls: bool) -> Result<Prepared, &'static str> {
    if std::env::var("WEDGEPROBE_SHIM_HOOKS").is_ok_and(|v| v == "off" || v == "0") {
        return Err("launch hooks turned off by WEDGEPROBE_SHIM_HOOKS");
    }
    // SAFETY: RTLD_NOLOAD only finds a libcuda the process has loaded already.
    let h = unsafe {
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if h.is_null() {
        return Err("libcuda.so.1 is not loaded");
    }
    let mut targets = [0usize; 8];
    for (i, (_, name)) in ENTRIES.iter().enumerate() {
        // SAFETY: a valid handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(h, name.as_ptr()) } as usize;
        if p == 0 {
            return Err("libcuda lacks a launch entry point");
        }
        let head = {
            // SAFETY: an exported function's first 16 bytes are mapped code.
            unsafe { std::slice::from_raw_parts(p as *const u8, 16) }
        };
        if code_patch::prologue_len(head).is_none() {
            return Err(
                "libcuda's launch entry points begin with instructions the shim does not move",
            );
        }
        targets[i] = p;
        let id = api::id_of(name.to_str().unwrap_or_default()).ok_or("unknown entry point")?;
        let id = u8::try_from(id).map_err(|_| "entry point id out of range")?;
        HOT.api[i].store(id, Ordering::Relaxed);
    }
    if HOT.resolve.load(Ordering::Acquire).is_null() {
        // Leaked: read by every hooked launch until the process ends.
        HOT.resolve
            .store(Box::into_raw(Box::new(resolve)), Ordering::Release);
    }
    HOT.ctx_get_current.store(
        crate::driver::driver()
            .ctx_get_current
            .map_or(0, |f| f as usize),
        Ordering::Relaxed,
    );
    let mut page = code_patch::Page::near(targets[0])?;
    let ours: [usize; 8] = [
        launch as *const () as usize,
        launch_ptsz as *const () as usize,
        launch_ex as *const () as usize,
        launch_ex_ptsz as *const () as usize,
        cooperative as *const () as usize,
        cooperative_ptsz as *const () as usize,
        graph as *const () as usize,
        graph_ptsz as *const () as usize,
    ];
    // Every trampoline is written and made executable before the first jump goes in.
    let mut launches = Vec::with_capacity(8);
    for i in 0..8 {
        launches.push(page.prepare(targets[i], ours[i])?);
        HOT.original[i].store(launches[i].trampoline, Ordering::Release);
    }
    let mut calls = Vec::new();
    if with_calls {
        for (name, ours, i) in crate::call_hooks::entries() {
            // SAFETY: a valid handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(h, name.as_ptr()) } as usize;
            if p != 0
                && let Ok(patch) = page.prepare(p, ours)
            {
                calls.push((i, patch));
            }
        }
    }
    page.seal()?;
    Ok(Prepared { launches, calls })
}

/// Patches every launch entry point of the loaded libcuda, or none. At `cuInit`, before any
/// launch can run. `Err` says why (the caller keeps CUPTI's callbacks and logs it).
pub fn install(resolve: Resolve, with_calls: bool) -> Result<(), &'static str> {
    if HOT.active.load(Ordering::Acquire) {
        return Ok(());
    }
    TRIED.store(true, Ordering::Release);
    let Prepared { launches, calls } = prepare(resolve, with_calls)?;
    for (i, p) in launches.iter().enumerate() {
        // SAFETY: exported functions no thread runs yet (we are inside cuInit, before any
        // launch can be made); `ours[i]` has the entry's signature; the page is sealed.
        if let Err(why) = unsafe { p.apply() } {
            // Entries patched so far stay patched: they pass launches through unrecorded, and
            // CUPTI's callbacks record every launch as before.
            if i > 0 {
                HOT.pass.store(true, Ordering::SeqCst);
            }
            return Err(why);
        }
    }
    for (i, p) in &calls {
        crate::call_hooks::installed(*i, p.trampoline);
        // SAFETY: as above (inside cuInit); the wrapper passes any of these through.
        if unsafe { p.apply() }.is_err() {
            crate::call_hooks::installed(*i, 0);
        }
    }
    let mut all = launches;
    all.extend(calls.into_iter().map(|(_, p)| p));
    let _ = PATCHES.set(all);
    HOT.active.store(true, Ordering::Release);
    Ok(())
}

/// `wedgeprobe attach`: prepares every patch without applying it, and lists in `out` the code
/// words that apply them; wedgeprobe writes them while every thread of the process is stopped
/// (threads run here, and one could be half-way through a prologue the jump overwrites). The
/// hooks count as installed from now: a launch that reaches one is recorded. Returns how many
/// words there are.
pub fn prepare_for_attach(
    resolve: Resolve,
    out: &mut [probe_common::attach::PatchWord],
) -> Result<usize, &'static str> {
    if TRIED.swap(true, Ordering::AcqRel) {
        return Err("the launch hooks were installed or tried already");
    }
    let Prepared { launches, calls } = prepare(resolve, true)?;
    if launches.len() + calls.len() > out.len() {
        return Err("more patches than an attach can carry");
    }
    for (i, p) in &calls {
        crate::call_hooks::installed(*i, p.trampoline);
    }
    let mut all = launches;
    all.extend(calls.into_iter().map(|(_, p)| p));
    for (slot, p) in out.iter_mut().zip(&all) {
        let (addr, old, new) = p.word();
        *slot = probe_common::attach::PatchWord { addr, old, new };
    }
    let n = all.len();
    let _ = PATCHES.set(all);
    HOT.active.store(true, Ordering::Release);
    Ok(n)
}

/// After `prepare_for_attach`: how many of the patches' jumps are in place, of how many.
pub fn patches_in_place() -> (usize, usize) {
    let Some(patches) = PATCHES.get() else {
        return (0, 0);
    };
    (
        patches.iter().filter(|p| p.in_place()).count(),
        patches.len(),
    )
}

/// The shim stops recording for good (released, or the process exits): launches pass
/// through, and libcuda's entry points get their own first instructions back — wedgeprobe
/// then traces launches with uprobes on them, and a uprobe on a patched entry would run the
/// file's instruction and land inside our jump.
pub fn remove() {
    HOT.pass.store(true, Ordering::SeqCst);
    if let Some(patches) = PATCHES.get() {
        // (An attach that never completed has some jumps not in place: only those are undone.)
        for p in patches.iter().filter(|p| p.in_place()) {
            // SAFETY: each was applied by `install`.
            if let Err(why) = unsafe { p.restore() } {
                let mut line = b"launch hooks: ".to_vec();
                line.extend_from_slice(why.as_bytes());
                crate::log_line(&line);
            }
        }
    }
}

/// The mangled name of a launched function (a `CUfunction`, or a `CUkernel` passed as one).
fn function_name_id(rec: &recorder::Recorder, t: &ThreadState, epoch: u64, f: *mut c_void) -> u32 {
    t.names.get_or(f as usize, epoch, || {
        let d = crate::driver::driver();
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: out-pointer; the driver validates the handle and fails on a foreign one.
        let ok = d
            .func_name
            .is_some_and(|g| unsafe { g(&mut p, f.cast()) } == 0)
            || d.kernel_name
                .is_some_and(|g| unsafe { g(&mut p, f.cast()) } == 0);
        if !ok || p.is_null() {
            return rec.writer().intern(b"(kernel name unknown)").into();
        }
        // SAFETY: a NUL-terminated name the driver owns; bounded.
        let name = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), libc::strnlen(p, 4096)) };
        rec.writer().intern(name).into()
    }) as u32
}

/// The name id graph launches carry (interned once).
fn graph_launch_name(rec: &recorder::Recorder) -> u32 {
    static ID: AtomicU32 = AtomicU32::new(0);
    match ID.load(Ordering::Relaxed) {
        0 => {
            let id = rec.writer().intern(b"(graph launch)");
            ID.store(id, Ordering::Relaxed);
            id
        }
        id => id,
    }
}

/// Until then (CLOCK_MONOTONIC ns; 0 = never) every launch asks whether its stream is being
/// captured (`crate::attach`).
pub fn check_captures_until(ns: u64) {
    HOT.check_captures_until.store(ns, Ordering::Relaxed);
}

fn captures_unknown() -> bool {
    let until = HOT.check_captures_until.load(Ordering::Relaxed);
    if until == 0 {
        return false;
    }
    if monotonic_ns() < until {
        return true;
    }
    HOT.check_captures_until.store(0, Ordering::Relaxed);
    false
}

fn capturing(stream: *mut c_void) -> bool {
    let mut status = 0u32;
    crate::driver::driver()
        .is_capturing
        // SAFETY: the launch's stream and an out-pointer.
        .is_some_and(|f| unsafe { f(stream, &mut status) } == 0 && status != 0)
}

/// The calling thread's current context (0: none).
pub(crate) fn current_context() -> usize {
    let mut c: *mut c_void = std::ptr::null_mut();
    let get = match HOT.ctx_get_current.load(Ordering::Relaxed) {
        0 => match crate::driver::driver().ctx_get_current {
            Some(get) => get,
            None => return 0,
        },
        // SAFETY: stored from the driver's `ctx_get_current`, of this type.
        f => unsafe { std::mem::transmute::<usize, crate::driver::CtxGetCurrent>(f) },
    };
    // SAFETY: an out-pointer.
    let r = unsafe { get(&mut c) };
    if r == 0 { c as usize } else { 0 }
}

/// Records a launch before the driver sees it; the exit is recorded by `after`. Returns
/// whether it was recorded.
#[inline(always)]
fn before(
    t: &ThreadState,
    entry: Entry,
    f: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    stream: *mut c_void,
    graph_exec: *mut c_void,
) -> bool {
    t.inside.set(true);
    t.hook_records.set(false);
    if !recording() {
        return false;
    }
    let Some(rec) = hot_recorder() else {
        return false;
    };
    let resolve = HOT.resolve.load(Ordering::Acquire);
    if resolve.is_null() {
        return false;
    }
    // SAFETY: set once from a leaked Box, never freed.
    let resolve = unsafe { &*resolve };
    // From here the hook owns this launch (records it, or leaves out a captured one).
    t.hook_records.set(true);
    rec.writer().prefetch_lines(&t.next_lines.get());
    // A launch into a stream being captured does not run: it becomes a graph node. Only
    // asked while some capture is in progress (rare), so a launch normally pays nothing —
    // and for a while after an attach, when captures begun before are not counted.
    if (hot_marks().is_some_and(crate::marks::Marks::capturing) || captures_unknown())
        && capturing(stream)
    {
        return false;
    }
    let i = entry as usize;
    let per_thread = u8::from(matches!(
        entry,
        Entry::LaunchPtsz | Entry::LaunchExPtsz | Entry::CooperativePtsz | Entry::GraphPtsz
    ));
    let mut phases = crate::self_cost::Phases::start_if(HOT.self_cost.load(Ordering::Relaxed));
    let correlation = rec.next_correlation();
    let now = monotonic_ns();
    let api = u32::from(HOT.api[i].load(Ordering::Relaxed));
    rec.api_enter_in(t, api, correlation, now);
    phases.next(crate::self_cost::Phase::Enter);
    let ctx = current_context();
    if let Some(context) = resolve.context {
        context(ctx);
    }
    let epoch = HOT.epoch.load(Ordering::Acquire);
    let device = crate::driver::device_of(t, ctx);
    let handle = crate::marks::stream_handle(stream as u64, per_thread != 0);
    // The stream's id and its journal mark slot, cached together: both are lookups
    // (a driver call; a probe of the journal's mark table) a stream's launches repeat.
    let cached = t
        .streams
        .get_or((stream as usize) ^ usize::from(per_thread), epoch, || {
            let id = (resolve.stream_id)(ctx, stream as usize, per_thread);
            let slot = rec
                .mark_slot_of(id, device, handle)
                .map_or(0, |s| u64::from(s) + 1);
            (u64::from(id) + 1) | (slot << 32)
        });
    let stream_id = (cached as u32).wrapping_sub(1);
    let mark_slot = ((cached >> 32) as u32).checked_sub(1);
    let (name_id, graph_id) = if graph_exec.is_null() {
        (function_name_id(rec, t, epoch, f), 0)
    } else {
        (
            graph_launch_name(rec),
            t.graphs.get_or(graph_exec as usize, epoch, || {
                (resolve.graph_id)(graph_exec as usize).into()
            }) as u32,
        )
    };
    phases.next(crate::self_cost::Phase::Resolve);
    rec.launch_named_in(
        t,
        name_id,
        Launch {
            correlation,
            launch_ns: now,
            stream: handle,
            stream_id,
            device,
            api,
            grid,
            block,
            cluster: [1, 1, 1],
            graph_id,
            ..Launch::default()
        },
        ctx as u64,
        mark_slot,
    );
    phases.next(crate::self_cost::Phase::Record);
    true
}

#[inline(always)]
fn after(t: &ThreadState, recorded: bool, result: u32) {
    t.inside.set(false);
    t.hook_records.set(false);
    if recorded && let Some(rec) = hot_recorder() {
        let mut phases = crate::self_cost::Phases::start_if(HOT.self_cost.load(Ordering::Relaxed));
        rec.api_exit_in(t, result == 0);
        phases.next(crate::self_cost::Phase::Exit);
    }
}

/// One hooked call: `before` (whether it recorded), the driver's `call`, then the exit —
/// the shim's parts under `catch_unwind`, so nothing unwinds into the caller; the thread's
/// state looked up once for both. Under `crate::self_cost` the shim's part on both sides is
/// timed.
#[inline(always)]
fn hooked(before: impl FnOnce(&ThreadState) -> bool, call: impl FnOnce() -> u32) -> u32 {
    thread_state::with(|t| {
        let t0 = HOT
            .self_cost
            .load(Ordering::Relaxed)
            .then(crate::self_cost::tsc);
        let recorded =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| before(t))).unwrap_or(false);
        let t1 = t0.map(|_| crate::self_cost::tsc());
        let r = call();
        let t2 = t0.map(|_| crate::self_cost::tsc());
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| after(t, recorded, r)));
        if let (true, Some(t0), Some(t1), Some(t2)) = (recorded, t0, t1, t2) {
            let t3 = crate::self_cost::tsc();
            crate::self_cost::launch(t1.wrapping_sub(t0).wrapping_add(t3.wrapping_sub(t2)));
        }
        r
    })
}

fn original(entry: Entry) -> usize {
    HOT.original[entry as usize].load(Ordering::Acquire)
}

/// `cuLaunchKernel` and `cuLaunchCooperativeKernel` (the same arguments, less `extra`).
macro_rules! launch_hook {
    ($name:ident, $entry:expr, $fn_ty:ty $(, $tail:ident)*) => {
        unsafe extern "C" fn $name(
            f: *mut c_void,
            gx: u32,
            gy: u32,
            gz: u32,
            bx: u32,
            by: u32,
            bz: u32,
            shmem: u32,
            stream: *mut c_void,
            params: *mut *mut c_void,
            $($tail: *mut *mut c_void,)*
        ) -> u32 {
            hooked(
                |t| {
                    before(
                        t,
                        $entry,
                        f,
                        [gx, gy, gz],
                        [bx, by, bz],
                        stream,
                        std::ptr::null_mut(),
                    )
                },
                // SAFETY: the trampoline to the original, which has this signature.
                || unsafe {
                    std::mem::transmute::<usize, $fn_ty>(original($entry))(
                        f, gx, gy, gz, bx, by, bz, shmem, stream, params $(, $tail)*
                    )
                },
            )
        }
    };
}

macro_rules! launch_ex_hook {
    ($name:ident, $entry:expr) => {
        unsafe extern "C" fn $name(
            config: *const cupti_sys::CUlaunchConfig,
            f: *mut c_void,
            params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> u32 {
            hooked(
                // SAFETY: the caller's config, valid for the call (null is the driver's to
                // refuse).
                |t| match unsafe { config.as_ref() } {
                    Some(c) => before(
                        t,
                        $entry,
                        f,
                        [c.gridDimX, c.gridDimY, c.gridDimZ],
                        [c.blockDimX, c.blockDimY, c.blockDimZ],
                        c.hStream.cast(),
                        std::ptr::null_mut(),
                    ),
                    None => false,
                },
                // SAFETY: the trampoline to the original, which has this signature.
                || unsafe {
                    std::mem::transmute::<usize, LaunchExFn>(original($entry))(
                        config, f, params, extra,
                    )
                },
            )
        }
    };
}

macro_rules! graph_hook {
    ($name:ident, $entry:expr) => {
        unsafe extern "C" fn $name(exec: *mut c_void, stream: *mut c_void) -> u32 {
            hooked(
                |t| {
                    before(
                        t,
                        $entry,
                        std::ptr::null_mut(),
                        [0; 3],
                        [0; 3],
                        stream,
                        exec,
                    )
                },
                // SAFETY: the trampoline to the original, which has this signature.
                || unsafe { std::mem::transmute::<usize, GraphFn>(original($entry))(exec, stream) },
            )
        }
    };
}

launch_hook!(launch, Entry::Launch, LaunchFn, extra);
launch_hook!(launch_ptsz, Entry::LaunchPtsz, LaunchFn, extra);
launch_ex_hook!(launch_ex, Entry::LaunchEx);
launch_ex_hook!(launch_ex_ptsz, Entry::LaunchExPtsz);
launch_hook!(cooperative, Entry::Cooperative, CooperativeFn);
launch_hook!(cooperative_ptsz, Entry::CooperativePtsz, CooperativeFn);
graph_hook!(graph, Entry::Graph);
graph_hook!(graph_ptsz, Entry::GraphPtsz);
