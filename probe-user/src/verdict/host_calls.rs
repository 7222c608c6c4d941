//! From the threads inside driver calls to one verdict a person on call can act on.
//!
//! eBPF alone sees the host side only: time inside the driver is the primary signal (a launch
//! behind a full queue and a synchronize behind a stuck kernel both sit in the driver at 100%
//! CPU; only the launch yields — docs/measured-facts.md).
//! Naming the stuck kernel needs the shim; this module says what can be said without it, and
//! `verdict::kernel` refines it with the journal's kernels.

use probe_common::api::{self, ApiClass};
use serde::Serialize;

use crate::{model::ThreadView, verdict::describe::fmt_duration};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
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
    /// No GPU work and no kernel in flight for a while, threads spinning on the host.
    HostStall,
    /// Every target exited.
    TargetExited,
    /// (Shim journal) a non-collective kernel is stuck: past its bounds, with host threads
    /// blocked behind it or past the hard bound.
    KernelWedge,
    /// (Shim journal) the stuck kernel is a collective: it waits for a peer rank.
    CollectiveWait,
    /// (Shim journal) threads wait behind a kernel that is still within its bounds, or
    /// behind work the journal shows completing.
    Busy,
    /// (No journal) threads blocked in a launch, synchronize or copy for less than the
    /// no-journal bound: whether the GPU completes work is not seen, and healthy serving
    /// waits seconds (a long kernel, a queue draining). An incident past the bound.
    Waiting,
}

#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub kind: VerdictKind,
    pub summary: String,
}

impl VerdictKind {
    /// Whether the verdict is an incident worth a flight-recorder dump (and an alert): all
    /// but healthy, busy (within bounds) and every target gone.
    pub fn is_incident(self) -> bool {
        !matches!(
            self,
            Self::Healthy | Self::Busy | Self::Waiting | Self::TargetExited
        )
    }

    /// The JSON spelling, for text output too.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::LaunchQueueFull => "launch_queue_full",
            Self::BlockedInSync => "blocked_in_sync",
            Self::BlockedInCopy => "blocked_in_copy",
            Self::BlockedInDriver => "blocked_in_driver",
            Self::HostStall => "host_stall",
            Self::TargetExited => "target_exited",
            Self::KernelWedge => "kernel_wedge",
            Self::CollectiveWait => "collective_wait",
            Self::Busy => "busy",
            Self::Waiting => "waiting",
        }
    }
}

/// See the `unknown` filter in `decide`.
const UNKNOWN_CALL_BOUND_MS: f64 = 10_000.0;
/// CUDA's initialisation (`cuInit`, the primary context) took 10–17 s in PyTorch on the H200
/// VM (2026-12-01); past two minutes it is a hang worth a verdict (a GPU that does not come up).
const INIT_CALL_BOUND_MS: f64 = 120_000.0;

/// One thread in a call, as verdicts list it: tid, name, entry point, time in it (`≥` where it
/// began before attach), its stream and sched_yield rate where known.
pub fn describe_thread(t: &ThreadView) -> String {
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
}

/// `kernels_visible`: a shim journal is read, so `apply_kernels` will name the kernel; in
/// eBPF-only mode the summary says it cannot.
pub fn decide(
    threads: &[ThreadView],
    blocked_after_ms: f64,
    any_alive: bool,
    kernels_visible: bool,
) -> Verdict {
    if !any_alive {
        return Verdict {
            kind: VerdictKind::TargetExited,
            summary: "every target exited".into(),
        };
    }
    let blocked: Vec<&ThreadView> = threads.iter().filter(|t| t.blocked).collect();
    let class = |t: &ThreadView| api::class(t.api_id);
    let list = |ts: &[&ThreadView]| {
        ts.iter()
            .map(|t| describe_thread(t))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let of = |c: Option<ApiClass>| -> Vec<&ThreadView> {
        blocked.iter().copied().filter(|t| class(t) == c).collect()
    };
    // Inside libcuda but not in a traced entry point (module loading, JIT, initialisation can
    // take seconds — seen on the H200 while Triton loaded a kernel): a verdict only when it
    // lasts UNKNOWN_CALL_BOUND_MS.
    let unknown: Vec<&ThreadView> = of(None)
        .into_iter()
        .filter(|t| t.in_call_ms >= UNKNOWN_CALL_BOUND_MS.max(blocked_after_ms))
        .collect();
    let init: Vec<&ThreadView> = of(Some(ApiClass::Init))
        .into_iter()
        .filter(|t| t.in_call_ms >= INIT_CALL_BOUND_MS.max(blocked_after_ms))
        .collect();
    let launch_tail = if kernels_visible {
        "A kernel ahead in the queue is likely wedged."
    } else {
        "A kernel ahead in the queue is likely wedged; eBPF-only mode cannot name it."
    };
    // A launch that waits for room in a full queue spins in sched_yield (~72k/s on the H200);
    // one that waits without yielding (a lazy module load, a driver lock behind the GPU) is
    // said to be what was measured, not a full queue.
    let launches = of(Some(ApiClass::Launch));
    let launch_opening = if launches.iter().any(|t| t.sched_yield_per_s >= 1000.0) {
        "GPU not completing work: launch blocked (driver launch queue full): "
    } else if launches.iter().any(|t| !t.sched_yield_measured) {
        "GPU not completing work: launch blocked (its sched_yield rate, which tells a full queue, is not measured yet): "
    } else {
        "GPU not completing work: launch blocked with no sched_yield seen (not the full-queue spin, which yields ~72k/s on the H200: a lazy module load or a driver lock waiting behind the GPU): "
    };
    // In order of strength: (threads, kind, opening, closing, list the other blocked threads).
    let groups = [
        (
            launches,
            VerdictKind::LaunchQueueFull,
            launch_opening,
            launch_tail,
            true,
        ),
        (
            of(Some(ApiClass::Sync)),
            VerdictKind::BlockedInSync,
            "GPU work not completing: ",
            "A kernel is running long or is wedged.",
            true,
        ),
        (
            unknown,
            VerdictKind::BlockedInDriver,
            "threads stuck inside the CUDA driver: ",
            "GPU work is likely not completing.",
            true,
        ),
        (
            init,
            VerdictKind::BlockedInDriver,
            "CUDA initialisation not completing: ",
            "The GPU or its driver is not coming up.",
            true,
        ),
        (
            of(Some(ApiClass::Copy)),
            VerdictKind::BlockedInCopy,
            "blocking copy not completing: ",
            "",
            false,
        ),
    ];
    for (group, kind, opening, closing, with_others) in groups {
        if group.is_empty() {
            continue;
        }
        let rest: Vec<&ThreadView> = blocked
            .iter()
            .copied()
            .filter(|t| !group.iter().any(|g| (g.pid, g.tid) == (t.pid, t.tid)))
            .collect();
        let others = if with_others && !rest.is_empty() {
            format!(" Also blocked: {}.", list(&rest))
        } else {
            String::new()
        };
        let closing = if closing.is_empty() {
            String::new()
        } else {
            format!(" {closing}")
        };
        return Verdict {
            kind,
            summary: format!("{opening}{}.{others}{closing}", list(&group)),
        };
    }
    // Blocked threads that are left are inside libcuda at an entry point not traced, or
    // initialising CUDA, under their bounds: the table lists them as blocked, so the summary
    // must not say "no thread" (a table with a BLOCKED row under "no thread inside a
    // CUDA driver call").
    let initialising = of(Some(ApiClass::Init));
    let summary = if blocked.is_empty() {
        format!(
            "no thread inside a CUDA driver call for longer than {}",
            fmt_duration(blocked_after_ms)
        )
    } else if initialising.len() == blocked.len() {
        format!(
            "initialising CUDA, under the {} bound for it: {}",
            fmt_duration(INIT_CALL_BOUND_MS.max(blocked_after_ms)),
            list(&initialising)
        )
    } else {
        format!(
            "no thread blocked in a traced CUDA call for longer than {}; inside libcuda at an \
             entry point not traced, under the {} bound for module loads and JIT: {}",
            fmt_duration(blocked_after_ms),
            fmt_duration(UNKNOWN_CALL_BOUND_MS.max(blocked_after_ms)),
            list(&blocked)
        )
    };
    Verdict {
        kind: VerdictKind::Healthy,
        summary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(api: &'static str, ms: f64, bound: f64) -> ThreadView {
        ThreadView::for_test(api, ms, bound)
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
            false,
        );
        assert_eq!(v.kind, VerdictKind::LaunchQueueFull);
        assert!(v.summary.contains("cuLaunchKernel") && v.summary.contains("cuStreamSynchronize"));
    }

    /// A thread inside libcuda at an entry point not traced, past the blocked bound but under
    /// the module-load bound, is listed blocked in the table: the healthy summary names it
    /// rather than saying "no thread inside a CUDA driver call" .
    #[test]
    fn a_healthy_summary_never_contradicts_a_blocked_row() {
        let v = decide(
            &[thread(
                crate::model::UNKNOWN_ENTRY_POINT_NAME,
                2500.0,
                1000.0,
            )],
            1000.0,
            true,
            true,
        );
        assert_eq!(v.kind, VerdictKind::Healthy);
        assert!(!v.summary.starts_with("no thread inside"), "{}", v.summary);
        assert!(
            v.summary.contains("tid 2500") && v.summary.contains("entry point not traced"),
            "{}",
            v.summary
        );
        let idle = decide(&[], 1000.0, true, true);
        assert!(
            idle.summary.starts_with("no thread inside"),
            "{}",
            idle.summary
        );
    }

    /// CUDA's initialisation takes seconds (10–17 s in PyTorch on the H200 VM): a thread in
    /// `cuInit` that long is named and healthy; only past the initialisation bound is it a
    /// verdict (the daemon called it "blocked in the driver" at 10 s, 2026-12-01).
    #[test]
    fn initialising_cuda_for_seconds_is_healthy_and_named() {
        let v = decide(&[thread("cuInit", 17_000.0, 1000.0)], 1000.0, true, false);
        assert_eq!(v.kind, VerdictKind::Healthy, "{}", v.summary);
        assert!(v.summary.starts_with("initialising CUDA"), "{}", v.summary);
        assert!(v.summary.contains("cuInit"), "{}", v.summary);
        let hung = decide(
            &[thread("cuDevicePrimaryCtxRetain", 130_000.0, 1000.0)],
            1000.0,
            true,
            false,
        );
        assert_eq!(hung.kind, VerdictKind::BlockedInDriver, "{}", hung.summary);
        assert!(hung.summary.contains("initialisation"), "{}", hung.summary);
    }

    /// A launch found by scan or journal whose yields have not been counted for long enough
    /// is said to be unmeasured — not "no sched_yield seen" (a watch's first tick said that
    /// of a launch spinning in a full queue).
    #[test]
    fn a_launch_whose_yield_rate_is_not_measured_yet_is_not_judged_by_it() {
        let mut t = thread("cuLaunchKernel", 4000.0, 1000.0);
        t.sched_yield_measured = false;
        let v = decide(&[t], 1000.0, true, true);
        assert_eq!(v.kind, VerdictKind::LaunchQueueFull);
        assert!(v.summary.contains("not measured yet"), "{}", v.summary);
        assert!(!v.summary.contains("no sched_yield seen"), "{}", v.summary);
    }

    /// A launch blocked while yielding is the full queue; one blocked without a yield (a lazy
    /// module load behind a stuck kernel on the H200) is said to be what was measured.
    #[test]
    fn a_launch_blocked_without_yields_is_not_called_a_full_queue() {
        let quiet = decide(
            &[thread("cuLaunchKernel", 4000.0, 1000.0)],
            1000.0,
            true,
            false,
        );
        assert_eq!(quiet.kind, VerdictKind::LaunchQueueFull);
        assert!(
            !quiet.summary.contains("launch queue full"),
            "{}",
            quiet.summary
        );
        assert!(
            quiet.summary.contains("no sched_yield seen"),
            "{}",
            quiet.summary
        );
        let mut spinning = thread("cuLaunchKernel", 4000.0, 1000.0);
        spinning.sched_yield_per_s = 72_000.0;
        let full = decide(&[spinning], 1000.0, true, false);
        assert!(
            full.summary.contains("driver launch queue full"),
            "{}",
            full.summary
        );
    }

    #[test]
    fn short_calls_are_healthy() {
        let v = decide(
            &[thread("cuStreamSynchronize", 3.0, 1000.0)],
            1000.0,
            true,
            false,
        );
        assert_eq!(v.kind, VerdictKind::Healthy);
        assert_eq!(
            decide(&[], 1000.0, false, false).kind,
            VerdictKind::TargetExited
        );
    }

    #[test]
    fn a_few_seconds_inside_an_untraced_driver_call_is_not_a_verdict() {
        let mut t = thread("libcuda (entry point unknown)", 3000.0, 1000.0);
        assert_eq!(
            decide(&[t.clone()], 1000.0, true, false).kind,
            VerdictKind::Healthy
        );
        t.in_call_ms = 12_000.0;
        assert_eq!(
            decide(&[t], 1000.0, true, false).kind,
            VerdictKind::BlockedInDriver
        );
    }

    #[test]
    fn sync_alone() {
        let v = decide(
            &[thread("cuCtxSynchronize", 1500.0, 1000.0)],
            1000.0,
            true,
            false,
        );
        assert_eq!(v.kind, VerdictKind::BlockedInSync);
    }
}
