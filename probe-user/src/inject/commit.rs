//! Turning the injected shim's hooks on: the code words its attach call listed are written
//! into libcuda with every thread of the process stopped, and only where no thread stands
//! inside the bytes a jump overwrites (one stopped after `push rbp; mov rbp,rsp`, about to
//! run `push r12`, would run the middle of the jump instead). A few milliseconds of stop.
//!
//! Every word is checked first: inside libcuda's executable mappings, 8-aligned, and holding
//! what the shim saw (`old`) — libcuda's code changed since means another tool is patching it,
//! and nothing is written. Killed half-way, the shim's flush thread finds its hooks partly
//! in place at its deadline, takes them back and turns itself off.

use std::{os::unix::fs::OpenOptionsExt as _, time::Duration};

use probe_common::attach::PatchWord;

use super::{cave::Cave, error::InjectError, ptrace, stopped::Stopped};
use crate::{process::target::Target, sys};

/// Bytes of a jump (`E9 rel32`): a thread's instruction pointer strictly inside
/// `(at, at + JMP_LEN)` of a patched word's jump is mid-prologue.
const JMP_LEN: u64 = 5;
/// Tries before giving up when a thread keeps standing in a prologue.
const TRIES: usize = 20;

/// Checks that every word lies in libcuda's code; returns them.
pub fn validate(target: &Target, words: &[PatchWord]) -> Result<(), InjectError> {
    for w in words {
        let in_code = target
            .libcuda_maps
            .iter()
            .any(|m| m.executable && w.addr >= m.start && w.addr + 8 <= m.end);
        if !in_code || w.addr % 8 != 0 {
            return Err(InjectError::Failed(format!(
                "the shim asked to patch {:#x}, which is not an aligned word of libcuda's code",
                w.addr
            )));
        }
    }
    Ok(())
}

/// Where a word's jump begins: the first byte that differs between `old` and `new`.
fn jump_at(w: &PatchWord) -> u64 {
    let diff = w.old ^ w.new;
    w.addr + u64::from(diff.trailing_zeros() / 8)
}

/// Writes every word with the process stopped, and puts the cave's bytes back (the blob is
/// done with it: no thread may be inside it either). Returns how many words.
pub fn write_all(pid: u32, words: &[PatchWord], cave: &Cave) -> Result<usize, InjectError> {
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(format!("/proc/{pid}/mem"))
        .map_err(|e| InjectError::Failed(format!("cannot open /proc/{pid}/mem: {e}")))?;
    for attempt in 0..TRIES {
        let stopped = Stopped::all(pid, Duration::from_millis(300))?;
        let cave_end = cave.addr + cave.original.len() as u64;
        let mid_prologue = stopped.threads.iter().find_map(|&(tid, _)| {
            let rip = ptrace::regs(tid).ok()?.rip;
            let in_prologue = words.iter().any(|w| {
                let at = jump_at(w);
                rip > at && rip < at + JMP_LEN
            });
            // The thread that ran the blob, on its last instructions.
            let in_cave = (cave.addr..cave_end).contains(&rip);
            (in_prologue || in_cave).then_some(tid)
        });
        if mid_prologue.is_some() && attempt + 1 < TRIES {
            drop(stopped);
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        if let Some(tid) = mid_prologue {
            return Err(InjectError::Failed(format!(
                "thread {tid} kept standing inside a launch entry point's first instructions; \
                 nothing was patched"
            )));
        }
        let mut written = Vec::with_capacity(words.len());
        for w in words {
            match sys::write_code_word(&mem, w.addr, w.old, w.new) {
                Ok(true) => written.push(w),
                outcome => {
                    // Put back what was written: the process is still stopped.
                    for done in written {
                        let _ = sys::write_code_word(&mem, done.addr, done.new, done.old);
                    }
                    return Err(InjectError::Failed(match outcome {
                        Ok(_) => format!(
                            "libcuda's code at {:#x} changed while attaching (another tool \
                             patching it, or a uprobe?); nothing was patched",
                            w.addr
                        ),
                        Err(e) => format!("cannot write libcuda's code at {:#x}: {e}", w.addr),
                    }));
                }
            }
        }
        // The cave's own bytes back (best effort: they are never run either way).
        use std::os::unix::fs::FileExt as _;
        let _ = mem.write_all_at(&cave.original, cave.addr);
        return Ok(written.len());
    }
    Err(InjectError::Failed(
        "threads kept standing inside launch entry points' first instructions; nothing was \
         patched"
            .into(),
    ))
}
