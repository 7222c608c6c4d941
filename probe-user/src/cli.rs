//! Every subcommand's flags. Flags set `Settings` (defaults in `settings::defaults`, shown
//! here as the flags' defaults); the commands take the parsed values.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::settings::{Settings, defaults, parse_duration};

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
    Trace(TraceArgs),
    /// Print the path to put in CUDA_INJECTION64_PATH (the shim next to this binary).
    ShimPath,
    /// Join reports (and traces) of several nodes: one clock, the job-wide culprit rank.
    Merge(MergeArgs),
    /// Always on: find every CUDA process on the node, watch them, serve Prometheus metrics,
    /// write incident dumps.
    Daemon(DaemonArgs),
    /// Put the shim into running CUDA processes: their launches are journaled from then on,
    /// as if they had been started with it (see the README for what it checks first).
    Attach(AttachArgs),
    /// Make a process's shim give CUPTI back, so torch.profiler / Nsight can subscribe.
    Release {
        #[arg(long, value_name = "PID")]
        pid: u32,
    },
}

/// The flags that become `Settings`: when a thread is blocked, a kernel stuck, a process in a
/// host stall, and what makes a job and a collective.
#[derive(Args, Debug, Clone)]
pub struct SettingsArgs {
    /// A thread inside a driver call for this long counts as blocked (e.g. 1s, 500ms).
    #[arg(long, default_value = defaults::BLOCKED_AFTER, value_parser = parse_duration)]
    pub blocked_after: Duration,
    /// With a shim journal: a kernel is suspect once it has run this long and longer than
    /// --kernel-multiple times its own p99 (when it has history).
    #[arg(long, default_value = defaults::KERNEL_FLOOR, value_parser = parse_duration)]
    pub kernel_floor: Duration,
    #[arg(long, default_value_t = defaults::KERNEL_MULTIPLE)]
    pub kernel_multiple: f64,
    /// A suspect kernel running this long is stuck even with no host thread blocked on it.
    #[arg(long, default_value = defaults::KERNEL_HARD_BOUND, value_parser = parse_duration)]
    pub kernel_hard_bound: Duration,
    /// A process whose GPU work has not moved for this long, with no kernel in flight and a
    /// thread spinning on a core, is in a host stall.
    #[arg(long, default_value = defaults::STALL_AFTER, value_parser = parse_duration)]
    pub stall_after: Duration,
    /// Without a shim journal (nothing shows whether the GPU completes work), a launch,
    /// synchronize or copy blocked this long is an incident; before, the verdict is `waiting`.
    #[arg(long, default_value = defaults::NO_JOURNAL_BOUND, value_parser = parse_duration)]
    pub no_journal_bound: Duration,
    /// Treat all the PIDs as the ranks of one job (else jobs come from their environment).
    #[arg(long)]
    pub job: bool,
    /// A kernel whose name contains PATTERN is a collective (repeat; added to the built-in
    /// NCCL / custom all-reduce patterns).
    #[arg(long = "collective", value_name = "PATTERN")]
    pub collectives: Vec<String>,
}

impl SettingsArgs {
    pub fn settings(&self) -> Settings {
        let mut s = Settings::new(
            self.blocked_after,
            self.kernel_floor,
            self.kernel_multiple,
            self.kernel_hard_bound,
            self.stall_after,
        )
        .with_no_journal_bound(self.no_journal_bound)
        .with_collectives(&self.collectives);
        s.one_job = self.job;
        s
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub settings: SettingsArgs,
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
    #[command(flatten)]
    pub settings: SettingsArgs,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    #[command(flatten)]
    pub targets: Targets,
    /// How long to observe before printing (at most 60s). A thread already inside a call at
    /// attach is known to be inside for at least this long, so the default (1s) equals the
    /// default --blocked-after. Without it, the window grows while a thread busy on the host
    /// since attach cannot be dated (no shim journal), up to --stall-after: watching is what
    /// tells a stall from work then. Given, it is the window.
    #[arg(long, value_parser = parse_duration)]
    pub window: Option<Duration>,
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

#[derive(Args, Debug)]
pub struct TraceArgs {
    #[command(flatten)]
    pub targets: Targets,
    /// How long to record (Ctrl-C ends it early, the file stays valid).
    #[arg(long, default_value = defaults::TRACE_DURATION, value_parser = parse_duration)]
    pub duration: Duration,
    /// Output file: Chrome trace JSON, gzip-compressed when it ends in `.gz`.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: std::path::PathBuf,
}

#[derive(Args, Debug)]
pub struct DaemonArgs {
    /// TOML configuration (README, "The daemon"); defaults without it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
pub struct MergeArgs {
    /// `report --json` files and/or Chrome traces (`.json`, `.json.gz`) from several nodes.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<std::path::PathBuf>,
    /// Write the traces among FILES joined into one Chrome trace here.
    #[arg(short = 'o', long = "output", value_name = "TRACE")]
    pub output: Option<std::path::PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The flight recorder (`watch`, `run`): the last seconds of events, written as a Chrome
/// trace with the JSON report beside it once per incident.
#[derive(Args, Debug, Clone)]
pub struct FlightArgs {
    /// Where incident dumps go (`<host>-<pid>-<time>.trace.json.gz` and `.report.json`).
    #[arg(long, default_value = defaults::FLIGHT_DIR, value_name = "DIR")]
    pub flight_dir: std::path::PathBuf,
    /// How many seconds of events the flight recorder keeps.
    #[arg(long, default_value = defaults::FLIGHT_SECONDS, value_parser = parse_duration)]
    pub flight_seconds: Duration,
    /// At most this many events in memory (~120 bytes each); the oldest go first.
    #[arg(long, default_value_t = defaults::FLIGHT_MAX_EVENTS)]
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

#[derive(Args, Debug)]
pub struct AttachArgs {
    /// The process to put the shim into (repeat for several).
    #[arg(long = "pid", value_name = "PID", required = true)]
    pub pids: Vec<u32>,
    /// One JSON object per process.
    #[arg(long)]
    pub json: bool,
}
