//! The patcher against the code it will meet (issue 31): every launch entry point of the H200's
//! libcuda (bytes saved on the GPU machine), and functions compiled here by gcc and clang at
//! -O0…-O3, with and without `-fcf-protection` and frame pointers — stack arguments, PIC loads
//! through the GOT, jump tables, TLS, libc calls through the PLT, recursion, tiny functions.
//! Each compiled function is patched, called through its trampoline and checked to return
//! what the original returned (and to have gone through the redirection); what is refused is
//! refused for a named reason, and the shapes a driver's entry points take are never refused.
//!
//! Why by running them: a relocated instruction that decodes fine but means something else at
//! its new address (a RIP-relative operand, a short branch) shows only when it runs.

use std::{
    collections::BTreeMap,
    ffi::CString,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU64, Ordering},
};

use cupti_shim::hooks::patch_code::{self, NotPrepared, Page};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, OpKind};

/// The corpus: every function takes up to ten `long`s (four of them on the stack) and returns
/// a `long`, so one signature calls them all.
const CORPUS_C: &str = r#"
#include <string.h>
#include <stdlib.h>
#define API __attribute__((visibility("default"), noinline))
__attribute__((visibility("default"))) long wp_counter = 7;                      /* exported: a PIC load goes through the GOT */
static long table[16] = {1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597};
static __thread long tls_acc;              /* general-dynamic TLS in a shared object */
static const char *words[] = {"launch", "kernel", "stream", "graph"};

API long tiny_add(long a, long b) { return a + b; }
API long tiny_const(long a, long b) { (void)a; (void)b; return 42; }
API long sum10(long a, long b, long c, long d, long e, long f, long g, long h, long i, long j) {
    return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h + 9 * i + 10 * j;
}
API long global_load(long a, long b) { return wp_counter * a + table[b & 15]; }
API long global_store(long a, long b) { wp_counter += a; return wp_counter * b; }
API long loop_first(long n, long b) { long s = 0; for (long i = 0; i < n; i++) s += i * b; return s; }
API long cond_first(long a, long b) {
    if (a == 0) return b;
    long s = 1;
    for (long i = 0; i < (a & 31); i++) s = s * 3 + b;
    return s;
}
API long switch_table(long a, long b) {
    switch (a & 7) {
    case 0: return b + 11; case 1: return b * 13; case 2: return b - 17; case 3: return b ^ 19;
    case 4: return b << 2; case 5: return b >> 1; case 6: return ~b; default: return -b;
    }
}
API long big_frame(long a, long b) {
    volatile long buf[64];
    for (int i = 0; i < 64; i++) buf[i] = a * i + b;
    long s = 0;
    for (int i = 0; i < 64; i += 3) s += buf[i];
    return s;
}
API long callee_saved(long a, long b, long c, long d, long e, long f, long g, long h) {
    long x[8] = {a, b, c, d, e, f, g, h};
    long s = 0;
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 8; i++) s = s * 31 + x[(i + r) & 7] * (r + 1);
    return s ^ (a * h) ^ (b * g) ^ (c * f) ^ (d * e);
}
API long with_alloca(long n, long b) {
    long m = (n & 15) + 1;
    long *v = __builtin_alloca(m * sizeof(long));
    for (long i = 0; i < m; i++) v[i] = i * b;
    long s = 0;
    for (long i = 0; i < m; i++) s += v[i];
    return s;
}
API long float_mix(long a, long b) { double x = (double)a / 3.0 + (double)b * 1.5; return (long)(x * 1000.0); }
API long libc_call(long a, long b) { return (long)strlen(words[a & 3]) * 100 + b; }
API long tls_inc(long a, long b) { tls_acc += a; return tls_acc * b; }
API long fib(long n, long b) { return n < 2 ? n + b : fib(n - 1, b) + fib(n - 2, b); }
static __attribute__((noinline)) long helper(long a, long b) { return a * 1000 + b * 7 + wp_counter; }
API long calls_helper(long a, long b) { long r = helper(a, b); return r + helper(b, a); }
API long tail_calls(long a, long b) { return helper(b, a); }
API long stack_protected(long a, long b) {
    char buf[48];
    memset(buf, (int)(a & 0x7f), sizeof buf);
    buf[b & 31] = 1;
    long s = 0;
    for (int i = 0; i < 48; i++) s += buf[i];
    return s;
}
"#;

const FUNCTIONS: [&str; 18] = [
    "tiny_add",
    "tiny_const",
    "sum10",
    "global_load",
    "global_store",
    "loop_first",
    "cond_first",
    "switch_table",
    "big_frame",
    "callee_saved",
    "with_alloca",
    "float_mix",
    "libc_call",
    "tls_inc",
    "fib",
    "calls_helper",
    "tail_calls",
    "stack_protected",
];

/// Shapes a driver's entry point takes (a frame or saved registers, a locals' frame, stack
/// arguments, GOT, PLT and TLS accesses, calls, recursion): refused in no build of the corpus.
/// (Refused in some builds, for the reasons printed: functions whose first instruction
/// changes an argument it reads — `and edi,7` — or writes xmm0 unread, where the patcher
/// cannot know it is no argument; functions too short for a jump.)
const NEVER_REFUSED: [&str; 11] = [
    "sum10",
    "global_load",
    "global_store",
    "loop_first",
    "cond_first",
    "big_frame",
    "callee_saved",
    "libc_call",
    "tls_inc",
    "fib",
    "calls_helper",
];

/// The refusals a compiler's output may meet — the function's own code makes the patch unsafe:
/// its first instruction changes state that cannot be given back before the hook, it is too
/// short, it branches at once, or it branches back into the bytes the jump replaces. Any other
/// (an instruction not decoded, not moved, not relocated) is a defect of the patcher.
const EXPECTED_REASONS: [&str; 7] = [
    "changes a register",
    "writes memory",
    "too short",
    "ends here",
    "jumps away",
    "branches into",
    "a branch first",
];

const ARGS: [i64; 10] = [5, 3, 7, 11, 13, 17, 19, 23, 29, 31];

type Corpus = unsafe extern "C" fn(i64, i64, i64, i64, i64, i64, i64, i64, i64, i64) -> i64;

fn call(f: usize) -> i64 {
    // SAFETY: every corpus function takes at most ten longs and returns a long; extra
    // arguments are the caller's to clean up (System V).
    let f: Corpus = unsafe { std::mem::transmute(f) };
    // SAFETY: as above.
    unsafe {
        f(
            ARGS[0], ARGS[1], ARGS[2], ARGS[3], ARGS[4], ARGS[5], ARGS[6], ARGS[7], ARGS[8],
            ARGS[9],
        )
    }
}

/// Redirections our jumps reach: per function, `lock inc [count]; jmp [target]` — flags aside,
/// every register as the caller left it, so they stand in for a hook of any signature.
struct Thunks {
    base: *mut u8,
    used: usize,
}

const THUNK: usize = 16;
/// Counters and targets after the code: (count, target) per thunk.
const DATA_AT: usize = 2048;

impl Thunks {
    fn new() -> Self {
        // SAFETY: an anonymous private mapping (a test's code and data in one page).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap for the thunks");
        Self {
            base: p.cast(),
            used: 0,
        }
    }

    /// A new thunk: its address and its index.
    fn add(&mut self) -> (usize, usize) {
        let k = self.used;
        assert!(DATA_AT + 16 * (k + 1) <= 4096, "thunk page full");
        self.used += 1;
        let code = self.base as usize + k * THUNK;
        let count = self.base as usize + DATA_AT + 16 * k;
        let target = count + 8;
        let mut b = vec![0xf0, 0x48, 0xff, 0x05];
        b.extend_from_slice(&((count as i64 - (code as i64 + 8)) as i32).to_le_bytes());
        b.extend_from_slice(&[0xff, 0x25]);
        b.extend_from_slice(&((target as i64 - (code as i64 + 14)) as i32).to_le_bytes());
        // SAFETY: inside our page.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), code as *mut u8, b.len()) };
        (code, k)
    }

    fn cell(&self, k: usize, word: usize) -> &AtomicU64 {
        // SAFETY: an aligned word of our page.
        unsafe { &*((self.base as usize + DATA_AT + 16 * k + 8 * word) as *const AtomicU64) }
    }

    fn count(&self, k: usize) -> u64 {
        self.cell(k, 0).load(Ordering::SeqCst)
    }

    fn set_target(&self, k: usize, to: usize) {
        self.cell(k, 1).store(to as u64, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct Tally {
    patched: usize,
    refused: BTreeMap<String, Vec<String>>,
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn compile(cc: &str, flags: &[&str], dir: &Path, src: &Path) -> PathBuf {
    let name = format!("{cc}{}.so", flags.join("").replace(['=', '-'], "_"));
    let out = dir.join(name);
    let status = Command::new(cc)
        .args(flags)
        .args(["-fPIC", "-shared", "-fvisibility=hidden", "-o"])
        .arg(&out)
        .arg(src)
        .status()
        .expect("run the C compiler");
    assert!(status.success(), "{cc} {flags:?} failed");
    out
}

/// Patches every corpus function of `lib` in turn, calls it through the trampoline, and
/// compares with the original's result.
fn patch_all(lib: &Path, tally: &mut Tally) {
    let path = CString::new(lib.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: our own freshly built library, loaded privately.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen {}", lib.display());
    let label = lib
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut thunks = Thunks::new();
    let mut first = 0usize;
    let mut prepared = Vec::new();
    let mut page: Option<Page> = None;
    for name in FUNCTIONS.iter() {
        let c = CString::new(*name).expect("name");
        // SAFETY: a valid handle and name.
        let f = unsafe { libc::dlsym(h, c.as_ptr()) } as usize;
        assert_ne!(f, 0, "{label}: no {name}");
        if first == 0 {
            first = f;
        }
        let page = page.get_or_insert_with(|| Page::near(first).expect("trampoline page"));
        let (thunk, k) = thunks.add();
        match page.prepare(f, thunk) {
            Ok(patch) => {
                thunks.set_target(k, patch.trampoline);
                prepared.push((*name, f, k, patch));
            }
            Err(NotPrepared::Refused(r)) => {
                assert!(
                    !NEVER_REFUSED.contains(name),
                    "{label}: {name} refused: {r}"
                );
                assert!(
                    EXPECTED_REASONS.iter().any(|w| r.why.contains(w)),
                    "{label}: {name} refused for an unexpected reason: {r}"
                );
                tally
                    .refused
                    .entry(format!("{name}: {}", r.why))
                    .or_default()
                    .push(label.clone());
            }
            Err(NotPrepared::Failed(why)) => panic!("{label}: {name}: {why}"),
        }
    }
    if let Some(page) = &page {
        page.seal().expect("seal");
    }
    for (name, f, k, patch) in &prepared {
        // Reset what the functions with state keep, so both calls see the same.
        let reset = || {
            // SAFETY: a valid handle and name; `wp_counter` is the corpus' exported long.
            let c = unsafe { libc::dlsym(h, c"wp_counter".as_ptr()) } as *mut i64;
            // SAFETY: as above.
            unsafe { *c = 7 };
        };
        reset();
        let want = call(*f);
        let tls_before = (*name == "tls_inc").then(|| call(*f));
        reset();
        // SAFETY: the page is sealed; this thread alone calls the corpus; the thunk passes
        // every argument through.
        unsafe { patch.apply() }.expect("apply");
        let through = call(*f);
        let hits = thunks.count(*k);
        if let Some(tls_second) = tls_before {
            // tls_inc accumulates per thread: compare with what a third plain call would give.
            let step = tls_second - want;
            assert_eq!(
                through,
                tls_second + step,
                "{label}: {name} through the trampoline"
            );
        } else {
            assert_eq!(through, want, "{label}: {name} through the trampoline");
        }
        assert!(
            hits >= 1,
            "{label}: {name}: the jump did not reach the redirection"
        );
        // SAFETY: applied above.
        let restored = unsafe { patch.restore() }.expect("restore");
        if restored && *name != "tls_inc" {
            reset();
            assert_eq!(
                call(*f),
                want,
                "{label}: {name} after the original bytes went back"
            );
            assert_eq!(
                thunks.count(*k),
                hits,
                "{label}: {name} still redirected after restore"
            );
        }
        tally.patched += 1;
    }
}

#[test]
fn compiled_prologues_are_patched_and_return_the_originals_results() {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("skipped: the patcher moves x86-64 code; this is another architecture");
        return;
    }
    let dir = std::env::temp_dir().join(format!("wp-prologue-corpus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let src = dir.join("corpus.c");
    std::fs::write(&src, CORPUS_C).expect("write the corpus");
    let mut compilers = vec!["gcc"];
    if have("clang") {
        compilers.push("clang");
    } else {
        eprintln!("clang not installed (scripts/setup.sh installs it): gcc's builds only");
    }
    let mut tally = Tally::default();
    let mut builds = 0;
    for cc in &compilers {
        for opt in ["-O0", "-O1", "-O2", "-O3"] {
            for cet in ["-fcf-protection=full", "-fcf-protection=none"] {
                for fp in ["-fno-omit-frame-pointer", "-fomit-frame-pointer"] {
                    for sp in ["-fstack-protector-strong", "-fno-stack-protector"] {
                        let lib = compile(cc, &[opt, cet, fp, sp], &dir, &src);
                        patch_all(&lib, &mut tally);
                        builds += 1;
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "{builds} builds × {} functions: {} patched and called through their trampolines",
        FUNCTIONS.len(),
        tally.patched
    );
    for (what, libs) in &tally.refused {
        eprintln!("refused in {} builds — {what}", libs.len());
    }
    // At -O0 every function has a frame first, however tiny: all of them move.
    for (what, libs) in &tally.refused {
        assert!(
            libs.iter().all(|l| !l.contains("_O0")),
            "refused at -O0 — {what}: {libs:?}"
        );
    }
    assert!(tally.patched > 0, "nothing patched");
}

/// The launch entry points of libcuda 580.159.04 on the H200 (64 bytes each, saved by
/// `gpu/entry_bytes.py`): each is planned, and its trampoline, decoded, holds the same
/// instructions — RIP-relative operands and branch targets pointing where the originals did —
/// then the jump back to the first byte not moved.
#[test]
fn the_h200_drivers_launch_entry_points_are_planned_and_relocated_faithfully() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/libcuda-580.159.04-h200-entry-bytes.txt");
    let mut seen = Vec::new();
    for (name, ip, code) in saved_entries(&data) {
        let name = name.as_str();
        let (kept, moved) = assert_relocated_faithfully(name, ip, &code);
        assert_eq!(
            (kept, moved),
            (1, 5),
            "{name}: push rbp stays; 5 bytes move"
        );
        seen.push(name.to_string());
    }
    // Every launch entry point the shim patches is in the saved corpus.
    for name in [
        "cuLaunchKernel",
        "cuLaunchKernel_ptsz",
        "cuLaunchKernelEx",
        "cuLaunchKernelEx_ptsz",
        "cuLaunchCooperativeKernel",
        "cuLaunchCooperativeKernel_ptsz",
        "cuGraphLaunch",
        "cuGraphLaunch_ptsz",
    ] {
        assert!(
            seen.iter().any(|s| s == name),
            "{name} missing from {}",
            data.display()
        );
    }
}

/// Every entry point the shim patches, whole, as libcuda 580.159.04 has it on the H200 (saved
/// by the harness's `entry-corpus` scenario, `gpu/entry_corpus.py`): each is planned and
/// relocated faithfully — the synchronizes, copies, captures, instantiations and destroys too,
/// not only the launches above. The names are read from the shim's own tables, so an entry
/// point hooked later and missing from the corpus fails here until the corpus is saved again.
#[test]
fn every_entry_point_the_shim_patches_on_the_h200_driver_is_relocated_faithfully() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = root.join("tests/data/libcuda-580.159.04-h200-entry-corpus.txt");
    let saved = saved_entries(&data);
    let mut shapes = std::collections::BTreeMap::<(usize, usize), Vec<String>>::new();
    for (name, ip, code) in &saved {
        let shape = assert_relocated_faithfully(name, *ip, code);
        shapes.entry(shape).or_default().push(name.clone());
    }
    for f in ["src/hooks/launch.rs", "src/hooks/calls.rs"] {
        let src = std::fs::read_to_string(root.join(f)).expect("the shim's tables");
        for name in src.split("c\"").skip(1).filter_map(|t| t.split('"').next()) {
            if name.starts_with("cu") {
                assert!(
                    saved.iter().any(|(n, ..)| n == name),
                    "{name} ({f}) is not in {}: save the corpus again",
                    data.display()
                );
            }
        }
    }
    println!(
        "{} entry points; (bytes kept, moved): {shapes:?}",
        saved.len()
    );
}

/// (name, load address, code) of each line of a saved corpus: `name 0xADDR HEX`.
fn saved_entries(path: &Path) -> Vec<(String, u64, Vec<u8>)> {
    let text = std::fs::read_to_string(path).expect("the saved entry bytes");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let mut f = line.split_whitespace();
            let mut field = |what| f.next().unwrap_or_else(|| panic!("{what} missing: {line}"));
            let (name, addr, hex) = (field("name"), field("address"), field("code"));
            let ip = u64::from_str_radix(addr.trim_start_matches("0x"), 16).expect("address");
            let code = (0..hex.len() / 2)
                .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
                .collect();
            (name.to_string(), ip, code)
        })
        .collect()
}

/// `code` (the entry point `name` at `ip`) is planned, and its trampoline, decoded, holds the
/// same instructions — RIP-relative operands and branch targets pointing where the originals
/// did — then the jump back to the first byte not moved. Returns (bytes kept, bytes moved).
fn assert_relocated_faithfully(name: &str, ip: u64, code: &[u8]) -> (usize, usize) {
    let plan =
        patch_code::plan(code, ip, code.len()).unwrap_or_else(|r| panic!("{name} refused: {r}"));
    // A trampoline page 1 GiB below the driver, as `Page::near` may place it.
    let at = ip - (1 << 30);
    let tramp = plan.encode(at).unwrap_or_else(|e| panic!("{name}: {e}"));
    let original: Vec<Instruction> = Decoder::with_ip(
        64,
        &code[..plan.kept + plan.moved],
        ip,
        DecoderOptions::NONE,
    )
    .into_iter()
    .collect();
    let moved: Vec<Instruction> = Decoder::with_ip(64, &tramp, at, DecoderOptions::NONE)
        .into_iter()
        .collect();
    assert_eq!(moved.len(), original.len() + 1, "{name}: {moved:?}");
    for (o, m) in original.iter().zip(&moved) {
        assert_same_meaning(name, o, m);
    }
    let back = moved.last().expect("jump back");
    assert_eq!(
        back.flow_control(),
        FlowControl::UnconditionalBranch,
        "{name}"
    );
    assert_eq!(
        back.near_branch_target(),
        ip + (plan.kept + plan.moved) as u64,
        "{name}: the jump back"
    );
    (plan.kept, plan.moved)
}

/// `m`, at its new address, does what `o` did at its old one.
fn assert_same_meaning(name: &str, o: &Instruction, m: &Instruction) {
    assert_eq!(o.mnemonic(), m.mnemonic(), "{name}: {o} → {m}");
    if o.is_ip_rel_memory_operand() {
        assert_eq!(
            o.ip_rel_memory_address(),
            m.ip_rel_memory_address(),
            "{name}: {o} → {m}"
        );
    }
    if matches!(
        o.op0_kind(),
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
    ) {
        assert_eq!(
            o.near_branch_target(),
            m.near_branch_target(),
            "{name}: {o} → {m}"
        );
    } else {
        assert_eq!(o, m, "{name}: {o} → {m}");
    }
}
