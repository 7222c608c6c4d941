//! The code a taken-over thread runs inside the target (`crate::inject::remote`), and the page
//! it runs in.
//!
//! Why machine code of our own, copied in: from the moment wedgeprobe hands the thread back,
//! nothing may depend on wedgeprobe still being alive. So the blob does the whole job by
//! itself and then puts the thread back exactly as it found it — its vector registers
//! (`xsave`/`xrstor`: glibc's string functions use AVX, and compiled code may keep values in
//! them across the system call the thread was in) and every general register — and resumes it
//! on the system call it was stopped at, which it makes again (a futex wait: waits again, or
//! returns as a spurious wake-up, which callers of futex handle). Killed before the hand-back,
//! wedgeprobe leaves the thread at that system call; after it, the blob finishes on its own.
//!
//! What it does: puts the shim's image (copied into the page by wedgeprobe) into a memfd —
//! not a path on disk: a container's /dev/shm is often `noexec` and its mount namespace is not
//! ours — loads it with `dlopen("/proc/self/fd/N")`, closes the fd, calls
//! `wedgeprobe_shim_attach(&args)` (`probe_common::attach`) and sets `DONE`.
//!
//! Layout of the page (offsets from its base, `LEN` bytes in all, the image after `IMAGE`):
//! code at 0; `AttachArgs` at `ARGS`; the registers to resume with at `REGS`; the addresses of
//! the target's `dlopen`/`dlsym`, the results and flags; the path and symbol strings; the
//! `xsave` area (64-byte aligned); a 64 KiB stack; the image.

use probe_common::attach::AttachArgs;

pub const ARGS: u64 = 0x1000;
/// r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rcx rdx rsi rdi rsp rax rip (in this order).
pub const REGS: u64 = 0x1700;
pub const DLOPEN: u64 = 0x1800;
pub const DLSYM: u64 = 0x1808;
pub const HANDLE: u64 = 0x1810;
pub const SYMBOL: u64 = 0x1818;
pub const RESULT: u64 = 0x1820;
/// Set to 1 when the blob has done its part (whatever the outcome).
pub const DONE: u64 = 0x1828;
/// Set to 1 just before the blob jumps back (the shim unmaps the page after it).
pub const LEFT: u64 = 0x1830;
pub const FD: u64 = 0x1838;
pub const IMAGE_LEN: u64 = 0x1840;
/// The last step the blob reached (1 memfd, 2 written, 3 dlopen, 4 dlsym, 5 called).
pub const STEP: u64 = 0x1848;
/// "/proc/self/fd/" and room for the fd's digits.
pub const PATH: u64 = 0x1900;
pub const SYMBOL_NAME: u64 = 0x1A00;
pub const MEMFD_NAME: u64 = 0x1A40;
pub const XSAVE: u64 = 0x2000;
pub const STACK_TOP: u64 = 0x13000;
pub const IMAGE: u64 = 0x13000;

const _: () = assert!(ARGS + core::mem::size_of::<AttachArgs>() as u64 <= REGS);

/// The page's length for an image of `image_len` bytes (whole pages).
pub fn len(image_len: u64) -> u64 {
    (IMAGE + image_len).div_ceil(4096) * 4096
}

// The blob. Every data reference is RIP-relative to `wp_inject_blob` plus an offset above, so
// the copy runs wherever the page lands. Numeric labels only (7:, 8:, …), per Rust's advice
// for assembly in Intel syntax. Registers it uses are all restored from REGS at the end.
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl wp_inject_blob",
    ".globl wp_inject_blob_end",
    ".p2align 4",
    "wp_inject_blob:",
    // The vector state: x87, SSE, AVX, AVX-512 (mask 0xE7; absent components are skipped).
    "mov eax, 0xE7",
    "xor edx, edx",
    "xsave64 [rip + wp_inject_blob + 0x2000]",
    // fd = memfd_create(name, MFD_CLOEXEC)
    "mov qword ptr [rip + wp_inject_blob + 0x1848], 1",
    "lea rdi, [rip + wp_inject_blob + 0x1A40]",
    "mov esi, 1",
    "mov eax, 319",
    "syscall",
    "test rax, rax",
    "js 8f",
    "mov [rip + wp_inject_blob + 0x1838], rax",
    // write(fd, image, len) until all of it is written (EINTR retried)
    "lea r12, [rip + wp_inject_blob + 0x13000]",
    "mov r13, [rip + wp_inject_blob + 0x1840]",
    "2:",
    "test r13, r13",
    "jz 3f",
    "mov rdi, [rip + wp_inject_blob + 0x1838]",
    "mov rsi, r12",
    "mov rdx, r13",
    "mov eax, 1",
    "syscall",
    "cmp rax, -4",
    "je 2b",
    "test rax, rax",
    "jle 9f",
    "add r12, rax",
    "sub r13, rax",
    "jmp 2b",
    "3:",
    "mov qword ptr [rip + wp_inject_blob + 0x1848], 2",
    // The fd's digits after "/proc/self/fd/" (14 bytes): backwards into the stack area, then
    // forwards into the path.
    "mov rax, [rip + wp_inject_blob + 0x1838]",
    "lea rdi, [rip + wp_inject_blob + 0x3020]",
    "mov ecx, 10",
    "4:",
    "xor edx, edx",
    "div rcx",
    "add dl, 48",
    "dec rdi",
    "mov [rdi], dl",
    "test rax, rax",
    "jnz 4b",
    "lea rsi, [rip + wp_inject_blob + 0x190E]",
    "lea rcx, [rip + wp_inject_blob + 0x3020]",
    "5:",
    "mov al, [rdi]",
    "mov [rsi], al",
    "inc rdi",
    "inc rsi",
    "cmp rdi, rcx",
    "jb 5b",
    "mov byte ptr [rsi], 0",
    // handle = dlopen(path, RTLD_NOW)
    "mov qword ptr [rip + wp_inject_blob + 0x1848], 3",
    "lea rdi, [rip + wp_inject_blob + 0x1900]",
    "mov esi, 2",
    "call qword ptr [rip + wp_inject_blob + 0x1800]",
    "mov [rip + wp_inject_blob + 0x1810], rax",
    "9:",
    // close(fd): the mapping keeps the image
    "mov rdi, [rip + wp_inject_blob + 0x1838]",
    "mov eax, 3",
    "syscall",
    "mov rax, [rip + wp_inject_blob + 0x1810]",
    "test rax, rax",
    "jz 8f",
    // symbol = dlsym(handle, "wedgeprobe_shim_attach")
    "mov qword ptr [rip + wp_inject_blob + 0x1848], 4",
    "mov rdi, rax",
    "lea rsi, [rip + wp_inject_blob + 0x1A00]",
    "call qword ptr [rip + wp_inject_blob + 0x1808]",
    "mov [rip + wp_inject_blob + 0x1818], rax",
    "test rax, rax",
    "jz 8f",
    // result = wedgeprobe_shim_attach(&args)
    "mov qword ptr [rip + wp_inject_blob + 0x1848], 5",
    "lea rdi, [rip + wp_inject_blob + 0x1000]",
    "call rax",
    "mov [rip + wp_inject_blob + 0x1820], rax",
    "8:",
    "mov qword ptr [rip + wp_inject_blob + 0x1828], 1",
    // The thread as it was: vector state, every general register, then back to its syscall.
    "mov eax, 0xE7",
    "xor edx, edx",
    "xrstor64 [rip + wp_inject_blob + 0x2000]",
    "mov r15, [rip + wp_inject_blob + 0x1700]",
    "mov r14, [rip + wp_inject_blob + 0x1708]",
    "mov r13, [rip + wp_inject_blob + 0x1710]",
    "mov r12, [rip + wp_inject_blob + 0x1718]",
    "mov rbp, [rip + wp_inject_blob + 0x1720]",
    "mov rbx, [rip + wp_inject_blob + 0x1728]",
    "mov r11, [rip + wp_inject_blob + 0x1730]",
    "mov r10, [rip + wp_inject_blob + 0x1738]",
    "mov r9, [rip + wp_inject_blob + 0x1740]",
    "mov r8, [rip + wp_inject_blob + 0x1748]",
    "mov rcx, [rip + wp_inject_blob + 0x1750]",
    "mov rdx, [rip + wp_inject_blob + 0x1758]",
    "mov rsi, [rip + wp_inject_blob + 0x1760]",
    "mov rdi, [rip + wp_inject_blob + 0x1768]",
    "mov rsp, [rip + wp_inject_blob + 0x1770]",
    "mov rax, [rip + wp_inject_blob + 0x1778]",
    "mov qword ptr [rip + wp_inject_blob + 0x1830], 1",
    "jmp qword ptr [rip + wp_inject_blob + 0x1780]",
    "wp_inject_blob_end:",
);

#[cfg(target_arch = "x86_64")]
unsafe extern "C" {
    static wp_inject_blob: u8;
    static wp_inject_blob_end: u8;
}

/// The blob's bytes.
#[cfg(target_arch = "x86_64")]
pub fn code() -> &'static [u8] {
    // SAFETY: two labels of the same global_asm block, start before end, in our own text.
    unsafe {
        let start = &raw const wp_inject_blob;
        let end = &raw const wp_inject_blob_end;
        std::slice::from_raw_parts(start, end.offset_from(start) as usize)
    }
}

/// The registers to resume with, in `REGS` order, from the thread's registers at its system
/// call: back on the `syscall` instruction (two bytes before), with the call's number in rax.
pub fn resume_words(r: &super::ptrace::Regs) -> [u64; 17] {
    [
        r.r15,
        r.r14,
        r.r13,
        r.r12,
        r.rbp,
        r.rbx,
        r.r11,
        r.r10,
        r.r9,
        r.r8,
        r.rcx,
        r.rdx,
        r.rsi,
        r.rdi,
        r.rsp,
        r.orig_rax,
        r.rip - 2,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blob_fits_its_page_and_the_layout_is_consistent() {
        let code = code();
        assert!(
            !code.is_empty() && (code.len() as u64) < ARGS,
            "{} bytes",
            code.len()
        );
        assert!(XSAVE.is_multiple_of(64));
        assert!(STACK_TOP.is_multiple_of(16));
        assert_eq!(len(1), IMAGE + 4096);
        // The blob begins with `mov eax, 0xE7` and ends with `jmp [rip + disp32]` to REGS'
        // last word (rip).
        assert_eq!(&code[..5], &[0xb8, 0xe7, 0, 0, 0]);
        let n = code.len();
        assert_eq!(&code[n - 6..n - 4], &[0xff, 0x25]);
        let disp = i32::from_le_bytes(code[n - 4..].try_into().unwrap());
        assert_eq!(n as i64 + disp as i64, (REGS + 16 * 8) as i64);
    }
}
