//! Is a thread of the target stuck inside a driver call? Then `attach` refuses: recording
//! cannot start behind a stuck (or very busy) GPU — the kernel it waits for was launched
//! before the shim and could not be named — and `report` is the command for that process.
//!
//! How: up to eight snapshots of every thread, 200 ms apart, the process stopped for each
//! (about a millisecond), ending early once no thread is still in the same call (a
//! launch-bound loop: after the second): registers and the top of the stack, scanned as
//! `report` scans them (`process::stackscan`). A thread is stuck when every snapshot finds it
//! inside the same launch, synchronize or copy *with its caller's frames unchanged* — the
//! bytes from just below the entry point's frame up — which a thread that returns and calls
//! again (a launch-bound loop, inside the driver most of the time) does not show: its loop
//! state, saved in those frames by the entry point's prologue, moves.

use std::{collections::HashMap, time::Duration};

use probe_common::api::{self, ApiClass};

use super::{error::InjectError, ptrace, stopped::Stopped};
use crate::{
    process::{
        code::TargetCode,
        stackscan::{self, Found},
    },
    sys,
};

/// Bytes of a thread's stack read per snapshot (what `report`'s samples take).
const STACK_BYTES: usize = 8192;
/// The window compared across snapshots: from a little below the return address that names
/// the entry point (its saved registers) to a couple of KiB above (the callers' frames).
const BELOW: usize = 128;
const ABOVE: usize = 2048;

/// A thread found stuck: its id, name and the call.
#[derive(Clone, Debug, PartialEq)]
pub struct Stuck {
    pub tid: u32,
    pub name: String,
    pub api: &'static str,
    pub seconds: f64,
}

/// `rounds` snapshots `interval` apart; the first thread inside the same wait in all of them,
/// with its callers' frames unchanged.
pub fn stuck_thread(
    pid: u32,
    code: &TargetCode,
    rounds: usize,
    interval: Duration,
) -> Result<Option<Stuck>, InjectError> {
    let mut seen: HashMap<u32, (u32, u64, usize)> = HashMap::new();
    for round in 0..rounds {
        if round > 0 {
            std::thread::sleep(interval);
        }
        let mut now: HashMap<u32, (u32, u64)> = HashMap::new();
        {
            let stopped = Stopped::all(pid, Duration::from_millis(300))?;
            for &(tid, _) in &stopped.threads {
                let Ok(r) = ptrace::regs(tid) else { continue };
                let mut stack = vec![0u8; STACK_BYTES];
                let n = sys::read_process_memory(pid, r.rsp, &mut stack).unwrap_or(0);
                let stack = &stack[..n];
                if let Some((Found::EntryPoint(id), off)) =
                    stackscan::entry_point_and_frame(r.rip, stack, code)
                    && matches!(
                        api::class(id),
                        Some(ApiClass::Launch | ApiClass::Sync | ApiClass::Copy)
                    )
                {
                    let from = off.saturating_sub(BELOW);
                    let to = (off + ABOVE).min(stack.len());
                    now.insert(tid, (id, fnv(&stack[from..to])));
                }
            }
        }
        if round == 0 {
            seen = now
                .into_iter()
                .map(|(t, (id, h))| (t, (id, h, 1)))
                .collect();
        } else {
            seen.retain(|t, (id, h, n)| {
                let same = now.get(t) == Some(&(*id, *h));
                *n += usize::from(same);
                same
            });
        }
        if seen.is_empty() {
            return Ok(None);
        }
    }
    let Some((&tid, &(id, _, _))) = seen.iter().min_by_key(|(t, _)| **t) else {
        return Ok(None);
    };
    let name = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    Ok(Some(Stuck {
        tid,
        name,
        api: api::name(id),
        seconds: interval.as_secs_f64() * (rounds.saturating_sub(1)) as f64,
    }))
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
