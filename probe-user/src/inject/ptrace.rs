//! The few ptrace operations `wedgeprobe attach` needs, with a bound on every wait: the target
//! is someone's production server, and a thread that does not stop (uninterruptible sleep in a
//! driver ioctl) must not hold the rest of it stopped.
//!
//! Why it is safe to be killed at any point: the kernel detaches a dead tracer's tracees and
//! wakes those in a ptrace stop (`__ptrace_unlink`), so a thread we stopped runs on. What it
//! would run with is the point of `crate::inject::remote`'s order of steps.
//!
//! Threads are seized (`PTRACE_SEIZE`: nothing stops, no SIGSTOP is sent) and stopped with
//! `PTRACE_INTERRUPT` only for the milliseconds a step needs, then detached.

use std::time::{Duration, Instant};

use nix::{
    sys::{
        ptrace,
        signal::Signal,
        wait::{WaitPidFlag, WaitStatus, waitpid},
    },
    unistd::Pid,
};

pub use nix::libc::user_regs_struct as Regs;

/// How one thread stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// `PTRACE_INTERRUPT`'s stop (or a group stop).
    Interrupt,
    /// Entering or leaving a system call (`PTRACE_O_TRACESYSGOOD`).
    Syscall,
    /// A signal on its way to the thread: it must be delivered when the thread goes on.
    Signal(Signal),
    /// The thread exited.
    Exited,
}

fn pid(tid: u32) -> Pid {
    Pid::from_raw(tid as i32)
}

/// Seizes `tid` without stopping it; system-call stops are told apart from signals.
pub fn seize(tid: u32) -> nix::Result<()> {
    ptrace::seize(pid(tid), ptrace::Options::PTRACE_O_TRACESYSGOOD)
}

pub fn interrupt(tid: u32) -> nix::Result<()> {
    ptrace::interrupt(pid(tid))
}

/// Waits for `tid`'s next stop, up to `timeout` (polled: waitpid itself has no timeout).
pub fn wait_stop(tid: u32, timeout: Duration) -> Option<Stop> {
    let start = Instant::now();
    loop {
        match waitpid(pid(tid), Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(WaitStatus::PtraceEvent(_, _, _)) | Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) => {
                return Some(Stop::Interrupt);
            }
            Ok(WaitStatus::PtraceSyscall(_)) => return Some(Stop::Syscall),
            Ok(WaitStatus::Stopped(_, sig)) => return Some(Stop::Signal(sig)),
            Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..)) | Err(_) => {
                return Some(Stop::Exited);
            }
            Ok(_) => {}
        }
        if start.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The calls the kernel ends with `EINTR` when their thread is stopped (signal(7),
/// "Interruption of system calls and library functions by stop signals"), instead of making
/// them again: `epoll_wait`, `epoll_pwait`, `epoll_pwait2`, `semop`, `semtimedop`,
/// `rt_sigtimedwait`, and socket calls with a send or receive timeout (`read`, `write`,
/// `recvfrom`, `sendto`, `recvmsg`, `sendmsg`, `accept`, `accept4`, `connect`).
const EINTR_ON_STOP: [u64; 15] = [
    232, 281, 441, 65, 220, 128, 0, 1, 45, 44, 47, 46, 43, 288, 42,
];
const EINTR: i64 = 4;
const ERESTARTNOHAND: i64 = 514;

/// At a stop of ours inside one of `EINTR_ON_STOP` that our stop ended with `EINTR`: has the
/// kernel make the call again when the thread goes on, as it does for every other call, so the
/// program never sees an `EINTR` it did not cause (measured: an attach's stops ended a
/// `epoll_wait` with no timeout twice, on the simulated driver's guard thread). Where a signal
/// handler runs first the kernel returns `EINTR` all the same, as without us. A call with a
/// timeout waits it anew.
fn no_eintr(tid: u32) {
    let Ok(mut r) = regs(tid) else { return };
    if EINTR_ON_STOP.contains(&r.orig_rax) && r.rax as i64 == -EINTR {
        r.rax = (-ERESTARTNOHAND) as u64;
        let _ = set_regs(tid, r);
    }
}

/// Stops a seized thread: `Some(signal)` when it stopped for a signal first (to be handed on
/// when it goes on), `Err` when it did not stop within `timeout` or exited. A call our stop
/// ended with `EINTR` is made again when it goes on (`no_eintr`).
pub fn stop(tid: u32, timeout: Duration) -> Result<Option<Signal>, Stop> {
    interrupt(tid).map_err(|_| Stop::Exited)?;
    let mut pending = None;
    loop {
        match wait_stop(tid, timeout) {
            Some(Stop::Interrupt) => {
                no_eintr(tid);
                return Ok(pending);
            }
            Some(Stop::Syscall) => return Ok(pending),
            Some(Stop::Signal(sig)) => {
                // Held until the thread goes on; the interrupt's own stop follows.
                pending = Some(sig);
                let _ = ptrace::cont(pid(tid), None);
            }
            Some(Stop::Exited) => return Err(Stop::Exited),
            None => return Err(Stop::Interrupt),
        }
    }
}

pub fn regs(tid: u32) -> nix::Result<Regs> {
    ptrace::getregs(pid(tid))
}

pub fn set_regs(tid: u32, regs: Regs) -> nix::Result<()> {
    ptrace::setregs(pid(tid), regs)
}

/// Resumes to the next system-call entry or exit, handing `sig` on.
pub fn to_syscall(tid: u32, sig: Option<Signal>) -> nix::Result<()> {
    ptrace::syscall(pid(tid), sig)
}

/// Lets the thread go, handing `sig` on. The thread must be stopped.
pub fn detach(tid: u32, sig: Option<Signal>) -> nix::Result<()> {
    ptrace::detach(pid(tid), sig)
}

/// Detaches a seized thread whatever it is doing: at once if it is in a ptrace stop, else it is
/// stopped first (PTRACE_DETACH needs a stopped tracee) and a signal it stopped for is handed
/// on.
pub fn release(tid: u32) {
    if detach(tid, None).is_ok() {
        return;
    }
    if let Ok(sig) = stop(tid, Duration::from_millis(500)) {
        let _ = detach(tid, sig);
    }
}
