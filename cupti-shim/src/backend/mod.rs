//! Where the shim learns what the process does: CUPTI (callbacks and, in the exact mode, activity
//! records; or not loaded at all, the hooks recording everything — `cupti`), or the simulated
//! driver of the tests (`sim`). Each wires the hooks, the recorder and the marks together for its
//! source; nothing below knows which one runs.

pub mod cupti;
pub mod sim;
