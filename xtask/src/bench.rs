//! `cargo xtask bench`: the per-launch cost of having wedgeprobe attached, on the simulated
//! driver. A launch-bound loop (`simworker bench N`: N launches, a sync every 1000 so the
//! queue never fills) runs alternately bare and with `wedgeprobe watch` attached, several
//! rounds interleaved (this machine is noisy: compare only within one run), and the medians
//! of the launcher thread's CPU time per launch are compared. The GPU machine uses the same
//! method with gpu/bench.sh.

use std::{
    io::Read as _,
    process::{Command, Stdio},
    thread::sleep,
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::build_wedgeprobe;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: Option<What>,
    /// Launches per run.
    #[arg(long, default_value_t = 200_000)]
    launches: u64,
    /// Rounds of (bare, attached), interleaved.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
}

/// Time the worker waits before its loop, so wedgeprobe has attached when it starts.
const ATTACH_GRACE_MS: u64 = 2000;

#[derive(clap::Subcommand)]
enum What {
    /// Time to first answer of `report` and `watch` against a wedged worker (`--rounds`).
    Answer,
    /// The shim's own CPU cost per launch on the simulated driver, interleaved: no shim, the
    /// shim recording through its launch hooks (the default), and through the driver's
    /// callbacks (`WEDGEPROBE_SHIM_HOOKS=off`, as with CUPTI's callbacks on a GPU — the
    /// simulated callbacks cost less than CUPTI's dispatch).
    Shim,
    /// Export time and peak RSS of a Chrome trace of N events (the goal: 1M events in
    /// ≤ 2 s and ≤ 200 MiB), plain and gzip.
    TraceExport {
        #[arg(long, default_value_t = 1_000_000)]
        events: u64,
    },
    /// The daemon's own CPU and memory while it watches N busy processes on the simulated
    /// driver (the bound: < 2% of one core, < 100 MiB RSS at steady state).
    Daemon {
        #[arg(long, default_value_t = 8)]
        procs: u32,
        /// Seconds measured, after the daemon attached to all of them.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        /// Extra lines for the daemon's config (e.g. `flight_max_events = 1`).
        #[arg(long, default_value = "")]
        config: String,
        /// Idle threads parked in each worker (a PyTorch process has 50-90 threads).
        #[arg(long, default_value_t = 0)]
        idle_threads: u32,
        /// Microseconds between a worker's launches (0: launch-bound, like a PyTorch loop).
        #[arg(long, default_value_t = 50)]
        pace_us: u32,
        /// Leave the daemon running for this many more seconds after the measurement, with
        /// its pid printed (to profile it: `perf record -p PID`).
        #[arg(long, default_value_t = 0)]
        hold: u64,
        /// Seconds between the daemon's start and the measurement (it attaches to the
        /// processes and settles their threads first).
        #[arg(long, default_value_t = 10)]
        warmup: u64,
        /// Another build's `wedgeprobe` to measure instead of this one (the same workers and
        /// shim): run in turns with this build's, for a comparison the machine's drift
        /// does not decide.
        #[arg(long)]
        wedgeprobe: Option<std::path::PathBuf>,
    },
    /// The daemon through an hour of processes starting and exiting (a wedge now and then):
    /// what it holds, sampled as it goes, must stay flat.
    Churn(crate::churn::Churn),
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    match &args.what {
        Some(What::Answer) => return crate::answer::run(args.rounds),
        Some(What::TraceExport { events }) => return trace_export(*events),
        Some(What::Shim) => return shim_sides(args.launches, args.rounds),
        Some(What::Churn(c)) => return crate::churn::run(c),
        Some(What::Daemon {
            procs,
            seconds,
            config,
            idle_threads,
            pace_us,
            hold,
            warmup,
            wedgeprobe,
        }) => {
            return daemon_bounds(
                *procs,
                *seconds,
                config,
                Load {
                    idle_threads: *idle_threads,
                    pace_us: *pace_us,
                    hold: *hold,
                    warmup: *warmup,
                    wedgeprobe: wedgeprobe.clone(),
                },
            );
        }
        None => {}
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark attaches eBPF probes: run it as root");
    }
    let wedgeprobe = build_wedgeprobe(true)?;
    let (mut bare, mut attached) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        // Alternate the order so drift in the machine's load hits both sides alike.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for with_probe in order {
            let ns = one_run(args.launches, with_probe.then_some(wedgeprobe.as_path()))?;
            eprintln!(
                "round {round}: {} {ns:.1} ns/launch",
                if with_probe { "attached" } else { "bare" }
            );
            if with_probe {
                attached.push(ns)
            } else {
                bare.push(ns)
            }
        }
    }
    let (b, a) = (median(&mut bare), median(&mut attached));
    println!(
        "| driver | launches/run | rounds | bare ns/launch | attached ns/launch | added ns/launch | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| simulated | {} | {} | {b:.0} | {a:.0} | {:+.0} | {:.2} |",
        args.launches,
        args.rounds,
        a - b,
        a / b
    );
    Ok(())
}

/// One worker run; returns the launcher thread's CPU ns per launch.
fn one_run(launches: u64, wedgeprobe: Option<&std::path::Path>) -> anyhow::Result<f64> {
    let mut worker = Command::new(wp_tests::simworker())
        .args(["bench", &launches.to_string()])
        .env("SIMWORKER_START_DELAY_MS", ATTACH_GRACE_MS.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .context("failed to start simworker")?;
    let mut probe = match wedgeprobe {
        Some(path) => {
            sleep(Duration::from_millis(200));
            Some(
                Command::new(path)
                    .args(["watch", "--pid", &worker.id().to_string()])
                    .stdout(Stdio::null())
                    .spawn()
                    .context("failed to start wedgeprobe")?,
            )
        }
        None => None,
    };
    let mut out = String::new();
    worker
        .stdout
        .take()
        .context("no stdout")?
        .read_to_string(&mut out)?;
    let status = worker.wait()?;
    if let Some(p) = probe.as_mut() {
        let _ = p.wait(); // it exits by itself when the worker has
    }
    if !status.success() {
        bail!("simworker bench failed: {status}");
    }
    out.split_whitespace()
        .skip_while(|w| *w != "thread_cpu_ns_per_launch")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("unexpected simworker output: {out}"))
}

/// `cargo xtask bench shim`: the launcher thread's CPU ns per launch for each side, rounds
/// interleaved with the order rotated.
fn shim_sides(launches: u64, rounds: u32) -> anyhow::Result<()> {
    let wedgeprobe = build_wedgeprobe(true)?;
    let shim = wedgeprobe.with_file_name("libcupti_shim.so");
    let shim = shim.to_str().context("shim path is not UTF-8")?;
    // WEDGEPROBE_SHIM_BASELINE=PATH: another shim build (e.g. before a change) as a fourth
    // side, in the same interleaved rounds.
    let baseline = std::env::var("WEDGEPROBE_SHIM_BASELINE").ok();
    let mut sides: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("no shim", vec![]),
        ("shim, launch hooks", vec![("CUDA_INJECTION64_PATH", shim)]),
        (
            "shim, driver callbacks",
            vec![
                ("CUDA_INJECTION64_PATH", shim),
                ("WEDGEPROBE_SHIM_HOOKS", "off"),
            ],
        ),
    ];
    if let Some(b) = &baseline {
        sides.push((
            "baseline shim, launch hooks",
            vec![("CUDA_INJECTION64_PATH", b.as_str())],
        ));
    }
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    for round in 0..rounds as usize {
        for k in 0..sides.len() {
            let i = (k + round) % sides.len();
            let (name, env) = &sides[i];
            let mut cmd = Command::new(wp_tests::simworker());
            cmd.args(["bench", &launches.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            for (key, value) in env {
                cmd.env(key, value);
            }
            let out = cmd.output().context("failed to run simworker")?;
            let text = String::from_utf8_lossy(&out.stdout);
            let ns: f64 = text
                .split_whitespace()
                .skip_while(|w| *w != "thread_cpu_ns_per_launch")
                .nth(1)
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("unexpected simworker output: {text}"))?;
            eprintln!("round {round}: {name} {ns:.1} ns/launch");
            results[i].push(ns);
        }
    }
    let base = median(&mut results[0].clone());
    println!("| side | launches/run | rounds | CPU ns/launch (median) | added ns/launch |");
    println!("|---|---|---|---|---|");
    for (i, (name, _)) in sides.iter().enumerate() {
        let m = median(&mut results[i]);
        println!(
            "| {name} | {launches} | {rounds} | {m:.0} | {:+.0} |",
            m - base
        );
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs probe-user's `trace_export` example (release) as a child per output kind and reads its
/// peak RSS from getrusage.
fn trace_export(events: u64) -> anyhow::Result<()> {
    crate::run(Command::new("cargo").args([
        "build",
        "--release",
        "-q",
        "-p",
        "probe-user",
        "--example",
        "trace_export",
    ]))?;
    let exe = crate::workspace_root().join("target/release/examples/trace_export");
    println!("| output | events | seconds | bytes | peak RSS MiB |");
    println!("|---|---|---|---|---|");
    for out in [
        "/tmp/wedgeprobe-bench.json",
        "/tmp/wedgeprobe-bench.json.gz",
    ] {
        let mut child = Command::new(&exe)
            .arg(events.to_string())
            .arg(out)
            .stdout(Stdio::piped())
            .spawn()
            .context("start trace_export")?;
        let mut line = String::new();
        if let Some(mut o) = child.stdout.take() {
            o.read_to_string(&mut line)?;
        }
        // wait4 gives this child's own peak RSS (getrusage(RUSAGE_CHILDREN) would include
        // the cargo build above).
        // SAFETY: a zeroed rusage is a valid out-parameter; the pid is our child's.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let mut status = 0;
        // SAFETY: as above.
        unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
        if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            bail!("trace_export failed: status {status}");
        }
        let v: serde_json::Value =
            serde_json::from_str(line.trim()).context("trace_export output")?;
        println!(
            "| {} | {} | {} | {} | {:.1} |",
            if out.ends_with(".gz") {
                "json.gz"
            } else {
                "json"
            },
            v["events"],
            v["seconds"],
            v["bytes"],
            ru.ru_maxrss as f64 / 1024.0
        );
        let _ = std::fs::remove_file(out);
    }
    Ok(())
}

/// CPU seconds (user + system) and resident bytes of `pid`, from /proc.
pub(crate) fn usage(pid: u32) -> (f64, u64) {
    // SAFETY: sysconf has no preconditions.
    let (ticks, page) = unsafe {
        (
            libc::sysconf(libc::_SC_CLK_TCK),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(vec![], |(_, r)| r.split_whitespace().collect());
    let cpu = f.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    let rss = std::fs::read_to_string(format!("/proc/{pid}/statm"))
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    (cpu / ticks.max(1) as f64, rss * page.max(1) as u64)
}

/// `pid`'s minor page faults so far (/proc/PID/stat's tenth field): a reader that lets go
/// of pages it mapped pays one each time it reads such a page again.
fn minor_faults(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which may hold spaces: state is the third field.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(7)?.parse().ok())
        .unwrap_or(0)
}

/// `pid`'s resident memory by kind, bytes: its own (anonymous) and mapped files and shared
/// memory (for the daemon: mostly the journals it reads, pages of its targets' /dev/shm files
/// that exist whether it reads them or not), from /proc/PID/status.
pub(crate) fn rss_parts(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (kb("RssAnon:"), kb("RssFile:") + kb("RssShmem:"))
}

/// What each simulated worker looks like, and how long to keep the daemon for profiling.
struct Load {
    idle_threads: u32,
    pace_us: u32,
    hold: u64,
    warmup: u64,
    wedgeprobe: Option<std::path::PathBuf>,
}

/// `wedgeprobe daemon --config CFG`, its stdout dropped, its stderr as asked (the churn bench
/// reads its JSON log lines).
pub(crate) fn spawn_daemon(
    wedgeprobe: &std::path::Path,
    cfg: &std::path::Path,
    stderr: Stdio,
) -> std::io::Result<std::process::Child> {
    Command::new(wedgeprobe)
        .args(["daemon", "--config"])
        .arg(cfg)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
}

/// What a daemon bench needs: root, the release build, and a config in a fresh folder
/// (`tag` names it; `extra` lines appended). Returns the binary, the shim and the config.
pub(crate) fn daemon_setup(
    tag: &str,
    extra: &str,
) -> anyhow::Result<(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the daemon attaches eBPF probes: run it as root");
    }
    let wedgeprobe = build_wedgeprobe(true)?;
    let shim = wedgeprobe.with_file_name("libcupti_shim.so");
    let dir = std::env::temp_dir().join(format!("wp-{tag}-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let cfg = dir.join("wedgeprobe.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:0\"\ndump_dir = \"{}\"\n{}\n",
            dir.join("dumps").display(),
            extra.replace("\\n", "\n")
        ),
    )?;
    Ok((wedgeprobe, shim, cfg))
}

fn daemon_bounds(procs: u32, seconds: u64, extra: &str, load: Load) -> anyhow::Result<()> {
    let (built, shim, cfg) = daemon_setup("daemon", extra)?;
    let wedgeprobe = load.wedgeprobe.clone().unwrap_or(built);
    let mut workers = Vec::new();
    for _ in 0..procs {
        workers.push(
            Command::new(wp_tests::simworker())
                .args([
                    "healthy",
                    &(seconds + 20 + load.warmup + load.hold).to_string(),
                ])
                .env("CUDA_INJECTION64_PATH", &shim)
                .env("SIMWORKER_IDLE_THREADS", load.idle_threads.to_string())
                .env("SIMWORKER_PACE_US", load.pace_us.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        );
    }
    // WEDGEPROBE_DEBUG_TICK=1 asks the daemon where a tick's time goes: let its stderr through.
    let daemon_stderr = match std::env::var_os("WEDGEPROBE_DEBUG_TICK") {
        Some(_) => Stdio::inherit(),
        None => Stdio::null(),
    };
    let mut daemon = spawn_daemon(&wedgeprobe, &cfg, daemon_stderr)?;
    let pid = daemon.id();
    // Attaching takes a few seconds (uprobes), settling the threads that existed at attach
    // a few more (two /proc scans each); then steady state.
    sleep(Duration::from_secs(load.warmup));
    let (cpu0, _) = usage(pid);
    let faults0 = minor_faults(pid);
    let mut max_rss = 0;
    for _ in 0..seconds {
        sleep(Duration::from_secs(1));
        max_rss = max_rss.max(usage(pid).1);
    }
    let (cpu1, rss) = usage(pid);
    let faults_per_s = minor_faults(pid).saturating_sub(faults0) as f64 / seconds as f64;
    let (anon, mapped) = rss_parts(pid);
    if load.hold > 0 {
        println!("daemon pid {pid}: held for {} s", load.hold);
        sleep(Duration::from_secs(load.hold));
    }
    // SAFETY: signalling our own children.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let stop = std::time::Instant::now();
    let _ = daemon.wait();
    let stop_s = stop.elapsed().as_secs_f64();
    for mut w in workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    let core_pct = 100.0 * (cpu1 - cpu0) / seconds as f64;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "| processes | idle threads each | pace µs | seconds | daemon CPU (% of one core) | RSS at end MiB | of it its own (anon) | of it mapped journals and files | max RSS MiB | page faults a second | SIGTERM to exit s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {procs} | {} | {} | {seconds} | {core_pct:.2} | {:.1} | {:.1} | {:.1} | {:.1} | {faults_per_s:.0} | {stop_s:.1} |",
        load.idle_threads,
        load.pace_us,
        mib(rss),
        mib(anon),
        mib(mapped),
        mib(max_rss),
    );
    Ok(())
}
