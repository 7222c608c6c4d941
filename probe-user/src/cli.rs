//! Command-line flags, then the validated configuration the rest of the code trusts.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "wedgeprobe",
    version,
    about = "Find the wedged GPU kernel and the host threads stuck behind it, live"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Observe the processes briefly and print what they are waiting on right now.
    Report(ReportArgs),
    /// Watch continuously; print a line whenever a thread becomes blocked or unblocked.
    Watch(WatchArgs),
    /// Start a command with the shim injected and watch it (lines on stderr); exits with
    /// the command's exit code.
    Run(RunArgs),
    /// Record a Chrome trace (Perfetto UI, chrome://tracing, speedscope) of the processes.
    Trace(crate::commands::trace::TraceArgs),
    /// Print the path to put in CUDA_INJECTION64_PATH (the shim next to this binary).
    ShimPath,
    /// Join reports (and traces) of several nodes: one clock, the job-wide culprit rank.
    Merge(crate::commands::merge::MergeArgs),
    /// Always on: find every CUDA process on the node, watch them, serve Prometheus metrics,
    /// write incident dumps.
    Daemon(crate::commands::daemon::DaemonArgs),
    /// Make a process's shim give CUPTI back, so torch.profiler / Nsight can subscribe.
    Release {
        #[arg(long, value_name = "PID")]
        pid: u32,
    },
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// A thread inside a driver call for this long counts as blocked.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub blocked_after: Duration,
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub kernel_floor: Duration,
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Do not inject the shim (eBPF only).
    #[arg(long)]
    pub no_shim: bool,
    #[command(flatten)]
    pub flight: FlightArgs,
    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct Targets {
    /// Process to attach to (repeat for several).
    #[arg(long = "pid", required = true, value_name = "PID")]
    pub pids: Vec<u32>,
    /// A thread inside a driver call for this long counts as blocked (e.g. 1s, 500ms).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub blocked_after: Duration,
    /// With a shim journal: a kernel is suspect once it has run this long and longer than
    /// --kernel-multiple times its own p99 (when it has history).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub kernel_floor: Duration,
    #[arg(long, default_value_t = 10.0)]
    pub kernel_multiple: f64,
    /// A suspect kernel running this long is stuck even with no host thread blocked on it.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub kernel_hard_bound: Duration,
    /// A process whose GPU work has not moved for this long, with no kernel in flight and a
    /// thread spinning on a core, is in a host stall.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub stall_after: Duration,
    /// Treat all the PIDs as the ranks of one job (else jobs come from their environment).
    #[arg(long)]
    pub job: bool,
    /// A kernel whose name contains PATTERN is a collective (repeat; added to the built-in
    /// NCCL / custom all-reduce patterns).
    #[arg(long = "collective", value_name = "PATTERN")]
    pub collectives: Vec<String>,
}

impl Targets {
    /// Applies the job-level options (process-wide settings read by the verdict code).
    pub fn apply_job_options(&self) {
        crate::verdict::job::set_one_job(self.job);
        crate::verdict::host_stall::set_stall_after_ns(self.stall_after.as_nanos() as u64);
        crate::verdict::kernel::set_extra_collectives(self.collectives.clone());
    }

    pub fn kernel_bounds(&self) -> crate::verdict::kernel::Bounds {
        crate::verdict::kernel::Bounds {
            floor_ms: self.kernel_floor.as_secs_f64() * 1e3,
            multiple: self.kernel_multiple.max(1.0),
            hard_ms: self.kernel_hard_bound.as_secs_f64() * 1e3,
        }
    }
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    #[command(flatten)]
    pub targets: Targets,
    /// How long to observe before printing (at most 60s). A thread already inside a call at
    /// attach is known to be inside for at least this long, so the default equals the
    /// default --blocked-after.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub window: Duration,
    /// Print JSON (schema in the README) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Trace launches with an entry probe only, as `watch` does: no launch latencies, and
    /// ~1 µs less per launch while attached (BENCHMARKS.md).
    #[arg(long)]
    pub no_launch_returns: bool,
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    #[command(flatten)]
    pub targets: Targets,
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Stop after this long (default: until Ctrl-C or every target exited).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Also put return probes on launches: exact launch latencies, at ~1 µs more per launch
    /// (BENCHMARKS.md). Without it a launch's end is inferred (sched_yield, stack samples).
    #[arg(long)]
    pub launch_returns: bool,
    #[command(flatten)]
    pub flight: FlightArgs,
}

/// The flight recorder (`watch`, `run`): the last seconds of events, written as a Chrome
/// trace with the JSON report beside it once per incident.
#[derive(Args, Debug, Clone)]
pub struct FlightArgs {
    /// Where incident dumps go (`<host>-<pid>-<time>.trace.json.gz` and `.report.json`).
    #[arg(long, default_value = "/var/tmp/wedgeprobe", value_name = "DIR")]
    pub flight_dir: std::path::PathBuf,
    /// How many seconds of events the flight recorder keeps.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub flight_seconds: Duration,
    /// At most this many events in memory (~120 bytes each); the oldest go first.
    #[arg(long, default_value_t = 500_000)]
    pub flight_max_events: usize,
    /// No flight recorder, no dumps.
    #[arg(long)]
    pub no_flight: bool,
}

impl FlightArgs {
    pub fn config(&self) -> Option<crate::output::trace::flight::FlightConfig> {
        (!self.no_flight).then(|| crate::output::trace::flight::FlightConfig {
            dir: self.flight_dir.clone(),
            seconds: self.flight_seconds.as_secs_f64(),
            max_events: self.flight_max_events.max(1),
        })
    }
}

/// `1s`, `250ms`, `2.5s`, `1m`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 1s or 250ms"))?;
    let secs = v * scale;
    if !secs.is_finite() || secs <= 0.0 || secs > 86_400.0 {
        return Err(format!("`{s}` is out of range (more than 0, at most 24h)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("NaNs").is_err());
    }
}
