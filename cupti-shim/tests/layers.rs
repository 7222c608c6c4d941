//! The shim's shape, checked (the same reading of the sources as probe-user's layout test):
//! no import circles among its modules, nor among its stages — `journal` (the shared-memory
//! writer), `driver` (libcuda's entry points), `clock`, `self_cost` at the bottom; then
//! `marks` (GPU progress), `record` (per-thread recording, the journal's launch records),
//! `hooks` (entry points and their patching, the launch path), `backend` (CUPTI, the
//! simulated driver), `attach`, with `lifecycle` and `measure` wiring them from above.
//!
//! Not checked yet: "no mutable globals beyond the one hot table the hooks read" — the
//! process-wide state (the recorder, the marks, CUPTI's handles, the patches, the measurement
//! counters) still lives in statics of the stages that own it (`layout::mutable_globals`
//! lists them).

#[path = "../../probe-user/tests/layout/mod.rs"]
mod layout;

use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_import_circles_among_modules() {
    let graph = layout::imports(&src());
    assert!(graph.len() > 20, "modules found: {graph:?}");
    let found = layout::circles(&graph);
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn no_import_circles_among_stages() {
    let found = layout::circles(&layout::stage_graph(&src()));
    assert!(
        found.is_empty(),
        "circles between stages:\n{}",
        found.join("\n")
    );
}

/// The stages keep their order: nothing below reaches up (a circle could be avoided by a
/// stage reaching over another; this pins which way each may look).
#[test]
fn stages_look_only_down() {
    let order = [
        "clock",
        "journal",
        "driver",
        "self_cost",
        "marks",
        "record",
        "hooks",
        "backend",
        "lifecycle",
        "attach",
        "measure",
    ];
    let rank = |s: &str| order.iter().position(|o| *o == s);
    let mut up = Vec::new();
    for (stage, deps) in layout::stage_graph(&src()) {
        let Some(me) = rank(&stage) else { continue };
        for d in deps {
            match rank(&d) {
                Some(r) if r > me => up.push(format!("{stage} → {d}")),
                None => up.push(format!("{stage} → {d} (a stage not in the order)")),
                _ => {}
            }
        }
    }
    assert!(up.is_empty(), "stages reaching up:\n{}", up.join("\n"));
}

/// The mutable globals do not grow while they are folded into the hot table and the stages'
/// own values: at most the 55 counted when the stages were drawn (2026-12-05).
#[test]
fn mutable_globals_do_not_grow() {
    let found = layout::mutable_globals(&src(), &[]);
    assert!(
        found.len() <= 55,
        "{} mutable globals (at most 55):\n{}",
        found.len(),
        found.join("\n")
    );
}
