//! Every shape of host spin a serving process meets, answered by every tool (issue 28):
//! {journal (the shim in), none} × {spinning since long before attach; spinning past
//! `stall_after` after 30 s of healthy serving; beginning to spin while watched} × {a tight
//! native loop with no call in it, a loop calling into libc every turn, a Python loop} ×
//! {`report`, `watch`, the daemon}. Each cell is a `host_stall` of its own process naming the
//! spinning function (the native frame, or the Python one).
//!
//! One test per timing, its six processes (3 loops × journal or not) side by side — the
//! 30 s of healthy serving are paid once, not 18 times. On c0c1473 the rows after healthy
//! serving without a journal were `healthy` (the miss 1: only the window was watched
//! and the thread's life average no longer stood in for the spin), and `watch` of several
//! processes printed only the first to stall.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{Worker, daemon::Daemon, report_json, require_root, secs, shim_path};

const STALL_AFTER: &str = "3s";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Loop {
    /// `while (!flag) n++;` — no call at all.
    Tight,
    /// access(2) of a peer's file every turn.
    Libc,
    /// `while not os.path.exists(path)` in CPython.
    Python,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum When {
    /// The spin began seconds before the tool attached, right after CUDA came up.
    LongBefore,
    /// 30 s of light serving (a launch and its synchronize every 20 ms), then the spin.
    AfterHealthy,
    /// Serving while the tool attaches; the spin begins after.
    WhileWatched,
}

struct Spinner {
    w: Worker,
    shape: Loop,
    journal: bool,
    /// Made by the test: the worker begins to spin (`When::WhileWatched`).
    trigger: PathBuf,
    /// Made by the worker as its spin begins.
    mark: PathBuf,
}

impl Spinner {
    fn new(shape: Loop, journal: bool, when: When, tag: &str) -> Self {
        let base = std::env::temp_dir().join(format!(
            "wp-matrix-{}-{tag}-{shape:?}-{journal}",
            std::process::id()
        ));
        let (trigger, mark) = (base.with_extension("go"), base.with_extension("spinning"));
        let _ = std::fs::remove_file(&trigger);
        let _ = std::fs::remove_file(&mark);
        let (trigger_s, mark_s) = (trigger.display().to_string(), mark.display().to_string());
        let shim = shim_path();
        let healthy = if when == When::AfterHealthy {
            "30"
        } else {
            "0"
        };
        let py = shape == Loop::Python;
        let mut env: Vec<(&str, &str)> = vec![
            (
                if py {
                    "PY_HEALTHY_BEFORE_S"
                } else {
                    "SIMWORKER_HEALTHY_BEFORE_S"
                },
                healthy,
            ),
            (
                if py {
                    "PY_SPIN_MARK"
                } else {
                    "SIMWORKER_SPIN_MARK"
                },
                &mark_s,
            ),
        ];
        if when == When::WhileWatched {
            env.push((
                if py {
                    "PY_SPIN_WHEN"
                } else {
                    "SIMWORKER_SPIN_WHEN"
                },
                &trigger_s,
            ));
        }
        if journal {
            env.push(("CUDA_INJECTION64_PATH", &shim));
        }
        let w = match shape {
            Loop::Tight => Worker::spawn(
                &["spin", "300"],
                &[&env[..], &[("SIMWORKER_SPIN_LOOP", "tight")]].concat(),
            ),
            Loop::Libc => Worker::spawn(
                &["spin", "300"],
                &[&env[..], &[("SIMWORKER_SPIN_LOOP", "libc")]].concat(),
            ),
            Loop::Python => Worker::python(&["handshake", "300"], &env),
        };
        Self {
            w,
            shape,
            journal,
            trigger,
            mark,
        }
    }

    fn name(&self) -> String {
        format!(
            "{:?} loop, {} (pid {})",
            self.shape,
            if self.journal {
                "journal"
            } else {
                "no journal"
            },
            self.w.pid()
        )
    }

    fn spinning(&self) -> bool {
        self.mark.exists()
    }

    fn go(&self) {
        std::fs::write(&self.trigger, "").unwrap();
    }

    /// Where this loop's stall must say it spins: its function, among the top frames.
    fn named_in(&self, t: &Value) -> bool {
        let frames = |k: &str| -> Vec<String> {
            t[k].as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|f| f.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        match self.shape {
            Loop::Tight => frames("native_stack")
                .iter()
                .take(3)
                .any(|f| f.contains("wait_for_peers_ready_tight")),
            Loop::Libc => frames("native_stack")
                .iter()
                .take(4)
                .any(|f| f.contains("wait_for_peers_ready_libc")),
            Loop::Python => frames("python_stack")
                .iter()
                .any(|f| f.starts_with("wait_for_peers_ready (py_launcher.py:")),
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.trigger);
        let _ = std::fs::remove_file(&self.mark);
    }
}

/// The six processes of one timing, with CUDA up (and, but for `WhileWatched`, spinning).
fn spinners(when: When, tag: &str) -> Vec<Spinner> {
    let all: Vec<Spinner> = [Loop::Tight, Loop::Libc, Loop::Python]
        .into_iter()
        .flat_map(|l| [true, false].map(|j| (l, j)))
        .map(|(l, j)| Spinner::new(l, j, when, tag))
        .collect();
    let deadline = Instant::now() + secs(60.0);
    for s in &all {
        if when == When::WhileWatched {
            s.w.wait_for_cuda();
        } else {
            while !s.spinning() {
                assert!(
                    Instant::now() < deadline,
                    "{} never began to spin",
                    s.name()
                );
                sleep(secs(0.05));
            }
        }
    }
    if when == When::WhileWatched {
        // Serving: a few launches and synchronizes in.
        sleep(secs(1.0));
    }
    all
}

/// `report` of all six: each has its own host stall naming its loop.
fn assert_report(all: &[Spinner], r: &Value) {
    assert_eq!(r["verdict"]["kind"], "host_stall", "{}", r["verdict"]);
    let stalls = r["host_stalls"].as_array().unwrap();
    for s in all {
        let stall = stalls
            .iter()
            .find(|x| x["pid"] == s.w.pid())
            .unwrap_or_else(|| panic!("{}: no host stall: {}", s.name(), r["verdict"]));
        assert_eq!(
            stall["gpu_evidence"],
            if s.journal { "journal" } else { "attach" },
            "{}: {stall}",
            s.name()
        );
        let t = &stall["threads"][0];
        assert!(s.named_in(t), "{}: not named: {t}", s.name());
        assert!(
            t["busy_ms"].as_f64().unwrap() >= 3000.0,
            "{}: {t}",
            s.name()
        );
    }
}

/// `watch` of all six for `duration`, `during` run once it has attached: the processes its
/// verdict lines named in a host stall.
fn watch(all: &[Spinner], duration: &str, during: impl FnOnce()) -> Vec<Value> {
    let mut args = vec![
        "watch".to_string(),
        "--json".into(),
        "--no-flight".into(),
        "--stall-after".into(),
        STALL_AFTER.into(),
        "--duration".into(),
        duration.into(),
    ];
    for s in all {
        args.push("--pid".into());
        args.push(s.w.pid_arg());
    }
    let mut child = Command::new(super::wedgeprobe_bin())
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Attached once its "attached" lines are out; read them, then the rest at exit.
    use std::io::{BufRead, BufReader};
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    while seen.len() < all.len() {
        let Some(Ok(l)) = lines.next() else { break };
        if let Ok(v) = serde_json::from_str::<Value>(&l)
            && v["event"] == "attached"
        {
            seen.push(v);
        }
    }
    assert_eq!(
        seen.len(),
        all.len(),
        "watch did not attach to all: {seen:?}"
    );
    during();
    let rest: Vec<Value> = lines
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    let _ = child.wait();
    super::wait_for_background_detach();
    rest.into_iter()
        .filter(|v| v["event"] == "verdict")
        .collect()
}

fn assert_watch(all: &[Spinner], verdicts: &[Value]) {
    for s in all {
        let named = verdicts.iter().any(|v| {
            v["verdict"]["kind"] == "host_stall"
                && v["verdict"]["summary"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(&format!("pid {} (", s.w.pid()))
        });
        assert!(
            named,
            "{}: no host stall from watch: {verdicts:?}",
            s.name()
        );
    }
}

/// The daemon's `host_stall` verdict for each of the six within `within`.
fn assert_daemon(all: &[Spinner], d: &Daemon, within: Duration) {
    for s in all {
        let pid = s.w.pid();
        d.wait_for(within, |e| {
            e["event"] == "verdict" && e["pid"] == pid && e["kind"] == "host_stall"
        });
    }
}

fn pids_args(all: &[Spinner]) -> Vec<String> {
    let mut a = vec!["--stall-after".to_string(), STALL_AFTER.into()];
    for s in all {
        a.push("--pid".into());
        a.push(s.w.pid_arg());
    }
    a
}

/// Spinning before any tool attaches (4 s, past `stall_after`): `report` with its default
/// window, then `watch`, then the daemon.
fn spun_before(when: When, tag: &str) {
    let t0 = Instant::now();
    let all = spinners(when, tag);
    eprintln!("{:.1} s: six spinning", t0.elapsed().as_secs_f64());
    sleep(secs(4.0));
    let args = pids_args(&all);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_report(&all, &report_json(&a));
    eprintln!("{:.1} s: report", t0.elapsed().as_secs_f64());
    assert_watch(&all, &watch(&all, "6s", || {}));
    eprintln!("{:.1} s: watch", t0.elapsed().as_secs_f64());
    let d = Daemon::start(tag, &format!("stall_after = \"{STALL_AFTER}\"\n"));
    assert_daemon(&all, &d, secs(20.0));
    eprintln!("{:.1} s: daemon", t0.elapsed().as_secs_f64());
}

#[test]
fn a_spin_since_long_before_attach_is_a_host_stall_for_every_loop_and_tool() {
    require_root!();
    spun_before(When::LongBefore, "before");
}

#[test]
fn a_spin_after_30_s_of_healthy_serving_is_a_host_stall_for_every_loop_and_tool() {
    require_root!();
    spun_before(When::AfterHealthy, "healthy");
}

/// Serving when the tools attach, spinning after: the daemon and `report --window 8s` both
/// attached, then the six begin; a second six for `watch`.
#[test]
fn a_spin_that_begins_while_watched_is_a_host_stall_for_every_loop_and_tool() {
    require_root!();
    let all = spinners(When::WhileWatched, "while");
    let d = Daemon::start("while", &format!("stall_after = \"{STALL_AFTER}\"\n"));
    for s in &all {
        let pid = s.w.pid();
        d.wait_for(secs(20.0), |e| e["event"] == "attached" && e["pid"] == pid);
    }
    let args = pids_args(&all);
    let mut cmd = Command::new(super::wedgeprobe_bin());
    cmd.args(["report", "--json", "--window", "8s"]).args(&args);
    let report = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Attached: two seconds is ~20x what attaching six processes takes here.
    sleep(secs(2.0));
    for s in &all {
        assert!(!s.spinning(), "{} spun before its trigger", s.name());
        s.go();
    }
    let out = report.wait_with_output().unwrap();
    super::wait_for_background_detach();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_report(&all, &r);
    assert_daemon(&all, &d, secs(10.0));
    drop(d);
    drop(all);
    let again = spinners(When::WhileWatched, "while-watch");
    let verdicts = watch(&again, "8s", || {
        sleep(secs(1.0));
        for s in &again {
            s.go();
        }
    });
    assert_watch(&again, &verdicts);
}
