//! `cargo xtask bench answer`: time to first answer on the simulated driver. A worker with the shim wedges 1 s in and stays wedged (the 3 a.m. case: wedgeprobe
//! arrives after the wedge); per round, interleaved:
//! - `report`: wall time of `wedgeprobe report --pid P` (the window is 1 s) until its answer is
//!   out (stdout closed) and until it exits, as a shell sees it (`WEDGEPROBE_TIMINGS=1` shows
//!   its phases);
//! - `watch`: from starting `wedgeprobe watch --json --pid P` to its first `blocked` line.
//!
//! The daemon's first answer is its scan interval plus one tick (2 s + 250 ms by default)
//! and is not timed here.

use std::{
    io::{BufRead as _, BufReader, Read as _},
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::build_wedgeprobe;

pub fn run(rounds: u32) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark attaches eBPF probes: run it as root");
    }
    let wedgeprobe = build_wedgeprobe(true)?;
    let shim = wedgeprobe.with_file_name("libcupti_shim.so");
    let mut worker = Command::new(wp_tests::simworker())
        .args(["wedge", "600", "1000"])
        .env("SIMCUDA_RELEASE_AFTER_S", "590")
        .env("CUDA_INJECTION64_PATH", &shim)
        .stdout(Stdio::null())
        .spawn()
        .context("start the simulated worker")?;
    let pid = worker.id().to_string();
    // Past the kernel floor (5 s): the report names a wedge, not a busy kernel.
    sleep(Duration::from_secs(7));
    let result = (|| -> anyhow::Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
        let (mut report, mut report_answer, mut watch) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            // The answer is out when report closes its stdout (before it detaches); the
            // shell's prompt comes back when it exits.
            let t = Instant::now();
            let mut child = Command::new(&wedgeprobe)
                .args(["report", "--pid", &pid])
                .stdout(Stdio::piped())
                .stderr(stderr())
                .spawn()?;
            let mut text = String::new();
            child
                .stdout
                .take()
                .context("report's stdout")?
                .read_to_string(&mut text)?;
            report_answer.push(t.elapsed().as_secs_f64());
            child.wait()?;
            report.push(t.elapsed().as_secs_f64());
            if !text.contains("verdict: kernel_wedge") {
                bail!("report did not name the wedge");
            }
            // The last command's links take seconds to close; do not time the next one
            // against them.
            sleep(Duration::from_secs(5));
            let t = Instant::now();
            let mut child = Command::new(&wedgeprobe)
                .args(["watch", "--json", "--pid", &pid, "--duration", "10s"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()?;
            let stdout = child.stdout.take().context("watch's stdout")?;
            let first = BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .find(|l| l.contains("\"event\":\"blocked\""));
            watch.push(t.elapsed().as_secs_f64());
            let _ = child.kill();
            let _ = child.wait();
            if first.is_none() {
                bail!("watch printed no blocked thread");
            }
            sleep(Duration::from_secs(5));
        }
        Ok((report, report_answer, watch))
    })();
    let _ = worker.kill();
    let _ = worker.wait();
    let (mut report, mut report_answer, mut watch) = result?;
    report.sort_by(f64::total_cmp);
    report_answer.sort_by(f64::total_cmp);
    watch.sort_by(f64::total_cmp);
    let med = |v: &[f64]| v[v.len() / 2];
    println!("| command | rounds | median s | min s | max s |");
    println!("|---|---|---|---|---|");
    for (name, v) in [
        (
            "report (window 1 s): the answer out (stdout closed)",
            &report_answer,
        ),
        ("report (window 1 s): exited", &report),
        ("watch, first blocked line", &watch),
    ] {
        println!(
            "| {name} | {} | {:.2} | {:.2} | {:.2} |",
            v.len(),
            med(v),
            v[0],
            v[v.len() - 1]
        );
    }
    Ok(())
}

/// report's phase lines pass through when `WEDGEPROBE_TIMINGS` is set.
fn stderr() -> Stdio {
    if std::env::var_os("WEDGEPROBE_TIMINGS").is_some() {
        Stdio::inherit()
    } else {
        Stdio::null()
    }
}
