//! Builds `probe-ebpf` for the BPF target with aya-build so `cargo build` stays the one entry
//! point; the object is embedded with `include_bytes_aligned!`.
fn main() -> anyhow::Result<()> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../probe-ebpf");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "probe-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
}
