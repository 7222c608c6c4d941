//! Everything that feeds the model, polled once a tick: the eBPF probes (`probe`), the shim
//! journals and /proc scans (`collector`), and attaching to targets (`session`).

pub mod collector;
pub mod probe;
pub mod session;
