//! How durations read in verdicts and reports: `850 ms`, `4.2 s`.

pub fn fmt_duration(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        format!("{ms:.0} ms")
    }
}
