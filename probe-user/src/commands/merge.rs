//! `wedgeprobe merge FILES… [-o TRACE]`: the job-wide view across nodes. Each node runs
//! `wedgeprobe report --json` (and/or keeps flight-recorder traces); `merge` puts the reports
//! on one clock — each carries the CLOCK_REALTIME/CLOCK_MONOTONIC pair of the moment it was
//! built — and names the culprit rank of the whole job; with `-o` it also joins the nodes'
//! Chrome traces into one, shifted onto the first trace's clock (each trace's first event holds
//! its clock pair) with processes renamed by node so nothing collides.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    path::Path,
};

use anyhow::{Context as _, bail};
use serde::Serialize;
use serde_json::{Value, json};

use crate::cli::MergeArgs;

/// One rank, on the job-wide clock.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MergedRank {
    pub host: String,
    pub pid: u64,
    pub rank: u64,
    pub state: String,
    pub kernel: Option<String>,
    /// CLOCK_REALTIME ns when it stopped making progress (its oldest stuck kernel began).
    pub stopped_at_ns: Option<u64>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MergedJob {
    pub job: String,
    pub ranks: Vec<MergedRank>,
    pub culprit: Option<MergedCulprit>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MergedCulprit {
    pub host: String,
    pub pid: u64,
    pub rank: u64,
    pub kernel: String,
    pub ahead_of_others_ms: f64,
    pub summary: String,
}

fn read_any(path: &Path) -> anyhow::Result<Value> {
    let raw = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut s = String::new();
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_string(&mut s)
            .with_context(|| format!("{}: not gzip", path.display()))?;
        s
    } else {
        String::from_utf8(raw).with_context(|| format!("{}: not UTF-8", path.display()))?
    };
    let t = text.trim_end();
    // A trace may lack its closing bracket (the format allows it: cut short).
    let fixed = if t.starts_with('[') && !t.ends_with(']') {
        format!("{}]", t.trim_end_matches(','))
    } else {
        t.to_string()
    };
    serde_json::from_str(&fixed).with_context(|| format!("{}: not JSON", path.display()))
}

/// Ranks of every job in `reports`, aligned on CLOCK_REALTIME, and each job's culprit.
pub fn merge_reports(reports: &[Value]) -> Vec<MergedJob> {
    let mut jobs: BTreeMap<String, Vec<MergedRank>> = BTreeMap::new();
    for r in reports {
        let host = r["host"].as_str().unwrap_or("?").to_string();
        let real = r["clock"]["realtime_ns"].as_u64().unwrap_or(0);
        for j in r["jobs"].as_array().into_iter().flatten() {
            let name = j["job"].as_str().unwrap_or("?").to_string();
            for k in j["ranks"].as_array().into_iter().flatten() {
                let stopped = k["running_ms"]
                    .as_f64()
                    .filter(|ms| ms.is_finite() && *ms >= 0.0)
                    .map(|ms| real.saturating_sub((ms * 1e6) as u64));
                jobs.entry(name.clone()).or_default().push(MergedRank {
                    host: host.clone(),
                    pid: k["pid"].as_u64().unwrap_or(0),
                    rank: k["rank"].as_u64().unwrap_or(0),
                    state: k["state"].as_str().unwrap_or("?").to_string(),
                    kernel: k["kernel"].as_str().map(str::to_string),
                    stopped_at_ns: stopped,
                });
            }
        }
    }
    jobs.into_iter()
        .map(|(job, mut ranks)| {
            ranks.sort_by_key(|r| (r.rank, r.host.clone()));
            let culprit = culprit(&ranks);
            MergedJob {
                job,
                ranks,
                culprit,
            }
        })
        .collect()
}

fn culprit(ranks: &[MergedRank]) -> Option<MergedCulprit> {
    let waiting: Vec<&MergedRank> = ranks
        .iter()
        .filter(|r| r.state == "waiting_in_collective")
        .collect();
    if waiting.is_empty() {
        return None;
    }
    let c = ranks
        .iter()
        .filter(|r| r.state == "stuck" && r.stopped_at_ns.is_some())
        .min_by_key(|r| r.stopped_at_ns)?;
    let first_waiter = waiting.iter().filter_map(|w| w.stopped_at_ns).min()?;
    let ahead = first_waiter as f64 / 1e6 - c.stopped_at_ns? as f64 / 1e6;
    let kernel = c.kernel.clone().unwrap_or_default();
    Some(MergedCulprit {
        host: c.host.clone(),
        pid: c.pid,
        rank: c.rank,
        summary: format!(
            "rank {} (pid {} on {}) is the culprit: stuck in {kernel}, {:.1} s before the first peer stopped; {} ranks wait in collectives for it",
            c.rank,
            c.pid,
            c.host,
            ahead / 1e3,
            waiting.len()
        ),
        kernel,
        ahead_of_others_ms: ahead,
    })
}

/// The traces joined: timestamps moved onto the first trace's clock, pids (and flow ids)
/// made distinct per node, process names prefixed with the node.
pub fn merge_traces(traces: &[(String, Vec<Value>)]) -> anyhow::Result<Vec<Value>> {
    let offset = |events: &[Value]| -> Option<i128> {
        let start = events
            .iter()
            .find(|e| e["name"] == "wedgeprobe trace start")?;
        let real = start["args"]["realtime_ns"].as_u64()? as i128;
        let mono = start["args"]["monotonic_ns"].as_u64()? as i128;
        Some(real - mono)
    };
    let Some(base) = traces.first().and_then(|(_, e)| offset(e)) else {
        bail!("the first trace has no clock pair (not a wedgeprobe trace?)");
    };
    let mut out = Vec::new();
    for (node, (label, events)) in traces.iter().enumerate() {
        let off = offset(events).with_context(|| format!("{label}: no clock pair"))?;
        let shift_us = (off - base) as f64 / 1e3;
        let n = node as u64;
        for e in events {
            let mut e = e.clone();
            if let Some(ts) = e["ts"].as_f64() {
                e["ts"] = json!(ts + shift_us);
            }
            if let Some(pid) = e["pid"].as_u64() {
                // Host pids stay below 2^32; GPU processes are 2^40 + device.
                e["pid"] = json!(pid + (n << 32) * u64::from(pid != 0));
            }
            if let Some(id) = e["bind_id"].as_u64() {
                e["bind_id"] = json!(id ^ (n << 56));
            }
            if e["ph"] == "M"
                && e["name"] == "process_name"
                && let Some(name) = e["args"]["name"].as_str()
            {
                e["args"]["name"] = json!(format!("{label}: {name}"));
            }
            out.push(e);
        }
    }
    Ok(out)
}

pub fn run(args: &MergeArgs, out: &mut impl Write) -> Result<(), crate::commands::Error> {
    Ok(merge(args, out)?)
}

fn merge(args: &MergeArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let mut reports = Vec::new();
    let mut traces = Vec::new();
    for f in &args.files {
        let v = read_any(f)?;
        match &v {
            Value::Object(o) if o.contains_key("wedgeprobe_version") => reports.push(v),
            Value::Array(a) => {
                let label = f
                    .file_name()
                    .and_then(|s| s.to_str())
                    .map_or("trace".into(), |s| {
                        s.split(".trace").next().unwrap_or(s).to_string()
                    });
                traces.push((label, a.clone()));
            }
            _ => bail!(
                "{}: neither a wedgeprobe report nor a Chrome trace",
                f.display()
            ),
        }
    }
    let jobs = merge_reports(&reports);
    if let Some(path) = &args.output {
        if traces.is_empty() {
            bail!("-o given but no trace among the files");
        }
        let merged = merge_traces(&traces)?;
        let file = std::fs::File::create(path).map_err(|source| {
            crate::output::trace::chrome::TraceError::Create {
                path: path.clone(),
                source,
            }
        })?;
        let mut w: Box<dyn Write> = if path.extension().is_some_and(|e| e == "gz") {
            Box::new(flate2::write::GzEncoder::new(
                file,
                flate2::Compression::fast(),
            ))
        } else {
            Box::new(std::io::BufWriter::new(file))
        };
        w.write_all(b"[\n")?;
        for (i, e) in merged.iter().enumerate() {
            if i > 0 {
                w.write_all(b",\n")?;
            }
            serde_json::to_writer(&mut w, e)?;
        }
        w.write_all(b"\n]\n")?;
        w.flush()?;
        drop(w);
        if !args.json {
            writeln!(
                out,
                "joined {} traces ({} events) into {}",
                traces.len(),
                merged.len(),
                path.display()
            )?;
        }
    }
    if args.json {
        serde_json::to_writer_pretty(
            &mut *out,
            &json!({"reports": reports.len(), "traces": traces.len(), "jobs": jobs}),
        )?;
        writeln!(out)?;
        return Ok(());
    }
    for j in &jobs {
        writeln!(
            out,
            "job {} ({} ranks from {} reports):",
            j.job,
            j.ranks.len(),
            reports.len()
        )?;
        for r in &j.ranks {
            writeln!(
                out,
                "  rank {:>3} {}:{:<7} {:<22} {}",
                r.rank,
                r.host,
                r.pid,
                r.state,
                r.kernel.as_deref().unwrap_or("-")
            )?;
        }
        match &j.culprit {
            Some(c) => writeln!(out, "  CULPRIT: {}", c.summary)?,
            None => writeln!(
                out,
                "  no culprit: no rank waits in a collective for a stuck peer"
            )?,
        }
    }
    if jobs.is_empty() && !reports.is_empty() {
        writeln!(out, "no job with two or more ranks in these reports")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(host: &str, real: u64, ranks: Value) -> Value {
        json!({"wedgeprobe_version": "0", "host": host, "clock": {"monotonic_ns": 1, "realtime_ns": real},
               "jobs": [{"job": "master 10.0.0.1:29500", "ranks": ranks}]})
    }

    #[test]
    fn the_culprit_is_found_across_nodes_on_one_clock() {
        // Node a reported at t=100 s: rank 0 waits since 8 s before, rank 1 since 7 s.
        // Node b reported at t=103 s: rank 2 stuck for 13 s (since t=90 s), rank 3 waits.
        let a = report(
            "a",
            100_000_000_000,
            json!([
            {"pid": 1, "rank": 0, "state": "waiting_in_collective", "kernel": "ncclDevKernel_AllReduce", "running_ms": 8000.0},
            {"pid": 2, "rank": 1, "state": "waiting_in_collective", "kernel": "ncclDevKernel_AllReduce", "running_ms": 7000.0}]),
        );
        let b = report(
            "b",
            103_000_000_000,
            json!([
            {"pid": 7, "rank": 2, "state": "stuck", "kernel": "gemm", "running_ms": 13000.0},
            {"pid": 8, "rank": 3, "state": "waiting_in_collective", "kernel": "ncclDevKernel_AllReduce", "running_ms": 9000.0}]),
        );
        let jobs = merge_reports(&[a, b]);
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].ranks.len(), 4);
        let c = jobs[0].culprit.as_ref().unwrap();
        assert_eq!((c.host.as_str(), c.rank, c.pid), ("b", 2, 7));
        // First peer stopped at 92 s (rank 0: 100 − 8); the culprit at 90 s.
        assert_eq!(c.ahead_of_others_ms, 2_000.0);
    }

    #[test]
    fn traces_move_onto_the_first_clock_and_stay_distinct() {
        let t = |real: u64, mono: u64| {
            vec![
                json!({"ph": "i", "name": "wedgeprobe trace start", "pid": 0, "tid": 0, "ts": mono as f64 / 1e3,
                       "args": {"realtime_ns": real, "monotonic_ns": mono}}),
                json!({"ph": "M", "name": "process_name", "pid": 42, "tid": 0, "args": {"name": "w (pid 42)"}}),
                json!({"ph": "X", "name": "k", "pid": 42, "tid": 42, "ts": (mono as f64 + 1000.0) / 1e3, "dur": 1.0, "bind_id": 5}),
            ]
        };
        // Node b's monotonic clock is 1,000 s behind node a's for the same real time.
        let merged = merge_traces(&[
            ("a".into(), t(5_000_000_000_000, 2_000_000_000_000)),
            ("b".into(), t(5_000_000_000_000, 1_000_000_000_000)),
        ])
        .unwrap();
        let xs: Vec<&Value> = merged.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(xs[0]["ts"], xs[1]["ts"], "same real instant, same ts");
        assert_ne!(xs[0]["pid"], xs[1]["pid"]);
        assert_ne!(xs[0]["bind_id"], xs[1]["bind_id"]);
        assert!(merged.iter().any(|e| e["args"]["name"] == "b: w (pid 42)"));
    }
}
