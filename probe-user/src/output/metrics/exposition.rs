//! The two text formats a Prometheus scrape may ask for. The metrics are encoded once, as
//! OpenMetrics (prometheus-client); a scraper that does not ask for OpenMetrics in its
//! `Accept` header — `curl`, `promtool check metrics`, older Prometheus servers — gets the
//! classic text format 0.0.4, converted here: counters are named with their `_total` suffix in
//! `# HELP`/`# TYPE` (OpenMetrics names the family without it), `# UNIT` and `# EOF` are
//! dropped (0.0.4 has neither), an `info` family becomes a gauge named `…_info`. Samples are
//! the same lines in both formats.

/// The content types of the two formats.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const TEXT_004: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether an HTTP request's `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(request: &str) -> bool {
    request.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("accept")
                && v.to_ascii_lowercase()
                    .contains("application/openmetrics-text")
        })
    })
}

/// OpenMetrics text → the classic text format 0.0.4 (see the module doc).
pub fn to_text_004(openmetrics: &str) -> String {
    let mut renamed: Vec<(&str, String)> = Vec::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some((name, kind)) = rest.split_once(' ')
        {
            match kind.trim() {
                "counter" => renamed.push((name, format!("{name}_total"))),
                "info" => renamed.push((name, format!("{name}_info"))),
                _ => {}
            }
        }
    }
    let rename = |name: &str| -> String {
        renamed
            .iter()
            .find(|(n, _)| *n == name)
            .map_or_else(|| name.to_string(), |(_, to)| to.clone())
    };
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some((name, kind)) = rest.split_once(' ')
        {
            let kind = if kind.trim() == "info" { "gauge" } else { kind };
            out.push_str(&format!("# TYPE {} {}\n", rename(name), kind));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push_str(&format!("# HELP {} {}\n", rename(name), help));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_with_total_and_openmetrics_only_lines_go() {
        let om = "# HELP wedgeprobe_dumps Incident dumps written.\n\
                  # TYPE wedgeprobe_dumps counter\n\
                  wedgeprobe_dumps_total 3\n\
                  # HELP wedgeprobe_blocked_threads Threads blocked.\n\
                  # TYPE wedgeprobe_blocked_threads gauge\n\
                  # UNIT wedgeprobe_blocked_threads threads\n\
                  wedgeprobe_blocked_threads{pid=\"7\"} 1\n\
                  # HELP build Build.\n\
                  # TYPE build info\n\
                  build_info{version=\"1\"} 1\n\
                  # EOF\n";
        let text = to_text_004(om);
        assert_eq!(
            text,
            "# HELP wedgeprobe_dumps_total Incident dumps written.\n\
             # TYPE wedgeprobe_dumps_total counter\n\
             wedgeprobe_dumps_total 3\n\
             # HELP wedgeprobe_blocked_threads Threads blocked.\n\
             # TYPE wedgeprobe_blocked_threads gauge\n\
             wedgeprobe_blocked_threads{pid=\"7\"} 1\n\
             # HELP build_info Build.\n\
             # TYPE build_info gauge\n\
             build_info{version=\"1\"} 1\n"
        );
    }

    #[test]
    fn the_accept_header_picks_the_format() {
        let prom = "GET /metrics HTTP/1.1\r\nHost: n\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\r\n";
        assert!(wants_openmetrics(prom));
        assert!(!wants_openmetrics(
            "GET /metrics HTTP/1.1\r\nHost: n\r\nAccept: */*\r\n\r\n"
        ));
        assert!(!wants_openmetrics("GET /metrics HTTP/1.1\r\n\r\n"));
    }
}
