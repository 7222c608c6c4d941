//! Redirects an exported function of another library to ours, in place: its first
//! instructions become a jump to our function, and a trampoline (those instructions, then a
//! jump back) calls the original. Why: CUPTI's callback dispatch on every launch is what the
//! shim cost on eager work (BENCHMARKS.md, the recorder's price: the same shim with CUPTI's launch
//! callbacks left off cost +8% instead of +31% on the launch-bound loop), and every caller —
//! the runtime through `cuGetProcAddress`, Triton through `dlsym`, NCCL — ends up in libcuda's
//! exported functions (the addresses `cuGetProcAddress` hands out are the exported ones,
//! `gpu/entry_bytes.py` on the H200).
//!
//! Deliberately narrow: only prologues made of a few position-independent instructions are
//! moved (libcuda 580's launch entry points all begin `push rbp; mov rbp,rsp; push r12`);
//! anything else is refused and the caller falls back to CUPTI callbacks. Patched once, at
//! `cuInit` (no other thread can be inside the driver yet) — or, for `wedgeprobe attach`, by
//! wedgeprobe itself with every thread of the process stopped (`Patch::word`) — and undone
//! only when the shim stops for good.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes a near jump takes (`E9 rel32`).
const JMP_LEN: usize = 5;
/// Per patched function in the trampoline page: the moved prologue (≤ 15 bytes) and its jump
/// back (5), then the stub: `pop` (1) and the far jump to our function (`FF 25 00000000` +
/// address: 14).
const SLOT: usize = 48;
const PAGE: usize = 4096;

/// Length of one position-independent prologue instruction at `code`, or `None` when it is
/// not one this patcher knows how to move.
pub fn instruction_len(code: &[u8]) -> Option<usize> {
    match code {
        // endbr64
        [0xf3, 0x0f, 0x1e, 0xfa, ..] => Some(4),
        // push r64
        [0x50..=0x57, ..] => Some(1),
        [0x41, 0x50..=0x57, ..] => Some(2),
        // mov r64, r64 (either direction, register operands only: ModRM mod = 11)
        [0x48 | 0x49 | 0x4c | 0x4d, 0x89 | 0x8b, m, ..] if m >> 6 == 3 => Some(3),
        // mov r32, imm32
        [0xb8..=0xbf, _, _, _, _, ..] => Some(5),
        [0x41, 0xb8..=0xbf, _, _, _, _, ..] => Some(6),
        // sub rsp, imm8 / imm32
        [0x48, 0x83, 0xec, _, ..] => Some(4),
        [0x48, 0x81, 0xec, _, _, _, _, ..] => Some(7),
        _ => None,
    }
}

/// How many leading bytes of `code` move to the trampoline: a one-byte `push` (kept in place,
/// see `Page::prepare`), then whole known instructions covering at least `JMP_LEN` bytes.
pub fn prologue_len(code: &[u8]) -> Option<usize> {
    if !matches!(code.first()?, 0x50..=0x57) {
        return None;
    }
    let mut n = 1;
    while n < 1 + JMP_LEN {
        n += instruction_len(code.get(n..)?)?;
    }
    (n <= 15).then_some(n)
}

/// The trampoline page: one per process, near the patched library (a `rel32` jump reaches
/// ±2 GiB).
pub struct Page {
    base: *mut u8,
    used: usize,
}

// SAFETY: the page is written only while patching (at cuInit, one thread), read-only after.
unsafe impl Send for Page {}

impl Page {
    /// Maps a page within ±1.5 GiB of `near`.
    pub fn near(near: usize) -> Result<Page, &'static str> {
        const STEP: usize = 64 << 20;
        for i in 1..24usize {
            for hint in [near.wrapping_sub(i * STEP), near.wrapping_add(i * STEP)] {
                let hint = hint & !(PAGE - 1);
                // SAFETY: an anonymous private mapping; the hint is only a hint.
                let p = unsafe {
                    libc::mmap(
                        hint as *mut libc::c_void,
                        PAGE,
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
                unsafe { libc::munmap(p, PAGE) };
            }
        }
        Err("no memory for trampolines near libcuda")
    }

    /// Makes the page executable (and no longer writable) once every patch is written.
    pub fn seal(&self) -> Result<(), &'static str> {
        // SAFETY: our own mapping.
        let r =
            unsafe { libc::mprotect(self.base.cast(), PAGE, libc::PROT_READ | libc::PROT_EXEC) };
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
    /// Where the jump goes: the entry point + 1.
    at: usize,
    jump: [u8; JMP_LEN],
    original: [u8; JMP_LEN],
    /// Where to call the original.
    pub trampoline: usize,
}

impl Page {
    /// Prepares redirecting the function at `target` to `ours`: writes the trampoline (the
    /// moved prologue and a jump back) and the stub that reaches `ours` into this page.
    ///
    /// The jump goes *after* the entry's first instruction, a one-byte `push`, which stays:
    /// a uprobe on the entry point (wedgeprobe's own, or anyone's) replaces that byte with
    /// int3, runs the file's `push` out of line and resumes at the next byte — our jump. A
    /// jump at the entry itself would be replaced by the int3 and resumed into its middle. So
    /// the stub first undoes the `push`, then jumps to `ours`, which then sees the stack as
    /// its caller left it.
    pub fn prepare(&mut self, target: usize, ours: usize) -> Result<Patch, &'static str> {
        if self.used + SLOT > PAGE {
            return Err("trampoline page full");
        }
        // SAFETY: the caller hands an exported function's entry: 16 bytes of mapped code.
        let head: [u8; 16] = unsafe { std::ptr::read_unaligned(target as *const [u8; 16]) };
        let n = prologue_len(&head)
            .ok_or("its entry point begins with instructions the shim does not move")?;
        // The jump must be written (and undone) in one aligned 8-byte store.
        let at = target + 1;
        if at & 7 > 8 - JMP_LEN {
            return Err("its entry point is not aligned for an atomic patch");
        }
        // SAFETY: within our page (checked above).
        let slot = unsafe { self.base.add(self.used) };
        let tramp = slot as usize;
        let stub = tramp + 24;
        let mut code = [0x90u8; SLOT];
        code[..n].copy_from_slice(&head[..n]);
        code[n] = 0xe9;
        code[n + 1..n + 5]
            .copy_from_slice(&rel32(tramp + n + 5, target + n).ok_or("trampoline out of reach")?);
        // pop the register the entry pushed, then jmp [rip+0] to `ours`.
        code[24] = head[0] + 8;
        code[25..31].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
        code[31..39].copy_from_slice(&(ours as u64).to_le_bytes());
        let mut jump = [0u8; JMP_LEN];
        jump[0] = 0xe9;
        jump[1..5].copy_from_slice(&rel32(at + JMP_LEN, stub).ok_or("trampoline out of reach")?);
        let mut original = [0u8; JMP_LEN];
        original.copy_from_slice(&head[1..1 + JMP_LEN]);
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

impl Patch {
    /// The aligned 8-byte code word the jump lies in: (its address, what it holds now, what
    /// it holds with the jump) — what `wedgeprobe attach` writes itself, with the process
    /// stopped.
    pub fn word(&self) -> (u64, u64, u64) {
        let word = self.at & !7;
        // SAFETY: `prepare` read these bytes (mapped code); an aligned word is read at once.
        let old = unsafe { &*(word as *const AtomicU64) }.load(Ordering::Relaxed);
        let mut b = old.to_le_bytes();
        b[self.at - word..self.at - word + JMP_LEN].copy_from_slice(&self.jump);
        (word as u64, old, u64::from_le_bytes(b))
    }

    /// Whether the jump is in place.
    pub fn in_place(&self) -> bool {
        // SAFETY: as for `word`.
        let b = unsafe { &*((self.at & !7) as *const AtomicU64) }
            .load(Ordering::Relaxed)
            .to_le_bytes();
        let at = self.at & 7;
        b[at..at + JMP_LEN] == self.jump
    }

    /// Writes the jump after the original's first instruction (5 bytes, in one store; the rest
    /// of the moved instructions is never reached again and stays as it was): from now on its
    /// callers reach ours.
    ///
    /// # Safety
    /// The page is sealed, no thread is executing the original's first `len` bytes, and
    /// `ours` has the original's signature.
    pub unsafe fn apply(&self) -> Result<(), &'static str> {
        // SAFETY: the caller's promise.
        unsafe { write_code(self.at, &self.jump) }
    }

    /// Puts the original's first bytes back (uprobes on the entry point work again). The jump
    /// lies in one aligned 8-byte word (`prepare` refuses otherwise) and is swapped in one
    /// store, so a thread entering sees the jump or the original, never half of each; the
    /// moved instructions' bytes after the jump were never changed; the trampoline stays valid
    /// for a thread already on its way.
    ///
    /// # Safety
    /// `apply` succeeded before.
    pub unsafe fn restore(&self) -> Result<(), &'static str> {
        // SAFETY: the caller's promise; one atomic store (`prepare` checked the alignment).
        unsafe { write_code(self.at, &self.original) }
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

    #[test]
    fn libcudas_launch_prologue_moves_whole_instructions() {
        // cuLaunchKernel in libcuda 580.159.04 (gpu/entry_bytes.py on the H200): push rbp
        // stays, mov rbp,rsp + push r12 (5 bytes) make room for the jump.
        let bytes = [
            0x55, 0x48, 0x89, 0xe5, 0x41, 0x54, 0x48, 0x83, 0xec, 0x08, 0x81, 0x3d,
        ];
        assert_eq!(prologue_len(&bytes), Some(6));
        // The simulated driver's: push rbp; mov rbp,rsp; sub rsp,0x20.
        assert_eq!(
            prologue_len(&[0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x20]),
            Some(8)
        );
        // ... and its cuGraphLaunch: push rbp; mov rdx,rsi; mov edi,6.
        assert_eq!(
            prologue_len(&[0x55, 0x48, 0x89, 0xf2, 0xbf, 6, 0, 0, 0, 0xe8]),
            Some(9)
        );
        // Not a push first (endbr64, a CET build): refused.
        assert_eq!(
            prologue_len(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x41, 0x54]),
            None
        );
        // A jump first (another tool's hook is on it already): refused.
        assert_eq!(prologue_len(&[0xe9, 1, 2, 3, 4, 0x41, 0x54]), None);
        // An int3 first (someone's uprobe is on it already): refused.
        assert_eq!(prologue_len(&[0xcc, 0x48, 0x89, 0xe5, 0x41, 0x54]), None);
        // A RIP-relative load after the push: refused, never moved.
        assert_eq!(
            prologue_len(&[0x55, 0x48, 0x8b, 0x05, 1, 2, 3, 4, 0x55]),
            None
        );
        // mov rbp,[rsp] (a memory operand) is not a register move.
        assert_eq!(
            prologue_len(&[0x55, 0x48, 0x8b, 0x2c, 0x24, 0x55, 0x55]),
            None
        );
        // Too short to hold a jump.
        assert_eq!(prologue_len(&[0x55, 0x55]), None);
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
    fn a_redirected_function_reaches_ours_and_the_original_through_the_trampoline()
    -> Result<(), &'static str> {
        let target = wp_patch_test_target as *const () as usize;
        // SAFETY: plain arithmetic before the patch.
        assert_eq!(unsafe { wp_patch_test_target(2, 3) }, 5);
        let mut page = Page::near(target)?;
        let patch = page.prepare(target, ours as *const () as usize)?;
        ORIGINAL.store(patch.trampoline as u64, Ordering::SeqCst);
        page.seal()?;
        // SAFETY: no other thread calls the test target.
        unsafe { patch.apply() }?;
        // SAFETY: as above; now through ours and the trampoline.
        assert_eq!(unsafe { wp_patch_test_target(2, 3) }, 50);
        // SAFETY: applied above.
        unsafe { patch.restore() }?;
        // SAFETY: as above; the original again.
        assert_eq!(unsafe { wp_patch_test_target(2, 3) }, 5);
        Ok(())
    }
}
