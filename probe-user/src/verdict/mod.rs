//! The verdict pipeline — the one place a verdict is built, for every output (report, watch,
//! run, trace, the daemon's logs and metrics, the flight recorder's dumps):
//!
//! 1. threads inside driver calls → a host-side verdict (`host_calls`);
//! 2. each stream's oldest kernel, judged against its bounds (`kernel`), refines it:
//!    `kernel_wedge`, `collective_wait`, `busy`;
//! 3. waits that evidence says are not stuck are not incidents: behind work the journal shows
//!    completing (`busy`), or, without a journal, under the no-journal bound (`waiting`);
//! 4. processes with no GPU work and spinning threads (`host_stall`) when nothing else is wrong;
//! 5. ranks grouped into jobs, and a job's culprit rank appended (`job`).
//!
//! `Pipeline` owns what must last between ticks (symbolized stacks, ranks read from the
//! environment) and the `Settings` it judges by.

pub mod describe;
pub mod host_calls;
pub mod host_stall;
pub mod job;
pub mod kernel;

use std::collections::HashMap;

pub use host_calls::{Verdict, VerdictKind};

use crate::{
    model::{Model, ThreadView, kernels::StreamHead},
    settings::Settings,
    verdict::{
        host_stall::{HostStall, StackCache, Undecided},
        job::{Culprit, JobView, RankInfo},
    },
};

/// What the model says now: threads inside calls, each stream's oldest kernel (judged), host
/// stalls, jobs, and the verdict over them.
#[derive(Clone, Debug)]
pub struct Evaluation {
    pub threads: Vec<ThreadView>,
    pub kernels: Vec<StreamHead>,
    pub host_stalls: Vec<HostStall>,
    /// Threads that may be in a host stall whose start nothing dates: watching decides them
    /// (`report` watches on while there are any).
    pub undecided: Vec<Undecided>,
    /// Jobs of two or more ranks (every target together only).
    pub jobs: Vec<JobView>,
    pub verdict: Verdict,
}

impl Evaluation {
    /// The pid the verdict is about: the stuck kernel's process, else a blocked thread's,
    /// else one in a host stall, else `first`.
    pub fn pid(&self, first: u32) -> u32 {
        self.kernels
            .iter()
            .find(|k| k.is_stuck())
            .map(|k| k.pid)
            .or_else(|| self.threads.iter().find(|t| t.blocked).map(|t| t.pid))
            .or_else(|| self.host_stalls.first().map(|s| s.pid))
            .unwrap_or(first)
    }

    /// The first job's culprit rank, if a job has one.
    pub fn culprit(&self) -> Option<&Culprit> {
        self.jobs.iter().find_map(|j| j.culprit.as_ref())
    }
}

/// A host stall is the verdict when nothing else is wrong (no blocked call, no stuck kernel).
fn apply_host_stalls(verdict: &mut Verdict, stalls: &[HostStall]) {
    if stalls.is_empty()
        || !matches!(
            verdict.kind,
            VerdictKind::Healthy | VerdictKind::Busy | VerdictKind::Waiting
        )
    {
        return;
    }
    let parts: Vec<String> = stalls.iter().map(host_stall::describe).collect();
    *verdict = Verdict {
        kind: VerdictKind::HostStall,
        summary: parts.join(". "),
    };
}

/// GPU work done this recently (a completion, a mark, a synchronize returning) is work still
/// completing: marks pass every few launches, so a healthy queue shows one well within it.
const COMPLETING_NS: u64 = 1_000_000_000;

/// Threads blocked in launches, synchronizes or copies behind GPU work the journal shows
/// completing are waiting, not stuck: busy, whatever the wait's length. (The daemon on the
/// H200, 2026-12-03, called a synchronize waiting 1–2 s for queued graph replays to drain
/// `blocked_in_sync` ten times in seven minutes, while the journal showed every replay
/// completing; on the simulated driver, nine incidents in 14 s of a queue of 2 ms kernels
/// draining.) A kernel judged stuck has made its verdict already; without a journal nothing
/// says whether work completes, and the verdict stands.
fn apply_progress(
    verdict: &mut Verdict,
    threads: &[ThreadView],
    heads: &[StreamHead],
    model: &Model,
    now_ns: u64,
) {
    use crate::model::kernels::KernelState;
    if !matches!(
        verdict.kind,
        VerdictKind::LaunchQueueFull | VerdictKind::BlockedInSync | VerdictKind::BlockedInCopy
    ) {
        return;
    }
    let waiting: Vec<&ThreadView> = threads.iter().filter(|t| waits_on_gpu(t)).collect();
    let mut pids: Vec<u32> = waiting.iter().map(|t| t.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    // A kernel past its bounds in one of them is evidence against: the verdict says it.
    let suspect = heads.iter().any(|h| {
        pids.contains(&h.pid)
            && h.judgement
                .as_ref()
                .is_some_and(|j| j.state != KernelState::Running)
    });
    if suspect {
        return;
    }
    let ago: Option<Vec<u64>> = pids
        .iter()
        .map(|&pid| model.gpu_completing(pid, now_ns, COMPLETING_NS))
        .collect();
    let Some(ago) = ago.filter(|a| !a.is_empty()) else {
        return;
    };
    let list: Vec<String> = waiting
        .iter()
        .map(|t| host_calls::describe_thread(t))
        .collect();
    let newest = ago.iter().max().copied().unwrap_or(0);
    *verdict = Verdict {
        kind: VerdictKind::Busy,
        summary: format!(
            "waiting behind GPU work that is completing: {}; the shim journal saw work done {} \
             ago: busy, not an incident.",
            list.join("; "),
            describe::fmt_duration(newest as f64 / 1e6)
        ),
    };
}

/// Blocked launches, synchronizes and copies of processes without a recording journal, under
/// the no-journal bound: nothing shows whether the GPU behind them completes work, and a
/// healthy server waits seconds (a 3 s kernel then a synchronize; a queue draining behind a
/// 2.5 s kernel — the H200 soak, where a 1 s bound made 8–9 incidents in 330 s). They are
/// judged apart: `waiting`, not an incident, until the bound.
fn unseen_waits(threads: &[ThreadView], model: &Model, bound_ms: f64) -> Vec<ThreadView> {
    threads
        .iter()
        .filter(|t| waits_on_gpu(t) && t.in_call_ms < bound_ms && !model.kernels_known(t.pid))
        .cloned()
        .collect()
}

/// Blocked in a call that waits for the GPU: a launch (room in the queue), a synchronize, a
/// blocking copy.
fn waits_on_gpu(t: &ThreadView) -> bool {
    use probe_common::api::{ApiClass, class};
    t.blocked
        && matches!(
            class(t.api_id),
            Some(ApiClass::Launch | ApiClass::Sync | ApiClass::Copy)
        )
}

/// The waits `unseen_waits` set apart, said: the verdict when nothing else is wrong, else
/// appended to it.
fn apply_unseen_waits(verdict: &mut Verdict, unseen: &[ThreadView], bound_ms: f64) {
    if unseen.is_empty() || verdict.kind == VerdictKind::TargetExited {
        return;
    }
    let list: Vec<String> = unseen.iter().map(host_calls::describe_thread).collect();
    let said = format!(
        "waiting in the driver, GPU progress not seen (no shim journal): {}. A kernel running \
         long, a queue draining and a wedge look the same from the host; an incident if it \
         lasts {} (--no-journal-bound), which healthy serving's waits do not reach.",
        list.join("; "),
        describe::fmt_duration(bound_ms)
    );
    match verdict.kind {
        VerdictKind::Healthy => {
            *verdict = Verdict {
                kind: VerdictKind::Waiting,
                summary: said,
            }
        }
        VerdictKind::Busy => {
            verdict.summary = format!("{said} {}", verdict.summary);
            verdict.kind = VerdictKind::Waiting;
        }
        _ => verdict.summary = format!("{} Also {said}", verdict.summary),
    }
}

pub struct Pipeline {
    pub settings: Settings,
    stacks: StackCache,
    /// Ranks from each target's environment, which does not change: read once per process.
    ranks: HashMap<u32, RankInfo>,
}

impl Pipeline {
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            stacks: StackCache::default(),
            ranks: HashMap::new(),
        }
    }

    /// Every target together: the verdict `report`, `watch`, `run` and `trace` give, with the
    /// job culprit appended to its summary.
    pub fn evaluate(&mut self, model: &Model, now_ns: u64) -> Evaluation {
        let seen = self.read(model, now_ns);
        self.judge_all(model, seen)
    }

    /// The daemon's: every target together (the trace's verdict marks, jobs) and each process
    /// on its own, from one read of the model.
    pub fn evaluate_all_and_each(
        &mut self,
        model: &Model,
        now_ns: u64,
    ) -> (Evaluation, Vec<(u32, Evaluation)>) {
        let seen = self.read(model, now_ns);
        let each = self.judge_each(model, &seen);
        (self.judge_all(model, seen), each)
    }

    fn read(&mut self, model: &Model, now_ns: u64) -> Seen {
        let threads = model.threads_in_calls(now_ns, self.settings.blocked_after_ns());
        let in_calls: std::collections::HashSet<(u32, u32)> =
            threads.iter().map(|t| (t.pid, t.tid)).collect();
        Seen {
            now_ns,
            heads: model.kernel_heads(),
            found: host_stall::find(
                model,
                now_ns,
                self.settings.stall_after_ns(),
                &in_calls,
                &mut self.stacks,
            ),
            threads,
        }
    }

    /// One process's (or every target's) verdict from what it was seen doing.
    #[allow(clippy::too_many_arguments)]
    fn judge(
        &self,
        model: &Model,
        threads: &[ThreadView],
        heads: &mut [StreamHead],
        stalls: &[HostStall],
        alive: bool,
        journal: bool,
        now_ns: u64,
    ) -> Verdict {
        let s = &self.settings;
        let bound_ms = s.no_journal_bound_ms();
        let unseen = unseen_waits(threads, model, bound_ms);
        // Judged as not blocked by the host-side verdict; said apart below.
        let judged: Vec<ThreadView> = threads
            .iter()
            .map(|t| {
                let mut t = t.clone();
                if unseen.iter().any(|u| (u.pid, u.tid) == (t.pid, t.tid)) {
                    t.blocked = false;
                }
                t
            })
            .collect();
        let threads = &judged[..];
        let mut verdict = host_calls::decide(threads, s.blocked_after_ms(), alive, journal);
        kernel::apply_kernels(
            &mut verdict,
            threads,
            heads,
            &model.history,
            &s.kernel,
            &s.collectives,
        );
        apply_progress(&mut verdict, threads, heads, model, now_ns);
        apply_unseen_waits(&mut verdict, &unseen, bound_ms);
        apply_host_stalls(&mut verdict, stalls);
        verdict
    }

    fn judge_all(&mut self, model: &Model, seen: Seen) -> Evaluation {
        let Seen {
            now_ns,
            threads,
            mut heads,
            found,
        } = seen;
        let stalls = found.stalls;
        let alive = model.procs.values().any(|p| !p.exited);
        let mut verdict = self.judge(
            model,
            &threads,
            &mut heads,
            &stalls,
            alive,
            model.journal_read(),
            now_ns,
        );
        self.ranks.retain(|pid, _| model.procs.contains_key(pid));
        let infos: Vec<RankInfo> = model
            .procs
            .keys()
            .map(|&pid| {
                self.ranks
                    .entry(pid)
                    .or_insert_with(|| job::read_rank_info(pid))
                    .clone()
            })
            .collect();
        let jobs = job::analyze(&infos, &heads, self.settings.one_job, &|pid| {
            model.kernels_known(pid)
        });
        if let Some(c) = jobs.iter().find_map(|j| j.culprit.as_ref()) {
            verdict.summary = format!("{} Job: {}", verdict.summary, c.summary);
        }
        Evaluation {
            threads,
            kernels: heads,
            host_stalls: stalls,
            undecided: found.undecided,
            jobs,
            verdict,
        }
    }

    fn judge_each(&self, model: &Model, seen: &Seen) -> Vec<(u32, Evaluation)> {
        model
            .procs
            .iter()
            .map(|(&pid, p)| {
                let threads: Vec<ThreadView> = seen
                    .threads
                    .iter()
                    .filter(|t| t.pid == pid)
                    .cloned()
                    .collect();
                let mut heads: Vec<StreamHead> = seen
                    .heads
                    .iter()
                    .filter(|h| h.pid == pid)
                    .cloned()
                    .collect();
                let stalls: Vec<HostStall> = seen
                    .found
                    .stalls
                    .iter()
                    .filter(|s| s.pid == pid)
                    .cloned()
                    .collect();
                let undecided: Vec<Undecided> = seen
                    .found
                    .undecided
                    .iter()
                    .filter(|u| u.pid == pid)
                    .cloned()
                    .collect();
                let journal = model
                    .journals
                    .get(&pid)
                    .is_some_and(|j| j.status.is_readable());
                let verdict = self.judge(
                    model,
                    &threads,
                    &mut heads,
                    &stalls,
                    !p.exited,
                    journal,
                    seen.now_ns,
                );
                (
                    pid,
                    Evaluation {
                        threads,
                        kernels: heads,
                        host_stalls: stalls,
                        undecided,
                        jobs: Vec::new(),
                        verdict,
                    },
                )
            })
            .collect()
    }
}

/// What a verdict is made from, read from the model once per evaluation.
struct Seen {
    now_ns: u64,
    threads: Vec<ThreadView>,
    heads: Vec<StreamHead>,
    found: host_stall::Found,
}
