//! Redirects an exported function of another library to ours, in place: a jump to our
//! function goes in after its first instruction, and a trampoline (the first instruction and
//! the whole instructions the jump covers, relocated, then a jump back) calls the original.
//! Why: CUPTI's callback dispatch on every launch is what the shim cost on eager work
//! (BENCHMARKS.md, the recorder's price: the same shim with CUPTI's launch callbacks left off
//! cost +8% instead of +31% on the launch-bound loop), and every caller — the runtime through
//! `cuGetProcAddress`, Triton through `dlsym`, NCCL — ends up in libcuda's exported functions
//! (the addresses `cuGetProcAddress` hands out are the exported ones, `gpu/entry_bytes.py` on
//! the H200).
//!
//! Instructions are decoded and relocated by iced-x86 (its `BlockEncoder` re-encodes
//! RIP-relative operands and relative branches at the trampoline's address), not matched
//! against shapes kept by hand: drivers are rebuilt every release, and a build whose entry
//! points begin with `endbr64` (CET), `sub rsp`, or a RIP-relative load was refused by the
//! hand-kept patterns this replaces. What cannot be moved safely is refused with the
//! instruction and the reason (`Refusal`): a first instruction that can neither stay in place
//! nor be undone, a function too short for a jump, a branch elsewhere in the function into the
//! bytes the jump replaces.
//!
//! The first instruction stays in place because of uprobes: a uprobe on the entry point
//! (wedgeprobe's own, or anyone's) replaces its first byte with int3, runs the *file's* first
//! instruction out of line and resumes right after it — at our jump. A jump at the entry
//! itself would be resumed into its middle. So the stub our jump reaches first undoes what
//! that instruction did (a `push`, a `sub rsp`), then enters our function with the stack as its
//! caller left it; an instruction that writes only scratch registers or flags needs no undoing.
//!
//! Patched once, at `cuInit` (no other thread can be inside the driver yet) — or, for
//! `wedgeprobe attach`, by wedgeprobe itself with every thread of the process stopped
//! (`Patch::words`) — and undone only when the shim stops for good, where that can be done in
//! one store.

use std::{
    fmt,
    sync::atomic::{AtomicU64, Ordering},
};

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Formatter as _,
    Instruction, InstructionBlock, InstructionInfoFactory, IntelFormatter, Mnemonic, OpAccess,
    OpKind, Register,
};

/// Bytes a near jump takes (`E9 rel32`).
const JMP_LEN: usize = 5;
/// Per patched function in the trampoline page: the trampoline (the kept and moved
/// instructions re-encoded — a short branch may grow to a near one — and the jump back), then
/// at `STUB_AT` the stub: the undo (≤ 8 bytes) and the far jump to our function
/// (`FF 25 00000000` + address: 14).
const SLOT: usize = 128;
const STUB_AT: usize = 96;
const PAGE: usize = 4096;
/// The trampoline area: four pages, 128 slots. The shim patches 8 launch entry points and 33
/// call entry points (41 slots); one page held 32 once slots grew from 48 to 128 bytes for
/// relocated code, and the last 9 call hooks (graph instantiation among them) went unhooked
/// without a word — graphs were no longer named in the default mode (H100, 2026-12-06).
const AREA: usize = 4 * PAGE;
/// Patches one trampoline area holds.
pub const SLOTS: usize = AREA / SLOT;
/// The most bytes of a function read to plan its patch (its first instruction and those the
/// jump covers: at most 15 + 4 × 15).
pub const HEAD: usize = 80;
/// The most bytes of a function scanned for branches into the replaced bytes.
pub const SCAN_MAX: usize = 4096;

/// The refusal of an entry point someone's breakpoint is on.
pub const BREAKPOINT: &str = "a breakpoint is on this entry point (a uprobe, or a debugger)";

/// Why a function is not patched: which instruction (its offset from the entry and its text)
/// and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub offset: usize,
    pub instruction: String,
    pub why: &'static str,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` at +{}: {}",
            self.instruction, self.offset, self.why
        )
    }
}

/// What the stub does before entering our function: undo the entry's first instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Undo {
    Nothing,
    /// `push r64`: `pop` it again.
    Pop(Register),
    /// `sub rsp, imm`: `lea rsp, [rsp + imm]` (flags untouched).
    Grow(i32),
}

impl Undo {
    fn bytes(self) -> Vec<u8> {
        match self {
            Undo::Nothing => Vec::new(),
            Undo::Pop(r) => {
                let n = r.number() as u8;
                if n >= 8 {
                    vec![0x41, 0x58 + (n - 8)]
                } else {
                    vec![0x58 + n]
                }
            }
            Undo::Grow(imm) => {
                let mut b = vec![0x48, 0x8d, 0xa4, 0x24];
                b.extend_from_slice(&imm.to_le_bytes());
                b
            }
        }
    }
}

/// How one function is patched: `plan`.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Bytes of the first instruction, which stays in place: the jump goes at this offset.
    pub kept: usize,
    /// Bytes after it moved to the trampoline (whole instructions, at least `JMP_LEN`).
    pub moved: usize,
    undo: Undo,
    /// The kept and moved instructions, decoded at their own addresses, then the jump back.
    trampoline: Vec<Instruction>,
}

fn text(i: &Instruction) -> String {
    let mut out = String::new();
    IntelFormatter::new().format(i, &mut out);
    out
}

fn refuse(ip: u64, i: &Instruction, why: &'static str) -> Refusal {
    Refusal {
        offset: i.ip().wrapping_sub(ip) as usize,
        instruction: text(i),
        why,
    }
}

/// Registers an instruction left in place may write (besides flags and, through `Undo`, the
/// stack pointer): scratch registers that carry no argument of the functions we hook
/// (`al` carries a variadic call's vector count: none of libcuda's entry points is variadic).
const SCRATCH: [Register; 3] = [Register::RAX, Register::R10, Register::R11];

/// The registers System V passes integer arguments in.
const ARGUMENTS: [Register; 6] = [
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::R8,
    Register::R9,
];

/// Whether the entry's first instruction can stay in place, and what undoes it.
fn kept(i: &Instruction, info: &mut InstructionInfoFactory, ip: u64) -> Result<Undo, Refusal> {
    match (i.mnemonic(), i.flow_control()) {
        (Mnemonic::Int3, _) => return Err(refuse(ip, i, BREAKPOINT)),
        (_, FlowControl::Next) => {}
        (Mnemonic::Jmp, _) => {
            return Err(refuse(
                ip,
                i,
                "it jumps away at once (another tool's hook, or a thunk)",
            ));
        }
        _ => return Err(refuse(ip, i, "a branch first is not moved")),
    }
    match i.mnemonic() {
        Mnemonic::Endbr64 | Mnemonic::Nop => return Ok(Undo::Nothing),
        Mnemonic::Push if i.op0_kind() == OpKind::Register && i.op0_register().is_gpr64() => {
            return Ok(Undo::Pop(i.op0_register()));
        }
        Mnemonic::Sub
            if i.op0_kind() == OpKind::Register
                && i.op0_register() == Register::RSP
                && matches!(
                    i.op1_kind(),
                    OpKind::Immediate8to64 | OpKind::Immediate32to64
                ) =>
        {
            return Ok(Undo::Grow(i.immediate(1) as i64 as i32));
        }
        _ => {}
    }
    let info = info.info(i);
    let writes = |a: OpAccess| {
        matches!(
            a,
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        )
    };
    // A store below the stack pointer (the red zone: gcc -O0 without a frame pointer spills
    // arguments there first) is dead by the time the hook runs — no caller keeps data below
    // its own call's return address — and the trampoline runs it again before the body.
    let below_stack = |m: &iced_x86::UsedMemory| {
        m.base() == Register::RSP
            && m.index() == Register::None
            && (-128..0).contains(&(m.displacement() as i64))
    };
    if info
        .used_memory()
        .iter()
        .any(|m| writes(m.access()) && !below_stack(m))
    {
        return Err(refuse(
            ip,
            i,
            "it writes memory: it must stay in place (a uprobe on the entry runs it) and \
             cannot be undone before the hook",
        ));
    }
    // An argument register the instruction overwrites whole without reading it was not an
    // input of the function (gcc -O1 begins `mov rdx,[rip+GOT]` in a two-argument function):
    // the trampoline runs the load again, and the hook — which reads only the arguments the
    // entry point is declared with — passes the register through. Partial (8/16-bit) writes
    // keep part of the old value, callee-saved registers hold the caller's state: refused.
    let reads_reg = |reg: Register| {
        info.used_registers().iter().any(|u| {
            u.register().full_register() == reg
                && matches!(
                    u.access(),
                    OpAccess::Read
                        | OpAccess::CondRead
                        | OpAccess::ReadWrite
                        | OpAccess::ReadCondWrite
                )
        }) || info
            .used_memory()
            .iter()
            .any(|m| m.base().full_register() == reg || m.index().full_register() == reg)
    };
    let dead_overwrite = |u: &iced_x86::UsedRegister| {
        let full = u.register().full_register();
        u.access() == OpAccess::Write
            && (u.register().is_gpr32() || u.register().is_gpr64())
            && ARGUMENTS.contains(&full)
            && !reads_reg(full)
    };
    let clobbers = info
        .used_registers()
        .iter()
        .filter(|r| writes(r.access()))
        .any(|r| !SCRATCH.contains(&r.register().full_register()) && !dead_overwrite(r));
    if clobbers || i.is_stack_instruction() {
        return Err(refuse(
            ip,
            i,
            "it changes a register the function reads (an argument) or keeps for its caller: \
             it must stay in place (a uprobe on the entry runs it) and cannot be undone before \
             the hook",
        ));
    }
    Ok(Undo::Nothing)
}

/// Plans the patch of the function at `ip` whose code `code` holds: its first bytes (at least
/// `HEAD`, where the function is that long) and, up to `scan_len`, the rest of it, scanned
/// for branches into the bytes the jump replaces.
pub fn plan(code: &[u8], ip: u64, scan_len: usize) -> Result<Plan, Refusal> {
    let head = &code[..code.len().min(HEAD)];
    let mut decoder = Decoder::with_ip(64, head, ip, DecoderOptions::NONE);
    let mut factory = InstructionInfoFactory::new();
    let first = decoder.decode();
    if first.is_invalid() {
        return Err(refuse(ip, &first, "not a valid instruction"));
    }
    let undo = kept(&first, &mut factory, ip)?;
    let kept_len = first.len();
    let mut trampoline = vec![first];
    let mut moved = 0;
    while moved < JMP_LEN {
        if !decoder.can_decode() {
            return Err(Refusal {
                offset: kept_len + moved,
                instruction: String::from("(end of the code read)"),
                why: "the function is too short to hold a jump after its first instruction",
            });
        }
        let i = decoder.decode();
        if i.is_invalid() {
            return Err(refuse(ip, &i, "not a valid instruction"));
        }
        match i.flow_control() {
            FlowControl::Next
            | FlowControl::Call
            | FlowControl::IndirectCall
            | FlowControl::ConditionalBranch => {}
            FlowControl::UnconditionalBranch
            | FlowControl::IndirectBranch
            | FlowControl::Return => {
                if moved + i.len() < JMP_LEN {
                    return Err(refuse(
                        ip,
                        &i,
                        "the function ends here, too soon to hold a jump after its first \
                         instruction",
                    ));
                }
            }
            _ => return Err(refuse(ip, &i, "an instruction of this kind is not moved")),
        }
        moved += i.len();
        trampoline.push(i);
    }
    let replaced = ip + kept_len as u64..ip + (kept_len + moved) as u64;
    // Branches from elsewhere in the function into the replaced bytes would land on our jump
    // (or in its middle) with the function half-run.
    let scan = &code[..scan_len.min(code.len()).max(kept_len + moved)];
    let mut sweep = Decoder::with_ip(64, scan, ip, DecoderOptions::NONE);
    for i in &mut sweep {
        if replaced.contains(&i.ip()) {
            continue; // a moved instruction: relocated with its target by the encoder
        }
        let near = matches!(
            i.op0_kind(),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
        );
        if near && replaced.contains(&i.near_branch_target()) {
            return Err(refuse(
                ip,
                &i,
                "it branches into the bytes the jump would replace",
            ));
        }
    }
    let back = Instruction::with_branch(Code::Jmp_rel32_64, replaced.end).map_err(|_| Refusal {
        offset: kept_len + moved,
        instruction: String::new(),
        why: "the jump back cannot be encoded",
    })?;
    // The encoder sends a branch whose target is the address of an instruction of the block
    // to that instruction's new place: the jump back, given its own address, would jump to
    // itself. It gets an address no branch can target.
    let mut back = back;
    back.set_ip(0);
    trampoline.push(back);
    Ok(Plan {
        kept: kept_len,
        moved,
        undo,
        trampoline,
    })
}

impl Plan {
    /// The trampoline's bytes for address `at`.
    pub fn encode(&self, at: u64) -> Result<Vec<u8>, &'static str> {
        let block = InstructionBlock::new(&self.trampoline, at);
        let code = BlockEncoder::encode(64, block, BlockEncoderOptions::NONE)
            .map_err(|_| "its first instructions cannot be relocated to the trampoline")?
            .code_buffer;
        if code.len() > STUB_AT {
            return Err("its relocated first instructions do not fit a trampoline");
        }
        Ok(code)
    }
}

/// `dladdr1`'s request for the symbol's table entry (dlfcn.h; not in the libc crate).
const RTLD_DL_SYMENT: libc::c_int = 1;

/// How many bytes of the function at `target` can be read and scanned: its symbol's size
/// where the dynamic linker knows it (capped at `SCAN_MAX`), else to the end of the page its
/// first `HEAD` bytes end in (mapped, as they are).
fn readable_len(target: usize) -> usize {
    // SAFETY: Dl_info is plain pointers, valid zeroed.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut sym: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: out-pointers; RTLD_DL_SYMENT stores a pointer to the symbol's ElfW(Sym).
    let found = unsafe {
        libc::dladdr1(
            target as *const libc::c_void,
            &mut info,
            &mut sym,
            RTLD_DL_SYMENT,
        )
    } != 0;
    let page_end = ((target + HEAD) | (PAGE - 1)) + 1;
    if found && !sym.is_null() && info.dli_saddr as usize == target {
        // SAFETY: the dynamic linker's own symbol entry for this address.
        let size = unsafe { (*sym.cast::<libc::Elf64_Sym>()).st_size } as usize;
        if size > 0 {
            return size.min(SCAN_MAX);
        }
    }
    page_end - target
}

/// The trampoline area (`AREA`, page-aligned): one per process, near the patched library (a
/// `rel32` jump reaches ±2 GiB).
pub struct Page {
    base: *mut u8,
    used: usize,
}

// SAFETY: the page is written only while patching (at cuInit, one thread), read-only after.
unsafe impl Send for Page {}

impl Page {
    /// Maps the area within ±1.5 GiB of `near`.
    pub fn near(near: usize) -> Result<Page, &'static str> {
        const STEP: usize = 64 << 20;
        for i in 1..24usize {
            for hint in [near.wrapping_sub(i * STEP), near.wrapping_add(i * STEP)] {
                let hint = hint & !(PAGE - 1);
                // SAFETY: an anonymous private mapping; the hint is only a hint.
                let p = unsafe {
                    libc::mmap(
                        hint as *mut libc::c_void,
                        AREA,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    )
                };
                if p == libc::MAP_FAILED {
                    continue;
                }
                if (p as usize).abs_diff(near) < (1500 << 20) {
                    return Ok(Page {
                        base: p.cast(),
                        used: 0,
                    });
                }
                // SAFETY: the mapping just made.
                unsafe { libc::munmap(p, AREA) };
            }
        }
        Err("no memory for trampolines near libcuda")
    }

    /// Makes the page executable (and no longer writable) once every patch is written.
    pub fn seal(&self) -> Result<(), &'static str> {
        // SAFETY: our own mapping.
        let r =
            unsafe { libc::mprotect(self.base.cast(), AREA, libc::PROT_READ | libc::PROT_EXEC) };
        if r == 0 {
            Ok(())
        } else {
            Err("cannot make the trampolines executable")
        }
    }
}

fn rel32(from_end: usize, to: usize) -> Option<[u8; 4]> {
    let d = (to as i64).wrapping_sub(from_end as i64);
    i32::try_from(d).ok().map(i32::to_le_bytes)
}

/// A prepared redirection: its trampoline is written (usable once the page is sealed), the
/// jump over the original's entry not yet.
pub struct Patch {
    /// Where the jump goes: the entry point + its first instruction's length.
    at: usize,
    jump: [u8; JMP_LEN],
    original: [u8; JMP_LEN],
    /// Where to call the original.
    pub trampoline: usize,
}

/// Why `Page::prepare` did not prepare a patch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotPrepared {
    /// The function's code cannot be moved safely.
    Refused(Refusal),
    /// Anything else (the page is full, out of reach…).
    Failed(&'static str),
}

impl fmt::Display for NotPrepared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotPrepared::Refused(r) => r.fmt(f),
            NotPrepared::Failed(why) => f.write_str(why),
        }
    }
}

/// Plans the patch of the function at `target`, reading its code in place.
///
/// # Safety
/// `target` is an exported function's entry in mapped code.
pub unsafe fn plan_at(target: usize) -> Result<Plan, Refusal> {
    let len = readable_len(target);
    // SAFETY: the caller's promise; `readable_len` stays inside the function's symbol or the
    // page its first bytes end in.
    let code = unsafe { std::slice::from_raw_parts(target as *const u8, len) };
    plan(code, target as u64, len)
}

impl Page {
    /// Prepares redirecting the function at `target` to `ours`: writes the trampoline (the
    /// kept and moved instructions relocated, and a jump back) and the stub that undoes the
    /// kept instruction and reaches `ours` into this page.
    pub fn prepare(&mut self, target: usize, ours: usize) -> Result<Patch, NotPrepared> {
        if self.used + SLOT > AREA {
            return Err(NotPrepared::Failed("trampoline area full"));
        }
        // SAFETY: the caller hands an exported function's entry.
        let plan = unsafe { plan_at(target) }.map_err(NotPrepared::Refused)?;
        // SAFETY: within our page (checked above).
        let slot = unsafe { self.base.add(self.used) };
        let tramp = slot as usize;
        let stub = tramp + STUB_AT;
        let mut code = [0xccu8; SLOT];
        let relocated = plan.encode(tramp as u64).map_err(NotPrepared::Failed)?;
        code[..relocated.len()].copy_from_slice(&relocated);
        let undo = plan.undo.bytes();
        code[STUB_AT..STUB_AT + undo.len()].copy_from_slice(&undo);
        let far = STUB_AT + undo.len();
        // jmp [rip+0] to `ours`.
        code[far..far + 6].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
        code[far + 6..far + 14].copy_from_slice(&(ours as u64).to_le_bytes());
        let at = target + plan.kept;
        let mut jump = [0u8; JMP_LEN];
        jump[0] = 0xe9;
        jump[1..5].copy_from_slice(
            &rel32(at + JMP_LEN, stub).ok_or(NotPrepared::Failed("trampoline out of reach"))?,
        );
        // SAFETY: `plan_at` read these bytes (mapped code).
        let original: [u8; JMP_LEN] = unsafe { std::ptr::read_unaligned(at as *const _) };
        // SAFETY: our page, writable until sealed.
        unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), slot, SLOT) };
        self.used += SLOT;
        Ok(Patch {
            at,
            jump,
            original,
            trampoline: tramp,
        })
    }
}

/// The aligned 8-byte words the 5 bytes at `at` lie in (one or two).
fn words_of(at: usize) -> impl Iterator<Item = usize> {
    let first = at & !7;
    let last = (at + JMP_LEN - 1) & !7;
    (first..=last).step_by(8)
}

fn read_bytes(at: usize) -> [u8; JMP_LEN] {
    let mut b = [0u8; 16];
    for (k, w) in words_of(at).enumerate() {
        // SAFETY: aligned words of mapped code `prepare` read; each read at once.
        let v = unsafe { &*(w as *const AtomicU64) }.load(Ordering::Relaxed);
        b[8 * k..8 * k + 8].copy_from_slice(&v.to_le_bytes());
    }
    let o = at & 7;
    let mut out = [0u8; JMP_LEN];
    out.copy_from_slice(&b[o..o + JMP_LEN]);
    out
}

impl Patch {
    /// The aligned 8-byte code words the jump lies in (one, or two where it crosses a word):
    /// (address, what it holds now, what it holds with the jump) — what `wedgeprobe attach`
    /// writes itself, with the process stopped.
    pub fn words(&self) -> Vec<(u64, u64, u64)> {
        words_of(self.at)
            .map(|w| {
                // SAFETY: as for `read_bytes`.
                let old = unsafe { &*(w as *const AtomicU64) }.load(Ordering::Relaxed);
                let mut b = old.to_le_bytes();
                for (k, &j) in self.jump.iter().enumerate() {
                    let a = self.at + k;
                    if (w..w + 8).contains(&a) {
                        b[a - w] = j;
                    }
                }
                (w as u64, old, u64::from_le_bytes(b))
            })
            .collect()
    }

    /// Whether the jump is in place.
    pub fn in_place(&self) -> bool {
        read_bytes(self.at) == self.jump
    }

    /// Writes the jump after the original's first instruction (the rest of the moved
    /// instructions is never reached again and stays as it was): from now on its callers
    /// reach ours. Where the jump crosses an aligned word it is not written at once: hence
    /// the caller's promise.
    ///
    /// # Safety
    /// The page is sealed, no thread is executing the original's first instructions, and
    /// `ours` has the original's signature.
    pub unsafe fn apply(&self) -> Result<(), &'static str> {
        // SAFETY: the caller's promise.
        unsafe { write_code(self.at, &self.jump) }
    }

    /// Puts the original's bytes back where that is one store (the jump inside one aligned
    /// word): a thread entering sees the jump or the original, never half of each; the
    /// trampoline stays valid for a thread already on its way. Returns `Ok(false)`, the jump
    /// left in place, where it crosses a word — threads run now, and could meet half a jump.
    /// A patch left in place passes calls through (`HOT.pass`) and does not disturb a uprobe
    /// on the entry: the first instruction is the file's own.
    ///
    /// # Safety
    /// `apply` succeeded before.
    pub unsafe fn restore(&self) -> Result<bool, &'static str> {
        if words_of(self.at).count() > 1 {
            return Ok(false);
        }
        // SAFETY: the caller's promise; one atomic store (one word, checked above).
        unsafe { write_code(self.at, &self.original) }.map(|()| true)
    }
}

/// Writes `bytes` over code at `at`: the pages are made writable for the write and executable
/// again after. When the bytes lie in one aligned 8-byte word (always, for a patch's jump)
/// they are stored at once.
unsafe fn write_code(at: usize, bytes: &[u8]) -> Result<(), &'static str> {
    let first = at & !(PAGE - 1);
    let last = (at + bytes.len() - 1) & !(PAGE - 1);
    let len = last - first + PAGE;
    let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
    // SAFETY: pages of mapped code (the caller's promise).
    if unsafe { libc::mprotect(first as *mut libc::c_void, len, rwx) } != 0 {
        return Err("cannot make libcuda's code writable (mprotect)");
    }
    let word = at & !7;
    if at + bytes.len() <= word + 8 {
        // SAFETY: an aligned word inside the now-writable page(s).
        let w = unsafe { &*(word as *const AtomicU64) };
        let mut b = w.load(Ordering::Relaxed).to_le_bytes();
        b[at - word..at - word + bytes.len()].copy_from_slice(bytes);
        w.store(u64::from_le_bytes(b), Ordering::SeqCst);
    } else {
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at as *mut u8, bytes.len()) };
    }
    // SAFETY: as above.
    unsafe {
        libc::mprotect(
            first as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_EXEC,
        )
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `plan` of `code` at a made-up address: (kept, moved, undo) or the refusal.
    fn planned(code: &[u8]) -> Result<(usize, usize, Undo), Refusal> {
        let mut c = code.to_vec();
        c.resize(HEAD, 0xcc);
        plan(&c, 0x7000_0000, code.len()).map(|p| (p.kept, p.moved, p.undo))
    }

    #[test]
    fn libcudas_launch_prologue_moves_whole_instructions() {
        // cuLaunchKernel in libcuda 580.159.04 (gpu/entry_bytes.py on the H200): push rbp
        // stays, mov rbp,rsp + push r12 (5 bytes) make room for the jump.
        let bytes = [
            0x55, 0x48, 0x89, 0xe5, 0x41, 0x54, 0x48, 0x83, 0xec, 0x08, 0x81, 0x3d, 1, 2, 3, 4, 0,
        ];
        assert_eq!(planned(&bytes), Ok((1, 5, Undo::Pop(Register::RBP))));
        // The simulated driver's: push rbp; mov rbp,rsp; sub rsp,0x20.
        assert_eq!(
            planned(&[0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20, 0xc3]),
            Ok((1, 7, Undo::Pop(Register::RBP)))
        );
    }

    #[test]
    fn prologues_the_hand_kept_patterns_refused_are_planned() {
        // endbr64 (a CET build) stays; push rbp; mov rbp,rsp; push r12 move.
        assert_eq!(
            planned(&[
                0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x41, 0x54, 0xc3
            ]),
            Ok((4, 6, Undo::Nothing))
        );
        // gcc -O2's small wrapper: sub rsp,8 stays (undone by the stub); lea rsi,[rip+x] moves,
        // relocated.
        assert_eq!(
            planned(&[
                0x48, 0x83, 0xec, 0x08, 0x48, 0x8d, 0x35, 1, 2, 3, 4, 0x48, 0x8d, 0x3d, 5, 6, 7, 8,
                0xe8, 0, 0, 0, 0, 0xc3
            ]),
            Ok((4, 7, Undo::Grow(8)))
        );
        // push r12 first (a two-byte push).
        assert_eq!(
            planned(&[0x41, 0x54, 0x48, 0x8b, 0x05, 1, 2, 3, 4, 0xc3]),
            Ok((2, 7, Undo::Pop(Register::R12)))
        );
        // An argument register overwritten whole, unread (gcc -O1: `mov rdx,[rip+GOT]`): not
        // an input of the function, so it stays; a store to the red zone (gcc -O0 without a
        // frame pointer) too.
        assert_eq!(
            planned(&[
                0x48, 0x8b, 0x15, 1, 2, 3, 4, 0x48, 0x8b, 0x02, 0x48, 0x01, 0xf8, 0xc3
            ]),
            Ok((7, 6, Undo::Nothing))
        );
        assert_eq!(
            planned(&[
                0x48, 0x89, 0x7c, 0x24, 0xf8, 0x48, 0x89, 0x74, 0x24, 0xf0, 0xc3
            ]),
            Ok((5, 5, Undo::Nothing))
        );
        // A RIP-relative load into rax first: stays (rax is scratch); a test and a short jcc
        // move (the encoder makes the jcc near).
        assert_eq!(
            planned(&[
                0x48, 0x8b, 0x05, 1, 2, 3, 4, 0x48, 0x85, 0xff, 0x74, 0x10, 0xc3
            ]),
            Ok((7, 5, Undo::Nothing))
        );
    }

    #[test]
    fn what_cannot_move_safely_is_refused_with_the_instruction_and_why() {
        let refused = |code: &[u8]| planned(code).expect_err("refused");
        // Another tool's hook is on it already.
        let r = refused(&[0xe9, 1, 2, 3, 4, 0x41, 0x54]);
        assert_eq!(
            (r.offset, r.instruction.starts_with("jmp")),
            (0, true),
            "{r}"
        );
        // Someone's uprobe.
        assert!(
            refused(&[0xcc, 0x48, 0x89, 0xe5, 0x41, 0x54])
                .why
                .contains("breakpoint")
        );
        // The first instruction changes an argument it reads: it can neither stay nor be undone.
        let r = refused(&[0x48, 0x83, 0xc7, 0x08, 0x48, 0x89, 0xe5, 0x41, 0x54, 0xc3]);
        assert_eq!(r.instruction, "add rdi,8", "{r}");
        // Half of rdx replaced: the rest of its old value still counts.
        let r = refused(&[0x8a, 0x15, 1, 2, 3, 4, 0x48, 0x89, 0xe5, 0x41, 0x54, 0xc3]);
        assert!(r.instruction.starts_with("mov dl"), "{r}");
        // A callee-saved register written before it is saved.
        let r = refused(&[0x48, 0x89, 0xfb, 0x48, 0x89, 0xe5, 0x41, 0x54, 0xc3]);
        assert_eq!(r.instruction, "mov rbx,rdi", "{r}");
        // `mov eax,42; ret`: too short for a jump after its first instruction.
        let r = refused(&[0xb8, 42, 0, 0, 0, 0xc3]);
        assert_eq!((r.offset, r.instruction.as_str()), (5, "ret"), "{r}");
        // A loop back into the replaced bytes: push rbp; mov rbp,rsp; push r12; ...; jne +1.
        let r = refused(&[
            0x55, 0x48, 0x89, 0xe5, 0x41, 0x54, 0xff, 0xcf, 0x75, 0xf7, 0xc3,
        ]);
        assert_eq!(r.offset, 8, "{r}");
        assert!(r.why.contains("branches into"), "{r}");
    }

    std::arch::global_asm!(
        ".globl wp_patch_test_target",
        ".p2align 4",
        "wp_patch_test_target:",
        "push rbp",
        "mov rbp, rsp",
        "push r12",
        "lea rax, [rdi + rsi]",
        "pop r12",
        "pop rbp",
        "ret",
    );

    unsafe extern "C" {
        fn wp_patch_test_target(a: u64, b: u64) -> u64;
    }

    static ORIGINAL: AtomicU64 = AtomicU64::new(0);

    extern "C" fn ours(a: u64, b: u64) -> u64 {
        // SAFETY: the trampoline has the original's signature.
        let f: extern "C" fn(u64, u64) -> u64 =
            unsafe { std::mem::transmute(ORIGINAL.load(Ordering::SeqCst) as usize) };
        f(a, b) * 10
    }

    #[test]
    fn one_trampoline_area_holds_a_patch_for_every_entry_point_the_shim_hooks() -> Result<(), String>
    {
        // Prepared, never applied: each prepare writes only into the area.
        let target = wp_patch_test_target as *const () as usize;
        let mut page = Page::near(target)?;
        let wanted = super::super::launch::ENTRIES.len() + super::super::calls::N;
        for i in 0..wanted {
            page.prepare(target, ours as *const () as usize)
                .map_err(|why| format!("patch {} of {wanted} not prepared: {why}", i + 1))?;
        }
        Ok(page.seal()?)
    }

    #[test]
    fn a_redirected_function_reaches_ours_and_the_original_through_the_trampoline()
    -> Result<(), &'static str> {
        let target = wp_patch_test_target as *const () as usize;
        // SAFETY: plain arithmetic before the patch.
        assert_eq!(unsafe { wp_patch_test_target(2, 3) }, 5);
        let mut page = Page::near(target)?;
        let patch = page
            .prepare(target, ours as *const () as usize)
            .map_err(|_| "not prepared")?;
        ORIGINAL.store(patch.trampoline as u64, Ordering::SeqCst);
        page.seal()?;
        // SAFETY: no other thread calls the test target.
        unsafe { patch.apply() }?;
        // SAFETY: as above; now through ours and the trampoline.
        assert_eq!(unsafe { wp_patch_test_target(2, 3) }, 50);
        // SAFETY: applied above.
        let restored = unsafe { patch.restore() }?;
        if !restored {
            return Ok(()); // the jump crosses a word: left in place, by design
        }
        // SAFETY: as above; the original again.
        assert_eq!(unsafe { wp_patch_test_target(2, 3) }, 5);
        Ok(())
    }
}
