//! wedgeprobe's user side as a library: the `wedgeprobe` binary (main.rs) wires it to the
//! command line, and the fuzz targets (fuzz/) drive the parts that read untrusted input —
//! the stack scanner, the journal reader and the /proc parsers — directly.
//!
//! The folders follow the data path (docs/architecture.md has the picture):
//!
//! - `process/` — a target process as /proc and its memory show it: its libcuda, code
//!   ranges, stacks (native and Python);
//! - `journal/` — the shim's journal: the reader, the cursor and stream heads, the control
//!   word (release, per-kernel leases);
//! - `model/` — what is known now: threads in calls, kernels in flight, history, events;
//! - `collect/` — eBPF probes and journals feeding the model, each tick;
//! - `verdict/` — from the model to one verdict (host calls, kernels, host stalls, jobs);
//! - `output/` — the report, Chrome traces and the flight recorder, Prometheus metrics;
//! - `engine` — the tick every long-running command shares;
//! - `inject/` — `attach`: putting the shim into a running process;
//! - `commands/` — one file per subcommand, thin; `cli` the flags, `settings` the values
//!   they set and every default; `timings` the phase lines of `WEDGEPROBE_TIMINGS=1`.

pub mod cli;
pub mod collect;
pub mod commands;
pub mod engine;
pub mod error;
pub mod inject;
pub mod journal;
pub mod model;
pub mod output;
pub mod process;
pub mod settings;
pub mod signals;
pub mod sys;
pub mod timings;
pub mod verdict;
