//! Targets that go away, and a probe that is killed: nothing of ours may stay in the kernel.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    fs,
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    thread::sleep,
    time::Duration,
};

use wp_tests::held::{self, open_fds, threads};

use super::{
    Worker, daemon::Daemon, report_json, require_root, secs, shim_path, wait_until, wedgeprobe_bin,
};

#[test]
fn target_exits_during_report() {
    require_root!();
    let w = Worker::spawn(&["healthy", "1"], &[("SIMCUDA_LONG_KERNEL_MS", "50")]);
    w.wait_for_cuda();
    let r = report_json(&["--pid", &w.pid_arg(), "--window", "3s"]);
    assert_eq!(r["targets"][0]["exited"], true, "{}", r["targets"]);
    assert_eq!(r["verdict"]["kind"], "target_exited");
    drop(w);
}

/// BPF program and link ids held by a process, from its fdinfo (the kernel's own view).
fn bpf_ids(pid: u32) -> (BTreeSet<u32>, BTreeSet<u32>) {
    (held::bpf_ids(pid, "prog_id"), held::bpf_ids(pid, "link_id"))
}

fn loaded_prog_ids() -> BTreeSet<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .collect()
}

fn loaded_link_ids() -> BTreeSet<u32> {
    aya::programs::loaded_links()
        .filter_map(Result::ok)
        .map(|l| l.id())
        .collect()
}

/// Every program and link in `progs` / `links` is unloaded within `timeout`.
fn assert_released(progs: &BTreeSet<u32>, links: &BTreeSet<u32>, timeout: Duration) {
    let gone = wait_until(timeout, || {
        loaded_prog_ids().is_disjoint(progs) && loaded_link_ids().is_disjoint(links)
    });
    assert!(
        gone,
        "still loaded: programs {:?}, links {:?}",
        loaded_prog_ids().intersection(progs).collect::<Vec<_>>(),
        loaded_link_ids().intersection(links).collect::<Vec<_>>()
    );
}

#[test]
fn sigkill_leaves_no_program_or_link_behind() {
    require_root!();
    let w = Worker::spawn(&["healthy", "30"], &[("SIMCUDA_LONG_KERNEL_MS", "50")]);
    w.wait_for_cuda();
    let mut child = Command::new(wedgeprobe_bin())
        .args(["watch", "--pid", &w.pid_arg()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start watch");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("watching pid"), "{first}");
    let (progs, links) = bpf_ids(child.id());
    assert!(progs.len() >= 6, "wedgeprobe holds its programs: {progs:?}");
    assert!(!links.is_empty(), "wedgeprobe holds links: {links:?}");
    assert!(progs.is_subset(&loaded_prog_ids()));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // The kernel releases them as it closes the dead process's fds (~100 ms per uprobe).
    assert_released(&progs, &links, Duration::from_secs(30));
    // No uprobe of ours in tracefs either (aya uses perf-event uprobes, which never appear
    // there; a leftover would be a bug elsewhere).
    let events = fs::read_to_string("/sys/kernel/tracing/uprobe_events").unwrap_or_default();
    assert!(
        !events.contains("simcuda"),
        "leftover uprobe events: {events}"
    );
    drop(w);
    let _ = secs(0.0);
}

/// `report` leaves closing its uprobe links (seconds: an RCU grace period each) to a child
/// process that outlives it: the answer and the exit come at once, and still nothing of
/// ours stays loaded once that child is done.
#[test]
fn report_leaves_no_program_or_link_behind_once_its_child_closed_them() {
    require_root!();
    let w = Worker::spawn(&["healthy", "30"], &[("SIMCUDA_LONG_KERNEL_MS", "50")]);
    w.wait_for_cuda();
    let child = Command::new(wedgeprobe_bin())
        .args(["report", "--json", "--window", "2s", "--pid", &w.pid_arg()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut held = (BTreeSet::new(), BTreeSet::new());
    wait_until(Duration::from_secs(10), || {
        held = bpf_ids(pid);
        !held.1.is_empty()
    });
    let (progs, links) = held;
    assert!(!links.is_empty(), "the report held no links while it ran");
    // Reading stdout and stderr to their end also proves the child let go of them.
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["verdict"]["kind"], "healthy", "{}", r["verdict"]);
    assert_released(&progs, &links, Duration::from_secs(60));
    drop(w);
}

/// The daemon's links do not grow with the processes it watches (issue 34): a process comes and
/// goes by its entry in WP_TARGETS, the waits' probes are linked once per libcuda file
/// (`uprobe_multi`), so stopping closes a handful of links — on c6de343 each process added
/// ~34 per-point links, ~0.1 s each to close (`cargo xtask bench daemon`: SIGTERM to exit).
/// After SIGTERM nothing of it stays in the kernel.
#[test]
fn the_daemons_links_do_not_grow_with_its_processes_and_none_outlive_it() {
    require_root!();
    super::wait_for_background_detach();
    let mut d = Daemon::start("links", "");
    let shim = shim_path();
    let env = [("CUDA_INJECTION64_PATH", shim.as_str())];
    let first = Worker::spawn(&["healthy", "30"], &env);
    let attached = |d: &Daemon, pid: u32| {
        d.wait_for(secs(15.0), |e| e["event"] == "attached" && e["pid"] == pid);
    };
    attached(&d, first.pid());
    let (_, links_one) = bpf_ids(d.pid());
    let more: Vec<Worker> = (0..7)
        .map(|_| Worker::spawn(&["healthy", "30"], &env))
        .collect();
    for w in &more {
        attached(&d, w.pid());
    }
    let (progs, links) = bpf_ids(d.pid());
    assert_eq!(
        links.len(),
        links_one.len(),
        "links with one process {links_one:?}, with eight {links:?}"
    );
    let status = d.terminate();
    assert!(status.success(), "the daemon's exit: {status:?}");
    assert_released(&progs, &links, secs(10.0));
    drop(first);
    drop(more);
}

/// The tgids in the daemon's `WP_TARGETS` map (found through its fdinfo's map ids).
fn targets_in_map(daemon: u32) -> BTreeSet<u32> {
    let ids = held::bpf_ids(daemon, "map_id");
    for id in ids {
        let Ok(info) = aya::maps::MapInfo::from_id(id) else {
            continue;
        };
        if info.name_as_str() != Some("WP_TARGETS") {
            continue;
        }
        let Ok(data) = aya::maps::MapData::from_id(id) else {
            continue;
        };
        let Ok(map) = aya::maps::Map::from_map_data(data) else {
            continue;
        };
        let Ok(targets) = aya::maps::HashMap::<_, u32, u32>::try_from(map) else {
            continue;
        };
        return targets.keys().filter_map(Result::ok).collect();
    }
    BTreeSet::new()
}

/// The pids the daemon's scrape has a `wedgeprobe_target_info` series for.
fn pids_in_metrics(d: &Daemon) -> BTreeSet<u32> {
    d.metrics()
        .lines()
        .filter(|l| l.starts_with("wedgeprobe_target_info{"))
        .filter_map(|l| l.split("pid=\"").nth(1)?.split('"').next()?.parse().ok())
        .collect()
}

/// The daemon's own tables by name (`wedgeprobe_daemon_state_entries`), the flight
/// recorder's events left out (bounded by time, not by processes).
fn state_entries(d: &Daemon) -> BTreeMap<String, u64> {
    d.metrics()
        .lines()
        .filter_map(|l| l.strip_prefix("wedgeprobe_daemon_state_entries{table=\""))
        .filter_map(|l| {
            let (table, n) = l.split_once("\"} ")?;
            Some((table.to_string(), n.trim().parse().ok()?))
        })
        .filter(|(table, _)| table != "flight_events")
        .collect()
}

/// Churn (issue 34; the hour is a bench): workers start and exit every 300 ms, 8 alive at a
/// time, 40 times over. Afterwards the daemon holds the same links, fds and threads as with the
/// first 8, its `WP_TARGETS` lists exactly the live workers and its scrape only their series —
/// nothing of an exited process stays, in the kernel or in its own tables (the flight
/// recorder's window set to 2 s: exited processes' track names stay that long).
#[test]
fn churn_leaves_the_daemon_as_it_was() {
    require_root!();
    super::wait_for_background_detach();
    let d = Daemon::start("churn", "flight_seconds = \"2s\"\n");
    let shim = shim_path();
    let env = [("CUDA_INJECTION64_PATH", shim.as_str())];
    let spawn = || Worker::spawn(&["healthy", "60"], &env);
    let live = |ws: &VecDeque<Worker>| ws.iter().map(Worker::pid).collect::<BTreeSet<u32>>();
    let settled = |ws: &VecDeque<Worker>| {
        let want = live(ws);
        wait_until(secs(30.0), || {
            targets_in_map(d.pid()) == want && pids_in_metrics(&d) == want
        })
    };
    let mut workers: VecDeque<Worker> = (0..8).map(|_| spawn()).collect();
    assert!(
        settled(&workers),
        "the first 8 never all attached: {:?} vs {:?}",
        targets_in_map(d.pid()),
        live(&workers)
    );
    // The daemon's track names are refreshed once a second: the baseline holds the 8's.
    sleep(secs(2.0));
    let (_, links) = bpf_ids(d.pid());
    let (fds, tasks) = (open_fds(d.pid()), threads(d.pid()));
    let entries = || held::hash_map_entries(d.pid()).values().sum::<usize>();
    let entries_before = entries();
    let tables_before = state_entries(&d);
    assert!(
        tables_before.contains_key("thread_scans"),
        "no state entries in the scrape: {tables_before:?}"
    );
    for _ in 0..40 {
        workers.pop_front();
        workers.push_back(spawn());
        sleep(Duration::from_millis(300));
    }
    assert!(
        settled(&workers),
        "after the churn: WP_TARGETS {:?}, scrape {:?}, live {:?}",
        targets_in_map(d.pid()),
        pids_in_metrics(&d),
        live(&workers)
    );
    assert_eq!(bpf_ids(d.pid()).1, links, "the daemon's links changed");
    assert_eq!(open_fds(d.pid()), fds, "the daemon's open fds");
    assert_eq!(threads(d.pid()), tasks, "the daemon's threads");
    // Per-thread entries of the 40 ended processes are gone: they kept ~2 each (yields, last
    // sample) before the sweep; live threads' entries move by a few.
    let after = entries();
    assert!(
        after <= entries_before + 20,
        "hash-map entries {entries_before} -> {after}: {:?}",
        held::hash_map_entries(d.pid())
    );
    // Its own tables follow the 8 alive, not the 48 that ran: on 6161d3f the /proc scans'
    // and the track names' entries of every ended thread stayed; on 17c1794 libcuda's symbol
    // tables, one per process (keyed by its /proc/PID/root path: libcuda_files 8 -> 48).
    sleep(secs(3.0));
    let tables_after = state_entries(&d);
    for (table, before) in &tables_before {
        let now = tables_after.get(table).copied().unwrap_or(0);
        assert!(
            now <= before + before / 2 + 4,
            "{table}: {before} -> {now} entries ({tables_before:?} -> {tables_after:?})"
        );
    }
}

/// A daemon restarted (SIGTERM, then a new one, as systemd restarts it) takes up the live
/// processes again, each once, with as many links as the first held and nothing of the first
/// left in the kernel.
#[test]
fn a_restarted_daemon_takes_up_the_live_processes_again() {
    require_root!();
    super::wait_for_background_detach();
    let shim = shim_path();
    let env = [("CUDA_INJECTION64_PATH", shim.as_str())];
    let workers: Vec<Worker> = (0..4)
        .map(|_| Worker::spawn(&["healthy", "40"], &env))
        .collect();
    let attached_once = |d: &Daemon| {
        for w in &workers {
            d.wait_for(secs(15.0), |e| {
                e["event"] == "attached" && e["pid"] == w.pid()
            });
        }
        for w in &workers {
            let n = d
                .events
                .lock()
                .unwrap()
                .iter()
                .filter(|e| e["event"] == "attached" && e["pid"] == w.pid())
                .count();
            assert_eq!(n, 1, "pid {} attached {n} times", w.pid());
        }
    };
    let mut first = Daemon::start("restart-1", "");
    attached_once(&first);
    let (progs, links) = bpf_ids(first.pid());
    assert!(first.terminate().success());
    assert_released(&progs, &links, secs(10.0));
    let second = Daemon::start("restart-2", "");
    attached_once(&second);
    assert_eq!(
        bpf_ids(second.pid()).1.len(),
        links.len(),
        "links after the restart"
    );
    assert_eq!(
        targets_in_map(second.pid()),
        workers.iter().map(Worker::pid).collect(),
        "WP_TARGETS after the restart"
    );
}
