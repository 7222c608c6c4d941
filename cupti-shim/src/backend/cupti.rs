//! The real backend: CUPTI launch callbacks (driver domain only — runtime launches fire the
//! driver callback too, so nothing is counted twice). Completions come from stream marks
//! (`crate::marks`, the default) or, in the exact mode or when marks cannot work, from
//! CONCURRENT_KERNEL activity records timestamped on CLOCK_MONOTONIC through CUPTI's timestamp
//! callback.
//!
//! CUDA graphs: resource callbacks (node created / cloned, executable graph created) fill the
//! journal's graph table, so a stuck graph launch breaks down into its kernel nodes.
//!
//! Costs (docs/measured-facts.md): driver-domain launch callbacks measured +298 ns per launch,
//! CONCURRENT_KERNEL +920 ns; this shim's own cost is in BENCHMARKS.md.
//! A flush withholds a buffer that holds an incomplete record: one stuck kernel can hold back
//! other kernels' completions in the same buffer, so the flush thread forces buffers out when
//! something has waited long (below), and the reader retires launches by later evidence too.
//!
//! Giving CUPTI back (one subscriber per process until CUDA 13.3): `wedgeprobe release --pid`
//! sets a bit in the journal that the flush thread polls, or the process calls the exported
//! `wedgeprobe_shim_release()` itself; either way the shim flushes, unsubscribes and calls
//! `cuptiFinalize`, so torch.profiler / Nsight can subscribe next.

#![allow(
    non_upper_case_globals,
    reason = "CUPTI's constant names in match patterns"
)]

use std::{
    ffi::{CStr, c_void},
    sync::{
        OnceLock,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use cupti_sys::*;
use probe_common::{
    api,
    journal::{ALL_STREAMS, RECORD_MARKS, STATE_RELEASED, drops},
};

use crate::{
    clock::monotonic_ns,
    guarded,
    journal::{Completion, Launch},
    record::{self},
};

static CUPTI: OnceLock<Cupti> = OnceLock::new();
static SUBSCRIBER: AtomicUsize = AtomicUsize::new(0);
/// Set once the shim has given CUPTI back: callbacks and the flush thread do nothing after.
static RELEASED: AtomicBool = AtomicBool::new(false);

/// Resource callbacks that describe CUDA graphs, and the destruction of streams, contexts,
/// modules and executable graphs (idle marks must never touch them again; the launch hooks'
/// caches drop their handles). All rare: graph construction, teardown.
const RESOURCE_CBIDS: [u32; 8] = [
    CUPTI_CBID_RESOURCE_CONTEXT_CREATED,
    CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING,
    CUPTI_CBID_RESOURCE_GRAPHEXEC_DESTROY_STARTING,
    CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED,
    CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED,
    CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED,
    CUPTI_CBID_RESOURCE_STREAM_DESTROY_STARTING,
    CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING,
];

/// Stream captures beginning (at their successful exit) and ending: marks stay clear of them.
const CAPTURE_BEGIN_CBIDS: [u32; 6] = [
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz,
];
const CAPTURE_END_CBIDS: [u32; 2] = [
    CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture,
    CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz,
];

/// Driver callback ids traced, with their `probe_common::api` ids.
const CBIDS: &[(u32, &str)] = &[
    (CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, "cuLaunchKernel"),
    (
        CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
        "cuLaunchKernel_ptsz",
    ),
    (CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, "cuLaunchKernelEx"),
    (
        CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
        "cuLaunchKernelEx_ptsz",
    ),
    (
        CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
        "cuLaunchCooperativeKernel",
    ),
    (
        CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
        "cuLaunchCooperativeKernel_ptsz",
    ),
    (CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch, "cuGraphLaunch"),
    (
        CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
        "cuGraphLaunch_ptsz",
    ),
    (
        CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize,
        "cuStreamSynchronize",
    ),
    (
        CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz,
        "cuStreamSynchronize_ptsz",
    ),
    (CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize, "cuCtxSynchronize"),
    (
        CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize,
        "cuEventSynchronize",
    ),
    (CUPTI_DRIVER_TRACE_CBID_cuMemcpy, "cuMemcpy"),
    (CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2, "cuMemcpyHtoD_v2"),
    (CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2, "cuMemcpyDtoH_v2"),
    (CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoD_v2, "cuMemcpyDtoD_v2"),
];

/// A measurement switch, not a mode (BENCHMARKS.md, the recorder's price): `WEDGEPROBE_SHIM_SKIP=launch`,
/// `graph` or `sync` (comma-separated) leaves those callbacks off, to price CUPTI's dispatch
/// on each kind of entry point. What is skipped is not recorded.
#[derive(Clone, Copy, PartialEq)]
enum Skip {
    Launch,
    Graph,
    Sync,
    Capture,
    Resource,
    /// No activity or timestamp callbacks registered.
    Activity,
    /// No `cuptiSubscribe` at all (no callbacks of any kind).
    Subscribe,
}

impl Skip {
    fn skips(self, name: &str) -> bool {
        match self {
            Skip::Launch => name.starts_with("cuLaunch"),
            Skip::Graph => name.starts_with("cuGraphLaunch"),
            Skip::Sync => !name.starts_with("cuLaunch") && !name.starts_with("cuGraphLaunch"),
            _ => false,
        }
    }
}

fn measurement_skip() -> Vec<Skip> {
    let v = std::env::var("WEDGEPROBE_SHIM_SKIP").unwrap_or_default();
    let skip: Vec<Skip> = v
        .split(',')
        .filter_map(|w| match w.trim() {
            "launch" => Some(Skip::Launch),
            "graph" => Some(Skip::Graph),
            "sync" => Some(Skip::Sync),
            "capture" => Some(Skip::Capture),
            "resource" => Some(Skip::Resource),
            "activity" => Some(Skip::Activity),
            "subscribe" => Some(Skip::Subscribe),
            _ => None,
        })
        .collect();
    if !skip.is_empty() {
        crate::log_line(
            b"measurement switch WEDGEPROBE_SHIM_SKIP: some callbacks left off, their calls not recorded",
        );
    }
    skip
}

/// `CUPTI_ACTIVITY_FLAG_FLUSH_FORCED` (cupti_activity.h).
const FLUSH_FORCED: u32 = 1;
const FORCE_AFTER_NS: u64 = 500_000_000;
const FORCE_EVERY_NS: u64 = 2_000_000_000;

/// Activity buffers: 1 MiB each (CUPTI's samples use 8–32 MiB; smaller buffers are handed back
/// sooner, so a stuck kernel's open buffer hides fewer completions).
const BUFFER_BYTES: usize = 1 << 20;

fn check(what: &str, r: CUptiResult) -> Result<(), String> {
    if r == CUPTI_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed (CUPTI error {r})"))
    }
}

/// Loads libcupti and subscribes; `Err` turns the shim off.
pub fn attach() -> Result<(), String> {
    let cupti = cupti_sys::load().map_err(|e| e.to_string())?;
    let c = CUPTI.get_or_init(|| cupti);
    RESOLVED.get_or_init(resolve);
    let skip = measurement_skip();
    let marks = record::get().is_some_and(|r| r.record_mode() == RECORD_MARKS);
    let late = LATE.load(Ordering::Acquire);
    if marks
        && !late
        && !crate::hooks::install::tried()
        && let Err(why) = crate::hooks::install::install(
            crate::hooks::hot::Resolve {
                stream_id: stream_id_of,
                graph_id: graph_id_of,
                context: None,
            },
            false,
        )
    {
        why.fell_back("launches recorded through CUPTI callbacks (dearer): ");
    }
    // SAFETY: documented CUPTI calls with valid arguments; the callbacks are extern "C" fns
    // that live for the whole process.
    unsafe {
        // Activity (per-kernel record) machinery only where it is used: merely registering
        // its callbacks cost +12.6% on the launch-bound graph loop with nothing enabled
        // (BENCHMARKS.md, the recorder's price). With marks it is set up when a lease or fallback wants it.
        if !marks && !skip.contains(&Skip::Activity) {
            activity_machinery(c)?;
        }
        if skip.contains(&Skip::Subscribe) {
            return Ok(());
        }
        let mut sub: CUpti_SubscriberHandle = std::ptr::null_mut();
        check(
            "cuptiSubscribe",
            (c.cuptiSubscribe)(&mut sub, Some(on_api), std::ptr::null_mut()),
        )?;
        SUBSCRIBER.store(sub as usize, Ordering::Release);
        let verify = crate::hooks::hot::active()
            && std::env::var("WEDGEPROBE_SHIM_VERIFY_HOOKS").is_ok_and(|v| v == "1");
        crate::hooks::coverage::VERIFY.store(verify, Ordering::Relaxed);
        for &(cbid, name) in CBIDS {
            // Late (after recording without CUPTI): the call hooks record synchronizes.
            let hooked = (is_launch(name) && crate::hooks::hot::active() && !verify)
                || (late && !is_launch(name));
            if skip.iter().any(|s| s.skips(name)) || hooked {
                continue;
            }
            check(
                "cuptiEnableCallback",
                (c.cuptiEnableCallback)(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, cbid),
            )?;
        }
        for cbid in CAPTURE_BEGIN_CBIDS.into_iter().chain(CAPTURE_END_CBIDS) {
            if skip.contains(&Skip::Capture) || late {
                break;
            }
            check(
                "cuptiEnableCallback (capture)",
                (c.cuptiEnableCallback)(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, cbid),
            )?;
        }
        for cbid in RESOURCE_CBIDS {
            if skip.contains(&Skip::Resource) {
                break;
            }
            check(
                "cuptiEnableCallback (resource)",
                (c.cuptiEnableCallback)(1, sub, CUPTI_CB_DOMAIN_RESOURCE, cbid),
            )?;
        }
        // Per-kernel records only in the exact mode: with marks they would cost ~0.9 µs of
        // CPU per launch for nothing (BENCHMARKS.md).
        if !marks && !skip.contains(&Skip::Activity) {
            check(
                "cuptiActivityEnable",
                (c.cuptiActivityEnable)(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
            )?;
        }
    }
    std::thread::Builder::new()
        .name("wedgeprobe-flush".into())
        .spawn(|| {
            let mut last_forced = 0u64;
            // Marks mode: whether per-kernel records are on now (a lease from wedgeprobe).
            let mut per_kernel = false;
            loop {
                std::thread::sleep(
                    record::get().map_or(Duration::from_millis(100), |r| r.flush_period()),
                );
                let (Some(c), Some(rec)) = (CUPTI.get(), record::get()) else {
                    continue;
                };
                if rec.writer().release_requested() {
                    release();
                }
                if RELEASED.load(Ordering::Acquire) {
                    rec.heartbeat();
                    continue;
                }
                if rec.take_fallback() {
                    // Per-kernel records need CUPTI's ids on launches: CUPTI records them
                    // from now on, the hooks pass them through.
                    let ok = per_kernel_records(c, true).is_ok();
                    if !ok {
                        crate::log_line(b"cannot enable per-kernel records either");
                    }
                }
                if rec.record_mode() == RECORD_MARKS {
                    // Per-kernel records only while wedgeprobe leases them (`trace`); enabled
                    // and disabled here, off every callback. Otherwise nothing to flush: marks
                    // are written by the GPU and published by the heartbeat.
                    let leased = rec.writer().per_kernel_leased(monotonic_ns());
                    if leased != per_kernel {
                        if per_kernel_records(c, leased).is_err() {
                            crate::log_line(b"cannot switch per-kernel records for a lease");
                        }
                        per_kernel = leased;
                    }
                    if !per_kernel {
                        rec.heartbeat();
                        continue;
                    }
                }
                // A default flush withholds any buffer holding an unfinished record, so one
                // stuck kernel hides the completions recorded next to it. When a thread has
                // waited in the driver, or a launch has been in flight, for FORCE_AFTER_NS,
                // force the buffers out (at most every FORCE_EVERY_NS): unfinished records come back with end = 0 and are skipped;
                // the launches they belong to are retired later by their stream's next
                // completion or synchronize (RECORD_SYNCED).
                let now = monotonic_ns();
                let oldest = match (
                    rec.writer().oldest_call_since(),
                    rec.writer().oldest_launch_ns(),
                ) {
                    (0, l) | (l, 0) => l,
                    (a, b) => a.min(b),
                };
                let force = oldest != 0
                    && now.saturating_sub(oldest) >= FORCE_AFTER_NS
                    && now.saturating_sub(last_forced) >= FORCE_EVERY_NS;
                if force {
                    last_forced = now;
                }
                // SAFETY: hands finished (or, forced, all) buffers to buffer_completed.
                unsafe { (c.cuptiActivityFlushAll)(if force { FLUSH_FORCED } else { 0 }) };
                rec.heartbeat();
            }
        })
        .map_err(|e| format!("cannot start its flush thread: {e}"))?;
    Ok(())
}

/// CUPTI is attached late, by `attach_without_cupti`'s flush thread: the hooks record
/// launches, synchronizes and captures already.
static LATE: AtomicBool = AtomicBool::new(false);

/// The default with stream marks: everything recorded through hooks on libcuda's entry points
/// (`crate::launch_hooks`, `crate::hooks::calls`), CUPTI not loaded — initialising it at all
/// cost ~12–18% on the launch-bound graph loop (BENCHMARKS.md). CUPTI is attached later only
/// if per-kernel records are wanted (a `trace` lease, or marks failing). `Err`: the hooks
/// could not be installed (the caller records through CUPTI instead).
pub fn attach_without_cupti() -> Result<(), crate::hooks::install::NotHooked> {
    crate::hooks::install::install(hook_resolve(), true)?;
    spawn_flush_thread().map_err(|why| crate::hooks::install::NotHooked {
        kind: crate::hooks::install::NotHookedKind::Failed,
        line: why,
    })
}

/// How the launch hooks name streams and graphs when CUPTI is not loaded.
pub fn hook_resolve() -> crate::hooks::hot::Resolve {
    crate::hooks::hot::Resolve {
        stream_id: driver_stream_id,
        graph_id: |exec| crate::hooks::calls::exec_id(exec),
        context: None,
    }
}

/// The flush thread of the hooks-only shim: release requests, CUPTI attached late for a
/// per-kernel lease or a fallback, an injected shim's attach completing (`crate::attach`),
/// marks polled and published.
pub fn spawn_flush_thread() -> Result<(), String> {
    std::thread::Builder::new()
        .name("wedgeprobe-flush".into())
        .spawn(|| {
            let mut told = false;
            loop {
                std::thread::sleep(
                    record::get().map_or(Duration::from_millis(100), |r| r.flush_period()),
                );
                let Some(rec) = record::get() else { continue };
                if rec.writer().release_requested() && !RELEASED.swap(true, Ordering::AcqRel) {
                    // Nothing of CUPTI to give back: the hooks step aside, the journal says so.
                    crate::hooks::install::remove();
                    rec.writer().set_state(STATE_RELEASED);
                    crate::log_line(b"released: recording stopped (CUPTI was never loaded)");
                }
                if !RELEASED.load(Ordering::Acquire)
                    && (rec.wants_fallback() || rec.writer().per_kernel_leased(monotonic_ns()))
                {
                    LATE.store(true, Ordering::Release);
                    match attach() {
                        // CUPTI's flush thread takes over from here.
                        Ok(()) => return,
                        Err(why) if !told => {
                            told = true;
                            let mut line = b"per-kernel records wanted but CUPTI failed: ".to_vec();
                            line.extend_from_slice(why.as_bytes());
                            crate::log_line(&line);
                        }
                        Err(_) => {}
                    }
                }
                crate::hooks::install::attach_tick(rec);
                rec.heartbeat();
            }
        })
        .map_err(|e| format!("cannot start its flush thread: {e}"))?;
    Ok(())
}

/// A stream's id from the driver (`cuStreamGetId`), when CUPTI is not loaded.
fn driver_stream_id(_ctx: usize, stream: usize, per_thread: u8) -> u32 {
    let handle = crate::marks::stream_handle(stream as u64, per_thread != 0);
    let mut id = 0u64;
    let Some(get) = crate::driver::driver().stream_get_id else {
        return 0;
    };
    // SAFETY: a stream handle from a launch in progress; an out-pointer.
    let r = unsafe { get(handle as *mut c_void, &mut id) };
    if r == 0 { id as u32 } else { 0 }
}

/// Gives CUPTI back so another tool can subscribe: flushes what is recorded, unsubscribes,
/// detaches CUPTI (`cuptiFinalize`) and marks the journal released. Idempotent.
pub fn release() {
    if RELEASED.swap(true, Ordering::AcqRel) {
        return;
    }
    crate::hooks::install::remove();
    let Some(c) = CUPTI.get() else { return };
    // SAFETY: documented CUPTI calls; the subscriber handle is the one cuptiSubscribe gave.
    unsafe {
        (c.cuptiActivityFlushAll)(FLUSH_FORCED);
        (c.cuptiActivityDisable)(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
        let sub = SUBSCRIBER.swap(0, Ordering::AcqRel);
        if sub != 0 {
            (c.cuptiUnsubscribe)(sub as CUpti_SubscriberHandle);
        }
        (c.cuptiFinalize)();
    }
    if let Some(rec) = record::get() {
        rec.writer().set_state(STATE_RELEASED);
    }
    crate::log_line(b"released CUPTI for another tool; recording stopped");
}

fn is_launch(name: &str) -> bool {
    name.starts_with("cuLaunch") || name.starts_with("cuGraphLaunch")
}

/// Registers the activity callbacks and the timestamp clock (once).
///
/// # Safety
/// Documented CUPTI calls; the callbacks live for the whole process.
unsafe fn activity_machinery(c: &Cupti) -> Result<(), String> {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.load(Ordering::Acquire) {
        return Ok(());
    }
    // SAFETY: the caller's promise.
    unsafe {
        check(
            "cuptiActivityRegisterTimestampCallback",
            (c.cuptiActivityRegisterTimestampCallback)(Some(timestamp)),
        )?;
        check(
            "cuptiActivityRegisterCallbacks",
            (c.cuptiActivityRegisterCallbacks)(Some(buffer_requested), Some(buffer_completed)),
        )?;
    }
    DONE.store(true, Ordering::Release);
    Ok(())
}

/// Per-kernel completion records on or off (marks mode: a lease, or the fallback). With the
/// launch hooks in place CUPTI's launch callbacks are switched with them: completion records
/// carry CUPTI's ids, so CUPTI must see the launches. Switching on, the callbacks start before
/// the hooks stop recording; off, the hooks record again before the callbacks stop — a launch
/// in between is recorded twice, never missed. On the flush thread only.
fn per_kernel_records(c: &Cupti, on: bool) -> Result<(), String> {
    let sub = SUBSCRIBER.load(Ordering::Acquire) as CUpti_SubscriberHandle;
    let hooks = crate::hooks::hot::active();
    let launch_callbacks = |enable: u32| {
        for &(cbid, name) in CBIDS {
            if is_launch(name) && !sub.is_null() {
                // SAFETY: a documented CUPTI call on our subscriber, off any callback.
                unsafe { (c.cuptiEnableCallback)(enable, sub, CUPTI_CB_DOMAIN_DRIVER_API, cbid) };
            }
        }
    };
    // SAFETY: documented CUPTI calls, on the flush thread.
    unsafe {
        if on {
            activity_machinery(c)?;
            check(
                "cuptiActivityEnable",
                (c.cuptiActivityEnable)(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
            )?;
            if hooks {
                launch_callbacks(1);
                crate::hooks::hot::pass_through(true);
            }
        } else {
            if hooks {
                crate::hooks::hot::pass_through(false);
                launch_callbacks(0);
            }
            (c.cuptiActivityFlushAll)(FLUSH_FORCED);
            (c.cuptiActivityDisable)(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
        }
    }
    Ok(())
}

/// The stream id CUPTI's records use (launch callbacks and the launch hooks).
fn stream_id_of(ctx: usize, stream: usize, per_thread: u8) -> u32 {
    let mut id = 0u32;
    if let Some(c) = CUPTI.get() {
        // SAFETY: a context and stream handle from a launch call in progress.
        unsafe {
            (c.cuptiGetStreamIdEx)(ctx as CUcontext, stream as CUstream, per_thread, &mut id)
        };
    }
    id
}

/// CUPTI's id of an executable graph (the journal's graph table is keyed by it).
fn graph_id_of(exec: usize) -> u32 {
    let mut id = 0u32;
    if let Some(c) = CUPTI.get() {
        // SAFETY: an executable graph handle from a launch call in progress.
        unsafe { (c.cuptiGetGraphExecId)(exec as CUgraphExec, &mut id) };
    }
    id
}

extern "C" fn timestamp() -> u64 {
    monotonic_ns()
}

/// `CBIDS` resolved once at attach: (cbid, api id, per-thread default stream), so a callback
/// compares integers instead of searching names.
static RESOLVED: OnceLock<Vec<(u32, u32, u8)>> = OnceLock::new();

fn resolve() -> Vec<(u32, u32, u8)> {
    CBIDS
        .iter()
        .filter_map(|&(cbid, name)| {
            Some((cbid, api::id_of(name)?, u8::from(name.ends_with("_ptsz"))))
        })
        .collect()
}

/// (api id, per-thread default stream) of a traced callback id.
fn api_of(cbid: u32) -> Option<(u32, u8)> {
    RESOLVED
        .get()?
        .iter()
        .find(|e| e.0 == cbid)
        .map(|e| (e.1, e.2))
}

unsafe extern "C" fn on_api(
    _user: *mut c_void,
    domain: CUpti_CallbackDomain,
    cbid: CUpti_CallbackId,
    data: *const c_void,
) {
    guarded(|| {
        if RELEASED.load(Ordering::Relaxed) {
            return;
        }
        if domain == CUPTI_CB_DOMAIN_RESOURCE {
            // SAFETY: resource-domain callbacks pass a CUpti_ResourceData.
            unsafe { on_resource(cbid, data.cast()) };
            return;
        }
        if domain != CUPTI_CB_DOMAIN_DRIVER_API {
            return;
        }
        // SAFETY: CUPTI passes a CUpti_CallbackData for the driver domain, valid during the call.
        let Some(d) = (unsafe { data.cast::<CUpti_CallbackData>().as_ref() }) else {
            return;
        };
        let exit = d.callbackSite == CUPTI_API_EXIT;
        // SAFETY: at the exit, the driver domain's return value is a CUresult.
        let ok = exit
            && unsafe { d.functionReturnValue.cast::<u32>().as_ref() }.is_some_and(|r| *r == 0);
        if crate::hooks::coverage::VERIFY.load(Ordering::Relaxed)
            && crate::hooks::hot::recording()
            && api_of(cbid).is_some_and(|(api, _)| {
                probe_common::api::class(api) == Some(probe_common::api::ApiClass::Launch)
            })
        {
            // The coverage check: counted, not recorded (the hook recorded it, or nobody).
            if !exit {
                crate::hooks::coverage::SEEN_BY_CUPTI.fetch_add(1, Ordering::Relaxed);
                if !crate::hooks::launch::inside() {
                    crate::hooks::coverage::MISSED_BY_HOOKS.fetch_add(1, Ordering::Relaxed);
                }
            }
            return;
        }
        let Some((api, per_thread)) = api_of(cbid) else {
            // The other ids enabled: a stream capture beginning (counted once it succeeded) or
            // ending. Looked at only after the traced entry points, off the launch path.
            let begin = CAPTURE_BEGIN_CBIDS.contains(&cbid);
            if exit && (begin || CAPTURE_END_CBIDS.contains(&cbid)) && (ok || !begin) {
                crate::marks::capture(begin);
            }
            return;
        };
        let Some(rec) = record::get() else {
            return;
        };
        if exit {
            rec.api_exit(ok);
            if ok {
                // SAFETY: the params struct matches the cbid.
                if let Some(stream) = unsafe { synced_stream(cbid, d.functionParams) }
                    && rec.mapped(d.correlationId as u64).is_some()
                {
                    rec.synced(record::thread::with(|t| t.sync_floor.get()), stream);
                }
            }
            return;
        }
        let now = monotonic_ns();
        let class = probe_common::api::class(api);
        if class == Some(probe_common::api::ApiClass::Launch) {
            record::thread::with(|t| rec.entering_in(t));
        }
        // With the launch hooks in place, the journal's ids are ours (translated). (Without
        // them the ids are CUPTI's, taken before this callback: `sync_floor` then sees the
        // launches already inside the driver, not one between its id and this callback.)
        let correlation = rec.own_correlation(d.correlationId as u64);
        rec.api_enter(api, correlation, now);
        if class == Some(probe_common::api::ApiClass::Sync)
            // SAFETY: the params struct matches the cbid (read in the call).
            && let Some(stream) = unsafe { synced_stream(cbid, d.functionParams) }
        {
            let floor = rec.sync_floor(correlation, stream);
            record::thread::with(|t| t.sync_floor.set(floor));
        }
        // SAFETY: the params struct matches the cbid (generated_cuda_meta.h); read in the call.
        let launch = unsafe { launch_params(cbid, d.functionParams) };
        let Some(LaunchShape {
            stream,
            grid,
            block,
            graph_exec,
        }) = launch
        else {
            return;
        };
        let name: &[u8] = if d.symbolName.is_null() {
            b"(graph launch)"
        } else {
            // SAFETY: a NUL-terminated string valid during the callback.
            unsafe { CStr::from_ptr(d.symbolName) }.to_bytes()
        };
        let stream_id = stream_id_of(d.context as usize, stream as usize, per_thread);
        let graph_id = if graph_exec.is_null() {
            0
        } else {
            graph_id_of(graph_exec as usize)
        };
        let stream = crate::marks::stream_handle(stream as u64, per_thread != 0);
        rec.launch_keyed(
            name,
            d.symbolName as usize,
            Launch {
                correlation,
                launch_ns: now,
                stream,
                stream_id,
                device: crate::record::thread::with(|t| t.device_of(d.context as usize)),
                api,
                grid,
                block,
                cluster: [1, 1, 1],
                graph_id,
                ..Launch::default()
            },
            d.context as u64,
        );
    });
}

/// Graph construction and instantiation: fills the journal's graph table.
unsafe fn on_resource(cbid: u32, data: *const CUpti_ResourceData) {
    let (Some(c), Some(rec)) = (CUPTI.get(), record::get()) else {
        return;
    };
    if cbid == CUPTI_CBID_RESOURCE_CONTEXT_CREATED {
        // SAFETY: valid during the callback.
        if let Some(d) = unsafe { data.as_ref() } {
            rec.context_created(d.context as u64);
        }
        return;
    }
    if cbid == CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING
        || cbid == CUPTI_CBID_RESOURCE_GRAPHEXEC_DESTROY_STARTING
    {
        crate::hooks::hot::handles_changed();
        return;
    }
    if cbid == CUPTI_CBID_RESOURCE_STREAM_DESTROY_STARTING
        || cbid == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING
    {
        crate::hooks::hot::handles_changed();
        // SAFETY: valid during the callback; for these ids `resourceHandle` is the stream.
        if let (Some(d), Some(m)) = (unsafe { data.as_ref() }, crate::marks::get()) {
            let stream = if cbid == CUPTI_CBID_RESOURCE_STREAM_DESTROY_STARTING {
                // SAFETY: the union's stream member, as documented for this callback id.
                unsafe { d.resourceHandle.stream as u64 }
            } else {
                0
            };
            m.forget(d.context as u64, stream);
        }
        return;
    }
    // Attached late: the instantiate hook fills the graph table with ids of ours; CUPTI's
    // would collide with them. Only a launch being captured (inside a launch call CUPTI
    // records during a lease) is taken out of the in-flight table.
    if LATE.load(Ordering::Acquire) {
        if cbid == CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED {
            rec.captured_if_in_launch();
        }
        return;
    }
    // SAFETY: valid during the callback; for graph callbacks the descriptor is a
    // CUpti_GraphData.
    let Some(g) = (unsafe { data.as_ref() })
        .and_then(|d| unsafe { d.resourceDescriptor.cast::<CUpti_GraphData>().as_ref() })
    else {
        return;
    };
    let graph_id = |graph: CUgraph| {
        let mut id = 0u32;
        if !graph.is_null() {
            // SAFETY: a graph handle CUPTI passed.
            unsafe { (c.cuptiGetGraphId)(graph, &mut id) };
        }
        id
    };
    let node_id = |node: CUgraphNode| {
        let mut id = 0u64;
        if !node.is_null() {
            // SAFETY: as above.
            unsafe { (c.cuptiGetGraphNodeId)(node, &mut id) };
        }
        id
    };
    match cbid {
        CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED if g.nodeType == CU_GRAPH_NODE_TYPE_KERNEL => {
            let node = g.node;
            rec.graph_kernel_node(node_id(node), graph_id(g.graph), || {
                crate::driver::kernel_node_name(node)
            });
        }
        CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED if g.nodeType == CU_GRAPH_NODE_TYPE_KERNEL => {
            rec.graph_node_cloned(node_id(g.node), node_id(g.originalNode), graph_id(g.graph));
        }
        CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED => {
            let exec = if g.graphExec.is_null() {
                0
            } else {
                graph_id_of(g.graphExec as usize)
            };
            if exec != 0 {
                rec.graph_exec(exec, graph_id(g.graph));
            }
        }
        _ => {}
    }
}

/// The stream a returning synchronize has drained (`ALL_STREAMS` for the context).
unsafe fn synced_stream(cbid: u32, params: *const c_void) -> Option<u64> {
    match cbid {
        CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize => Some(ALL_STREAMS),
        CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize
        | CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz => {
            // SAFETY: cuStreamSynchronize's params, valid during the callback.
            let p = unsafe { params.cast::<cuStreamSynchronize_params_st>().as_ref() }?;
            Some(p.hStream as u64)
        }
        _ => None,
    }
}

/// Stream and dimensions of a launch.
struct LaunchShape {
    stream: CUstream,
    grid: [u32; 3],
    block: [u32; 3],
    /// Graph launches: the executable graph.
    graph_exec: CUgraphExec,
}

/// The shape of a params struct with cuLaunchKernel's fields (the cooperative variant too).
macro_rules! shape {
    ($p:expr) => {{
        let p = $p;
        LaunchShape {
            stream: p.hStream,
            grid: [p.gridDimX, p.gridDimY, p.gridDimZ],
            block: [p.blockDimX, p.blockDimY, p.blockDimZ],
            graph_exec: std::ptr::null_mut(),
        }
    }};
}

/// The shape of a launch's parameters; `None` for non-launches.
unsafe fn launch_params(cbid: u32, params: *const c_void) -> Option<LaunchShape> {
    if params.is_null() {
        return None;
    }
    // SAFETY: each arm casts to the params struct CUPTI documents for that cbid.
    unsafe {
        match cbid {
            CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel
            | CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz => {
                Some(shape!(&*params.cast::<cuLaunchKernel_params_st>()))
            }
            CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel
            | CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz => Some(shape!(
                &*params.cast::<cuLaunchCooperativeKernel_params_st>()
            )),
            CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx
            | CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz => {
                let p = &*params.cast::<cuLaunchKernelEx_params_st>();
                let c = p.config.as_ref()?;
                Some(LaunchShape {
                    stream: c.hStream,
                    grid: [c.gridDimX, c.gridDimY, c.gridDimZ],
                    block: [c.blockDimX, c.blockDimY, c.blockDimZ],
                    graph_exec: std::ptr::null_mut(),
                })
            }
            CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch | CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz => {
                let p = &*params.cast::<cuGraphLaunch_params_st>();
                Some(LaunchShape {
                    stream: p.hStream,
                    grid: [0; 3],
                    block: [0; 3],
                    graph_exec: p.hGraph,
                })
            }
            _ => None,
        }
    }
}

unsafe extern "C" fn buffer_requested(
    buffer: *mut *mut u8,
    size: *mut usize,
    max_records: *mut usize,
) {
    guarded(|| {
        // Activity buffers come from CUPTI's own thread, not from a launch: allocating here is
        // off the launch path.
        let layout = std::alloc::Layout::from_size_align(BUFFER_BYTES, 8).ok();
        // SAFETY: a non-zero layout; a null result is passed on (CUPTI then drops records and
        // counts them).
        let p = layout.map_or(std::ptr::null_mut(), |l| unsafe { std::alloc::alloc(l) });
        // SAFETY: CUPTI's out-pointers.
        unsafe {
            *buffer = p;
            *size = if p.is_null() { 0 } else { BUFFER_BYTES };
            *max_records = 0;
        }
    });
}

unsafe extern "C" fn buffer_completed(
    ctx: CUcontext,
    stream_id: u32,
    buffer: *mut u8,
    _size: usize,
    valid: usize,
) {
    guarded(|| {
        let (Some(c), Some(rec)) = (CUPTI.get(), record::get()) else {
            return;
        };
        let mut record: *mut CUpti_Activity = std::ptr::null_mut();
        loop {
            // SAFETY: iterating a buffer CUPTI handed back.
            let r = unsafe { (c.cuptiActivityGetNextRecord)(buffer, valid, &mut record) };
            if r != CUPTI_SUCCESS || record.is_null() {
                break;
            }
            // SAFETY: every record starts with its kind.
            if unsafe { (*record).kind } != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL {
                continue;
            }
            // SAFETY: a kernel record; Kernel9's leading fields are the common prefix of the
            // kernel records of CUPTI 12.x and 13.x.
            let k = unsafe { &*record.cast::<CUpti_ActivityKernel9>() };
            // Launch hooks in place: CUPTI's id translated (a record of a launch CUPTI did
            // not record for us is skipped; marks retire that launch).
            let Some(correlation) = rec.mapped(k.correlationId as u64) else {
                continue;
            };
            if k.end == 0 {
                // A forced flush of a kernel still running: not a completion, and its record
                // will never come back; a later synchronize frees its in-flight slot.
                rec.writer().orphaned(correlation);
                continue;
            }
            rec.complete(&Completion {
                correlation,
                start_ns: k.start,
                end_ns: k.end,
                stream_id: k.streamId,
                device: k.deviceId,
                graph_node: k.graphNodeId,
            });
        }
        let mut dropped = 0usize;
        // SAFETY: the buffer's context and stream as CUPTI passed them.
        unsafe { (c.cuptiActivityGetNumDroppedRecords)(ctx, stream_id, &mut dropped) };
        rec.writer()
            .count_drops(drops::ACTIVITY_DROPPED, dropped as u64);
        if !buffer.is_null()
            && let Ok(l) = std::alloc::Layout::from_size_align(BUFFER_BYTES, 8)
        {
            // SAFETY: allocated in buffer_requested with this layout.
            unsafe { std::alloc::dealloc(buffer, l) };
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_traced_callback_id_maps_to_an_entry_point() {
        assert_eq!(super::resolve().len(), super::CBIDS.len());
    }
}
