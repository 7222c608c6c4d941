//! `wedgeprobe trace` and the flight recorder: the files are well formed (tests/src/
//! chrome_check.rs), show the stuck kernel and the blocked threads as open slices, stay
//! loadable when the disk fills or the target exits, and load in a real viewer.

use std::{path::PathBuf, process::Command, thread::sleep};

use wp_tests::chrome_check::{self, Checked};

use super::{Worker, require_root, secs, shim_path, wedgeprobe};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wp-trace-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn trace(pid: u32, out: &std::path::Path, duration: &str) -> std::process::Output {
    wedgeprobe(&[
        "trace",
        "--pid",
        &pid.to_string(),
        "--duration",
        duration,
        "-o",
        out.to_str().unwrap(),
    ])
}

/// A simulated worker with the shim whose kernel wedges at 300 ms and is released after
/// `release_s` seconds. The shim records per-kernel completions (the exact mode): these tests
/// look at kernels that completed before the trace or the flight recorder started, which the
/// default recording (stream marks) records per kernel only while a `trace` holds its lease
/// (`a_trace_with_marks_records_the_kernels_that_run_while_it_traces`).
fn wedged_with_shim(release_s: &str) -> Worker {
    let shim = shim_path();
    Worker::spawn(
        &["wedge", "1", "300"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMCUDA_RELEASE_AFTER_S", release_s),
            ("WEDGEPROBE_SHIM_RECORD", "exact"),
        ],
    )
}

/// With stream marks (the default), `trace` leases per-kernel records from the shim while it
/// traces: kernels that run meanwhile are on the GPU tracks with their launches' flows, and
/// the lease lapses once the trace ends (the shim goes back to marks alone).
#[test]
fn a_trace_with_marks_records_the_kernels_that_run_while_it_traces() {
    require_root!();
    let shim = shim_path();
    let w = Worker::spawn(
        &["healthy", "30"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMCUDA_LONG_KERNEL_MS", "50"),
        ],
    );
    sleep(secs(0.5));
    let out = tmp("marks.json");
    let r = trace(w.pid(), &out, "2s");
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    let c = chrome_check::check_file(&out).unwrap_or_else(|e| panic!("malformed trace: {e}"));
    assert_completed_kernels_with_flows(&c);
    // Lapsed: a report after the trace sees the journal record with marks, not per kernel.
    sleep(secs(2.5));
    let rep = super::report_json(&["--pid", &w.pid_arg(), "--window", "1s"]);
    let j = &rep["targets"][0]["journal"];
    assert_eq!(j["record"], "marks", "{j}");
    assert_eq!(
        j["completions_seen"], 0,
        "no per-kernel records once the lease lapsed: {j}"
    );
}

/// The bench worker's own line says it made every launch.
fn assert_ran_its_launches(w: &mut Worker, launches: u64) {
    let mut made = String::new();
    if let Some(mut s) = w.child.stdout.take() {
        use std::io::Read as _;
        let _ = s.read_to_string(&mut made);
    }
    assert!(made.contains(&format!("launches {launches}")), "{made}");
}

/// The records a trace's `lost` markers count.
fn counted_lost(events: &[serde_json::Value]) -> u64 {
    events
        .iter()
        .filter(|e| e["cat"] == "lost")
        .map(|e| {
            e["args"]["overwritten_in_ring"].as_u64().unwrap_or(0)
                + e["args"]["reader_buffer_full"].as_u64().unwrap_or(0)
        })
        .sum()
}

/// A trace that loses records says on which streams, and how many: a reader descheduled
/// for 400 ms (SIGSTOP; a loaded node does this to any process) while a launch-bound loop
/// fills a 1,024-record ring over three streams. On each stream the records kept (launches
/// on the host tracks, kernels on the stream's GPU track) and those its `lost_by_stream`
/// marker counts add up to the records the shim numbered on it. (Before, a lost record's
/// stream was gone with it: the trace said how many were lost, not whose, and a stream with
/// holes looked idle.)
#[test]
fn a_trace_that_loses_records_counts_them_on_their_streams() {
    require_root!();
    let shim = shim_path();
    const LAUNCHES: u64 = 300_000;
    let mut w = Worker::spawn_piped(
        &["bench", &LAUNCHES.to_string()],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMWORKER_LAUNCH_DELAY_MS", "3000"),
            ("SIMWORKER_STREAMS", "3"),
            ("WEDGEPROBE_SHIM_RING_RECORDS", "1024"),
        ],
    );
    w.wait_for_cuda();
    let out = tmp("streams-lost.json");
    let t = Command::new(super::wedgeprobe_bin())
        .args(["trace", "--pid", &w.pid_arg(), "--duration", "60s", "-o"])
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Into the loop (it starts 3 s after CUDA), then the reader stops for 400 ms.
    sleep(secs(4.0));
    let stop = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &t.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig}");
    };
    stop("-STOP");
    sleep(secs(0.4));
    stop("-CONT");
    let r = t.wait_with_output().unwrap();
    super::wait_for_background_detach();
    let summary = String::from_utf8_lossy(&r.stdout).into_owned();
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    assert_ran_its_launches(&mut w, LAUNCHES);
    let (events, _) = chrome_check::load(&out).unwrap();
    let lost_total = counted_lost(&events);
    eprintln!("{summary}");
    assert!(
        lost_total > 0,
        "a 1,024-record ring outran a stopped reader: {summary}"
    );
    // Each GPU stream track's handle, from its name: "stream N (0x…) of …".
    let handle_of: std::collections::HashMap<u64, String> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .filter_map(|e| {
            let name = e["args"]["name"].as_str()?;
            let handle = name.split_once('(')?.1.split_once(')')?.0;
            handle
                .starts_with("0x")
                .then(|| (e["tid"].as_u64().unwrap(), handle.to_string()))
        })
        .collect();
    let per_stream: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["cat"] == "lost_by_stream")
        .collect();
    assert_eq!(
        per_stream.len(),
        3,
        "one marker per stream that lost records: {summary}"
    );
    let mut on_streams = 0;
    for m in per_stream {
        let tid = m["tid"].as_u64().unwrap();
        let (lost, written) = (
            m["args"]["lost"].as_u64().unwrap(),
            m["args"]["written"].as_u64().unwrap(),
        );
        let handle = &handle_of[&tid];
        let kernels = events
            .iter()
            .filter(|e| e["cat"] == "kernel" && e["tid"].as_u64() == Some(tid))
            .count() as u64;
        let launches = events
            .iter()
            .filter(|e| e["cat"] == "launch" && e["args"]["stream"].as_str() == Some(handle))
            .count() as u64;
        assert_eq!(
            launches + kernels + lost,
            written,
            "stream {handle}: {launches} launches + {kernels} kernels kept, {lost} lost, \
             {written} written: {summary}"
        );
        assert!(written >= LAUNCHES / 3, "{m}");
        assert!(
            summary.contains(&format!(
                "stream {}: {lost} of {written}",
                m["args"]["stream_id"]
            )),
            "{summary}"
        );
        on_streams += lost;
    }
    assert!(on_streams <= lost_total, "{on_streams} > {lost_total}");
}

/// A trace begun while a launch-bound loop runs reads the ring from its oldest record, and
/// the loop overwrites those first (~90k launches a second into a 1,024-record ring here):
/// what it overwrote before the first read reached it was written before the trace began —
/// history the ring held, not records the trace lost. Before, a trace of such a loop with
/// nothing lost in its window said "N journal records LOST … N synchronize/capture records
/// or not yet placed on a stream" (on the H200, 5,658 of them in a 3 s trace of PyTorch).
#[test]
fn a_trace_begun_mid_loop_does_not_count_the_history_it_raced_as_lost() {
    require_root!();
    let shim = shim_path();
    let w = Worker::spawn_piped(
        &["bench", "3000000"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMWORKER_LAUNCH_DELAY_MS", "300"),
            ("WEDGEPROBE_SHIM_RING_RECORDS", "1024"),
        ],
    );
    w.wait_for_cuda();
    sleep(secs(1.5));
    let out = tmp("mid-loop.json");
    let r = trace(w.pid(), &out, "2s");
    let summary = String::from_utf8_lossy(&r.stdout).into_owned();
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    assert!(
        summary
            .contains("of the oldest records the ring held were overwritten before the first read"),
        "a 1,024-record ring written ~90k times a second outruns the trace's first read: \
         {summary}"
    );
    let (events, _) = chrome_check::load(&out).unwrap();
    let lost = counted_lost(&events);
    let on_streams: u64 = events
        .iter()
        .filter(|e| e["cat"] == "lost_by_stream")
        .map(|e| e["args"]["lost"].as_u64().unwrap())
        .sum();
    // A loss inside the window (a descheduled reader) is on its stream but for the loop's
    // synchronizes (one record in ~2,000, not numbered per stream).
    assert!(
        lost - on_streams.min(lost) <= lost / 100 + 2,
        "{lost} records counted lost, {on_streams} of them on a stream: {summary}"
    );
}

/// A trace of the whole life of a launch-bound loop (300,000 launches back to back, ~140k a
/// second here) keeps every launch, or counts in the trace itself those it lost, so that the
/// kept and the lost cover every launch made. (Reading the ring once a tick, a 3 s trace of such a loop
/// kept ~71% of its launches, and said only `wrote N events`.)
#[test]
fn a_trace_of_a_launch_bound_loop_keeps_every_launch_or_counts_what_it_lost() {
    require_root!();
    let shim = shim_path();
    const LAUNCHES: u64 = 300_000;
    let mut w = Worker::spawn_piped(
        &["bench", &LAUNCHES.to_string()],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMWORKER_LAUNCH_DELAY_MS", "3000"),
        ],
    );
    w.wait_for_cuda();
    let out = tmp("launch-bound.json");
    // Ends when the worker exits, its last records read.
    let r = trace(w.pid(), &out, "60s");
    let summary = String::from_utf8_lossy(&r.stdout).into_owned();
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    assert_ran_its_launches(&mut w, LAUNCHES);
    let (events, _) = chrome_check::load(&out).unwrap();
    let launches = events.iter().filter(|e| e["cat"] == "launch").count() as u64;
    let lost = counted_lost(&events);
    eprintln!(
        "trace kept {launches} of {LAUNCHES} launches, {lost} records counted lost: {summary}"
    );
    assert!(
        launches + lost >= LAUNCHES,
        "{} launches missing from the trace, {lost} records counted lost: {summary}",
        LAUNCHES - launches
    );
    if lost == 0 {
        // At least every launch: once, under load, one launch was kept twice (two correlation
        // ids: the simulated driver's callback recorded a launch its hook had recorded, the
        // pass-through flag flipping between them as the lease began; the callback now asks
        // the hook, `hooks::launch::hook_records_this_launch`). Not proven the only cause,
        // so not an equality.
        assert!(launches >= LAUNCHES, "{summary}");
        assert!(summary.contains("no journal record lost"), "{summary}");
    } else {
        assert!(
            summary.contains(&format!("{lost} journal records LOST")),
            "{summary}"
        );
    }
    assert!(
        summary.contains(&format!("kept {launches} launches")),
        "{summary}"
    );
}

/// At least 10 completed kernel slices on the GPU tracks, and as many launch→kernel flows.
fn assert_completed_kernels_with_flows(c: &Checked) {
    let kernels = c
        .events
        .iter()
        .filter(|e| e["cat"] == "kernel" && e["ph"] == "X")
        .count();
    assert!(kernels >= 10, "{kernels} completed kernels");
    assert!(c.flows_paired >= 10, "{} flows", c.flows_paired);
}

fn open_named<'a>(c: &'a Checked, name: &str) -> Option<&'a serde_json::Value> {
    c.open
        .iter()
        .find(|e| e["name"].as_str().is_some_and(|n| n.contains(name)))
}

#[test]
fn a_trace_of_a_wedge_shows_the_stuck_kernel_and_the_blocked_threads_open() {
    require_root!();
    let w = wedged_with_shim("10");
    sleep(secs(0.5));
    let out = tmp("wedge.json.gz");
    let r = trace(w.pid(), &out, "3s");
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(stdout.contains("mode journal+ebpf"), "{stdout}");
    let c = chrome_check::check_file(&out).unwrap_or_else(|e| panic!("malformed trace: {e}"));
    assert!(!c.truncated);
    // The stuck kernel: open on its GPU stream track, with the queue behind it.
    let k = open_named(&c, "attn_wedge_kernel").expect("the stuck kernel is an open slice");
    assert_eq!(k["cat"], "kernel");
    assert_eq!(k["args"]["kernel"], "_Z17attn_wedge_kernelP7barrierPf");
    assert_eq!(k["args"]["grid"], serde_json::json!([132, 2, 1]));
    // A full queue, less the shim's stream marks in it (one per 8 launches by default).
    assert!(k["args"]["queued_behind"].as_u64().unwrap() >= 900, "{k}");
    assert!(
        k["pid"].as_u64().unwrap() >= 1 << 40,
        "drawn on a GPU process"
    );
    // The host threads behind it: the launcher in cuLaunchKernel, the syncer in a sync.
    assert!(open_named(&c, "cuLaunchKernel").is_some(), "{:?}", c.open);
    assert!(
        open_named(&c, "cuStreamSynchronize").is_some(),
        "{:?}",
        c.open
    );
    // Completed kernels before the wedge, with flows from their launches.
    assert_completed_kernels_with_flows(&c);
    // A verdict instant and the counters.
    assert!(c.events.iter().any(|e| e["cat"] == "verdict"));
    assert!(
        c.events
            .iter()
            .any(|e| e["ph"] == "C" && e["name"].as_str().unwrap().starts_with("in-flight kernels")),
        "no in-flight counter"
    );
}

#[test]
fn an_ebpf_only_trace_has_host_tracks_only() {
    require_root!();
    let w = Worker::spawn(&["wedge", "1", "300"], &[("SIMCUDA_RELEASE_AFTER_S", "10")]);
    sleep(secs(0.5));
    let out = tmp("ebpf.json");
    let r = trace(w.pid(), &out, "2500ms");
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    assert!(String::from_utf8_lossy(&r.stdout).contains("ebpf-only"));
    let c = chrome_check::check_file(&out).unwrap_or_else(|e| panic!("malformed trace: {e}"));
    assert!(
        c.events
            .iter()
            .all(|e| e["pid"].as_u64().unwrap() < 1 << 40),
        "no GPU tracks"
    );
    assert!(
        open_named(&c, "cuStreamSynchronize").is_some(),
        "{:?}",
        c.open
    );
}

#[test]
fn an_unwritable_output_fails_before_attaching_with_its_exit_code() {
    require_root!();
    let w = Worker::spawn(&["healthy", "5"], &[]);
    let r = trace(w.pid(), &PathBuf::from("/proc/no/such/dir/t.json"), "1s");
    assert_eq!(r.status.code(), Some(9), "{r:?}");
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot create /proc/no/such/dir/t.json"),
        "{stderr}"
    );
}

#[test]
fn a_target_that_exits_mid_trace_leaves_a_valid_file() {
    require_root!();
    let shim = shim_path();
    // The exact mode: this worker's kernels were all launched before the trace began, and
    // with marks a trace gets per-kernel records only for kernels launched while it runs
    // (as CUPTI on a GPU: records start with the launches after they are enabled) —
    // `a_trace_with_marks_records_the_kernels_that_run_while_it_traces` covers that.
    let w = Worker::spawn(
        &["healthy", "2"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("WEDGEPROBE_SHIM_RECORD", "exact"),
        ],
    );
    sleep(secs(0.3));
    let out = tmp("exits.json");
    let r = trace(w.pid(), &out, "10s");
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    assert!(String::from_utf8_lossy(&r.stdout).contains("target exited during the trace"));
    let c = chrome_check::check_file(&out).unwrap_or_else(|e| panic!("malformed trace: {e}"));
    assert!(!c.truncated);
    assert!(c.events.iter().any(|e| e["cat"] == "kernel"));
}

#[test]
fn a_full_disk_leaves_a_loadable_file_and_a_clear_error() {
    require_root!();
    let dir = tmp("full");
    std::fs::create_dir_all(&dir).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipping: cannot mount a small tmpfs to fill");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Unmount(dir.clone());
    let shim = shim_path();
    let w = Worker::spawn(&["healthy", "30"], &[("CUDA_INJECTION64_PATH", &shim)]);
    sleep(secs(0.3));
    let out = dir.join("t.json");
    let r = trace(w.pid(), &out, "20s");
    assert_eq!(r.status.code(), Some(9), "{r:?}");
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert!(
        stderr.contains("No space left on device") && stderr.contains("still loads"),
        "{stderr}"
    );
    let c = chrome_check::check_file(&out).unwrap_or_else(|e| panic!("not loadable: {e}"));
    assert!(c.truncated, "cut short, without its closing bracket");
    assert!(c.events.len() > 100, "{} events kept", c.events.len());
}

#[test]
fn the_flight_recorder_dumps_once_per_incident() {
    require_root!();
    let w = wedged_with_shim("20");
    sleep(secs(0.5));
    let dir = tmp("flight");
    let out = wedgeprobe(&[
        "watch",
        "--pid",
        &w.pid_arg(),
        "--json",
        "--kernel-floor",
        "1s",
        "--duration",
        "5s",
        "--flight-dir",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let dumps: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["event"] == "flight_dump")
        .collect();
    assert_eq!(dumps.len(), 1, "one dump for one incident: {lines:?}");
    let trace = PathBuf::from(dumps[0]["trace"].as_str().unwrap());
    let report = PathBuf::from(dumps[0]["report"].as_str().unwrap());
    assert!(trace.to_str().unwrap().ends_with(".trace.json.gz"));
    assert!(
        trace
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .contains(&format!("-{}-", w.pid()))
    );
    let c = chrome_check::check_file(&trace).unwrap_or_else(|e| panic!("malformed dump: {e}"));
    assert!(
        open_named(&c, "attn_wedge_kernel").is_some(),
        "{:?}",
        c.open
    );
    assert!(c.events.iter().filter(|e| e["cat"] == "kernel").count() >= 10);
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["verdict"]["kind"], "kernel_wedge", "{}", r["verdict"]);
}

#[test]
fn a_trace_loads_in_speedscope_in_headless_chromium() {
    require_root!();
    let viewer = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("viewer");
    if !viewer.join("node_modules/speedscope").exists()
        || !PathBuf::from("/usr/bin/chromium").exists()
    {
        eprintln!(
            "skipping: the viewer check needs chromium and tests/viewer/node_modules (scripts/setup.sh installs both)"
        );
        return;
    }
    let w = wedged_with_shim("10");
    sleep(secs(0.5));
    let out = tmp("viewer.json");
    assert_eq!(trace(w.pid(), &out, "2500ms").status.code(), Some(0));
    let shot = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/speedscope-sim.png");
    let r = Command::new("node")
        .current_dir(&viewer)
        .env("PROFILE", "stream,syncer")
        .arg("render.mjs")
        .arg(&out)
        .arg(&shot)
        .output()
        .expect("node");
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(
        r.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(stdout.contains("\"ok\":true"), "{stdout}");
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "a screenshot with content"
    );
}

#[test]
fn the_golden_trace_passes_the_structural_checks() {
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../probe-user/src/output/trace/golden/small.json");
    let c = chrome_check::check_file(&golden).unwrap_or_else(|e| panic!("golden trace: {e}"));
    assert_eq!((c.flows_paired, c.flows_unpaired, c.open.len()), (2, 0, 2));
}

/// The traces recorded on the H200 (docs/runs/h200-2026-11-29-1221-traces-and-flight) pass the same checks, and show what
/// docs/validation.md says they show.
#[test]
fn the_h200_traces_in_docs_are_well_formed() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/runs/h200-2026-11-29-1221-traces-and-flight");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if !name.contains(".trace.json") {
            continue;
        }
        let c = chrome_check::check_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            !c.open.is_empty(),
            "{name}: something is stuck in every one of them"
        );
        if name.contains("ebpf-only") {
            assert!(open_named(&c, "cuStreamSynchronize").is_some(), "{name}");
        } else {
            assert!(
                c.open.iter().any(|e| e["cat"] == "kernel"),
                "{name}: the stuck kernel is open"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 4);
}

#[test]
fn merge_names_the_job_culprit_and_joins_traces_into_a_well_formed_one() {
    let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/runs");
    let out = tmp("merged.json");
    let r = wedgeprobe(&[
        "merge",
        docs.join("h200-2026-11-29-1249-ranks/h200-ranks.report.json")
            .to_str()
            .unwrap(),
        docs.join("h200-2026-11-29-1221-traces-and-flight/h200-mbarrier.trace.json.gz")
            .to_str()
            .unwrap(),
        docs.join("h200-2026-11-29-1221-traces-and-flight/h200-torch-triton.trace.json.gz")
            .to_str()
            .unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(stdout.contains("CULPRIT: rank 2 (pid"), "{stdout}");
    assert!(stdout.contains("joined 2 traces"), "{stdout}");
    let c = chrome_check::check_file(&out).unwrap_or_else(|e| panic!("merged trace: {e}"));
    assert!(
        c.open.iter().filter(|e| e["cat"] == "kernel").count() >= 2,
        "both stuck kernels"
    );
    let names: Vec<&str> = c
        .events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    assert!(
        names.iter().any(|n| n.starts_with("h200-mbarrier: ")),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n.starts_with("h200-torch-triton: ")),
        "{names:?}"
    );
}
