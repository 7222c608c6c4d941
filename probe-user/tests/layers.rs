//! probe-user's shape, checked: no import circles among its modules (files), nor among its
//! stages (top-level folders), and no mutable global state outside signal handling — the
//! layout rules of the stage redesign, kept true by `cargo test`. The graph is read by
//! `layout` (shared with the shim's test, cupti-shim/tests/layers.rs).

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

/// Settings are passed down, caches are owned by who uses them: a `static` that can change
/// (an atomic, a lock, a cell) lives only in signal handling.
#[test]
fn no_mutable_globals_outside_signal_handling() {
    let found = layout::mutable_globals(&src(), &["signals.rs"]);
    assert!(found.is_empty(), "mutable globals:\n{}", found.join("\n"));
}
