//! Rebuild when bpf-linker changes: it is the linker of this crate, and cargo does not track it.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(e) => println!("cargo:warning=bpf-linker not found ({e}); run scripts/setup.sh"),
    }
}
