//! Every thread of a process stopped at once, for as short a time as a step needs: the
//! snapshots of `blocked` and the patching of `commit`. Dropping it lets them all go.
//!
//! A thread that does not stop within the bound (uninterruptible sleep in a driver ioctl)
//! fails the step: the ones stopped so far are let go at once.

use std::time::Duration;

use nix::sys::signal::Signal;

use super::{error::InjectError, ptrace};

pub struct Stopped {
    /// (tid, a signal it stopped for, to be handed on).
    pub threads: Vec<(u32, Option<Signal>)>,
}

fn tasks(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

impl Stopped {
    /// Seizes and stops every thread of `pid`, picking up threads started meanwhile until
    /// none are; each may take `per_thread` to stop.
    pub fn all(pid: u32, per_thread: Duration) -> Result<Self, InjectError> {
        let mut s = Stopped {
            threads: Vec::new(),
        };
        for _round in 0..16 {
            let new: Vec<u32> = tasks(pid)
                .into_iter()
                .filter(|t| !s.threads.iter().any(|(x, _)| x == t))
                .collect();
            if new.is_empty() {
                if s.threads.is_empty() {
                    return Err(InjectError::TargetExited { pid });
                }
                return Ok(s);
            }
            for tid in new {
                match ptrace::seize(tid) {
                    Ok(()) => {}
                    // Exited since it was listed.
                    Err(nix::errno::Errno::ESRCH) => continue,
                    Err(e) => return Err(InjectError::from_ptrace(pid, e)),
                }
                match ptrace::stop(tid, per_thread) {
                    Ok(sig) => s.threads.push((tid, sig)),
                    Err(ptrace::Stop::Exited) => {}
                    Err(_) => {
                        ptrace::release(tid);
                        return Err(InjectError::Failed(format!(
                            "thread {tid} of pid {pid} did not stop within {} ms (in an \
                             uninterruptible wait?); nothing was changed",
                            per_thread.as_millis()
                        )));
                    }
                }
            }
        }
        Err(InjectError::Failed(format!(
            "pid {pid} kept starting threads while being stopped"
        )))
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for &(tid, sig) in &self.threads {
            let _ = ptrace::detach(tid, sig);
        }
    }
}
