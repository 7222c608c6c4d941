//! Stalls with no GPU kernel: ranks that busy-poll each other on the host ("waiting for
//! ranks: 0/1821 ready", 105% CPU, for 30 minutes) never enter a driver call and have no
//! kernel in flight, so neither the driver-call verdicts nor the kernel verdict see them.
//!
//! A process is in a host stall when its GPU work has not moved (no launch, completion, mark
//! or driver call returning) for `stall_after`, no kernel of it is in flight, and a thread has
//! wanted ≥ 80% of a core (on one, or runnable and waiting for one: `model::CpuTime`) for
//! that long — or, when the shim's journal dates the GPU's silence, all the time it was
//! watched (the silence is then the stall's duration). The report shows each such thread's
//! CPU use, its latest on-CPU stack (sampled by the eBPF perf sampler, return addresses found
//! by scanning, symbolized with blazesym) and its Python stack (`report`).
//!
//! Busy is not enough: a serving process that builds its model or loads a checkpoint also
//! keeps a core at 100% with no GPU work for tens of seconds (the H200 healthy run: a false
//! `host_stall` at startup, "no GPU work for 11 s" while transformers built the model). A
//! busy-poll makes no progress: its stack stays the same. So a thread counts only once its
//! stack — the Python frames' functions and files when it has them (line numbers move inside a
//! loop; a sample may catch the loop itself or a callee, so one stack beginning the other is
//! the same loop), else its native frames past the innermost two — has read the same for
//! `SPIN_CONFIRM` (`same_stack_ms` in JSON); model building walks from function to function
//! in that time (`build ← init_mlp`, then `build ← init_norm`). A long computation inside one
//! function cannot be told from a spin this way. `report`'s default 1 s window spans it.
//!
//! A stall that began before attach — someone runs `report` at 3 a.m. on a boot deadlock, or
//! on a server that hung after hours of serving — is found in the first window where the shim
//! is in the process: its journal dates the last GPU work (possibly long before attach), and
//! its once-a-second readings of each CUDA thread's CPU clock date the spin (`journal::cpu` in
//! the shim). Without the shim nothing dates it: /proc keeps a thread's CPU totals, not when
//! it last slept, and a life's average is an upper bound, not a start (taken for one, it made
//! a serving thread 1 s into tokenizing "100% CPU for 93 s", a false `host_stall` on the
//! H200; and it reported a spin after 25 s of healthy serving healthy). Such a thread — busy
//! since the first reading, no driver call returning, no journal — is `Undecided`: watching
//! decides it, and `report` keeps watching (up to `stall_after`) while one is (`gpu_evidence`:
//! `attach` says what is not known of the GPU).

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
    /// On a core over the last second (100 = one core).
    pub cpu_pct: f64,
    /// Runnable but waiting for a core over the last second: a spinner gets less than a
    /// core where cores are short, and wants one all the same.
    pub waiting_for_cpu_pct: f64,
    pub busy_ms: f64,
    /// Busy since the first CPU reading with nothing dating it earlier (no shim reading):
    /// `busy_ms` is a lower bound, the spin began at attach or before.
    pub busy_since_attach: bool,
    /// Innermost first: `function+0xoff (module)`, or the address when unknown.
    pub native_stack: Vec<String>,
    /// How long its stack has read the same (≥ `SPIN_CONFIRM_NS`): a busy-poll, not work.
    pub same_stack_ms: f64,
    /// Innermost first, `function (file:line)`; null when the process is not CPython or its
    /// interpreter state could not be read.
    pub python_stack: Option<Vec<String>>,
}

impl SpinningThread {
    /// "99% CPU", or "62% CPU + 36% waiting for a core" where the wait is worth saying.
    pub fn cpu_words(&self) -> String {
        if self.waiting_for_cpu_pct >= 5.0 {
            format!(
                "{:.0}% CPU + {:.0}% waiting for a core",
                self.cpu_pct, self.waiting_for_cpu_pct
            )
        } else {
            format!("{:.0}% CPU", self.cpu_pct)
        }
    }
}

/// A thread that may be spinning that the evidence so far does not decide (`why`). Watching
/// longer decides it: busy on the same stack long enough, or not.
#[derive(Clone, Debug, Serialize)]
pub struct Undecided {
    pub pid: u32,
    pub tid: u32,
    pub name: String,
    /// Busy for at least this long (`None`: only one CPU reading yet).
    pub busy_ms: Option<f64>,
    pub why: UndecidedWhy,
}

/// A thread that made `report`'s window grow (busy on the host since attach, its start not
/// known) and stopped being busy before it could be called a stall: the answer at the
/// window's end is about *now*, and without this the report said `healthy` with no word of
/// the seconds of spinning it had watched.
#[derive(Clone, Debug, Serialize)]
pub struct Watched {
    pub pid: u32,
    pub tid: u32,
    pub name: String,
    /// Busy on the host for at least this long (from before attach) when last seen busy.
    pub busy_ms: f64,
    /// Into the report's window when it was last seen busy: it stopped after that.
    pub stopped_after_ms: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UndecidedWhy {
    /// One CPU reading only: whether it is busy is not known.
    OneReading,
    /// Busy since the first reading in a process that has returned from no driver call since
    /// attach and has no journal (nor a shim reading of this thread): its start is not known.
    StartUnknown,
    /// Busy for long enough, its stack compared over less than `SPIN_CONFIRM`: whether it
    /// spins or works is not known. The CI run of 2026-12-06: a spinner dated by the journal,
    /// its first samples late on a loaded machine, had its stack compared over under 0.8 s
    /// when `report`'s 1 s window ended, and the report answered `healthy`.
    StackNotWatchedEnough,
}

/// What `find` saw: the stalls, and the threads it could not decide yet.
#[derive(Default)]
pub struct Found {
    pub stalls: Vec<HostStall>,
    pub undecided: Vec<Undecided>,
}

/// How long after attach a thread on a core has its stack compared before a second CPU
/// reading (once a second) says whether it is busy.
const UNCONFIRMED_NS: u64 = 2_000_000_000;

/// A process's Python stacks by thread (`process::pystack::stacks`).
type PythonStacks = HashMap<u32, Vec<String>>;

/// How long a busy thread's stack must read the same before it counts as spinning (above).
pub const SPIN_CONFIRM_NS: u64 = 800_000_000;

/// Symbolized stacks by (pid, tid, sample time), Python stacks by (pid, evaluation time):
/// `find` runs every tick while a stall lasts (watch, the daemon), and a sample changes at
/// most a few times a second; validating return addresses reads the target and symbolizing
/// parses its ELF files, so each sample is done once; a Python stack walks its interpreter's
/// frames, once per process and evaluation (each is a reading: `find`). Owned by the verdict
/// pipeline.
#[derive(Default)]
pub struct StackCache {
    native: HashMap<(u32, u32, u64), Vec<String>>,
    python: HashMap<(u32, u64), Option<PythonStacks>>,
    /// Per busy thread: its stack's signature, the first sample that showed it, the latest
    /// sample compared (`compare_sample`).
    same_since: HashMap<(u32, u32), (Signature, u64, u64)>,
    /// Per busy thread: the first sample its stack was compared from (how long the evidence
    /// has watched it, changes or not).
    watched_from: HashMap<(u32, u32), u64>,
}

impl StackCache {
    fn python(&mut self, pid: u32, at: u64) -> Option<&PythonStacks> {
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
/// `in_calls`: the threads inside a driver call now (`Model::threads_in_calls`): they wait
/// for the driver or the GPU, which the driver-call verdicts judge, and are never spinners
/// here (the H200 soak: a synchronize behind a 3 s kernel, found inside
/// `cuCtxSynchronize_v2` by stack scan, was "host_stall … 100% CPU for 164 s" without the
/// shim).
pub fn find(
    model: &Model,
    now_ns: u64,
    after_ns: u64,
    in_calls: &std::collections::HashSet<(u32, u32)>,
    stacks: &mut StackCache,
) -> Found {
    let after = after_ns;
    let mut out = Vec::new();
    let mut undecided = Vec::new();
    let mut touched = std::collections::HashSet::new();
    for (&pid, p) in &model.procs {
        // Without a journal, quiet since attach is all that can be known of the GPU; the
        // threads' spin (dated from the first reading: `Undecided`) carries the duration.
        let quiet = now_ns.saturating_sub(p.last_progress_ns) >= after
            || (!p.progress_known_before_attach && p.last_progress_ns <= p.attached_ns);
        if p.exited || !quiet {
            continue;
        }
        if model.kernels.get(&pid).is_some_and(|k| !k.is_empty()) {
            continue;
        }
        // Stacks are compared from the first CPU reading on, so that the second reading, a
        // second later, which confirms the thread is still busy, finds its stack already
        // compared for that second: `report`'s 1 s window finds a stall the shim dated.
        let busy_for = |t: &crate::model::ThreadState| {
            let since = match (t.busy_since_ns, t.busy_from_start_ns) {
                (0, Some(start)) => start,
                (since, _) => since,
            };
            (since != 0).then(|| now_ns.saturating_sub(since))
        };
        // With a journal the GPU's silence is dated exactly (possibly long before attach).
        // Where the shim also read the thread's CPU clock, the spin is dated by it and must
        // itself last `stall_after` (`busy_for`): the silence is not the spin's duration (the
        // H200 soak: an idle gap then 1 s of tokenizing was "host_stall … no GPU work for
        // 11 s"), and a life's average does not date it either (a rank that spent seconds in
        // CUDA initialisation before spinning was "busy for 1 s" and reported healthy 22 s
        // in). A thread the shim did not read (it never called CUDA, an older shim) is
        // judged by the silence: on a core all the time watched is enough.
        let quiet_known =
            p.progress_known_before_attach && now_ns.saturating_sub(p.last_progress_ns) >= after;
        // Reported: confirmed busy by a second CPU reading, for `stall_after` (dated by the
        // shim, the thread's life, or the watch) or, judged by the silence, all the time
        // watched.
        let by_silence = |t: &crate::model::ThreadState| quiet_known && t.shim_busy_since.is_none();
        let reportable = |t: &crate::model::ThreadState| {
            t.busy_since_ns != 0 && (by_silence(t) || busy_for(t).is_some_and(|d| d >= after))
        };
        // Busy since the first reading with nothing to date it (no journal, no shim reading):
        // compared from then, so that when watching has made it `stall_after` (`report`'s
        // grown window) its stack has been compared all that time.
        let undated = |t: &crate::model::ThreadState| {
            t.busy_since_ns != 0
                && !p.progress_known_before_attach
                && t.shim_busy_since.is_none()
                && t.busy_since_ns <= t.first_cpu_ns
        };
        // Not decided yet: one CPU reading only (busy or not is not known), or busy since the
        // first reading with nothing to date the start (no journal, no shim reading) and not
        // yet for `stall_after`.
        for (&tid, t) in &p.threads {
            let Some((_, last)) = t.cpu_last else {
                continue;
            };
            if in_calls.contains(&(pid, tid)) || reportable(t) {
                continue;
            }
            let (busy_ms, why) = if t.busy_since_ns == 0 {
                if last != t.first_cpu_ns {
                    continue;
                }
                (None, UndecidedWhy::OneReading)
            } else if undated(t) {
                (
                    busy_for(t).map(|d| d as f64 / 1e6),
                    UndecidedWhy::StartUnknown,
                )
            } else {
                continue;
            };
            undecided.push(Undecided {
                pid,
                tid,
                name: t.name.clone(),
                busy_ms,
                why,
            });
        }
        // Stacks compared: those, and — until the second reading can have come — every thread
        // on a core since attach, so a spinner's count is already running when it comes. Not
        // later: a quiet process idling between requests would have its Python stacks read
        // every tick for threads that never turn out busy.
        let first_readings = now_ns.saturating_sub(p.attached_ns) < UNCONFIRMED_NS;
        // The shim dates a spin past the bound: compared from the first reading too.
        let shim_long = |t: &crate::model::ThreadState| {
            t.shim_busy_since
                .is_some_and(|x| x != 0 && now_ns.saturating_sub(x) >= after)
        };
        let tracked = |t: &crate::model::ThreadState| {
            busy_for(t).is_some_and(|d| d >= after)
                || undated(t)
                || ((by_silence(t) || shim_long(t))
                    && (t.busy_since_ns != 0 || first_readings)
                    && t.last_sample
                        .as_ref()
                        .is_some_and(|(at, ..)| *at >= p.attached_ns))
        };
        let mut threads: Vec<SpinningThread> = p
            .threads
            .iter()
            .filter(|(tid, t)| tracked(t) && !in_calls.contains(&(pid, **tid)))
            .map(|(&tid, t)| SpinningThread {
                tid,
                name: t.name.clone(),
                cpu_pct: (t.cpu_pct * 10.0).round() / 10.0,
                waiting_for_cpu_pct: (t.waiting_pct * 10.0).round() / 10.0,
                busy_ms: busy_for(t).unwrap_or(0) as f64 / 1e6,
                busy_since_attach: undated(t),
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
                same_stack_ms: 0.0,
                python_stack: None,
            })
            .collect();
        if !threads.is_empty() {
            // The Python frames say where a CPython spinner is in the user's code (the native
            // frames of the interpreter loop do not): read once per process and evaluation,
            // each read a reading of its own (at `now_ns`). Read once per native sample
            // instead (~5 a second here), a model build of six steps repeating every 0.46 s
            // was read in init_mlp at every reading for 0.8 s — its two calls of it are half a
            // cycle apart — and called a host stall (a_process_busy_building_its_model_is_not_a_
            // host_stall: 2 of 5 runs, 2026-12-07). Layers initialised alike repeat so too.
            if let Some(py) = stacks.python(pid, now_ns) {
                for t in &mut threads {
                    t.python_stack = py.get(&t.tid).cloned();
                }
            }
            let mut watched_ns: HashMap<u32, u64> = HashMap::new();
            for t in &mut threads {
                let sample_at = p
                    .threads
                    .get(&t.tid)
                    .and_then(|s| s.last_sample.as_ref().map(|(at, ..)| *at))
                    .unwrap_or(0);
                let sig = signature(t);
                // A Python stack was read now; a native one is the sample's.
                let reading_at = match &sig {
                    Some(Signature::Python(_)) => now_ns.max(sample_at),
                    _ => sample_at,
                };
                let old = stacks.same_since.remove(&(pid, t.tid));
                let compared = compare_sample(old, sig, reading_at);
                t.same_stack_ms = compared.2.saturating_sub(compared.1) as f64 / 1e6;
                // No sample yet (time 0): not watched at all.
                let watched = if compared.2 == 0 {
                    0
                } else {
                    let from = stacks
                        .watched_from
                        .entry((pid, t.tid))
                        .or_insert(compared.2);
                    compared.2.saturating_sub(*from)
                };
                watched_ns.insert(t.tid, watched);
                stacks.same_since.insert((pid, t.tid), compared);
                touched.insert((pid, t.tid));
            }
            // Reportable, its stack not the same for SPIN_CONFIRM: still undecided while the
            // evidence cannot say spin or work, so that `report`'s window watches on rather
            // than ending with neither a stall nor the thread named. Busy past the bound with
            // nothing dating it earlier (a sample caught the loop elsewhere): until
            // `stall_after`. Otherwise until its samples span SPIN_CONFIRM: a stack that
            // changed within that span is work (model building changes every 0.06-0.15 s).
            for t in &threads {
                if t.same_stack_ms * 1e6 >= SPIN_CONFIRM_NS as f64
                    || !p.threads.get(&t.tid).is_some_and(reportable)
                {
                    continue;
                }
                let why = if t.busy_since_attach {
                    UndecidedWhy::StartUnknown
                } else if watched_ns.get(&t.tid).copied().unwrap_or(0) < SPIN_CONFIRM_NS {
                    UndecidedWhy::StackNotWatchedEnough
                } else {
                    continue;
                };
                undecided.push(Undecided {
                    pid,
                    tid: t.tid,
                    name: t.name.clone(),
                    busy_ms: Some(t.busy_ms),
                    why,
                });
            }
            // Reported once a second reading confirms the thread busy, and its stack stayed.
            threads.retain(|t| {
                p.threads.get(&t.tid).is_some_and(reportable)
                    && t.same_stack_ms * 1e6 >= SPIN_CONFIRM_NS as f64
            });
        }
        if !threads.is_empty() {
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
    // Threads no longer busy (or gone) start over when they are busy again.
    stacks.same_since.retain(|k, _| touched.contains(k));
    stacks.watched_from.retain(|k, _| touched.contains(k));
    Found {
        stalls: out,
        undecided,
    }
}

/// What must stay the same for a thread to be spinning: its Python frames as `function
/// (file)` (no line numbers: they move inside the loop), else its native frames past the
/// innermost two (the loop's own calls into libc and the interpreter vary between samples).
#[derive(Clone, Debug, PartialEq)]
enum Signature {
    Python(Vec<String>),
    Native(Vec<String>),
}

/// `None`: no stack to compare this time.
fn signature(t: &SpinningThread) -> Option<Signature> {
    match &t.python_stack {
        // Outermost first: a loop's innermost frame is the loop itself or one of its callees,
        // turn by turn (`exists ← wait_for_peers_ready` one sample, `wait_for_peers_ready` the
        // next: seen making the rule flaky in CI); `same_since` takes one stack beginning the
        // other as the same loop. A model being built diverges instead (`build ← init_mlp`,
        // then `build ← init_norm`).
        Some(py) if !py.is_empty() => Some(Signature::Python(
            py.iter()
                .rev()
                .map(|f| match (f.find(" ("), f.rfind(':')) {
                    (Some(open), Some(colon)) if colon > open => f[..colon].to_string(),
                    _ => f.clone(),
                })
                .collect(),
        )),
        _ if t.native_stack.is_empty() => None,
        // Outermost first too: a loop that calls into libc at two depths (access(2), then
        // clock_gettime through the vDSO: one frame more) reads `main` one sample and
        // `wait_for_peers_ready ← main` the next past its innermost two; compared
        // innermost-first they differed, and a spinner of six sharing two cores never kept
        // its stack 0.8 s (the stall matrix test).
        _ => Some(Signature::Native(
            t.native_stack
                .iter()
                .skip(2)
                .rev()
                .map(|f| f.split('+').next().unwrap_or(f).to_string())
                .collect(),
        )),
    }
}

/// A thread's stack signature and since when it has read the same, after one more reading.
/// Only two stacks of the same kind that differ are a change. No stack this time, a Python
/// read that failed (the frames move while they are read), or the first Python read after
/// native ones: no evidence of a change (the first Python stack becomes the reference).
/// One comparison of a thread's stack: (signature, the first sample's time with it, the
/// latest sample's time). Only a sample not compared before moves it — a stack read from the
/// same sample again proves nothing, and "the same stack for N s" is the span of the samples
/// that showed it, not the time since the first one (every tick once re-compared the latest
/// sample, so a thread whose samples stopped coming read "the same" for as long as it was
/// busy: the H200 soak's "97% CPU for 309 s, the same stack for 289 s" may be that).
fn compare_sample(
    old: Option<(Signature, u64, u64)>,
    new: Option<Signature>,
    sample_at: u64,
) -> (Signature, u64, u64) {
    match old {
        Some(o) if sample_at <= o.2 => o,
        old => {
            let (sig, since) = same_since(old.map(|(s, since, _)| (s, since)), new, sample_at);
            (sig, since, sample_at)
        }
    }
}

fn same_since(
    old: Option<(Signature, u64)>,
    new: Option<Signature>,
    now_ns: u64,
) -> (Signature, u64) {
    match (old, new) {
        (None, Some(new)) => (new, now_ns),
        (None, None) => (Signature::Native(Vec::new()), now_ns),
        (Some((old, since)), None) => (old, since),
        (Some((old @ Signature::Python(_), since)), Some(Signature::Native(_))) => (old, since),
        (Some((Signature::Native(_), since)), Some(new @ Signature::Python(_))) => (new, since),
        (Some((old, since)), Some(new)) if old == new => (old, since),
        // Frames outermost first: the same loop when one is the other's beginning (the
        // sample caught the loop itself, or a callee); the longer one is kept.
        (Some((Signature::Python(old), since)), Some(Signature::Python(new)))
            if old.starts_with(&new) || new.starts_with(&old) =>
        {
            (
                Signature::Python(if new.len() > old.len() { new } else { old }),
                since,
            )
        }
        (Some((Signature::Native(old), since)), Some(Signature::Native(new)))
            if old.starts_with(&new) || new.starts_with(&old) =>
        {
            (
                Signature::Native(if new.len() > old.len() { new } else { old }),
                since,
            )
        }
        (Some(_), Some(new)) => (new, now_ns),
    }
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
                "tid {} ({}) {} for {}{:.0} s, the same stack for {:.1} s, in {}",
                t.tid,
                t.name,
                t.cpu_words(),
                if t.busy_since_attach { "≥ " } else { "" },
                t.busy_ms / 1e3,
                t.same_stack_ms / 1e3,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(native: &[&str], python: Option<&[&str]>) -> SpinningThread {
        SpinningThread {
            tid: 1,
            name: "t".into(),
            cpu_pct: 100.0,
            waiting_for_cpu_pct: 0.0,
            busy_ms: 20_000.0,
            busy_since_attach: false,
            native_stack: native.iter().map(|s| s.to_string()).collect(),
            same_stack_ms: 0.0,
            python_stack: python.map(|p| p.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn a_python_spin_keeps_its_signature_while_lines_and_native_frames_move() {
        // Two samples of the H200 handshake spinner: other lines, other interpreter frames.
        let a = thread(
            &[
                "fstatat+0xe (libc.so.6)",
                "0x633fbc",
                "__clock_gettime+0x1d (libc.so.6)",
            ],
            Some(&[
                "exists (<frozen genericpath>:19)",
                "wait_for_peers_ready (host_handshake.py:18)",
                "main (host_handshake.py:32)",
            ]),
        );
        let b = thread(
            &[
                "PyObject_Malloc+0x78 (python3.12)",
                "PyType_GenericAlloc+0x5c (python3.12)",
            ],
            Some(&[
                "exists (<frozen genericpath>:21)",
                "wait_for_peers_ready (host_handshake.py:20)",
                "main (host_handshake.py:32)",
            ]),
        );
        assert_eq!(signature(&a), signature(&b));
        let Some(Signature::Python(sig)) = signature(&a) else {
            panic!("a Python signature")
        };
        assert_eq!(
            sig,
            [
                "main (host_handshake.py",
                "wait_for_peers_ready (host_handshake.py",
                "exists (<frozen genericpath>"
            ]
        );
        // Model building: another function on top is another signature.
        let c = thread(
            &[],
            Some(&[
                "kaiming_uniform_ (torch/nn/init.py:456)",
                "reset_parameters (torch/nn/modules/linear.py:117)",
                "main (host_handshake.py:32)",
            ]),
        );
        assert_ne!(signature(&a), signature(&c));
    }

    #[test]
    fn only_two_different_stacks_of_one_kind_restart_the_count() {
        let py = |f: &str| Some(Signature::Python(vec![f.to_string()]));
        let native = |f: &str| Some(Signature::Native(vec![f.to_string()]));
        // A failed Python read (no stack, or only native frames) between two equal ones.
        let (s, t) = same_since(None, py("spin (a.py"), 10);
        let (s, t) = same_since(Some((s, t)), None, 20);
        let (s, t) = same_since(Some((s, t)), native("PyEval"), 30);
        let (s, t) = same_since(Some((s, t)), py("spin (a.py"), 40);
        assert_eq!(t, 10);
        // The first Python read after native ones keeps the count; another function resets it.
        let (s, t) = same_since(Some((Signature::Native(vec![]), 5)), Some(s), 50);
        assert_eq!(t, 5);
        let (_, t) = same_since(Some((s, t)), py("load (b.py"), 60);
        assert_eq!(t, 60);
        // The loop caught in itself, then in a callee: one stack begins the other.
        let frames =
            |f: &[&str]| Some(Signature::Python(f.iter().map(|x| x.to_string()).collect()));
        let (s, t) = same_since(None, frames(&["main (a.py", "wait (a.py"]), 100);
        let (s, t) = same_since(Some((s, t)), frames(&["main (a.py"]), 110);
        let (s, t) = same_since(Some((s, t)), frames(&["main (a.py", "wait (a.py"]), 120);
        assert_eq!(
            (t, &s),
            (100, &frames(&["main (a.py", "wait (a.py"]).unwrap())
        );
        // A model being built: layer after layer under `build`, not one inside the other.
        let (s, t) = same_since(
            None,
            frames(&["main (a.py", "build (a.py", "attn (m.py"]),
            200,
        );
        let (_, t) = same_since(
            Some((s, t)),
            frames(&["main (a.py", "build (a.py", "mlp (m.py"]),
            210,
        );
        assert_eq!(t, 210);
        let (s, t) = same_since(None, native("spin_wait"), 70);
        let (_, t) = same_since(Some((s, t)), native("load_weights"), 80);
        assert_eq!(t, 80);
    }

    #[test]
    fn a_native_spin_is_compared_past_its_innermost_two_frames() {
        let a = thread(
            &[
                "__clock_gettime+0x1d (libc.so.6)",
                "0x4011a0",
                "spin_wait+0x20 (w)",
                "main+0x40 (w)",
            ],
            None,
        );
        let b = thread(
            &[
                "sched_yield+0x9 (libc.so.6)",
                "0x4011c4",
                "spin_wait+0x20 (w)",
                "main+0x40 (w)",
            ],
            None,
        );
        assert_eq!(signature(&a), signature(&b));
        let c = thread(
            &[
                "memcpy+0x9 (libc.so.6)",
                "0x4011c4",
                "load_weights+0x80 (w)",
                "main+0x40 (w)",
            ],
            None,
        );
        assert_ne!(signature(&a), signature(&c));
    }

    /// A loop that calls into libc at two depths — access(2) one turn, clock_gettime through
    /// the vDSO (a frame deeper) the next — keeps one signature outermost-first: one stack is
    /// the other's beginning. Another function under `main` is another stack.
    #[test]
    fn a_native_loop_caught_at_two_depths_is_the_same_stack() {
        let at = |frames: &[&str]| signature(&thread(frames, None));
        let access = at(&[
            "access+0xb (libc.so.6)",
            "wait_for_peers_ready_libc+0x1e (w)",
            "main+0x40 (w)",
            "__libc_start_main+0x85 (libc.so.6)",
        ]);
        let clock = at(&[
            "__vdso_clock_gettime+0x4c ([vdso])",
            "clock_gettime+0x25 (libc.so.6)",
            "wait_for_peers_ready_libc+0x31 (w)",
            "main+0x40 (w)",
            "__libc_start_main+0x85 (libc.so.6)",
        ]);
        let (s, t) = same_since(None, access.clone(), 10);
        let (s, t) = same_since(Some((s, t)), clock, 20);
        let (s, t) = same_since(Some((s, t)), access, 30);
        assert_eq!(t, 10, "one loop: {s:?}");
        let other = at(&[
            "memcpy+0x9 (libc.so.6)",
            "init_layer+0x80 (w)",
            "load_weights+0x20 (w)",
            "main+0x40 (w)",
            "__libc_start_main+0x85 (libc.so.6)",
        ]);
        let (_, t) = same_since(Some((s, t)), other, 40);
        assert_eq!(t, 40, "another function under main");
    }

    /// The same sample compared again (every tick re-reads the latest one) does not make the
    /// stack "the same" for longer: only new samples do, and the span is theirs.
    #[test]
    fn a_stack_stays_the_same_only_across_new_samples() {
        let spin = || {
            signature(&thread(
                &["a (libc)", "0x1", "spin+0x1 (w)", "main (w)"],
                None,
            ))
        };
        let first = compare_sample(None, spin(), 1_000);
        assert_eq!((first.1, first.2), (1_000, 1_000));
        // Ticks later, no new sample: nothing moves.
        let again = compare_sample(Some(first.clone()), spin(), 1_000);
        assert_eq!((again.1, again.2), (1_000, 1_000));
        // A new sample with the same stack: the span is the samples'.
        let later = compare_sample(Some(again), spin(), 901_000);
        assert_eq!(later.2 - later.1, 900_000);
        // A different stack starts over at its sample.
        let other = signature(&thread(
            &["b (libc)", "0x2", "load+0x1 (w)", "main (w)"],
            None,
        ));
        let moved = compare_sample(Some(later), other, 950_000);
        assert_eq!((moved.1, moved.2), (950_000, 950_000));
    }
}
