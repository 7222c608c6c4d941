//! The one table every hooked launch reads (`HOT`, two cache lines) and the switches on it:
//! whether the hooks record or pass launches through, the entry points' ids and originals, and
//! the recorder, marks and stream/graph naming a launch needs, cached where the launch reads
//! anyway. Everything else of the hooks reads it; it reads only the stages below.

use std::{
    ffi::c_void,
    sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering},
};

use crate::{clock::monotonic_ns, marks::Marks, record::Recorder};

/// Everything of the hooks' own a hooked launch reads, in two cache lines of their own.
/// Scattered statics were ~16 of the ~38 cold lines a launch took in callgrind's cache model
/// of a serving loop (BENCHMARKS.md, 2026-12-02): several of them reached through the GOT
/// first, two lines for one flag.
#[repr(C, align(64))]
pub(super) struct Hot {
    /// The hooks are in place and record launches.
    pub(super) active: AtomicBool,
    /// Launches pass through unrecorded: CUPTI's callbacks record them now (a per-kernel
    /// lease), or the shim stopped (released, process exiting).
    pub(super) pass: AtomicBool,
    /// Measurement switch `pass` (`crate::measure`).
    pub(super) measure_pass: AtomicBool,
    /// `crate::self_cost::on()`, mirrored (`self_cost_on`).
    pub(super) self_cost: AtomicBool,
    /// `probe_common::api` ids of the entries (27 ids today).
    pub(super) api: [AtomicU8; 8],
    /// The driver's `cuCtxGetCurrent` (0: none), asked by every launch.
    pub(super) ctx_get_current: AtomicUsize,
    /// Bumped when handles may be reused (a module unloaded, a stream, graph or context
    /// destroyed): the per-thread caches drop what they hold.
    pub(super) epoch: AtomicU64,
    /// Until then (CLOCK_MONOTONIC ns; 0 = never) every launch asks whether its stream is
    /// being captured (`crate::attach`).
    pub(super) check_captures_until: AtomicU64,
    /// `record::get()`, `RESOLVE`, `marks::get()`, cached (null: not yet).
    pub(super) recorder: AtomicPtr<Recorder>,
    pub(super) resolve: AtomicPtr<Resolve>,
    pub(super) marks: AtomicPtr<Marks>,
    /// The originals, reached through their trampolines (the second line).
    pub(super) original: [AtomicUsize; 8],
}

pub(super) static HOT: Hot = Hot {
    active: AtomicBool::new(false),
    pass: AtomicBool::new(false),
    measure_pass: AtomicBool::new(false),
    self_cost: AtomicBool::new(false),
    api: [const { AtomicU8::new(0) }; 8],
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
pub(super) fn hot_recorder() -> Option<&'static Recorder> {
    cached(&HOT.recorder, crate::record::get)
}

#[inline(always)]
pub(super) fn hot_marks() -> Option<&'static Marks> {
    cached(&HOT.marks, crate::marks::get)
}

/// `crate::self_cost` was switched on: hooked launches time themselves.
pub fn self_cost_on() {
    HOT.self_cost.store(true, Ordering::Relaxed);
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

/// Until then (CLOCK_MONOTONIC ns; 0 = never) every launch asks whether its stream is being
/// captured (`crate::attach`).
pub fn check_captures_until(ns: u64) {
    HOT.check_captures_until.store(ns, Ordering::Relaxed);
}

pub(super) fn captures_unknown() -> bool {
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
