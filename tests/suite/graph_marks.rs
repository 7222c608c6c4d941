//! The stuck node of a CUDA graph (issue 30): the shim's graph marks
//! (cupti-shim/src/marks/graph.rs; opt-in, `WEDGEPROBE_GRAPH_MARK_EVERY`, after their price on
//! the GPU) on the simulated driver's graph API, for each graph shape
//! the issue names — a chain with the stuck kernel early, in the middle and last, after
//! healthy replays of the same exec; captured from a stream; branches; a child graph; an exec
//! updated in place —
//! and the graph's "output" (the kernels run, in order) unchanged by the marks.

use std::io::Read;

use super::*;

/// A `simworker graph` run with the shim (marks mode, the default; graph marks on, a mark per
/// 4 kernel nodes, unless `env` says otherwise) and `env`, its stderr into `log` if given;
/// waits until the report calls it a kernel wedge and returns that report's first head.
fn stuck_head_logged(env: &[(&str, &str)], log: Option<&std::path::Path>) -> serde_json::Value {
    stuck_report_logged(env, log)["kernels"][0].clone()
}

/// `stuck_head_logged`'s whole report.
fn stuck_report_logged(env: &[(&str, &str)], log: Option<&std::path::Path>) -> serde_json::Value {
    let shim = shim_path();
    let mut all: Vec<(&str, &str)> = vec![
        ("CUDA_INJECTION64_PATH", &shim),
        ("WEDGEPROBE_GRAPH_MARK_EVERY", "4"),
        ("SIMCUDA_RELEASE_AFTER_S", "12"),
        // Two healthy replays of the same exec first: their marks set every word, and the
        // third replay's reset must clear them.
        ("SIMCUDA_WEDGE_ON_RUN", "3"),
    ];
    all.extend_from_slice(env);
    let w = match log {
        Some(log) => Worker::spawn_logged(&["graph", "10"], &all, log),
        None => Worker::spawn(&["graph", "10"], &all),
    };
    w.wait_for_cuda();
    let mut last = serde_json::Value::Null;
    let wedged = wait_until(secs(8.0), || {
        last = report_json(&["--pid", &w.pid_arg(), "--kernel-floor", "1s"]);
        last["verdict"]["kind"] == "kernel_wedge"
    });
    assert!(wedged, "{env:?}: no kernel wedge: {}", last["verdict"]);
    last
}

fn stuck_head(env: &[(&str, &str)]) -> serde_json::Value {
    stuck_head_logged(env, None)
}

fn names(nodes: &serde_json::Value) -> Vec<String> {
    nodes
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {nodes}"))
        .iter()
        .map(|n| n["kernel"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn a_stuck_node_early_in_the_middle_and_last_is_among_at_most_four_candidates() {
    require_root!();
    for (at, wedge) in [
        ("0", "graph_k0_wedge"),
        ("5", "graph_k5_wedge"),
        ("11", "graph_k11_wedge"),
    ] {
        let head = stuck_head(&[("SIMWORKER_GRAPH_WEDGE_AT", at)]);
        assert_eq!(head["exact"], true, "at {at}: {head}");
        let g = &head["graph"];
        let branches = g["marks"]["branches"]
            .as_array()
            .unwrap_or_else(|| panic!("at {at}: {g}"));
        assert_eq!(branches.len(), 1, "at {at}: {g}");
        let candidates = names(&branches[0]["candidates"]);
        assert!(candidates.len() <= 4, "at {at}: {candidates:?}");
        assert!(
            candidates.contains(&wedge.to_string()),
            "at {at}: {candidates:?}"
        );
        // The nodes before the candidates' group are known done.
        let first = branches[0]["candidates"][0]["position"].as_u64().unwrap();
        assert_eq!(
            branches[0]["done"].as_u64().unwrap(),
            first - 1,
            "at {at}: {g}"
        );
        assert_eq!(g["kernel_nodes"], 12, "at {at}");
        // When the replay last made progress (the flush thread's view): no later than when
        // the stuck kernel began, so about as long ago as the head has run.
        let ago = g["marks"]["last_progress_ms_ago"]
            .as_f64()
            .unwrap_or_else(|| panic!("at {at}: {g}"));
        let running = head["running_ms"].as_f64().unwrap();
        assert!(
            ago >= 500.0 && ago <= running + 300.0,
            "at {at}: {ago} ms, running {running} ms"
        );
    }
}

/// What PyTorch, vLLM, SGLang and TensorRT-LLM do: the graph comes from a stream capture
/// (the launches into the capturing stream become its nodes, and are not in flight).
#[test]
fn a_graph_captured_from_a_stream_gets_its_stuck_node_named() {
    require_root!();
    let head = stuck_head(&[
        ("SIMWORKER_GRAPH_BUILD", "capture"),
        ("SIMWORKER_GRAPH_WEDGE_AT", "9"),
    ]);
    let b = &head["graph"]["marks"]["branches"][0];
    let c = names(&b["candidates"]);
    assert!(
        c.contains(&"graph_k9_wedge".to_string()) && c.len() <= 4,
        "{head}"
    );
    assert_eq!(head["graph"]["kernel_nodes"], 12, "{head}");
    // The captured launches were never in flight: the stream's head is the replay.
    assert_eq!(head["kernel"], "(graph launch)", "{head}");
}

#[test]
fn a_mark_after_every_kernel_names_the_stuck_node_exactly_with_its_shape() {
    require_root!();
    let head = stuck_head(&[
        ("SIMWORKER_GRAPH_WEDGE_AT", "6"),
        ("WEDGEPROBE_GRAPH_MARK_EVERY", "1"),
    ]);
    let b = &head["graph"]["marks"]["branches"][0];
    assert_eq!(b["exact"], true, "{head}");
    assert_eq!(names(&b["candidates"]), vec!["graph_k6_wedge"], "{head}");
    let n = &b["candidates"][0];
    assert_eq!(n["position"], 7);
    assert_eq!(n["grid"], serde_json::json!([70, 1, 1]));
    assert_eq!(n["block"], serde_json::json!([128, 1, 1]));
    assert_eq!(b["done"], 6);
}

#[test]
fn a_branched_graph_reports_every_unfinished_branch_and_the_stuck_one_among_them() {
    require_root!();
    // A root, two branches of five, a join: the second branch's third kernel wedges.
    let head = stuck_head(&[
        ("SIMWORKER_GRAPH_SHAPE", "branches"),
        ("SIMWORKER_GRAPH_WEDGE_AT", "8"),
    ]);
    let g = &head["graph"];
    let branches = g["marks"]["branches"]
        .as_array()
        .unwrap_or_else(|| panic!("{g}"));
    let stuck: Vec<_> = branches
        .iter()
        .filter(|b| names(&b["candidates"]).contains(&"graph_k8_wedge".to_string()))
        .collect();
    assert_eq!(stuck.len(), 1, "{g}");
    assert!(names(&stuck[0]["candidates"]).len() <= 4, "{g}");
    // The first branch ran to its end (the simulated GPU runs one branch after the other):
    // it is not listed; the join, waiting for both, is.
    assert!(
        branches
            .iter()
            .all(|b| !names(&b["candidates"]).contains(&"graph_k1".to_string())),
        "{g}"
    );
    assert!(
        branches
            .iter()
            .any(|b| names(&b["candidates"]) == vec!["graph_k11"]),
        "{g}"
    );
}

#[test]
fn a_child_graph_node_is_named_as_one_node_and_an_exec_updated_in_place_keeps_its_marks() {
    require_root!();
    let head = stuck_head(&[
        ("SIMWORKER_GRAPH_SHAPE", "child"),
        ("SIMWORKER_GRAPH_WEDGE_AT", "100"),
        ("WEDGEPROBE_GRAPH_MARK_EVERY", "1"),
    ]);
    let b = &head["graph"]["marks"]["branches"][0];
    let c = names(&b["candidates"]);
    assert_eq!(c.len(), 1, "{head}");
    assert!(c[0].starts_with("(child graph node"), "{c:?}");
    assert_eq!(b["candidates"][0]["position"], 5, "{head}");

    // cuGraphExecUpdate from a graph of the same shape: the update succeeds with the marks in
    // (printed by the worker), and the updated kernels are the ones named.
    let head = stuck_head(&[
        ("SIMWORKER_GRAPH_WEDGE_AT", "5"),
        ("SIMWORKER_GRAPH_UPDATE", "1"),
    ]);
    let c = names(&head["graph"]["marks"]["branches"][0]["candidates"]);
    assert!(c.contains(&"graph_updated_k5_wedge".to_string()), "{c:?}");
}

/// `cuGraphExecKernelNodeSetParams` gives a node of an exec another kernel (TensorRT-LLM and
/// others update instantiated graphs so): the stuck node is named as the kernel it runs now,
/// with its new dimensions, with graph marks and in the default listing alike.
#[test]
fn a_kernel_node_set_in_the_exec_is_named_as_the_kernel_it_runs_now() {
    require_root!();
    let head = stuck_head(&[("SIMWORKER_GRAPH_SET_AT", "5")]);
    let c = &head["graph"]["marks"]["branches"][0]["candidates"];
    assert!(
        names(c).contains(&"graph_swapped_k5_wedge".to_string()),
        "{head}"
    );
    assert!(!names(c).contains(&"graph_k5".to_string()), "{head}");
    let swapped = c
        .as_array()
        .and_then(|c| c.iter().find(|n| n["kernel"] == "graph_swapped_k5_wedge"))
        .unwrap_or_else(|| panic!("{head}"));
    assert_eq!(swapped["grid"], serde_json::json!([300, 1, 1]), "{head}");

    // After an exec update the caller may go on naming the nodes of the graph it first
    // instantiated: the set reaches the updated exec's node all the same.
    let head = stuck_head(&[
        ("SIMWORKER_GRAPH_SET_AT", "5"),
        ("SIMWORKER_GRAPH_UPDATE", "1"),
    ]);
    let c = names(&head["graph"]["marks"]["branches"][0]["candidates"]);
    assert!(c.contains(&"graph_swapped_k5_wedge".to_string()), "{c:?}");
    assert!(!c.contains(&"graph_updated_k5".to_string()), "{c:?}");

    // Marks off (the default): the graph's nodes listed, the set one as it runs now; through
    // the CUDA 11 entry point and the generic one too.
    for api in ["v2", "v1", "generic"] {
        let head = stuck_head(&[
            ("SIMWORKER_GRAPH_SET_AT", "5"),
            ("SIMWORKER_GRAPH_SET_API", api),
            ("WEDGEPROBE_GRAPH_MARK_EVERY", ""),
        ]);
        let listed = names(&head["graph"]["not_completed"]);
        assert!(
            listed.contains(&"graph_swapped_k5_wedge".to_string()),
            "{api}: {head}"
        );
        assert!(!listed.contains(&"graph_k5".to_string()), "{api}: {head}");
    }
}

/// The last of many execs (`execs`: the simulated worker's settings) is replayed stuck at
/// node 5 of 12: named with its 12 nodes, by default and with graph marks, nothing dropped.
fn last_of_many_execs_is_named(execs: &[(&str, &str)]) {
    for every in ["", "4"] {
        let env = [
            &[
                ("SIMWORKER_GRAPH_WEDGE_AT", "5"),
                ("WEDGEPROBE_GRAPH_MARK_EVERY", every),
            ][..],
            execs,
        ]
        .concat();
        let r = stuck_report_logged(&env, None);
        let head = &r["kernels"][0];
        let g = &head["graph"];
        assert_eq!(
            g["kernel_nodes"], 12,
            "{execs:?}, marks every {every:?}: {head}"
        );
        let named = if every.is_empty() {
            names(&g["not_completed"])
        } else {
            names(&g["marks"]["branches"][0]["candidates"])
        };
        assert!(
            named.contains(&"graph_k5_wedge".to_string()),
            "{execs:?}, marks every {every:?}: {head}"
        );
        for (k, v) in r["targets"][0]["journal"]["drops"].as_object().unwrap() {
            assert_eq!(
                v, 0,
                "{execs:?}, marks every {every:?}: the shim dropped {k}"
            );
        }
    }
}

/// A server captures a graph per batch size and per piece of its model: vLLM's piecewise
/// graphs are ~67 sizes × (layers + 1) pieces, thousands of execs and tens of thousands of
/// kernel nodes. The graph table held 4,096 slots: past them a stuck replay was "graph launch
/// of 0 kernel nodes". 2,000 execs of 12 nodes (26,000 slots), all alive.
#[test]
fn a_server_s_thousands_of_captured_graphs_are_all_named() {
    require_root!();
    last_of_many_execs_is_named(&[("SIMWORKER_GRAPH_EXECS", "2000")]);
}

/// A server that captures its graphs again and again (a model reloaded, its batch sizes
/// captured anew) destroys the execs it replaced. Their slots in the graph table were never
/// given back: 6,000 execs of 12 nodes made one after another, each destroyed once the next
/// exists (78,000 slots over time, 13 live), filled the 65,536 slots, and the last exec's
/// stuck replay lost its nodes (`graphs_full`). Now a destroyed exec's slots go back.
#[test]
fn a_server_that_captures_its_graphs_again_and_again_is_still_named() {
    require_root!();
    last_of_many_execs_is_named(&[
        ("SIMWORKER_GRAPH_EXECS", "6000"),
        ("SIMWORKER_GRAPH_DESTROY", "1"),
    ]);
}

/// The kernels a `simworker graph` run of 40 replays ran, in order (count and hash).
fn graph_output(env: &[(&str, &str)]) -> String {
    let mut w = Worker::spawn_piped(&["graph", "10"], env);
    let status = w.child.wait().expect("worker");
    assert!(status.success(), "{env:?}: {status}");
    let mut out = String::new();
    w.child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    out.lines()
        .find(|l| l.starts_with("kernels_run"))
        .unwrap_or_else(|| panic!("{out}"))
        .to_string()
}

#[test]
fn graph_marks_never_change_what_a_graph_runs() {
    require_root!();
    let shim = shim_path();
    for shape in ["chain", "branches", "child"] {
        let base = [
            ("SIMWORKER_GRAPH_SHAPE", shape),
            ("SIMWORKER_GRAPH_REPLAYS", "40"),
        ];
        let without = graph_output(&base);
        let with_shim_no_marks = graph_output(
            &[
                &base[..],
                &[
                    ("CUDA_INJECTION64_PATH", &shim),
                    ("WEDGEPROBE_GRAPH_MARK_EVERY", "0"),
                ],
            ]
            .concat(),
        );
        let on = [
            ("CUDA_INJECTION64_PATH", shim.as_str()),
            ("WEDGEPROBE_GRAPH_MARK_EVERY", "4"),
        ];
        let with_marks = graph_output(&[&base[..], &on[..]].concat());
        assert_eq!(without, with_shim_no_marks, "{shape}");
        assert_eq!(without, with_marks, "{shape}");
    }
}

/// Graph marks are opt-in (their price on the GPU: the module doc of marks::graph): by
/// default a stuck replay is the graph launch with its kernel nodes listed, and no node of
/// ours goes into the user's graph.
#[test]
fn by_default_a_graph_gets_no_marks_and_its_launch_is_named_with_its_nodes() {
    require_root!();
    let head = stuck_head(&[
        ("SIMWORKER_GRAPH_WEDGE_AT", "5"),
        ("WEDGEPROBE_GRAPH_MARK_EVERY", ""),
    ]);
    let g = &head["graph"];
    assert!(g.get("marks").is_none(), "{head}");
    assert_eq!(g["kernel_nodes"], 12, "{head}");
    assert_eq!(g["node_progress"], false, "{head}");
}

/// A device-launched graph (CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) is not covered: no
/// marks go in, one line says so, and its stuck replay is named as the graph launch it is.
#[test]
fn a_device_launched_graph_is_said_not_covered_and_gets_no_marks() {
    require_root!();
    let log = std::env::temp_dir().join(format!("wp-graph-device-{}.stderr", std::process::id()));
    let head = stuck_head_logged(
        &[
            ("SIMWORKER_GRAPH_WEDGE_AT", "5"),
            ("SIMWORKER_GRAPH_INSTANTIATE_FLAGS", "4"),
        ],
        Some(&log),
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(
        text.contains("a device-launched graph is not covered by graph marks"),
        "{text}"
    );
    assert!(head["graph"].get("marks").is_none(), "{head}");
    assert_eq!(head["graph"]["kernel_nodes"], 12, "{head}");
}

#[test]
fn a_driver_refusing_the_marked_graph_gets_the_users_graph_instantiated() {
    require_root!();
    let shim = shim_path();
    let log = std::env::temp_dir().join(format!("wp-graph-refused-{}.stderr", std::process::id()));
    let w = Worker::spawn_logged(
        &["graph", "10"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMCUDA_INSTANTIATE_REFUSES_MEMOPS", "1"),
            ("WEDGEPROBE_GRAPH_MARK_EVERY", "4"),
            ("SIMWORKER_GRAPH_REPLAYS", "40"),
        ],
        &log,
    );
    let mut w = w;
    let status = w.child.wait().expect("worker");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(
        status.success(),
        "instantiation failed for the user: {status}\n{text}"
    );
    assert!(
        text.contains("the driver refused a graph with graph marks; instantiated without them"),
        "{text}"
    );
}
