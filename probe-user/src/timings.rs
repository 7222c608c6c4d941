//! `WEDGEPROBE_TIMINGS=1`: one stderr line per phase of a command, to find where its wall
//! time goes on a machine we cannot profile at leisure (a `report` took
//! 9.6 s against a PyTorch process on the H200 and 5 s on the simulated driver, ~3.6 s of it
//! closing uprobe links). Off, it costs one environment lookup per command.

use std::time::Instant;

pub struct Phases {
    on: bool,
    start: Instant,
    last: Instant,
}

impl Phases {
    pub fn from_env() -> Self {
        let now = Instant::now();
        Self {
            on: std::env::var_os("WEDGEPROBE_TIMINGS").is_some_and(|v| v != "0"),
            start: now,
            last: now,
        }
    }

    /// Ends the phase `what`: prints its length and the time since the command began.
    pub fn done(&mut self, what: &str) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        eprintln!(
            "wedgeprobe: timing {what}: {:.1} ms (at {:.1} ms)",
            (now - self.last).as_secs_f64() * 1e3,
            (now - self.start).as_secs_f64() * 1e3
        );
        self.last = now;
    }
}
