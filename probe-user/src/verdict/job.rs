//! Jobs, ranks and the culprit rank. Two of the three incidents behind this project were
//! multi-process: one rank's kernel is stuck while its peers wait in a collective for it. From
//! the host the ranks look alike (each main thread at 100% CPU, blocked in a launch); only
//! each GPU's oldest in-flight kernel tells the culprit (not a collective) from the victims
//! (a collective) — docs/measured-facts.md, "Two ranks, one stuck".
//!
//! Processes are grouped into a job by what torchrun, vLLM and SGLang put in their
//! environment (`TORCHELASTIC_RUN_ID`, `MASTER_ADDR:MASTER_PORT`, `WEDGEPROBE_JOB`), else —
//! when they carry a rank (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, or mpirun's, PMI's and Slurm's:
//! TensorRT-LLM starts its ranks with mpirun) — by parent process, or all targets when `--job`
//! says so. A shared parent alone is not a job: two unrelated servers started from one shell
//! were judged one job on the H200 (2026-12-03), a dump's verdict listing the other's thread.
//! The rank comes from `RANK`, else the launcher's, else `LOCAL_RANK`, else the PID order
//! within the job. The environment is the target's: read from /proc, bounded and parsed
//! defensively.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::kernels::{KernelState, StreamHead};

/// What a process's environment says about its place in a job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RankInfo {
    pub pid: u32,
    pub job: String,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// Where the rank came from: `RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, `SLURM_PROCID`,
    /// `LOCAL_RANK`, or `pid order`.
    pub rank_source: &'static str,
}

/// Where a rank is read from, in order: torch.distributed's, mpirun's, PMI's, Slurm's, the
/// node-local one.
const RANK_VARS: [&str; 5] = [
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "SLURM_PROCID",
    "LOCAL_RANK",
];

/// Largest environment read (a hostile process cannot make us read more).
const MAX_ENVIRON: usize = 1 << 20;

pub fn read_rank_info(pid: u32) -> RankInfo {
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let ppid = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            crate::process::target::stat_field(&s, 4)?
                .parse::<u32>()
                .ok()
        })
        .unwrap_or(0);
    parse_environ(pid, ppid, &env[..env.len().min(MAX_ENVIRON)])
}

pub fn parse_environ(pid: u32, ppid: u32, env: &[u8]) -> RankInfo {
    let mut vars = BTreeMap::new();
    for kv in env.split(|&b| b == 0) {
        let Ok(kv) = std::str::from_utf8(kv) else {
            continue;
        };
        if let Some((k, v)) = kv.split_once('=')
            && matches!(
                k,
                "RANK"
                    | "LOCAL_RANK"
                    | "WORLD_SIZE"
                    | "OMPI_COMM_WORLD_RANK"
                    | "PMI_RANK"
                    | "SLURM_PROCID"
                    | "MASTER_ADDR"
                    | "MASTER_PORT"
                    | "TORCHELASTIC_RUN_ID"
                    | "WEDGEPROBE_JOB"
            )
            && v.len() <= 256
        {
            vars.insert(k, v.to_string());
        }
    }
    let num = |k: &str| vars.get(k).and_then(|v| v.trim().parse::<u32>().ok());
    let job = if let Some(j) = vars.get("WEDGEPROBE_JOB") {
        format!("job {j}")
    } else if let Some(r) = vars.get("TORCHELASTIC_RUN_ID") {
        format!("torchelastic {r}")
    } else if let (Some(a), Some(p)) = (vars.get("MASTER_ADDR"), vars.get("MASTER_PORT")) {
        format!("master {a}:{p}")
    } else if RANK_VARS.iter().any(|k| num(k).is_some()) || num("WORLD_SIZE").is_some() {
        format!("ranks of pid {ppid}")
    } else {
        // No evidence of a job: a job of one, which `analyze` leaves out.
        format!("pid {pid}")
    };
    let (rank, source) = RANK_VARS
        .iter()
        .find_map(|&k| Some((Some(num(k)?), k)))
        .unwrap_or((None, "pid order"));
    RankInfo {
        pid,
        job,
        rank,
        local_rank: num("LOCAL_RANK"),
        world_size: num("WORLD_SIZE"),
        rank_source: source,
    }
}

/// What a rank is doing, as far as its kernels show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RankStateKind {
    /// A non-collective kernel past its bound: the cause, when peers wait.
    Stuck,
    /// A collective past its bound: waiting for a peer.
    WaitingInCollective,
    /// Kernels in flight within their bounds.
    Running,
    /// No shim journal: whether a kernel is in flight is not known.
    KernelsUnknown,
    NoKernelInFlight,
}

impl RankStateKind {
    /// The JSON spelling, for text output too.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stuck => "stuck",
            Self::WaitingInCollective => "waiting_in_collective",
            Self::Running => "running",
            Self::KernelsUnknown => "kernels_unknown",
            Self::NoKernelInFlight => "no_kernel_in_flight",
        }
    }
}

/// One rank as the job view shows it.
#[derive(Clone, Debug, Serialize)]
pub struct RankState {
    pub pid: u32,
    pub rank: u32,
    pub rank_source: &'static str,
    pub state: RankStateKind,
    pub kernel: Option<String>,
    pub running_ms: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Culprit {
    pub pid: u32,
    pub rank: u32,
    pub kernel: String,
    pub stuck_ms: f64,
    /// How much earlier it stopped making progress than the first peer that waits for it.
    pub ahead_of_others_ms: f64,
    pub waiting_ranks: Vec<u32>,
    pub summary: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct JobView {
    pub job: String,
    pub ranks: Vec<RankState>,
    pub culprit: Option<Culprit>,
}

/// Groups `infos` into jobs (`one_job`: all of them in one) and finds each job's culprit from
/// the judged stream heads.
/// `kernels_known(pid)`: whether the process's kernels are seen at all (a shim journal).
pub fn analyze(
    infos: &[RankInfo],
    heads: &[StreamHead],
    one_job: bool,
    kernels_known: &dyn Fn(u32) -> bool,
) -> Vec<JobView> {
    let mut jobs: BTreeMap<String, Vec<&RankInfo>> = BTreeMap::new();
    for i in infos {
        let key = if one_job {
            "all targets".to_string()
        } else {
            i.job.clone()
        };
        jobs.entry(key).or_default().push(i);
    }
    jobs.into_iter()
        .filter(|(_, members)| members.len() > 1)
        .map(|(job, mut members)| {
            members.sort_by_key(|m| (m.rank.unwrap_or(u32::MAX), m.pid));
            let ranks: Vec<RankState> = members
                .iter()
                .enumerate()
                .map(|(i, m)| rank_state(m, i as u32, heads, kernels_known(m.pid)))
                .collect();
            let culprit = culprit(&ranks);
            JobView {
                job,
                ranks,
                culprit,
            }
        })
        .collect()
}

fn rank_state(m: &RankInfo, order: u32, heads: &[StreamHead], known: bool) -> RankState {
    let judged = |h: &&StreamHead| h.pid == m.pid && h.state() != KernelState::Running;
    // A rank's oldest suspect-or-stuck kernel; a non-collective one wins (it is the cause).
    let mut mine: Vec<&StreamHead> = heads.iter().filter(judged).collect();
    mine.sort_by(|a, b| b.running_ms.total_cmp(&a.running_ms));
    let pick = mine
        .iter()
        .find(|h| !h.judgement.as_ref().is_some_and(|j| j.collective))
        .or(mine.first())
        .copied();
    let any = heads.iter().any(|h| h.pid == m.pid);
    // A head narrowed to candidates (marks mode) names them all, never one of them alone.
    let name = |h: &StreamHead| {
        if h.exact {
            h.kernel_demangled
                .clone()
                .unwrap_or_else(|| h.kernel.clone())
        } else {
            format!(
                "one of {}: {}",
                h.candidates_total,
                crate::verdict::kernel::list_candidates(h)
            )
        }
    };
    let (state, kernel, running_ms) = match pick {
        Some(h) if h.judgement.as_ref().is_some_and(|j| j.collective) => (
            RankStateKind::WaitingInCollective,
            Some(name(h)),
            Some(h.running_ms),
        ),
        Some(h) => (RankStateKind::Stuck, Some(name(h)), Some(h.running_ms)),
        None if any => (RankStateKind::Running, None, None),
        // Without a journal nothing says whether a kernel is in flight: say that.
        None if !known => (RankStateKind::KernelsUnknown, None, None),
        None => (RankStateKind::NoKernelInFlight, None, None),
    };
    RankState {
        pid: m.pid,
        rank: m.rank.unwrap_or(order),
        rank_source: m.rank_source,
        state,
        kernel,
        running_ms,
    }
}

fn culprit(ranks: &[RankState]) -> Option<Culprit> {
    let waiting: Vec<&RankState> = ranks
        .iter()
        .filter(|r| r.state == RankStateKind::WaitingInCollective)
        .collect();
    if waiting.is_empty() {
        return None;
    }
    let c = ranks
        .iter()
        .filter(|r| r.state == RankStateKind::Stuck)
        .max_by(|a, b| {
            a.running_ms
                .unwrap_or(0.0)
                .total_cmp(&b.running_ms.unwrap_or(0.0))
        })?;
    let stuck_ms = c.running_ms.unwrap_or(0.0);
    let first_waiter = waiting
        .iter()
        .filter_map(|w| w.running_ms)
        .fold(0.0, f64::max);
    let ahead = stuck_ms - first_waiter;
    let kernel = c.kernel.clone().unwrap_or_default();
    let waiting_ranks: Vec<u32> = waiting.iter().map(|w| w.rank).collect();
    Some(Culprit {
        pid: c.pid,
        rank: c.rank,
        summary: format!(
            "rank {} (pid {}) is the culprit: stuck in {} for {:.1} s, {:.1} s before the others stopped; ranks {:?} wait in collectives for it",
            c.rank,
            c.pid,
            kernel,
            stuck_ms / 1e3,
            ahead / 1e3,
            waiting_ranks
        ),
        kernel,
        stuck_ms,
        ahead_of_others_ms: ahead,
        waiting_ranks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::KernelJudgement;

    fn head(pid: u32, kernel: &str, running_ms: f64, collective: bool) -> StreamHead {
        StreamHead {
            judgement: Some(KernelJudgement {
                state: KernelState::Stuck,
                bound_ms: 5_000.0,
                collective,
            }),
            ..StreamHead::for_test(pid, kernel, running_ms)
        }
    }

    #[test]
    fn ranks_come_from_the_environment_or_pid_order() {
        let env = b"PATH=/bin\0RANK=3\0WORLD_SIZE=4\0MASTER_ADDR=10.0.0.1\0MASTER_PORT=29500\0";
        let i = parse_environ(10, 1, env);
        assert_eq!(
            (i.rank, i.world_size, i.rank_source),
            (Some(3), Some(4), "RANK")
        );
        assert_eq!(i.job, "master 10.0.0.1:29500");
        let i = parse_environ(11, 7, b"LOCAL_RANK=1\0garbage\xff\0");
        assert_eq!((i.rank, i.rank_source), (Some(1), "LOCAL_RANK"));
        assert_eq!(i.job, "ranks of pid 7");
        let i = parse_environ(12, 7, b"RANK=not-a-number\0");
        assert_eq!(i.rank, None);
        let i = parse_environ(13, 7, b"OMPI_COMM_WORLD_RANK=2\0OMPI_COMM_WORLD_SIZE=4\0");
        assert_eq!((i.rank, i.rank_source), (Some(2), "OMPI_COMM_WORLD_RANK"));
        assert_eq!(i.job, "ranks of pid 7");
    }

    /// Two servers started from one shell share a parent and nothing else: no job (before,
    /// "children of pid 7", one job, each judged with the other's threads).
    #[test]
    fn a_shared_parent_alone_is_not_a_job() {
        let a = parse_environ(20, 7, b"PATH=/bin\0HOME=/root\0");
        let b = parse_environ(21, 7, b"PATH=/bin\0HOME=/root\0");
        assert_ne!(a.job, b.job);
        assert!(analyze(&[a, b], &[], false, &|_| true).is_empty());
    }

    #[test]
    fn the_rank_stuck_in_a_gemm_is_the_culprit_of_three_waiting_in_allreduce() {
        let infos: Vec<RankInfo> = (0..4)
            .map(|r| {
                parse_environ(
                    100 + r,
                    1,
                    format!("RANK={r}\0MASTER_ADDR=a\0MASTER_PORT=1\0").as_bytes(),
                )
            })
            .collect();
        let heads = vec![
            head(
                100,
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                9_000.0,
                true,
            ),
            head(
                101,
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                9_500.0,
                true,
            ),
            head(102, "gemm_kernel", 12_000.0, false),
            head(
                103,
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                8_000.0,
                true,
            ),
        ];
        let jobs = analyze(&infos, &heads, false, &|_| true);
        assert_eq!(jobs.len(), 1);
        let c = jobs[0].culprit.as_ref().expect("a culprit");
        assert_eq!((c.rank, c.pid, c.kernel.as_str()), (2, 102, "gemm_kernel"));
        assert_eq!(c.ahead_of_others_ms, 2_500.0);
        assert_eq!(c.waiting_ranks, vec![0, 1, 3]);
    }

    #[test]
    fn no_culprit_without_a_waiting_peer() {
        let infos: Vec<RankInfo> = (0..2)
            .map(|r| parse_environ(200 + r, 1, b"WEDGEPROBE_JOB=t\0"))
            .collect();
        let heads = vec![head(200, "gemm_kernel", 9_000.0, false)];
        let jobs = analyze(&infos, &heads, false, &|_| true);
        assert!(jobs[0].culprit.is_none());
        assert_eq!(jobs[0].ranks[1].state, RankStateKind::NoKernelInFlight);
        assert_eq!(jobs[0].ranks[1].rank_source, "pid order");
    }

    /// Without a shim journal nothing says whether a rank has a kernel in flight: the rank
    /// says that, rather than "no kernel in flight".
    #[test]
    fn a_rank_without_a_journal_has_unknown_kernels() {
        let infos: Vec<RankInfo> = (0..2)
            .map(|r| parse_environ(300 + r, 1, b"WEDGEPROBE_JOB=t\0"))
            .collect();
        let jobs = analyze(&infos, &[], false, &|pid| pid == 300);
        let states: Vec<RankStateKind> = jobs[0].ranks.iter().map(|r| r.state).collect();
        assert_eq!(
            states,
            [
                RankStateKind::NoKernelInFlight,
                RankStateKind::KernelsUnknown
            ]
        );
    }
}
