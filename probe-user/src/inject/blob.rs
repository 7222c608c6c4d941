//! The code a taken-over thread runs inside the target (`crate::inject::remote`), and the page
//! it works in.
//!
//! Why machine code of our own, and why written where it is: from the moment wedgeprobe lets
//! the thread go, nothing may depend on wedgeprobe still being alive — killed at any point, it
//! must leave a thread that goes on exactly as if nothing happened. So the blob is written
//! into a *code cave* (the never-run bytes after an executable segment's end, in its last page:
//! `remote::find_cave`) through /proc/PID/mem, the thread is pointed at it from the entry of
//! its futex wait (the call skipped), and everything the thread had is carried *in the blob's
//! own instructions* (immediates patched per injection): every general register, and the
//! address of its syscall instruction. The blob then
//! 1. maps its page (RW) and saves the vector state there (`xsave`: glibc's string functions
//!    use AVX, and compiled code may keep values in vector registers across a system call);
//! 2. waits — at most 5 s, 1 ms sleeps — for wedgeprobe to fill the page (`READY`): the
//!    shim's image, the target's `dlopen`/`dlsym`, the attach arguments;
//! 3. puts the image into a memfd (not a file: a container's /dev/shm is often `noexec`, and
//!    its mount namespace is not ours), `dlopen("/proc/self/fd/N")`, closes it, calls
//!    `wedgeprobe_shim_attach(&args)`, sets `DONE`;
//! 4. waits — at most 5 s — for wedgeprobe to have read the answer (`ACK`), restores the
//!    vector state, unmaps the page, restores every register and jumps back to the thread's
//!    syscall instruction with the call's number in rax: the futex wait is made again (a wake
//!    meanwhile changed the futex word, so it returns at once, as futex callers expect).
//!
//! Killed before `READY`, wedgeprobe costs the thread 5 s of its idle wait and nothing else;
//! after it, at most 5 s more (the wait for `ACK`).
//!
//! Page layout (offsets from its base, `len` bytes in all, the image from `IMAGE`).

use probe_common::attach::AttachArgs;

pub const COOKIE: u64 = 0x0;
pub const READY: u64 = 0x8;
pub const DONE: u64 = 0x10;
pub const ACK: u64 = 0x18;
pub const HANDLE: u64 = 0x30;
pub const SYMBOL: u64 = 0x38;
pub const RESULT: u64 = 0x40;
/// The last step the blob reached (1 memfd, 2 written, 3 dlopen, 4 dlsym, 5 called).
pub const STEP: u64 = 0x48;
pub const IMAGE_LEN: u64 = 0x58;
pub const DLOPEN: u64 = 0x60;
pub const DLSYM: u64 = 0x68;
/// "/proc/self/fd/" and room for the fd's digits.
pub const PATH: u64 = 0x100;
pub const SYMBOL_NAME: u64 = 0x200;
pub const MEMFD_NAME: u64 = 0x240;
pub const ARGS: u64 = 0x1000;
pub const XSAVE: u64 = 0x2000;
pub const IMAGE: u64 = 0x13000;

const _: () = assert!(ARGS + core::mem::size_of::<AttachArgs>() as u64 <= XSAVE);

/// The page's length for an image of `image_len` bytes (whole pages).
pub fn len(image_len: u64) -> u64 {
    (IMAGE + image_len).div_ceil(4096) * 4096
}

// The blob. Data is addressed from r15 (the page it maps); what it restores, and the page's
// length and cookie, are immediates patched in (`Blob::patched`), found by the `wp_blob_*`
// labels that follow each of them. Numeric labels only where local, never made of 0s and 1s
// alone (Rust's advice for Intel syntax).
#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".globl wp_inject_blob",
    ".globl wp_inject_blob_end",
    ".globl wp_blob_len",
    ".globl wp_blob_len2",
    ".globl wp_blob_cookie",
    ".globl wp_blob_regs",
    ".globl wp_blob_rip",
    ".globl wp_blob_rsp",
    ".p2align 4",
    "wp_inject_blob:",
    // page = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    "xor edi, edi",
    "movabs rsi, 0",
    "wp_blob_len:",
    "mov edx, 3",
    "mov r10d, 0x22",
    "mov r8, -1",
    "xor r9d, r9d",
    "mov eax, 9",
    "syscall",
    "cmp rax, -4095",
    "jae 9f",
    "mov r15, rax",
    "lea rsp, [r15 + 0x13000]",
    "movabs rax, 0",
    "wp_blob_cookie:",
    "mov [r15], rax",
    "mov eax, 0xE7",
    "xor edx, edx",
    "xsave64 [r15 + 0x2000]",
    // Wait for READY, at most 5,000 × 1 ms (no READY: wedgeprobe is gone, straight back).
    "mov r14d, 5000",
    "22:",
    "cmp qword ptr [r15 + 0x8], 1",
    "je 23f",
    "dec r14d",
    "jz 8f",
    "mov qword ptr [r15 + 0x20], 0",
    "mov qword ptr [r15 + 0x28], 1000000",
    "lea rdi, [r15 + 0x20]",
    "xor esi, esi",
    "mov eax, 35",
    "syscall",
    "jmp 22b",
    "23:",
    // fd = memfd_create(name, MFD_CLOEXEC)
    "mov qword ptr [r15 + 0x48], 1",
    "lea rdi, [r15 + 0x240]",
    "mov esi, 1",
    "mov eax, 319",
    "syscall",
    "test rax, rax",
    "js 6f",
    "mov [r15 + 0x50], rax",
    // write(fd, image, len) until all of it is written (EINTR retried)
    "lea r12, [r15 + 0x13000]",
    "mov r13, [r15 + 0x58]",
    "3:",
    "test r13, r13",
    "jz 4f",
    "mov rdi, [r15 + 0x50]",
    "mov rsi, r12",
    "mov rdx, r13",
    "mov eax, 1",
    "syscall",
    "cmp rax, -4",
    "je 3b",
    "test rax, rax",
    "jle 5f",
    "add r12, rax",
    "sub r13, rax",
    "jmp 3b",
    "4:",
    "mov qword ptr [r15 + 0x48], 2",
    // The fd's digits after "/proc/self/fd/" (14 bytes): backwards into scratch at the
    // bottom of the stack area, then forwards into the path.
    "mov rax, [r15 + 0x50]",
    "lea rdi, [r15 + 0x3020]",
    "mov ecx, 10",
    "32:",
    "xor edx, edx",
    "div rcx",
    "add dl, 48",
    "dec rdi",
    "mov [rdi], dl",
    "test rax, rax",
    "jnz 32b",
    "lea rsi, [r15 + 0x10E]",
    "lea rcx, [r15 + 0x3020]",
    "33:",
    "mov al, [rdi]",
    "mov [rsi], al",
    "inc rdi",
    "inc rsi",
    "cmp rdi, rcx",
    "jb 33b",
    "mov byte ptr [rsi], 0",
    // handle = dlopen(path, RTLD_NOW)
    "mov qword ptr [r15 + 0x48], 3",
    "lea rdi, [r15 + 0x100]",
    "mov esi, 2",
    "call qword ptr [r15 + 0x60]",
    "mov [r15 + 0x30], rax",
    "5:",
    // close(fd): the mapping keeps the image
    "mov rdi, [r15 + 0x50]",
    "mov eax, 3",
    "syscall",
    "mov rax, [r15 + 0x30]",
    "test rax, rax",
    "jz 6f",
    // symbol = dlsym(handle, "wedgeprobe_shim_attach"); result = symbol(&args)
    "mov qword ptr [r15 + 0x48], 4",
    "mov rdi, rax",
    "lea rsi, [r15 + 0x200]",
    "call qword ptr [r15 + 0x68]",
    "mov [r15 + 0x38], rax",
    "test rax, rax",
    "jz 6f",
    "mov qword ptr [r15 + 0x48], 5",
    "lea rdi, [r15 + 0x1000]",
    "call rax",
    "mov [r15 + 0x40], rax",
    "6:",
    "mov qword ptr [r15 + 0x10], 1",
    // Wait for ACK (wedgeprobe has read the answer), at most 5,000 × 1 ms.
    "mov r14d, 5000",
    "7:",
    "cmp qword ptr [r15 + 0x18], 1",
    "je 8f",
    "dec r14d",
    "jz 8f",
    "mov qword ptr [r15 + 0x20], 0",
    "mov qword ptr [r15 + 0x28], 1000000",
    "lea rdi, [r15 + 0x20]",
    "xor esi, esi",
    "mov eax, 35",
    "syscall",
    "jmp 7b",
    "8:",
    "mov eax, 0xE7",
    "xor edx, edx",
    "xrstor64 [r15 + 0x2000]",
    // Back on the thread's own stack before the page goes (a signal delivered from here on
    // lands there), then munmap(page, len).
    "movabs rsp, 0",
    "wp_blob_rsp:",
    "mov rdi, r15",
    "movabs rsi, 0",
    "wp_blob_len2:",
    "mov eax, 11",
    "syscall",
    "9:",
    // Every general register as the thread had it (16 immediates, in `REG_ORDER`), then back
    // to its syscall instruction.
    "wp_blob_regs:",
    "movabs r15, 0",
    "movabs r14, 0",
    "movabs r13, 0",
    "movabs r12, 0",
    "movabs rbp, 0",
    "movabs rbx, 0",
    "movabs r11, 0",
    "movabs r10, 0",
    "movabs r9, 0",
    "movabs r8, 0",
    "movabs rcx, 0",
    "movabs rdx, 0",
    "movabs rsi, 0",
    "movabs rdi, 0",
    "movabs rsp, 0",
    "movabs rax, 0",
    "jmp qword ptr [rip + wp_blob_rip]",
    "wp_blob_rip:",
    ".quad 0",
    "wp_inject_blob_end:",
);

#[cfg(target_arch = "x86_64")]
unsafe extern "C" {
    static wp_inject_blob: u8;
    static wp_inject_blob_end: u8;
    static wp_blob_len: u8;
    static wp_blob_len2: u8;
    static wp_blob_cookie: u8;
    static wp_blob_regs: u8;
    static wp_blob_rip: u8;
    static wp_blob_rsp: u8;
}

/// Each `movabs r64, imm64` at `wp_blob_regs` is 10 bytes, its immediate the last 8.
const MOVABS: usize = 10;

/// Offset of a label in the blob.
fn at(label: &u8) -> usize {
    // SAFETY: labels of the same global_asm block as `wp_inject_blob`, after it.
    unsafe { (label as *const u8).offset_from(&raw const wp_inject_blob) as usize }
}

/// The blob's template bytes.
fn template() -> &'static [u8] {
    // SAFETY: two labels of the same global_asm block, start before end, in our own text.
    unsafe {
        let start = &raw const wp_inject_blob;
        std::slice::from_raw_parts(start, at(&wp_inject_blob_end))
    }
}

/// How long the blob is (what a cave must hold).
pub fn code_len() -> usize {
    template().len()
}

/// The blob for one injection: the page's length and cookie, the thread's registers to
/// resume with (`resume_words`, in the order of `wp_blob_regs`) and where to jump back.
pub fn patched(page_len: u64, cookie: u64, regs: [u64; 16], rip: u64) -> Vec<u8> {
    let mut code = template().to_vec();
    let put = |code: &mut Vec<u8>, end: usize, v: u64| {
        code[end - 8..end].copy_from_slice(&v.to_le_bytes());
    };
    // SAFETY: the labels read exist in the blob (global_asm above).
    let (len1, len2, ck, regs_at, rip_at, rsp_at) = unsafe {
        (
            at(&wp_blob_len),
            at(&wp_blob_len2),
            at(&wp_blob_cookie),
            at(&wp_blob_regs),
            at(&wp_blob_rip),
            at(&wp_blob_rsp),
        )
    };
    put(&mut code, len1, page_len);
    put(&mut code, len2, page_len);
    put(&mut code, ck, cookie);
    put(&mut code, rsp_at, regs[14]);
    for (i, r) in regs.iter().enumerate() {
        put(&mut code, regs_at + MOVABS * (i + 1), *r);
    }
    code[rip_at..rip_at + 8].copy_from_slice(&rip.to_le_bytes());
    code
}

/// The registers to resume with, in the order of `wp_blob_regs`, from the thread's registers
/// and what rax is to hold: the call's number where the blob jumps back to the syscall
/// instruction (the call made again), or the call's result where it jumps back past it (a
/// wait taken as it ended).
pub fn resume_words(r: &super::ptrace::Regs, rax: u64) -> [u64; 16] {
    [
        r.r15, r.r14, r.r13, r.r12, r.rbp, r.rbx, r.r11, r.r10, r.r9, r.r8, r.rcx, r.rdx, r.rsi,
        r.rdi, r.rsp, rax,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patched_blob_carries_every_register_and_its_way_back() {
        let regs: [u64; 16] = std::array::from_fn(|i| 0x1111 * (i as u64 + 1));
        let code = patched(0x54000, 0xc0ffee, regs, 0x7f00_1234_5678);
        assert_eq!(code.len(), code_len());
        assert!(code.len() < 1024, "{} bytes: caves are small", code.len());
        // SAFETY: labels of the blob.
        let regs_at = unsafe { at(&wp_blob_regs) };
        for (i, r) in regs.iter().enumerate() {
            let op = regs_at + MOVABS * i;
            // REX.W (+B for r8–r15), B8+r: a movabs.
            assert!(
                matches!(code[op], 0x48 | 0x49),
                "register {i}: {:#x}",
                code[op]
            );
            assert_eq!(code[op + 2..op + 10], r.to_le_bytes(), "register {i}");
        }
        let n = code.len();
        assert_eq!(code[n - 8..], 0x7f00_1234_5678u64.to_le_bytes());
        // The jump back reads the quad right after it (rip-relative displacement 0).
        assert_eq!(code[n - 14..n - 8], [0xff, 0x25, 0, 0, 0, 0]);
        assert!(XSAVE.is_multiple_of(64));
        assert_eq!(len(1), IMAGE + 4096);
    }
}
