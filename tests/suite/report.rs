//! `wedgeprobe report` against wedged, healthy and several workloads.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::sleep,
};

use super::{
    BOUND_AT_BLOCKED, Worker, assert_empty_list, report_json, report_json_and_stderr, require_root,
    secs, thread,
};

/// Attached before the wedge: the uprobes see the calls begin, so times and arguments are
/// exact, and the kernel names are known (attached before cuModuleGetFunction).
#[test]
fn wedge_names_the_blocked_launcher_and_syncer() {
    require_root!();
    let w = Worker::spawn(
        &["wedge", "12", "1000"],
        &[
            ("SIMWORKER_START_DELAY_MS", "1500"),
            ("SIMCUDA_RELEASE_AFTER_S", "8"),
        ],
    );
    sleep(secs(0.3));
    // Attach at ~0.5 s; the kernels are looked up at 1.5 s, the wedge at 2.5 s.
    let r = report_json(&[
        "--pid",
        &w.pid_arg(),
        "--window",
        "5s",
        BOUND_AT_BLOCKED[0],
        BOUND_AT_BLOCKED[1],
    ]);
    let launcher = thread(&r, "launcher").expect("launcher is in a call");
    assert_eq!(launcher["api"], "cuLaunchKernel");
    assert_eq!(launcher["seen_by"], "uprobe");
    assert_eq!(launcher["blocked"], true);
    assert!(
        launcher["in_call_ms"].as_f64().unwrap() > 1000.0,
        "{launcher}"
    );
    assert!(
        launcher["sched_yield_per_s"].as_f64().unwrap() > 1000.0,
        "{launcher}"
    );
    assert_eq!(launcher["grid"], serde_json::json!([132, 2, 1]));
    assert_eq!(launcher["block"], serde_json::json!([128, 1, 1]));
    assert_eq!(launcher["kernel"], "_Z13decode_kernelPKfPfi");
    let stream = launcher["stream"].as_str().expect("stream known");
    let syncer = thread(&r, "syncer").expect("syncer is in a call");
    assert_eq!(syncer["api"], "cuStreamSynchronize");
    assert_eq!(
        syncer["stream"].as_str(),
        Some(stream),
        "both wait on the same stream"
    );
    assert_eq!(syncer["blocked"], true);
    assert!(
        syncer["sched_yield_per_s"].as_f64().unwrap() < 1.0,
        "sync spins without yielding"
    );
    assert_eq!(r["verdict"]["kind"], "launch_queue_full");
    assert!(
        r["verdict"]["summary"]
            .as_str()
            .unwrap()
            .contains("launcher")
    );
    let lat = r["latency"].as_array().unwrap();
    assert!(
        lat.iter()
            .any(|l| l["api"] == "cuLaunchKernel" && l["count"].as_u64() > Some(1000))
    );
    for (k, v) in r["lost"].as_object().unwrap() {
        assert_eq!(v, 0, "lost {k}");
    }
}

/// Attached after the wedge (the 3 a.m. case): the threads are found by stack scan.
#[test]
fn wedge_found_after_the_fact_by_stack_scan() {
    require_root!();
    let w = Worker::spawn(&["wedge", "10", "300"], &[("SIMCUDA_RELEASE_AFTER_S", "8")]);
    sleep(secs(1.5));
    let r = report_json(&[
        "--pid",
        &w.pid_arg(),
        BOUND_AT_BLOCKED[0],
        BOUND_AT_BLOCKED[1],
    ]);
    let launcher = thread(&r, "launcher").expect("launcher found");
    assert_eq!(launcher["api"], "cuLaunchKernel");
    assert_eq!(launcher["seen_by"], "stack-scan");
    assert_eq!(launcher["in_call_at_least"], true);
    assert_eq!(launcher["blocked"], true);
    let syncer = thread(&r, "syncer").expect("syncer found");
    assert_eq!(syncer["api"], "cuStreamSynchronize");
    // A synchronize spins without yielding: over the window watched that is a measured 0, not
    // an unknown (the H200's sync-wedge read "not measured" for its whole report).
    assert_eq!(syncer["sched_yield_measured"], true, "{syncer}");
    assert!(
        syncer["sched_yield_per_s"].as_f64().unwrap() < 1.0,
        "{syncer}"
    );
    assert!(
        thread(&r, "sim-gpu").is_none(),
        "the driver's own thread is no API call"
    );
    assert_eq!(r["verdict"]["kind"], "launch_queue_full");
}

/// Without a journal nothing shows whether the GPU completes work: a launch blocked behind a
/// full queue looks the same behind a wedge as behind a 2.5 s kernel that completes (the H200
/// soak: `report` called the healthy one `launch_queue_full` three times in 330 s, the daemon
/// eight). Under the no-journal bound (default 10 s) it is `waiting`, the threads still listed
/// blocked, the unknown said; a window reaching the bound gives the incident.
#[test]
fn a_wait_without_a_journal_is_waiting_until_its_bound() {
    require_root!();
    // Released late: the second report starts after the first one's probes are closed
    // (`wait_for_background_detach`, seconds).
    let w = Worker::spawn(
        &["wedge", "30", "300"],
        &[("SIMCUDA_RELEASE_AFTER_S", "28")],
    );
    sleep(secs(1.5));
    let r = report_json(&["--pid", &w.pid_arg()]);
    assert_eq!(r["verdict"]["kind"], "waiting", "{}", r["verdict"]);
    let summary = r["verdict"]["summary"].as_str().unwrap();
    let launcher = thread(&r, "launcher").expect("launcher found");
    assert_eq!(launcher["blocked"], true, "{launcher}");
    assert!(
        summary.contains(&format!("tid {}", launcher["tid"]))
            && summary.contains("GPU progress not seen")
            && summary.contains("10.0 s"),
        "{summary}"
    );
    // The same wait watched past a lowered bound is the incident.
    let r = report_json(&[
        "--pid",
        &w.pid_arg(),
        "--window",
        "2.5s",
        "--no-journal-bound",
        "2s",
    ]);
    assert_eq!(
        r["verdict"]["kind"], "launch_queue_full",
        "{}",
        r["verdict"]
    );
}

/// A synchronize that sleeps (blocking sync) is found from /proc, off-CPU.
#[test]
fn sleeping_sync_found_after_the_fact() {
    require_root!();
    let w = Worker::spawn(
        &["wedge", "10", "300"],
        &[
            ("SIMCUDA_RELEASE_AFTER_S", "8"),
            ("SIMCUDA_BLOCKING_SYNC", "1"),
        ],
    );
    sleep(secs(1.5));
    let r = report_json(&["--pid", &w.pid_arg()]);
    let syncer = thread(&r, "syncer").expect("syncer found");
    assert_eq!(syncer["api"], "cuStreamSynchronize");
    assert_eq!(syncer["blocked"], true);
}

#[test]
fn healthy_busy_process_is_not_blocked() {
    require_root!();
    let w = Worker::spawn(&["healthy", "8"], &[("SIMCUDA_LONG_KERNEL_MS", "50")]);
    sleep(secs(0.5));
    let r = report_json(&["--pid", &w.pid_arg(), "--window", "2s"]);
    assert_eq!(r["verdict"]["kind"], "healthy", "{}", r["verdict"]);
    assert!(
        r["threads"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["blocked"] == false)
    );
    let lat = r["latency"].as_array().unwrap();
    let count = |api: &str| {
        lat.iter()
            .find(|l| l["api"] == api)
            .and_then(|l| l["count"].as_u64())
            .unwrap_or(0)
    };
    assert!(count("cuLaunchKernel") > 1000, "{lat:?}");
    assert!(count("cuStreamSynchronize") > 10, "{lat:?}");
}

/// A busy host (a loop on every core beside the worker): a launcher spinning in a full queue
/// since before attach yields its core away at every `sched_yield`, so the timer seldom
/// samples it — on 2026-12-07 it got one sample in 4.75 s, `report` could not see it inside
/// `cuLaunchKernel`, watched on as if it spun on the host ("busy on the host since attach …
/// watching up to 10.5 s more") and, once the worker released itself meanwhile, answered
/// `healthy`. Its yields are stack sample points now: seen inside its launch, a full queue.
#[test]
fn a_launcher_blocked_in_a_full_queue_is_seen_inside_its_call_on_a_busy_host() {
    require_root!();
    let w = Worker::spawn(&["wedge", "10", "300"], &[("SIMCUDA_RELEASE_AFTER_S", "8")]);
    let stop = Arc::new(AtomicBool::new(false));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let hogs: Vec<_> = (0..cores)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    sleep(secs(1.5));
    let answer = std::panic::catch_unwind(|| {
        report_json_and_stderr(&[
            "--pid",
            &w.pid_arg(),
            BOUND_AT_BLOCKED[0],
            BOUND_AT_BLOCKED[1],
        ])
    });
    stop.store(true, Ordering::Relaxed);
    for h in hogs {
        let _ = h.join();
    }
    let (r, err) = answer.unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert!(
        !err.contains("busy on the host since attach"),
        "the blocked launcher taken for a host spin: {err}"
    );
    assert_eq!(
        r["verdict"]["kind"], "launch_queue_full",
        "{}",
        r["verdict"]
    );
    let launcher = thread(&r, "launcher").expect("the launcher is in a call");
    assert_eq!(launcher["api"], "cuLaunchKernel", "{launcher}");
    assert_eq!(launcher["blocked"], true, "{launcher}");
}

#[test]
fn two_targets_at_once() {
    require_root!();
    let a = Worker::spawn(&["wedge", "10", "300"], &[("SIMCUDA_RELEASE_AFTER_S", "8")]);
    let b = Worker::spawn(&["healthy", "10"], &[("SIMCUDA_LONG_KERNEL_MS", "50")]);
    sleep(secs(1.5));
    let r = report_json(&[
        "--pid",
        &a.pid_arg(),
        "--pid",
        &b.pid_arg(),
        BOUND_AT_BLOCKED[0],
        BOUND_AT_BLOCKED[1],
    ]);
    let pids: Vec<u64> = r["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(pids.len(), 2);
    let blocked: Vec<&serde_json::Value> = r["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["blocked"] == true)
        .collect();
    assert!(!blocked.is_empty());
    assert!(
        blocked
            .iter()
            .all(|t| t["pid"].as_u64() == Some(a.pid() as u64)),
        "{blocked:?}"
    );
    assert_eq!(r["verdict"]["kind"], "launch_queue_full");
}

#[test]
fn many_short_lived_threads() {
    require_root!();
    let w = Worker::spawn(&["threads", "6"], &[]);
    sleep(secs(0.3));
    let r = report_json(&["--pid", &w.pid_arg(), "--window", "3s"]);
    let lat = r["latency"].as_array().unwrap();
    let launches = lat
        .iter()
        .find(|l| l["api"] == "cuLaunchKernel")
        .and_then(|l| l["count"].as_u64())
        .unwrap_or(0);
    // Each thread makes 20 launches and exits: calls from many threads were all traced.
    assert!(launches >= 100, "{lat:?}");
    assert_eq!(r["verdict"]["kind"], "healthy");
    for (k, v) in r["lost"].as_object().unwrap() {
        // Calls already under way while the probes went in return without a seen entry.
        if k != "exit_without_entry" {
            assert_eq!(v, 0, "lost {k}");
        }
    }
}

/// cuLaunchKernelEx takes its dimensions and stream from a CUlaunchConfig in user memory;
/// the syncer waits in a blocking copy this time.
#[test]
fn launch_ex_config_is_read_and_a_blocking_copy_is_named() {
    require_root!();
    let w = Worker::spawn(
        &["wedge", "10", "800"],
        &[
            ("SIMWORKER_LAUNCH_API", "ex"),
            ("SIMWORKER_SYNC_API", "copy"),
            ("SIMCUDA_RELEASE_AFTER_S", "8"),
        ],
    );
    sleep(secs(0.3));
    let r = report_json(&[
        "--pid",
        &w.pid_arg(),
        "--window",
        "3s",
        BOUND_AT_BLOCKED[0],
        BOUND_AT_BLOCKED[1],
    ]);
    let launcher = thread(&r, "launcher").expect("launcher is in a call");
    assert_eq!(launcher["api"], "cuLaunchKernelEx");
    assert_eq!(launcher["grid"], serde_json::json!([66, 4, 2]));
    assert_eq!(launcher["block"], serde_json::json!([256, 2, 1]));
    assert!(
        launcher["stream"].as_str().is_some_and(|s| s != "0x0"),
        "{launcher}"
    );
    let copier = thread(&r, "syncer").expect("syncer is in a call");
    assert_eq!(copier["api"], "cuMemcpyDtoH_v2");
    assert_eq!(copier["blocked"], true);
    assert_eq!(r["verdict"]["kind"], "launch_queue_full");
    assert!(
        r["verdict"]["summary"]
            .as_str()
            .unwrap()
            .contains("cuMemcpyDtoH_v2")
    );
}

/// Only a synchronize is blocked (the launcher is not): blocked_in_sync.
#[test]
fn ctx_synchronize_alone_gives_blocked_in_sync() {
    require_root!();
    // run_s no longer than the wedge time: the launcher launches the wedge, then waits in
    // cuStreamSynchronize; the syncer waits in cuCtxSynchronize. No launch is blocked.
    let w = Worker::spawn(
        &["wedge", "0.3", "300"],
        &[
            ("SIMWORKER_SYNC_API", "ctx"),
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
    let syncer = thread(&r, "syncer").expect("syncer found");
    assert_eq!(syncer["api"], "cuCtxSynchronize");
    assert_eq!(
        thread(&r, "launcher").expect("launcher found")["api"],
        "cuStreamSynchronize"
    );
    assert_eq!(r["verdict"]["kind"], "blocked_in_sync", "{}", r["verdict"]);
}

/// On the H200: CUDA 13's `cudaDeviceSynchronize` (`torch.cuda.synchronize()`)
/// waits in `cuCtxSynchronize_v2`, which was traced by neither eBPF nor the shim: the thread was
/// "libcuda (entry point unknown)". Named now, with and without the shim.
#[test]
fn a_ctx_synchronize_v2_is_named() {
    require_root!();
    for shim in [false, true] {
        let mut env = vec![
            ("SIMWORKER_SYNC_API", "ctx_v2"),
            ("SIMCUDA_RELEASE_AFTER_S", "6"),
        ];
        let shim_path = super::shim_path();
        if shim {
            env.push(("CUDA_INJECTION64_PATH", shim_path.as_str()));
        }
        let w = Worker::spawn(&["wedge", "0.3", "300"], &env);
        sleep(secs(1.5));
        let r = report_json(&[
            "--pid",
            &w.pid_arg(),
            BOUND_AT_BLOCKED[0],
            BOUND_AT_BLOCKED[1],
        ]);
        let syncer = thread(&r, "syncer").expect("syncer found");
        assert_eq!(
            syncer["api"], "cuCtxSynchronize_v2",
            "shim {shim}: {syncer}"
        );
        // With the shim the journal dates the kernel (2 s, under its 5 s bound): busy.
        let kind = if shim { "busy" } else { "blocked_in_sync" };
        assert_eq!(r["verdict"]["kind"], kind, "shim {shim}: {}", r["verdict"]);
    }
    // Entered after attach: the entry probe itself records it (an eBPF object built with an
    // older API table read no arguments for it and dropped the call: arg_read_failed).
    let w = Worker::spawn(
        &["wedge", "0.3", "300"],
        &[
            ("SIMWORKER_SYNC_API", "ctx_v2"),
            ("SIMWORKER_START_DELAY_MS", "1500"),
            ("SIMCUDA_RELEASE_AFTER_S", "8"),
        ],
    );
    sleep(secs(0.3));
    let r = report_json(&["--pid", &w.pid_arg(), "--window", "3s"]);
    let syncer = thread(&r, "syncer").expect("syncer found");
    assert_eq!(syncer["api"], "cuCtxSynchronize_v2", "{syncer}");
    assert_eq!(syncer["seen_by"], "uprobe", "{syncer}");
    assert_eq!(r["lost"]["arg_read_failed"], 0, "{}", r["lost"]);
}

/// synchronizes entered before attach keep their identity and their age.
/// Without the shim, found by samples only: named, in the call "at least" since attach (never
/// the age of the first sample), and the verdict names the same threads the table lists.
/// With the shim: the journal names the call and gives its exact start, before attach.
#[test]
fn a_synchronize_entered_before_attach_keeps_its_name_and_age() {
    require_root!();
    let shim = super::shim_path();
    for with_shim in [false, true] {
        let mut env = vec![
            ("SIMWORKER_SYNC_API", "ctx"),
            ("SIMCUDA_RELEASE_AFTER_S", "8"),
        ];
        if with_shim {
            env.push(("CUDA_INJECTION64_PATH", shim.as_str()));
        }
        let w = Worker::spawn(&["wedge", "0.3", "300"], &env);
        sleep(secs(1.5));
        let r = report_json(&[
            "--pid",
            &w.pid_arg(),
            BOUND_AT_BLOCKED[0],
            BOUND_AT_BLOCKED[1],
        ]);
        let syncer = thread(&r, "syncer").expect("syncer found");
        assert_eq!(syncer["api"], "cuCtxSynchronize", "{syncer}");
        assert_eq!(syncer["blocked"], true, "{syncer}");
        let in_call = syncer["in_call_ms"].as_f64().unwrap();
        let seen_by = syncer["seen_by"].as_str().unwrap();
        if with_shim {
            assert!(seen_by.contains("journal"), "{syncer}");
            // Entered ~1.2 s before attach, and the journal knows when.
            assert!(in_call >= 1500.0, "{syncer}");
        } else {
            assert_eq!(syncer["in_call_at_least"], true, "{syncer}");
            // At least the whole window watched (1 s), however late the first sample.
            assert!(in_call >= 900.0, "{syncer}");
        }
        let summary = r["verdict"]["summary"].as_str().unwrap();
        // With the shim the kernel they wait behind is known (and still within its bound).
        let kind = r["verdict"]["kind"].as_str().unwrap();
        assert!(
            kind == if with_shim { "busy" } else { "blocked_in_sync" },
            "{}",
            r["verdict"]
        );
        assert!(
            summary.contains(&format!("tid {}", syncer["tid"])),
            "the verdict names the thread the table lists: {summary}"
        );
    }
}

/// A thread inside CUDA's initialisation for seconds (PyTorch's took 10–17 s on the H200 VM)
/// is named by its entry point and is not a verdict: the daemon called such a thread "blocked
/// in the driver, entry point unknown" (2026-12-01).
#[test]
fn a_thread_initialising_cuda_for_seconds_is_named_and_healthy() {
    require_root!();
    let w = Worker::spawn(&["healthy", "6"], &[("SIMCUDA_INIT_DELAY_MS", "4000")]);
    w.wait_for_cuda();
    sleep(secs(0.8));
    let r = report_json(&["--pid", &w.pid_arg()]);
    let main = thread(&r, "simworker").expect("the main thread is inside cuInit");
    assert_eq!(main["api"], "cuInit", "{main}");
    assert_eq!(main["blocked"], true, "{main}");
    assert_eq!(r["verdict"]["kind"], "healthy", "{}", r["verdict"]);
    assert!(
        r["verdict"]["summary"]
            .as_str()
            .unwrap()
            .starts_with("initialising CUDA"),
        "{}",
        r["verdict"]
    );
}

/// A thread busy on the host since attach (no shim, no driver call returning) makes the
/// window grow; when it stops while watched, the answer is about the window's end — not a
/// stall — and says what it watched: before, `healthy` with no word of the seconds of
/// spinning the report had sat through (2026-12-07, the busy-host runs).
#[test]
fn a_spin_that_stops_while_the_window_grows_is_said_not_forgotten() {
    require_root!();
    // Spins from its start until 6 s, then sleeps: alive, idle. 6 s leaves a slow machine's
    // attach and first window (~1.5 s here) room to end inside the spin, and stops well
    // before the default `--stall-after` (10 s) would call it a stall.
    let w = Worker::spawn(&["spin", "6"], &[("SIMWORKER_LINGER_S", "30")]);
    sleep(secs(0.5));
    let pid = w.pid_arg();
    let (r, err) = report_json_and_stderr(&["--pid", &pid]);
    assert!(err.contains("watching up to"), "the window grew: {err}");
    assert_ne!(r["verdict"]["kind"], "host_stall", "{}", r["verdict"]);
    assert_empty_list(&r, "undecided", "");
    let watched = r["watched"].as_array().expect("a `watched` list");
    assert_eq!(watched.len(), 1, "{watched:?}");
    let t = &watched[0];
    assert_eq!(t["tid"].to_string(), pid, "the spinning main thread: {t}");
    assert!(t["busy_ms"].as_f64().unwrap() >= 1000.0, "{t}");
    assert!(t["stopped_after_ms"].as_f64().unwrap() >= 1000.0, "{t}");
}
