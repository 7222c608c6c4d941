//! Moves what the kernel saw into the model: drains the eBPF rings, reads the in-call and
//! yield tables, reads the stacks of sleeping threads from /proc, and notices threads and
//! processes that went away. One `poll` per tick (50 ms in `watch`).
//!
//! Records from the rings are decoded by size and kind and counted when they do not decode;
//! bytes that came from the target (kernel names, stacks) are treated as hostile.

use std::{collections::HashMap, fs, mem::size_of, sync::Arc};

use anyhow::Context as _;
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use probe_common::{
    CallDone, EVENT_CALL_DONE, EVENT_KERNEL_NAME, EventHeader, InCall, KernelName,
    SAMPLE_STACK_LEN, SampleHeader, counters,
    journal::{RECORD_LAUNCH, RECORD_SYNCED, RingRecord},
    maps,
};

use crate::{
    collect::probe::{Attached, Probe},
    error::ProbeError,
    journal::MappedJournal,
    journal::heads::{JournalCursor, is_completion},
    model::{
        JournalInfo, JournalStatus, Model,
        event::{self, TraceEvent},
    },
    process::code::TargetCode,
    process::target::Target,
    sys,
};

/// Sleeping threads are re-read from /proc this often (per process): each read is two small
/// /proc files and up to 16 process_vm_readv calls per sleeping thread.
const OFFCPU_SCAN_EVERY_NS: u64 = 250_000_000;
/// Thread lists are refreshed this often to forget threads that exited.
const PRUNE_EVERY_NS: u64 = 1_000_000_000;
/// Per-thread map entries of ended threads are dropped at least this often.
const SWEEP_EVERY_NS: u64 = 30_000_000_000;
/// A live process's threads are listed at least this often (`prune`).
const THREADS_LIST_EVERY_NS: u64 = 10_000_000_000;

pub struct Collector {
    pub probe: Probe,
    pub model: Model,
    events: RingBuf<MapData>,
    samples: RingBuf<MapData>,
    in_call: BpfHashMap<MapData, u32, InCall>,
    yields: BpfHashMap<MapData, u32, u64>,
    /// Read only to drop the entries of threads that ended (`sweep_ended_threads`).
    last_sample: BpfHashMap<MapData, u32, u64>,
    counters: PerCpuArray<MapData, u64>,
    last_offcpu_scan_ns: u64,
    last_prune_ns: u64,
    last_sweep_ns: u64,
    /// Open shim journals by pid.
    journals: HashMap<u32, (Arc<MappedJournal>, JournalCursor)>,
    /// While a trace runs: the rings are read on a thread of their own (`ring_pump`).
    pump: Option<super::ring_pump::RingPump>,
    /// Per journal, its process's namespace thread ids → the host's (the shim writes the
    /// former; everything else here is the latter).
    ns_tids: HashMap<u32, crate::process::ns_tids::NsTids>,
    /// When set, every call, launch and kernel drained is also appended here as a trace
    /// event (for `trace` and the flight recorder); the consumer empties it each tick.
    pub tap: Option<Vec<TraceEvent>>,
    /// Whether journal launches and completions go into `tap` as they are read (true), or
    /// stay in each journal's ring until a flight dump asks for them (`ring_events`: the
    /// daemon's way).
    pub tap_journal_records: bool,
    /// Per sleeping thread, the (sp, pc) its stack was last scanned at, and whether that scan
    /// found it inside libcuda: a thread still asleep at the same place has the same stack,
    /// so it is not read and scanned again (a serving process has dozens of threads parked in
    /// futex waits).
    scanned_at: HashMap<(u32, u32), ProcScan>,
    /// Newest journal records read per process per poll (`u64::MAX`: all; the daemon bounds
    /// it).
    pub max_records_per_poll: u64,
    /// The in-flight tables are scanned at most this often (0: every poll; the daemon sets
    /// it, see `JournalCursor::heads_every`).
    pub heads_every_ns: u64,
    /// Each journal's ring pages are let go at most this often (0: never; the daemon sets it,
    /// see `MappedJournal::release_ring_every`).
    pub release_ring_every_ns: u64,
    /// Kernel names read from journals, by (pid, name id): a name slot never changes once
    /// written, and a trace names every kernel event.
    names: HashMap<(u32, u32), Arc<str>>,
    /// Time spent in each part of `poll` (see `take_phases`).
    phases: [std::time::Duration; PHASES.len()],
    /// Journal ring records read since `WEDGEPROBE_DEBUG_TICK` last took them.
    pub records_read: u64,
    /// Time the phases of `poll` (`take_phases`; the daemon's `WEDGEPROBE_DEBUG_TICK`).
    pub timed: bool,
    /// Processes attached with their launches left to the journal (no launch probes).
    launches_by_journal: std::collections::HashSet<u32>,
    /// Processes whose shim stopped recording since the last `take_launch_probe_changes`, with
    /// how launches are traced now (or why probes could not be added).
    launch_probe_changes: Vec<(u32, Result<&'static str, String>)>,
}

/// The parts of `poll` timed for `WEDGEPROBE_DEBUG_TICK` (indexes into `phases`).
const PHASES: [&str; 11] = [
    "events",
    "samples",
    "in_call",
    "journal ring",
    "journal history+trace",
    "journal heads",
    "journal calls",
    "scan",
    "yields",
    "prune",
    "counters",
];

/// Successive intervals of one poll, in this thread's CPU time (wall time counted the
/// preemptions on a loaded node: 4-6 ms a tick against 1.6 ms of CPU at 16 simulated processes
/// on 2 cores, 2026-12-06). Timed only when `Collector::timed` (`WEDGEPROBE_DEBUG_TICK`): the
/// thread CPU clock is a system call, and the ~80 a tick at 16 processes were 7% of the
/// daemon's samples.
struct Lap(Option<u64>);

impl Lap {
    fn start(timed: bool) -> Self {
        Self(timed.then(sys::thread_cpu_ns))
    }

    fn mark(&mut self, into: &mut std::time::Duration) {
        if let Some(before) = self.0 {
            let now = sys::thread_cpu_ns();
            *into += std::time::Duration::from_nanos(now.saturating_sub(before));
            self.0 = Some(now);
        }
    }
}

/// The last /proc scan of a sleeping thread.
#[derive(Clone, Copy)]
struct ProcScan {
    sp: u64,
    pc: u64,
    inside: bool,
    /// Scans in a row that found it outside libcuda.
    outside_in_a_row: u8,
}

/// A target that went away since the last poll.
pub struct Exited {
    pub pid: u32,
    pub comm: String,
}

impl Collector {
    /// Reads the journals' rings on a thread of its own from now on (`ring_pump`: what a
    /// trace needs to keep every record); `Err` if the thread cannot start.
    pub fn start_ring_pump(&mut self) -> std::io::Result<()> {
        let pump = super::ring_pump::RingPump::start()?;
        for (&pid, (j, cursor)) in &self.journals {
            pump.add(pid, j.clone(), cursor.next_index(), cursor.window_from());
        }
        self.pump = Some(pump);
        Ok(())
    }

    fn forget_journal(&mut self, pid: u32) {
        self.journals.remove(&pid);
        if let Some(p) = &self.pump {
            p.remove(pid);
        }
    }

    /// (pid, where it maps its journal) of every journal being read now.
    pub fn journal_mappings(&self) -> Vec<(u32, crate::process::target::Mapping)> {
        self.journals
            .iter()
            .map(|(pid, (j, _))| (*pid, j.mapping.clone()))
            .collect()
    }

    pub fn new(probe: Probe) -> Result<Self, ProbeError> {
        Ok(Self::with_maps(probe)?)
    }

    fn with_maps(mut probe: Probe) -> anyhow::Result<Self> {
        let ebpf = probe.ebpf_mut();
        let mut take = |name: &str| {
            ebpf.take_map(name)
                .with_context(|| format!("no map {name}"))
        };
        Ok(Self {
            events: RingBuf::try_from(take(maps::EVENTS)?)?,
            samples: RingBuf::try_from(take(maps::SAMPLES)?)?,
            in_call: BpfHashMap::try_from(take(maps::IN_CALL)?)?,
            yields: BpfHashMap::try_from(take(maps::THREAD_YIELDS)?)?,
            last_sample: BpfHashMap::try_from(take(maps::LAST_SAMPLE)?)?,
            counters: PerCpuArray::try_from(take(maps::COUNTERS)?)?,
            probe,
            model: Model::new(),
            last_offcpu_scan_ns: 0,
            last_prune_ns: 0,
            last_sweep_ns: 0,
            journals: HashMap::new(),
            ns_tids: HashMap::new(),
            pump: None,
            tap: None,
            tap_journal_records: true,
            max_records_per_poll: u64::MAX,
            heads_every_ns: 0,
            release_ring_every_ns: 0,
            scanned_at: HashMap::new(),
            names: HashMap::new(),
            phases: Default::default(),
            records_read: 0,
            timed: false,
            launches_by_journal: Default::default(),
            launch_probe_changes: Vec::new(),
        })
    }

    pub fn attach(&mut self, target: Target, launch_returns: bool) -> Result<Attached, ProbeError> {
        let pid = target.pid;
        // The journal first: only a journal that validates lets the launch probes stay off.
        if let Some(mapping) = target.journal.clone() {
            self.open_journal(pid, &mapping);
        }
        // A shim that no longer records (released, off) leaves launches to the probes.
        let journal_ok = self.journals.get(&pid).is_some_and(|(j, _)| {
            let v = j.view();
            !v.shim_off() && !v.shim_released()
        });
        let attached = match self.probe.attach(&target, launch_returns, journal_ok) {
            Ok(a) => a,
            Err(e) => {
                self.forget_journal(pid);
                self.model.journals.remove(&pid);
                return Err(e);
            }
        };
        if journal_ok && !launch_returns {
            self.launches_by_journal.insert(pid);
        }
        let code = TargetCode::new(&target, &attached.lib);
        self.model.add_process(target, code, sys::monotonic_ns());
        self.journal_known(pid);
        Ok(attached)
    }

    /// Tells the model that `pid`'s journal (if one was opened) dates its GPU work.
    fn journal_known(&mut self, pid: u32) {
        if let Some((j, _)) = self.journals.get(&pid) {
            self.model
                .journal_opened(pid, j.view().header().created_mono_ns);
        }
    }

    /// Opens a target's shim journal; a rejected one is reported, and eBPF carries on alone.
    /// A journal caught between its creation and its header (the shim sizes the file, then
    /// writes the header) is retried for up to 500 ms.
    fn open_journal(&mut self, pid: u32, at: &crate::process::target::Mapping) {
        let mut opened = MappedJournal::open(pid, at);
        for _ in 0..10 {
            let incomplete = opened.as_ref().err().is_some_and(|e| {
                matches!(
                    e.downcast_ref::<crate::journal::JournalError>(),
                    Some(
                        crate::journal::JournalError::BadMagic
                            | crate::journal::JournalError::TooShort { .. }
                    )
                )
            });
            if !incomplete {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            opened = MappedJournal::open(pid, at);
        }
        match opened {
            Ok(j) => {
                let j = Arc::new(j);
                // While a trace runs, a journal made after it began is read from its first
                // record: what its ring overwrote before this read is the trace's loss.
                let cursor = if self.pump.is_some() {
                    JournalCursor::default()
                } else {
                    JournalCursor::starting_at(j.view())
                };
                if let Some(p) = &self.pump {
                    p.add(pid, j.clone(), cursor.next_index(), cursor.window_from());
                }
                self.journals.insert(pid, (j, cursor));
            }
            Err(e) => {
                let info = JournalInfo {
                    path: crate::journal::shown_path(&at.path),
                    status: JournalStatus::Rejected(format!("{e:#}")),
                    ..JournalInfo::default()
                };
                self.model.journals.insert(pid, info);
            }
        }
    }

    fn read_journals(&mut self, now_ns: u64) {
        self.read_journals_of(None, now_ns);
    }

    /// Reads every journal, or `only` that one for the last time (its process exited: the
    /// ring pump's buffer and what it had not read yet are taken whole).
    fn read_journals_of(&mut self, only: Option<u32>, now_ns: u64) {
        let mut stopped_pids = Vec::new();
        let journals = &self.journals;
        self.ns_tids.retain(|pid, _| journals.contains_key(pid));
        for (&pid, (journal, cursor)) in self.journals.iter_mut() {
            if only.is_some_and(|o| o != pid) {
                continue;
            }
            let view = journal.view();
            let tids = self
                .ns_tids
                .entry(pid)
                .or_insert_with(|| crate::process::ns_tids::NsTids::new(pid));
            // The newest sign of GPU work among the records read, at its own time: the first
            // read after attach holds records from before it, which must not count as now.
            let mut moved_at = 0u64;
            // Consecutive records mostly name the same kernel: look the name up once per run
            // of them, and feed the history one run at a time.
            let mut last: Option<(u32, Arc<str>)> = None;
            let mut run: Vec<u64> = Vec::new();
            let mut lap = Lap::start(self.timed);
            let records = match &self.pump {
                Some(pump) if pump.has(pid) => {
                    let taken = if only.is_some() {
                        pump.take_last(pid)
                    } else {
                        pump.take(pid)
                    };
                    if let Some(tap) = &mut self.tap {
                        tap.extend(taken.gaps.iter().map(|g| {
                            TraceEvent::Lost(event::LostRecords {
                                pid,
                                ts_ns: g.at_ns,
                                overwritten: g.overwritten,
                                buffer_full: g.buffer_full,
                            })
                        }));
                    }
                    let read = cursor.absorb(view, taken.read);
                    cursor.stream_losses.dropped_upto(&taken.dropped_upto);
                    read
                }
                _ => cursor.advance_at_most(view, self.max_records_per_poll),
            };
            journal.release_ring_every(now_ns, self.release_ring_every_ns);
            if only.is_some() {
                // The process exited: its streams' counts are final.
                cursor.stream_losses.settle(&view.stream_counts());
            }
            lap.mark(&mut self.phases[3]);
            self.records_read += records.len() as u64;
            let mut done_at = 0u64;
            for r in records {
                if r.kind == RECORD_SYNCED {
                    moved_at = moved_at.max(r.start_ns.min(now_ns));
                    done_at = done_at.max(r.start_ns.min(now_ns));
                }
                if !(is_completion(&r) || r.kind == RECORD_LAUNCH) {
                    continue;
                }
                moved_at = moved_at.max(r.start_ns.max(r.end_ns).min(now_ns));
                // A launch only dates GPU work, unless it goes into the tap.
                if !is_completion(&r) && !(self.tap_journal_records && self.tap.is_some()) {
                    continue;
                }
                let name = match &last {
                    Some((id, n)) if *id == r.name_id => n.clone(),
                    _ => {
                        if let Some((_, n)) = &last {
                            self.model.history.record_all(pid, n, &run);
                            run.clear();
                        }
                        let n = journal_name(&mut self.names, pid, view, r.name_id);
                        last = Some((r.name_id, n.clone()));
                        n
                    }
                };
                if is_completion(&r) {
                    run.push(r.end_ns.saturating_sub(r.start_ns));
                    done_at = done_at.max(r.end_ns.min(now_ns));
                }
                if self.tap_journal_records
                    && let Some(tap) = &mut self.tap
                {
                    let mut r = r;
                    r.tid = tids.host(r.tid, now_ns);
                    tap.push(trace_event(pid, &r, name));
                }
            }
            if let Some((_, n)) = &last {
                self.model.history.record_all(pid, n, &run);
            }
            let marked = cursor.last_mark_at_ns().min(now_ns);
            self.model.progress(pid, moved_at.max(marked));
            self.model.gpu_done(pid, done_at.max(marked));
            lap.mark(&mut self.phases[4]);
            // A shim that is off or gave CUPTI back no longer updates its slots: launches in
            // flight then never complete in the table, and judged as kernels they would age
            // into a false kernel_wedge. The process is watched eBPF-only from then on.
            let stopped = view.shim_off() || view.shim_released();
            if stopped {
                stopped_pids.push(pid);
            }
            let mut heads = if stopped {
                Vec::new()
            } else {
                cursor.heads_every(pid, view, now_ns, self.heads_every_ns)
            };
            for h in &mut heads {
                h.tid = tids.host(h.tid, now_ns);
            }
            self.model.kernels.insert(pid, heads);
            lap.mark(&mut self.phases[5]);
            let mut calls = if stopped {
                Vec::new()
            } else {
                view.threads_in_calls()
            };
            for c in &mut calls {
                c.tid = tids.host(c.tid, now_ns);
            }
            self.model.set_journal_calls(pid, &calls, now_ns);
            if !stopped && let Some(mut busy) = view.threads_busy(now_ns) {
                for (tid, _) in &mut busy {
                    *tid = tids.host(*tid, now_ns);
                }
                self.model.set_shim_busy(pid, &busy);
            }
            let heartbeat = view.heartbeat_ns();
            self.model.journals.insert(
                pid,
                JournalInfo {
                    path: journal.path.clone(),
                    status: if view.shim_off() {
                        JournalStatus::ShimOff
                    } else if view.shim_released() {
                        JournalStatus::Released
                    } else if view.shim_attaching() {
                        JournalStatus::Attaching
                    } else {
                        JournalStatus::Recording
                    },
                    heartbeat_age_ms: (heartbeat > 0)
                        .then(|| now_ns.saturating_sub(heartbeat) as f64 / 1e6),
                    record: if view.record_mode().marks {
                        "marks"
                    } else {
                        "per-kernel"
                    },
                    completions_seen: cursor.completed,
                    marks_passed: cursor.marks_passed,
                    ring_lost: cursor.lost,
                    ring_history_unread: cursor.history_unread,
                    ring_lost_by_stream: cursor.stream_losses.lossy(),
                    ring_skipped: cursor.skipped,
                    drops: view.drops().into_iter().collect(),
                    attached_late: view.attached_late(),
                    launch_callbacks: view.launch_callbacks_why(),
                },
            );
            lap.mark(&mut self.phases[6]);
        }
        for pid in stopped_pids {
            if !self.launches_by_journal.remove(&pid) {
                continue;
            }
            let Some(p) = self.model.procs.get(&pid) else {
                continue;
            };
            // The shim stops recording as its process exits too (its exit handler): nothing
            // to take over then, and no line to log (`cargo xtask bench churn`, 2026-12-06:
            // 35 `shim_stopped` lines for 42 processes that simply ended).
            if crate::process::target::exiting(pid) {
                continue;
            }
            let outcome = self
                .probe
                .attach_launch_probes(&p.target)
                .map_err(|e| format!("{e:#}"));
            self.launch_probe_changes.push((pid, outcome));
        }
    }

    /// What `pid`'s journal ring still holds from `since_ns` on — its newest launches and
    /// completions, at most the newest `max` — as trace events, for a flight dump. The ring
    /// is the shim's own recorder of the process's last records; a dump reads it there
    /// instead of the daemon copying every record into its recorder each tick. At 32
    /// PyTorch servers on an H100 that copying was most of the daemon's CPU (BENCHMARKS.md),
    /// and one shared recorder let busy neighbours evict a wedged process's last launches
    /// (500,000 events were ~3 s of 32 servers' launches) while a wedged process stops
    /// launching, so its ring keeps what led to the wedge.
    pub fn ring_events(
        &mut self,
        pid: u32,
        since_ns: u64,
        max: usize,
        now_ns: u64,
    ) -> Vec<TraceEvent> {
        let Some((journal, _)) = self.journals.get(&pid) else {
            return Vec::new();
        };
        let view = journal.view();
        let head = view.header_now_ring_head();
        let cap = u64::from(view.layout().ring_cap);
        // From the oldest record the ring holds; `window_from` at the head: what was
        // overwritten while this read went is not a loss of the process's record.
        let read = view.ring_since(head.saturating_sub(cap), head);
        let tids = self
            .ns_tids
            .entry(pid)
            .or_insert_with(|| crate::process::ns_tids::NsTids::new(pid));
        let kept: Vec<&RingRecord> = read
            .records
            .iter()
            .filter(|r| (is_completion(r) || r.kind == RECORD_LAUNCH) && r.start_ns >= since_ns)
            .collect();
        let skip = kept.len().saturating_sub(max);
        kept[skip..]
            .iter()
            .map(|&&r| {
                let name = journal_name(&mut self.names, pid, view, r.name_id);
                let mut r = r;
                r.tid = tids.host(r.tid, now_ns);
                trace_event(pid, &r, name)
            })
            .collect()
    }

    /// Whether `pid`'s stream heads come from an in-flight table scan made in the poll at
    /// `now_ns` (always, without a journal or without `heads_every_ns`): between scans the
    /// heads only age and retire, so per-stream in-flight counts are known at scans only.
    pub fn heads_fresh(&self, pid: u32, now_ns: u64) -> bool {
        self.journals
            .get(&pid)
            .is_none_or(|(_, c)| self.heads_every_ns == 0 || c.scanned_at_ns() == Some(now_ns))
    }

    /// Processes whose shim stopped recording since the last call, with how their launches
    /// are traced now: callers say so once.
    pub fn take_launch_probe_changes(&mut self) -> Vec<(u32, Result<&'static str, String>)> {
        std::mem::take(&mut self.launch_probe_changes)
    }

    /// One tick: everything the kernel has for us, then the periodic /proc work.
    pub fn poll(&mut self, now_ns: u64) -> Vec<Exited> {
        let mut lap = Lap::start(self.timed);
        self.drain_events();
        lap.mark(&mut self.phases[0]);
        self.drain_samples(now_ns);
        lap.mark(&mut self.phases[1]);
        self.read_in_call();
        lap.mark(&mut self.phases[2]);
        self.read_journals(now_ns);
        let mut lap = Lap::start(self.timed);
        if now_ns.saturating_sub(self.last_offcpu_scan_ns) >= OFFCPU_SCAN_EVERY_NS {
            self.last_offcpu_scan_ns = now_ns;
            self.scan_sleeping_threads(now_ns);
        }
        lap.mark(&mut self.phases[7]);
        // After the calls are known: yields are read only for threads in calls.
        self.read_yields();
        lap.mark(&mut self.phases[8]);
        let mut exited = Vec::new();
        if now_ns.saturating_sub(self.last_prune_ns) >= PRUNE_EVERY_NS {
            self.last_prune_ns = now_ns;
            exited = self.prune(now_ns);
        }
        lap.mark(&mut self.phases[9]);
        self.read_counters();
        lap.mark(&mut self.phases[10]);
        exited
    }

    /// The next `poll` looks for exited processes whatever the time since the last look
    /// (once a second otherwise): an answer about to be given must not call a process that
    /// exited inside its window healthy.
    pub fn look_for_exits_next(&mut self) {
        self.last_prune_ns = 0;
    }

    /// Time spent in each part of `poll` since the last call, by name (for
    /// `WEDGEPROBE_DEBUG_TICK`), and resets it.
    pub fn take_phases(&mut self) -> Vec<(&'static str, std::time::Duration)> {
        let out = PHASES.into_iter().zip(self.phases).collect();
        self.phases = Default::default();
        out
    }

    fn drain_events(&mut self) {
        while let Some(item) = self.events.next() {
            let bytes: &[u8] = &item;
            let Some(header) = read_record::<EventHeader>(bytes) else {
                self.model.bad_records += 1;
                continue;
            };
            match header.kind {
                EVENT_CALL_DONE => match read_record::<CallDone>(bytes) {
                    Some(ev) => {
                        self.model.on_call_done(&ev);
                        if let Some(tap) = &mut self.tap {
                            tap.push(TraceEvent::Call(event::Call {
                                pid: ev.header.tgid,
                                tid: ev.header.tid,
                                api: crate::model::api_name(ev.call.api),
                                start_ns: ev.call.start_ns,
                                end_ns: Some(ev.end_ns),
                                stream: (ev.call.stream != 0).then_some(ev.call.stream),
                                failed: ev.result != 0,
                            }));
                        }
                    }
                    None => self.model.bad_records += 1,
                },
                EVENT_KERNEL_NAME => match read_record::<KernelName>(bytes) {
                    Some(ev) => {
                        self.model
                            .on_kernel_name(ev.header.tgid, ev.handle, ev.alias_of, &ev.name)
                    }
                    None => self.model.bad_records += 1,
                },
                _ => self.model.bad_records += 1,
            }
        }
    }

    fn drain_samples(&mut self, now_ns: u64) {
        while let Some(item) = self.samples.next() {
            let bytes: &[u8] = &item;
            // StackSample is 8 KiB: read the header, borrow the stack in place.
            let Some(s) = read_record::<SampleHeader>(bytes) else {
                self.model.bad_records += 1;
                continue;
            };
            let len = (s.len as usize).min(SAMPLE_STACK_LEN);
            let Some(stack) = bytes.get(size_of::<SampleHeader>()..size_of::<SampleHeader>() + len)
            else {
                self.model.bad_records += 1;
                continue;
            };
            self.model.on_stack(s.tgid, s.tid, s.ip, stack, now_ns);
        }
    }

    fn read_in_call(&mut self) {
        let entries: Vec<(u32, InCall)> = self.in_call.iter().filter_map(Result::ok).collect();
        self.model.set_in_call(&entries);
    }

    fn read_yields(&mut self) {
        let now = sys::monotonic_ns();
        for (pid, tid) in self.model.threads_needing_yields() {
            // No entry: the thread has not yielded since the probes attached (the map is
            // made at load, an entry at a thread's first yield), which is a measurement of
            // 0, not an unknown: a synchronize spinning without yields (the H200's sync-wedge)
            // read "not measured" for its whole report. The map is an LRU of MAX_THREADS
            // (16,384) target threads; an evicted entry would read as fewer yields, never more.
            match self.yields.get(&tid, 0) {
                Ok(n) => self.model.set_yields(pid, tid, n, now),
                Err(aya::maps::MapError::KeyNotFound) => self.model.set_yields(pid, tid, 0, now),
                Err(_) => {}
            }
        }
    }

    fn read_counters(&mut self) {
        for i in 0..counters::LEN {
            if let Ok(values) = self.counters.get(&i, 0) {
                self.model.lost[i as usize] = values.iter().sum();
            }
        }
    }

    /// Threads asleep in the kernel are never on-CPU samples: read their user registers from
    /// /proc/PID/task/TID/syscall (stable while they sleep) and scan their stacks.
    fn scan_sleeping_threads(&mut self, now_ns: u64) {
        let pids: Vec<u32> = self.model.procs.keys().copied().collect();
        for pid in pids {
            let Some(p) = self.model.procs.get(&pid) else {
                continue;
            };
            if p.exited {
                continue;
            }
            // Only threads whose scan can matter: one in a launch traced without return probe
            // (whether it is still inside is inferred from scans), or one that existed at
            // attach and may still be in a call that began before it — until two /proc scans
            // in a row find it asleep outside libcuda: any later call is seen by the probes or
            // the journal. (Two, and not on-CPU samples: a scan is a heuristic, and one
            // wrong "outside" would hide a pre-attach call for good.) The model discards the
            // other scans, and reading them was most of the daemon's CPU: two /proc reads per
            // thread every 250 ms, ~60 threads per PyTorch process (perf, 8 simulated
            // processes with 60 idle threads: 58% of its samples).
            let scanned = &self.scanned_at;
            let mut idle: Vec<u32> = p
                .threads_at_attach
                .iter()
                .copied()
                .filter(|tid| {
                    p.threads.get(tid).is_none_or(|t| {
                        let settled = t.scanned_call.is_none()
                            && scanned
                                .get(&(pid, *tid))
                                .is_some_and(|s| s.outside_in_a_row >= 2);
                        !t.traced && !settled && !t.call_is_exact()
                    })
                })
                .collect();
            idle.extend(p.maybe_in_calls().filter_map(|(tid, t)| {
                t.uprobe_call
                    .as_ref()
                    .is_some_and(|c| c.open_ended())
                    .then_some(tid)
            }));
            idle.sort_unstable();
            idle.dedup();
            for tid in idle {
                if !is_sleeping(pid, tid) {
                    continue;
                }
                let Some((sp, pc)) = syscall_regs(pid, tid) else {
                    continue;
                };
                let last = self.scanned_at.get(&(pid, tid)).copied();
                let inside = match last {
                    Some(l) if (l.sp, l.pc) == (sp, pc) => {
                        // Same place as last time: the same answer, as of now.
                        self.model.confirm_scan(pid, tid, now_ns);
                        l.inside
                    }
                    _ => {
                        let stack = read_stack(pid, sp);
                        self.model.on_stack(pid, tid, pc, &stack, now_ns)
                    }
                };
                let outside_in_a_row = match (inside, last) {
                    (true, _) => 0,
                    (false, Some(l)) => l.outside_in_a_row.saturating_add(1),
                    (false, None) => 1,
                };
                self.scanned_at.insert(
                    (pid, tid),
                    ProcScan {
                        sp,
                        pc,
                        inside,
                        outside_in_a_row,
                    },
                );
                // Asleep outside libcuda twice since attach: whatever call it makes next
                // began after attach (the probes or the journal see it), so it is no longer
                // a thread that can be in a call from before. Dropped from the set, it is not
                // filtered again every 250 ms (with 61 threads in each of 64 processes that
                // filter was 10% of the daemon's CPU).
                if outside_in_a_row >= 2
                    && let Some(p) = self.model.procs.get_mut(&pid)
                    && p.threads.get(&tid).is_none_or(|t| t.scanned_call.is_none())
                {
                    p.threads_at_attach.remove(&tid);
                }
            }
        }
    }

    fn prune(&mut self, now_ns: u64) -> Vec<Exited> {
        let mut exited = Vec::new();
        let mut listed: HashMap<u32, Vec<u32>> = HashMap::new();
        let pids: Vec<u32> = self.model.procs.keys().copied().collect();
        for pid in pids {
            let Some(p) = self.model.procs.get_mut(&pid) else {
                continue;
            };
            if p.exited {
                continue;
            }
            if !p.target.alive() {
                p.exited = true;
                p.threads.clear();
                exited.push(Exited {
                    pid,
                    comm: p.target.comm.clone(),
                });
                self.probe.detach(pid);
                // Its last records (the mapping outlives the process).
                self.read_journals_of(Some(pid), now_ns);
                self.forget_journal(pid);
                self.model.kernels.remove(&pid);
                continue;
            }
            // A process that initialises CUDA after attach creates its journal then.
            if !self.journals.contains_key(&pid)
                && !self.model.journals.contains_key(&pid)
                && let Some(m) = crate::process::target::find_journal(pid)
            {
                self.open_journal(pid, &m);
                self.journal_known(pid);
            }
            let Some(p) = self.model.procs.get_mut(&pid) else {
                continue;
            };
            // Per-thread CPU serves the host-stall verdict only, whose precondition is GPU
            // work that stopped moving with no kernel in flight: read it then, not for every
            // thread of every busy process each second (one /proc read per thread). Quiet
            // since attach counts from the first reading: a stall that began before attach
            // is found in the first window, not a second later.
            let quiet_since_attach = p.last_progress_ns <= p.attached_ns;
            let quiet = (quiet_since_attach
                || now_ns.saturating_sub(p.last_progress_ns) >= PRUNE_EVERY_NS)
                && self.model.kernels.get(&pid).is_none_or(|k| k.is_empty());
            // The threads are listed when their number changed, when their CPU is read, and
            // every `THREADS_LIST_EVERY_NS`: listing /proc/PID/task every second was 15% of the
            // daemon's CPU at 64 processes of 61 threads (perf, 2026-12-06); its link count
            // is one lookup. A thread that ended as another began is let go within that bound.
            let count = p.target.thread_count();
            let (listed_at, listed_count) = p.threads_listed;
            if !quiet
                && listed_at != 0
                && count == Some(listed_count)
                && now_ns.saturating_sub(listed_at) < THREADS_LIST_EVERY_NS
            {
                self.model.clear_cpu(pid);
                continue;
            }
            let alive = p.target.threads();
            p.threads_listed = (now_ns, alive.len() as u32);
            // Threads rename themselves (pthread_setname_np after start): re-read the names
            // of the threads a report can show (in a call, or busy).
            for (&tid, t) in p.threads.iter_mut() {
                if t.current(now_ns).is_some() || t.busy_since_ns != 0 {
                    let name = p.target.thread_name(tid);
                    if name != t.name {
                        t.name = name;
                        p.names_version += 1;
                    }
                }
            }
            p.threads_at_attach
                .retain(|t| alive.binary_search(t).is_ok());
            if quiet {
                for &tid in &alive {
                    if let Some(cpu) = thread_cpu(pid, tid) {
                        self.model.set_cpu(pid, tid, cpu, sys::monotonic_ns());
                    }
                }
            } else {
                self.model.clear_cpu(pid);
            }
            for tid in self.model.prune_threads(pid, &alive) {
                // A thread that died inside a call never ran its uretprobe.
                let _ = self.in_call.remove(&tid);
            }
            listed.insert(pid, alive);
        }
        // One pass over the scans of every process (per process, it was a pass over all of
        // them each: 3% of the daemon's CPU at 64 processes).
        if !listed.is_empty() {
            self.scanned_at.retain(|(p, t), _| {
                listed
                    .get(p)
                    .is_none_or(|alive| alive.binary_search(t).is_ok())
            });
        }
        if !exited.is_empty() || now_ns.saturating_sub(self.last_sweep_ns) >= SWEEP_EVERY_NS {
            self.last_sweep_ns = now_ns;
            self.sweep_ended_threads();
        }
        exited
    }

    /// Drops the per-thread entries (yields, last sample, open call) of threads that no longer
    /// exist. The maps are LRU or bounded, but a daemon on a node where processes come and go
    /// kept every ended thread's entries until the bound (`cargo xtask bench churn`,
    /// 2026-12-06: 34 → 104 entries in 90 s of 43 short-lived processes). Run when a process
    /// exits, and every `SWEEP_EVERY_NS` for threads that end inside a live one: one /proc
    /// lookup per entry, tens to hundreds.
    fn sweep_ended_threads(&mut self) {
        let ended = |tid: &u32| !std::path::Path::new(&format!("/proc/{tid}")).exists();
        let of = |keys: Vec<u32>| keys.into_iter().filter(ended).collect::<Vec<u32>>();
        for tid in of(self.yields.keys().filter_map(Result::ok).collect()) {
            let _ = self.yields.remove(&tid);
        }
        for tid in of(self.last_sample.keys().filter_map(Result::ok).collect()) {
            let _ = self.last_sample.remove(&tid);
        }
        for tid in of(self.in_call.keys().filter_map(Result::ok).collect()) {
            let _ = self.in_call.remove(&tid);
        }
    }

    /// Stops tracing `pid` if still attached and drops everything known about it.
    pub fn forget(&mut self, pid: u32) {
        self.probe.detach(pid);
        self.launches_by_journal.remove(&pid);
        self.forget_journal(pid);
        self.names.retain(|(p, _), _| *p != pid);
        // Pruned per live process at each /proc scan; a forgotten one is scanned no more
        // (`cargo xtask bench churn`: one entry per thread of every process that ever ran).
        self.scanned_at.retain(|(p, _), _| *p != pid);
        self.model.forget(pid);
    }

    /// How many entries each of its per-process and per-thread tables holds: what a daemon
    /// months in must not grow (`wedgeprobe_daemon_state_entries`).
    pub fn state_entries(&self) -> Vec<(&'static str, u64)> {
        let m = &self.model;
        vec![
            ("processes", m.procs.len() as u64),
            (
                "threads",
                m.procs.values().map(|p| p.threads.len() as u64).sum(),
            ),
            ("kernel_names", m.kernel_names.len() as u64),
            ("journals", self.journals.len() as u64),
            ("journal_names", self.names.len() as u64),
            ("thread_scans", self.scanned_at.len() as u64),
            ("namespace_tids", self.ns_tids.len() as u64),
            ("kernel_history", m.history.entries() as u64),
            ("libcuda_files", self.probe.libcuda_files() as u64),
        ]
    }

    pub fn detach_all(&mut self) {
        for pid in self.model.procs.keys() {
            self.probe.detach(*pid);
        }
    }

    /// Every target leaves `WP_TARGETS` (their links stay open: `Probe::stop_recording`).
    pub fn stop_recording_all(&mut self) {
        for pid in self.model.procs.keys() {
            self.probe.stop_recording(*pid);
        }
    }
}

/// A journal launch or completion as a trace event.
/// The kernel name of `name_id` in `pid`'s journal, read once (a name slot never changes once
/// written) and kept in `names`.
fn journal_name(
    names: &mut HashMap<(u32, u32), Arc<str>>,
    pid: u32,
    view: &crate::journal::JournalView,
    name_id: u32,
) -> Arc<str> {
    names
        .entry((pid, name_id))
        .or_insert_with(|| Arc::from(view.name(name_id).unwrap_or_else(|| "?".into())))
        .clone()
}

fn trace_event(pid: u32, r: &RingRecord, kernel: Arc<str>) -> TraceEvent {
    if r.kind == RECORD_LAUNCH {
        return TraceEvent::Launch(event::Launch {
            pid,
            tid: r.tid,
            api: crate::model::api_name(r.api),
            ts_ns: r.start_ns,
            correlation: r.correlation,
            stream: r.stream,
            kernel,
            grid: r.grid,
            block: r.block,
        });
    }
    TraceEvent::Kernel(event::Kernel {
        pid,
        device: r.device,
        stream: r.stream,
        stream_id: r.stream_id,
        correlation: r.correlation,
        kernel,
        start_ns: r.start_ns,
        end_ns: Some(r.end_ns),
        grid: r.grid,
        block: r.block,
        cluster: [
            r.cluster[0] as u32,
            r.cluster[1] as u32,
            r.cluster[2] as u32,
        ],
        graph_node: r.graph_node,
        queued_behind: None,
    })
}

/// Copies a `T` out of a ring record if the record is long enough.
fn read_record<T: Copy>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: length checked above; T is a plain #[repr(C)] record valid for any bit pattern,
    // and read_unaligned makes no alignment assumption about the ring's memory.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// A thread's CPU time: /proc/PID/task/TID/stat (utime, stime: fields 14 and 15) and, where
/// the kernel has it, schedstat (ns on a core, ns waiting for one).
fn thread_cpu(pid: u32, tid: u32) -> Option<crate::model::CpuTime> {
    let s = fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    let cpu = parse_thread_cpu(&s, sys::clock_ticks_per_s())?;
    Some(
        fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
            .ok()
            .and_then(|s| parse_schedstat(&s))
            .unwrap_or(cpu),
    )
}

fn parse_thread_cpu(stat: &str, hz: f64) -> Option<crate::model::CpuTime> {
    let field = |n| {
        crate::process::target::stat_field(stat, n)?
            .parse::<u64>()
            .ok()
    };
    let ticks = field(14)? + field(15)?;
    Some(crate::model::CpuTime {
        on_cpu_ns: (ticks as f64 / hz * 1e9) as u64,
        waiting_ns: 0,
    })
}

/// `run_ns wait_ns timeslices` (Documentation/scheduler/sched-stats.rst).
fn parse_schedstat(s: &str) -> Option<crate::model::CpuTime> {
    let mut f = s.split_whitespace().map(|w| w.parse::<u64>().ok());
    let (on_cpu_ns, waiting_ns) = (f.next()??, f.next()??);
    f.next()??;
    Some(crate::model::CpuTime {
        on_cpu_ns,
        waiting_ns,
    })
}

fn is_sleeping(pid: u32, tid: u32) -> bool {
    matches!(
        crate::process::target::proc_state(&format!("/proc/{pid}/task/{tid}/stat")),
        Some('S' | 'D')
    )
}

/// (sp, pc) of a thread blocked in a syscall, from `nr a0 … a5 sp pc`.
fn syscall_regs(pid: u32, tid: u32) -> Option<(u64, u64)> {
    let s = fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    parse_syscall_regs(&s)
}

pub fn parse_syscall_regs(s: &str) -> Option<(u64, u64)> {
    let fields: Vec<&str> = s.split_whitespace().collect();
    if fields.len() < 3 || fields[0] == "running" {
        return None;
    }
    let hex = |f: &str| u64::from_str_radix(f.trim_start_matches("0x"), 16).ok();
    let n = fields.len();
    Some((hex(fields[n - 2])?, hex(fields[n - 1])?))
}

/// Up to SAMPLE_STACK_LEN bytes of user stack from `sp`, stopping at the end of the mapping.
fn read_stack(pid: u32, sp: u64) -> Vec<u8> {
    const CHUNK: usize = 512;
    let mut stack = vec![0u8; SAMPLE_STACK_LEN];
    let mut len = 0;
    while len < SAMPLE_STACK_LEN {
        match sys::read_process_memory(pid, sp + len as u64, &mut stack[len..len + CHUNK]) {
            Ok(CHUNK) => len += CHUNK,
            _ => break,
        }
    }
    stack.truncate(len);
    stack
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_file_parses() {
        assert_eq!(
            parse_syscall_regs("202 0x7f00 0x80 0x1 0x0 0x0 0x0 0x7ffd1000 0x7f001234\n"),
            Some((0x7ffd1000, 0x7f001234))
        );
        assert_eq!(parse_syscall_regs("running\n"), None);
        assert_eq!(
            parse_syscall_regs("-1 0x7ffd1000 0x7f001234"),
            Some((0x7ffd1000, 0x7f001234))
        );
        assert_eq!(parse_syscall_regs("garbage"), None);
    }

    #[test]
    fn short_records_do_not_decode() {
        assert!(read_record::<CallDone>(&[0u8; 10]).is_none());
        assert!(read_record::<EventHeader>(&[0u8; 16]).is_some());
    }

    #[test]
    fn cpu_files_parse() {
        // A comm with a space and a parenthesis: fields count from the last ')'.
        let stat = "42 (py (x) 1) R 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 777 0";
        let c = parse_thread_cpu(stat, 100.0).unwrap();
        assert_eq!(c.on_cpu_ns, 3_000_000_000);
        let t = parse_schedstat("2953718493 1290381812 4711\n").unwrap();
        assert_eq!((t.on_cpu_ns, t.waiting_ns), (2_953_718_493, 1_290_381_812));
        assert_eq!(parse_schedstat("12 34"), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
    }
}
