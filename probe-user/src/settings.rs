//! The values every command runs with, built once — from the command line (`cli`) or the
//! daemon's configuration file (`commands::daemon::config`) — and passed down. Every default
//! is here and only here: the flags show these strings as their defaults, the daemon's file
//! falls back to them, and `Settings::default()` parses the same strings.

use std::time::Duration;

/// Defaults, as the flags and the daemon's keys spell them.
pub mod defaults {
    /// A thread inside a driver call this long counts as blocked.
    pub const BLOCKED_AFTER: &str = "1s";
    /// A kernel is suspect once it has run this long (and `KERNEL_MULTIPLE` × its p99)…
    pub const KERNEL_FLOOR: &str = "5s";
    pub const KERNEL_MULTIPLE: f64 = 10.0;
    /// …and stuck past this even with no host thread blocked on it.
    pub const KERNEL_HARD_BOUND: &str = "60s";
    /// GPU work still this long, no kernel in flight, a thread spinning: a host stall.
    pub const STALL_AFTER: &str = "10s";
    /// Without a shim journal nothing shows whether the GPU completes work: a launch,
    /// synchronize or copy blocked this long is an incident, not before. The longest wait of
    /// healthy serving measured on the H200 (`healthy-serving-soak`, 2026-12-04: a 3 s kernel
    /// then a synchronize; a 2.5 s kernel with 1500 launches queued behind it; graph replays
    /// draining 1–2 s) is 3.0 s, and at a 1 s bound the daemon called those waits incidents
    /// 8–9 times in 330 s; 10 s is 3× the longest and the same as `STALL_AFTER`.
    pub const NO_JOURNAL_BOUND: &str = "10s";
    /// `report` watches this long; a call already in progress at attach is known to be
    /// inside at least this long, so it equals `BLOCKED_AFTER`.
    pub const REPORT_WINDOW: &str = "1s";
    /// `trace` records this long.
    pub const TRACE_DURATION: &str = "10s";
    /// The flight recorder of `watch` and `run`.
    pub const FLIGHT_DIR: &str = "/var/tmp/wedgeprobe";
    pub const FLIGHT_SECONDS: &str = "30s";
    pub const FLIGHT_MAX_EVENTS: usize = 500_000;
    /// The daemon's (`deploy/wedgeprobe.toml` documents each).
    pub const DAEMON_LISTEN: &str = "127.0.0.1:9464";
    pub const DAEMON_DUMP_DIR: &str = "/var/lib/wedgeprobe/dumps";
    pub const DAEMON_DUMP_MAX_MB: u64 = 1024;
    pub const DAEMON_SCAN_INTERVAL: &str = "2s";
    pub const DAEMON_TICK: &str = "250ms";
    /// Fewer events than `watch` keeps: the daemon holds every process's at once.
    pub const DAEMON_FLIGHT_MAX_EVENTS: usize = 200_000;
    pub const DAEMON_MAX_TARGETS: usize = 64;
}

/// When a kernel at the head of its stream is suspect and when stuck (`verdict::kernel`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelBounds {
    pub floor_ms: f64,
    pub multiple: f64,
    pub hard_ms: f64,
}

/// What the verdict pipeline is told by the person running wedgeprobe.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub blocked_after: Duration,
    pub kernel: KernelBounds,
    pub stall_after: Duration,
    /// Without a journal, a blocked launch / synchronize / copy is an incident past this
    /// (`defaults::NO_JOURNAL_BOUND`); under it the verdict is `waiting`.
    pub no_journal_bound: Duration,
    /// Every target is a rank of one job (`--job`).
    pub one_job: bool,
    /// Kernel-name patterns that also mark collectives (`--collective`, `collectives`).
    pub collectives: Vec<String>,
}

/// A default duration (one of `defaults`; every one parses: `tests::the_defaults_parse`).
pub fn default_duration(s: &str) -> Duration {
    parse_duration(s).unwrap_or(Duration::from_secs(1))
}

impl Default for Settings {
    fn default() -> Self {
        let d = default_duration;
        Self::new(
            d(defaults::BLOCKED_AFTER),
            d(defaults::KERNEL_FLOOR),
            defaults::KERNEL_MULTIPLE,
            d(defaults::KERNEL_HARD_BOUND),
            d(defaults::STALL_AFTER),
        )
    }
}

impl Settings {
    pub fn new(
        blocked_after: Duration,
        kernel_floor: Duration,
        kernel_multiple: f64,
        kernel_hard_bound: Duration,
        stall_after: Duration,
    ) -> Self {
        Self {
            blocked_after,
            kernel: KernelBounds {
                floor_ms: kernel_floor.as_secs_f64() * 1e3,
                multiple: kernel_multiple.max(1.0),
                hard_ms: kernel_hard_bound.as_secs_f64() * 1e3,
            },
            stall_after,
            no_journal_bound: default_duration(defaults::NO_JOURNAL_BOUND),
            one_job: false,
            collectives: Vec::new(),
        }
    }

    pub fn blocked_after_ms(&self) -> f64 {
        self.blocked_after.as_secs_f64() * 1e3
    }

    pub fn blocked_after_ns(&self) -> u64 {
        self.blocked_after.as_nanos() as u64
    }

    pub fn no_journal_bound_ms(&self) -> f64 {
        self.no_journal_bound.as_secs_f64() * 1e3
    }

    pub fn with_no_journal_bound(mut self, bound: Duration) -> Self {
        self.no_journal_bound = bound;
        self
    }

    pub fn stall_after_ns(&self) -> u64 {
        (self.stall_after.as_nanos() as u64).max(1)
    }

    /// Extra collective patterns, empty ones dropped.
    pub fn with_collectives(mut self, patterns: &[String]) -> Self {
        self.collectives = patterns.iter().filter(|p| !p.is_empty()).cloned().collect();
        self
    }
}

/// `1s`, `250ms`, `2.5s`, `1m`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 1s or 250ms"))?;
    let secs = v * scale;
    if !secs.is_finite() || secs <= 0.0 || secs > 86_400.0 {
        return Err(format!("`{s}` is out of range (more than 0, at most 24h)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("NaNs").is_err());
    }

    /// Every default parses (a typo here would silently fall back).
    #[test]
    fn the_defaults_parse() {
        for s in [
            defaults::BLOCKED_AFTER,
            defaults::KERNEL_FLOOR,
            defaults::KERNEL_HARD_BOUND,
            defaults::STALL_AFTER,
            defaults::REPORT_WINDOW,
            defaults::TRACE_DURATION,
            defaults::FLIGHT_SECONDS,
            defaults::DAEMON_SCAN_INTERVAL,
            defaults::DAEMON_TICK,
        ] {
            assert!(parse_duration(s).is_ok(), "{s}");
        }
        assert!(
            defaults::DAEMON_LISTEN
                .parse::<std::net::SocketAddr>()
                .is_ok()
        );
        let s = Settings::default();
        assert_eq!(s.blocked_after, Duration::from_secs(1));
        assert_eq!(s.kernel.floor_ms, 5_000.0);
        assert_eq!(s.kernel.hard_ms, 60_000.0);
        assert_eq!(s.stall_after, Duration::from_secs(10));
    }
}
