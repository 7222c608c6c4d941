//! The daemon's configuration: a TOML file, every key optional, unknown keys refused. A bad
//! file is rejected with the exact key and reason — at start (exit 2) and on SIGHUP (the old
//! configuration stays).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::Deserialize;

use crate::settings::{Settings, default_duration, defaults, parse_duration};

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub listen: SocketAddr,
    pub dump_dir: PathBuf,
    pub dump_max_bytes: u64,
    pub scan_interval: Duration,
    pub tick: Duration,
    pub blocked_after: Duration,
    pub kernel_floor: Duration,
    pub kernel_multiple: f64,
    pub kernel_hard_bound: Duration,
    pub stall_after: Duration,
    pub no_journal_bound: Duration,
    pub flight_seconds: Duration,
    pub flight_max_events: usize,
    pub json_logs: bool,
    pub max_targets: usize,
    /// Extra kernel-name patterns that mark collectives.
    pub collectives: Vec<String>,
    /// Put the shim into CUDA processes found without it (`wedgeprobe attach`'s checks and
    /// steps, once per process).
    pub inject: bool,
}

impl Default for Config {
    /// `settings::defaults`, the one place defaults are defined.
    fn default() -> Self {
        let dur = default_duration;
        Self {
            listen: defaults::DAEMON_LISTEN
                .parse()
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 9464))),
            dump_dir: PathBuf::from(defaults::DAEMON_DUMP_DIR),
            dump_max_bytes: defaults::DAEMON_DUMP_MAX_MB << 20,
            scan_interval: dur(defaults::DAEMON_SCAN_INTERVAL),
            tick: dur(defaults::DAEMON_TICK),
            blocked_after: dur(defaults::BLOCKED_AFTER),
            kernel_floor: dur(defaults::KERNEL_FLOOR),
            kernel_multiple: defaults::KERNEL_MULTIPLE,
            kernel_hard_bound: dur(defaults::KERNEL_HARD_BOUND),
            stall_after: dur(defaults::STALL_AFTER),
            no_journal_bound: dur(defaults::NO_JOURNAL_BOUND),
            flight_seconds: dur(defaults::FLIGHT_SECONDS),
            flight_max_events: defaults::DAEMON_FLIGHT_MAX_EVENTS,
            json_logs: false,
            max_targets: defaults::DAEMON_MAX_TARGETS,
            collectives: Vec::new(),
            inject: false,
        }
    }
}

/// The file as written (all optional; durations as "2s", "250ms").
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<String>,
    dump_dir: Option<PathBuf>,
    dump_max_mb: Option<u64>,
    scan_interval: Option<String>,
    tick: Option<String>,
    blocked_after: Option<String>,
    kernel_floor: Option<String>,
    kernel_multiple: Option<f64>,
    kernel_hard_bound: Option<String>,
    stall_after: Option<String>,
    no_journal_bound: Option<String>,
    flight_seconds: Option<String>,
    flight_max_events: Option<usize>,
    log_format: Option<String>,
    max_targets: Option<usize>,
    collectives: Option<Vec<String>>,
    inject: Option<bool>,
}

/// What is wrong with a configuration, naming the key.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path}: {reason}")]
    Syntax { path: String, reason: String },
    #[error("{path}: key `{key}`: {reason}")]
    Key {
        path: String,
        key: &'static str,
        reason: String,
    },
}

pub fn load(path: Option<&std::path::Path>) -> Result<Config, ConfigError> {
    let Some(path) = path else {
        return Ok(Config::default());
    };
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    parse(&text, &shown)
}

pub fn parse(text: &str, path: &str) -> Result<Config, ConfigError> {
    let f: File = toml::from_str(text).map_err(|e| ConfigError::Syntax {
        path: path.to_string(),
        reason: e.to_string().trim().replace('\n', " "),
    })?;
    let key = |key: &'static str, reason: String| ConfigError::Key {
        path: path.to_string(),
        key,
        reason,
    };
    let dur = |k: &'static str, v: &Option<String>, d: Duration| -> Result<Duration, ConfigError> {
        match v {
            None => Ok(d),
            Some(s) => parse_duration(s).map_err(|r| key(k, r)),
        }
    };
    let d = Config::default();
    let c = Config {
        listen: match &f.listen {
            None => d.listen,
            Some(s) => s.parse().map_err(|_| {
                key(
                    "listen",
                    format!("`{s}` is not an address like 127.0.0.1:9464"),
                )
            })?,
        },
        dump_dir: f.dump_dir.clone().unwrap_or(d.dump_dir),
        dump_max_bytes: match f.dump_max_mb {
            None => d.dump_max_bytes,
            Some(0) => return Err(key("dump_max_mb", "must be at least 1".into())),
            Some(mb) => mb.saturating_mul(1 << 20),
        },
        scan_interval: dur("scan_interval", &f.scan_interval, d.scan_interval)?,
        tick: dur("tick", &f.tick, d.tick)?,
        blocked_after: dur("blocked_after", &f.blocked_after, d.blocked_after)?,
        kernel_floor: dur("kernel_floor", &f.kernel_floor, d.kernel_floor)?,
        kernel_multiple: match f.kernel_multiple {
            None => d.kernel_multiple,
            Some(m) if m.is_finite() && m >= 1.0 => m,
            Some(m) => return Err(key("kernel_multiple", format!("{m} is not a number ≥ 1"))),
        },
        kernel_hard_bound: dur(
            "kernel_hard_bound",
            &f.kernel_hard_bound,
            d.kernel_hard_bound,
        )?,
        stall_after: dur("stall_after", &f.stall_after, d.stall_after)?,
        no_journal_bound: dur("no_journal_bound", &f.no_journal_bound, d.no_journal_bound)?,
        flight_seconds: dur("flight_seconds", &f.flight_seconds, d.flight_seconds)?,
        flight_max_events: match f.flight_max_events {
            None => d.flight_max_events,
            Some(0) => return Err(key("flight_max_events", "must be at least 1".into())),
            Some(n) => n,
        },
        json_logs: match f.log_format.as_deref() {
            None | Some("text") => false,
            Some("json") => true,
            Some(o) => return Err(key("log_format", format!("`{o}` is not `text` or `json`"))),
        },
        max_targets: f.max_targets.unwrap_or(d.max_targets).max(1),
        collectives: f.collectives.clone().unwrap_or_default(),
        inject: f.inject.unwrap_or(d.inject),
    };
    if c.tick > Duration::from_secs(5) {
        return Err(key(
            "tick",
            "at most 5s (verdicts are evaluated every tick)".into(),
        ));
    }
    Ok(c)
}

impl Config {
    /// The settings the daemon judges by (no `--job` here: jobs come from environments).
    pub fn settings(&self) -> Settings {
        Settings::new(
            self.blocked_after,
            self.kernel_floor,
            self.kernel_multiple,
            self.kernel_hard_bound,
            self.stall_after,
        )
        .with_no_journal_bound(self.no_journal_bound)
        .with_collectives(&self.collectives)
    }

    pub fn flight(&self) -> crate::output::trace::flight::FlightConfig {
        crate::output::trace::flight::FlightConfig {
            dir: self.dump_dir.clone(),
            seconds: self.flight_seconds.as_secs_f64(),
            max_events: self.flight_max_events,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_is_the_defaults() {
        assert_eq!(parse("", "c.toml"), Ok(Config::default()));
    }

    #[test]
    fn the_shipped_example_is_the_defaults() {
        let text = include_str!("../../../../deploy/wedgeprobe.toml");
        assert_eq!(parse(text, "deploy/wedgeprobe.toml"), Ok(Config::default()));
    }

    #[test]
    fn values_are_read() {
        let c = parse(
            "listen = \"0.0.0.0:9000\"\nscan_interval = \"500ms\"\nlog_format = \"json\"\ndump_max_mb = 10\n",
            "c.toml",
        )
        .unwrap();
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.scan_interval, Duration::from_millis(500));
        assert!(c.json_logs);
        assert_eq!(c.dump_max_bytes, 10 << 20);
    }

    #[test]
    fn errors_name_the_key() {
        let e = parse("scan_interval = \"soon\"", "c.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("c.toml: key `scan_interval`: `soon` is not a duration"),
            "{e}"
        );
        let e = parse("listen = \"here\"", "c.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `listen`"), "{e}");
        let e = parse("colour = \"blue\"", "c.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `colour`"), "{e}");
        let e = parse("kernel_multiple = \"ten\"", "c.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("kernel_multiple"), "{e}");
        let e = parse("log_format = \"xml\"", "c.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `log_format`"), "{e}");
    }
}
