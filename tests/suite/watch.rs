//! `wedgeprobe watch`: blocked/unblocked crossings as they happen.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use super::{Worker, require_root, wedgeprobe_bin};

/// The wedge begins after attach and is released 3 s later: watch prints BLOCKED for the
/// launcher and the syncer, then UNBLOCKED for both, then EXITED, and exits 0 by itself.
#[test]
fn watch_prints_crossings_and_follows_the_target_to_its_exit() {
    require_root!();
    let w = Worker::spawn(&["wedge", "6", "1500"], &[("SIMCUDA_RELEASE_AFTER_S", "3")]);
    w.wait_for_cuda();
    let mut child = Command::new(wedgeprobe_bin())
        .args([
            "watch",
            "--json",
            "--pid",
            &w.pid_arg(),
            "--duration",
            "30s",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start watch");
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send((Instant::now(), line));
        }
    });
    let mut events = Vec::new();
    while let Ok((at, line)) = rx.recv_timeout(Duration::from_secs(30)) {
        let v: serde_json::Value = serde_json::from_str(&line).expect("JSON line");
        events.push((at, v));
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let kinds: Vec<String> = events
        .iter()
        .map(|(_, e)| {
            let name = e["thread"]["name"].as_str().unwrap_or("");
            format!("{} {}", e["event"].as_str().unwrap_or("?"), name)
                .trim()
                .to_string()
        })
        .collect();
    for want in [
        "attached",
        "blocked launcher",
        "blocked syncer",
        "unblocked launcher",
        "unblocked syncer",
        "exited",
    ] {
        assert!(kinds.iter().any(|k| k == want), "no `{want}` in {kinds:?}");
    }
    // Never before the bound. How soon after it is a timing goal, measured by
    // `cargo xtask bench` (BENCHMARKS.md), not asserted here.
    for (_, e) in events.iter().filter(|(_, e)| e["event"] == "blocked") {
        assert!(e["thread"]["in_call_ms"].as_f64().unwrap() >= 1000.0, "{e}");
    }
    let pos = |k: &str| kinds.iter().position(|x| x == k).unwrap();
    assert!(pos("blocked launcher") < pos("unblocked launcher"));
    assert!(pos("unblocked syncer") < pos("exited"));
    drop(w);
}

/// Ctrl-C (SIGINT) detaches cleanly: exit 0 and the "detached" line.
#[test]
fn ctrl_c_detaches_cleanly() {
    require_root!();
    let w = Worker::spawn(&["healthy", "20"], &[("SIMCUDA_LONG_KERNEL_MS", "50")]);
    let child = Command::new(wedgeprobe_bin())
        .args(["watch", "--pid", &w.pid_arg()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start watch");
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("watching pid") && text.trim_end().ends_with("detached"),
        "{text}"
    );
}
