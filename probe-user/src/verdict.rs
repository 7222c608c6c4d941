//! From the threads inside driver calls to one verdict a person on call can act on.
//!
//! eBPF alone sees the host side only: time inside the driver is the primary signal (a launch
//! behind a full queue and a synchronize behind a stuck kernel both sit in the driver at 100%
//! CPU; only the launch yields — notes/gpu-machine.md). Naming the stuck kernel needs the
//! CUPTI shim; this module says what can be said without it.

use probe_common::api::{self, ApiClass};
use serde::Serialize;

use crate::model::ThreadView;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// No thread is inside a driver call past the bound.
    Healthy,
    /// A launch has been blocked past the bound: the driver's launch queue is full, so the
    /// GPU stopped completing work — a wedged kernel is the usual cause.
    LaunchQueueFull,
    /// A synchronize has waited past the bound, no launch is blocked: a kernel runs long or is
    /// wedged (a 3 s kernel looks the same from the host).
    BlockedInSync,
    /// A blocking copy has waited past the bound.
    BlockedInCopy,
    /// A thread found (by stack scan) inside libcuda past the bound, entry point unknown.
    BlockedInDriver,
    /// Every target exited.
    TargetExited,
}

#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub kind: VerdictKind,
    pub summary: String,
}

impl VerdictKind {
    /// The JSON spelling, for text output too.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::LaunchQueueFull => "launch_queue_full",
            Self::BlockedInSync => "blocked_in_sync",
            Self::BlockedInCopy => "blocked_in_copy",
            Self::BlockedInDriver => "blocked_in_driver",
            Self::TargetExited => "target_exited",
        }
    }
}

pub fn decide(threads: &[ThreadView], blocked_after_ms: f64, any_alive: bool) -> Verdict {
    if !any_alive {
        return Verdict {
            kind: VerdictKind::TargetExited,
            summary: "every target exited".into(),
        };
    }
    let blocked: Vec<&ThreadView> = threads.iter().filter(|t| t.blocked).collect();
    let of = |class| {
        blocked
            .iter()
            .copied()
            .filter(move |t| api::id_of(t.api).and_then(api::class) == Some(class))
    };
    let describe = |t: &ThreadView| {
        let mut s = format!(
            "tid {} ({}) in {} for {}{}",
            t.tid,
            t.name,
            t.api,
            if t.in_call_at_least { "≥ " } else { "" },
            fmt_duration(t.in_call_ms)
        );
        if let Some(stream) = &t.stream {
            s.push_str(&format!(" on stream {stream}"));
        }
        if t.sched_yield_per_s >= 1.0 {
            s.push_str(&format!(", {:.0} sched_yield/s", t.sched_yield_per_s));
        }
        s
    };
    let list = |ts: Vec<&ThreadView>| ts.into_iter().map(describe).collect::<Vec<_>>().join("; ");
    let launches: Vec<_> = of(ApiClass::Launch).collect();
    let syncs: Vec<_> = of(ApiClass::Sync).collect();
    let copies: Vec<_> = of(ApiClass::Copy).collect();
    let unknown: Vec<_> = blocked
        .iter()
        .copied()
        .filter(|t| api::id_of(t.api).and_then(api::class).is_none())
        .collect();
    let others = |listed: &[&ThreadView]| {
        let rest: Vec<_> = blocked
            .iter()
            .copied()
            .filter(|t| !listed.iter().any(|l| (l.pid, l.tid) == (t.pid, t.tid)))
            .collect();
        if rest.is_empty() {
            String::new()
        } else {
            format!(" Also blocked: {}.", list(rest))
        }
    };
    if !launches.is_empty() {
        return Verdict {
            kind: VerdictKind::LaunchQueueFull,
            summary: format!(
                "GPU not completing work: launch blocked (driver launch queue full): {}.{} A kernel \
                 ahead in the queue is likely wedged; eBPF-only mode cannot name it.",
                list(launches.clone()),
                others(&launches)
            ),
        };
    }
    if !syncs.is_empty() {
        return Verdict {
            kind: VerdictKind::BlockedInSync,
            summary: format!(
                "GPU work not completing: {}.{} A kernel is running long or is wedged.",
                list(syncs.clone()),
                others(&syncs)
            ),
        };
    }
    if !unknown.is_empty() {
        return Verdict {
            kind: VerdictKind::BlockedInDriver,
            summary: format!(
                "threads stuck inside the CUDA driver: {}.{} GPU work is likely not completing.",
                list(unknown.clone()),
                others(&unknown)
            ),
        };
    }
    if !copies.is_empty() {
        return Verdict {
            kind: VerdictKind::BlockedInCopy,
            summary: format!("blocking copy not completing: {}.", list(copies)),
        };
    }
    Verdict {
        kind: VerdictKind::Healthy,
        summary: format!(
            "no thread inside a CUDA driver call for longer than {}",
            fmt_duration(blocked_after_ms)
        ),
    }
}

pub fn fmt_duration(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        format!("{ms:.0} ms")
    }
}

/// With a shim journal, says which kernel the blocked threads wait behind: the longest-running
/// unfinished kernel of a process that has blocked threads. (Deciding that a kernel itself is
/// wedged — adaptive bounds from its duration history — is issue 3's kernel verdict.)
pub fn name_the_kernel(
    verdict: &mut Verdict,
    threads: &[ThreadView],
    kernels: &[crate::kernels::StreamHead],
) {
    if matches!(
        verdict.kind,
        VerdictKind::Healthy | VerdictKind::TargetExited
    ) {
        return;
    }
    let Some(k) = kernels
        .iter()
        .find(|k| threads.iter().any(|t| t.blocked && t.pid == k.pid))
    else {
        return;
    };
    verdict.summary = verdict
        .summary
        .replace("; eBPF-only mode cannot name it.", ".");
    verdict.summary.push_str(&format!(
        " Oldest unfinished kernel: {} on device {} stream {} (grid {}x{}x{}, block {}x{}x{}), running ~{} with {} launches queued behind it.",
        k.kernel,
        k.device,
        k.stream,
        k.grid[0], k.grid[1], k.grid[2], k.block[0], k.block[1], k.block[2],
        fmt_duration(k.running_ms),
        k.queued_behind
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(api: &'static str, ms: f64, bound: f64) -> ThreadView {
        ThreadView {
            pid: 1,
            tid: ms as u32,
            name: "w".into(),
            api,
            in_call_ms: ms,
            in_call_at_least: false,
            blocked: ms >= bound,
            sched_yield_per_s: 0.0,
            stream: Some("0x0".into()),
            handle: None,
            kernel: None,
            grid: None,
            block: None,
            seen_by: "uprobe",
        }
    }

    #[test]
    fn blocked_launch_wins_over_sync() {
        let v = decide(
            &[
                thread("cuStreamSynchronize", 5000.0, 1000.0),
                thread("cuLaunchKernel", 4000.0, 1000.0),
            ],
            1000.0,
            true,
        );
        assert_eq!(v.kind, VerdictKind::LaunchQueueFull);
        assert!(v.summary.contains("cuLaunchKernel") && v.summary.contains("cuStreamSynchronize"));
    }

    #[test]
    fn short_calls_are_healthy() {
        let v = decide(&[thread("cuStreamSynchronize", 3.0, 1000.0)], 1000.0, true);
        assert_eq!(v.kind, VerdictKind::Healthy);
        assert_eq!(decide(&[], 1000.0, false).kind, VerdictKind::TargetExited);
    }

    #[test]
    fn sync_alone() {
        let v = decide(&[thread("cuCtxSynchronize", 1500.0, 1000.0)], 1000.0, true);
        assert_eq!(v.kind, VerdictKind::BlockedInSync);
    }
}
