//! The shim in the shapes production gives it — a pod's small or full /dev/shm, a file size
//! limit, two containers' pid 1 sharing /dev/shm, fork without exec, an attach into a pod —
//! never harms the process it is in, and keeps a journal wedgeprobe reads or says once that it
//! is off.
//!
//! Namespaces come from util-linux's `unshare` (root); where it is not allowed the test says so
//! and skips.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread::sleep,
    time::Duration,
};

use super::{Worker, report_json, require_root, secs, shim_path, wait_until, wedgeprobe};

/// Whether this machine lets root make mount and pid namespaces; the reason if not.
fn namespaces_allowed() -> Result<(), String> {
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--pid",
            "--fork",
            "--propagation",
            "private",
            "true",
        ])
        .output()
        .map_err(|e| format!("unshare: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

macro_rules! require_namespaces {
    () => {
        if let Err(why) = namespaces_allowed() {
            eprintln!("skipping: cannot make mount/pid namespaces here ({why})");
            return;
        }
    };
}

fn simworker() -> String {
    wp_tests::simworker().display().to_string()
}

fn log_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("wp-shim-safety-{name}-{}.log", std::process::id()))
}

/// The simulated worker run by `sh -c "$setup; exec simworker ARGS"` inside `unshare
/// UNSHARE…` (no `--fork`: the worker keeps the pid the test spawned), its stderr to `log`.
fn worker_in(
    unshare: &[&str],
    setup: &str,
    args: &[&str],
    env: &[(&str, &str)],
    log: &Path,
) -> Worker {
    super::wait_for_background_detach();
    let mut cmd = Command::new("unshare");
    cmd.args(unshare)
        .args(["sh", "-c", &format!("{setup} && exec \"$0\" \"$@\"")])
        .arg(simworker())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).expect("create the worker's log"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    Worker {
        child: cmd.spawn().expect("failed to start unshare"),
    }
}

/// A private mount namespace whose /dev/shm is a fresh tmpfs of `size`, `fill` of it taken
/// (a pod's /dev/shm that NCCL and DataLoader workers filled).
fn pod_dev_shm(size: &str, fill: bool) -> String {
    let mut s = format!("mount -t tmpfs -o size={size} tmpfs /dev/shm");
    if fill {
        s += " && (dd if=/dev/zero of=/dev/shm/fill bs=64k 2>/dev/null; true)";
    }
    s
}

const POD_NS: &[&str] = &["--mount", "--propagation", "private"];

/// Waits for `w` to exit (up to `limit`) and returns its exit code (None: killed by a signal,
/// said on stderr, or still running, then killed by the drop).
fn exit_code(mut w: Worker, limit: Duration) -> Option<i32> {
    let pid = w.pid();
    let mut status = None;
    wait_until(limit, || {
        status = w.child.try_wait().ok().flatten();
        status.is_some()
    });
    let status = status?;
    if let Some(sig) = std::os::unix::process::ExitStatusExt::signal(&status) {
        eprintln!("worker {pid} was killed by signal {sig}");
    }
    status.code()
}

fn shim_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("wedgeprobe shim:"))
        .map(str::to_string)
        .collect()
}

/// The report of a wedged worker names its stuck kernel from the journal.
fn assert_named_from_journal(pid: u32) {
    let r = report_json(&["--pid", &pid.to_string(), "--kernel-floor", "1s"]);
    assert_eq!(r["mode"], "journal+ebpf", "pid {pid}: {}", r["targets"][0]);
    assert_eq!(
        r["verdict"]["kind"], "kernel_wedge",
        "pid {pid}: {}",
        r["verdict"]
    );
    assert_eq!(
        r["kernels"][0]["kernel"], "_Z17attn_wedge_kernelP7barrierPf",
        "pid {pid}: {}",
        r["kernels"][0]
    );
    assert_eq!(r["targets"][0]["journal"]["status"], "recording");
}

/// A pod's /dev/shm smaller than the journal (1 MiB; the journal is ~3.8 MiB), and one that is
/// full: the process runs to its end, and its journal names the wedge. (With the journal a
/// file in /dev/shm the first store to an unbacked page was SIGBUS: `Bus error`, exit 135.)
#[test]
fn a_small_or_full_dev_shm_neither_kills_the_process_nor_loses_the_journal() {
    require_root!();
    require_namespaces!();
    let shim = shim_path();
    // Two reports, each waiting for the last one's probes to close (~4 s): the wedge outlasts both.
    let env = [
        ("CUDA_INJECTION64_PATH", shim.as_str()),
        ("SIMCUDA_RELEASE_AFTER_S", "13"),
    ];
    let (small_log, full_log) = (log_path("small"), log_path("full"));
    let small = worker_in(
        POD_NS,
        &pod_dev_shm("1m", false),
        &["wedge", "15", "1500"],
        &env,
        &small_log,
    );
    let full = worker_in(
        POD_NS,
        &pod_dev_shm("4m", true),
        &["wedge", "15", "1500"],
        &env,
        &full_log,
    );
    small.wait_for_cuda();
    full.wait_for_cuda();
    sleep(secs(3.5));
    assert_named_from_journal(small.pid());
    assert_named_from_journal(full.pid());
    for (w, log) in [(small, &small_log), (full, &full_log)] {
        let code = exit_code(w, secs(20.0));
        assert_eq!(
            code,
            Some(0),
            "the worker did not run to its end; its log: {:?}",
            shim_lines(log)
        );
        assert!(shim_lines(log).is_empty(), "{:?}", shim_lines(log));
    }
}

/// A file size limit below the journal's size (`ulimit -f`): sizing a file past it raises
/// SIGXFSZ, fatal by default. The shim refuses at start with one line, and the process runs
/// on, watched eBPF-only.
#[test]
fn a_file_size_limit_below_the_journal_turns_the_shim_off_with_one_line() {
    require_root!();
    let shim = shim_path();
    let log = log_path("fsize");
    super::wait_for_background_detach();
    let child = Command::new("sh")
        .args(["-c", "ulimit -f 1024 && exec \"$0\" \"$@\""])
        .arg(simworker())
        .args(["wedge", "6", "1000"])
        .env("CUDA_INJECTION64_PATH", &shim)
        .env("SIMCUDA_RELEASE_AFTER_S", "4")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let w = Worker { child };
    w.wait_for_cuda();
    sleep(secs(2.5));
    let r = report_json(&["--pid", &w.pid_arg()]);
    assert_eq!(r["mode"], "ebpf-only", "{}", r["targets"][0]);
    assert!(r["targets"][0]["journal"].is_null(), "{}", r["targets"][0]);
    // The host side still sees the wedge (the launcher or the syncer blocked, whichever a
    // loaded machine shows first).
    assert_ne!(r["verdict"]["kind"], "healthy", "{}", r["verdict"]);
    assert_eq!(exit_code(w, secs(20.0)), Some(0));
    let lines = shim_lines(&log);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("file size limit") && lines[0].ends_with("shim off"),
        "{lines:?}"
    );
}

/// The host pid of the one child of `pid` (`unshare --fork`'s command), once it has one.
fn only_child(pid: u32) -> u32 {
    let path = format!("/proc/{pid}/task/{pid}/children");
    let mut child = 0;
    wait_until(secs(5.0), || {
        child = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        child != 0
    });
    assert_ne!(child, 0, "unshare {pid} started no child");
    child
}

/// Two containers of a pod sharing /dev/shm each run their first process as pid 1: both
/// journals live and name each process's wedge. (With `/dev/shm/wedgeprobe-<pid>.journal`
/// the second shim removed the first's file, which was then reported eBPF-only.)
#[test]
fn two_processes_with_the_same_pid_in_their_namespaces_each_keep_a_journal() {
    require_root!();
    require_namespaces!();
    let shim = shim_path();
    let env = [
        ("CUDA_INJECTION64_PATH", shim.as_str()),
        ("SIMCUDA_RELEASE_AFTER_S", "13"),
    ];
    let ns = ["--pid", "--fork", "--kill-child"];
    let (log_a, log_b) = (log_path("pidns-a"), log_path("pidns-b"));
    let a = worker_in(&ns, "true", &["wedge", "15", "1500"], &env, &log_a);
    sleep(secs(0.3));
    let b = worker_in(&ns, "true", &["wedge", "15", "1500"], &env, &log_b);
    let (pa, pb) = (only_child(a.pid()), only_child(b.pid()));
    for p in [pa, pb] {
        let ns_pid = std::fs::read_to_string(format!("/proc/{p}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:").map(str::to_string))
            .unwrap_or_default();
        assert_eq!(
            ns_pid.split_whitespace().last(),
            Some("1"),
            "pid {p}: NSpid {ns_pid}"
        );
    }
    sleep(secs(3.0));
    assert_named_from_journal(pa);
    assert_named_from_journal(pb);
}

/// A process that uses CUDA forks a child without exec that exits normally (its atexit
/// handlers run) after one launch of its own: the parent's journal stays live and names the
/// parent's wedge. (The child's exit used to remove the
/// parent's journal, which was then reported eBPF-only.)
#[test]
fn a_forked_child_leaves_its_parents_journal_recording() {
    require_root!();
    let shim = shim_path();
    let log = log_path("fork");
    let w = Worker::spawn_logged(
        &["wedge", "8", "1500"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMCUDA_RELEASE_AFTER_S", "6"),
            ("SIMWORKER_FORK_CHILD", "launch"),
        ],
        &log,
    );
    w.wait_for_cuda();
    sleep(secs(3.5));
    assert_named_from_journal(w.pid());
    assert_eq!(exit_code(w, secs(20.0)), Some(0));
    assert!(shim_lines(&log).is_empty(), "{:?}", shim_lines(&log));
}

/// `wedgeprobe attach` into a process in a pod whose /dev/shm is full: the attach goes through
/// (the journal needs no room there) and the process serves to its end, its guard thread's
/// registers intact. (It used to die of SIGBUS right after the attach.)
#[test]
fn attaching_into_a_process_whose_dev_shm_is_full_leaves_it_running() {
    require_root!();
    require_namespaces!();
    let log = log_path("attach-full");
    let w = worker_in(
        POD_NS,
        &pod_dev_shm("4m", true),
        &["loop", "8"],
        &[("SIMWORKER_GUARD", "1")],
        &log,
    );
    w.wait_for_cuda();
    sleep(secs(0.5));
    let out = wedgeprobe(&["attach", "--pid", &w.pid_arg()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report_json(&["--pid", &w.pid_arg(), "--window", "300ms"]);
    assert_eq!(
        r["targets"][0]["journal"]["status"], "recording",
        "{}",
        r["targets"][0]
    );
    let mut w = w;
    let mut stdout = String::new();
    if let Some(mut s) = w.child.stdout.take() {
        use std::io::Read as _;
        let _ = s.read_to_string(&mut stdout);
    }
    assert_eq!(exit_code(w, secs(20.0)), Some(0), "{stdout}");
    assert!(stdout.contains("corrupted 0"), "{stdout}");
}
