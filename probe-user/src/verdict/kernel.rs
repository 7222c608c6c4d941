//! With a shim journal: is the oldest unfinished kernel of a stream stuck, merely long, or a
//! collective waiting for a peer? (docs/architecture.md, "Verdicts".)
//!
//! A head kernel is *suspect* when it has run longer than a floor and than a multiple of its
//! own name's history (p99 of its completed runs, hdrhistogram). A suspect kernel is *stuck*
//! only with corroboration — host threads blocked in this process — or past a hard bound. A
//! kernel name with too little history is judged by the floor alone: the floor (default 5 s)
//! is what keeps a legitimately long first run (3 s) from being called a wedge.

use crate::{
    model::{
        ThreadView,
        history::History,
        kernels::{KernelJudgement, KernelState, StreamHead},
    },
    settings::KernelBounds,
    verdict::{
        describe::fmt_duration,
        host_calls::{Verdict, VerdictKind},
    },
};

/// Names of collective kernels (substrings): NCCL's (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`,
/// `ncclKernel_…`), vLLM's custom all-reduce (`cross_device_reduce_1stage/2stage`), SGLang's
/// (`custom_all_reduce`, `allreduce`), TensorRT-LLM's (`oneShotAllReduceKernel`,
/// `twoShotAllReduceKernel`, `allReduceFusionKernel`, Lamport variants) and FlashInfer's
/// (`trtllm_allreduce`, `all_reduce`). A stuck collective waits for a peer; the culprit is
/// elsewhere. More with `--collective PATTERN` / the daemon's `collectives` key.
const COLLECTIVE_PATTERNS: &[&str] = &[
    "ncclDevKernel_",
    "ncclKernel_",
    "cross_device_reduce",
    "custom_all_reduce",
    "allreduce",
    "AllReduce",
    "allReduce",
    "all_reduce",
    "AllGather",
    "all_gather",
    "ReduceScatter",
    "reduce_scatter",
    "twoshot",
    "oneshot",
    "twoShot",
    "oneShot",
    "lamport",
];

/// Whether `name` is a collective's: a built-in pattern, or one of `extra` (settings).
pub fn is_collective(name: &str, extra: &[String]) -> bool {
    COLLECTIVE_PATTERNS.iter().any(|p| name.contains(p))
        || extra.iter().any(|p| name.contains(p.as_str()))
}

pub fn judge(
    head: &StreamHead,
    history: &History,
    bounds: &KernelBounds,
    threads: &[ThreadView],
    collectives: &[String],
) -> KernelJudgement {
    // Candidates (marks mode) have no one name whose history could raise the bound.
    let bound_ms = head
        .exact
        .then(|| history.bound_ms(head.pid, &head.kernel, bounds.multiple))
        .flatten()
        .map_or(bounds.floor_ms, |b| b.max(bounds.floor_ms));
    // A build that never finds a kernel stuck (`--features wrong-kernel-verdict`, packed by
    // `cargo xtask gpu-pack --wrong-answer`): the GPU harness's scenarios must fail against
    // it, which shows they check the answer rather than pass whatever it is.
    let suspect = head.running_ms >= bound_ms && !cfg!(feature = "wrong-kernel-verdict");
    let corroborated = threads.iter().any(|t| t.blocked && t.pid == head.pid);
    let state = if suspect && (corroborated || head.running_ms >= bounds.hard_ms) {
        KernelState::Stuck
    } else if suspect {
        KernelState::Suspect
    } else {
        KernelState::Running
    };
    // Candidates: a collective wait only if every one of them is a collective.
    let names = head.names();
    KernelJudgement {
        state,
        bound_ms,
        collective: !names.is_empty() && names.iter().all(|n| is_collective(n, collectives)),
    }
}

/// The candidates of a head that is not exact, in one line: `[1] a (grid …), [2] b, …`.
pub fn list_candidates(head: &StreamHead) -> String {
    let mut out: Vec<String> = head
        .candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let name = c.kernel_demangled.as_deref().unwrap_or(&c.kernel);
            if c.graph_exec != 0 {
                format!("[{}] graph launch (exec {})", i + 1, c.graph_exec)
            } else {
                format!(
                    "[{}] {} (grid {}x{}x{}, block {}x{}x{})",
                    i + 1,
                    name,
                    c.grid[0],
                    c.grid[1],
                    c.grid[2],
                    c.block[0],
                    c.block[1],
                    c.block[2]
                )
            }
        })
        .collect();
    if head.candidates_total > head.candidates.len() {
        out.push(format!(
            "… {} more",
            head.candidates_total - head.candidates.len()
        ));
    }
    let mut line = out.join(", ");
    // A dense run of launches repeats a few kernels (a decode layer's): at 3 a.m. the
    // distinct ones, with how often each is listed, read faster than 16 lines.
    let mut distinct: Vec<(&str, usize)> = Vec::new();
    for c in &head.candidates {
        let name = if c.graph_exec != 0 {
            "graph launch"
        } else {
            c.kernel_demangled.as_deref().unwrap_or(&c.kernel)
        };
        match distinct.iter_mut().find(|(n, _)| *n == name) {
            Some((_, k)) => *k += 1,
            None => distinct.push((name, 1)),
        }
    }
    if distinct.len() > 1 && distinct.len() < head.candidates.len() {
        let parts: Vec<String> = distinct.iter().map(|(n, k)| format!("{n} ×{k}")).collect();
        line.push_str(&format!(" (listed: {})", parts.join(", ")));
    }
    line
}

/// A replay's position by its graph marks: the stuck (or running) node of each unfinished
/// branch, exactly or among its mark's group.
fn graph_marks_line(g: &crate::model::kernels::GraphProgress) -> String {
    let Some(m) = &g.marks else {
        return String::new();
    };
    let node = |n: &crate::model::kernels::GraphNodeView| {
        let name = n.kernel_demangled.as_deref().unwrap_or(&n.kernel);
        if n.grid == [0; 3] {
            format!("#{} {name}", n.position)
        } else {
            format!(
                "#{} {name} (grid {}x{}x{}, block {}x{}x{})",
                n.position, n.grid[0], n.grid[1], n.grid[2], n.block[0], n.block[1], n.block[2]
            )
        }
    };
    let branch = |b: &crate::model::kernels::BranchProgress| match b.candidates.as_slice() {
        [one] => format!("kernel node {} has not completed", node(one)),
        many => format!(
            "one of kernel nodes {} has not completed (the first, unless it finished since the last mark)",
            many.iter().map(node).collect::<Vec<_>>().join(", ")
        ),
    };
    let mut line = format!("graph launch (exec {}): ", g.exec_id);
    match m.branches.as_slice() {
        [] => line.push_str("its kernel nodes are done (a node after them runs)"),
        [b] => line.push_str(&branch(b)),
        bs => {
            let parts: Vec<String> = bs
                .iter()
                .map(|b| format!("branch {}: {}", b.branch, branch(b)))
                .collect();
            line.push_str(&format!(
                "{} branches unfinished — {}",
                bs.len(),
                parts.join("; ")
            ));
        }
    }
    line.push_str(&format!(
        " ({} of {} kernel nodes done by the graph marks",
        g.completed, g.kernel_nodes
    ));
    if let Some(ago) = m.last_progress_ms_ago {
        line.push_str(&format!(
            "; the last of them, or the replay's start, ~{} ago",
            fmt_duration(ago)
        ));
    }
    line.push(')');
    line
}

/// One line saying what the longest stuck head is, for the verdict's summary.
pub fn describe(head: &StreamHead, j: &KernelJudgement) -> String {
    if !head.exact {
        let why = match head.marks_stale_ms {
            Some(age) => format!(
                "the shim last published its stream marks {} ago (its flush thread is waiting, \
                 inside the driver or with the process stopped), so which of them completed \
                 since is not known",
                fmt_duration(age)
            ),
            None => "the shim's stream marks (the default recording) do not tell which".into(),
        };
        return format!(
            "one of {} kernels on device {} stream {} has not completed for ~{} (bound {}), {} launches queued behind: in launch order {} — the first of them not completed is stuck; {why} (WEDGEPROBE_SHIM_RECORD=exact names it, at the price in BENCHMARKS.md)",
            head.candidates_total,
            head.device,
            head.stream,
            fmt_duration(head.running_ms),
            fmt_duration(j.bound_ms),
            head.queued_behind,
            list_candidates(head)
        );
    }
    let what = match &head.graph {
        Some(g) if g.marks.is_some() => graph_marks_line(g),
        Some(g) if !g.node_progress => format!(
            "graph launch (exec {}) of {} kernel nodes ({}…; node progress is not recorded with stream marks: graph marks, WEDGEPROBE_GRAPH_MARK_EVERY=4 in the process's environment, narrow it to <= 4 nodes, WEDGEPROBE_SHIM_RECORD=exact names it — each at the price in BENCHMARKS.md)",
            g.exec_id,
            g.kernel_nodes,
            g.not_completed
                .iter()
                .take(3)
                .map(|n| n
                    .kernel_demangled
                    .as_deref()
                    .unwrap_or(&n.kernel)
                    .to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Some(g) => match g.not_completed.first() {
            Some(n) => format!(
                "graph launch (exec {}): kernel node {} {} has not completed ({} of {} kernel nodes done)",
                g.exec_id,
                n.node_id,
                n.kernel_demangled.as_deref().unwrap_or(&n.kernel),
                g.completed,
                g.kernel_nodes
            ),
            None => format!("graph launch (exec {}, nodes unknown)", g.exec_id),
        },
        // A graph instantiated before the shim was there (`wedgeprobe attach`): no node list.
        None if head.kernel == "(graph launch)" => {
            "a CUDA graph launch (its graph was instantiated before the shim was there: its \
             kernel nodes are not known)"
                .to_string()
        }
        None => match &head.kernel_demangled {
            Some(d) => format!("{d} [{}]", head.kernel),
            None => head.kernel.clone(),
        },
    };
    if head.before_attach() {
        return format!(
            "work queued on device {} stream {} before wedgeprobe attached (a kernel launched \
             before the shim was put in: it cannot be named) has not completed for ≥ {} since \
             the attach (bound {}), {} launches queued behind it",
            head.device,
            head.stream,
            fmt_duration(head.running_ms),
            fmt_duration(j.bound_ms),
            head.queued_behind
        );
    }
    let shape = if head.graph.is_some() || head.kernel == "(graph launch)" {
        String::new()
    } else {
        format!(
            " (grid {}x{}x{}, block {}x{}x{})",
            head.grid[0], head.grid[1], head.grid[2], head.block[0], head.block[1], head.block[2]
        )
    };
    format!(
        "{} on device {} stream {}{} has run ~{} (bound {}), {} launches queued behind it",
        what,
        head.device,
        head.stream,
        shape,
        fmt_duration(head.running_ms),
        fmt_duration(j.bound_ms),
        head.queued_behind
    )
}

/// With a shim journal, judges each stream's oldest unfinished kernel (`kernel_verdict`) and
/// refines the host-side verdict: a stuck kernel makes it `kernel_wedge` (or
/// `collective_wait` for a collective, whose culprit is another rank), and threads blocked
/// behind a kernel still within its bounds make it `busy`.
pub fn apply_kernels(
    verdict: &mut Verdict,
    threads: &[ThreadView],
    heads: &mut [StreamHead],
    history: &History,
    bounds: &KernelBounds,
    collectives: &[String],
) {
    for h in heads.iter_mut() {
        h.judgement = Some(judge(h, history, bounds, threads, collectives));
    }
    if matches!(verdict.kind, VerdictKind::TargetExited) {
        return;
    }
    let host = verdict.summary.clone();
    // A stuck non-collective kernel is the culprit; collectives only wait for one.
    let stuck = heads
        .iter()
        .filter(|h| h.is_stuck())
        .min_by_key(|h| h.judgement.as_ref().is_some_and(|j| j.collective));
    if let Some(h) = stuck
        && let Some(j) = &h.judgement
    {
        let (kind, what) = if j.collective {
            (
                VerdictKind::CollectiveWait,
                "collective kernel waiting (the culprit is a peer rank)",
            )
        } else {
            (VerdictKind::KernelWedge, "kernel wedged")
        };
        verdict.kind = kind;
        // Several streams of one process stuck: none is singled out. One may only wait behind
        // another — a stream's work, and its marks, can wait for another stream's (the legacy
        // default stream and every blocking stream wait for each other; events), and the
        // journal does not record those dependencies. Seen on the H200 (2026-12-01): a fill
        // kernel on a side stream, done, could not be proven done behind a stuck graph on the
        // default stream.
        let mut same: Vec<&StreamHead> = heads
            .iter()
            .filter(|o| {
                o.pid == h.pid
                    && o.is_stuck()
                    && o.judgement
                        .as_ref()
                        .is_some_and(|oj| oj.collective == j.collective)
            })
            .collect();
        if same.len() > 1 {
            same.sort_by_key(|o| o.correlation);
            let list: Vec<String> = same
                .iter()
                .filter_map(|o| Some(describe(o, o.judgement.as_ref()?)))
                .collect();
            verdict.summary = format!(
                "{what} on {} streams of pid {} — one may be waiting behind another (stream \
                 dependencies are not recorded), in launch order: {}. Host: {host}",
                same.len(),
                h.pid,
                list.join("; ")
            );
        } else {
            verdict.summary = format!("{what}: {}. Host: {host}", describe(h, j));
        }
        return;
    }
    if verdict.kind != VerdictKind::Healthy
        && let Some(h) = heads
            .iter()
            .find(|h| threads.iter().any(|t| t.blocked && t.pid == h.pid))
        && let Some(j) = &h.judgement
    {
        if j.state == KernelState::Running {
            // Said without the host verdict's opening ("GPU not completing work … likely
            // wedged"): read at 3 a.m., it contradicted the `busy` it ended with.
            let waiting: Vec<String> = threads
                .iter()
                .filter(|t| t.blocked && t.pid == h.pid)
                .map(super::host_calls::describe_thread)
                .collect();
            verdict.kind = VerdictKind::Busy;
            verdict.summary = format!(
                "{} wait behind {} on stream {}, which has run ~{}, within its bound of {}: busy, not (yet) a wedge.",
                waiting.join("; "),
                h.kernel,
                h.stream,
                fmt_duration(h.running_ms),
                fmt_duration(j.bound_ms)
            );
        } else {
            verdict.summary = format!("{host} Suspect: {}.", describe(h, j));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::settings::Settings;

    fn bounds() -> KernelBounds {
        Settings::default().kernel
    }

    fn head(name: &str, running_ms: f64) -> StreamHead {
        StreamHead::for_test(1, name, running_ms)
    }

    fn blocked_thread() -> ThreadView {
        ThreadView::for_test("cuStreamSynchronize", 9000.0, 1000.0)
    }

    fn candidate(name: &str, correlation: u64) -> crate::model::kernels::Candidate {
        crate::model::kernels::Candidate {
            kernel: name.into(),
            kernel_demangled: None,
            correlation,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            launched_ms_ago: 1.0,
            graph_exec: 0,
        }
    }

    /// Candidates that repeat a few kernels are also summed up by kernel, in order of first
    /// listing; a list of distinct ones is not.
    #[test]
    fn repeated_candidates_are_summed_up_by_kernel() {
        let mut h = head("(one of 4 kernels)", 5_000.0);
        h.candidates = ["decode", "decode", "wedge", "decode"]
            .iter()
            .enumerate()
            .map(|(i, n)| candidate(n, i as u64 + 1))
            .collect();
        h.candidates_total = 4;
        let line = list_candidates(&h);
        assert!(
            line.starts_with("[1] decode (grid 1x1x1, block 32x1x1), [2] decode"),
            "{line}"
        );
        assert!(line.ends_with(" (listed: decode ×3, wedge ×1)"), "{line}");
        h.candidates = vec![candidate("a", 1), candidate("b", 2)];
        h.candidates_total = 2;
        assert!(!list_candidates(&h).contains("listed:"));
    }

    /// Two streams of one process with a stuck head (one may only wait behind the other):
    /// the verdict lists both in launch order, and names neither alone.
    #[test]
    fn stuck_heads_on_two_streams_are_listed_not_one_picked() {
        let mut a = head("fill_kernel", 8_000.0);
        a.stream = "0xa".into();
        a.correlation = 10;
        let mut b = head("spin_on_flag", 7_900.0);
        b.stream = "0xb".into();
        b.correlation = 11;
        b.queued_behind = 1022;
        let mut heads = vec![a, b];
        let mut v = Verdict {
            kind: VerdictKind::LaunchQueueFull,
            summary: "host".into(),
        };
        apply_kernels(
            &mut v,
            &[blocked_thread()],
            &mut heads,
            &History::default(),
            &bounds(),
            &[],
        );
        assert_eq!(v.kind, VerdictKind::KernelWedge);
        assert!(
            v.summary.starts_with("kernel wedged on 2 streams"),
            "{}",
            v.summary
        );
        let (fa, fb) = (
            v.summary.find("fill_kernel"),
            v.summary.find("spin_on_flag"),
        );
        assert!(fa.is_some() && fb.is_some() && fa < fb, "{}", v.summary);
    }

    #[test]
    fn a_long_first_run_below_the_floor_is_not_stuck() {
        let j = judge(
            &head("long_kernel", 3_000.0),
            &History::default(),
            &bounds(),
            &[blocked_thread()],
            &[],
        );
        assert_eq!(j.state, KernelState::Running);
    }

    #[test]
    fn past_the_floor_with_blocked_threads_is_stuck_without_them_suspect() {
        let b = bounds();
        assert_eq!(
            judge(
                &head("k", 6_000.0),
                &History::default(),
                &b,
                &[blocked_thread()],
                &[]
            )
            .state,
            KernelState::Stuck
        );
        assert_eq!(
            judge(&head("k", 6_000.0), &History::default(), &b, &[], &[]).state,
            KernelState::Suspect
        );
        assert_eq!(
            judge(&head("k", 61_000.0), &History::default(), &b, &[], &[]).state,
            KernelState::Stuck
        );
    }

    #[test]
    fn history_raises_the_bound_for_kernels_that_are_always_long() {
        let mut h = History::default();
        for _ in 0..10 {
            h.record(1, &Arc::from("slow"), 4_000_000_000); // 4 s every time
        }
        let j = judge(
            &head("slow", 6_000.0),
            &h,
            &bounds(),
            &[blocked_thread()],
            &[],
        );
        assert_eq!(j.state, KernelState::Running);
        assert!((j.bound_ms - 40_000.0).abs() < 1_000.0, "{j:?}");
    }

    #[test]
    fn collectives_are_recognised() {
        assert!(is_collective(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            &[]
        ));
        assert!(is_collective(
            "_ZN4vllm19cross_device_reduce1stIfLi8EEEvPNS_6RankDataE",
            &[]
        ));
        assert!(!is_collective("_Z26attn_mbarrier_wedge_kernelPViy", &[]));
        // Settings add patterns.
        assert!(is_collective(
            "_Z26attn_mbarrier_wedge_kernelPViy",
            &["mbarrier_wedge".to_string()]
        ));
    }
}
