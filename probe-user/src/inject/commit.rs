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

/// Bytes of a jump (`E9 rel32`).
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

/// The byte ranges the words change, as (first changed byte, last changed byte), words of one
/// jump merged: a jump crossing an aligned word comes as two words, and a changed run never
/// holds more than one jump's 5 bytes apart. A thread whose instruction pointer is after the
/// first byte and not past the last would run the middle of a jump.
fn changed_spans(words: &[PatchWord]) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = words
        .iter()
        .filter(|w| w.old != w.new)
        .map(|w| {
            let diff = w.old ^ w.new;
            let lo = u64::from(diff.trailing_zeros() / 8);
            let hi = 7 - u64::from(diff.leading_zeros() / 8);
            (w.addr + lo, w.addr + hi)
        })
        .collect();
    spans.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
    for (lo, hi) in spans {
        match merged.last_mut() {
            // Within one jump's length: the same jump (bytes equal before and after in its
            // middle are possible, a rel32 byte that happens to match).
            Some(last) if lo < last.0 + JMP_LEN => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
}

/// Whether `rip` stands inside a jump about to be written (its first byte is fine: the
/// thread then runs the whole jump).
fn mid_jump(spans: &[(u64, u64)], rip: u64) -> bool {
    spans.iter().any(|&(lo, hi)| rip > lo && rip <= hi)
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
    let spans = changed_spans(words);
    for attempt in 0..TRIES {
        let stopped = Stopped::all(pid, Duration::from_millis(300))?;
        let cave_end = cave.addr + cave.original.len() as u64;
        let mid_prologue = stopped.threads.iter().find_map(|&(tid, _)| {
            let rip = ptrace::regs(tid).ok()?.rip;
            let in_prologue = mid_jump(&spans, rip);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn word(addr: u64, old: [u8; 8], new: [u8; 8]) -> PatchWord {
        PatchWord {
            addr,
            old: u64::from_le_bytes(old),
            new: u64::from_le_bytes(new),
        }
    }

    #[test]
    fn a_jump_across_two_words_is_one_span() {
        // endbr64 kept; the jump at +4 runs into the next word (bytes +4..+8).
        let a = word(
            0x1000,
            [0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5],
            [0xf3, 0x0f, 0x1e, 0xfa, 0xe9, 1, 2, 3],
        );
        let b = word(
            0x1008,
            [0x41, 0x54, 0, 0, 0, 0, 0, 0],
            [4, 0x54, 0, 0, 0, 0, 0, 0],
        );
        let spans = changed_spans(&[b, a]);
        assert_eq!(spans, vec![(0x1004, 0x1008)]);
        // A thread at +6 (the old `mov rbp,rsp`) or +8 (`push r12`) would run half a jump;
        // one at +4 runs the jump, one at +9 is past it.
        assert!(mid_jump(&spans, 0x1006) && mid_jump(&spans, 0x1008));
        assert!(!mid_jump(&spans, 0x1004) && !mid_jump(&spans, 0x1009));
    }

    #[test]
    fn a_jump_byte_equal_to_the_old_one_stays_inside_its_span() {
        // push rbp kept; jump at +1 whose last rel32 byte equals the old byte there.
        let w = word(
            0x2000,
            [0x55, 0x48, 0x89, 0xe5, 0x41, 0x54, 0x48, 0x83],
            [0x55, 0xe9, 9, 9, 9, 0x54, 0x48, 0x83],
        );
        let spans = changed_spans(&[w]);
        assert_eq!(spans, vec![(0x2001, 0x2004)]);
        assert!(!mid_jump(&spans, 0x2001) && mid_jump(&spans, 0x2004));
        assert!(!mid_jump(&spans, 0x2006));
    }
}
