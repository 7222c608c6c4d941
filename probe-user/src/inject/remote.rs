//! Taking over one thread of the target, at a system call, to run the injection blob.
//!
//! The order of steps is what makes a SIGKILL of wedgeprobe at any point harmless:
//! 1. the thread is seized and stopped at the entry of its futex wait (the one system call
//!    chosen for it: callers of futex handle a wait that returns early or is made again);
//! 2. that call becomes an `mmap` of the injection page — the one window where the thread,
//!    were wedgeprobe killed right then, would go on with its futex wait "returning" the
//!    mapping's address (a spurious wake-up to its caller) and with the futex arguments'
//!    registers holding mmap's. A few microseconds, between two ptrace calls;
//! 3. the thread, stopped at that mmap's exit, is set to make its futex wait again — killed
//!    from here to step 5, it does exactly that;
//! 4. the page is written: the blob, its data, the shim's image;
//! 5. the thread is pointed at the blob and let go. From here nothing waits for wedgeprobe:
//!    the blob loads the shim, calls it, restores the thread and makes its futex wait again.
//!    wedgeprobe only watches the page for `DONE`.

use std::time::{Duration, Instant};

use probe_common::attach::AttachArgs;

use super::{
    InjectError, blob,
    ptrace::{self, Stop},
};
use crate::{
    process::{
        code::TargetCode,
        stackscan::{self, CodeView as _},
    },
    sys,
};

const SYS_FUTEX: u64 = 202;
const SYS_MMAP: u64 = 9;
const SYS_MPROTECT: u64 = 10;
const FUTEX_WAIT: u64 = 0;
const FUTEX_WAIT_BITSET: u64 = 9;
/// FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME: bits beside the operation.
const FUTEX_OP_MASK: u64 = 0x7f;

/// A thread of `pid` idle in a futex wait with no timeout, not inside libcuda: the one to
/// take over (a wait with a timeout becomes `restart_syscall` when interrupted, whose restart
/// block our own system calls would overwrite).
pub fn pick_thread(pid: u32, code: &TargetCode, exclude: &[u32]) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut tids: Vec<u32> = tasks
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|t| !exclude.contains(t))
        .collect();
    // The main thread last (Python's runs the interpreter), the driver's own threads only if
    // there is nothing else (their waits are the driver's business).
    tids.sort_unstable_by_key(|&t| (t == pid, t));
    let mut driver_thread = None;
    let found = tids.into_iter().find(|&tid| {
        let Some(call) = read_syscall(pid, tid) else {
            return false;
        };
        if !call.is_untimed_futex_wait() {
            return false;
        }
        let mut stack = vec![0u8; 8192];
        let n = sys::read_process_memory(pid, call.sp, &mut stack).unwrap_or(0);
        let stack = &stack[..n];
        let found = stackscan::entry_point(call.pc, stack, code);
        if std::env::var_os("WEDGEPROBE_DEBUG_ATTACH").is_some() {
            eprintln!("attach: thread {tid} waits in a futex; {n} stack bytes; libcuda: {found:?}");
        }
        if found.is_some() {
            return false;
        }
        let in_driver = stackscan::code_words(stack, code, 64)
            .iter()
            .any(|&a| code.in_libcuda(a) && stackscan::is_return_address(code, a));
        if in_driver {
            driver_thread.get_or_insert(tid);
        }
        !in_driver
    });
    found.or(driver_thread)
}

/// `/proc/PID/task/TID/syscall`: the system call a sleeping thread is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyscallState {
    pub nr: u64,
    pub args: [u64; 6],
    pub sp: u64,
    pub pc: u64,
}

impl SyscallState {
    pub fn is_untimed_futex_wait(&self) -> bool {
        self.nr == SYS_FUTEX
            && matches!(self.args[1] & FUTEX_OP_MASK, FUTEX_WAIT | FUTEX_WAIT_BITSET)
            && self.args[3] == 0
    }
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
}

/// Where the injection runs: the target's `dlopen` and `dlsym`, the shim's image, and the
/// arguments for its attach call.
pub struct Plan<'a> {
    pub pid: u32,
    pub tid: u32,
    pub dlopen: u64,
    pub dlsym: u64,
    pub image: &'a [u8],
    pub args: AttachArgs,
    /// How long the blob may take to come back (loading the shim, preparing its hooks).
    pub wait: Duration,
}

/// Runs the injection on `plan.tid` (see the module doc). `Err(InjectError::ThreadBusy)`:
/// that thread was not where it was expected (it woke up); it was let go untouched.
pub fn run(plan: Plan) -> Result<Ran, InjectError> {
    let Plan { pid, tid, .. } = plan;
    ptrace::seize(tid).map_err(|e| InjectError::from_ptrace(pid, e))?;
    let pending = match ptrace::stop(tid, Duration::from_millis(500)) {
        Ok(sig) => sig,
        Err(_) => {
            ptrace::release(tid);
            return Err(InjectError::ThreadBusy { tid });
        }
    };
    // To the entry of the futex wait it was in (interrupted, the kernel makes it again).
    if ptrace::to_syscall(tid, pending).is_err() {
        ptrace::release(tid);
        return Err(InjectError::ThreadBusy { tid });
    }
    let start = Instant::now();
    loop {
        match ptrace::wait_stop(tid, Duration::from_millis(500)) {
            Some(Stop::Syscall) => break,
            Some(Stop::Signal(sig)) if start.elapsed() < Duration::from_secs(1) => {
                let _ = ptrace::to_syscall(tid, Some(sig));
            }
            Some(Stop::Exited) => return Err(InjectError::ThreadBusy { tid }),
            _ => {
                ptrace::release(tid);
                return Err(InjectError::ThreadBusy { tid });
            }
        }
    }
    let r0 = ptrace::regs(tid).map_err(|e| InjectError::from_ptrace(pid, e))?;
    let mut insn = [0u8; 2];
    let at_syscall = sys::read_process_memory(pid, r0.rip - 2, &mut insn).is_ok_and(|n| n == 2)
        && insn == [0x0f, 0x05];
    let futex = SyscallState {
        nr: r0.orig_rax,
        args: [r0.rdi, r0.rsi, r0.rdx, r0.r10, r0.r8, r0.r9],
        sp: r0.rsp,
        pc: r0.rip,
    };
    if !at_syscall || !futex.is_untimed_futex_wait() {
        // Not the wait it was in a moment ago: let it make this call as it meant to.
        let _ = ptrace::detach(tid, None);
        return Err(InjectError::ThreadBusy { tid });
    }
    // From the next step on, a thread resumed by the kernel (wedgeprobe killed) makes its
    // futex wait again: back on its syscall instruction, the call's number in rax.
    let mut replay = r0;
    replay.rip = r0.rip - 2;
    replay.rax = r0.orig_rax;
    let len = blob::len(plan.image.len() as u64);
    let (base, executable) = match remote_mmap(tid, &r0, &replay, len) {
        Ok(v) => v,
        Err(e) => {
            let _ = ptrace::set_regs(tid, replay);
            let _ = ptrace::detach(tid, None);
            return Err(e);
        }
    };
    let mut args = plan.args;
    args.page = base;
    args.page_len = len;
    if let Err(e) = write_page(pid, base, &plan, &args, &r0) {
        let _ = ptrace::detach(tid, None);
        return Err(e);
    }
    if !executable && let Err(e) = remote_mprotect(tid, &replay, base) {
        let _ = ptrace::detach(tid, None);
        return Err(e);
    }
    // Hand over: the blob's entry, its own stack; no system call to restart.
    let mut go = r0;
    go.rip = base;
    go.rsp = base + blob::STACK_TOP;
    go.rax = 0;
    go.orig_rax = u64::MAX;
    ptrace::set_regs(tid, go).map_err(|e| InjectError::from_ptrace(pid, e))?;
    let _ = ptrace::detach(tid, None);
    wait_done(pid, base, plan.wait)
}

/// The syscall at the current stop becomes `mmap` of the page, RWX or else RW (then made RX
/// after it is written); the thread is left stopped at its exit, set to replay its wait.
fn remote_mmap(
    tid: u32,
    r0: &ptrace::Regs,
    replay: &ptrace::Regs,
    len: u64,
) -> Result<(u64, bool), InjectError> {
    const PROT_RWX: u64 = 7;
    const PROT_RW: u64 = 3;
    const MAP_PRIVATE_ANON: u64 = 0x22;
    let mut first = true;
    for prot in [PROT_RWX, PROT_RW] {
        let mut r = if first { *r0 } else { *replay };
        r.orig_rax = SYS_MMAP;
        r.rax = SYS_MMAP;
        r.rdi = 0;
        r.rsi = len;
        r.rdx = prot;
        r.r10 = MAP_PRIVATE_ANON;
        r.r8 = u64::MAX;
        r.r9 = 0;
        let result = remote_syscall(tid, r, first)?;
        first = false;
        ptrace::set_regs(tid, *replay).map_err(|_| InjectError::ThreadBusy { tid })?;
        if (result as i64) > 0 {
            return Ok((result, prot == PROT_RWX));
        }
    }
    Err(InjectError::Failed(
        "the target could not map the injection page (mmap refused)".into(),
    ))
}

/// Makes the page's first 4 KiB (the blob) read-and-execute.
fn remote_mprotect(tid: u32, replay: &ptrace::Regs, base: u64) -> Result<(), InjectError> {
    const PROT_RX: u64 = 5;
    let mut r = *replay;
    r.orig_rax = SYS_MPROTECT;
    r.rax = SYS_MPROTECT;
    r.rdi = base;
    r.rsi = 4096;
    r.rdx = PROT_RX;
    let result = remote_syscall(tid, r, false)?;
    ptrace::set_regs(tid, *replay).map_err(|_| InjectError::ThreadBusy { tid })?;
    if result != 0 {
        return Err(InjectError::Failed(
            "the target may not execute new code (mprotect PROT_EXEC refused: a W^X policy)".into(),
        ));
    }
    Ok(())
}

/// Runs one system call on the stopped thread: at an entry stop (`at_entry`) the pending call
/// is replaced; at an exit stop the thread is sent back to its syscall instruction to make it.
/// Returns the result (rax); the thread is left at that call's exit stop.
fn remote_syscall(tid: u32, r: ptrace::Regs, at_entry: bool) -> Result<u64, InjectError> {
    let busy = || InjectError::ThreadBusy { tid };
    ptrace::set_regs(tid, r).map_err(|_| busy())?;
    let steps = if at_entry { 1 } else { 2 };
    for _ in 0..steps {
        ptrace::to_syscall(tid, None).map_err(|_| busy())?;
        match ptrace::wait_stop(tid, Duration::from_millis(500)) {
            Some(Stop::Syscall) => {}
            _ => return Err(busy()),
        }
    }
    Ok(ptrace::regs(tid).map_err(|_| busy())?.rax)
}

fn write_page(
    pid: u32,
    base: u64,
    plan: &Plan,
    args: &AttachArgs,
    r0: &ptrace::Regs,
) -> Result<(), InjectError> {
    let put = |off: u64, bytes: &[u8]| -> Result<(), InjectError> {
        match sys::write_process_memory(pid, base + off, bytes) {
            Ok(n) if n == bytes.len() => Ok(()),
            _ => Err(InjectError::Failed(
                "cannot write the injection page into the target".into(),
            )),
        }
    };
    put(0, blob::code())?;
    // SAFETY: AttachArgs is plain old data (repr(C), padding-free: pinned by its test).
    let args_bytes = unsafe {
        std::slice::from_raw_parts(
            (args as *const AttachArgs).cast::<u8>(),
            std::mem::size_of::<AttachArgs>(),
        )
    };
    put(blob::ARGS, args_bytes)?;
    let regs: Vec<u8> = blob::resume_words(r0)
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    put(blob::REGS, &regs)?;
    put(blob::DLOPEN, &plan.dlopen.to_le_bytes())?;
    put(blob::DLSYM, &plan.dlsym.to_le_bytes())?;
    put(blob::IMAGE_LEN, &(plan.image.len() as u64).to_le_bytes())?;
    put(blob::PATH, b"/proc/self/fd/\0")?;
    put(blob::SYMBOL_NAME, b"wedgeprobe_shim_attach\0")?;
    put(blob::MEMFD_NAME, b"wedgeprobe-shim\0")?;
    for (i, chunk) in plan.image.chunks(1 << 20).enumerate() {
        put(blob::IMAGE + (i as u64) * (1 << 20), chunk)?;
    }
    Ok(())
}

fn read_u64(pid: u32, addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    (sys::read_process_memory(pid, addr, &mut b).ok()? == 8).then(|| u64::from_le_bytes(b))
}

/// Watches the page for `DONE`, up to `wait`; then reads what the blob and the shim wrote.
fn wait_done(pid: u32, base: u64, wait: Duration) -> Result<Ran, InjectError> {
    let start = Instant::now();
    while read_u64(pid, base + blob::DONE) != Some(1) {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(InjectError::TargetExited { pid });
        }
        if start.elapsed() >= wait {
            return Err(InjectError::Timeout {
                step: read_u64(pid, base + blob::STEP).unwrap_or(0),
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
    if sys::read_process_memory(pid, base + blob::ARGS, buf).ok() != Some(buf.len()) {
        return Err(InjectError::Failed(
            "cannot read the shim's answer back".into(),
        ));
    }
    Ok(Ran {
        args,
        handle: read_u64(pid, base + blob::HANDLE).unwrap_or(0),
        symbol: read_u64(pid, base + blob::SYMBOL).unwrap_or(0),
        step: read_u64(pid, base + blob::STEP).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_lines_parse_and_only_untimed_futex_waits_qualify() {
        let wait = parse_syscall("202 0x7f00 0x80 0x0 0x0 0x0 0x0 0x7ffd1000 0x7f1234\n").unwrap();
        assert!(wait.is_untimed_futex_wait());
        assert_eq!((wait.sp, wait.pc), (0x7ffd1000, 0x7f1234));
        let bitset = parse_syscall("202 0x7f00 0x189 0x0 0x0 0x0 0xffffffff 0x1 0x2").unwrap();
        assert!(bitset.is_untimed_futex_wait());
        let timed = parse_syscall("202 0x7f00 0x80 0x0 0x7ffd2000 0x0 0x0 0x1 0x2").unwrap();
        assert!(!timed.is_untimed_futex_wait());
        let wake = parse_syscall("202 0x7f00 0x81 0x1 0x0 0x0 0x0 0x1 0x2").unwrap();
        assert!(!wake.is_untimed_futex_wait());
        let poll = parse_syscall("7 0x1 0x2 0xffffffff 0x0 0x0 0x0 0x1 0x2").unwrap();
        assert!(!poll.is_untimed_futex_wait());
        assert_eq!(parse_syscall("running\n"), None);
        assert_eq!(parse_syscall("-1 0x7ffd1000 0x7f1234\n"), None);
        assert_eq!(parse_syscall("202 zz"), None);
    }
}
