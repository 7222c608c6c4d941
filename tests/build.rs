//! Builds the simulated driver (`libcuda.so.1`), a libcuda without the traced symbols, and
//! the workloads, with the system C compiler, into OUT_DIR/simcuda.
use std::{env, path::PathBuf, process::Command};

fn cc(args: &[&str]) {
    let status = Command::new(env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(args)
        .status()
        .expect("failed to run the C compiler (install gcc: scripts/setup.sh does)");
    assert!(status.success(), "cc {args:?} failed");
}

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR")).join("simcuda");
    let nosyms = out.join("nosyms");
    std::fs::create_dir_all(&nosyms).expect("create OUT_DIR/simcuda");
    let src = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("manifest dir")).join("simcuda");
    let s = |f: &str| src.join(f).display().to_string();
    let o = |f: &str| out.join(f).display().to_string();
    // -O2 as a real driver is built; frame pointers omitted like libcuda's, so the stack scan
    // is tested on the same kind of stack.
    cc(&[
        "-O2",
        "-fomit-frame-pointer",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        "-Wl,-soname,libcuda.so.1",
        "-o",
        &o("libcuda.so.1"),
        &s("libcuda_sim.c"),
        "-lpthread",
    ]);
    // The same driver with launch entry points that begin as other driver builds' do
    // (libcuda_sim.c, SIM_PROLOGUE): a worker run with LD_LIBRARY_PATH at one of these loads it.
    for (n, shape) in ["cet", "sub-rsp", "rip-load"].iter().enumerate() {
        let dir = out.join(format!("prologue-{shape}"));
        std::fs::create_dir_all(&dir).expect("create a prologue dir");
        cc(&[
            "-O2",
            "-fomit-frame-pointer",
            "-fPIC",
            "-shared",
            "-fvisibility=hidden",
            &format!("-DSIM_PROLOGUE={}", n + 1),
            "-Wl,-soname,libcuda.so.1",
            "-o",
            &dir.join("libcuda.so.1").display().to_string(),
            &s("libcuda_sim.c"),
            "-lpthread",
        ]);
    }
    cc(&[
        "-O2",
        "-fPIC",
        "-shared",
        "-Wl,-soname,libcuda.so.1",
        "-o",
        &nosyms.join("libcuda.so.1").display().to_string(),
        &s("libcuda_nosyms.c"),
    ]);
    let rpath = format!("-Wl,-rpath,{}", out.display());
    cc(&[
        "-O2",
        "-o",
        &o("simworker"),
        &s("simworker.c"),
        &format!("-L{}", out.display()),
        "-l:libcuda.so.1",
        &rpath,
        "-lpthread",
    ]);
    let rpath_nosyms = format!("-Wl,-rpath,{}", nosyms.display());
    cc(&[
        "-O2",
        "-o",
        &nosyms.join("nosyms-worker").display().to_string(),
        &s("nosyms_worker.c"),
        &format!("-L{}", nosyms.display()),
        "-l:libcuda.so.1",
        &rpath_nosyms,
    ]);
    println!("cargo:rustc-env=SIMCUDA_DIR={}", out.display());
    println!("cargo:rerun-if-changed=simcuda");
}
