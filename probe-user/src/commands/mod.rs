//! One file per subcommand; each wires settings, the collector, the verdict pipeline and an
//! output together and holds no logic of its own.

pub mod daemon;
pub mod merge;
pub mod report;
pub mod run;
pub mod shim_path;
pub mod trace;
pub mod watch;
