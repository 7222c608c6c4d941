//! Builds `probe-ebpf` for the BPF target with aya-build so `cargo build` stays the one entry
//! point; the object is embedded with `include_bytes_aligned!`.
fn main() -> anyhow::Result<()> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../probe-ebpf");
    // The eBPF programs compile probe-common too (the API table, the record layouts): a change
    // there must rebuild them. Without this line the H200 ran an object whose API table
    // predated cuCtxSynchronize_v2 (every such call counted as arg_read_failed, 165 in 7 min).
    println!(
        "cargo:rerun-if-changed={}",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../probe-common/src")
    );
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "probe-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
}
