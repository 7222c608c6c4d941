//! wedgeprobe's user side as a library: the `wedgeprobe` binary (main.rs) wires it to the
//! command line, and the fuzz targets (fuzz/) drive the parts that read untrusted input —
//! the stack scanner and the /proc parsers — directly.

pub mod cli;
pub mod code;
pub mod collector;
pub mod daemon;
pub mod error;
pub mod host_stall;
pub mod job;
pub mod journal;
pub mod kernel_verdict;
pub mod kernels;
pub mod libcuda;
pub mod merge;
pub mod model;
pub mod probe;
pub mod pystack;
pub mod release;
pub mod report;
pub mod run;
pub mod session;
pub mod signals;
pub mod stackscan;
pub mod sys;
pub mod target;
pub mod trace;
pub mod verdict;
pub mod watch;
