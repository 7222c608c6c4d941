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

/// Stops a seized thread: `Some(signal)` when it stopped for a signal first (to be handed on
/// when it goes on), `Err` when it did not stop within `timeout` or exited.
pub fn stop(tid: u32, timeout: Duration) -> Result<Option<Signal>, Stop> {
    interrupt(tid).map_err(|_| Stop::Exited)?;
    let mut pending = None;
    loop {
        match wait_stop(tid, timeout) {
            Some(Stop::Interrupt) | Some(Stop::Syscall) => return Ok(pending),
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
