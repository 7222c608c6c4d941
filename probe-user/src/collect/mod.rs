//! Everything that feeds the model, polled once a tick: the eBPF probes (`probe`), the shim
//! journals and /proc scans (`collector`; while a trace runs, the journals' rings are read on a
//! thread of their own, `ring_pump`), and attaching to targets (`session`).

pub mod collector;
pub mod probe;
pub mod ring_pump;
pub mod session;
