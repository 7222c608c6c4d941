//! Taking over one thread of the target, at a system call, to run the injection blob.
//!
//! The order of steps is what makes a SIGKILL of wedgeprobe at any point harmless:
//! 1. the blob, carrying the thread's registers in its instructions, is written into a code
//!    cave (`cave`) — killed now, the thread (not yet stopped) never goes there;
//! 2. the thread is seized and stopped where its idle wait (`IdleWait`) can be taken from it
//!    and given back unchanged: at the entry of the same call made again, where the kernel
//!    would make it again anyway after a stop (a futex, epoll, poll, select or read wait, a
//!    sleep until a time) — killed now, the kernel lets it make that call; or, for a wait with
//!    a relative timeout the kernel resumes from its own restart block (a timed futex, a
//!    relative sleep, a timed poll), as that wait ends on its own (up to `AT_END_WAIT`) —
//!    killed before, the wait goes on untouched;
//! 3. the thread is pointed at the blob (the call made again skipped) — from here on the blob
//!    does everything itself, waits (at most 5 s) for wedgeprobe to fill its page, and puts
//!    the thread back with every register restored, whether wedgeprobe is alive or not: on its
//!    wait made again, or just past the wait that ended, with its result;
//! 4. wedgeprobe reads the page's address at the exit of the blob's mmap, lets the thread go,
//!    fills the page (the shim's image, dlopen/dlsym, the attach arguments), sets READY,
//!    waits for DONE, reads the answer and sets ACK.
//!
//! No system call of the thread's is ever replaced: nothing it runs afterwards sees a result
//! or a register it did not have, and `EINTR` never reaches it (an `epoll_wait` interrupted by
//! a stop returns `EINTR`: wedgeprobe has the kernel make it again instead).

use std::time::{Duration, Instant};

use probe_common::attach::AttachArgs;

use super::{
    blob, cave,
    error::InjectError,
    ptrace::{self, Stop},
};
use crate::{
    process::{
        code::TargetCode,
        stackscan::{self, CodeView as _},
    },
    sys,
};

const SYS_READ: u64 = 0;
const SYS_POLL: u64 = 7;
const SYS_SELECT: u64 = 23;
const SYS_NANOSLEEP: u64 = 35;
const SYS_FUTEX: u64 = 202;
const SYS_RESTART: u64 = 219;
const SYS_CLOCK_NANOSLEEP: u64 = 230;
const SYS_EPOLL_WAIT: u64 = 232;
const SYS_PSELECT6: u64 = 270;
const SYS_PPOLL: u64 = 271;
const SYS_EPOLL_PWAIT: u64 = 281;
const SYS_EPOLL_PWAIT2: u64 = 441;
const SYS_MMAP: u64 = 9;
const FUTEX_WAIT: u64 = 0;
const FUTEX_WAIT_BITSET: u64 = 9;
/// FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME: bits beside the operation.
const FUTEX_OP_MASK: u64 = 0x7f;
const TIMER_ABSTIME: u64 = 1;
const EINTR: i64 = 4;
/// The kernel's "make the call again" results (include/linux/errno.h): seen by a tracer at a
/// stop inside an interrupted call, never by the program.
const ERESTARTSYS: i64 = 512;
const ERESTARTNOINTR: i64 = 513;
const ERESTARTNOHAND: i64 = 514;
const ERESTART_RESTARTBLOCK: i64 = 516;
/// How long a wait with a relative timeout may take to end on its own before the thread is
/// let go (untouched) and another one tried.
const AT_END_WAIT: Duration = Duration::from_millis(1500);

/// An idle wait a thread can be borrowed from (issue 31), by how it is given back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleWait {
    /// futex wait, no timeout.
    Futex,
    /// futex wait until a time (`FUTEX_WAIT_BITSET`: its timeout is absolute).
    FutexUntil,
    /// futex wait with a relative timeout (`FUTEX_WAIT`).
    FutexFor,
    /// `epoll_wait`/`epoll_pwait`/`epoll_pwait2` with no timeout.
    Epoll,
    /// `poll` with no timeout.
    Poll,
    /// `poll` with a timeout (relative, resumed from the kernel's restart block).
    PollFor,
    /// `ppoll`: the kernel writes the time left back into its argument.
    Ppoll,
    /// `select`/`pselect6`: as `ppoll`.
    Select,
    /// `nanosleep`/`clock_nanosleep`, relative.
    SleepFor,
    /// `clock_nanosleep(TIMER_ABSTIME)`.
    SleepUntil,
    /// `read` on a pipe.
    ReadPipe,
    /// `read` on a socket.
    ReadSocket,
}

impl IdleWait {
    /// What `wedgeprobe attach` says the borrowed thread was doing.
    pub fn describe(self) -> &'static str {
        match self {
            IdleWait::Futex => "a futex wait",
            IdleWait::FutexUntil => "a futex wait until a time",
            IdleWait::FutexFor => "a futex wait with a timeout",
            IdleWait::Epoll => "epoll_wait",
            IdleWait::Poll => "poll",
            IdleWait::PollFor => "poll with a timeout",
            IdleWait::Ppoll => "ppoll",
            IdleWait::Select => "select",
            IdleWait::SleepFor => "nanosleep",
            IdleWait::SleepUntil => "clock_nanosleep until a time",
            IdleWait::ReadPipe => "read on a pipe",
            IdleWait::ReadSocket => "read on a socket",
        }
    }

    /// Taken as the wait ends on its own (its timeout is relative, and only the kernel's
    /// restart block knows how much of it is left), not at once.
    pub fn at_its_end(self) -> bool {
        matches!(
            self,
            IdleWait::FutexFor | IdleWait::PollFor | IdleWait::SleepFor
        )
    }

    /// The kinds `/proc/PID/task/TID/syscall` shows; `fd_kind` names what a read's fd is.
    pub fn of(call: &SyscallState, fd_kind: impl Fn(u64) -> Option<String>) -> Option<Self> {
        let a = call.args;
        Some(match call.nr {
            SYS_FUTEX => match (a[1] & FUTEX_OP_MASK, a[3]) {
                (FUTEX_WAIT | FUTEX_WAIT_BITSET, 0) => IdleWait::Futex,
                (FUTEX_WAIT_BITSET, _) => IdleWait::FutexUntil,
                (FUTEX_WAIT, _) => IdleWait::FutexFor,
                _ => return None,
            },
            // A timed epoll wait interrupted returns EINTR, and made again it would wait its
            // whole timeout anew: not taken.
            SYS_EPOLL_WAIT | SYS_EPOLL_PWAIT if a[3] as i32 == -1 => IdleWait::Epoll,
            SYS_EPOLL_PWAIT2 if a[3] == 0 => IdleWait::Epoll,
            SYS_POLL if (a[2] as i32) < 0 => IdleWait::Poll,
            SYS_POLL => IdleWait::PollFor,
            SYS_PPOLL => IdleWait::Ppoll,
            SYS_SELECT | SYS_PSELECT6 => IdleWait::Select,
            SYS_NANOSLEEP => IdleWait::SleepFor,
            SYS_CLOCK_NANOSLEEP if a[1] & TIMER_ABSTIME != 0 => IdleWait::SleepUntil,
            SYS_CLOCK_NANOSLEEP => IdleWait::SleepFor,
            SYS_READ => match fd_kind(a[0])? {
                k if k.starts_with("pipe:") => IdleWait::ReadPipe,
                k if k.starts_with("socket:") => IdleWait::ReadSocket,
                _ => return None,
            },
            _ => return None,
        })
    }
}

/// The thread picked to run the injection: its wait as seen, and what kind it is.
#[derive(Clone, Copy, Debug)]
pub struct Idle {
    pub tid: u32,
    pub call: SyscallState,
    pub wait: IdleWait,
}

/// A thread of `pid` idle in a wait it can be borrowed from (`IdleWait`), not inside libcuda:
/// the one to take over. Waits given back at once come before those taken at their end; the
/// main thread (Python's runs the interpreter) and the driver's own threads (their waits are
/// the driver's business) last.
pub fn pick_thread(pid: u32, code: &TargetCode, exclude: &[u32]) -> Option<Idle> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let tids: Vec<u32> = tasks
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|t| !exclude.contains(t))
        .collect();
    let fd_kind = |fd: u64| {
        std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    };
    // Five looks 4 ms apart: a thread woken every few ms is running (or runnable, waiting for
    // a core) at any one look now and then, and would be passed over for a worse candidate.
    // While the best found is the main thread or a driver's thread, up to 20 more: on a busy
    // two-core machine a worker thread woken every 20 ms was missed by all five looks once
    // (the suite under load, 2026-12-07), and Python's main thread was borrowed instead.
    let mut found: Vec<(bool, bool, bool, u32, Idle)> = Vec::new();
    for look in 0..25 {
        if look >= 5 && found.iter().any(|f| !f.0 && !f.2) {
            break;
        }
        if look > 0 {
            std::thread::sleep(std::time::Duration::from_millis(4));
        }
        let seen: Vec<_> = tids
            .iter()
            .copied()
            .filter(|t| !found.iter().any(|f| f.3 == *t))
            .filter_map(|tid| {
                let call = read_syscall(pid, tid)?;
                let wait = IdleWait::of(&call, fd_kind)?;
                let mut stack = vec![0u8; 8192];
                let n = sys::read_process_memory(pid, call.sp, &mut stack).unwrap_or(0);
                let stack = &stack[..n];
                let inside = stackscan::entry_point(call.pc, stack, code);
                if inside.is_some() {
                    return None;
                }
                let in_driver = stackscan::code_words(stack, code, 64)
                    .iter()
                    .any(|&a| code.in_libcuda(a) && stackscan::is_return_address(code, a));
                if std::env::var_os("WEDGEPROBE_DEBUG_ATTACH").is_some() {
                    eprintln!(
                        "attach: thread {tid} waits in {wait:?}; {n} stack bytes; libcuda: \
                     {inside:?}; driver's thread: {in_driver}; {}",
                        stackscan::explain(call.pc, stack, code)
                    );
                }
                Some((
                    in_driver,
                    wait.at_its_end(),
                    tid == pid,
                    tid,
                    Idle { tid, call, wait },
                ))
            })
            .collect();
        found.extend(seen);
    }
    found.sort_unstable_by_key(|f| (f.0, f.1, f.2, f.3));
    found.first().map(|f| f.4)
}

/// `/proc/PID/task/TID/syscall`: the system call a sleeping thread is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyscallState {
    pub nr: u64,
    pub args: [u64; 6],
    pub sp: u64,
    pub pc: u64,
}

pub fn read_syscall(pid: u32, tid: u32) -> Option<SyscallState> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    parse_syscall(&text)
}

/// Parses the file's one line: `nr a0 … a5 sp pc` (hex but nr), or `running` / `-1 sp pc`.
pub fn parse_syscall(text: &str) -> Option<SyscallState> {
    let w: Vec<&str> = text.split_whitespace().collect();
    if w.len() != 9 {
        return None;
    }
    let nr: u64 = w[0].parse().ok()?;
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    let mut args = [0u64; 6];
    for (a, s) in args.iter_mut().zip(&w[1..7]) {
        *a = hex(s)?;
    }
    Some(SyscallState {
        nr,
        args,
        sp: hex(w[7])?,
        pc: hex(w[8])?,
    })
}

/// What the blob reported back.
#[derive(Debug)]
pub struct Ran {
    pub args: AttachArgs,
    /// dlopen's handle and the symbol's address (0: failed), and the last step reached.
    pub handle: u64,
    pub symbol: u64,
    pub step: u64,
    /// Where the blob was written (its bytes go back once the thread has left it).
    pub cave: cave::Cave,
    pub tid: u32,
    /// What the borrowed thread was doing.
    pub wait: IdleWait,
}

/// Where the injection runs: the target's `dlopen` and `dlsym`, the shim's image, and the
/// arguments for its attach call.
pub struct Plan<'a> {
    pub pid: u32,
    pub idle: Idle,
    pub dlopen: u64,
    pub dlsym: u64,
    pub image: &'a [u8],
    pub args: AttachArgs,
    /// How long the blob may take to come back (loading the shim, preparing its hooks).
    pub wait: Duration,
}

/// A cookie the blob writes at its page's start: the page wedgeprobe fills is the blob's.
fn cookie() -> u64 {
    let t = sys::monotonic_ns() ^ u64::from(std::process::id()).rotate_left(32);
    t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// Runs the injection on `plan.idle`'s thread (see the module doc).
/// `Err(InjectError::ThreadBusy)`: that thread was not where it was expected (it woke up);
/// `ThreadSlow`: its wait did not end in time. Either way it was let go, its wait as it was.
pub fn run(plan: Plan) -> Result<Ran, InjectError> {
    let Plan { pid, idle, .. } = plan;
    let tid = idle.tid;
    let len = blob::len(plan.image.len() as u64);
    let cave = cave::find(pid, blob::code_len()).ok_or_else(|| {
        InjectError::Failed(format!(
            "no code cave of {} bytes in pid {pid}'s executable mappings to write the \
             injection into",
            blob::code_len()
        ))
    })?;
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .map_err(|e| InjectError::Failed(format!("cannot open /proc/{pid}/mem: {e}")))?;
    ptrace::seize(tid).map_err(|e| InjectError::from_ptrace(pid, e))?;
    let Some((resume, resume_rip, mut go)) = take(pid, idle)? else {
        return Err(InjectError::ThreadBusy { tid });
    };
    let cookie = cookie();
    let code = blob::patched(len, cookie, resume, resume_rip);
    if let Err(e) = sys::write_code_bytes(&mem, cave.addr, &cave.original, &code) {
        let _ = ptrace::detach(tid, None);
        return Err(InjectError::Failed(format!(
            "cannot write the injection into pid {pid}'s code at {:#x}: {e}",
            cave.addr
        )));
    }
    // Skip the call made again, or leave the one just ended (no restart: orig_rax -1), and
    // go to the blob.
    go.orig_rax = u64::MAX;
    go.rip = cave.addr;
    ptrace::set_regs(tid, go).map_err(|e| InjectError::from_ptrace(pid, e))?;
    // The blob's first call is its mmap: its exit gives the page's address. (Stops on the
    // way: the skipped wait's exit, the mmap's entry.)
    let mut page = 0u64;
    for _ in 0..4 {
        if ptrace::to_syscall(tid, None).is_err()
            || wait_syscall(tid, Duration::from_secs(1)) != Some(Stop::Syscall)
        {
            break;
        }
        match ptrace::regs(tid) {
            Ok(r) if r.orig_rax == SYS_MMAP && (r.rax as i64) > 0 => {
                page = r.rax;
                break;
            }
            _ => {}
        }
    }
    let _ = ptrace::detach(tid, None);
    if page == 0 {
        return Err(InjectError::Failed(
            "the blob could not map its page in the target (it put the thread back on its own)"
                .into(),
        ));
    }
    let ready = wait_until(Duration::from_secs(1), || {
        read_u64(pid, page + blob::COOKIE) == Some(cookie)
    });
    if !ready {
        return Err(InjectError::Failed(
            "the blob's page did not show its cookie; nothing was written into it".into(),
        ));
    }
    fill_page(pid, page, &plan, &plan.args)?;
    put(pid, page + blob::READY, &1u64.to_le_bytes())?;
    let ran = wait_done(pid, page, plan.wait);
    // Whatever came back: the blob may now restore the thread and give its page back.
    let _ = put(pid, page + blob::ACK, &1u64.to_le_bytes());
    let (args, handle, symbol, step) = ran?;
    Ok(Ran {
        args,
        handle,
        symbol,
        step,
        cave,
        tid,
        wait: idle.wait,
    })
}

/// What the blob restores (its register words, where it jumps) and the registers to send the
/// thread to it with (`rip` and `orig_rax` set by the caller).
type Taken = ([u64; 16], u64, ptrace::Regs);

/// Stops the seized thread where its wait can be taken from it and given back unchanged (the
/// module doc, step 2). `Ok(None)`: it was not in that wait any more; `Err(ThreadSlow)`: the
/// wait did not end in time — either way it was let go, and never sees `EINTR` from us.
fn take(pid: u32, idle: Idle) -> Result<Option<Taken>, InjectError> {
    let tid = idle.tid;
    let Ok(pending) = ptrace::stop(tid, Duration::from_millis(500)) else {
        ptrace::release(tid);
        debug_take(tid, 1);
        return Ok(None);
    };
    let r = ptrace::regs(tid).map_err(|e| InjectError::from_ptrace(pid, e))?;
    if r.orig_rax != idle.call.nr {
        // Woken and gone on: let it go as it was.
        let _ = ptrace::detach(tid, pending);
        debug_take(tid, 2);
        return Ok(None);
    }
    let err = -(r.rax as i64);
    let made_again = match err {
        // (An epoll wait our stop ended with EINTR is among these: `ptrace::stop` has the
        // kernel make it again; with no timeout, the same wait.)
        ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND => true,
        // A futex wait until a time, made again, ends at the same time.
        ERESTART_RESTARTBLOCK if idle.wait == IdleWait::FutexUntil => restart_instead(tid, r, pid)?,
        ERESTART_RESTARTBLOCK => false,
        EINTR => {
            // A wait we did not expect to return EINTR (a socket with a receive timeout):
            // made again rather than seen by the program; not taken.
            restart_instead(tid, r, pid)?;
            let _ = ptrace::detach(tid, pending);
            debug_take(tid, 3);
            return Ok(None);
        }
        _ => {
            // It had just ended on its own: it goes on with its result.
            let _ = ptrace::detach(tid, pending);
            debug_take(tid, 4);
            return Ok(None);
        }
    };
    if made_again {
        // To the entry of the same call, made again by the kernel.
        if ptrace::to_syscall(tid, pending).is_err()
            || !matches!(
                wait_syscall(tid, Duration::from_secs(1)),
                Some(Stop::Syscall)
            )
        {
            ptrace::release(tid);
            debug_take(tid, 5);
            return Ok(None);
        }
        let r0 = ptrace::regs(tid).map_err(|e| InjectError::from_ptrace(pid, e))?;
        let call = SyscallState {
            nr: r0.orig_rax,
            args: [r0.rdi, r0.rsi, r0.rdx, r0.r10, r0.r8, r0.r9],
            sp: r0.rsp,
            pc: r0.rip,
        };
        if !at_syscall_insn(pid, r0.rip) || call.nr != idle.call.nr || call.args != idle.call.args {
            // Not the wait it was in a moment ago: let it make this call as it meant to.
            let _ = ptrace::detach(tid, None);
            debug_take(tid, 6);
            return Ok(None);
        }
        // The blob makes the call again at its end: rax its number, at the syscall.
        let mut go = r0;
        go.rax = 0;
        return Ok(Some((blob::resume_words(&r0, r0.orig_rax), r0.rip - 2, go)));
    }
    // A relative wait the kernel resumes from its restart block (restart_syscall): let it run
    // to its end, and take the thread as it returns, result in hand.
    if ptrace::to_syscall(tid, pending).is_err()
        || !matches!(
            wait_syscall(tid, Duration::from_secs(1)),
            Some(Stop::Syscall)
        )
    {
        ptrace::release(tid);
        debug_take(tid, 7);
        return Ok(None);
    }
    let entry = ptrace::regs(tid).map_err(|e| InjectError::from_ptrace(pid, e))?;
    if entry.orig_rax != SYS_RESTART {
        let _ = ptrace::detach(tid, None);
        debug_take(tid, 8);
        return Ok(None);
    }
    let ended = ptrace::to_syscall(tid, None).is_ok()
        && matches!(wait_syscall(tid, AT_END_WAIT), Some(Stop::Syscall));
    if !ended {
        // Still waiting: stopped again (the kernel keeps its restart block) and let go.
        ptrace::release(tid);
        debug_take(tid, 9);
        return Err(InjectError::ThreadSlow { tid });
    }
    let r1 = ptrace::regs(tid).map_err(|e| InjectError::from_ptrace(pid, e))?;
    let e1 = -(r1.rax as i64);
    if r1.orig_rax != SYS_RESTART || (ERESTARTSYS..=ERESTART_RESTARTBLOCK).contains(&e1) {
        // Interrupted again (a signal of its own): the kernel's to handle.
        let _ = ptrace::detach(tid, None);
        debug_take(tid, 10);
        return Ok(None);
    }
    // The blob returns to just after the syscall with the call's result.
    Ok(Some((blob::resume_words(&r1, r1.rax), r1.rip, r1)))
}

/// `WEDGEPROBE_DEBUG_ATTACH=1`: where a take gave a thread back.
fn debug_take(tid: u32, at: u32) {
    if std::env::var_os("WEDGEPROBE_DEBUG_ATTACH").is_some() {
        eprintln!("attach: thread {tid} let go at step {at} of the take");
    }
}

/// At a stop inside an interrupted call: has the kernel make the same call again when the
/// thread goes on (ERESTARTNOHAND), instead of returning what it would have. Returns true.
fn restart_instead(tid: u32, mut r: ptrace::Regs, pid: u32) -> Result<bool, InjectError> {
    r.rax = (-ERESTARTNOHAND) as u64;
    ptrace::set_regs(tid, r).map_err(|e| InjectError::from_ptrace(pid, e))?;
    Ok(true)
}

fn at_syscall_insn(pid: u32, rip: u64) -> bool {
    let mut insn = [0u8; 2];
    sys::read_process_memory(pid, rip - 2, &mut insn).is_ok_and(|n| n == 2) && insn == [0x0f, 0x05]
}

/// The next stop of a thread sent on with PTRACE_SYSCALL (signals handed on), within `limit`.
fn wait_syscall(tid: u32, limit: Duration) -> Option<Stop> {
    let start = Instant::now();
    loop {
        let left = limit.saturating_sub(start.elapsed());
        match ptrace::wait_stop(tid, left.max(Duration::from_millis(1))) {
            Some(Stop::Signal(sig)) if start.elapsed() < limit => {
                if ptrace::to_syscall(tid, Some(sig)).is_err() {
                    return None;
                }
            }
            other => return other,
        }
    }
}

fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !f() {
        if start.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

fn put(pid: u32, addr: u64, bytes: &[u8]) -> Result<(), InjectError> {
    match sys::write_process_memory(pid, addr, bytes) {
        Ok(n) if n == bytes.len() => Ok(()),
        _ => Err(InjectError::Failed(
            "cannot write the injection page in the target".into(),
        )),
    }
}

fn fill_page(pid: u32, page: u64, plan: &Plan, args: &AttachArgs) -> Result<(), InjectError> {
    // SAFETY: AttachArgs is plain old data (repr(C), padding-free: pinned by its test).
    let args_bytes = unsafe {
        std::slice::from_raw_parts(
            (args as *const AttachArgs).cast::<u8>(),
            std::mem::size_of::<AttachArgs>(),
        )
    };
    put(pid, page + blob::ARGS, args_bytes)?;
    put(pid, page + blob::DLOPEN, &plan.dlopen.to_le_bytes())?;
    put(pid, page + blob::DLSYM, &plan.dlsym.to_le_bytes())?;
    put(
        pid,
        page + blob::IMAGE_LEN,
        &(plan.image.len() as u64).to_le_bytes(),
    )?;
    put(pid, page + blob::PATH, b"/proc/self/fd/\0")?;
    put(pid, page + blob::SYMBOL_NAME, b"wedgeprobe_shim_attach\0")?;
    put(pid, page + blob::MEMFD_NAME, b"wedgeprobe-shim\0")?;
    for (i, chunk) in plan.image.chunks(1 << 20).enumerate() {
        put(pid, page + blob::IMAGE + (i as u64) * (1 << 20), chunk)?;
    }
    Ok(())
}

fn read_u64(pid: u32, addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    (sys::read_process_memory(pid, addr, &mut b).ok()? == 8).then(|| u64::from_le_bytes(b))
}

/// Watches the page for `DONE`, up to `wait`; then reads what the blob and the shim wrote.
fn wait_done(
    pid: u32,
    page: u64,
    wait: Duration,
) -> Result<(AttachArgs, u64, u64, u64), InjectError> {
    let start = Instant::now();
    while read_u64(pid, page + blob::DONE) != Some(1) {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(InjectError::TargetExited { pid });
        }
        if start.elapsed() >= wait {
            return Err(InjectError::Timeout {
                step: read_u64(pid, page + blob::STEP).unwrap_or(0),
                waited: wait,
            });
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut args = AttachArgs::default();
    // SAFETY: plain old data, filled from the target's copy (validated by the caller).
    let buf = unsafe {
        std::slice::from_raw_parts_mut(
            (&mut args as *mut AttachArgs).cast::<u8>(),
            std::mem::size_of::<AttachArgs>(),
        )
    };
    if sys::read_process_memory(pid, page + blob::ARGS, buf).ok() != Some(buf.len()) {
        return Err(InjectError::Failed(
            "cannot read the shim's answer back".into(),
        ));
    }
    Ok((
        args,
        read_u64(pid, page + blob::HANDLE).unwrap_or(0),
        read_u64(pid, page + blob::SYMBOL).unwrap_or(0),
        read_u64(pid, page + blob::STEP).unwrap_or(0),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_lines_parse_and_the_waits_a_thread_can_be_borrowed_from_are_told_apart() {
        let kind = |line: &str| {
            let call = parse_syscall(line).unwrap();
            IdleWait::of(&call, |fd| match fd {
                3 => Some("pipe:[123]".into()),
                4 => Some("socket:[456]".into()),
                _ => Some("/dev/null".into()),
            })
        };
        let wait = parse_syscall("202 0x7f00 0x80 0x0 0x0 0x0 0x0 0x7ffd1000 0x7f1234\n").unwrap();
        assert_eq!((wait.sp, wait.pc), (0x7ffd1000, 0x7f1234));
        assert_eq!(
            kind("202 0x7f00 0x80 0x0 0x0 0x0 0x0 0x1 0x2"),
            Some(IdleWait::Futex)
        );
        // FUTEX_WAIT_BITSET | PRIVATE | CLOCK_REALTIME, untimed then until a time.
        assert_eq!(
            kind("202 0x7f00 0x189 0x0 0x0 0x0 0xffffffff 0x1 0x2"),
            Some(IdleWait::Futex)
        );
        assert_eq!(
            kind("202 0x7f00 0x189 0x0 0x7ffd2000 0x0 0xffffffff 0x1 0x2"),
            Some(IdleWait::FutexUntil)
        );
        assert_eq!(
            kind("202 0x7f00 0x80 0x0 0x7ffd2000 0x0 0x0 0x1 0x2"),
            Some(IdleWait::FutexFor)
        );
        // A wake, a lock: not waits.
        assert_eq!(kind("202 0x7f00 0x81 0x1 0x0 0x0 0x0 0x1 0x2"), None);
        assert_eq!(kind("202 0x7f00 0x86 0x1 0x0 0x0 0x0 0x1 0x2"), None);
        // epoll: only with no timeout (-1 as an int; pwait2: a NULL timespec).
        assert_eq!(
            kind("232 0x5 0x7ffd 0x40 0xffffffff 0x0 0x0 0x1 0x2"),
            Some(IdleWait::Epoll)
        );
        assert_eq!(
            kind("281 0x5 0x7ffd 0x40 0xffffffffffffffff 0x0 0x8 0x1 0x2"),
            Some(IdleWait::Epoll)
        );
        assert_eq!(kind("232 0x5 0x7ffd 0x40 0x64 0x0 0x0 0x1 0x2"), None);
        assert_eq!(
            kind("441 0x5 0x7ffd 0x40 0x0 0x0 0x8 0x1 0x2"),
            Some(IdleWait::Epoll)
        );
        assert_eq!(kind("441 0x5 0x7ffd 0x40 0x7ffd3000 0x0 0x8 0x1 0x2"), None);
        assert_eq!(
            kind("7 0x7ffd 0x2 0xffffffff 0x0 0x0 0x0 0x1 0x2"),
            Some(IdleWait::Poll)
        );
        assert_eq!(
            kind("7 0x7ffd 0x2 0x3e8 0x0 0x0 0x0 0x1 0x2"),
            Some(IdleWait::PollFor)
        );
        assert_eq!(
            kind("271 0x7ffd 0x2 0x7ffe 0x0 0x8 0x0 0x1 0x2"),
            Some(IdleWait::Ppoll)
        );
        assert_eq!(
            kind("23 0x4 0x7ffd 0x0 0x0 0x0 0x0 0x1 0x2"),
            Some(IdleWait::Select)
        );
        assert_eq!(
            kind("35 0x7ffd 0x0 0x0 0x0 0x0 0x0 0x1 0x2"),
            Some(IdleWait::SleepFor)
        );
        assert_eq!(
            kind("230 0x1 0x1 0x7ffd 0x0 0x0 0x0 0x1 0x2"),
            Some(IdleWait::SleepUntil)
        );
        assert_eq!(
            kind("230 0x1 0x0 0x7ffd 0x0 0x0 0x0 0x1 0x2"),
            Some(IdleWait::SleepFor)
        );
        // read: on a pipe or a socket, not on a file or a device.
        assert_eq!(
            kind("0 0x3 0x7ffd 0x1 0x0 0x0 0x0 0x1 0x2"),
            Some(IdleWait::ReadPipe)
        );
        assert_eq!(
            kind("0 0x4 0x7ffd 0x1 0x0 0x0 0x0 0x1 0x2"),
            Some(IdleWait::ReadSocket)
        );
        assert_eq!(kind("0 0x5 0x7ffd 0x1 0x0 0x0 0x0 0x1 0x2"), None);
        // Other calls.
        assert_eq!(kind("61 0x5 0x7ffd 0x0 0x0 0x0 0x0 0x1 0x2"), None);
        assert_eq!(parse_syscall("running\n"), None);
        assert_eq!(parse_syscall("-1 0x7ffd1000 0x7f1234\n"), None);
        assert_eq!(parse_syscall("202 zz"), None);
    }
}
