//! `cargo xtask bench churn`: the daemon over a node's working life, compressed — processes
//! start and exit every few seconds, `--alive` at a time, every `--wedge-every`th one wedging
//! for a while — with what the daemon holds sampled as it goes: RSS, open fds, threads, BPF
//! links and hash-map entries (the kernel's view), the scrape's series, its CPU. A daemon that
//! runs for months must hold the same at the end of the hour as after its first minute; the
//! suite's `churn_leaves_the_daemon_as_it_was` is the short version.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpStream,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use wp_tests::held;

use crate::bench::{daemon_setup, spawn_daemon, usage};

#[derive(clap::Args)]
pub struct Churn {
    /// How long the churn lasts.
    #[arg(long, default_value_t = 60.0)]
    minutes: f64,
    /// Processes alive at a time.
    #[arg(long, default_value_t = 16)]
    alive: usize,
    /// Seconds between one process exiting and the next starting.
    #[arg(long, default_value_t = 3.0)]
    every_s: f64,
    /// Every Nth process wedges (2 s after it starts, until it exits).
    #[arg(long, default_value_t = 10)]
    wedge_every: u64,
    /// Seconds between samples of what the daemon holds.
    #[arg(long, default_value_t = 300)]
    sample_s: u64,
    /// Idle threads in each process.
    #[arg(long, default_value_t = 60)]
    idle_threads: u32,
}

/// The daemon's log, by event.
#[derive(Default)]
struct Seen {
    attached: BTreeSet<u32>,
    detached: BTreeSet<u32>,
    wedge_verdicts: BTreeSet<u32>,
    other: BTreeMap<String, u64>,
}

pub fn run(c: &Churn) -> anyhow::Result<()> {
    let (wedgeprobe, shim, cfg) = daemon_setup("churn", "log_format = \"json\"")?;
    let mut daemon = spawn_daemon(&wedgeprobe, &cfg, Stdio::piped())?;
    let pid = daemon.id();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let addr = Arc::new(Mutex::new(String::new()));
    let (sink, at) = (seen.clone(), addr.clone());
    let stderr = daemon.stderr.take().context("the daemon's stderr")?;
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let p = v["pid"].as_u64().unwrap_or(0) as u32;
            let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
            match v["event"].as_str().unwrap_or("") {
                "started" => {
                    *at.lock().unwrap_or_else(|e| e.into_inner()) =
                        v["listen"].as_str().unwrap_or("").into()
                }
                "attached" => drop(s.attached.insert(p)),
                "detached" => drop(s.detached.insert(p)),
                "verdict" if v["kind"] == "kernel_wedge" => drop(s.wedge_verdicts.insert(p)),
                other => *s.other.entry(other.to_string()).or_default() += 1,
            }
        }
    });
    let lifetime = c.alive as f64 * c.every_s;
    let spawn = |n: u64| -> anyhow::Result<(Child, bool)> {
        let wedge = c.wedge_every > 0 && n % c.wedge_every == c.wedge_every - 1;
        let mut cmd = Command::new(wp_tests::simworker());
        if wedge {
            cmd.args(["wedge", &format!("{lifetime}"), "2000"]);
        } else {
            cmd.args(["healthy", &format!("{lifetime}")]);
        }
        let child = cmd
            .env("CUDA_INJECTION64_PATH", &shim)
            .env("SIMWORKER_IDLE_THREADS", c.idle_threads.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        Ok((child, wedge))
    };
    let mut live: VecDeque<Child> = VecDeque::new();
    let mut started = 0u64;
    let mut wedges = Vec::new();
    // Staggered start: one every `every_s`, so exits stay spread out.
    let t0 = Instant::now();
    let total = Duration::from_secs_f64(c.minutes * 60.0);
    let mut next_sample = t0;
    let (mut cpu_last, mut t_last) = (usage(pid).0, Instant::now());
    println!(
        "| minute | started | alive | RSS MiB | of it its own (anon) / the journals' and files' pages | C heap in use / free in its arenas MiB | fds | threads | links | hash-map entries | scrape series | daemon tables' entries / flight events | CPU % of a core (since last) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut first_row = None;
    let mut last_row = None;
    while t0.elapsed() < total {
        // Reap the ones that ended (their lifetime is up).
        live.retain_mut(|ch| !matches!(ch.try_wait(), Ok(Some(_))));
        if live.len() < c.alive {
            let (ch, wedge) = spawn(started)?;
            if wedge {
                wedges.push((ch.id(), Instant::now()));
            }
            live.push_back(ch);
            started += 1;
        }
        if Instant::now() >= next_sample {
            let (cpu, rss) = usage(pid);
            // RSS counts the alive processes' journal pages the daemon has touched (shared
            // memfd pages): what grows must be told apart from its own heap.
            let (anon, mapped) = crate::bench::rss_parts(pid);
            let pct = 100.0 * (cpu - cpu_last) / t_last.elapsed().as_secs_f64().max(1e-3);
            (cpu_last, t_last) = (cpu, Instant::now());
            let maps = held::hash_map_entries(pid);
            let entries: usize = maps.values().sum();
            let text = scrape(&addr.lock().unwrap_or_else(|e| e.into_inner()));
            let series = text
                .lines()
                .filter(|l| !l.starts_with('#') && !l.is_empty())
                .count();
            let (tables, flight) = state_entries(&text);
            let (heap_used, heap_free) = heap(&text);
            let row = (
                rss >> 20,
                held::open_fds(pid),
                held::threads(pid),
                held::bpf_ids(pid, "link_id").len(),
                entries,
                series,
            );
            println!(
                "| {:.0} | {started} | {} | {} | {} / {} | {:.1} / {:.1} | {} | {} | {} | {} ({}) | {} | {tables} / {flight} | {pct:.2} |",
                t0.elapsed().as_secs_f64() / 60.0,
                live.len(),
                row.0,
                anon >> 20,
                mapped >> 20,
                heap_used as f64 / (1u64 << 20) as f64,
                heap_free as f64 / (1u64 << 20) as f64,
                row.1,
                row.2,
                row.3,
                row.4,
                maps.iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                row.5
            );
            std::io::stdout().flush().ok();
            if first_row.is_none() && t0.elapsed() > Duration::from_secs_f64(lifetime) {
                first_row = Some(row);
            }
            last_row = Some(row);
            next_sample += Duration::from_secs(c.sample_s);
        }
        sleep(Duration::from_secs_f64(c.every_s));
    }
    // A wedge counts once it had time to be declared: 2 s to wedge, then the daemon's
    // blocked-after (1 s) and a scan or two.
    let all_wedges: Vec<u32> = wedges.iter().map(|(p, _)| *p).collect();
    let wedges: Vec<u32> = wedges
        .into_iter()
        .filter(|(_, at)| at.elapsed() >= Duration::from_secs(8))
        .map(|(p, _)| p)
        .collect();
    for mut ch in live.drain(..) {
        let _ = ch.kill();
        let _ = ch.wait();
    }
    sleep(Duration::from_secs(3));
    let (idle_rss, idle_fds, idle_links) = (
        usage(pid).1 >> 20,
        held::open_fds(pid),
        held::bpf_ids(pid, "link_id").len(),
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let stop = Instant::now();
    let _ = daemon.wait();
    let s = seen.lock().unwrap_or_else(|e| e.into_inner());
    let named = wedges
        .iter()
        .filter(|p| s.wedge_verdicts.contains(p))
        .count();
    println!(
        "\n{started} processes over {:.1} min ({} alive at a time, one every {} s, {} idle threads each); \
         the daemon attached {}, let go {}; {} of {} wedges (that lived 8 s) declared kernel_wedge, \
         {} kernel_wedge verdicts on other processes; other events: {:?}",
        c.minutes,
        c.alive,
        c.every_s,
        c.idle_threads,
        s.attached.len(),
        s.detached.len(),
        named,
        wedges.len(),
        s.wedge_verdicts
            .iter()
            .filter(|p| !all_wedges.contains(p))
            .count(),
        s.other
    );
    if let (Some(a), Some(b)) = (first_row, last_row) {
        println!(
            "first full sample → last: RSS {} → {} MiB, fds {} → {}, threads {} → {}, links {} → {}, \
             hash-map entries {} → {}, series {} → {}",
            a.0, b.0, a.1, b.1, a.2, b.2, a.3, b.3, a.4, b.4, a.5, b.5
        );
    }
    println!(
        "with every process gone: RSS {idle_rss} MiB, {idle_fds} fds, {idle_links} links; \
         SIGTERM to exit {:.2} s",
        stop.elapsed().as_secs_f64()
    );
    Ok(())
}

/// From a scrape: the entries of the daemon's per-process and per-thread tables together, and
/// the flight recorder's events (`wedgeprobe_daemon_state_entries`; bounded by time instead).
fn state_entries(text: &str) -> (u64, u64) {
    let mut out = (0, 0);
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("wedgeprobe_daemon_state_entries{table=\"") else {
            continue;
        };
        let Some((table, n)) = rest.split_once("\"} ") else {
            continue;
        };
        let n: u64 = n.trim().parse().unwrap_or(0);
        if table == "flight_events" {
            out.1 += n;
        } else {
            out.0 += n;
        }
    }
    out
}

/// The daemon's C heap from its scrape, bytes: (in use, free in its arenas).
fn heap(text: &str) -> (u64, u64) {
    let part = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(&format!("wedgeprobe_daemon_heap_bytes{{part=\"{name}\"}} "))
            })
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    };
    (part("in_use"), part("free"))
}

/// The daemon's /metrics, plain text.
fn scrape(addr: &str) -> String {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}
