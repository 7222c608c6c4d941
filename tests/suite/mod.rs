//! Helpers shared by the integration tests: workloads that clean up after themselves,
//! running wedgeprobe, and the root check.

mod attach;
mod bad_input;
mod daemon;
mod graph_marks;
mod job;
mod lifecycle;
mod prometheus;
mod report;
mod shim;
mod shim_safety;
mod stall_matrix;
mod trace;
mod watch;

use std::{
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

/// Skips (with the reason on stderr) unless running as root.
macro_rules! require_root {
    () => {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: needs root to load eBPF programs (CI runs as root)");
            return;
        }
    };
}
pub(crate) use require_root;

/// The wedgeprobe binary `cargo xtask test` builds before the tests.
pub fn wedgeprobe_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("WEDGEPROBE_BIN") {
        return p.into();
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/wedgeprobe");
    assert!(
        p.exists(),
        "{} is missing: run `cargo xtask test` (it builds it first)",
        p.display()
    );
    p
}

/// A simulated-driver workload, killed when dropped.
/// A host with every core taken (as CI's and a loaded node's are): one busy loop per core,
/// killed when dropped.
pub struct BusyHost(Vec<Child>);

impl BusyHost {
    pub fn every_core() -> Self {
        let n = std::thread::available_parallelism().map_or(2, |n| n.get());
        BusyHost(
            (0..n)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .expect("sh")
                })
                .collect(),
        )
    }
}

impl Drop for BusyHost {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub struct Worker {
    pub child: Child,
}

impl Worker {
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Self {
        wait_for_background_detach();
        let mut cmd = Command::new(wp_tests::simworker());
        cmd.args(args).stdout(Stdio::null()).stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self {
            child: cmd.spawn().expect("failed to start simworker"),
        }
    }

    /// `spawn` with the worker's stderr (the shim's log lines) going to `log`.
    pub fn spawn_logged(args: &[&str], env: &[(&str, &str)], log: &std::path::Path) -> Self {
        wait_for_background_detach();
        let mut cmd = Command::new(wp_tests::simworker());
        let file = std::fs::File::create(log).expect("create the worker's log");
        cmd.args(args).stdout(Stdio::null()).stderr(file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self {
            child: cmd.spawn().expect("failed to start simworker"),
        }
    }

    /// `spawn` with the worker's stdout piped (read it with `child.stdout` after it ends).
    pub fn spawn_piped(args: &[&str], env: &[(&str, &str)]) -> Self {
        wait_for_background_detach();
        let mut cmd = Command::new(wp_tests::simworker());
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self {
            child: cmd.spawn().expect("failed to start simworker"),
        }
    }

    /// `simcuda/py_launcher.py` on the simulated libcuda: a CPython process (its mode in
    /// `args`: none, `handshake [S]`, `build [S]`).
    pub fn python(args: &[&str], env: &[(&str, &str)]) -> Self {
        wait_for_background_detach();
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("simcuda/py_launcher.py");
        let mut cmd = Command::new("python3");
        cmd.arg(script)
            .arg(wp_tests::sim_dir().join("libcuda.so.1"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self {
            child: cmd.spawn().expect("failed to start python3"),
        }
    }

    pub fn spawn_path(path: PathBuf, args: &[&str]) -> Self {
        wait_for_background_detach();
        let child = Command::new(path)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("failed to start worker");
        Self { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn pid_arg(&self) -> String {
        self.pid().to_string()
    }

    /// Waits (up to 5 s) until the worker has mapped libcuda: attaching before that is
    /// refused with exit code 4, which a loaded CI machine can hit right after spawn.
    pub fn wait_for_cuda(&self) -> &Self {
        let maps = format!("/proc/{}/maps", self.pid());
        let mapped = wait_until(Duration::from_secs(5), || {
            std::fs::read_to_string(&maps).is_ok_and(|m| m.contains("libcuda"))
        });
        assert!(mapped, "worker {} never mapped libcuda", self.pid());
        self
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The shim `cargo xtask test` builds next to the wedgeprobe binary.
pub fn shim_path() -> String {
    let p = wedgeprobe_bin().with_file_name("libcupti_shim.so");
    assert!(
        p.exists(),
        "{} is missing: run `cargo xtask test` (it builds it first)",
        p.display()
    );
    p.display().to_string()
}

pub fn wedgeprobe(args: &[&str]) -> Output {
    let out = Command::new(wedgeprobe_bin())
        .args(args)
        .output()
        .expect("failed to run wedgeprobe");
    wait_for_background_detach();
    out
}

/// `report` leaves closing its uprobe links to a child process that outlives it
/// (`probe_user::sys::leave_files_to_a_child`); while that child closes them (~4 s here),
/// the kernel makes any new uprobe attach wait behind the same mutex. The next command of a
/// test would then attach seconds late — a test of attach timing would measure the previous
/// command (2026-12-01 saw two such failures). So a test waits for such children (a live
/// wedgeprobe process that is not its own child) before it goes on: after every command run
/// through `wedgeprobe`, and before a worker starts. At most 30 s, never a failure.
pub fn wait_for_background_detach() {
    wait_until(Duration::from_secs(30), || !background_wedgeprobe_alive());
}

fn background_wedgeprobe_alive() -> bool {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            return false;
        };
        // pid (comm) state ppid …
        let Some((head, rest)) = stat.rsplit_once(") ") else {
            return false;
        };
        let mut f = rest.split_whitespace();
        let (state, ppid) = (f.next(), f.next().and_then(|p| p.parse::<u32>().ok()));
        head.ends_with("(wedgeprobe") && state != Some("Z") && ppid != Some(me)
    })
}

/// How launches are traced, from an `attached` or `shim_stopped` event ("" when absent).
pub fn launch_probes(event: &serde_json::Value) -> &str {
    event["launch_probes"].as_str().unwrap_or("")
}

/// `wedgeprobe report --json` parsed, with its exit status checked.
/// For tests of what a verdict without a journal names, not of when it becomes an incident:
/// the no-journal bound out of the way (1 ms: the blocked bound decides, as before the bound
/// existed). Its default, 10 s, is tested by `a_wait_without_a_journal_is_waiting_until_its_bound`
/// and the daemon's `without_a_journal_healthy_waits_are_not_incidents_and_a_wedge_is_one`.
pub const BOUND_AT_BLOCKED: [&str; 2] = ["--no-journal-bound", "1ms"];

pub fn report_json(args: &[&str]) -> serde_json::Value {
    report_json_and_stderr(args).0
}

/// `report --json ARGS`, which must succeed: its answer and what it said on stderr.
pub fn report_json_and_stderr(args: &[&str]) -> (serde_json::Value, String) {
    let mut all = vec!["report", "--json"];
    all.extend_from_slice(args);
    let out = wedgeprobe(&all);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "wedgeprobe {all:?} failed: {}\n{err}",
        out.status,
    );
    let r = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", String::from_utf8_lossy(&out.stdout)));
    (r, err)
}

/// The report's list `field` is present and empty (`context` leads the message).
pub fn assert_empty_list(r: &serde_json::Value, field: &str, context: &str) {
    assert_eq!(
        r[field].as_array().map(Vec::len),
        Some(0),
        "{context}{field}: {}",
        r[field]
    );
}

/// The thread of the report named `name`, if it is inside a call.
pub fn thread<'a>(report: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    report["threads"]
        .as_array()?
        .iter()
        .find(|t| t["name"] == name)
}

/// The simulated driver's stuck kernel (`simworker`'s wedge).
pub const WEDGE_KERNEL: &str = "_Z17attn_wedge_kernelP7barrierPf";

/// The report's verdict is a kernel wedge whose stuck kernel is `kernel`, named exactly;
/// returns the head (`what` says which case failed).
pub fn assert_named_exactly<'a>(
    r: &'a serde_json::Value,
    kernel: &str,
    what: &str,
) -> &'a serde_json::Value {
    assert_eq!(
        r["verdict"]["kind"], "kernel_wedge",
        "{what}: {}",
        r["verdict"]
    );
    let head = &r["kernels"][0];
    assert_eq!(head["kernel"], kernel, "{what}: {head}");
    assert_eq!(head["exact"], true, "{what}: {head}");
    head
}

/// Polls `f` until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return true;
        }
        sleep(Duration::from_millis(50));
    }
    false
}

pub fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}
