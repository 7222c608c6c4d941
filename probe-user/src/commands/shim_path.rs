//! `wedgeprobe shim-path`: the path to put in CUDA_INJECTION64_PATH — the shim installed next
//! to the wedgeprobe binary.

use std::io::Write;

pub fn run(out: &mut impl Write) -> Result<(), crate::commands::Error> {
    let exe = std::env::current_exe()?;
    let shim = exe.with_file_name("libcupti_shim.so");
    if !shim.exists() {
        return Err(crate::commands::Error::Internal(anyhow::anyhow!(
            "no libcupti_shim.so next to {} (build it: cargo build -p cupti-shim)",
            exe.display()
        )));
    }
    writeln!(out, "{}", shim.display())?;
    Ok(())
}
