#!/usr/bin/env bash
# Idempotent setup for a fresh Debian 12 machine with rustup (see README).
# Installs what building the eBPF half needs: nightly's rust-src (for -Z build-std=core) and
# bpf-linker built against rustc's own libLLVM (the recipe in docs/toolchain.md; plain
# `cargo install bpf-linker` fails on these machines: its default wants a system LLVM 23).
set -euo pipefail

log() { echo "setup: $*" >&2; }

need_apt=()
command -v cc >/dev/null || need_apt+=(gcc)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
# clang: the patcher's prologue corpus is compiled by gcc and clang (cupti-shim/tests/prologue_corpus.rs).
command -v clang >/dev/null || need_apt+=(clang)
# The trace viewer check (tests/suite/trace.rs): Debian's Chromium, Node.js and npm.
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
command -v npm >/dev/null || need_apt+=(nodejs npm)
# promtool (Debian's prometheus package): the daemon's scrape and deploy/'s rules are linted
# with Prometheus's own tool (tests/suite/daemon.rs).
command -v promtool >/dev/null || need_apt+=(prometheus)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing Debian packages: ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

if ! rustup toolchain list | grep -q '^nightly'; then
  log "installing the nightly toolchain"
  rustup toolchain install nightly --profile minimal
fi
if ! rustup component list --toolchain nightly --installed | grep -q '^rust-src'; then
  log "adding rust-src to nightly"
  rustup component add rust-src --toolchain nightly
fi

# The workspace's pinned toolchain (rust-toolchain.toml: aya 0.16 needs Rust 1.98), with the
# AArch64 standard library: `cargo xtask test` also checks the workspace for AArch64 (Grace
# Hopper / Grace Blackwell hosts).
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PINNED="$(sed -n 's/^channel = "\(.*\)"/\1/p' "$REPO/rust-toolchain.toml")"
if ! rustup toolchain list | grep -q "^$PINNED"; then
  log "installing the pinned toolchain $PINNED"
  rustup toolchain install "$PINNED" --profile minimal -c clippy -c rustfmt
fi
if ! rustup target list --toolchain "$PINNED" --installed | grep -q '^aarch64-unknown-linux-gnu$'; then
  log "adding the aarch64-unknown-linux-gnu target (the AArch64 build check)"
  rustup target add aarch64-unknown-linux-gnu --toolchain "$PINNED"
fi

if ! command -v bpf-linker >/dev/null 2>&1 || ! bpf-linker --version >/dev/null 2>&1; then
  SYSROOT_LIB="$(rustc +nightly --print sysroot)/lib"
  LLVM_MAJOR="$(rustc +nightly -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')"
  LINK_DIR="${TMPDIR:-/tmp}/wedgeprobe-llvm-link"
  mkdir -p "$LINK_DIR"
  ln -sf "$(ls "$SYSROOT_LIB"/libLLVM.so.* | head -1)" "$LINK_DIR/libLLVM.so"
  log "building bpf-linker against rustc's LLVM $LLVM_MAJOR (about a minute)"
  RUSTFLAGS="-L $LINK_DIR -C link-arg=-Wl,-rpath,$SYSROOT_LIB" \
    cargo +nightly install --locked bpf-linker --version 0.13.0 \
      --no-default-features --features "llvm-$LLVM_MAJOR"
fi

# speedscope and playwright-core for the viewer check, pinned by tests/viewer/package-lock.json.
VIEWER="$(cd "$(dirname "$0")/../tests/viewer" && pwd)"
if [ ! -d "$VIEWER/node_modules/speedscope" ] || [ ! -d "$VIEWER/node_modules/playwright-core" ]; then
  log "installing the trace viewer check's npm packages"
  (cd "$VIEWER" && npm ci --no-audit --no-fund --silent)
fi

# The daemon test parses /metrics with the Prometheus project's own Python parser.
if ! python3 -c 'import prometheus_client' 2>/dev/null; then
  log "installing prometheus_client (Python) for the metrics parser check"
  python3 -m pip install --quiet prometheus_client==0.26.0 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages prometheus_client==0.26.0
fi

# tracefs: uprobes and tracepoints are created through it; some machines do not mount it.
if [ ! -e /sys/kernel/tracing/uprobe_events ] && [ "$(id -u)" = 0 ]; then
  mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || log "could not mount tracefs"
fi
log "ok"
