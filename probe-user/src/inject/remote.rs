//! Taking over one thread of the target, at a system call, to run the injection blob.
//!
//! The order of steps is what makes a SIGKILL of wedgeprobe at any point harmless:
//! 1. the blob, carrying the thread's registers in its instructions, is written into a code
//!    cave (`cave`) — killed now, the thread (not yet stopped) never goes there;
//! 2. the thread is seized and stopped at the entry of the untimed futex wait it was seen in
//!    — killed now, the kernel lets it make that call;
//! 3. the call is skipped and the thread pointed at the blob — from here on the blob does
//!    everything itself, waits (at most 5 s) for wedgeprobe to fill its page, and puts the
//!    thread back on its futex wait with every register restored, whether wedgeprobe is
//!    alive or not;
//! 4. wedgeprobe reads the page's address at the exit of the blob's mmap, lets the thread go,
//!    fills the page (the shim's image, dlopen/dlsym, the attach arguments), sets READY,
//!    waits for DONE, reads the answer and sets ACK.
//!
//! No system call of the thread's is ever replaced: nothing it runs afterwards sees a result
//! or a register it did not have.

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

const SYS_FUTEX: u64 = 202;
const SYS_MMAP: u64 = 9;
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
    /// Where the blob was written (its bytes go back once the thread has left it).
    pub cave: cave::Cave,
    pub tid: u32,
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

/// A cookie the blob writes at its page's start: the page wedgeprobe fills is the blob's.
fn cookie() -> u64 {
    let t = sys::monotonic_ns() ^ u64::from(std::process::id()).rotate_left(32);
    t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// Runs the injection on `plan.tid` (see the module doc). `Err(InjectError::ThreadBusy)`:
/// that thread was not where it was expected (it woke up); it was let go untouched.
pub fn run(plan: Plan) -> Result<Ran, InjectError> {
    let Plan { pid, tid, .. } = plan;
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
    if !matches!(wait_syscall(tid), Some(Stop::Syscall)) {
        ptrace::release(tid);
        return Err(InjectError::ThreadBusy { tid });
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
    let cookie = cookie();
    let code = blob::patched(len, cookie, blob::resume_words(&r0), r0.rip - 2);
    if let Err(e) = sys::write_code_bytes(&mem, cave.addr, &cave.original, &code) {
        let _ = ptrace::detach(tid, None);
        return Err(InjectError::Failed(format!(
            "cannot write the injection into pid {pid}'s code at {:#x}: {e}",
            cave.addr
        )));
    }
    // Skip the wait (the blob makes it again at its end) and go to the blob.
    let mut go = r0;
    go.orig_rax = u64::MAX;
    go.rax = 0;
    go.rip = cave.addr;
    ptrace::set_regs(tid, go).map_err(|e| InjectError::from_ptrace(pid, e))?;
    // The blob's first call is its mmap: its exit gives the page's address. (Stops on the
    // way: the skipped wait's exit, the mmap's entry.)
    let mut page = 0u64;
    for _ in 0..4 {
        if ptrace::to_syscall(tid, None).is_err() || wait_syscall(tid) != Some(Stop::Syscall) {
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
    })
}

/// The next stop of a thread sent on with PTRACE_SYSCALL (signals handed on), within 1 s.
fn wait_syscall(tid: u32) -> Option<Stop> {
    let start = Instant::now();
    loop {
        match ptrace::wait_stop(tid, Duration::from_millis(1000)) {
            Some(Stop::Signal(sig)) if start.elapsed() < Duration::from_secs(1) => {
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
