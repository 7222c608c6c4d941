//! What wedgeprobe hands to people and tools: the report (text and JSON), Chrome traces and
//! the flight recorder, Prometheus metrics.

pub mod metrics;
pub mod report;
pub mod trace;
