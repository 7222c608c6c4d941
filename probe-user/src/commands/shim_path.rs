//! `wedgeprobe shim-path`: the path to put in CUDA_INJECTION64_PATH — the shim installed next
//! to the wedgeprobe binary.

use std::io::Write;

pub fn run(out: &mut impl Write) -> Result<(), crate::commands::Error> {
    writeln!(out, "{}", shim_path()?.display())?;
    Ok(())
}

/// The shim next to this binary (`run`, `attach` and this command use it).
pub fn shim_path() -> anyhow::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    let shim = exe.with_file_name("libcupti_shim.so");
    if !shim.exists() {
        anyhow::bail!(
            "no libcupti_shim.so next to {} (build it: cargo build -p cupti-shim)",
            exe.display()
        );
    }
    Ok(shim)
}
