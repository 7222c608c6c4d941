//! `wedgeprobe report`: one snapshot of "what is this process waiting on right now", as text
//! or JSON (schema in the README; fields are only ever added).

use std::io::Write;

use serde::Serialize;

use crate::{
    model::{Model, ThreadView},
    verdict::{Evaluation, Verdict, describe::fmt_duration, host_stall::UndecidedWhy},
};

#[derive(Serialize)]
pub struct Report {
    pub wedgeprobe_version: &'static str,
    /// `ebpf-only` until the CUPTI shim exists.
    pub mode: &'static str,
    pub observed_ms: f64,
    pub blocked_after_ms: f64,
    /// Launches had return probes: launch latencies are in `latency`.
    pub launch_returns: bool,
    /// How the uprobes were linked: `uprobe_multi`, or per-point links on a kernel without it
    /// (said in the text header: detaching then costs ~0.1 s a probe).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uprobe_links: Option<&'static str>,
    pub targets: Vec<TargetReport>,
    pub threads: Vec<ThreadView>,
    /// Per stream, the oldest kernel not yet completed (from shim journals), longest running
    /// first. Empty in eBPF-only mode.
    pub kernels: Vec<crate::model::kernels::StreamHead>,
    pub latency: Vec<LatencyReport>,
    /// Every loss, by name; all zero in a complete report.
    pub lost: std::collections::BTreeMap<&'static str, u64>,
    pub verdict: Verdict,
    /// Targets grouped into jobs (two or more ranks): each rank's state and the culprit.
    pub jobs: Vec<crate::verdict::job::JobView>,
    /// Processes with no GPU work and no kernel in flight whose threads spin on the host.
    pub host_stalls: Vec<crate::verdict::host_stall::HostStall>,
    /// Threads busy on the host since attach that the window could not decide (no journal
    /// to date their start, not yet busy for `stall_after`): `--window` was given, or the
    /// grown window reached its end.
    pub undecided: Vec<crate::verdict::host_stall::Undecided>,
    /// Threads that made the window grow and stopped being busy before they were a stall
    /// (the verdict is about the window's end; these say what it watched before).
    pub watched: Vec<crate::verdict::host_stall::Watched>,
    /// This node, and the clock pair taken when the report was built: `wedgeprobe merge`
    /// aligns reports of several nodes with it (times in `kernels`/`threads` are relative to
    /// this instant).
    pub host: String,
    pub clock: Clock,
}

#[derive(Clone, Copy, Debug, Serialize, serde::Deserialize)]
pub struct Clock {
    pub monotonic_ns: u64,
    pub realtime_ns: u64,
}

#[derive(Serialize)]
pub struct TargetReport {
    pub pid: u32,
    pub comm: String,
    pub libcuda: String,
    pub exited: bool,
    pub traced_entry_points: usize,
    /// How launches are traced by eBPF: "entry+return", "entry", or "off (…)" when the shim
    /// journal records them.
    pub launch_probes: &'static str,
    pub missing_symbols: Vec<&'static str>,
    pub kernel_names_known: usize,
    /// The process's shim journal; null when it runs without the shim.
    pub journal: Option<crate::model::JournalInfo>,
}

#[derive(Serialize)]
pub struct LatencyReport {
    pub api: &'static str,
    pub count: u64,
    pub errors: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// Python frames for the blocked threads, one read per process (only processes with such
/// threads are read). Spinning threads of host stalls have theirs from the verdict.
fn attach_python_stacks(threads: &mut [ThreadView]) {
    let mut pids: Vec<u32> = threads
        .iter()
        .filter(|t| t.blocked)
        .map(|t| t.pid)
        .collect();
    pids.sort_unstable();
    pids.dedup();
    for pid in pids {
        let Some(stacks) = crate::process::pystack::stacks(pid) else {
            continue;
        };
        for t in threads.iter_mut().filter(|t| t.pid == pid && t.blocked) {
            t.python_stack = stacks.get(&t.tid).cloned();
        }
    }
}

/// Per-target facts the model does not keep (from attach time).
pub struct TargetFacts {
    pub traced: usize,
    pub launch_probes: &'static str,
    pub missing: Vec<&'static str>,
}

impl Report {
    /// The report of `ev` (the pipeline's evaluation of `model` at `now_ns`), with the Python
    /// stacks of its blocked and spinning threads read now.
    pub fn build(
        model: &Model,
        facts: &std::collections::HashMap<u32, TargetFacts>,
        ev: &Evaluation,
        now_ns: u64,
        observed_ms: f64,
        blocked_after_ms: f64,
        launch_returns: bool,
    ) -> Self {
        let mut threads = ev.threads.clone();
        let host_stalls = ev.host_stalls.clone();
        let undecided = ev
            .undecided
            .iter()
            .filter(|u| u.busy_ms.is_some())
            .cloned()
            .collect();
        attach_python_stacks(&mut threads);
        let kernels = ev.kernels.clone();
        let verdict = ev.verdict.clone();
        let jobs = ev.jobs.clone();
        let with_journal = model.journal_read();
        let targets = model
            .procs
            .values()
            .map(|p| TargetReport {
                pid: p.target.pid,
                comm: p.target.comm.clone(),
                libcuda: p.target.libcuda.clone(),
                exited: p.exited,
                traced_entry_points: facts.get(&p.target.pid).map_or(0, |f| f.traced),
                launch_probes: facts.get(&p.target.pid).map_or("?", |f| f.launch_probes),
                missing_symbols: facts
                    .get(&p.target.pid)
                    .map_or(Vec::new(), |f| f.missing.clone()),
                kernel_names_known: model
                    .kernel_names
                    .keys()
                    .filter(|(pid, _)| *pid == p.target.pid)
                    .count(),
                journal: model.journals.get(&p.target.pid).cloned(),
            })
            .collect();
        let us = |ns: u64| ns as f64 / 1e3;
        let latency = model
            .finished_calls()
            .map(|(api, l)| LatencyReport {
                api,
                count: l.ns.len(),
                errors: l.errors,
                p50_us: us(l.ns.value_at_quantile(0.5)),
                p90_us: us(l.ns.value_at_quantile(0.9)),
                p99_us: us(l.ns.value_at_quantile(0.99)),
                max_us: us(l.ns.max()),
            })
            .collect();
        let lost = model.losses();
        Self {
            wedgeprobe_version: env!("CARGO_PKG_VERSION"),
            mode: if with_journal {
                "journal+ebpf"
            } else {
                "ebpf-only"
            },
            observed_ms,
            blocked_after_ms,
            launch_returns,
            uprobe_links: None,
            targets,
            threads,
            kernels,
            latency,
            lost,
            verdict,
            jobs,
            host_stalls,
            undecided,
            watched: Vec::new(),
            host: crate::sys::hostname(),
            clock: Clock {
                monotonic_ns: now_ns,
                realtime_ns: crate::sys::realtime_ns(),
            },
        }
    }

    pub fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        self.write_targets(out)?;
        self.write_threads(out)?;
        self.write_kernels(out)?;
        self.write_journals(out)?;
        self.write_latency(out)?;
        self.write_host_stalls(out)?;
        self.write_jobs(out)?;
        self.write_verdict(out)
    }

    /// The targets, one line each.
    fn write_targets(&self, out: &mut impl Write) -> std::io::Result<()> {
        if let Some(links) = self.uprobe_links.filter(|l| *l != "uprobe_multi") {
            writeln!(out, "uprobe links: {links}")?;
        }
        for t in &self.targets {
            writeln!(
                out,
                "process {} ({}){}  mode: {}  libcuda: {}  ({} entry points traced{}; launch probes: {})",
                t.pid,
                t.comm,
                if t.exited { " EXITED" } else { "" },
                self.mode,
                t.libcuda,
                t.traced_entry_points,
                if t.missing_symbols.is_empty() {
                    String::new()
                } else {
                    format!(", not exported: {}", t.missing_symbols.join(", "))
                },
                t.launch_probes
            )?;
            if let Some(why) = t.journal.as_ref().and_then(|j| j.launch_callbacks) {
                writeln!(
                    out,
                    "  its shim records launches through the driver's callbacks, not its launch \
                     hooks (the dearer path: BENCHMARKS.md, the recorder's price): {why}"
                )?;
            }
            if t.journal.as_ref().is_some_and(|j| j.attached_late) {
                writeln!(
                    out,
                    "  its shim was put in while it ran (wedgeprobe attach): launches from before \
                     are not in its journal; what a stream had queued then shows as one record, \
                     \"(work queued before wedgeprobe attached)\""
                )?;
            }
        }
        Ok(())
    }

    /// Threads inside driver calls, with their Python frames.
    fn write_threads(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(out)?;
        if self.threads.is_empty() {
            writeln!(out, "no thread is inside a CUDA driver call")?;
        } else {
            writeln!(out, "threads inside CUDA driver calls:")?;
            writeln!(
                out,
                "  {:>7} {:>7} {:<16} {:<26} {:>10} {:>9} {:<8} details",
                "pid", "tid", "thread", "api", "in call", "yield/s", "stream"
            )?;
            for t in &self.threads {
                let mut details = Vec::new();
                if t.blocked {
                    details.push("BLOCKED".to_string());
                }
                if let Some(k) = &t.kernel {
                    details.push(format!("kernel {k}"));
                } else if let Some(h) = &t.handle {
                    details.push(format!("handle {h}"));
                }
                if let (Some(g), Some(b)) = (t.grid, t.block) {
                    details.push(format!(
                        "grid {}x{}x{} block {}x{}x{}",
                        g[0], g[1], g[2], b[0], b[1], b[2]
                    ));
                }
                if t.in_call_at_least {
                    details.push("already inside at attach (stack scan)".into());
                }
                writeln!(
                    out,
                    "  {:>7} {:>7} {:<16} {:<26} {:>10} {:>9} {:<8} {}",
                    t.pid,
                    t.tid,
                    t.name,
                    t.api,
                    format!(
                        "{}{}",
                        if t.in_call_at_least { "≥" } else { "" },
                        fmt_duration(t.in_call_ms)
                    ),
                    // Not measured yet (a call found by scan, watched < 0.1 s) is "-", never 0.
                    if t.sched_yield_measured {
                        format!("{:.0}", t.sched_yield_per_s)
                    } else {
                        "-".into()
                    },
                    t.stream.as_deref().unwrap_or("-"),
                    details.join(", ")
                )?;
                if let Some(py) = &t.python_stack {
                    writeln!(
                        out,
                        "                  python: {} ← {}",
                        t.api,
                        py.join(" ← ")
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Each stream's oldest unfinished kernel, its candidates and graph nodes.
    fn write_kernels(&self, out: &mut impl Write) -> std::io::Result<()> {
        if !self.kernels.is_empty() {
            writeln!(out, "\noldest unfinished kernel per stream (shim journal):")?;
            for k in &self.kernels {
                writeln!(
                    out,
                    "  {}pid {} dev {} stream {}: {}  running ~{}  ({} queued behind; launched {} ago by tid {}; grid {}x{}x{} block {}x{}x{}; correlation {})",
                    k.judgement.as_ref().map_or(String::new(), |j| format!(
                        "[{}] ",
                        j.state.as_str().to_uppercase()
                    )),
                    k.pid,
                    k.device,
                    k.stream,
                    k.kernel,
                    fmt_duration(k.running_ms),
                    k.queued_behind,
                    fmt_duration(k.launched_ms_ago),
                    k.tid,
                    k.grid[0],
                    k.grid[1],
                    k.grid[2],
                    k.block[0],
                    k.block[1],
                    k.block[2],
                    k.correlation
                )?;
                if let Some(d) = &k.kernel_demangled {
                    writeln!(out, "      demangled: {d}")?;
                }
                if !k.exact {
                    writeln!(
                        out,
                        "      not named exactly (stream marks): the first unfinished of these, in launch order, is it:"
                    )?;
                    for (i, c) in k.candidates.iter().enumerate() {
                        writeln!(
                            out,
                            "        [{}] {}  (grid {}x{}x{} block {}x{}x{}; correlation {}; launched {} ago)",
                            i + 1,
                            c.kernel_demangled.as_deref().unwrap_or(&c.kernel),
                            c.grid[0],
                            c.grid[1],
                            c.grid[2],
                            c.block[0],
                            c.block[1],
                            c.block[2],
                            c.correlation,
                            fmt_duration(c.launched_ms_ago)
                        )?;
                    }
                    if k.candidates_total > k.candidates.len() {
                        writeln!(
                            out,
                            "        … {} more",
                            k.candidates_total - k.candidates.len()
                        )?;
                    }
                }
                if let Some(g) = &k.graph
                    && let Some(m) = &g.marks
                {
                    writeln!(
                        out,
                        "      graph launch: exec {} (graph {}), {} of {} kernel nodes done by the graph marks (one mark per ≤ {} kernel nodes){}:",
                        g.exec_id,
                        g.graph_id.map_or("?".into(), |id| id.to_string()),
                        g.completed,
                        g.kernel_nodes,
                        m.kernels_per_mark,
                        m.last_progress_ms_ago.map_or(String::new(), |ago| format!(
                            ", last progress ~{} ago",
                            fmt_duration(ago)
                        ))
                    )?;
                    for b in &m.branches {
                        writeln!(
                            out,
                            "        branch {}: {} of {} done; {}:",
                            b.branch,
                            b.done,
                            b.kernel_nodes,
                            if b.exact {
                                "stuck or running"
                            } else {
                                "stuck or running: the first of these not completed"
                            }
                        )?;
                        for n in &b.candidates {
                            writeln!(
                                out,
                                "          #{} {} grid {}x{}x{} block {}x{}x{} (node {})",
                                n.position,
                                n.kernel_demangled.as_deref().unwrap_or(&n.kernel),
                                n.grid[0],
                                n.grid[1],
                                n.grid[2],
                                n.block[0],
                                n.block[1],
                                n.block[2],
                                n.node_id
                            )?;
                        }
                    }
                } else if let Some(g) = &k.graph
                    && !g.node_progress
                {
                    writeln!(
                        out,
                        "      graph launch: exec {} (graph {}), {} kernel nodes; node progress is not recorded with stream marks (WEDGEPROBE_GRAPH_MARK_EVERY=4 or WEDGEPROBE_SHIM_RECORD=exact records it); its kernel nodes:",
                        g.exec_id,
                        g.graph_id.map_or("?".into(), |id| id.to_string()),
                        g.kernel_nodes
                    )?;
                } else if let Some(g) = &k.graph {
                    writeln!(
                        out,
                        "      graph launch: exec {} (graph {}), {} of {} kernel nodes completed; not completed:",
                        g.exec_id,
                        g.graph_id.map_or("?".into(), |id| id.to_string()),
                        g.completed,
                        g.kernel_nodes
                    )?;
                }
                if let Some(g) = &k.graph
                    && g.marks.is_none()
                {
                    for n in &g.not_completed {
                        writeln!(
                            out,
                            "        node {}: {}",
                            n.node_id,
                            n.kernel_demangled.as_deref().unwrap_or(&n.kernel)
                        )?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Journals that are not recording.
    fn write_journals(&self, out: &mut impl Write) -> std::io::Result<()> {
        for t in &self.targets {
            if let Some(j) = &t.journal
                && j.status != crate::model::JournalStatus::Recording
            {
                writeln!(out, "\njournal of pid {}: {}", t.pid, j.status)?;
            }
        }
        Ok(())
    }

    /// Finished calls' latency, and what was lost.
    fn write_latency(&self, out: &mut impl Write) -> std::io::Result<()> {
        if !self.latency.is_empty() {
            writeln!(out)?;
            writeln!(
                out,
                "finished calls over {}:",
                fmt_duration(self.observed_ms)
            )?;
            writeln!(
                out,
                "  {:<26} {:>9} {:>10} {:>10} {:>10} {:>10}",
                "api", "count", "p50 µs", "p90 µs", "p99 µs", "max µs"
            )?;
            for l in &self.latency {
                writeln!(
                    out,
                    "  {:<26} {:>9} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                    l.api, l.count, l.p50_us, l.p90_us, l.p99_us, l.max_us
                )?;
            }
        }
        let lost: Vec<String> = self
            .lost
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if !lost.is_empty() {
            writeln!(out, "\nlost or incomplete: {}", lost.join(" "))?;
        }
        Ok(())
    }

    /// Host stalls with each spinning thread's stacks.
    fn write_host_stalls(&self, out: &mut impl Write) -> std::io::Result<()> {
        for s in &self.host_stalls {
            let gpu = match s.gpu_evidence {
                crate::verdict::host_stall::GpuEvidence::Journal => {
                    format!("no GPU work for {}", fmt_duration(s.no_gpu_progress_ms))
                }
                crate::verdict::host_stall::GpuEvidence::Attach => format!(
                    "no driver call returned in the {} watched (no journal)",
                    fmt_duration(s.no_gpu_progress_ms)
                ),
            };
            writeln!(out, "\nhost stall: pid {} ({}), {gpu}:", s.pid, s.comm)?;
            for t in &s.threads {
                writeln!(
                    out,
                    "  tid {} ({}) {} for {}{}",
                    t.tid,
                    t.name,
                    t.cpu_words(),
                    if t.busy_since_attach { "≥ " } else { "" },
                    fmt_duration(t.busy_ms)
                )?;
                for f in &t.native_stack {
                    writeln!(out, "      {f}")?;
                }
                if let Some(py) = &t.python_stack {
                    writeln!(out, "      python: {}", py.join(" ← "))?;
                }
            }
        }
        for w in &self.watched {
            writeln!(
                out,
                "\nwatched: pid {} tid {} ({}) was busy on the host for ≥ {} (since before \
                 attach; no driver call returned, no shim journal: what it ran is not known) and \
                 stopped {} into the window: not a stall now",
                w.pid,
                w.tid,
                w.name,
                fmt_duration(w.busy_ms),
                fmt_duration(w.stopped_after_ms)
            )?;
        }
        for u in &self.undecided {
            let why = if u.why == UndecidedWhy::StackNotWatchedEnough {
                "its stack was not sampled long enough to tell a spin from work (report without \
                 --window, or a longer one, decides it)"
            } else {
                "no driver call returning; without a shim journal its start is not known (report \
                 without --window, or with one ≥ --stall-after, decides it)"
            };
            writeln!(
                out,
                "\nundecided: pid {} tid {} ({}) busy on the host for ≥ {}; {why}",
                u.pid,
                u.tid,
                u.name,
                fmt_duration(u.busy_ms.unwrap_or(0.0))
            )?;
        }
        Ok(())
    }

    /// Jobs, their ranks and culprit.
    fn write_jobs(&self, out: &mut impl Write) -> std::io::Result<()> {
        for j in &self.jobs {
            writeln!(out, "\njob {} ({} ranks):", j.job, j.ranks.len())?;
            for r in &j.ranks {
                writeln!(
                    out,
                    "  rank {:>3} pid {:>7}  {:<22} {}{}",
                    r.rank,
                    r.pid,
                    r.state.as_str(),
                    r.kernel.as_deref().unwrap_or("-"),
                    r.running_ms
                        .map_or(String::new(), |ms| format!("  ~{}", fmt_duration(ms)))
                )?;
            }
            if let Some(c) = &j.culprit {
                writeln!(out, "  CULPRIT: {}", c.summary)?;
            }
        }
        Ok(())
    }

    /// The verdict, last.
    fn write_verdict(&self, out: &mut impl Write) -> std::io::Result<()> {
        writeln!(
            out,
            "\nverdict: {}: {}",
            self.verdict.kind.as_str(),
            self.verdict.summary
        )
        .map(|_| ())
    }
}
