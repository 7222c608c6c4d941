//! Loading the eBPF object and attaching it to target processes.
//!
//! Owns the `aya::Ebpf` (maps, programs, links). Uprobes are attached per target process
//! (`UProbeScope::OneProcess`), so other CUDA processes on the node pay nothing; the
//! sched_yield tracepoint and the on-CPU sampler are node-wide and filter by `WP_TARGETS` in
//! the kernel. Dropping the `Probe` detaches everything; a SIGKILLed wedgeprobe leaves
//! nothing behind either, because every link is an fd the kernel closes.

use std::{collections::HashMap, num::NonZeroU32, path::PathBuf};

use anyhow::{Context as _, anyhow};
use aya::{
    Ebpf,
    maps::HashMap as BpfHashMap,
    programs::{
        PerfEvent, TracePoint, UProbe,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
    },
};
use probe_common::{COOKIE_OPEN_ENDED, api, maps, programs};

use crate::{error::ProbeError, process::libcuda::LibCuda, process::target::Target, sys};

/// On-CPU sampling frequency per CPU. 49 Hz: a spinning thread is seen every ~20 ms, well
/// inside a 500 ms report window; a prime, so it does not beat with 100 Hz/1 kHz timers.
const SAMPLE_HZ: u64 = 49;

pub struct Probe {
    ebpf: Ebpf,
    /// The uprobe programs in use, in `Uprobes` order: the `uprobe.multi` ones where the
    /// kernel has `uprobe_multi` links with a process-wide pid filter (≥ 6.10), else the
    /// per-point ones.
    uprobes: Uprobes,
    /// Uprobe links per target pid, as (program name, link).
    links: HashMap<u32, Vec<(&'static str, UProbeLinkId)>>,
    /// The daemon's mode (`share_waits`): the non-launch entry points' probes are linked once
    /// per libcuda file (`FileId`) for every process, and a process is traced by its
    /// tgid's entry in `WP_TARGETS` alone.
    share_waits: bool,
    shared: HashMap<FileId, Vec<(&'static str, UProbeLinkId)>>,
    /// Resolved symbol tables per libcuda file. Keyed by the file, not its path: the path is
    /// `/proc/PID/root/…`, another for every process, so each attach parsed libcuda again
    /// and kept the result for ever (~0.8 KiB a process started; `cargo xtask bench churn`'s
    /// heap in use rose 12.7 → 14.3 MiB in an hour of 1,169 processes, heaptrack found it).
    libs: HashMap<FileId, LibCuda>,
}

/// A file as the kernel knows it: (device, inode, size, mtime in ns). Size and mtime tell a
/// new file on a reused inode (a driver upgraded, a container's layer replaced) from the old.
type FileId = (u64, u64, u64, i64);

/// The identity of `target`'s libcuda.
fn libcuda_file(target: &Target) -> Result<FileId, ProbeError> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(&target.libcuda_host_path).map_err(|e| {
        if target.alive() {
            ProbeError::Other(anyhow!("cannot stat {}: {e}", target.libcuda))
        } else {
            ProbeError::TargetExited { pid: target.pid }
        }
    })?;
    Ok((
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
    ))
}

/// What attaching to one target found.
#[derive(Clone, Debug)]
pub struct Attached {
    pub lib: LibCuda,
    /// How launches are traced: "entry+return", "entry", or "off" (the shim journal records
    /// them).
    pub launch_probes: &'static str,
}

/// The four uprobe programs of one kind (per-point links or `uprobe_multi` links).
#[derive(Clone, Copy, Debug)]
struct Uprobes {
    call_enter: &'static str,
    call_exit: &'static str,
    name_enter: &'static str,
    name_exit: &'static str,
    multi: bool,
}

impl Uprobes {
    /// `uprobe_multi` links where the kernel has them with a process-wide pid filter (the
    /// first implementations filtered one thread), unless `WEDGEPROBE_UPROBE_MULTI=0`.
    fn choose() -> Self {
        let wanted = std::env::var("WEDGEPROBE_UPROBE_MULTI").map_or(true, |v| v != "0");
        let multi = wanted
            && aya::sys::is_uprobe_multi_supported(
                aya::sys::UProbeMultiFeature::ProcessScopedPidFilter,
            )
            .unwrap_or(false);
        if multi {
            Self {
                call_enter: programs::CALL_ENTER_MULTI,
                call_exit: programs::CALL_EXIT_MULTI,
                name_enter: programs::NAME_ENTER_MULTI,
                name_exit: programs::NAME_EXIT_MULTI,
                multi,
            }
        } else {
            Self {
                call_enter: programs::CALL_ENTER,
                call_exit: programs::CALL_EXIT,
                name_enter: programs::NAME_ENTER,
                name_exit: programs::NAME_EXIT,
                multi,
            }
        }
    }

    fn all(&self) -> [&'static str; 4] {
        [
            self.call_enter,
            self.call_exit,
            self.name_enter,
            self.name_exit,
        ]
    }
}

impl Probe {
    /// How this probe's uprobes are linked, for headers and logs: `uprobe_multi` (one link per
    /// program and process, closed in one step) or per-point links (a kernel without
    /// `uprobe_multi`: each link's close costs the kernel a grace period, ~100 ms here).
    pub fn uprobe_links(&self) -> &'static str {
        if self.uprobes.multi {
            "uprobe_multi"
        } else {
            "per-point (no uprobe_multi in this kernel: detaching costs ~0.1 s a probe)"
        }
    }

    /// The daemon's mode, where the kernel has `uprobe_multi` (returns whether it is on): the
    /// probes of libcuda's synchronizes, copies and waits are linked once per libcuda file for
    /// every process that maps it, and the programs keep what `WP_TARGETS` lists — so a process
    /// comes and goes by one map entry (attaching and detaching it cost no link), and stopping
    /// closes a handful of links whatever the number of processes (issue 34). Per process
    /// remain only the launch and name-lookup probes of a process without a shim journal.
    /// The price: a process the daemon does not watch that maps the same libcuda takes those
    /// probes' traps too (no launch is probed that way: the shim records launches).
    pub fn share_waits(&mut self) -> bool {
        self.share_waits = self.uprobes.multi;
        self.share_waits
    }

    /// Checks privileges, loads the eBPF object and attaches the node-wide programs.
    pub fn load() -> Result<Self, ProbeError> {
        check_capabilities()?;
        sys::raise_memlock_limit();
        let mut ebpf = Ebpf::load(aya::include_bytes_aligned!(concat!(
            env!("OUT_DIR"),
            "/wedgeprobe"
        )))
        .map_err(|e| privilege_or(e.into(), "failed to load the eBPF object"))?;

        let uprobes = Uprobes::choose();
        for name in uprobes.all() {
            let prog: &mut UProbe = program(&mut ebpf, name)?
                .try_into()
                .map_err(anyhow::Error::from)?;
            prog.load()
                .map_err(|e| privilege_or(e.into(), "failed to load a uprobe program"))?;
        }

        ensure_tracefs()?;
        let yield_prog: &mut TracePoint = program(&mut ebpf, programs::SCHED_YIELD)?
            .try_into()
            .map_err(anyhow::Error::from)?;
        yield_prog
            .load()
            .map_err(|e| privilege_or(e.into(), "failed to load the tracepoint"))?;
        yield_prog
            .attach("syscalls", "sys_enter_sched_yield")
            .map_err(|e| {
                privilege_or(
                    e.into(),
                    "failed to attach to syscalls/sys_enter_sched_yield",
                )
            })?;

        let sampler: &mut PerfEvent = program(&mut ebpf, programs::ON_CPU)?
            .try_into()
            .map_err(anyhow::Error::from)?;
        sampler
            .load()
            .map_err(|e| privilege_or(e.into(), "failed to load the on-CPU sampler"))?;
        for cpu in sys::online_cpus() {
            sampler
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(SAMPLE_HZ),
                    false,
                )
                .map_err(|e| privilege_or(e.into(), "failed to open the on-CPU sampler"))?;
        }
        Ok(Self {
            ebpf,
            uprobes,
            links: HashMap::new(),
            share_waits: false,
            shared: HashMap::new(),
            libs: HashMap::new(),
        })
    }

    /// Starts tracing `target`: uprobes on its libcuda, and its tgid in `WP_TARGETS`.
    /// With `launch_returns` false, launches get an entry probe only (see
    /// `probe_common::CALL_OPEN_ENDED`): a uretprobe costs more than the entry probe itself
    /// (docs/measured-facts.md: +628 ns entry only, +1,743 ns with the return), and a launch
    /// happens thousands of times a second. Without `launch_returns` and with a shim journal
    /// in the target, launches get no probe at all: the shim already records every launch
    /// and which thread is inside one since when, and even the entry probe costs ~1.3 µs per
    /// launch on the H200 (BENCHMARKS.md) — most of what being attached costs.
    pub fn attach(
        &mut self,
        target: &Target,
        launch_returns: bool,
        journal_ok: bool,
    ) -> Result<Attached, ProbeError> {
        let skip_launches = !launch_returns && journal_ok;
        let path = target.libcuda_host_path.clone();
        let file = libcuda_file(target)?;
        let lib = match self.libs.get(&file) {
            Some(lib) => lib.clone(),
            None => {
                let lib = LibCuda::resolve(&path).map_err(|e| {
                    if target.alive() {
                        ProbeError::from(e)
                    } else {
                        ProbeError::TargetExited { pid: target.pid }
                    }
                })?;
                self.libs.insert(file, lib.clone());
                lib
            }
        };
        if lib.waits.is_empty() {
            return Err(ProbeError::NoSymbols {
                path: PathBuf::from(&target.libcuda),
            });
        }
        if target.pid == 0 {
            return Err(ProbeError::NoSuchProcess { pid: 0 });
        }
        // The target's tgid goes in first: a call that starts while we attach is then either
        // fully seen or (entry before the uprobe existed) counted as exit-without-entry.
        let mut targets: BpfHashMap<_, u32, u32> =
            BpfHashMap::try_from(self.ebpf.map_mut(maps::TARGETS).context("no targets map")?)
                .map_err(anyhow::Error::from)?;
        targets
            .insert(&target.pid, &1, 0)
            .context("failed to add the target to WP_TARGETS")?;

        let mut links = Vec::new();
        let pid = NonZeroU32::new(target.pid).ok_or(ProbeError::NoSuchProcess { pid: 0 })?;
        // With the journal recording launches, kernel names come from it too: the name-lookup
        // probes (entry + return on cuModuleGetFunction, cuLibraryGetKernel,
        // cuKernelGetFunction) are left off. The runtime may call cuKernelGetFunction on its
        // launch path, and a uprobe + uretprobe pair costs ~1.7 µs a call on the H200.
        let result = if self.share_waits {
            self.shared_waits(target, &lib).and_then(|()| {
                self.attach_points(
                    target,
                    &lib,
                    &mut links,
                    !skip_launches,
                    UProbeScope::OneProcess(pid),
                    |launch| (launch && !skip_launches).then_some(!launch_returns),
                )
            })
        } else {
            self.attach_points(
                target,
                &lib,
                &mut links,
                !skip_launches,
                UProbeScope::OneProcess(pid),
                |launch| {
                    if launch && skip_launches {
                        None
                    } else {
                        Some(launch && !launch_returns)
                    }
                },
            )
        };
        self.links.insert(target.pid, links);
        if let Err(e) = result {
            self.detach(target.pid);
            return Err(e);
        }
        if !target.alive() {
            self.detach(target.pid);
            return Err(ProbeError::TargetExited { pid: target.pid });
        }
        let launch_probes = match (skip_launches, launch_returns) {
            (true, _) => "off (the shim journal records launches)",
            (false, true) => "entry+return",
            (false, false) => "entry",
        };
        Ok(Attached { lib, launch_probes })
    }

    /// The shim of an attached process stopped recording (released CUPTI, or turned itself
    /// off): its launches were left to the journal, so put entry probes on them now (entry
    /// only, the cheap mode: whether a thread is still inside is inferred from its yields and
    /// stack samples). Returns how launches are traced now.
    pub fn attach_launch_probes(&mut self, target: &Target) -> Result<&'static str, ProbeError> {
        let lib = self
            .libs
            .get(&libcuda_file(target)?)
            .cloned()
            .context("libcuda of an attached process not resolved")?;
        let mut links = Vec::new();
        let pid = NonZeroU32::new(target.pid).ok_or(ProbeError::NoSuchProcess { pid: 0 })?;
        let result = self.attach_points(
            target,
            &lib,
            &mut links,
            true,
            UProbeScope::OneProcess(pid),
            |launch| launch.then_some(true),
        );
        self.links.entry(target.pid).or_default().extend(links);
        result.map(|()| "entry (the shim stopped recording)")
    }

    /// Attaches the uprobes of `lib`'s entry points in `target`. `which(is_launch)` says per
    /// entry point whether to trace it (None: skip) and whether it is open-ended (entry probe
    /// only); `names`: the kernel-name lookups too. Links made are pushed to `links` even on
    /// error, for the caller to keep or drop.
    fn attach_points(
        &mut self,
        target: &Target,
        lib: &LibCuda,
        links: &mut Vec<(&'static str, UProbeLinkId)>,
        names: bool,
        scope: UProbeScope,
        which: impl Fn(bool) -> Option<bool>,
    ) -> Result<(), ProbeError> {
        let path = &target.libcuda_host_path;
        // Return probes first: a call that enters after its entry probe exists then always
        // has its return probe too (the kernel arms a uretprobe at entry), so no in-call
        // entry is left without the exit that removes it.
        let u = self.uprobes;
        let plan = [
            (u.call_exit, &lib.waits),
            (u.call_enter, &lib.waits),
            (u.name_exit, &lib.name_lookups),
            (u.name_enter, &lib.name_lookups),
        ];
        for (name, points) in plan {
            let is_exit = name == u.call_exit || name == u.name_exit;
            if !names && (name == u.name_enter || name == u.name_exit) {
                continue;
            }
            // Every point of this program in one attach: one `uprobe_multi` link (closed in
            // one step), or per-point links under one id on kernels without it.
            let mut chosen = Vec::new();
            for ep in points.iter() {
                let launch = api::class(ep.id) == Some(api::ApiClass::Launch);
                let Some(open_ended) = which(launch) else {
                    continue;
                };
                if open_ended && is_exit {
                    continue;
                }
                let cookie = ep.id as u64 | if open_ended { COOKIE_OPEN_ENDED } else { 0 };
                chosen.push((ep, cookie));
            }
            if chosen.is_empty() {
                continue;
            }
            let prog: &mut UProbe = program(&mut self.ebpf, name)?
                .try_into()
                .map_err(anyhow::Error::from)?;
            let link = prog
                .attach(
                    chosen.iter().map(|(ep, cookie)| UProbeAttachPoint {
                        location: UProbeAttachLocation::AbsoluteOffset(ep.file_offset),
                        cookie: Some(*cookie),
                    }),
                    path,
                    scope,
                )
                .map_err(|e| {
                    if exited_or_exiting(target) {
                        ProbeError::TargetExited { pid: target.pid }
                    } else {
                        let symbols: Vec<&str> = chosen.iter().map(|(ep, _)| ep.symbol).collect();
                        privilege_or(
                            e.into(),
                            &format!(
                                "failed to attach uprobes on {} in {}",
                                symbols.join(", "),
                                target.libcuda
                            ),
                        )
                    }
                })?;
            links.push((name, link));
        }
        Ok(())
    }

    /// `share_waits`: the shared links of `target`'s libcuda file, made once (non-launch entry
    /// points, entry and return, every process).
    fn shared_waits(&mut self, target: &Target, lib: &LibCuda) -> Result<(), ProbeError> {
        let key = libcuda_file(target)?;
        if self.shared.contains_key(&key) {
            return Ok(());
        }
        let mut links = Vec::new();
        let result = self.attach_points(
            target,
            lib,
            &mut links,
            false,
            UProbeScope::AllProcesses,
            |launch| (!launch).then_some(false),
        );
        if result.is_ok() {
            self.shared.insert(key, links);
        } else {
            self.close(links);
        }
        result
    }

    fn close(&mut self, links: Vec<(&'static str, UProbeLinkId)>) {
        for (name, link) in links {
            if let Some(Ok(prog)) = self.ebpf.program_mut(name).map(<&mut UProbe>::try_from) {
                // Detaching fails only if the link is already gone: nothing to do then.
                let _ = prog.detach(link);
            }
        }
    }

    /// Stops tracing `pid` (it exited, or the user is done).
    ///
    /// The target leaves `WP_TARGETS` first, so the programs stop recording at once. Closing
    /// a uprobe link waits for an RCU grace period under a kernel-wide lock: ~100 ms a link
    /// measured on 6.18 (36 per-point links ≈ 3.6 s; closing them from parallel threads
    /// measured the same). With `uprobe_multi` a process has one link per program (2–4), so
    /// detaching is that many grace periods, not one per probe point (BENCHMARKS.md, daemon).
    /// Callers print their output before detaching; `report` leaves the closing to a child
    /// process instead (`Engine::detach_in_background`).
    pub fn detach(&mut self, pid: u32) {
        self.stop_recording(pid);
        let links = self.links.remove(&pid).unwrap_or_default();
        self.close(links);
    }

    /// `pid` leaves `WP_TARGETS`: the programs record nothing more for it, though its uprobes
    /// stay until `detach` (or this process's exit) closes their links.
    pub fn stop_recording(&mut self, pid: u32) {
        if let Some(map) = self.ebpf.map_mut(maps::TARGETS)
            && let Ok(mut targets) = BpfHashMap::<_, u32, u32>::try_from(map)
        {
            let _ = targets.remove(&pid);
        }
    }

    /// libcuda files resolved (one per file on the node, not per process).
    pub fn libcuda_files(&self) -> usize {
        self.libs.len()
    }

    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> anyhow::Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("the eBPF object has no program {name}"))
}

/// Names the missing capability up front rather than surfacing EPERM from deep inside aya.
fn check_capabilities() -> Result<(), ProbeError> {
    let caps = sys::effective_capabilities();
    let has = |cap: u32| caps & (1 << cap) != 0;
    let admin = has(sys::CAP_SYS_ADMIN);
    if !admin && !has(sys::CAP_BPF) {
        return Err(ProbeError::MissingCapability {
            capability: "CAP_BPF",
            why: "needed to load eBPF programs and maps",
        });
    }
    if !admin && !has(sys::CAP_PERFMON) {
        return Err(ProbeError::MissingCapability {
            capability: "CAP_PERFMON",
            why: "needed to attach uprobes, tracepoints and perf events",
        });
    }
    if !has(sys::CAP_SYS_PTRACE) {
        return Err(ProbeError::MissingCapability {
            capability: "CAP_SYS_PTRACE",
            why: "needed to read the stacks and memory maps of the target processes",
        });
    }
    Ok(())
}

/// Maps an EPERM anywhere in the chain to the capability error; otherwise adds context.
/// (EACCES from BPF_PROG_LOAD is the verifier's rejection, not a privilege problem.)
/// Tracepoints are attached by name through tracefs. A machine (or a container with /sys
/// mounted) can lack the mount — the H200 machine starts without it — so mount it, as root
/// may, and say so once; if that fails, say what to run.
fn ensure_tracefs() -> anyhow::Result<()> {
    const AT: &str = "/sys/kernel/tracing";
    let mounted = |root: &str| std::path::Path::new(root).join("events").exists();
    if mounted(AT) || mounted("/sys/kernel/debug/tracing") {
        return Ok(());
    }
    if let Err(e) = sys::mount_tracefs(AT) {
        anyhow::bail!(
            "tracefs is not mounted and mounting it at {AT} failed ({e}); run `mount -t tracefs tracefs {AT}`"
        );
    }
    eprintln!("wedgeprobe: note: mounted tracefs at {AT} (it was not mounted)");
    Ok(())
}

fn privilege_or(e: anyhow::Error, what: &str) -> ProbeError {
    let denied = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            .is_some_and(sys::is_eperm)
    });
    if denied {
        ProbeError::Refused {
            what: what.to_string(),
            capability: "CAP_BPF and CAP_PERFMON",
            source: e,
        }
    } else {
        ProbeError::Other(e.context(what.to_string()))
    }
}

/// Whether a link's failure is the target's exit: gone, or in its exit already. A process-wide
/// uprobe link is refused (ENOENT) once the process has begun exiting, before its pidfd says
/// it ended — `target_exits_during_attach` (`cargo xtask test` here, 2026-12-06) got "failed to attach
/// uprobes …: No such file or directory" for a target a few milliseconds from gone. The exit
/// is given 200 ms to show (an error path only).
fn exited_or_exiting(target: &Target) -> bool {
    for _ in 0..20 {
        if !target.alive() || crate::process::target::exiting(target.pid) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}
