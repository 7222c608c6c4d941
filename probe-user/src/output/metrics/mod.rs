//! Prometheus exposition (OpenMetrics text, through the `prometheus-client` crate): the daemon
//! loop fills a [`Snapshot`] each tick; a scrape encodes the latest one. Label cardinality is
//! bounded: per process at most one series per (device, stream) — its oldest in-flight kernel,
//! whose name label is cut to 96 bytes — and processes that exited leave with their series.

pub mod exposition;
pub mod http;

use std::{collections::BTreeMap, fmt};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet},
    metrics::MetricType,
    registry::Registry,
};

/// Everything a scrape shows, as of the last tick.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub processes: Vec<ProcessMetrics>,
    /// Transitions into each verdict kind, all processes, since start.
    pub verdicts_total: BTreeMap<&'static str, u64>,
    /// Driver call latencies per entry point (from calls with both probes).
    pub latency: Vec<(&'static str, Hist)>,
    pub ebpf_lost: Vec<(&'static str, u64)>,
    pub dumps_total: u64,
    pub dump_failures_total: u64,
    pub dump_dir_bytes: u64,
    pub discovery_scans_total: u64,
    pub discovery_scan_seconds: f64,
    pub discovery_pending: u64,
    pub config_reloads_total: u64,
    pub config_errors_total: u64,
    pub blocked_after_seconds: f64,
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    /// The C heap: ("in_use", bytes handed out), ("free", bytes free inside its arenas).
    pub heap_bytes: Vec<(&'static str, u64)>,
    /// Per job with a culprit: (job, rank, pid, kernel).
    pub culprits: Vec<(String, u32, u32, String)>,
    /// Entries of each of the daemon's per-process and per-thread tables (`Engine::state_entries`).
    pub state_entries: Vec<(&'static str, u64)>,
}

#[derive(Clone, Debug, Default)]
pub struct ProcessMetrics {
    pub pid: u32,
    pub comm: String,
    /// The job and rank of a process that is one rank of a job of several (else empty): an
    /// alert joins them in from `wedgeprobe_target_info`, so a page says which rank.
    pub job: String,
    pub rank: String,
    pub mode: &'static str,
    pub verdict: &'static str,
    pub threads_in_calls: u64,
    pub blocked_threads: u64,
    pub sched_yield_per_s: f64,
    pub streams: Vec<StreamMetrics>,
    pub journal_drops: Vec<(&'static str, u64)>,
    pub journal_ring_lost: u64,
    pub journal_ring_skipped: u64,
    /// How the shim records launches, where there is a journal: (`hooks` or `callbacks`, why
    /// callbacks — empty for hooks).
    pub launches_via: Option<(&'static str, &'static str)>,
}

#[derive(Clone, Debug, Default)]
pub struct StreamMetrics {
    pub device: u32,
    pub stream: String,
    pub kernel: String,
    pub oldest_age_seconds: f64,
    pub in_flight: u64,
}

/// A histogram already bucketed: (upper bound in seconds, count in that bucket alone).
#[derive(Clone, Debug, Default)]
pub struct Hist {
    pub sum: f64,
    pub count: u64,
    pub buckets: Vec<(f64, u64)>,
}

/// Bucket bounds for driver call latency, seconds (10 µs … 60 s).
pub const LATENCY_BOUNDS: [f64; 14] = [
    1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0,
];

impl Hist {
    /// From an hdrhistogram of nanoseconds: per-bucket counts (the encoder makes them
    /// cumulative), the last bucket `f64::MAX`, which it writes as `+Inf`.
    pub fn from_hdr(h: &hdrhistogram::Histogram<u64>) -> Self {
        let mut per = vec![0u64; LATENCY_BOUNDS.len() + 1];
        for v in h.iter_recorded() {
            let secs = v.value_iterated_to() as f64 / 1e9;
            let i = LATENCY_BOUNDS
                .iter()
                .position(|&b| secs <= b)
                .unwrap_or(LATENCY_BOUNDS.len());
            per[i] += v.count_at_value();
        }
        let buckets = LATENCY_BOUNDS
            .iter()
            .copied()
            .chain([f64::MAX])
            .zip(per)
            .collect();
        Self {
            sum: h.mean() * h.len() as f64 / 1e9,
            count: h.len(),
            buckets,
        }
    }
}

/// Kernel names are labels: cut to a bounded length on a char boundary.
pub fn bounded_label(s: &str) -> String {
    if s.len() <= 96 {
        return s.to_string();
    }
    let mut end = 96;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

type Labels = Vec<(&'static str, String)>;

#[derive(Debug)]
struct SnapshotCollector(Snapshot);

fn gauge<V: prometheus_client::encoding::EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, V)],
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in rows {
        m.encode_family(labels)?.encode_gauge(v)?;
    }
    Ok(())
}

fn counter<V: prometheus_client::encoding::EncodeCounterValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Labels, V)],
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in rows {
        m.encode_family(labels)?
            .encode_counter::<NoLabelSet, _, u64>(v, None)?;
    }
    Ok(())
}

/// A process's series carry its pid.
fn pid_label(p: &ProcessMetrics) -> Labels {
    vec![("pid", p.pid.to_string())]
}

/// The snapshot as OpenMetrics families, one group of series per helper below.
impl Collector for SnapshotCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        targets(s, &mut e)?;
        streams(s, &mut e)?;
        threads(s, &mut e)?;
        jobs(s, &mut e)?;
        journals(s, &mut e)?;
        verdicts_and_losses(s, &mut e)?;
        the_daemon(s, &mut e)
    }
}

/// Each watched process and its verdict.
fn targets(s: &Snapshot, e: &mut DescriptorEncoder) -> fmt::Result {
    gauge(
        e,
        "wedgeprobe_target_info",
        "A process wedgeprobe watches (mode: journal+ebpf or ebpf-only; job and rank when it is one rank of a job).",
        &s.processes
            .iter()
            .map(|p| {
                let mut l = pid_label(p);
                l.push(("comm", p.comm.clone()));
                l.push(("mode", p.mode.to_string()));
                if !p.job.is_empty() {
                    l.push(("job", p.job.clone()));
                    l.push(("rank", p.rank.clone()));
                }
                (l, 1u64)
            })
            .collect::<Vec<_>>(),
    )?;
    gauge(
        e,
        "wedgeprobe_verdict",
        "The current verdict of each process (1 for its kind).",
        &s.processes
            .iter()
            .map(|p| {
                let mut l = pid_label(p);
                l.push(("kind", p.verdict.to_string()));
                (l, 1u64)
            })
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}

/// Per stream: the oldest kernel's age and the kernels in flight.
fn streams(s: &Snapshot, e: &mut DescriptorEncoder) -> fmt::Result {
    let streams: Vec<(Labels, &StreamMetrics)> = s
        .processes
        .iter()
        .flat_map(|p| {
            p.streams.iter().map(move |st| {
                let mut l = pid_label(p);
                l.push(("device", st.device.to_string()));
                l.push(("stream", st.stream.clone()));
                (l, st)
            })
        })
        .collect();
    gauge(
        e,
        "wedgeprobe_oldest_kernel_age_seconds",
        "How long the oldest unfinished kernel of each stream has run (estimate), by kernel.",
        &streams
            .iter()
            .map(|(l, st)| {
                let mut l = l.clone();
                l.push(("kernel", st.kernel.clone()));
                (l, st.oldest_age_seconds)
            })
            .collect::<Vec<_>>(),
    )?;
    gauge(
        e,
        "wedgeprobe_inflight_kernels",
        "Kernels launched and not completed, per stream.",
        &streams
            .iter()
            .map(|(l, st)| (l.clone(), st.in_flight))
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}

/// Host threads inside driver calls, blocked, yielding.
fn threads(s: &Snapshot, e: &mut DescriptorEncoder) -> fmt::Result {
    gauge(
        e,
        "wedgeprobe_threads_in_driver_calls",
        "Host threads inside a CUDA driver call now.",
        &s.processes
            .iter()
            .map(|p| (pid_label(p), p.threads_in_calls))
            .collect::<Vec<_>>(),
    )?;
    gauge(
        e,
        "wedgeprobe_blocked_threads",
        "Host threads inside a driver call for longer than blocked_after.",
        &s.processes
            .iter()
            .map(|p| (pid_label(p), p.blocked_threads))
            .collect::<Vec<_>>(),
    )?;
    gauge(
        e,
        "wedgeprobe_sched_yield_per_second",
        "sched_yield calls per second of the threads inside driver calls.",
        &s.processes
            .iter()
            .map(|p| (pid_label(p), p.sched_yield_per_s))
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}

/// Culprit ranks.
fn jobs(s: &Snapshot, e: &mut DescriptorEncoder) -> fmt::Result {
    gauge(
        e,
        "wedgeprobe_culprit",
        "The rank whose non-collective kernel is stuck while its peers wait in collectives (1).",
        &s.culprits
            .iter()
            .map(|(job, rank, pid, kernel)| {
                (
                    vec![
                        ("job", job.clone()),
                        ("rank", rank.to_string()),
                        ("pid", pid.to_string()),
                        ("kernel", bounded_label(kernel)),
                    ],
                    1u64,
                )
            })
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}

/// What the shims could not record, and journal records lost or skipped.
fn journals(s: &Snapshot, e: &mut DescriptorEncoder) -> fmt::Result {
    gauge(
        e,
        "wedgeprobe_shim_launches_via",
        "How a process's shim records launches: via=\"hooks\" (its launch hooks) or \"callbacks\" (the driver's, the dearer path), with why.",
        &s.processes
            .iter()
            .filter_map(|p| {
                let (via, why) = p.launches_via?;
                let mut l = pid_label(p);
                l.push(("via", via.to_string()));
                l.push(("why", why.to_string()));
                Some((l, 1u64))
            })
            .collect::<Vec<_>>(),
    )?;
    counter(
        e,
        "wedgeprobe_journal_dropped",
        "What the shim could not record, by reason.",
        &s.processes
            .iter()
            .flat_map(|p| {
                p.journal_drops.iter().map(move |(r, v)| {
                    let mut l = pid_label(p);
                    l.push(("reason", r.to_string()));
                    (l, *v)
                })
            })
            .collect::<Vec<_>>(),
    )?;
    counter(
        e,
        "wedgeprobe_journal_ring_lost",
        "Journal records overwritten before wedgeprobe read them.",
        &s.processes
            .iter()
            .map(|p| (pid_label(p), p.journal_ring_lost))
            .collect::<Vec<_>>(),
    )?;
    counter(
        e,
        "wedgeprobe_journal_ring_skipped",
        "Journal records not read: the daemon reads at most the newest 1,024 per process per tick.",
        &s.processes
            .iter()
            .map(|p| (pid_label(p), p.journal_ring_skipped))
            .collect::<Vec<_>>(),
    )?;
    Ok(())
}

/// Verdict changes, eBPF losses, driver call durations.
fn verdicts_and_losses(s: &Snapshot, e: &mut DescriptorEncoder) -> fmt::Result {
    counter(
        e,
        "wedgeprobe_verdicts",
        "Verdict changes into each kind, all processes.",
        &s.verdicts_total
            .iter()
            .map(|(k, v)| (vec![("kind", k.to_string())], *v))
            .collect::<Vec<_>>(),
    )?;
    counter(
        e,
        "wedgeprobe_ebpf_lost",
        "What was not recorded, by reason: the eBPF side's losses and undecodable journal records.",
        &s.ebpf_lost
            .iter()
            .map(|(k, v)| (vec![("reason", k.to_string())], *v))
            .collect::<Vec<_>>(),
    )?;
    {
        let mut m = e.encode_descriptor(
            "wedgeprobe_driver_call_duration_seconds",
            "Duration of finished driver calls (entry points with both probes).",
            None,
            MetricType::Histogram,
        )?;
        for (api, h) in &s.latency {
            let l: Labels = vec![("api", api.to_string())];
            HistMetric(h).encode(m.encode_family(&l)?)?;
        }
    }
    Ok(())
}

/// The daemon itself: dumps, discovery, configuration, its own CPU and memory.
fn the_daemon(s: &Snapshot, e: &mut DescriptorEncoder) -> fmt::Result {
    counter(
        e,
        "wedgeprobe_dumps",
        "Incident dumps written.",
        &[(vec![], s.dumps_total)],
    )?;
    counter(
        e,
        "wedgeprobe_dump_failures",
        "Incident dumps that could not be written (watching goes on).",
        &[(vec![], s.dump_failures_total)],
    )?;
    gauge(
        e,
        "wedgeprobe_dump_dir_bytes",
        "Bytes in the dump directory.",
        &[(vec![], s.dump_dir_bytes)],
    )?;
    counter(
        e,
        "wedgeprobe_discovery_scans",
        "Scans of /proc for CUDA processes.",
        &[(vec![], s.discovery_scans_total)],
    )?;
    gauge(
        e,
        "wedgeprobe_discovery_scan_seconds",
        "Duration of the last /proc scan.",
        &[(vec![], s.discovery_scan_seconds)],
    )?;
    gauge(
        e,
        "wedgeprobe_discovery_pending",
        "Processes not using CUDA (yet), waiting for a re-check.",
        &[(vec![], s.discovery_pending)],
    )?;
    counter(
        e,
        "wedgeprobe_config_reloads",
        "Configurations applied on SIGHUP.",
        &[(vec![], s.config_reloads_total)],
    )?;
    counter(
        e,
        "wedgeprobe_config_errors",
        "Configurations rejected on SIGHUP.",
        &[(vec![], s.config_errors_total)],
    )?;
    gauge(
        e,
        "wedgeprobe_blocked_after_seconds",
        "The configured bound for a blocked thread.",
        &[(vec![], s.blocked_after_seconds)],
    )?;
    let rows: Vec<(Labels, u64)> = s
        .state_entries
        .iter()
        .map(|(table, n)| (vec![("table", (*table).to_string())], *n))
        .collect();
    gauge(
        e,
        "wedgeprobe_daemon_state_entries",
        "Entries in each of the daemon's per-process and per-thread tables: they follow the \
         processes alive, not all that ever ran.",
        &rows,
    )?;
    counter(
        e,
        "process_cpu_seconds",
        "CPU time wedgeprobe itself used (user + system).",
        &[(vec![], s.cpu_seconds)],
    )?;
    gauge(
        e,
        "process_resident_memory_bytes",
        "wedgeprobe's own resident memory.",
        &[(vec![], s.rss_bytes)],
    )?;
    let rows: Vec<_> = s
        .heap_bytes
        .iter()
        .map(|(part, n)| (vec![("part", (*part).to_string())], *n))
        .collect();
    gauge(
        e,
        "wedgeprobe_daemon_heap_bytes",
        "The daemon's C heap over every arena (glibc mallinfo2): in_use, bytes handed out (a \
         structure that grows shows here); free, bytes free inside the arenas (fragmentation).",
        &rows,
    )?;
    Ok(())
}

#[derive(Debug)]
struct HistMetric<'a>(&'a Hist);

impl EncodeMetric for HistMetric<'_> {
    fn encode(&self, mut e: MetricEncoder) -> fmt::Result {
        e.encode_histogram::<NoLabelSet>(self.0.sum, self.0.count, &self.0.buckets, None)
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The OpenMetrics text of a snapshot.
pub fn encode(s: &Snapshot) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotCollector(s.clone())));
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// wedgeprobe's own CPU seconds (getrusage: one system call, where /proc/self/stat is an
/// open, a read and a close every daemon tick) and resident bytes (/proc/self/statm).
pub fn own_usage() -> (f64, u64) {
    let page = crate::sys::page_size();
    // SAFETY: an all-zero rusage is valid; getrusage writes it whole.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    let cpu = if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0 {
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        secs(ru.ru_utime) + secs(ru.ru_stime)
    } else {
        0.0
    };
    let rss = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * page;
    (cpu, rss)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_end_in_inf() {
        let mut h = hdrhistogram::Histogram::<u64>::new(3).unwrap();
        for ns in [20_000u64, 20_000, 2_000_000, 2_000_000_000] {
            h.record(ns).unwrap();
        }
        let b = Hist::from_hdr(&h);
        assert_eq!(b.count, 4);
        assert_eq!(b.buckets[1], (5e-5, 2), "two in (10 µs, 50 µs]");
        assert_eq!(b.buckets[5], (5e-3, 1), "one in (1 ms, 5 ms]");
        assert_eq!(b.buckets.iter().map(|b| b.1).sum::<u64>(), 4);
        assert_eq!(b.buckets.last().unwrap().0, f64::MAX);
        let text = encode(&Snapshot {
            latency: vec![("cuStreamSynchronize", b)],
            ..Snapshot::default()
        });
        assert!(
            text.contains("le=\"+Inf\",api=\"cuStreamSynchronize\"} 4"),
            "{text}"
        );
        assert!(
            text.contains("le=\"0.005\",api=\"cuStreamSynchronize\"} 3"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn long_kernel_names_are_cut() {
        let long = "k".repeat(300);
        assert_eq!(bounded_label(&long).chars().count(), 97);
        assert_eq!(bounded_label("short"), "short");
    }
}
