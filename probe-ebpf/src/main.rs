//! The kernel half of wedgeprobe: what eBPF can see of a CUDA process with no help from
//! inside it.
//!
//! - `wp_call_enter` / `wp_call_exit`: one uprobe/uretprobe pair on every libcuda entry point
//!   a thread can wait in (launch, graph launch, synchronize, blocking copy). The attach cookie
//!   is the entry point's id (probe_common::api), so one program serves them all. While a
//!   thread is inside, its `InCall` sits in `WP_IN_CALL`; user space reads that table to see
//!   who waits where and since when.
//! - `wp_sched_yield`: counts sched_yield per thread and per call. A launch blocked on a full
//!   queue yields ~72,000 times/s on the H200 (docs/measured-facts.md); a synchronize does not
//!   yield at all, so this only corroborates the time in call. A thread's first yield and every
//!   64th are also stack sample points (as `wp_on_cpu`'s, same rate limit): a yielding thread
//!   is seldom on a core when the timer fires on a busy host.
//! - `wp_name_enter` / `wp_name_exit`: `cuModuleGetFunction` and friends, to name the
//!   `CUfunction` handles that launches pass.
//! - `wp_on_cpu`: a timer sample of watched threads that are not inside a call we saw begin
//!   and end (no call, or a launch traced without return probe), with the top of their user stack: a thread that was already stuck in `cuLaunchKernel`
//!   when wedgeprobe attached never hits the entry uprobe, so user space finds the entry point
//!   in its stack instead.
//!
//! Everything is filtered in the kernel by `WP_TARGETS` (tgid), and every loss is counted in
//! `WP_COUNTERS`.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_get_current_task_btf,
        bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_str_bytes,
        generated::bpf_task_pt_regs,
    },
    macros::{map, perf_event, tracepoint, uprobe, uretprobe},
    maps::{HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::{PerfEventContext, ProbeContext, RetProbeContext, TracePointContext},
};
use probe_common::{
    CALL_OPEN_ENDED, COOKIE_OPEN_ENDED, CallDone, EVENT_CALL_DONE, EVENT_KERNEL_NAME, EventHeader,
    InCall, KernelName, MAX_TARGETS, MAX_THREADS, NAME_LEN, PendingName, SAMPLE_STACK_LEN,
    SampleHeader, StackSample,
    api::{self, ArgShape},
    counters,
};

#[map]
static WP_TARGETS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_TARGETS, 0);
#[map]
static WP_IN_CALL: HashMap<u32, InCall> = HashMap::with_max_entries(MAX_THREADS, 0);
#[map]
static WP_PENDING_NAME: HashMap<u32, PendingName> = HashMap::with_max_entries(4096, 0);
/// sched_yield calls per thread since attach (LRU: short-lived threads age out).
#[map]
static WP_THREAD_YIELDS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_THREADS, 0);
/// Last on-CPU sample per thread, to send at most one stack every SAMPLE_GAP_NS per thread.
#[map]
static WP_LAST_SAMPLE: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_THREADS, 0);
/// Finished calls and kernel names: ~112 B per call, so 4 MiB holds ~37k calls, about 0.4 s of
/// a launch-bound loop at the fastest rate measured (~90k launches/s) if user space stalls.
#[map]
static WP_EVENTS: RingBuf = RingBuf::with_byte_size(4 << 20, 0);
#[map]
static WP_SAMPLES: RingBuf = RingBuf::with_byte_size(1 << 20, 0);
#[map]
static WP_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counters::LEN, 0);

/// At most one stack sample per thread per 200 ms: enough to confirm every report window
/// (default 500 ms) and cheap for a thread that is merely busy.
const SAMPLE_GAP_NS: u64 = 200_000_000;

#[inline(always)]
fn count(index: u32) {
    if let Some(c) = WP_COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, this program is the only writer on this CPU right now.
        unsafe { *c += 1 };
    }
}

/// (tgid, tid) of the current thread when its process is watched.
#[inline(always)]
fn watched() -> Option<(u32, u32)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: the value is only tested for presence.
    unsafe { WP_TARGETS.get(&tgid) }?;
    Some((tgid, pid_tgid as u32))
}

#[inline(always)]
fn cookie(ctx: &impl aya_ebpf::EbpfContext) -> u64 {
    // SAFETY: the context pointer is the program's own.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }
}

#[inline(always)]
fn read_user<T>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_user faults safely on bad addresses and reports it.
    unsafe { bpf_probe_read_user(addr as *const T).ok() }
}

/// The registers read by name, per architecture: x86-64 (System V: six integer arguments in
/// registers, the rest on the stack above the return address) or AArch64 (AAPCS64: eight in
/// x0–x7, the rest from `sp`; the frame pointer is x29). Each read is volatile at a fixed
/// offset of the context: a register chosen at run time would make the compiler compute a
/// variable ctx offset, which the verifier rejects.
#[cfg(bpf_target_arch = "x86_64")]
mod arch {
    use super::pt_regs;

    /// Stack pointer, instruction pointer, frame pointer.
    #[inline(always)]
    pub fn sp_ip_fp(r: &pt_regs) -> (u64, u64, u64) {
        (r.rsp, r.rip, r.rbp)
    }

    /// The second and third integer arguments (rsi, rdx).
    #[inline(always)]
    pub fn args_1_2(r: *const pt_regs) -> (u64, u64) {
        // SAFETY: the probe's own pt_regs, fields at fixed offsets.
        unsafe {
            (
                core::ptr::read_volatile(&(*r).rsi),
                core::ptr::read_volatile(&(*r).rdx),
            )
        }
    }
}

#[cfg(bpf_target_arch = "aarch64")]
mod arch {
    use super::pt_regs;

    /// Stack pointer, instruction pointer (pc), frame pointer (x29).
    #[inline(always)]
    pub fn sp_ip_fp(r: &pt_regs) -> (u64, u64, u64) {
        (r.sp, r.pc, r.regs[29])
    }

    /// The second and third integer arguments (x1, x2).
    #[inline(always)]
    pub fn args_1_2(r: *const pt_regs) -> (u64, u64) {
        // SAFETY: the probe's own pt_regs, fields at fixed offsets.
        unsafe {
            (
                core::ptr::read_volatile(&(*r).regs[1]),
                core::ptr::read_volatile(&(*r).regs[2]),
            )
        }
    }
}

/// The arguments of a `cuLaunchKernel`-shaped call past the sixth (blockDimZ,
/// sharedMemBytes, hStream): on x86-64 on the stack above the return address, on AArch64
/// the first two in x6, x7 and hStream at `sp`.
#[inline(always)]
fn launch_tail(ctx: &ProbeContext) -> Option<[u64; 3]> {
    // SAFETY: regs is the probe's own pt_regs.
    let (sp, _, _) = arch::sp_ip_fp(unsafe { &*ctx.regs });
    #[cfg(bpf_target_arch = "x86_64")]
    {
        read_user::<[u64; 3]>(sp + 8)
    }
    #[cfg(bpf_target_arch = "aarch64")]
    {
        let arg = |n: usize| ctx.arg::<u64>(n).unwrap_or(0);
        Some([arg(6), arg(7), read_user::<u64>(sp)?])
    }
}

#[uprobe]
pub fn wp_call_enter(ctx: ProbeContext) -> u32 {
    let _ = try_call_enter(&ctx);
    0
}

/// `wp_call_enter` in a `uprobe.multi` section (aya-ebpf 0.2's macro has no `multi`): one
/// link holds every entry point of a process's libcuda, closed in one step — a perf-event
/// uprobe link costs the kernel a grace period each when closed, ~100 ms here (issue 34).
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe.multi")]
pub fn wp_call_enter_m(ctx: *mut core::ffi::c_void) -> u32 {
    let _ = try_call_enter(&ProbeContext::new(ctx));
    0
}

#[inline(always)]
fn try_call_enter(ctx: &ProbeContext) -> Option<()> {
    // The hot path: every launch of a watched process runs this (measured cost in
    // BENCHMARKS.md). The uprobes are attached per process, so no WP_TARGETS lookup here.
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let cookie = cookie(ctx);
    let api = (cookie & 0xffff) as u32;
    let flags = if cookie & COOKIE_OPEN_ENDED != 0 {
        CALL_OPEN_ENDED
    } else {
        0
    };
    let mut call = InCall {
        start_ns: 0,
        tgid,
        api,
        flags,
        ..InCall::default()
    };
    if fill_args(ctx, &mut call).is_none() {
        count(counters::ARG_READ_FAILED);
    }
    // SAFETY: a helper with no memory arguments.
    call.start_ns = unsafe { bpf_ktime_get_ns() };
    // A thread that launches keeps its entry (open-ended launches are never deleted), so the
    // common case rewrites it in place: a hash update would take the bucket lock and swap
    // elements on every launch. A reader may see a half-written entry for an instant; user
    // space only ever uses the table as a snapshot. Any previous entry of the thread is
    // replaced: a nested traced call hides the outer one (whose return then counts as
    // exit-without-entry), and an entry whose return was never seen cannot linger.
    match WP_IN_CALL.get_ptr_mut(&tid) {
        // SAFETY: this thread's own entry; only this thread writes it.
        Some(slot) => unsafe { *slot = call },
        None => {
            if WP_IN_CALL.insert(&tid, &call, 0).is_err() {
                count(counters::IN_CALL_FULL);
            }
        }
    }
    Some(())
}

/// Reads the arguments that matter for this entry point's shape (`arch` says where they are).
#[inline(always)]
fn fill_args(ctx: &ProbeContext, call: &mut InCall) -> Option<()> {
    let arg = |n: usize| ctx.arg::<u64>(n).unwrap_or(0);
    match api::shape(call.api)? {
        ArgShape::Launch => {
            // f, gx, gy, gz, bx, by in registers; bz, sharedMem, hStream past them
            // (`launch_tail`).
            call.handle = arg(0);
            call.grid = [arg(1) as u32, arg(2) as u32, arg(3) as u32];
            let stack = launch_tail(ctx)?;
            call.block = [arg(4) as u32, arg(5) as u32, stack[0] as u32];
            call.bytes = stack[1] & 0xffff_ffff;
            call.stream = stack[2];
        }
        ArgShape::LaunchEx => {
            // CUlaunchConfig: grid[3], block[3], sharedMemBytes (u32s), then hStream at 32.
            call.handle = arg(1);
            let cfg: [u32; 10] = read_user(arg(0))?;
            call.grid = [cfg[0], cfg[1], cfg[2]];
            call.block = [cfg[3], cfg[4], cfg[5]];
            call.bytes = cfg[6] as u64;
            call.stream = (cfg[8] as u64) | ((cfg[9] as u64) << 32);
        }
        ArgShape::GraphLaunch => {
            call.handle = arg(0);
            call.stream = arg(1);
        }
        ArgShape::StreamSync => call.stream = arg(0),
        ArgShape::EventSync => call.handle = arg(0),
        ArgShape::Copy3 => call.bytes = arg(2),
        ArgShape::NoArgs | ArgShape::CopyOther => {}
    }
    Some(())
}

#[uretprobe]
pub fn wp_call_exit(ctx: RetProbeContext) -> u32 {
    let _ = try_call_exit(&ctx);
    0
}

/// `wp_call_exit` in a `uretprobe.multi` section (see `wp_call_enter_m`).
#[unsafe(no_mangle)]
#[unsafe(link_section = "uretprobe.multi")]
pub fn wp_call_exit_m(ctx: *mut core::ffi::c_void) -> u32 {
    let _ = try_call_exit(&RetProbeContext::new(ctx));
    0
}

#[inline(always)]
fn try_call_exit(ctx: &RetProbeContext) -> Option<()> {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(cur) = WP_IN_CALL.get_ptr_mut(&tid) else {
        count(counters::EXIT_WITHOUT_ENTRY);
        return None;
    };
    // SAFETY: this thread's own entry.
    let call = unsafe { &*cur };
    // SAFETY: a helper with no memory arguments.
    let end_ns = unsafe { bpf_ktime_get_ns() };
    match WP_EVENTS.reserve::<CallDone>(0) {
        Some(mut slot) => {
            slot.write(CallDone {
                header: EventHeader {
                    kind: EVENT_CALL_DONE,
                    tid,
                    tgid: call.tgid,
                    _pad: 0,
                },
                call: *call,
                end_ns,
                result: ctx.ret::<u64>() & 0xffff_ffff,
            });
            slot.submit(0);
        }
        None => count(counters::CALL_EVENT_LOST),
    }
    let _ = WP_IN_CALL.remove(&tid);
    Some(())
}

#[uprobe]
pub fn wp_name_enter(ctx: ProbeContext) -> u32 {
    let _ = try_name_enter(&ctx);
    0
}

/// `wp_name_enter` in a `uprobe.multi` section (see `wp_call_enter_m`).
#[unsafe(no_mangle)]
#[unsafe(link_section = "uprobe.multi")]
pub fn wp_name_enter_m(ctx: *mut core::ffi::c_void) -> u32 {
    let _ = try_name_enter(&ProbeContext::new(ctx));
    0
}

#[inline(always)]
fn try_name_enter(ctx: &ProbeContext) -> Option<()> {
    let (_, tid) = watched()?;
    let api = cookie(ctx) as u32;
    // Both candidates are read unconditionally (`arch::args_1_2` says why).
    let (second, third) = arch::args_1_2(ctx.regs);
    let pending = PendingName {
        out_ptr: ctx.arg::<u64>(0).unwrap_or(0),
        name_or_kernel: if api == api::NAME_KERNEL_GET_FUNCTION {
            second
        } else {
            third
        },
        api,
        _pad: 0,
    };
    let _ = WP_PENDING_NAME.insert(&tid, &pending, 0);
    Some(())
}

#[uretprobe]
pub fn wp_name_exit(ctx: RetProbeContext) -> u32 {
    let _ = try_name_exit(&ctx);
    0
}

/// `wp_name_exit` in a `uretprobe.multi` section (see `wp_call_enter_m`).
#[unsafe(no_mangle)]
#[unsafe(link_section = "uretprobe.multi")]
pub fn wp_name_exit_m(ctx: *mut core::ffi::c_void) -> u32 {
    let _ = try_name_exit(&RetProbeContext::new(ctx));
    0
}

#[inline(always)]
fn try_name_exit(ctx: &RetProbeContext) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // SAFETY: copied out at once.
    let Some(pending) = (unsafe { WP_PENDING_NAME.get(&tid) }).copied() else {
        return None;
    };
    let _ = WP_PENDING_NAME.remove(&tid);
    if ctx.ret::<u64>() & 0xffff_ffff != 0 {
        return None; // the lookup failed: no handle was written
    }
    let Some(handle) = read_user::<u64>(pending.out_ptr) else {
        return None;
    };
    let Some(mut slot) = WP_EVENTS.reserve::<KernelName>(0) else {
        count(counters::NAME_EVENT_LOST);
        return None;
    };
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points to a reserved KernelName; every field is written before submit.
    unsafe {
        (*ev).header = EventHeader {
            kind: EVENT_KERNEL_NAME,
            tid,
            tgid: (pid_tgid >> 32) as u32,
            _pad: 0,
        };
        (*ev).handle = handle;
        (*ev).name = [0u8; NAME_LEN];
        if pending.api == api::NAME_KERNEL_GET_FUNCTION {
            (*ev).alias_of = pending.name_or_kernel;
        } else {
            (*ev).alias_of = 0;
            let _ =
                bpf_probe_read_user_str_bytes(pending.name_or_kernel as *const u8, &mut (*ev).name);
        }
    }
    slot.submit(0);
    Some(())
}

#[tracepoint]
pub fn wp_sched_yield(ctx: TracePointContext) -> u32 {
    let _ = try_sched_yield(&ctx);
    0
}

#[inline(always)]
fn try_sched_yield(_ctx: &TracePointContext) -> Option<()> {
    let (tgid, tid) = watched()?;
    if let Some(call) = WP_IN_CALL.get_ptr_mut(&tid) {
        // SAFETY: this thread's own entry; a helper with no memory arguments.
        unsafe {
            (*call).yields += 1;
            (*call).last_yield_ns = bpf_ktime_get_ns();
        }
    }
    let n = match WP_THREAD_YIELDS.get_ptr_mut(&tid) {
        // SAFETY: only this thread adds to its own counter.
        Some(n) => unsafe {
            *n += 1;
            *n
        },
        None => {
            let _ = WP_THREAD_YIELDS.insert(&tid, &1, 0);
            1
        }
    };
    // A thread yielding in a loop is seldom on a core when the timer samples on a busy host:
    // it gives its core away at every yield. On this 2-core machine with one busy loop beside,
    // a launcher spinning in a full queue since before attach got one timer sample in 4.75 s,
    // so `report` could not see it inside cuLaunchKernel and watched on as if it were a host
    // spin (2026-12-07). Its yields are its own sampling points: its first since attach, then
    // every `YIELDS_PER_SAMPLE_CHECK`th (the check itself, a map lookup and a clock read, made
    // on every yield cost ~100 ns a yield on top of the ~400 ns the tracepoint already costs),
    // under the timer's rate limit.
    if n == 1 || n % YIELDS_PER_SAMPLE_CHECK == 0 {
        sample_stack(tgid, tid);
    }
    Some(())
}

/// A yielding thread's stack is looked at on every this-many yields: that starved launcher
/// still yielded ~1,100 times a second (one look every ~60 ms), a free-running one ~72,000.
const YIELDS_PER_SAMPLE_CHECK: u64 = 64;

#[perf_event]
pub fn wp_on_cpu(ctx: PerfEventContext) -> u32 {
    let _ = try_on_cpu(&ctx);
    0
}

#[inline(always)]
fn try_on_cpu(_ctx: &PerfEventContext) -> Option<()> {
    let Some((tgid, tid)) = watched() else {
        return None;
    };
    sample_stack(tgid, tid)
}

/// Sends the calling thread's user stack top to `WP_SAMPLES`, at most once per
/// `SAMPLE_GAP_NS` per thread, unless a call we saw begin and will see end says where it is.
#[inline(always)]
fn sample_stack(tgid: u32, tid: u32) -> Option<()> {
    // SAFETY: read at once.
    if unsafe { WP_IN_CALL.get(&tid) }.is_some_and(|c| c.flags & CALL_OPEN_ENDED == 0) {
        return None; // entry and return probes already say where it is
    }
    // SAFETY: a helper with no memory arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: read and copied at once.
    if let Some(last) = unsafe { WP_LAST_SAMPLE.get(&tid) }
        && now.wrapping_sub(*last) < SAMPLE_GAP_NS
    {
        return None;
    }
    let _ = WP_LAST_SAMPLE.insert(&tid, &now, 0);
    // The sample may interrupt kernel code (a sched_yield, a page fault): the user registers
    // are the ones saved at the top of the task's kernel stack.
    // SAFETY: bpf_task_pt_regs takes the BTF task pointer the helper returns.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf() as *mut _) } as *const pt_regs;
    if regs.is_null() {
        return None;
    }
    // SAFETY: `regs` is a kernel pointer from bpf_task_pt_regs, read with a probing helper.
    let Ok(regs) = (unsafe { aya_ebpf::helpers::bpf_probe_read_kernel(regs) }) else {
        return None;
    };
    let Some(mut slot) = WP_SAMPLES.reserve::<StackSample>(0) else {
        count(counters::SAMPLE_LOST);
        return None;
    };
    let s = slot.as_mut_ptr();
    const CHUNK: usize = 512;
    let (sp, ip, bp) = arch::sp_ip_fp(&regs);
    // SAFETY: `s` points to a reserved StackSample; the header fields are written here and
    // `stack` is filled by the probing reads below, `len` says how much of it is valid.
    unsafe {
        (*s).header = SampleHeader {
            tid,
            tgid,
            time_ns: now,
            ip,
            sp,
            bp,
            len: 0,
        };
        let mut len = 0u64;
        let base = (*s).stack.as_mut_ptr();
        for i in 0..(SAMPLE_STACK_LEN / CHUNK) {
            let dst = base.add(i * CHUNK) as *mut core::ffi::c_void;
            let src = (sp + (i * CHUNK) as u64) as *const core::ffi::c_void;
            if aya_ebpf::helpers::generated::bpf_probe_read_user(dst, CHUNK as u32, src) != 0 {
                break; // the top of the stack mapping
            }
            len += CHUNK as u64;
        }
        (*s).header.len = len;
    }
    slot.submit(0);
    Some(())
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
