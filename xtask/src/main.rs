//! Developer tasks, so that every workflow is one `cargo xtask …` command:
//! `demo` (the README's first command), `test` (the second), `bench`, `gpu-pack` (the GPU
//! harness's folder).

mod answer;
mod bench;
mod churn;
mod codegen;
mod demo;
mod gpu_pack;

use std::process::Command;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// A simulated serving worker wedges; wedgeprobe attaches and says why (root).
    Demo,
    /// Build everything and run the whole test suite (integration tests need root).
    Test,
    /// Launches per second with and without wedgeprobe attached, on the simulated driver.
    Bench(bench::Args),
    /// Pack the release binaries and the GPU sources for the GPU harness (docs/development.md).
    GpuPack {
        /// The folder to fill (emptied first); `.gpu-pack` is ignored by git.
        #[arg(default_value = ".gpu-pack")]
        dir: std::path::PathBuf,
        /// Also pack `bin/wedgeprobe-wrong-kernel-verdict`, a build whose kernel verdict never
        /// fires, for the harness's self-check (`run --wedgeprobe wrong-kernel-verdict …`).
        #[arg(long)]
        wrong_answer: bool,
    },
    /// Regenerate cupti-sys/src/bindings.rs from the pinned CUPTI headers (needs pip, libclang).
    Codegen,
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Demo => demo::run_demo(),
        Task::Test => test(),
        Task::Bench(args) => bench::run(&args),
        Task::Codegen => codegen::run_codegen(),
        Task::GpuPack { dir, wrong_answer } => gpu_pack::pack(&dir, wrong_answer),
    };
    if let Err(e) = result {
        eprintln!("xtask: {e:#}");
        std::process::exit(1);
    }
}

/// Runs a command, failing with its name if it fails.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("failed to start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Builds the wedgeprobe binary in `profile` and returns its path.
pub fn build_wedgeprobe(release: bool) -> anyhow::Result<std::path::PathBuf> {
    // WEDGEPROBE_BIN: measure another build (kept elsewhere) against this one, e.g. the
    // code before a refactor, in the same interleaved run.
    if let Some(bin) = std::env::var_os("WEDGEPROBE_BIN") {
        return Ok(bin.into());
    }
    let mut cmd = cargo();
    cmd.args(["build", "--quiet", "-p", "probe-user"]);
    if release {
        cmd.arg("--release");
    }
    run(&mut cmd)?;
    // The shim goes next to the binary: `wedgeprobe shim-path` finds it there.
    let mut shim = cargo();
    shim.args(["build", "--quiet", "-p", "cupti-shim"]);
    if release {
        shim.arg("--release");
    }
    run(&mut shim)?;
    let dir = if release { "release" } else { "debug" };
    Ok(workspace_root().join("target").join(dir).join("wedgeprobe"))
}

pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is in the workspace")
        .into()
}

fn test() -> anyhow::Result<()> {
    build_wedgeprobe(false)?;
    // Unit tests of every crate, then the integration tests one at a time: each runs real
    // workloads that spin on both cores, and several at once would starve each other.
    // (probe-ebpf builds only for the BPF target, inside probe-user's build script.)
    // No doc tests: the crates have none, and an empty doc-test run would otherwise be the
    // last "test result" line of the log.
    let units = [
        "probe-common",
        "probe-user",
        "cupti-sys",
        "cupti-shim",
        "xtask",
    ];
    run(cargo()
        .args(["test", "--lib", "--bins"])
        .args(units.iter().flat_map(|p| ["-p", p])))?;
    // probe-user's shape (no import circles, no mutable globals): a test of its sources.
    run(cargo().args(["test", "-p", "probe-user", "--test", "layers"]))?;
    // The shim's too: its stages look only down (cupti-shim/tests/layers.rs).
    run(cargo().args(["test", "-p", "cupti-shim", "--test", "layers"]))?;
    // The patcher on the H200 driver's entry bytes and on prologues gcc and clang emit, each
    // patched and called through its trampoline (cupti-shim/tests/prologue_corpus.rs).
    run(cargo().args(["test", "-p", "cupti-shim", "--test", "prologue_corpus"]))?;
    // What ships builds for AArch64 hosts too (the eBPF programs read that architecture's
    // registers; `attach` refuses there with one line): checked, not linked — no cross linker.
    run(cargo().args([
        "check",
        "--target",
        "aarch64-unknown-linux-gnu",
        "-p",
        "probe-user",
        "-p",
        "cupti-shim",
        "-p",
        "probe-common",
        "-p",
        "cupti-sys",
    ]))?;
    run(cargo().args([
        "test",
        "-p",
        "wp-tests",
        "--test",
        "integration",
        "--",
        "--test-threads=1",
    ]))
}
