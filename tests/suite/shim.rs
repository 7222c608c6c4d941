//! The shim in a process on the simulated driver, which calls it back where CUPTI would: its
//! journal names the stuck kernel, and a bad or absent journal leaves eBPF working alone.

use std::thread::sleep;

use super::{
    BOUND_AT_BLOCKED, WEDGE_KERNEL, Worker, assert_named_exactly, launch_probes, report_json,
    report_json_and_stderr, require_root, secs, shim_path, thread, wedgeprobe, wedgeprobe_bin,
};

#[test]
fn the_journal_names_the_stuck_kernel_and_the_queue_behind_it() {
    require_root!();
    let shim = shim_path();
    let w = Worker::spawn(
        &["wedge", "10", "300"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMCUDA_RELEASE_AFTER_S", "8"),
        ],
    );
    sleep(secs(1.5));
    // The kernel floor (default 5 s) lowered so the test need not wait that long.
    let r = report_json(&["--pid", &w.pid_arg(), "--kernel-floor", "1s"]);
    assert_eq!(r["mode"], "journal+ebpf");
    assert_eq!(r["verdict"]["kind"], "kernel_wedge", "{}", r["verdict"]);
    assert_eq!(r["kernels"][0]["state"], "stuck");
    assert_eq!(
        r["targets"][0]["journal"]["status"], "recording",
        "{}",
        r["targets"][0]
    );
    let head = &r["kernels"][0];
    assert_eq!(head["kernel"], "_Z17attn_wedge_kernelP7barrierPf", "{head}");
    assert_eq!(head["grid"], serde_json::json!([132, 2, 1]));
    // The queue is full behind it: 1,021 entries, of which the shim's stream marks (one per
    // 8 launches by default) take their share.
    assert!(head["queued_behind"].as_u64().unwrap() >= 900, "{head}");
    assert!(head["running_ms"].as_f64().unwrap() >= 1000.0, "{head}");
    assert_eq!(head["pid"].as_u64(), Some(w.pid() as u64));
    assert!(thread(&r, "launcher").is_some());
    let summary = r["verdict"]["summary"].as_str().unwrap();
    assert!(
        summary.contains("_Z17attn_wedge_kernelP7barrierPf"),
        "{summary}"
    );
    for (k, v) in r["targets"][0]["journal"]["drops"].as_object().unwrap() {
        assert_eq!(v, 0, "shim dropped {k}");
    }
}

#[test]
fn a_healthy_process_with_the_shim_has_no_stuck_kernel() {
    require_root!();
    let shim = shim_path();
    let w = Worker::spawn(
        &["healthy", "8"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMCUDA_LONG_KERNEL_MS", "50"),
        ],
    );
    sleep(secs(0.5));
    let r = report_json(&["--pid", &w.pid_arg(), "--window", "2s"]);
    assert_eq!(r["mode"], "journal+ebpf");
    assert_eq!(r["verdict"]["kind"], "healthy");
    // GPU progress reached the journal: completion records (exact mode) or marks (default).
    let j = &r["targets"][0]["journal"];
    let progress = j["completions_seen"].as_u64().unwrap() + j["marks_passed"].as_u64().unwrap();
    assert!(progress > 10, "{j}");
    for k in r["kernels"].as_array().unwrap() {
        assert!(k["running_ms"].as_f64().unwrap() < 1000.0, "{k}");
    }
}

#[test]
fn the_shim_can_be_turned_off() {
    require_root!();
    let shim = shim_path();
    let w = Worker::spawn(
        &["wedge", "8", "300"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("WEDGEPROBE_SHIM", "off"),
            ("SIMCUDA_RELEASE_AFTER_S", "6"),
        ],
    );
    sleep(secs(1.5));
    let r = report_json(&[
        "--pid",
        &w.pid_arg(),
        BOUND_AT_BLOCKED[0],
        BOUND_AT_BLOCKED[1],
    ]);
    assert_eq!(r["mode"], "ebpf-only");
    assert!(r["targets"][0]["journal"].is_null());
    assert_eq!(r["verdict"]["kind"], "launch_queue_full");
}

/// A journal whose header was overwritten is rejected with its reason; eBPF carries on.
#[test]
fn a_corrupt_journal_is_rejected_not_trusted() {
    require_root!();
    let shim = shim_path();
    let w = Worker::spawn(
        &["wedge", "8", "300"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMCUDA_RELEASE_AFTER_S", "6"),
        ],
    );
    sleep(secs(0.5));
    // The journal is a memfd the worker keeps open: written through its /proc fd link.
    let fd = std::fs::read_dir(format!("/proc/{}/fd", w.pid()))
        .unwrap()
        .flatten()
        .find(|e| {
            std::fs::read_link(e.path())
                .is_ok_and(|l| l.as_os_str() == "/memfd:wedgeprobe-journal (deleted)")
        })
        .expect("the shim made its journal");
    // Overwrite the magic in place (the journal's size is sealed: it cannot be truncated,
    // which would SIGBUS the writer and the reader).
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(fd.path())
        .expect("the journal opens for writing");
    std::io::Write::write_all(&mut f, b"garbage!").unwrap();
    drop(f);
    sleep(secs(1.0));
    let (r, err) = report_json_and_stderr(&[
        "--pid",
        &w.pid_arg(),
        BOUND_AT_BLOCKED[0],
        BOUND_AT_BLOCKED[1],
    ]);
    assert!(!err.contains("panicked"));
    assert_eq!(r["mode"], "ebpf-only");
    let status = r["targets"][0]["journal"]["status"].as_str().unwrap();
    assert!(status.starts_with("rejected:"), "{status}");
    assert_eq!(r["verdict"]["kind"], "launch_queue_full");
}

#[test]
fn shim_path_points_at_the_library() {
    let out = wedgeprobe(&["shim-path"]);
    assert!(out.status.success());
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        path.ends_with("libcupti_shim.so") && std::path::Path::new(&path).exists(),
        "{path}"
    );
}

/// Threads blocked behind a kernel still within its bounds (a 3 s kernel, under the 5 s
/// floor): `busy`, not a wedge.
#[test]
fn waiting_behind_a_long_but_normal_kernel_is_busy() {
    require_root!();
    let shim = shim_path();
    let w = Worker::spawn(
        &["healthy", "8"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMCUDA_LONG_KERNEL_MS", "3000"),
        ],
    );
    sleep(secs(0.2));
    let r = report_json(&["--pid", &w.pid_arg(), "--window", "1500ms"]);
    assert_eq!(r["verdict"]["kind"], "busy", "{}", r["verdict"]);
    assert_eq!(r["kernels"][0]["kernel"], "_Z11long_kernelPf");
    assert_eq!(r["kernels"][0]["state"], "running");
}

/// `wedgeprobe run -- CMD`: injects the shim, watches, names the stuck kernel, and exits
/// with the command's exit code.
#[test]
fn run_injects_the_shim_watches_and_forwards_the_exit_code() {
    require_root!();
    let out = std::process::Command::new(super::wedgeprobe_bin())
        .args(["run", "--kernel-floor", "1s", "--"])
        .arg(wp_tests::simworker())
        .args(["wedge", "4", "300"])
        .env("SIMCUDA_RELEASE_AFTER_S", "3")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("VERDICT   kernel_wedge") && err.contains("_Z17attn_wedge_kernelP7barrierPf"),
        "{err}"
    );
    assert!(err.contains("EXITED"), "{err}");
    let out = std::process::Command::new(super::wedgeprobe_bin())
        .args(["run", "--", "sh", "-c", "exit 7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
}

/// At 3 a.m. (attached after the wedge) the stack scan finds the blocked threads, and the
/// shim journal's per-thread slots give their exact start: no "at least" any more.
#[test]
fn the_journal_gives_threads_found_by_stack_scan_their_exact_start() {
    require_root!();
    let shim = shim_path();
    let w = Worker::spawn(
        &["wedge", "10", "300"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMCUDA_RELEASE_AFTER_S", "8"),
        ],
    );
    sleep(secs(2.5));
    let r = report_json(&["--pid", &w.pid_arg()]);
    for name in ["launcher", "syncer"] {
        let t = thread(&r, name).unwrap_or_else(|| panic!("{name} found: {r}"));
        // A launcher blocked in the stream mark the shim writes at its launch's exit (the queue
        // is full) has that write innermost on its stack, not a traced entry point: the
        // journal's slot alone then says which call it is in, with the same exact start.
        let by = t["seen_by"].as_str().unwrap_or_default();
        assert!(
            by == "stack-scan+journal" || (name == "launcher" && by == "journal"),
            "{t}"
        );
        assert_eq!(t["in_call_at_least"], false, "{t}");
        // In the call since ~0.3 s after start; attached at ~2.5 s; the window is 1 s.
        assert!(t["in_call_ms"].as_f64().unwrap() > 2_000.0, "{t}");
    }
}

#[test]
fn release_makes_the_shim_give_cupti_back_and_says_so() {
    require_root!();
    let shim = shim_path();
    let w = Worker::spawn(&["healthy", "8"], &[("CUDA_INJECTION64_PATH", &shim)]);
    sleep(secs(0.5));
    let out = wedgeprobe(&["release", "--pid", &w.pid_arg()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("released CUPTI"), "{stdout}");
    // Asked again: already released, still fine.
    let again = wedgeprobe(&["release", "--pid", &w.pid_arg()]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("already released"));
    let r = report_json(&["--pid", &w.pid_arg(), "--window", "300ms"]);
    assert_eq!(
        r["targets"][0]["journal"]["status"], "released",
        "{}",
        r["targets"][0]
    );
}

/// After a release the shim records nothing: kernels that were in flight then stay in its
/// table. They must not age into a kernel_wedge (here the long kernel finishes 1.5 s after
/// start, 1 s after the release, and the report is taken at ~3.5 s with a 1 s floor).
#[test]
fn kernels_in_flight_at_a_release_are_not_judged_afterwards() {
    require_root!();
    let shim = shim_path();
    let w = Worker::spawn(
        &["healthy", "8"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMCUDA_LONG_KERNEL_MS", "1500"),
        ],
    );
    sleep(secs(0.5));
    let out = wedgeprobe(&["release", "--pid", &w.pid_arg()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    sleep(secs(2.5));
    let r = report_json(&[
        "--pid",
        &w.pid_arg(),
        "--window",
        "500ms",
        "--kernel-floor",
        "1s",
    ]);
    assert_eq!(r["targets"][0]["journal"]["status"], "released");
    assert_eq!(
        r["kernels"].as_array().map_or(0, Vec::len),
        0,
        "{}",
        r["kernels"]
    );
    assert_ne!(r["verdict"]["kind"], "kernel_wedge", "{}", r["verdict"]);
}

/// A shim released while `watch` runs no longer records launches: watch says so, puts entry
/// probes on the launches, and still sees the launch that blocks behind the wedge later.
#[test]
fn after_a_release_watch_traces_launches_itself() {
    require_root!();
    let shim = shim_path();
    let w = Worker::spawn(
        &["wedge", "10", "2500"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMCUDA_RELEASE_AFTER_S", "12"),
        ],
    );
    sleep(secs(0.5));
    let watch = std::process::Command::new(wedgeprobe_bin())
        .args(["watch", "--pid", &w.pid_arg(), "--json", "--duration", "6s"])
        .args(["--kernel-floor", "2s", "--no-flight"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("watch starts");
    sleep(secs(1.0));
    let rel = wedgeprobe(&["release", "--pid", &w.pid_arg()]);
    assert_eq!(rel.status.code(), Some(0), "{rel:?}");
    let out = watch.wait_with_output().expect("watch ends");
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let stopped = lines
        .iter()
        .find(|l| l["event"] == "shim_stopped")
        .unwrap_or_else(|| panic!("no shim_stopped line: {lines:?}"));
    assert!(launch_probes(stopped).starts_with("entry"), "{stopped}");
    let b = lines
        .iter()
        .find(|l| l["event"] == "blocked" && l["thread"]["api"] == "cuLaunchKernel")
        .unwrap_or_else(|| panic!("no blocked launch: {lines:?}"));
    assert_eq!(b["thread"]["seen_by"], "uprobe", "{b}");
    assert!(
        !lines
            .iter()
            .any(|l| l["event"] == "verdict" && l["verdict"]["kind"] == "kernel_wedge"),
        "no kernel is judged after the release: {lines:?}"
    );
}

#[test]
fn release_without_a_shim_journal_says_so_with_its_exit_code() {
    require_root!();
    let w = Worker::spawn(&["healthy", "8"], &[]);
    sleep(secs(0.5));
    let out = wedgeprobe(&["release", "--pid", &w.pid_arg()]);
    assert_eq!(out.status.code(), Some(8), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no wedgeprobe shim journal"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

#[test]
fn watch_leaves_launches_to_the_journal_and_still_sees_a_launch_blocked_after_attach() {
    require_root!();
    let shim = shim_path();
    // The worker wedges 2.5 s after start, long after watch attached: the blocked launch is
    // not one found by a stack scan at attach, and the launch probes are off (journal).
    let w = Worker::spawn(
        &["wedge", "10", "2500"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMCUDA_RELEASE_AFTER_S", "12"),
        ],
    );
    sleep(secs(0.5));
    let out = wedgeprobe(&[
        "watch",
        "--pid",
        &w.pid_arg(),
        "--json",
        "--duration",
        "6s",
        "--kernel-floor",
        "2s",
        "--no-flight",
    ]);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let attached = lines
        .iter()
        .find(|l| l["event"] == "attached")
        .expect("attached line");
    assert!(launch_probes(attached).starts_with("off"), "{attached}");
    let blocked_launch = lines
        .iter()
        .find(|l| l["event"] == "blocked" && l["thread"]["api"] == "cuLaunchKernel");
    let b = blocked_launch.unwrap_or_else(|| panic!("no blocked launch: {lines:?}"));
    // The journal's slot (with or without a confirming stack sample), never a uprobe.
    assert!(
        b["thread"]["seen_by"].as_str().unwrap().contains("journal"),
        "{b}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["event"] == "verdict" && l["verdict"]["kind"] == "kernel_wedge"),
        "{lines:?}"
    );
}

/// A head's candidates' correlation ids, in the order listed.
fn candidate_correlations(head: &serde_json::Value) -> Vec<u64> {
    head["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["correlation"].as_u64().unwrap())
        .collect()
}

/// A worker with the shim that wedges 300 ms in (released after 8 s), with `extra` in its
/// environment, and the report taken 1.5 s later (`--kernel-floor 1s`): the worker is
/// returned so it lives as long as the test.
fn wedged_report(extra: &[(&str, &str)]) -> (Worker, serde_json::Value) {
    let shim = shim_path();
    let mut env = vec![
        ("CUDA_INJECTION64_PATH", shim.as_str()),
        ("SIMCUDA_RELEASE_AFTER_S", "8"),
    ];
    env.extend_from_slice(extra);
    let w = Worker::spawn(&["wedge", "10", "300"], &env);
    sleep(secs(1.5));
    let r = report_json(&["--pid", &w.pid_arg(), "--kernel-floor", "1s"]);
    (w, r)
}

/// Stream marks (the shim's default recording) cannot bracket a kernel launched in a burst:
/// the report lists the launches it is narrowed to, in launch order, the stuck one among them,
/// and names none of them alone — not in the head, not in the verdict.
#[test]
fn with_marks_a_kernel_launched_in_a_burst_is_narrowed_to_candidates_never_misnamed() {
    require_root!();
    let (_w, r) = wedged_report(&[("SIMWORKER_BURST", "3")]);
    assert_eq!(
        r["targets"][0]["journal"]["record"], "marks",
        "{}",
        r["targets"][0]
    );
    assert_eq!(r["verdict"]["kind"], "kernel_wedge", "{}", r["verdict"]);
    let head = &r["kernels"][0];
    assert_eq!(head["exact"], false, "{head}");
    assert_eq!(head["state"], "stuck", "{head}");
    let names: Vec<&str> = head["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kernel"].as_str().unwrap())
        .collect();
    let wedge = names
        .iter()
        .position(|n| *n == "_Z17attn_wedge_kernelP7barrierPf")
        .unwrap_or_else(|| panic!("the stuck kernel is a candidate: {names:?}"));
    // In launch order: the burst's prefills before it, decodes (queued) after it.
    assert!(
        names[..wedge].iter().all(|n| n.contains("prefill")),
        "{names:?}"
    );
    assert!(
        names[wedge + 1..].iter().all(|n| n.contains("decode")),
        "{names:?}"
    );
    assert!(
        wedge >= 1,
        "a prefill of the burst shares its window: {names:?}"
    );
    let corrs = candidate_correlations(head);
    assert!(corrs.windows(2).all(|p| p[0] < p[1]), "{corrs:?}");
    assert!(
        head["kernel"].as_str().unwrap().starts_with("(one of"),
        "{head}"
    );
    let summary = r["verdict"]["summary"].as_str().unwrap();
    assert!(
        summary.contains("one of") && summary.contains("attn_wedge_kernel"),
        "{summary}"
    );
    assert!(
        summary.contains("WEDGEPROBE_SHIM_RECORD=exact"),
        "{summary}"
    );
}

/// Behind a wedged kernel the launching thread waits for room in the full queue; the shim's
/// flush thread must not wait with it (an idle mark on that stream would): it keeps publishing
/// marks and signs of life after the wedge. Before the fix, a tick publishing just before the
/// stuck kernel's predecessor passed its mark left that predecessor named as stuck.
#[test]
fn the_flush_thread_keeps_publishing_behind_a_full_queue() {
    require_root!();
    let (_w, r) = wedged_report(&[("SIMWORKER_BURST", "3")]);
    let journal = &r["targets"][0]["journal"];
    assert_eq!(journal["record"], "marks", "{journal}");
    let head = &r["kernels"][0];
    let wedged_ms_ago = head["launched_ms_ago"].as_f64().unwrap();
    let heartbeat_ms_ago = journal["heartbeat_age_ms"].as_f64().unwrap();
    // Ordering, not timing: a sign of life came after the queue filled (the launcher blocks
    // within milliseconds of the wedge, the stuck flush thread stopped 100 ms after that).
    assert!(
        heartbeat_ms_ago + 500.0 < wedged_ms_ago,
        "the last heartbeat ({heartbeat_ms_ago} ms ago) predates the wedge ({wedged_ms_ago} ms ago) by too little: {journal}"
    );
    assert!(
        head["kernel"] != "_Z14prefill_kernelPfS_i",
        "a kernel whose mark passed is never the stuck one: {head}"
    );
}

/// Event marks whose queries wait behind the launcher blocked in the full queue (the H200,
/// 2026-12-01; `SIMCUDA_EVENT_QUERY_BEHIND_FULL_QUEUE`): no mark is published after the
/// queue fills, and a done kernel with an unpublished mark after it was named the stuck one,
/// exact. Now the journal's stale heartbeat says the marks are not current: the head is
/// narrowed to every launch not known done, never a wrong name alone, and why is said.
#[test]
fn event_marks_held_behind_a_full_queue_never_name_a_done_kernel() {
    require_root!();
    let shim = shim_path();
    let w = Worker::spawn(
        &["wedge", "10", "300"],
        &[
            ("CUDA_INJECTION64_PATH", shim.as_str()),
            ("SIMCUDA_RELEASE_AFTER_S", "10"),
            ("SIMWORKER_BURST", "3"),
            ("WEDGEPROBE_SHIM_MARK_WITH", "event"),
            ("SIMCUDA_EVENT_QUERY_BEHIND_FULL_QUEUE", "1"),
        ],
    );
    // The queue fills within milliseconds of the wedge at 300 ms; 3 s later the flush
    // thread's last sign of life is well over the 1 s staleness bound.
    sleep(secs(3.5));
    let r = report_json(&["--pid", &w.pid_arg(), "--kernel-floor", "1s"]);
    drop(w);
    let journal = &r["targets"][0]["journal"];
    assert_eq!(journal["record"], "marks", "{journal}");
    assert!(
        journal["heartbeat_age_ms"].as_f64() > Some(1_000.0),
        "the flush thread is held behind the full queue: {journal}"
    );
    assert_eq!(r["verdict"]["kind"], "kernel_wedge", "{}", r["verdict"]);
    let head = &r["kernels"][0];
    assert_eq!(head["exact"], false, "{head}");
    assert!(head["marks_stale_ms"].as_f64() > Some(1_000.0), "{head}");
    // The window runs from the oldest launch not known done to the newest: the burst, the
    // stuck kernel and the ~1,000 queued behind it (the first 16 are listed).
    assert!(
        head["candidates_total"].as_u64() > Some(900),
        "candidates to the newest launch: {head}"
    );
    assert!(
        head["kernel"].as_str().unwrap().starts_with("(one of"),
        "{head}"
    );
    let corrs = candidate_correlations(head);
    assert!(
        corrs.windows(2).all(|p| p[0] < p[1]),
        "in launch order: {corrs:?}"
    );
    let summary = r["verdict"]["summary"].as_str().unwrap();
    assert!(
        summary.contains("one of") && summary.contains("last published its stream marks"),
        "{summary}"
    );
}

/// The exact mode (a CUPTI record per kernel) names the same kernel alone.
#[test]
fn the_exact_mode_names_a_kernel_launched_in_a_burst() {
    require_root!();
    let (_w, r) = wedged_report(&[
        ("SIMWORKER_BURST", "3"),
        ("WEDGEPROBE_SHIM_RECORD", "exact"),
    ]);
    assert_eq!(r["targets"][0]["journal"]["record"], "per-kernel");
    assert_eq!(r["verdict"]["kind"], "kernel_wedge", "{}", r["verdict"]);
    let head = &r["kernels"][0];
    assert_eq!(head["exact"], true, "{head}");
    assert_eq!(head["kernel"], "_Z17attn_wedge_kernelP7barrierPf", "{head}");
}

/// Where marks cannot work (no pinned memory for them), the shim falls back to per-kernel
/// records with one line, and still names the stuck kernel.
#[test]
fn without_pinned_memory_for_marks_the_shim_falls_back_to_per_kernel_records() {
    require_root!();
    let (w, r) = wedged_report(&[("SIMCUDA_NO_HOST_ALLOC", "1")]);
    assert_eq!(
        r["targets"][0]["journal"]["record"], "per-kernel",
        "{}",
        r["targets"][0]
    );
    assert_eq!(
        r["kernels"][0]["kernel"],
        "_Z17attn_wedge_kernelP7barrierPf"
    );
    drop(w);
}

/// A stream that goes quiet after a launch the marks did not cover: the shim's idle mark
/// proves it done, so a healthy process idling for seconds never ages into a wedge.
#[test]
fn a_quiet_stream_is_marked_done_and_never_ages_into_a_wedge() {
    require_root!();
    let shim = shim_path();
    // healthy: short kernels every 50 µs (no mark after most), a sync every 64; run 2 s,
    // then the process idles until it exits — report while it idles.
    let w = Worker::spawn(&["idle-after", "1"], &[("CUDA_INJECTION64_PATH", &shim)]);
    sleep(secs(2.0));
    let r = report_json(&[
        "--pid",
        &w.pid_arg(),
        "--kernel-floor",
        "1s",
        "--kernel-hard-bound",
        "1s",
    ]);
    assert_eq!(r["targets"][0]["journal"]["record"], "marks");
    assert!(
        r["kernels"].as_array().unwrap().is_empty(),
        "nothing in flight once the idle mark passed: {}",
        r["kernels"]
    );
    assert_eq!(r["verdict"]["kind"], "healthy", "{}", r["verdict"]);
}

/// The launch hooks are what records by default (the shim says nothing); where they cannot go
/// in — here turned off, as when another tool's jump already sits on an entry point — the
/// shim says so in one line and records through the driver's callbacks, and the stuck kernel
/// is named exactly either way.
#[test]
fn without_launch_hooks_the_shim_says_so_and_still_names_the_stuck_kernel() {
    require_root!();
    let shim = shim_path();
    for hooks in ["on", "off"] {
        let log =
            std::env::temp_dir().join(format!("wp-hooks-{hooks}-{}.stderr", std::process::id()));
        let w = Worker::spawn_logged(
            &["wedge", "10", "300"],
            &[
                ("CUDA_INJECTION64_PATH", &shim),
                ("SIMCUDA_RELEASE_AFTER_S", "8"),
                ("WEDGEPROBE_SHIM_HOOKS", hooks),
            ],
            &log,
        );
        sleep(secs(1.5));
        let r = report_json(&["--pid", &w.pid_arg(), "--kernel-floor", "1s"]);
        assert_eq!(
            r["verdict"]["kind"], "kernel_wedge",
            "hooks {hooks}: {}",
            r["verdict"]
        );
        assert_eq!(
            r["kernels"][0]["kernel"], "_Z17attn_wedge_kernelP7barrierPf",
            "hooks {hooks}: {}",
            r["kernels"][0]
        );
        assert_eq!(r["kernels"][0]["exact"], true, "hooks {hooks}");
        // The report says how launches are recorded, not only the target's log.
        let via = &r["targets"][0]["journal"]["launch_callbacks"];
        if hooks == "on" {
            assert!(via.is_null(), "hooks on: {via}");
        } else {
            assert!(
                via.as_str()
                    .is_some_and(|w| w.contains("WEDGEPROBE_SHIM_HOOKS")),
                "hooks off: {}",
                r["targets"][0]["journal"]
            );
            let text = wedgeprobe(&["report", "--pid", &w.pid_arg(), "--kernel-floor", "1s"]);
            let text = String::from_utf8_lossy(&text.stdout);
            assert!(
                text.contains("records launches through the driver's callbacks")
                    && text.contains("WEDGEPROBE_SHIM_HOOKS"),
                "{text}"
            );
        }
        drop(w);
        let lines: Vec<String> = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("wedgeprobe shim"))
            .map(str::to_string)
            .collect();
        let _ = std::fs::remove_file(&log);
        if hooks == "on" {
            assert!(lines.is_empty(), "hooks on: {lines:?}");
        } else {
            assert_eq!(lines.len(), 1, "{lines:?}");
            assert!(
                lines[0].contains("launches recorded through the driver's callbacks")
                    && lines[0].contains("WEDGEPROBE_SHIM_HOOKS"),
                "{lines:?}"
            );
        }
    }
}

/// The shim loaded at start hooks drivers whose launch entry points begin with `endbr64`, a
/// `sub rsp` wrapper or a RIP-relative load (it fell back to the driver's callbacks on them
/// before issue 31, with one log line): no line, and the stuck kernel named exactly.
#[test]
fn the_shim_hooks_drivers_whose_entry_points_begin_with_other_prologues() {
    require_root!();
    let shim = shim_path();
    for shape in ["cet", "sub-rsp", "rip-load"] {
        let dir = wp_tests::prologue_dir(shape).display().to_string();
        let log =
            std::env::temp_dir().join(format!("wp-prologue-{shape}-{}.stderr", std::process::id()));
        let w = Worker::spawn_logged(
            &["wedge", "10", "300"],
            &[
                ("CUDA_INJECTION64_PATH", &shim),
                ("SIMCUDA_RELEASE_AFTER_S", "8"),
                ("LD_LIBRARY_PATH", &dir),
            ],
            &log,
        );
        sleep(secs(1.5));
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", w.pid())).unwrap_or_default();
        assert!(
            maps.contains(&dir),
            "{shape}: the worker did not load {dir}"
        );
        let r = report_json(&["--pid", &w.pid_arg(), "--kernel-floor", "1s"]);
        assert_eq!(
            r["verdict"]["kind"], "kernel_wedge",
            "{shape}: {}",
            r["verdict"]
        );
        assert_eq!(
            r["kernels"][0]["kernel"], "_Z17attn_wedge_kernelP7barrierPf",
            "{shape}: {}",
            r["kernels"][0]
        );
        assert_eq!(r["kernels"][0]["exact"], true, "{shape}");
        drop(w);
        let lines: Vec<String> = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("wedgeprobe shim"))
            .map(str::to_string)
            .collect();
        let _ = std::fs::remove_file(&log);
        assert!(lines.is_empty(), "{shape}: the shim fell back: {lines:?}");
    }
}

/// A process whose context is on device 1 (a rank on `cuda:1`): its stuck kernel is reported
/// on device 1 — through the launch hooks (the device of the launch's current context) and
/// through the driver's callbacks alike (a rank on cuda:1 was reported as dev 0).
#[test]
fn a_kernel_stuck_on_device_1_is_reported_on_device_1() {
    require_root!();
    for hooks in ["on", "off"] {
        let (w, r) = wedged_report(&[("SIMCUDA_DEVICE", "1"), ("WEDGEPROBE_SHIM_HOOKS", hooks)]);
        let head = &r["kernels"][0];
        assert_eq!(
            head["kernel"], "_Z17attn_wedge_kernelP7barrierPf",
            "hooks {hooks}: {head}"
        );
        assert_eq!(head["device"], 1, "hooks {hooks}: {head}");
        let summary = r["verdict"]["summary"].as_str().unwrap_or_default();
        assert!(summary.contains("device 1"), "hooks {hooks}: {summary}");
        drop(w);
    }
}

/// `WEDGEPROBE_SHIM_MEASURE=self_cost` (a benchmark switch): at exit the shim accounts for
/// every launch it recorded and every mark it wrote, by reason; an unknown switch word is
/// named, not silently dropped.
#[test]
fn the_self_cost_switch_accounts_for_every_launch_and_mark() {
    let out = std::process::Command::new(wp_tests::simworker())
        .args(["bench", "20000"])
        .env("CUDA_INJECTION64_PATH", shim_path())
        .env("WEDGEPROBE_SHIM_MEASURE", "self_cost,no_such_switch")
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`no_such_switch` is not a measurement switch"),
        "{err}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("self cost: "))
        .unwrap_or_else(|| panic!("no self-cost line: {err}"));
    let num_before = |word: &str| -> u64 {
        let head = &line[..line.find(word).unwrap_or_else(|| panic!("{word}: {line}"))];
        head.trim_end()
            .rsplit(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no number before {word}: {line}"))
    };
    // The bench's launches, plus its warm-up launch(es).
    let launches = num_before(" launches,");
    assert!((20_000..20_100).contains(&launches), "{line}");
    let marks = num_before(" marks (");
    let reasons: u64 = [
        " before a gap",
        " after a gap",
        " after a sync",
        " every N",
        " period",
        " graph launch",
        " idle",
    ]
    .iter()
    .map(|r| num_before(r))
    .sum();
    assert!(marks > 0 && marks == reasons, "{line}");
    // One per 16 launches by default (less the first launches, before the marks' memory).
    assert!(marks >= launches / 20, "{line}");
}

/// The H200's shape (2026-12-07, the harness's launch and burst wedges with event marks): the
/// stream's first launch is the stuck kernel, so its event ring is wanted just as the
/// launching thread fills the queue behind it, and creating events waits behind that blocked
/// launch (`SIMCUDA_EVENT_CREATE_BEHIND_FULL_QUEUE`). Only the event maker waits: the flush
/// thread keeps publishing (a fresh heartbeat), the stream's marks stay stream writes, and
/// the stuck kernel is named exactly. Before, the flush thread made the rings and waited with
/// them: no mark published, the kernel one of ~1,000.
#[test]
fn event_marks_name_a_wedge_whose_ring_is_made_behind_the_full_queue() {
    require_root!();
    let shim = shim_path();
    let w = Worker::spawn(
        &["wedge", "10", "0"],
        &[
            ("CUDA_INJECTION64_PATH", shim.as_str()),
            ("SIMCUDA_RELEASE_AFTER_S", "8"),
            ("WEDGEPROBE_SHIM_MARK_WITH", "event"),
            ("SIMCUDA_EVENT_CREATE_BEHIND_FULL_QUEUE", "1"),
        ],
    );
    // Well past the 1 s after which unpublished marks are stale.
    sleep(secs(2.5));
    let r = report_json(&["--pid", &w.pid_arg(), "--kernel-floor", "1s"]);
    drop(w);
    let journal = &r["targets"][0]["journal"];
    assert!(
        journal["heartbeat_age_ms"].as_f64() < Some(1_000.0),
        "the flush thread publishes while the ring waits: {journal}"
    );
    assert_eq!(r["verdict"]["kind"], "kernel_wedge", "{}", r["verdict"]);
    let head = &r["kernels"][0];
    assert_eq!(head["kernel"], "_Z17attn_wedge_kernelP7barrierPf", "{head}");
    assert_eq!(head["exact"], true, "{head}");
    assert!(head["queued_behind"].as_u64() >= Some(900), "{head}");
}

/// CI, 2026-12-07: the wedge was named as the kernel after it, "exact". The stuck kernel was
/// the process's first launch; it took its correlation id, and while it was still inside the
/// driver (a cold first launch) the syncer thread's `cuStreamSynchronize` took a later id,
/// found nothing queued and returned — and its record "done through my id" retired the
/// wedge. A kernel's first launch under CUDA's lazy loading loads its
/// module before its work is queued (`SIMCUDA_FIRST_LAUNCH_LOADS_MS`); a synchronize that
/// returns meanwhile must prove nothing about it, with either kind of marks.
#[test]
fn a_synchronize_while_a_kernel_loads_on_its_first_launch_does_not_retire_it() {
    require_root!();
    let shim = shim_path();
    for with in ["event", "write"] {
        let w = Worker::spawn(
            &["wedge", "10", "0"],
            &[
                ("CUDA_INJECTION64_PATH", shim.as_str()),
                ("SIMCUDA_RELEASE_AFTER_S", "8"),
                ("SIMCUDA_FIRST_LAUNCH_LOADS_MS", "200"),
                ("WEDGEPROBE_SHIM_MARK_WITH", with),
            ],
        );
        sleep(secs(2.0));
        let r = report_json(&["--pid", &w.pid_arg(), "--kernel-floor", "1s"]);
        drop(w);
        assert_named_exactly(&r, WEDGE_KERNEL, &format!("{with} marks"));
    }
}

/// Marks as event records (opt-in: WEDGEPROBE_SHIM_MARK_WITH=event; the flush thread polls
/// them), stream writes where events cannot be had: either way the stuck kernel is named
/// exactly, with its grid and the
/// full queue behind it. With stream writes refused by the driver, only the event marks can
/// have named it; with events refused, one line says the marks fell back to stream writes.
#[test]
fn event_marks_name_the_stuck_kernel_and_stream_writes_take_over_without_events() {
    require_root!();
    let shim = shim_path();
    for (case, driver_env) in [
        ("only events work", "SIMCUDA_WRITE_VALUE_FAILS"),
        ("no events", "SIMCUDA_NO_EVENTS"),
    ] {
        let log = std::env::temp_dir().join(format!(
            "wp-event-marks-{}-{}.stderr",
            driver_env.to_lowercase(),
            std::process::id()
        ));
        let w = Worker::spawn_logged(
            &["wedge", "10", "400"],
            &[
                ("CUDA_INJECTION64_PATH", &shim),
                ("SIMCUDA_RELEASE_AFTER_S", "8"),
                ("WEDGEPROBE_SHIM_DEBUG", "1"),
                ("WEDGEPROBE_SHIM_MARK_WITH", "event"),
                (driver_env, "1"),
            ],
            &log,
        );
        sleep(secs(1.5));
        let r = report_json(&["--pid", &w.pid_arg(), "--kernel-floor", "1s"]);
        drop(w);
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        let head = &r["kernels"][0];
        assert_eq!(
            r["verdict"]["kind"], "kernel_wedge",
            "{case}: {}",
            r["verdict"]
        );
        assert_eq!(
            head["kernel"], "_Z17attn_wedge_kernelP7barrierPf",
            "{case}: {head}"
        );
        assert_eq!(head["exact"], true, "{case}: {head}");
        assert_eq!(head["grid"], serde_json::json!([132, 2, 1]), "{case}");
        assert!(
            head["queued_behind"].as_u64().unwrap() >= 900,
            "{case}: {head}"
        );
        let j = &r["targets"][0]["journal"];
        assert!(j["marks_passed"].as_u64().unwrap() > 0, "{case}: {j}");
        if driver_env == "SIMCUDA_NO_EVENTS" {
            assert!(
                log.contains(
                    "event marks unavailable (cuEventCreate returned 2); marking with stream writes"
                ),
                "{case}: {log}"
            );
        } else {
            assert!(
                log.contains(": Ok(())"),
                "{case}: no event ring created: {log}"
            );
            assert!(!log.contains("event marks unavailable"), "{case}: {log}");
        }
    }
}
