//! `cargo xtask demo`: the README's first command. A simulated serving worker (the simulated
//! driver from tests/, no GPU needed, with the wedgeprobe shim injected) wedges a kernel; its
//! launcher thread fills the launch queue and blocks in cuLaunchKernel, its syncer blocks in
//! cuStreamSynchronize. wedgeprobe attaches *after* the wedge, as it would at 3 a.m., reports
//! (naming the stuck kernel from the shim's journal), then watches until the worker releases
//! itself.

use std::{
    process::{Command, Stdio},
    thread::sleep,
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::{build_wedgeprobe, run};

pub fn run_demo() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the demo loads eBPF programs: run it as root");
    }
    let wedgeprobe = build_wedgeprobe(true)?;
    let worker_path = wp_tests::simworker();
    println!(
        "demo: starting a simulated serving worker; its attention kernel wedges after 1 s; wedgeprobe attaches at 7 s"
    );
    // The worker runs with the shim, as a serving process would with
    // CUDA_INJECTION64_PATH=$(wedgeprobe shim-path): the report then names the stuck kernel.
    let shim = wedgeprobe.with_file_name("libcupti_shim.so");
    let mut worker = Command::new(&worker_path)
        .args(["wedge", "20", "1000"])
        .env("SIMCUDA_RELEASE_AFTER_S", "14")
        .env("CUDA_INJECTION64_PATH", &shim)
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("failed to start {}", worker_path.display()))?;
    let pid = worker.id().to_string();
    let result = (|| {
        sleep(Duration::from_secs(7));
        println!("\ndemo: $ wedgeprobe report --pid {pid}\n");
        run(Command::new(&wedgeprobe).args(["report", "--pid", &pid]))?;
        println!(
            "\ndemo: $ wedgeprobe watch --pid {pid}   (the kernel is released at ~15 s, the worker exits at 20 s)\n"
        );
        run(Command::new(&wedgeprobe).args(["watch", "--pid", &pid, "--duration", "30s"]))
    })();
    let _ = worker.kill();
    let _ = worker.wait();
    result
}
