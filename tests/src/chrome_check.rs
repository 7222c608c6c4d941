//! Structural checks of a Chrome trace written by wedgeprobe — what a viewer relies on:
//! slices close (except the ones marked never completed), timestamps are monotone per track,
//! every track and process is named, and every flow arrow that ends has a start.

use std::{collections::HashMap, io::Read as _, path::Path};

use serde_json::Value;

/// What a well-formed trace holds.
#[derive(Debug, Default)]
pub struct Checked {
    pub events: Vec<Value>,
    /// `B` events never ended, all marked `never_completed`.
    pub open: Vec<Value>,
    pub flows_paired: usize,
    /// Launches whose kernel had not run (queued) when the trace ended.
    pub flows_unpaired: usize,
    /// The file had no closing `]` (cut short; the format allows it).
    pub truncated: bool,
}

/// Reads a trace (gzip when the name ends in `.gz`; concatenated members allowed).
pub fn load(path: &Path) -> Result<(Vec<Value>, bool), String> {
    let raw = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = if path.extension().is_some_and(|e| e == "gz") {
        let mut s = String::new();
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_string(&mut s)
            .map_err(|e| format!("gunzip: {e}"))?;
        s
    } else {
        String::from_utf8(raw).map_err(|e| e.to_string())?
    };
    let trimmed = text.trim_end();
    let (json, truncated) = if trimmed.ends_with(']') {
        (trimmed.to_string(), false)
    } else {
        // The JSON array form's closing bracket is optional: a cut-short file loads.
        (format!("{}]", trimmed.trim_end_matches(',')), true)
    };
    let v: Value = serde_json::from_str(&json).map_err(|e| format!("not JSON: {e}"))?;
    match v {
        Value::Array(a) => Ok((a, truncated)),
        _ => Err("not a JSON array of events".into()),
    }
}

pub fn check_file(path: &Path) -> Result<Checked, String> {
    let (events, truncated) = load(path)?;
    let mut c = check(events)?;
    c.truncated = truncated;
    Ok(c)
}

pub fn check(events: Vec<Value>) -> Result<Checked, String> {
    let mut last_ts: HashMap<(u64, u64), f64> = HashMap::new();
    let mut stacks: HashMap<(u64, u64), Vec<Value>> = HashMap::new();
    let mut thread_names: HashMap<(u64, u64), String> = HashMap::new();
    let mut process_names: HashMap<u64, String> = HashMap::new();
    let mut used_tracks = Vec::new();
    let mut flow_out: HashMap<u64, usize> = HashMap::new();
    let mut flows_paired = 0;
    for (i, e) in events.iter().enumerate() {
        let ph = e["ph"]
            .as_str()
            .ok_or(format!("event {i} has no ph: {e}"))?;
        let pid = e["pid"]
            .as_u64()
            .ok_or(format!("event {i} has no pid: {e}"))?;
        let tid = e["tid"].as_u64().unwrap_or(0);
        if ph == "M" {
            let name = e["args"]["name"].as_str().map(str::to_string);
            match (e["name"].as_str(), name) {
                (Some("thread_name"), Some(n)) => {
                    thread_names.insert((pid, tid), n);
                }
                (Some("process_name"), Some(n)) => {
                    process_names.insert(pid, n);
                }
                _ => {}
            }
            continue;
        }
        let ts = e["ts"]
            .as_f64()
            .ok_or(format!("event {i} has no ts: {e}"))?;
        if matches!(ph, "X" | "B" | "E") {
            let track = (pid, tid);
            if let Some(&prev) = last_ts.get(&track)
                && ts < prev
            {
                return Err(format!(
                    "event {i}: ts {ts} before {prev} on track {track:?}: {e}"
                ));
            }
            last_ts.insert(track, ts);
            used_tracks.push(track);
        }
        match ph {
            "X" => {
                let dur = e["dur"].as_f64().ok_or(format!("X without dur: {e}"))?;
                if dur < 0.0 {
                    return Err(format!("negative dur: {e}"));
                }
            }
            "B" => stacks.entry((pid, tid)).or_default().push(e.clone()),
            "E" if stacks.entry((pid, tid)).or_default().pop().is_none() => {
                return Err(format!("E without B: {e}"));
            }
            _ => {}
        }
        if let Some(id) = e["bind_id"].as_u64() {
            if e["flow_out"] == true {
                *flow_out.entry(id).or_default() += 1;
            }
            if e["flow_in"] == true {
                match flow_out.get_mut(&id) {
                    Some(n) if *n > 0 => {
                        *n -= 1;
                        flows_paired += 1;
                    }
                    _ => return Err(format!("flow into {id} with no flow out before it: {e}")),
                }
            }
        }
        if e["cat"] == "kernel"
            && (e["args"]["kernel"].as_str().is_none()
                || e["args"]["correlation"].as_u64().is_none())
        {
            return Err(format!(
                "kernel slice without kernel name or correlation: {e}"
            ));
        }
    }
    for track in &used_tracks {
        if !thread_names.contains_key(track) {
            return Err(format!("track {track:?} has no thread_name"));
        }
        if !process_names.contains_key(&track.0) {
            return Err(format!("process {} has no process_name", track.0));
        }
    }
    let open: Vec<Value> = stacks.into_values().flatten().collect();
    if let Some(bad) = open.iter().find(|e| e["args"]["never_completed"] != true) {
        return Err(format!("slice left open without never_completed: {bad}"));
    }
    Ok(Checked {
        events,
        open,
        flows_paired,
        flows_unpaired: flow_out.values().sum(),
        truncated: false,
    })
}
