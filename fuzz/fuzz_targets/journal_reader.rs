//! A shim journal is written by the serving process and read by wedgeprobe as root: any
//! image must be rejected with an error or read in full without a panic.
//!
//! Input byte 0 picks the mode: odd → the rest is a raw image; even → a valid journal with
//! threads, launches, completions and names (bit 1 clear; per-kernel records) or stream marks
//! (bit 1 set) is built by the real writer, and the rest of the input is XORed over it (so
//! mutations reach the slot-reading code behind a valid header).
#![no_main]

use std::{ptr::NonNull, sync::atomic::AtomicU64};

use cupti_shim::journal::{Completion, ExecMarks, Launch, Placement, Writer};
use libfuzzer_sys::fuzz_target;
use probe_common::journal::{Layout, RECORD_MARKS};
use probe_user::journal::OwnedJournal;

const SMALL: Layout = Layout {
    threads_cap: 4,
    inflight_cap: 8,
    ring_cap: 16,
    names_cap: 4,
    graphs_cap: 8,
    marks_cap: 4,
};

/// The GPU-written progress words of the marks image (static: a fuzzer runs millions of
/// images, a leak per image would grow without bound).
static WORDS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

fn valid_image() -> OwnedJournal {
    let mut mem = OwnedJournal::zeroed(SMALL.total_size() as usize);
    let Some(ptr) = NonNull::new(mem.as_mut_ptr()) else { return mem };
    // SAFETY: aligned, zeroed, sized for SMALL; `mem` outlives the writer.
    let w = unsafe { Writer::create(ptr, SMALL, 7, 1, 2) };
    let name = w.intern(b"_Z6kernelPf");
    if let Some(slot) = w.thread_slot(11) {
        w.enter(slot, 0, 3, 100);
    }
    for corr in 1..=6 {
        w.launch(&Launch { correlation: corr, name_id: name, launch_ns: corr, ..Launch::default() }, None);
    }
    w.complete(&Completion { correlation: 1, start_ns: 5, end_ns: 6, ..Completion::default() });
    // A graph with two kernel nodes, instantiated (clones), launched, one node done.
    w.graph_kernel_node(21, 0, 3, name);
    w.graph_kernel_node(22, 0, 3, name);
    w.graph_kernel_node(31, 21, 4, 0);
    w.graph_exec(9, 3);
    w.launch(&Launch { correlation: 7, graph_id: 9, nodes_pending: 2, ..Launch::default() }, None);
    w.complete(&Completion { correlation: 7, graph_node: 31, ..Completion::default() });
    w.synced(8, 0, 9);
    mem
}

/// The default recording: stream marks, one passed, launches with and without a mark after.
fn marks_image() -> OwnedJournal {
    let mut mem = OwnedJournal::zeroed(SMALL.total_size() as usize);
    let Some(ptr) = NonNull::new(mem.as_mut_ptr()) else { return mem };
    // SAFETY: aligned, zeroed, sized for SMALL; `mem` outlives the writer.
    let w = unsafe { Writer::create(ptr, SMALL, 7, 1, 2) };
    // SAFETY: four static atomics, accessed only atomically.
    unsafe { w.set_mark_words(WORDS[0].as_ptr()) };
    w.set_record_mode(RECORD_MARKS, 8, 100);
    let name = w.intern(b"_Z6kernelPf");
    let Some(slot) = w.mark_slot(5, 0, 0x77) else { return mem };
    for corr in 1..=6 {
        w.launch(&Launch {
            correlation: corr,
            name_id: name,
            launch_ns: corr,
            stream: 0x77,
            stream_id: 4,
            mark: slot + 1,
            ..Launch::default()
        }, None);
        if corr % 3 == 0 {
            w.set_marked(corr);
        }
    }
    // A graph with graph marks (two branches, three kernel nodes), a replay of it begun: its
    // first word set, its second not.
    let place = |position, branch, mark| Placement { position, branch, mark, grid: [2, 1, 1], block: [32, 1, 1] };
    w.graph_kernel_node_placed(41, 0, 5, name, place(1, 0, 1));
    w.graph_kernel_node_placed(42, 0, 5, name, place(2, 0, 2));
    w.graph_kernel_node_placed(43, 0, 5, name, place(3, 1, 3));
    // Its nodes' ids are consecutive from 41: the reader looks them up by key (`graphs_of`).
    w.graph_exec_marked(10, 5, Some(ExecMarks { first: 2, words: 3, branches: 2 }), (41, 3));
    w.set_graph_mark_words(2, 3, 0);
    w.set_graph_mark_words(2, 1, 1);
    w.launch(&Launch {
        correlation: 7,
        graph_id: 10,
        launch_ns: 7,
        stream: 0x77,
        stream_id: 4,
        mark: slot + 1,
        ..Launch::default()
    }, None);
    WORDS[slot as usize % 4].store(3, std::sync::atomic::Ordering::Relaxed);
    w.publish_marks(10);
    mem
}

fn read_all(image: &OwnedJournal) {
    if let Ok(view) = image.view() {
        let _ = view.threads_in_calls();
        let _ = view.threads_busy(u64::MAX);
        let _ = view.threads_busy(0);
        let _ = view.drops();
        for slot in view.inflight() {
            let _ = view.name(slot.name_id);
        }
        let ring = view.ring_since(0, 0);
        for r in ring.records.iter().take(64) {
            let _ = view.name(r.name_id);
        }
        let _ = view.ring_since(u64::MAX, u64::MAX);
        let _ = view.graphs();
        let _ = view.graphs_of(&[9, 10, 0, u32::MAX]);
        let _ = (view.marks(), view.record_mode());
        let mut cursor = probe_user::journal::heads::JournalCursor::default();
        cursor.advance(&view);
        let _ = cursor.heads(7, &view, 1_000);
        // The daemon's path: bounded reads, heads kept between in-flight scans.
        let mut daemon = probe_user::journal::heads::JournalCursor::default();
        let _ = daemon.advance_at_most(&view, 4);
        let _ = daemon.heads_every(7, &view, 1_000, 1_000);
        let _ = daemon.advance_at_most(&view, 4);
        let _ = daemon.heads_every(7, &view, 1_500, 1_000);
        let _ = daemon.heads_every(7, &view, 2_500, 1_000);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode & 1 == 1 {
        read_all(&OwnedJournal::from_bytes(rest));
        return;
    }
    let image = if mode & 2 == 0 { valid_image() } else { marks_image() };
    // SAFETY: `image` owns `len()` initialised bytes and is not written while borrowed.
    let mut bytes = unsafe { std::slice::from_raw_parts(image.as_ptr(), image.len()) }.to_vec();
    for (i, b) in rest.iter().enumerate() {
        let at = (i * 131) % bytes.len();
        bytes[at] ^= b;
    }
    read_all(&OwnedJournal::from_bytes(&bytes));
});
