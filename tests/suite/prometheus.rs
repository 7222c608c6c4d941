//! A real Prometheus in the loop (Debian's `prometheus`, installed by scripts/setup.sh): a
//! server on loopback with deploy/prometheus.yml's scrape job and deploy/alerts.yaml's rules
//! (targets and intervals set for the test, the rules as shipped) scrapes `wedgeprobe daemon`
//! over a simulated wedge, and its own HTTP API shows the wedge alert go pending → firing with
//! the stuck kernel's name, then resolve after the release. A target it cannot reach and a
//! daemon restarted mid-scrape raise no alert.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{
    Worker,
    daemon::{Daemon, tmpdir},
    require_root, secs, shim_path,
};

/// A free loopback port (bound, then released for the process that takes it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `path` from `addr`, the body.
fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    // Prometheus answers small JSON unchunked; a chunked body would start with its size.
    Some(
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(body)
        } else {
            body.to_string()
        },
    )
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

struct Prometheus {
    child: Child,
    addr: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// deploy/prometheus.yml with `targets` and 1 s intervals; deploy/alerts.yaml as shipped.
    fn start(dir: &Path, targets: &[String]) -> Self {
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let shipped = std::fs::read_to_string(deploy.join("prometheus.yml")).unwrap();
        let targets_line = format!(
            "      - targets: [{}]",
            targets
                .iter()
                .map(|t| format!("\"{t}\""))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let config: String = shipped
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("- targets:") {
                    targets_line.clone()
                } else if l.trim_start().starts_with("scrape_interval:") {
                    "  scrape_interval: 1s".to_string()
                } else if l.trim_start().starts_with("evaluation_interval:") {
                    "  evaluation_interval: 1s".to_string()
                } else if l.trim() == "- alerts.yaml" {
                    format!("  - {}", deploy.join("alerts.yaml").display())
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        assert!(config.contains(&targets_line), "{config}");
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus starts");
        let p = Prometheus { child, addr };
        let start = Instant::now();
        while http_get(&p.addr, "/-/ready").is_none() {
            assert!(
                start.elapsed() < secs(30.0),
                "prometheus never became ready"
            );
            sleep(Duration::from_millis(200));
        }
        p
    }

    /// The alerts Prometheus holds now (pending or firing).
    fn alerts(&self) -> Vec<Value> {
        http_get(&self.addr, "/api/v1/alerts")
            .and_then(|b| serde_json::from_str::<Value>(&b).ok())
            .and_then(|v| v["data"]["alerts"].as_array().cloned())
            .unwrap_or_default()
    }

    fn query(&self, q: &str) -> Vec<Value> {
        let q: String = q
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        http_get(&self.addr, &format!("/api/v1/query?query={q}"))
            .and_then(|b| serde_json::from_str::<Value>(&b).ok())
            .and_then(|v| v["data"]["result"].as_array().cloned())
            .unwrap_or_default()
    }

    /// Waits until `f` holds of the alerts (`timeout`), returning them.
    fn wait_alerts(
        &self,
        timeout: Duration,
        what: &str,
        f: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let a = self.alerts();
            if f(&a) {
                return a;
            }
            assert!(
                start.elapsed() < timeout,
                "timed out waiting for {what}; alerts: {a:?}"
            );
            sleep(Duration::from_millis(500));
        }
    }
}

fn named<'a>(alerts: &'a [Value], name: &str) -> Vec<&'a Value> {
    alerts
        .iter()
        .filter(|a| a["labels"]["alertname"] == name)
        .collect()
}

fn have_prometheus() -> bool {
    let ok = Command::new("prometheus").arg("--version").output().is_ok();
    if !ok {
        eprintln!("skipping: prometheus missing (scripts/setup.sh installs Debian's prometheus)");
    }
    ok
}

#[test]
fn prometheus_sees_the_wedge_alert_pending_then_firing_then_resolved() {
    require_root!();
    if !have_prometheus() {
        return;
    }
    let dir: PathBuf = tmpdir("prometheus");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let d = Daemon::start_at("prom-daemon", &listen, "kernel_floor = \"1s\"\n");
    // A second target nothing listens on: `up` 0 for it, and no alert from it.
    let dead = format!("127.0.0.1:{}", free_port());
    let prom = Prometheus::start(&dir, &[d.addr.clone(), dead.clone()]);
    let shim = shim_path();
    // Wedges 3 s in and stays wedged 75 s: past the rule's `for: 1m`.
    let w = Worker::spawn(
        &["wedge", "85", "3000"],
        &[
            ("CUDA_INJECTION64_PATH", &shim),
            ("SIMCUDA_RELEASE_AFTER_S", "75"),
        ],
    );
    let pending = prom.wait_alerts(secs(30.0), "GPUKernelWedged pending", |a| {
        named(a, "GPUKernelWedged")
            .iter()
            .any(|x| x["state"] == "pending")
    });
    let alert = named(&pending, "GPUKernelWedged")[0].clone();
    assert_eq!(alert["labels"]["pid"], w.pid().to_string(), "{alert}");
    assert_eq!(alert["labels"]["node"], "127.0.0.1", "{alert}");
    assert_eq!(
        alert["labels"]["kernel"], "attn_wedge_kernel(barrier*, float*)",
        "{alert}"
    );
    assert!(
        alert["annotations"]["summary"]
            .as_str()
            .unwrap()
            .contains("attn_wedge_kernel(barrier*, float*)"),
        "{alert}"
    );
    let firing = prom.wait_alerts(secs(90.0), "GPUKernelWedged firing", |a| {
        named(a, "GPUKernelWedged")
            .iter()
            .any(|x| x["state"] == "firing")
    });
    assert!(
        firing
            .iter()
            .all(|a| a["labels"]["instance"] != dead.as_str()),
        "nothing from the unreachable target: {firing:?}"
    );
    let up: Vec<(String, String)> = prom
        .query("up")
        .iter()
        .map(|r| {
            (
                r["metric"]["instance"].as_str().unwrap_or("").to_string(),
                r["value"][1].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(up.contains(&(dead.clone(), "0".into())), "{up:?}");
    assert!(up.contains(&(d.addr.clone(), "1".into())), "{up:?}");
    // Released at 75 s: the verdict goes back to healthy and the alert resolves.
    prom.wait_alerts(secs(60.0), "GPUKernelWedged resolved", |a| {
        named(a, "GPUKernelWedged").is_empty()
    });
    drop(w);
    // A daemon restarted mid-scrape (its series gone, then back, healthy): no alert.
    drop(d);
    sleep(secs(3.0));
    let _d = Daemon::start_at("prom-daemon-2", &listen, "kernel_floor = \"1s\"\n");
    let healthy = Worker::spawn(&["healthy", "15"], &[("CUDA_INJECTION64_PATH", &shim)]);
    sleep(secs(12.0));
    let after = prom.alerts();
    assert!(
        named(&after, "GPUKernelWedged").is_empty()
            && named(&after, "GPUCollectiveWaiting").is_empty()
            && named(&after, "GPUHostStall").is_empty(),
        "no false alert across the restart: {after:?}"
    );
    drop(healthy);
}
