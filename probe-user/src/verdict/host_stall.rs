//! Stalls with no GPU kernel: ranks that busy-poll each other on the host ("waiting for
//! ranks: 0/1821 ready", 105% CPU, for 30 minutes) never enter a driver call and have no
//! kernel in flight, so neither the driver-call verdicts nor the kernel verdict see them.
//!
//! A process is in a host stall when its GPU work has not moved (no launch, completion, mark
//! or driver call returning) for `stall_after`, no kernel of it is in flight, and a thread has
//! used ≥ 80% of a core for that long. The report shows each such thread's CPU use, its latest
//! on-CPU stack (sampled by the eBPF perf sampler, return addresses found by scanning,
//! symbolized with blazesym) and its Python stack (`report`).
//!
//! A stall that began before attach — someone runs `report` at 3 a.m. on a boot deadlock — is
//! found in the first window: the shim journal dates the last GPU work (possibly long before
//! attach), and a thread's CPU time over its whole life, read at the first reading, dates its
//! spin. Without a journal nothing is known of the GPU before attach: a process whose threads
//! have spun since before attach with no driver call returning in view is reported, saying
//! that (`gpu_evidence`: `attach`).

use std::collections::HashMap;

use serde::Serialize;

use crate::{model::Model, process::stackscan};

/// Where a stall's `no_gpu_progress_ms` counts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuEvidence {
    /// The shim's journal: every launch, completion and synchronize, before attach included.
    Journal,
    /// No journal: attach; the GPU work before it is not known.
    Attach,
}

#[derive(Clone, Debug, Serialize)]
pub struct HostStall {
    pub pid: u32,
    pub comm: String,
    /// Since the last sign of GPU work (without a journal: since attach at most).
    pub no_gpu_progress_ms: f64,
    pub gpu_evidence: GpuEvidence,
    pub threads: Vec<SpinningThread>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SpinningThread {
    pub tid: u32,
    pub name: String,
    pub cpu_pct: f64,
    pub busy_ms: f64,
    /// Innermost first: `function+0xoff (module)`, or the address when unknown.
    pub native_stack: Vec<String>,
    /// Innermost first, `function (file:line)`; null when the process is not CPython or its
    /// interpreter state could not be read.
    pub python_stack: Option<Vec<String>>,
}

/// Symbolized stacks by (pid, tid, sample time), Python stacks by (pid, newest sample time):
/// `find` runs every tick while a stall lasts (watch, the daemon), and a sample changes at
/// most a few times a second; validating return addresses reads the target, symbolizing
/// parses its ELF files and a Python stack walks its interpreter's frames, so each sample is
/// done once. Owned by the verdict pipeline.
#[derive(Default)]
pub struct StackCache {
    native: HashMap<(u32, u32, u64), Vec<String>>,
    python: HashMap<(u32, u64), Option<HashMap<u32, Vec<String>>>>,
}

impl StackCache {
    fn python(&mut self, pid: u32, at: u64) -> Option<&HashMap<u32, Vec<String>>> {
        if self.python.len() >= 256 && !self.python.contains_key(&(pid, at)) {
            self.python.clear();
        }
        self.python
            .entry((pid, at))
            .or_insert_with(|| crate::process::pystack::stacks(pid))
            .as_ref()
    }

    fn get_or_make(
        &mut self,
        key: (u32, u32, u64),
        make: impl FnOnce() -> Vec<String>,
    ) -> Vec<String> {
        if let Some(v) = self.native.get(&key) {
            return v.clone();
        }
        let v = make();
        if self.native.len() >= 4096 {
            self.native.clear();
        }
        self.native.insert(key, v.clone());
        v
    }
}

/// Processes in a host stall now: GPU work still for `after_ns`, and threads busy that long.
pub fn find(model: &Model, now_ns: u64, after_ns: u64, stacks: &mut StackCache) -> Vec<HostStall> {
    let after = after_ns;
    let mut out = Vec::new();
    for (&pid, p) in &model.procs {
        // Without a journal, quiet since attach is all that can be known of the GPU; the
        // threads' spin (dated from their life at the first reading) carries the duration.
        let quiet = now_ns.saturating_sub(p.last_progress_ns) >= after
            || (!p.progress_known_before_attach && p.last_progress_ns <= p.attached_ns);
        if p.exited || !quiet {
            continue;
        }
        if model.kernels.get(&pid).is_some_and(|k| !k.is_empty()) {
            continue;
        }
        let mut threads: Vec<SpinningThread> = p
            .threads
            .iter()
            .filter(|(_, t)| {
                t.busy_since_ns != 0 && now_ns.saturating_sub(t.busy_since_ns) >= after
            })
            .map(|(&tid, t)| SpinningThread {
                tid,
                name: t.name.clone(),
                cpu_pct: (t.cpu_pct * 10.0).round() / 10.0,
                busy_ms: now_ns.saturating_sub(t.busy_since_ns) as f64 / 1e6,
                native_stack: t
                    .last_sample
                    .as_ref()
                    .map(|(at, ip, words)| {
                        stacks.get_or_make((pid, tid, *at), || {
                            let frames: Vec<u64> = words
                                .iter()
                                .copied()
                                .filter(|&a| stackscan::is_return_address(&p.code, a))
                                .take(12)
                                .collect();
                            symbolize(pid, *ip, &frames)
                        })
                    })
                    .unwrap_or_default(),
                python_stack: None,
            })
            .collect();
        if !threads.is_empty() {
            // The Python frames say where a CPython spinner is in the user's code (the native
            // frames of the interpreter loop do not): read once per process and sample.
            let newest = p
                .threads
                .values()
                .filter_map(|t| t.last_sample.as_ref().map(|(at, ..)| *at))
                .max()
                .unwrap_or(0);
            if let Some(py) = stacks.python(pid, newest) {
                for t in &mut threads {
                    t.python_stack = py.get(&t.tid).cloned();
                }
            }
            out.push(HostStall {
                pid,
                comm: p.target.comm.clone(),
                no_gpu_progress_ms: now_ns.saturating_sub(p.last_progress_ns) as f64 / 1e6,
                gpu_evidence: if p.progress_known_before_attach {
                    GpuEvidence::Journal
                } else {
                    GpuEvidence::Attach
                },
                threads,
            });
        }
    }
    out
}

/// `ip` and the return addresses as `symbol+0xoff (module)`, through the target's own maps.
fn symbolize(pid: u32, ip: u64, frames: &[u64]) -> Vec<String> {
    use blazesym::symbolize::{
        Input, Symbolized, Symbolizer,
        source::{Process, Source},
    };
    let addrs: Vec<u64> = std::iter::once(ip).chain(frames.iter().copied()).collect();
    let src = Source::Process(Process::new(pid.into()));
    let symbolizer = Symbolizer::new();
    match symbolizer.symbolize(&src, Input::AbsAddr(&addrs)) {
        Ok(syms) => syms
            .iter()
            .zip(&addrs)
            .map(|(s, a)| match s {
                Symbolized::Sym(sym) => {
                    let module = sym
                        .module
                        .as_ref()
                        .and_then(|m| {
                            std::path::Path::new(m)
                                .file_name()
                                .map(|f| f.to_string_lossy().to_string())
                        })
                        .unwrap_or_default();
                    format!("{}+{:#x} ({module})", sym.name, sym.offset)
                }
                Symbolized::Unknown(_) => format!("{a:#x}"),
            })
            .collect(),
        Err(_) => addrs.iter().map(|a| format!("{a:#x}")).collect(),
    }
}

/// One line for a verdict summary.
pub fn describe(s: &HostStall) -> String {
    let threads: Vec<String> = s
        .threads
        .iter()
        .map(|t| {
            // The Python frames when there are any (the interpreter loop's native frames say
            // nothing of the user's code), else the native ones.
            let top: Vec<&str> = match &t.python_stack {
                Some(py) if !py.is_empty() => py.iter().take(3).map(String::as_str).collect(),
                _ => t
                    .native_stack
                    .iter()
                    .take(3)
                    .map(|f| f.split('+').next().unwrap_or(f))
                    .collect(),
            };
            format!(
                "tid {} ({}) {:.0}% CPU for {:.0} s in {}",
                t.tid,
                t.name,
                t.cpu_pct,
                t.busy_ms / 1e3,
                if top.is_empty() {
                    "?".to_string()
                } else {
                    top.join(" ← ")
                }
            )
        })
        .collect();
    let gpu = if s.gpu_evidence == GpuEvidence::Journal {
        format!(
            "has had no GPU work for {:.0} s and no kernel in flight",
            s.no_gpu_progress_ms / 1e3
        )
    } else {
        format!(
            "returned from no driver call in the {:.1} s watched (no journal: its GPU work \
             before attach and kernels in flight are not known)",
            s.no_gpu_progress_ms / 1e3
        )
    };
    format!(
        "host stall: pid {} ({}) {gpu} while {}",
        s.pid,
        s.comm,
        threads.join("; ")
    )
}
