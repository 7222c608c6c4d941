//! `cargo xtask gpu-pack DIR`: everything the GPU harness (gpu/harness.py) needs on the GPU
//! machine, which has no Rust toolchain and no network, in one folder that fits a device
//! call's carry (64 MiB): the release binaries without debug info, the CUDA and Python
//! sources, the commit they were built from, and `DIR/run`, the harness's entry point.

use std::{fs, path::Path, process::Command};

use anyhow::{Context as _, bail};

use crate::{cargo, run, workspace_root};

/// A carry holds at most 64 MiB; the pack must leave room for the working tree beside it.
const MAX_PACK_BYTES: u64 = 48 << 20;

pub fn pack(dir: &Path, wrong_answer: bool) -> anyhow::Result<()> {
    let root = workspace_root();
    // Debug info off: the release profile keeps it for profiling here (the binaries are
    // ~10x larger with it).
    let release = |extra: &[&str]| {
        run(cargo()
            .args(["build", "--release", "-p", "probe-user"])
            .args(extra)
            .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
            .env("CARGO_PROFILE_RELEASE_STRIP", "symbols"))
    };
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("failed to empty {}", dir.display()))?;
    }
    let (bin, gpu) = (dir.join("bin"), dir.join("gpu"));
    fs::create_dir_all(&bin)?;
    fs::create_dir_all(&gpu)?;
    if wrong_answer {
        // First, and in the same target folder: only probe-user is rebuilt, twice.
        release(&["--features", "wrong-kernel-verdict"])?;
        fs::copy(
            root.join("target/release/wedgeprobe"),
            bin.join("wedgeprobe-wrong-kernel-verdict"),
        )
        .context("failed to copy the wrong-answer build")?;
    }
    release(&["-p", "cupti-shim"])?;
    for f in ["wedgeprobe", "libcupti_shim.so"] {
        fs::copy(root.join("target/release").join(f), bin.join(f))
            .with_context(|| format!("failed to copy {f}"))?;
    }
    for e in fs::read_dir(root.join("gpu"))? {
        let p = e?.path();
        let keep = p
            .extension()
            .is_some_and(|x| x == "cu" || x == "cuh" || x == "py");
        if let (true, Some(name)) = (keep, p.file_name()) {
            fs::copy(&p, gpu.join(name))?;
        }
    }
    // The shim's tables of the entry points it patches (`gpu/entry_corpus.py` reads the
    // names from them).
    fs::create_dir_all(gpu.join("shim-src"))?;
    for f in ["launch.rs", "calls.rs"] {
        fs::copy(
            root.join("cupti-shim/src/hooks").join(f),
            gpu.join("shim-src").join(f),
        )?;
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(&root)
        .output()
        .context("failed to run git")?;
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .current_dir(&root)
        .output()?;
    let mut id = String::from_utf8_lossy(&commit.stdout).trim().to_string();
    if !dirty.stdout.is_empty() {
        id.push_str("+uncommitted");
    }
    fs::write(dir.join("COMMIT"), format!("{id}\n"))?;
    let entry = dir.join("run");
    fs::write(
        &entry,
        "#!/usr/bin/env bash\n# The GPU harness (gpu/harness.py): DIR/run [SCENARIO...] [--quick] [--list]\n\
         exec python3 \"$(dirname \"$0\")/gpu/harness.py\" \"$@\"\n",
    )?;
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(&entry, fs::Permissions::from_mode(0o755))?;
    let size = du(dir)?;
    if size > MAX_PACK_BYTES {
        bail!(
            "{} is {} MiB, over the {} MiB a device call can carry beside the tree",
            dir.display(),
            size >> 20,
            MAX_PACK_BYTES >> 20
        );
    }
    println!(
        "packed {} ({:.1} MiB, commit {id}); on the GPU machine: {}/run [SCENARIO...] [--quick]",
        dir.display(),
        size as f64 / (1 << 20) as f64,
        dir.display()
    );
    Ok(())
}

fn du(dir: &Path) -> anyhow::Result<u64> {
    let mut n = 0;
    for e in fs::read_dir(dir)? {
        let e = e?;
        let m = e.metadata()?;
        n += if m.is_dir() { du(&e.path())? } else { m.len() };
    }
    Ok(n)
}
