//! Opening targets and attaching to them: shared by `report` and `watch`.

use std::collections::HashMap;

use crate::{
    collect::collector::Collector, collect::probe::Probe, error::ProbeError,
    output::report::TargetFacts, process::target::Target, timings::Phases,
};

pub struct Session {
    pub collector: Collector,
    pub facts: HashMap<u32, TargetFacts>,
}

impl Session {
    /// Validates every PID before loading anything, so bad input fails fast with its own
    /// message and exit code.
    pub fn attach(
        pids: &[u32],
        launch_returns: bool,
        phases: &mut Phases,
    ) -> Result<Self, ProbeError> {
        let mut targets = Vec::new();
        for &pid in pids {
            if targets.iter().any(|t: &Target| t.pid == pid) {
                continue;
            }
            targets.push(Target::open(pid)?);
        }
        phases.done("open targets (/proc, libcuda's symbols)");
        let mut collector = Collector::new(Probe::load()?)?;
        phases.done("load the eBPF programs");
        let mut facts = HashMap::new();
        for target in targets {
            let pid = target.pid;
            let attached = collector.attach(target, launch_returns)?;
            for (alias, of) in &attached.lib.aliases {
                eprintln!("wedgeprobe: note: {alias} is the same code as {of}; traced as {of}");
            }
            facts.insert(
                pid,
                TargetFacts {
                    traced: attached.lib.waits.len(),
                    launch_probes: attached.launch_probes,
                    missing: attached.lib.missing,
                },
            );
            phases.done(&format!("attach to pid {pid}"));
        }
        Ok(Self { collector, facts })
    }
}
